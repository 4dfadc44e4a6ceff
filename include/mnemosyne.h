/* mnemosyne: the C API of the preload library (libmnemosyne.so).
 *
 * A program does not need this header to be served by mnemosyne; it is for
 * programs and tests that want to ask where a block lives. Resolve the
 * functions with dlsym(RTLD_DEFAULT, ...) when the library may be absent. */
#ifndef MNEMOSYNE_H
#define MNEMOSYNE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when `ptr` lies in memory mnemosyne took from a backend, else 0. */
int mnemosyne_owns(const void* ptr);

/* The backend `ptr` came from: "unified", "device", "hbm", "gddr",
 * "pinned", "host", or "system" for memory mnemosyne does not own. */
const char* mnemosyne_backend_of(const void* ptr);

/* The backend new arena memory comes from now ("host" after a fallback). */
const char* mnemosyne_active_backend(void);

/* This process's statistics as JSON (schema "mnemosyne-stats/1", see
 * docs/stats-schema.md), in a block the caller releases with free(); NULL
 * when memory is short. Allocation counts are collected only when
 * MNEMOSYNE_SHOW_STATS or MNEMOSYNE_STATS_FILE was set at start. */
char* mnemosyne_stats_json(void);

/* The library's version, "MAJOR.MINOR.PATCH". */
const char* mnemosyne_version(void);

#ifdef __cplusplus
}
#endif

#endif /* MNEMOSYNE_H */
