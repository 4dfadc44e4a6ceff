// The work of the C++ allocation functions (new_delete.cpp exports them).
// Failure follows the standard: call the new-handler and retry while there
// is one, else throw std::bad_alloc (nothrow forms: return null).
//
// The handler and the exception are the process's own C++ runtime's, found
// in the libstdc++ (or libc++) that is loaded: std::get_new_handler (the
// handler the program set with std::set_new_handler) and
// std::__throw_bad_alloc. A nothrow form with a handler set is handed to the
// runtime's own nothrow operator new, which calls the throwing form (ours,
// through the global symbol) and catches what the handler throws.
//
// Why not link them: the library would then load libstdc++ into every
// process it is preloaded in, C programs included, whose relocation alone
// costs /bin/true 1.6 million instructions; and a private get_new_handler
// (mimalloc's C sources define a weak one that returns null) never sees the
// handler the program set. A process that calls operator new has a C++
// runtime loaded, perhaps RTLD_LOCAL (a Python extension): it is found by
// name with RTLD_NOLOAD, not in the global scope. Not the runtime's aligned
// operator new either: libstdc++ 12 rounds the size up to the alignment
// without an overflow check, so a request near SIZE_MAX gets a tiny block.
#include "cxx_alloc.hpp"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "api_names.hpp"

#ifdef MNEMOSYNE_API_PREFIX
extern "C" int MNEMOSYNE_API(posix_memalign)(void** out, std::size_t alignment,
                                             std::size_t size) noexcept;
#endif

namespace mnemosyne::cxx {
namespace {

// What is used of the runtime, by its names in libstdc++ and in libc++.
enum Piece : int { kGetHandler, kThrowBadAlloc, kNothrow, kAlignedNothrow, kPieceCount };
constexpr const char* kRuntimes[] = {"libstdc++.so.6", "libc++.so.1"};
constexpr const char* kSymbols[kPieceCount][2] = {
    {"_ZSt15get_new_handlerv", "_ZSt15get_new_handlerv"},
    {"_ZSt17__throw_bad_allocv", "_ZNSt3__117__throw_bad_allocEv"},
    {"_ZnwmRKSt9nothrow_t", "_ZnwmRKSt9nothrow_t"},
    {"_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnwmSt11align_val_tRKSt9nothrow_t"},
};

constinit std::atomic<void*> g_pieces[kPieceCount] = {};
constinit std::atomic<bool> g_resolved{false};

// The runtime's `piece`, or nullptr when no C++ runtime is loaded. Found at
// start (a program linked with libstdc++ has it loaded by then), else on
// the first failed allocation, and again later while none is found.
void* runtime(Piece piece) noexcept {
  resolve_runtime();
  return g_pieces[piece].load(std::memory_order_relaxed);
}

std::new_handler new_handler() noexcept {
  void* fn = runtime(kGetHandler);
  return fn != nullptr ? reinterpret_cast<std::new_handler (*)() noexcept>(fn)() : nullptr;
}

[[noreturn]] void throw_bad_alloc(std::size_t size) {
  if (void* fn = runtime(kThrowBadAlloc)) reinterpret_cast<void (*)()>(fn)();
  char line[256];
  const int n = std::snprintf(line, sizeof line,
                              "mnemosyne: operator new(%zu) failed and no C++ runtime "
                              "(libstdc++.so.6, libc++.so.1) is loaded to throw "
                              "std::bad_alloc; aborting\n",
                              size);
  if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<std::size_t>(n));
  std::abort();
}

void* aligned_attempt(std::size_t size, std::align_val_t alignment) noexcept {
  const auto align = static_cast<std::size_t>(alignment);
  void* p = nullptr;
  return MNEMOSYNE_API(posix_memalign)(&p, align < sizeof(void*) ? sizeof(void*) : align, size) == 0
             ? p
             : nullptr;
}

// Not std::nothrow: that object lives in libstdc++. The argument is a tag.
constexpr std::nothrow_t kNothrowTag{};

}  // namespace

namespace {

// Which of kRuntimes appear loaded (bit r), asked of the loader's own list:
// dlopen(RTLD_NOLOAD) of a name that is not loaded searches the library path
// like a real load (ld.so.cache, open, read), twenty system calls at the
// start of every C program. A file whose name begins with the runtime's
// (libstdc++.so.6.0.30 loaded by its path) counts: dlopen then finds it by
// its soname.
unsigned loaded_runtimes() noexcept {
  unsigned found = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) noexcept -> int {
        if (info->dlpi_name == nullptr) return 0;
        const char* slash = std::strrchr(info->dlpi_name, '/');
        const char* base = slash != nullptr ? slash + 1 : info->dlpi_name;
        for (std::size_t r = 0; r < std::size(kRuntimes); ++r) {
          // The name up to ".so" and one more character: "libstdc++.so."
          const std::size_t stem = std::strlen(kRuntimes[r]) - 1;
          if (std::strncmp(base, kRuntimes[r], stem) == 0) *static_cast<unsigned*>(out) |= 1u << r;
        }
        return 0;
      },
      &found);
  return found;
}

}  // namespace

// dlopen and dlsym allocate: called at start, or on a failure, when malloc
// may fail them too.
void resolve_runtime() noexcept {
  if (g_resolved.load(std::memory_order_acquire)) return;
  const unsigned loaded = loaded_runtimes();
  for (std::size_t r = 0; r < std::size(kRuntimes); ++r) {
    if ((loaded & (1u << r)) == 0) continue;
    void* lib = dlopen(kRuntimes[r], RTLD_LAZY | RTLD_NOLOAD);
    if (lib == nullptr) continue;
    for (int i = 0; i < kPieceCount; ++i) {
      g_pieces[i].store(dlsym(lib, kSymbols[i][r]), std::memory_order_relaxed);
    }
    dlclose(lib);  // only the reference RTLD_NOLOAD took: the runtime stays
    g_resolved.store(true, std::memory_order_release);
    return;
  }
}

void* allocate_failed(std::size_t size) {
  for (;;) {
    const std::new_handler handler = new_handler();
    if (handler == nullptr) throw_bad_alloc(size);
    handler();
    if (void* p = fast_malloc(size)) return p;
  }
}

void* allocate_aligned(std::size_t size, std::align_val_t alignment) {
  for (;;) {
    if (void* p = aligned_attempt(size, alignment)) return p;
    const std::new_handler handler = new_handler();
    if (handler == nullptr) throw_bad_alloc(size);
    handler();
  }
}

// With a handler set, what it throws must become nullptr: the runtime's
// nothrow form catches it (this library is built without exceptions).
void* allocate_nothrow(std::size_t size) noexcept {
  if (void* p = fast_malloc(size)) return p;
  if (new_handler() == nullptr) return nullptr;
  using Fn = void* (*)(std::size_t, const std::nothrow_t&) noexcept;
  return reinterpret_cast<Fn>(runtime(kNothrow))(size, kNothrowTag);
}

void* allocate_aligned_nothrow(std::size_t size, std::align_val_t alignment) noexcept {
  if (void* p = aligned_attempt(size, alignment)) return p;
  if (new_handler() == nullptr) return nullptr;
  using Fn = void* (*)(std::size_t, std::align_val_t, const std::nothrow_t&) noexcept;
  return reinterpret_cast<Fn>(runtime(kAlignedNothrow))(size, alignment, kNothrowTag);
}

}  // namespace mnemosyne::cxx
