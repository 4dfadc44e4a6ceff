// A child that pulls its heap (MNEMOSYNE_FORK_PULL_MS): the parent does not
// copy the heap before the clone. The child maps the fork's image, empty,
// at the segments' addresses, watches those pages with a userfaultfd
// (platform/page_pull.hpp) and hands it to the parent; the parent's forking
// thread, inside fork(), fills each page the child (or the kernel for it)
// touches first from its own heap as it stands, with the program's other
// threads held (no malloc or free runs) and glibc's stdio list locked, so
// that what the child pulls is of one moment. The service ends
//  - when the child execs or exits (its end of the socket closes, and its
//    memory is gone): it took only the pages it touched, the image is
//    dropped; or
//  - when the budget (the option's milliseconds, or kMaxPullShare of the
//    heap pulled) is spent, or the child is about to fork itself: the parent
//    makes the image as a fork without the pull would (copy_pass.cpp),
//    stops watching the child's pages (those not pulled then read from the
//    image) and says so ('R'), and keeps the image as the base for the
//    forks that follow (image.cpp).
// A fork with a base kept (one soon after a fork whose child took its
// image) compares against the base as before instead of pulling.
//
// The socket's protocol, one byte each way (page_pull.hpp passes the
// descriptor):
//   child -> parent  'U' + userfaultfd  serve these pages
//                    'C'                I cannot be served: copy all
//                    'F'                finish (I am about to fork)
//   parent -> child  'S'                serving
//                    'R'                the image holds everything; no page
//                                       is watched any more
// The child waits for 'S' or 'R' after 'U' or 'C', and for 'R' after 'F'.
// End of file without 'R' means the parent died: the child's pages not yet
// pulled cannot be had (see restore_failed).
#include "platform/page_pull.hpp"

#include <atomic>

#include "arena/fork/internal.hpp"

namespace mnemosyne::arena {

namespace forking {

namespace pull = platform::page_pull;

// A fault is served with the run of kPullRunBytes around it (aligned, within
// its segment): a child reading a block or a string touches its
// neighbours too, and one round trip costs more than 16 pages' copy.
constexpr std::size_t kPullRunBytes = 16 * 1024;
// Past this share of the heap's segments pulled, the parent copies the rest
// at once (a child that reads the heap all over: a worker).
constexpr std::uint64_t kMaxPullShare = 8;
// Wait slices of the service, so that a child that closed its socket
// without exec'ing (Python's close_fds) is noticed when its memory goes.
constexpr int kSliceMs = 2;

// Whether this process may pull (probed once: the credentials rarely change).
constinit std::atomic<int> g_pull_probe{0};  // 0 unknown, 1 yes, 2 no

static bool pull_possible() noexcept {
  int known = g_pull_probe.load(std::memory_order_relaxed);
  if (known == 0) {
    known = pull::available() ? 1 : 2;
    g_pull_probe.store(known, std::memory_order_relaxed);
  }
  return known == 1;
}

bool prepare_pull(bool adopt) noexcept {
  if (g_state.cfg.fork_pull_ms == 0 || g_state.forked_child) return false;
  // A base is kept: the delta over it serves (and copy_early's image, if
  // adopted, is that delta).
  if (g_fork.base.fd.open() || (g_fork.image.open() && g_fork.delta)) return false;
  if (!any_segment_needs_copy() || !pull_possible()) return false;
  if (!open_image(/*fresh=*/true)) return false;
  int ends[2];
  if (!pull::socket_pair(ends)) {
    close_image();
    return false;
  }
  g_fork.pull_parent.set(ends[0]);
  g_fork.pull_child.set(ends[1]);
  g_fork.shadow_count = 0;
  g_fork.missing_count = 0;
  const SegmentTable::Entry* entries = g_state.table.entries();
  for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
    const SegmentTable::Entry& e = entries[i];
    if (!e.used || inherited(e.segment.backend)) continue;
    const std::size_t k = g_fork.shadow_count++;
    describe(g_fork.shadows[k], e);
    g_fork.entries[k] = e;
  }
  g_fork.pull = true;
  g_fork.pull_adopt = adopt;
  return true;
}

// ---- the child's side

// The parent cannot serve, and did not copy: what was not pulled is lost,
// and never shown as zeros (the child's own writes included: it cannot tell
// which pages it has). Every segment becomes a missing one (child.cpp).
static void restore_failed() noexcept {
  for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
    const Shadow& s = g_fork.shadows[i];
    g_fork.missing[g_fork.missing_count++] = Missing{s.target, s.size};
  }
  g_fork.child_incomplete = true;
}

