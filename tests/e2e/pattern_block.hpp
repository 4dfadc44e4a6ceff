// Self-checking heap blocks for the end-to-end probes:
// [magic][seed][size][words derived from seed]. The magic is written last and
// sits first, so a block whose magic is set has its whole body written (in a
// plain fork's child as in mnemosyne's, whose copy runs in address order).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace test {

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

inline constexpr std::uint64_t kMagic = 0x6d6e656d6f73796eull;
struct Header {
  std::atomic<std::uint64_t> magic;
  std::uint64_t seed;
  std::size_t size;
};

inline std::uint64_t body_word(std::uint64_t seed, std::size_t i) {
  return seed * 0x9e3779b97f4a7c15ull + i;
}

// Writes a block of `size` bytes (at least a header) at p with the words of
// `seed`, its magic last.
inline void fill_block(void* block, std::size_t size, std::uint64_t seed) {
  auto* p = static_cast<unsigned char*>(block);
  reinterpret_cast<Header*>(p)->magic.store(0, std::memory_order_relaxed);
  std::size_t i = sizeof(Header);
  for (; i + 8 <= size; i += 8) {
    const std::uint64_t w = body_word(seed, i);
    std::memcpy(p + i, &w, 8);
  }
  const std::uint64_t tail = body_word(seed, i);
  std::memcpy(p + i, &tail, size - i);
  auto* h = reinterpret_cast<Header*>(p);
  h->seed = seed;
  h->size = size;
  h->magic.store(kMagic, std::memory_order_release);
}

// A block of `size` bytes (at least a header) from malloc, filled; null when
// malloc failed.
inline void* make_block(std::size_t size, std::uint64_t seed) {
  if (size < sizeof(Header)) size = sizeof(Header);
  void* p = std::malloc(size);
  if (p != nullptr) fill_block(p, size, seed);
  return p;
}

// True when the block is intact; blocks without magic (being written, or
// freed) are not checked (*checked false).
inline bool block_ok(const void* block, bool* checked) {
  const auto* h = static_cast<const Header*>(block);
  *checked = false;
  if (h->magic.load(std::memory_order_acquire) != kMagic) return true;
  *checked = true;
  const auto* p = static_cast<const unsigned char*>(block);
  const std::size_t size = h->size;
  std::uint64_t diff = 0;
  std::size_t i = sizeof(Header);
  for (; i + 8 <= size; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    diff |= w ^ body_word(h->seed, i);
  }
  const std::uint64_t tail = body_word(h->seed, i);
  return diff == 0 && std::memcmp(p + i, &tail, size - i) == 0;
}

inline void drop_block(void* block) {
  static_cast<Header*>(block)->magic.store(0, std::memory_order_relaxed);
  std::free(block);
}

}  // namespace test
