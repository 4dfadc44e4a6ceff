// call_guarded on Windows: fn runs on a worker thread of its own, watched by
// a vectored exception handler. A fatal exception raised on that thread
// (an access violation inside the driver, say) is not passed to the
// program's handlers: the thread's context is pointed at a function that
// records the exception and ends the thread, and the caller reports the
// driver as unavailable. The caller waits kGuardTimeoutMs at most.
//
// The worker can only start once the loader lock is free: the interposer
// never starts the driver from DllMain (interpose/windows/start.cpp).
#include <windows.h>

#include <atomic>
#include <cstdio>

#include "platform/crash_guard.hpp"
#include "platform/platform.hpp"

namespace mnemosyne {
namespace {

struct Guarded {
  void (*fn)(void*);
  void* arg;
  std::atomic<DWORD> thread_id{0};
  std::atomic<DWORD> exception{0};  // the code that ended fn; 0 while none
};

// Static: a worker that outlives its timeout must still find it.
constinit Guarded g_call{};

[[noreturn]] void end_crashed_thread() {
  ExitThread(1);
}

LONG CALLBACK on_exception(EXCEPTION_POINTERS* info) {
  if (GetCurrentThreadId() != g_call.thread_id.load(std::memory_order_acquire)) {
    return EXCEPTION_CONTINUE_SEARCH;
  }
  const DWORD code = info->ExceptionRecord->ExceptionCode;
  switch (code) {
    case EXCEPTION_ACCESS_VIOLATION:
    case EXCEPTION_ILLEGAL_INSTRUCTION:
    case EXCEPTION_PRIV_INSTRUCTION:
    case EXCEPTION_IN_PAGE_ERROR:
    case EXCEPTION_INT_DIVIDE_BY_ZERO:
    case EXCEPTION_STACK_OVERFLOW:
    case EXCEPTION_DATATYPE_MISALIGNMENT:
      break;
    default:
      return EXCEPTION_CONTINUE_SEARCH;  // the driver's own C++ exceptions and the like
  }
  g_call.exception.store(code, std::memory_order_release);
  // Resume in end_crashed_thread on a 16-byte aligned stack, as after a call.
  CONTEXT* ctx = info->ContextRecord;
  ctx->Rsp = (ctx->Rsp & ~DWORD64{15}) - 8;
  ctx->Rip = reinterpret_cast<DWORD64>(&end_crashed_thread);
  return EXCEPTION_CONTINUE_EXECUTION;
}

DWORD WINAPI run_guarded(void*) {
  g_call.fn(g_call.arg);
  return 0;
}

const char* exception_name(DWORD code) noexcept {
  switch (code) {
    case EXCEPTION_ACCESS_VIOLATION:
      return "access violation";
    case EXCEPTION_ILLEGAL_INSTRUCTION:
      return "illegal instruction";
    case EXCEPTION_PRIV_INSTRUCTION:
      return "privileged instruction";
    case EXCEPTION_IN_PAGE_ERROR:
      return "in-page error";
    case EXCEPTION_INT_DIVIDE_BY_ZERO:
      return "integer division by zero";
    case EXCEPTION_STACK_OVERFLOW:
      return "stack overflow";
    default:
      return "misaligned data";
  }
}

// kGuardTimeoutMs, or MNEMOSYNE_TEST_DRIVER_TIMEOUT_MS (tests/windows: a
// test of the timeout should not wait a minute).
DWORD guard_timeout_ms() noexcept {
  const char* text = Os::secure_env("MNEMOSYNE_TEST_DRIVER_TIMEOUT_MS");
  if (text == nullptr || *text == '\0') return kGuardTimeoutMs;
  DWORD ms = 0;
  for (; *text >= '0' && *text <= '9' && ms < 10000000; ++text) ms = ms * 10 + (*text - '0');
  return *text == '\0' && ms > 0 ? ms : kGuardTimeoutMs;
}

}  // namespace

bool call_guarded(void (*fn)(void*), void* arg, char* what, std::size_t len) noexcept {
  g_call.fn = fn;
  g_call.arg = arg;
  g_call.exception.store(0, std::memory_order_relaxed);
  PVOID handler = AddVectoredExceptionHandler(1, &on_exception);
  DWORD id = 0;
  HANDLE thread = CreateThread(nullptr, 0, &run_guarded, nullptr, CREATE_SUSPENDED, &id);
  if (thread == nullptr) {
    if (handler != nullptr) RemoveVectoredExceptionHandler(handler);
    fn(arg);  // no thread to spare: unguarded, as a program calling the driver would
    return true;
  }
  g_call.thread_id.store(id, std::memory_order_release);
  ResumeThread(thread);
  const DWORD timeout_ms = guard_timeout_ms();
  const DWORD waited = WaitForSingleObject(thread, timeout_ms);
  CloseHandle(thread);
  if (waited != WAIT_OBJECT_0) {
    // Left running: the handler stays, in case it crashes later.
    std::snprintf(what, len, "gave no answer within %.1f s", timeout_ms / 1000.0);
    return false;
  }
  if (handler != nullptr) RemoveVectoredExceptionHandler(handler);
  g_call.thread_id.store(0, std::memory_order_release);
  const DWORD code = g_call.exception.load(std::memory_order_acquire);
  if (code != 0) {
    std::snprintf(what, len, "crashed inside the driver (exception 0x%08lx, %s)",
                  static_cast<unsigned long>(code), exception_name(code));
    return false;
  }
  return true;
}

}  // namespace mnemosyne
