// Helpers shared by the files of src/config (not part of the contract in
// options.hpp). Plain ASCII, no locale, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mnemosyne::config::detail {

constexpr char ascii_lower(char c) noexcept {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

constexpr bool is_digit(char c) noexcept {
  return c >= '0' && c <= '9';
}

// True when text[0, len) equals the NUL-terminated `word`, ignoring ASCII case.
constexpr bool equals_ci(const char* text, std::size_t len, const char* word) noexcept {
  std::size_t i = 0;
  for (; i < len; ++i) {
    if (word[i] == '\0' || ascii_lower(text[i]) != ascii_lower(word[i])) return false;
  }
  return word[i] == '\0';
}

// True when the NUL-terminated `text` starts with `prefix`, ignoring ASCII case.
constexpr bool starts_with_ci(const char* text, const char* prefix) noexcept {
  for (; *prefix != '\0'; ++text, ++prefix) {
    if (*text == '\0' || ascii_lower(*text) != ascii_lower(*prefix)) return false;
  }
  return true;
}

constexpr std::size_t length(const char* text) noexcept {
  std::size_t n = 0;
  while (text[n] != '\0') ++n;
  return n;
}

// Parses text[0, len) as a plain decimal number (digits only: no sign, no
// blank, at least one digit) no greater than `max`. *out is written only on
// success.
constexpr bool parse_decimal(const char* text, std::size_t len, std::uint64_t max,
                             std::uint64_t* out) noexcept {
  if (len == 0) return false;
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < len; ++i) {
    if (!is_digit(text[i])) return false;
    const auto digit = static_cast<std::uint64_t>(text[i] - '0');
    if (value > (max - digit) / 10) return false;
    value = value * 10 + digit;
  }
  *out = value;
  return true;
}

// The variables local_rank() reads, in order of precedence: the launcher
// nearest the process first. A launcher started by another hands the outer
// one's variables on to the processes it starts, where they describe the
// launcher, not its worker: torchrun started once a node by mpirun or srun
// passes OMPI_COMM_WORLD_LOCAL_RANK=0 or SLURM_LOCALID=0 to every worker,
// and Open MPI's ranks inside a Slurm job can inherit their daemon's
// SLURM_LOCALID. So the frameworks' per-worker launchers come first, then
// the MPI launchers (each sets its own variable only), then Slurm's srun,
// the outermost. No PMIX_ variable is read: in PMIx the local rank is a key
// (PMIX_LOCAL_RANK, "pmix.lrank") queried through the PMIx client library,
// not a variable we know any launcher to export, and the PMIX_RANK variable
// is the global rank. Open MPI's mpirun (also over PMIx) exports
// OMPI_COMM_WORLD_LOCAL_RANK.
inline constexpr const char* kLocalRankVariables[] = {
    "LOCAL_RANK",                  // torchrun, and accelerate, DeepSpeed, Lightning over it
    "HOROVOD_LOCAL_RANK",          // horovodrun
    "OMPI_COMM_WORLD_LOCAL_RANK",  // Open MPI
    "MV2_COMM_WORLD_LOCAL_RANK",   // MVAPICH2
    "MPI_LOCALRANKID",             // MPICH (Hydra), Intel MPI
    "PMI_LOCAL_RANK",              // PMI-1/PMI-2 launchers that set it
    "PALS_LOCAL_RANKID",           // HPE Cray PALS (mpiexec on Cray EX)
    "FLUX_TASK_LOCAL_ID",          // Flux
    "JSM_NAMESPACE_LOCAL_RANK",    // IBM jsrun (LSF)
    "SLURM_LOCALID",               // srun
};

}  // namespace mnemosyne::config::detail
