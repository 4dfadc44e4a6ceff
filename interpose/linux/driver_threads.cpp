// Threads the driver starts while mnemosyne is inside a driver call (cuInit
// starts several) are marked as driver-owned: their mallocs may come from
// the arena, but never make it call the driver again. Such a thread can hold
// the driver's own lock when it calls malloc, and asking the driver for a new
// segment from there would deadlock.
//
// They also start with every asynchronous signal blocked. The program did
// not start them and cannot know to block its signals there: a signal it
// blocks in its own threads, to sigwait() it or read it from a signalfd,
// would otherwise be delivered to the driver's thread instead (a handler run
// there, or the default action killing the process). The new thread inherits
// its creator's mask, so the creator blocks them just around the creation.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>

#include "backend/driver_call.hpp"
#include "driver_threads.hpp"
#include "libc.hpp"
#include "platform/platform.hpp"

namespace {

using CreateFn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
std::atomic<CreateFn> g_real_create{nullptr};

CreateFn real_create() noexcept {
  CreateFn fn = g_real_create.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<CreateFn>(dlsym(RTLD_NEXT, "pthread_create"));
    g_real_create.store(fn, std::memory_order_release);
  }
  return fn;
}

struct Start {
  void* (*routine)(void*);
  void* arg;
};

// The driver's threads alive (fork.cpp: a fork's child pulls its heap only
// when the program has no thread of its own besides the forking one). A
// thread-specific value's destructor counts each end, pthread_exit's too.
constinit std::atomic<long> g_live{0};
constinit pthread_key_t g_end_key{};
constinit std::atomic<bool> g_end_key_made{false};

void on_driver_thread_end(void*) {
  g_live.fetch_sub(1, std::memory_order_relaxed);
}

void* driver_thread_main(void* raw) {
  const Start start = *static_cast<Start*>(raw);
  __libc_free(raw);
  mnemosyne::mark_thread_as_driver_owned();
  if (g_end_key_made.load(std::memory_order_acquire)) {
    pthread_setspecific(g_end_key, &g_live);  // any non-null value
  }
  return start.routine(start.arg);
}

}  // namespace

namespace mnemosyne {
long live_driver_threads() noexcept {
  return g_live.load(std::memory_order_relaxed);
}
}  // namespace mnemosyne

extern "C" __attribute__((visibility("default"))) int pthread_create(pthread_t* thread,
                                                                     const pthread_attr_t* attr,
                                                                     void* (*routine)(void*),
                                                                     void* arg) {
  const CreateFn create = real_create();
  if (create == nullptr) return EAGAIN;
  if (!mnemosyne::in_driver_call()) return create(thread, attr, routine, arg);
  // Made once, by the first driver thread's creator (inside a driver call,
  // which the driver serializes with its own lock; the flag makes it once).
  if (!g_end_key_made.load(std::memory_order_acquire) &&
      pthread_key_create(&g_end_key, &on_driver_thread_end) == 0) {
    g_end_key_made.store(true, std::memory_order_release);
  }
  auto* start = static_cast<Start*>(__libc_malloc(sizeof(Start)));
  if (start == nullptr) return EAGAIN;
  *start = Start{routine, arg};
  int rc;
  {
    mnemosyne::AsyncSignalsBlocked inherited_by_the_thread;
    rc = create(thread, attr, &driver_thread_main, start);
  }
  if (rc != 0) {
    __libc_free(start);
  } else if (g_end_key_made.load(std::memory_order_acquire)) {
    g_live.fetch_add(1, std::memory_order_relaxed);
  }
  return rc;
}