// The child's descriptors, where they are still its own: the program may
// have closed them and reused the numbers.
static void forget_reused() noexcept {
  if (pull::file_id(g_fork.pull_faults.fd()) != g_fork.pull_faults_id) g_fork.pull_faults.forget();
  if (pull::file_id(g_fork.pull_child.fd()) != g_fork.pull_child_id) g_fork.pull_child.forget();
}

// The pull is over in the child: the parent watches nothing any more (its
// 'R'), or never started; the child's own registrations dropped too.
static void end_pull_in_child() noexcept {
  forget_reused();
  if (g_fork.pull_faults.open()) {
    for (std::size_t i = 0; i < g_fork.pull_count; ++i) {
      pull::unwatch(g_fork.pull_faults.fd(), g_fork.shadows[i].target, g_fork.shadows[i].size);
    }
  }
  g_fork.pull_faults.close();
  g_fork.pull_child.close();
  g_fork.pull = false;
}

// Waits for the parent's answer: 'S' (it serves) or 'R' (the image is whole).
static char parent_answer() noexcept {
  char answer = 0;
  while (pull::receive_byte(g_fork.pull_child.fd(), &answer)) {
    if (answer == 'S' || answer == 'R') return answer;
  }
  return 0;  // end of file: the parent is gone
}

void start_pull_in_child() noexcept {
  g_fork.pull_parent.close();
  const int socket = g_fork.pull_child.fd();
  g_fork.pull_count = g_fork.shadow_count;
  int faults = pull::open_faults();
  bool watched = faults >= 0;
  for (std::size_t i = 0; watched && i < g_fork.shadow_count; ++i) {
    watched = pull::watch(faults, g_fork.shadows[i].target, g_fork.shadows[i].size);
  }
  g_fork.pull_child_id = pull::file_id(socket);
  if (watched) {
    g_fork.pull_faults.set(faults);
    g_fork.pull_faults_id = pull::file_id(faults);
    // A failed send (the parent gave up waiting and closed) still finds its
    // 'R' in the socket.
    pull::send_with_fd(socket, 'U', faults);
  } else {
    pull::close(faults);
    pull::send_byte(socket, 'C');
  }
  const char answer = parent_answer();
  if (answer == 'S') return;  // pulling, until it execs, exits or forks
  end_pull_in_child();
  if (answer != 'R') restore_failed();
}

}  // namespace forking

using namespace forking;

void finish_pull_in_child() noexcept {
  if (!g_fork.pull || !g_state.forked_child) return;
  forget_reused();
  if (!g_fork.pull_child.open()) {
    // The program closed the socket (and the parent saw it end, and serves
    // on until the budget ends): wait until the parent has made the image
    // and stopped watching, which a fresh userfaultfd tells by being able
    // to watch the same pages.
    while (g_fork.pull_count != 0 &&
           pull::watched(g_fork.shadows[0].target, g_fork.shadows[0].size)) {
      Os::sleep_ns(1000 * 1000);
    }
    end_pull_in_child();
    return;
  }
  // Its own child would not inherit the watch (a userfaultfd without
  // UFFD_FEATURE_EVENT_FORK): every page first, from the parent's image.
  pull::send_byte(g_fork.pull_child.fd(), 'F');
  char answer = 0;
  while (pull::receive_byte(g_fork.pull_child.fd(), &answer) && answer != 'R') {
  }
  if (answer == 'R') {
    end_pull_in_child();
    return;
  }
  // The parent died while this child pulled: pages not pulled have no
  // source. They stay watched (a touch waits, as for a page nobody serves)
  // rather than read as zeros; said in docs/fork.md.
  g_fork.pull_child.close();
  g_fork.pull = false;
}

