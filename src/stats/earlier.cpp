#include "stats/earlier.hpp"

#include <atomic>

#include "stats/counters.hpp"

namespace mnemosyne::stats {
namespace {

// Open addressing, linear probing: 0 is an empty slot, 1 one whose block
// was freed (probing goes on past it). Written with compare-and-swap only.
constexpr std::size_t kSlots = std::size_t{1} << 14;
constexpr std::uintptr_t kEmpty = 0;
constexpr std::uintptr_t kGone = 1;
constinit std::atomic<std::uintptr_t> g_table[kSlots] = {};
constinit std::atomic<std::uint64_t> g_count{0};
constinit std::atomic<std::uint64_t> g_bytes{0};
constinit std::atomic<std::uint64_t> g_not_remembered{0};
constinit std::atomic<bool> g_any{false};  // nothing to look up before the first

std::size_t home(std::uintptr_t key) noexcept {
  return static_cast<std::size_t>((key >> 4) * 0x9e3779b97f4a7c15ull >> 50) & (kSlots - 1);
}

// The slot holding `block`, or nullptr.
std::atomic<std::uintptr_t>* find(const void* block) noexcept {
  const auto key = reinterpret_cast<std::uintptr_t>(block);
  for (std::size_t i = 0, at = home(key); i < kSlots; ++i, at = (at + 1) & (kSlots - 1)) {
    const std::uintptr_t v = g_table[at].load(std::memory_order_acquire);
    if (v == key) return &g_table[at];
    if (v == kEmpty) return nullptr;
  }
  return nullptr;
}

bool take(const void* block) noexcept {
  if (!g_any.load(std::memory_order_acquire) || block == nullptr) return false;
  std::atomic<std::uintptr_t>* slot = find(block);
  auto key = reinterpret_cast<std::uintptr_t>(block);
  return slot != nullptr && slot->compare_exchange_strong(key, kGone, std::memory_order_acq_rel);
}

}  // namespace

bool remember_earlier(const void* block) noexcept {
  const auto key = reinterpret_cast<std::uintptr_t>(block);
  if (key <= kGone) return true;
  g_any.store(true, std::memory_order_release);
  for (std::size_t i = 0, at = home(key); i < kSlots; ++i, at = (at + 1) & (kSlots - 1)) {
    std::uintptr_t v = g_table[at].load(std::memory_order_relaxed);
    if (v == key) return true;
    if (v == kEmpty && g_table[at].compare_exchange_strong(v, key, std::memory_order_acq_rel)) {
      return true;
    }
  }
  g_not_remembered.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void forget_earlier(const void* block) noexcept {
  take(block);
}

void count_system_free(const void* block, std::size_t usable) noexcept {
  if (take(block)) {
    g_count.fetch_add(1, std::memory_order_relaxed);
    g_bytes.fetch_add(usable, std::memory_order_relaxed);
    return;
  }
  count_free(kSystemPool, usable);
}

EarlierFrees earlier_frees() noexcept {
  EarlierFrees out;
  out.count = g_count.load(std::memory_order_relaxed);
  out.bytes = g_bytes.load(std::memory_order_relaxed);
  out.not_remembered = g_not_remembered.load(std::memory_order_relaxed);
  return out;
}

}  // namespace mnemosyne::stats
