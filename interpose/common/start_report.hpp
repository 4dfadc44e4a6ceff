// What the Linux preload library and the Windows DLL say and report the same
// way at start and at exit (interpose/linux/, interpose/windows/).
#pragma once

#include "arena/arena.hpp"
#include "config/options.hpp"
#include "stats/report.hpp"

namespace mnemosyne {

// The device to use: DEVICE, or for DEVICE=local-rank the rank's local index
// modulo the device count (which loads the driver, when it would be anyway).
int choose_device(const config::Options& o) noexcept;

// MNEMOSYNE_VERBOSE's lines at start, each through `warn`. `flavour` names
// the build after the pid ("" or " (Windows DLL)").
void print_verbose(const config::Options& o, const arena::StartReport& report, int device, long pid,
                   const char* flavour, void (*warn)(const char* line)) noexcept;

// The statistics report's context for this process.
stats::ReportContext report_context(const config::Options& o, long pid, const char* program,
                                    bool counting) noexcept;

}  // namespace mnemosyne