// ---- the parent's side

namespace forking {

namespace {

struct Service {
  int faults = -1;
  int socket = -1;  // -1 once the child has closed its end
  std::uint64_t deadline = 0;
  std::uint64_t pulled = 0;
  std::uint64_t max_pulled = 0;
  bool gone = false;  // the child exec'd or exited
};

const Shadow* shadow_of(std::uintptr_t address) noexcept {
  for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
    const auto start = reinterpret_cast<std::uintptr_t>(g_fork.shadows[i].target);
    if (address - start < g_fork.shadows[i].size) return &g_fork.shadows[i];
  }
  return nullptr;
}

void serve_fault(Service& sv, std::uintptr_t address) noexcept {
  const Shadow* s = shadow_of(address);
  if (s == nullptr) return;  // not ours: nothing to fill (cannot happen: we watch only these)
  const auto start = reinterpret_cast<std::uintptr_t>(s->target);
  std::uintptr_t from = address & ~static_cast<std::uintptr_t>(kPullRunBytes - 1);
  std::uintptr_t to = from + kPullRunBytes;
  if (from < start) from = start;
  if (to > start + s->size) to = start + s->size;
  const long n = pull::fill(sv.faults, from, to - from);
  if (n < 0) {
    sv.gone = true;
    return;
  }
  sv.pulled += static_cast<std::uint64_t>(n);
}

// Whether the child's memory is still there (it closed its socket: exec,
// exit, or a close of every descriptor before an exec).
bool child_alive(Service& sv) noexcept {
  if (g_fork.shadow_count == 0) return false;
  const auto first = reinterpret_cast<std::uintptr_t>(g_fork.shadows[0].target);
  const long n = pull::fill(sv.faults, first, Os::page_size());
  if (n > 0) sv.pulled += static_cast<std::uint64_t>(n);
  return n >= 0;
}

// The free space of the heap (runs of kMinFreeBytes or more outside the live
// ranges, kMaxFreeRuns of them at most), as child.cpp's map_free_space
// makes it: the zero page in the child, where the image's holes would add a
// page to the image for each one the child writes.
void zero_free_space(int faults) noexcept {
  const std::size_t page = Os::page_size();
  std::size_t runs = kMaxFreeRuns;
  for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
    const Shadow& s = g_fork.shadows[i];
    if (s.live == nullptr) continue;
    const std::size_t pages = s.size / page;
    const auto start = reinterpret_cast<std::uintptr_t>(s.target);
    for (std::size_t p = 0; p < pages && runs > 0;) {
      if (bit(s.live, p)) {
        ++p;
        continue;
      }
      std::size_t q = p + 1;
      while (q < pages && !bit(s.live, q)) ++q;
      if ((q - p) * page >= kMinFreeBytes) {
        pull::zero(faults, start + p * page, (q - p) * page);
        --runs;
      }
      p = q;
    }
  }
}

// The rest of the heap into the image, as a fork without the pull makes it;
// then no page is watched, and the child is told.
void fill_image(Service& sv) noexcept {
  if (lift_file_size_limit()) {
    copy_all(g_fork.pull_adopt);
  } else {
    // No image can be written: every segment missing (below).
    for (std::size_t i = 0; i < g_fork.shadow_count; ++i) {
      const Shadow& s = g_fork.shadows[i];
      g_fork.missing[g_fork.missing_count++] = Missing{s.target, s.size};
    }
    g_fork.shadow_count = 0;
  }
  restore_file_size_limit();
  if (g_fork.pull_adopt) drop_early();
  // A segment the image could not take goes to the child whole, page by
  // page, through the watch (memory of its own, not shared with siblings).
  for (std::size_t i = 0; i < g_fork.missing_count && sv.faults >= 0; ++i) {
    const auto at = reinterpret_cast<std::uintptr_t>(g_fork.missing[i].start);
    const long n = pull::fill(sv.faults, at, g_fork.missing[i].size);
    if (n > 0) sv.pulled += static_cast<std::uint64_t>(n);
  }
  g_fork.missing_count = 0;  // the child has them all
  if (sv.faults >= 0) zero_free_space(sv.faults);
  if (sv.faults >= 0) {
    const SegmentTable::Entry* entries = g_state.table.entries();
    for (std::size_t i = 0; i < g_state.table.high_water(); ++i) {
      const SegmentTable::Entry& e = entries[i];
      if (e.used && !inherited(e.segment.backend)) {
        pull::unwatch(sv.faults, e.segment.start, e.segment.size);
      }
    }
  }
  pull::send_byte(g_fork.pull_parent.fd(), 'R');
}

