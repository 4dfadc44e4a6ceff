// The operating system below the backends: one struct of static functions,
// declared once here and defined per OS in platform_<os>.cpp (snmalloc's PAL
// idea), checked by one concept. The code above never sees an #ifdef for
// loading the driver, mapping pages or reading a setting.
#pragma once

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>

#if !defined(_WIN32)
#include <signal.h>
#endif

namespace mnemosyne::platform {

// wait_while_equal's timeout for "until woken".
inline constexpr std::uint64_t kNoTimeout = ~std::uint64_t{0};

// Each OS defines these in platform_<os>.cpp. Nothing here allocates through
// malloc: it runs inside the allocator's own slow paths.
template <class P>
concept Layer = requires(const char* text, char* buf, std::size_t n, void* p, int* err) {
  // The CUDA driver library names to try, in order, when none is given.
  { P::kDriverNames[0] } -> std::convertible_to<const char*>;
  // A library, loaded once and never unloaded; nullptr with a reason in buf.
  { P::open_library(text, buf, n) } -> std::same_as<void*>;
  { P::find_symbol(p, text) } -> std::same_as<void*>;
  // Zeroed read-write private pages; nullptr with the OS error in *err.
  { P::map_pages(n, err) } -> std::same_as<void*>;
  { P::unmap_pages(p, n) } -> std::same_as<bool>;
  { P::page_size() } -> std::same_as<std::size_t>;
  // A setting from the environment; ignored (nullptr) where a program runs
  // with more privilege than its caller (set-uid on Linux).
  { P::secure_env(text) } -> std::same_as<const char*>;
  // Waiting for another thread: a yield for the first spins, then a sleep.
  { P::pause(n) } -> std::same_as<void>;
  { P::monotonic_ns() } -> std::same_as<std::uint64_t>;
  { P::process_id() } -> std::same_as<long>;
  // The calling thread's id, and the CPU time (ns) a thread of this process
  // has used so far, by id; 0 when it cannot be read (the thread is gone).
  { P::thread_id() } -> std::same_as<long>;
  { P::thread_cpu_ns(0L) } -> std::same_as<std::uint64_t>;
  // Whether the NVIDIA kernel module zero-fills the pinned host memory it
  // hands out (its InitializeSystemMemoryAllocations setting): 1 yes, 0 no,
  // -1 when this OS or machine does not say. The setting's text goes to buf.
  { P::nvidia_zeroes_pinned_memory(buf, n) } -> std::same_as<int>;
  // Keeps a child created by fork() from inheriting [p, p + n) (Linux:
  // MADV_DONTFORK); false with the OS error in *err. Windows has no fork.
  { P::exclude_from_fork(p, n, err) } -> std::same_as<bool>;
  { P::sleep_ns(std::uint64_t{0}) } -> std::same_as<void>;
  // Whether the process is being torn down with its other threads already
  // stopped, wherever they were (perhaps inside the driver, holding its
  // locks): no driver call may be made. Windows: DLL_PROCESS_DETACH of an
  // exiting process (RtlDllShutdownInProgress). Linux: never (atexit
  // handlers and destructors run with every thread alive).
  { P::process_exiting() } -> std::same_as<bool>;
  // The contents of [p, p + n), pages of map_pages, are no longer needed:
  // the OS takes their frames back (resident memory drops) and the range
  // stays mapped, reading zero or its old contents (Linux MADV_DONTNEED:
  // zero; Windows MEM_RESET: either). False when the OS refused.
  { P::discard_pages(p, n) } -> std::same_as<bool>;
  // Sleeping while *word still holds `seen`, at most timeout_ns (it may also
  // return early; kNoTimeout: no limit), and waking every thread sleeping on word: a futex on
  // Linux, WaitOnAddress on Windows. Here, not std::atomic::wait, whose libstdc++ error path would
  // make the preload library load libstdc++ into every process.
  {
    P::wait_while_equal(static_cast<std::atomic<std::uint32_t>*>(nullptr), std::uint32_t{0},
                        kNoTimeout)
    } -> std::same_as<void>;
  { P::wake_all(static_cast<std::atomic<std::uint32_t>*>(nullptr)) } -> std::same_as<void>;
  // A detached thread of mnemosyne's own running fn(p), started with every
  // asynchronous signal blocked (the program's signals go to the threads it
  // chose); false when the OS refused.
  { P::start_thread(static_cast<void (*)(void*)>(nullptr), p) } -> std::same_as<bool>;
  // The CPUs this process may run on (Linux: its affinity mask), at least 1.
  { P::cpu_count() } -> std::same_as<std::size_t>;
}
&&requires(typename P::SignalMask* mask, const typename P::SignalMask& saved) {
  // The asynchronous signals (every one but the faults a thread raises
  // itself, which must stay deliverable) blocked on the calling thread, and
  // the earlier mask put back: around a lock that a signal handler on the
  // same thread could also need (it may fork), and for threads the driver
  // starts. Windows has no signals: nothing to do there.
  { P::block_async_signals(mask) } -> std::same_as<void>;
  { P::restore_signals(saved) } -> std::same_as<void>;
};

// The one declaration of the layer; platform_linux.cpp and
// platform_windows.cpp each define it for their OS.
struct System {
#if defined(_WIN32)
  struct SignalMask {};  // no signals
  static constexpr const char* kDriverNames[] = {"nvcuda.dll"};
#else
  using SignalMask = sigset_t;
  static constexpr const char* kDriverNames[] = {"libcuda.so.1", "libcuda.so"};
#endif
  static void* open_library(const char* path, char* error, std::size_t len) noexcept;
  static void* find_symbol(void* library, const char* name) noexcept;
  static void* map_pages(std::size_t size, int* error) noexcept;
  static bool unmap_pages(void* ptr, std::size_t size) noexcept;
  static std::size_t page_size() noexcept;
  static const char* secure_env(const char* name) noexcept;
  static void pause(std::size_t spins) noexcept;
  static std::uint64_t monotonic_ns() noexcept;
  static long process_id() noexcept;
  static long thread_id() noexcept;
  static std::uint64_t thread_cpu_ns(long tid) noexcept;
  static int nvidia_zeroes_pinned_memory(char* source, std::size_t len) noexcept;
  static bool exclude_from_fork(void* ptr, std::size_t size, int* error) noexcept;
  static void sleep_ns(std::uint64_t ns) noexcept;
  static bool discard_pages(void* ptr, std::size_t size) noexcept;
  static void wait_while_equal(std::atomic<std::uint32_t>* word, std::uint32_t seen,
                               std::uint64_t timeout_ns = kNoTimeout) noexcept;
  static void wake_all(std::atomic<std::uint32_t>* word) noexcept;
  static bool process_exiting() noexcept;
  static bool start_thread(void (*fn)(void*), void* arg) noexcept;
  static std::size_t cpu_count() noexcept;
  static void block_async_signals(SignalMask* saved) noexcept;
  static void restore_signals(const SignalMask& saved) noexcept;
};

}  // namespace mnemosyne::platform

namespace mnemosyne {
using Os = platform::System;
static_assert(platform::Layer<Os>);

// RAII over Os::block_async_signals / restore_signals.
class AsyncSignalsBlocked {
 public:
  AsyncSignalsBlocked() noexcept { Os::block_async_signals(&saved_); }
  ~AsyncSignalsBlocked() { Os::restore_signals(saved_); }
  AsyncSignalsBlocked(const AsyncSignalsBlocked&) = delete;
  AsyncSignalsBlocked& operator=(const AsyncSignalsBlocked&) = delete;

 private:
  Os::SignalMask saved_;
};
}  // namespace mnemosyne

// printf-style checking of our own formatting functions: mingw-w64's
// headers check against the MS runtime's format unless told it is the C99
// one (the build defines __USE_MINGW_ANSI_STDIO=1 on Windows).
#if defined(_WIN32)
#define MNEMOSYNE_PRINTF(fmt, first) __attribute__((format(gnu_printf, fmt, first)))
#else
#define MNEMOSYNE_PRINTF(fmt, first) __attribute__((format(printf, fmt, first)))
#endif