// Until the child's 'U' (or 'C'), its end of file, or the deadline.
void await_child(Service& sv) noexcept {
  std::uintptr_t unused = 0;
  for (;;) {
    const std::uint64_t now = Os::monotonic_ns();
    if (now >= sv.deadline) return;
    const int ms = static_cast<int>((sv.deadline - now) / 1'000'000) + 1;
    const pull::Event ev = pull::wait(-1, sv.socket, ms, &unused);
    if (ev == pull::Event::timeout) continue;
    if (ev != pull::Event::message) return;
    char byte = 0;
    int fd = -1;
    if (!pull::receive_with_fd(sv.socket, &byte, &fd)) {
      sv.gone = true;  // exec'd or exited before it took its heap
      return;
    }
    if (byte == 'U' && fd >= 0) {
      sv.faults = fd;
      pull::send_byte(sv.socket, 'S');
      return;
    }
    pull::close(fd);
    if (byte == 'C') return;  // copy all: fill_image, at once
  }
}

}  // namespace

}  // namespace forking

bool fork_pull_enabled() noexcept {
  return g_state.cfg.fork_pull_ms != 0;
}

bool fork_may_pull() noexcept {
  return g_state.cfg.fork_pull_ms != 0 && !g_state.forked_child &&
         g_fork.base_deadline.load(std::memory_order_acquire) == 0 && pull_possible();
}

bool fork_child_pulls() noexcept {
  return g_fork.pull;
}

void serve_forked_child() noexcept {
  if (!g_fork.pull) return;
  g_fork.pull = false;
  g_fork.pull_child.close();
  Service sv;
  sv.socket = g_fork.pull_parent.fd();
  sv.deadline = Os::monotonic_ns() + std::uint64_t{g_state.cfg.fork_pull_ms} * 1'000'000;
  std::uint64_t heap = 0;
  for (std::size_t i = 0; i < g_fork.shadow_count; ++i) heap += g_fork.shadows[i].size;
  sv.max_pulled = heap / kMaxPullShare;
  await_child(sv);
  bool finish = sv.faults < 0 && !sv.gone;  // no service: copy now
  while (!finish && !sv.gone) {
    const std::uint64_t now = Os::monotonic_ns();
    if (now >= sv.deadline || sv.pulled > sv.max_pulled) {
      finish = true;
      break;
    }
    std::uintptr_t address = 0;
    const pull::Event ev = pull::wait(sv.faults, sv.socket, kSliceMs, &address);
    if (ev == pull::Event::fault) {
      serve_fault(sv, address);
    } else if (ev == pull::Event::message) {
      char byte = 0;
      if (pull::receive_byte(sv.socket, &byte)) {
        finish = byte == 'F';
      } else {
        sv.socket = -1;  // closed: exec'd, exited, or closed every descriptor
        sv.gone = !child_alive(sv);
      }
    } else if (ev == pull::Event::timeout && sv.socket < 0) {
      sv.gone = !child_alive(sv);
    } else if (ev == pull::Event::error) {
      finish = true;
    }
  }
  if (finish && !sv.gone) {
    fill_image(sv);
  } else {
    // The child took what it touched: the image holds nothing, and no base
    // is made of it.
    g_fork.shadow_count = 0;
    g_fork.missing_count = 0;
    if (g_fork.pull_adopt) drop_early();
    close_image();
  }
  g_state.fork_bytes_copied.fetch_add(sv.pulled, std::memory_order_relaxed);
  pull::close(sv.faults);
  g_fork.pull_parent.close();
}

}  // namespace mnemosyne::arena
