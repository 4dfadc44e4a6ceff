/* The private mimalloc in one translation unit, plus mnemosyne's live-range
 * walk over its arenas (mimalloc-live.h). The walk lives here, not in src/,
 * because the arena table and the segment layout are internal to mimalloc:
 * the whole mimalloc-specific reading of them stays in this one file, pinned
 * to the 2.0.9 source it is built with.
 *
 * The sources are included as src/static.c includes them, with one change:
 * page.c's _mi_malloc_generic, where every allocation that its page cannot
 * serve at once goes (a thread's first, a new page, a full arena), is
 * compiled under another name and wrapped so that it leaves errno as it
 * found it. mimalloc sets errno on the way to a success: ENOENT while it
 * counts NUMA nodes (a thread's first allocation), ENOMEM when its arenas
 * are full and mnemosyne is about to add one; a program's errno must survive
 * every successful malloc. A failure is reported by the interposer, which
 * sets ENOMEM itself. Sizes above PTRDIFF_MAX are refused there at once. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE
#endif
#include "mimalloc.h"
#include "mimalloc-internal.h"
#include "stats.c"
#include "random.c"
#include "os.c"
#include "bitmap.c"
#define _mi_arena_free mnemosyne_mi_arena_free_inner
#include "arena.c"
#undef _mi_arena_free

/* Arena retirement (mimalloc-live.h): the embedder's hook, told of every
 * block freed in a committed arena, and whether the arena has none in use
 * any more. */
static void (*mnemosyne_arena_free_hook)(void* arena_start, void* block, size_t size,
                                         int arena_unused);

/* The arena block the embedder has claimed to discard its memory
 * (mnemosyne_mi_block_claim), 0 when none: the walks skip it. */
static _Atomic(uintptr_t) mnemosyne_discarding;

/* The value a field of an arena's in-use bitmap holds when none of its blocks
 * is in use: the bits past the arena's end are claimed for good. */
static size_t mnemosyne_field_unused(const mi_arena_t* arena, size_t field) {
  const size_t post = arena->field_count * MI_BITMAP_FIELD_BITS - arena->block_count;
  if (field + 1 < arena->field_count || post == 0) return 0;
  return (((size_t)1 << post) - 1) << (MI_BITMAP_FIELD_BITS - post);
}

static bool mnemosyne_arena_unused(mi_arena_t* arena) {
  for (size_t f = 0; f < arena->field_count; f++) {
    if (mi_atomic_load_relaxed(&arena->blocks_inuse[f]) != mnemosyne_field_unused(arena, f)) {
      return false;
    }
  }
  return true;
}

/* Every arena free goes through here: arena.c's, then, for a committed arena
 * (one that cannot decommit: the embedder can only give it back whole, or
 * discard what a free block held), the hook. A free of arena blocks, not of a
 * page or an object: it happens when a whole segment goes. */
void _mi_arena_free(void* p, size_t size, size_t alignment, size_t align_offset, size_t memid,
                    bool all_committed, mi_stats_t* stats) {
  mnemosyne_mi_arena_free_inner(p, size, alignment, align_offset, memid, all_committed, stats);
  void (*hook)(void*, void*, size_t, int) = mnemosyne_arena_free_hook;
  if (hook == NULL || p == NULL || size == 0 || memid == MI_MEMID_OS) return;
  size_t arena_idx;
  size_t bitmap_idx;
  mi_arena_memid_indices(memid, &arena_idx, &bitmap_idx);
  if (arena_idx >= MI_MAX_ARENAS) return;
  mi_arena_t* arena = mi_atomic_load_ptr_relaxed(mi_arena_t, &mi_arenas[arena_idx]);
  if (arena == NULL || arena->blocks_committed != NULL) return;
  uint8_t* start = mi_atomic_load_ptr_relaxed(uint8_t, &arena->start);
  if (start != NULL) hook(start, p, size, mnemosyne_arena_unused(arena) ? 1 : 0);
}

#define _mi_segment_cache_push mnemosyne_mi_segment_cache_push_inner
#include "segment-cache.c"
#undef _mi_segment_cache_push

/* Segments of committed arenas skip the segment cache while the embedder
 * retires arenas: a cached segment keeps its arena block in use, so an arena
 * would never be seen wholly free. The cache saves them nothing (their memory
 * is never decommitted, and a segment from the arena is set up as one from
 * the cache is). */
bool _mi_segment_cache_push(void* start, size_t size, size_t memid,
                            const mi_commit_mask_t* commit_mask,
                            const mi_commit_mask_t* decommit_mask, bool is_large, bool is_pinned,
                            mi_os_tld_t* tld) {
  if (is_pinned && mnemosyne_arena_free_hook != NULL) return false;
  return mnemosyne_mi_segment_cache_push_inner(start, size, memid, commit_mask, decommit_mask,
                                               is_large, is_pinned, tld);
}

#include "segment.c"
#define _mi_malloc_generic mnemosyne_mi_malloc_generic_errno
#include "page.c"
#undef _mi_malloc_generic

static _Atomic(size_t) mnemosyne_huge_limit;

void* _mi_malloc_generic(mi_heap_t* heap, size_t size, bool zero,
                         size_t huge_alignment) mi_attr_noexcept {
  /* A size no allocator serves (above PTRDIFF_MAX, as glibc refuses too):
     refused before the heap's deferred work and mimalloc's error report,
     which would otherwise run for every such request. */
  if (size > PTRDIFF_MAX) return NULL;
  /* A request the embedder serves from memory of its own (see
     mnemosyne_mi_set_huge_limit): refused here, before the same work. */
  const size_t huge_limit = mi_atomic_load_relaxed(&mnemosyne_huge_limit);
  if (huge_limit != 0 && size >= huge_limit) return NULL;
  const int saved_errno = errno;
  void* p = mnemosyne_mi_malloc_generic_errno(heap, size, zero, huge_alignment);
  errno = saved_errno;
  return p;
}

#include "heap.c"
#include "alloc.c"
#include "alloc-aligned.c"
#include "alloc-posix.c"
#include "init.c"
#include "options.c"

#include "mimalloc-live.h"

void mnemosyne_mi_load(void) {
  _mi_embedder_load();
}

void mnemosyne_mi_set_huge_clear(void (*clear)(void* p, size_t size)) {
  _mi_huge_clear = clear;
}

void mnemosyne_mi_set_os_hook(int (*hook)(void* start, size_t size, int op)) {
  _mi_os_commit_hook = hook;
}

void mnemosyne_mi_set_huge_limit(size_t bytes) {
  mi_atomic_store_relaxed(&mnemosyne_huge_limit, bytes);
}

static size_t mnemosyne_os_page(void) {
  return _mi_os_page_size();
}

/* Widens [start, end) to whole OS pages, clipped to [lo, hi), and reports it. */
static void mnemosyne_report(uint8_t* start, uint8_t* end, uint8_t* lo, uint8_t* hi,
                             mnemosyne_mi_range_fn visit, void* arg) {
  const size_t page = mnemosyne_os_page();
  uint8_t* s = (uint8_t*)_mi_align_down((uintptr_t)start, page);
  uint8_t* e = (uint8_t*)_mi_align_up((uintptr_t)end, page);
  if (s < lo) s = lo;
  if (e > hi) e = hi;
  if (e > s) visit(s, (size_t)(e - s), arg);
}

/* One walk over an arena: the live ranges go to `visit` (when set), and the
 * bytes of blocks in use are summed. */
typedef struct mnemosyne_walk_s {
  mnemosyne_mi_range_fn visit;
  void* arg;
  size_t in_use;
} mnemosyne_walk_t;

/* The number of blocks on `page`'s list of blocks other threads freed, at
 * most `limit`. The owner may be taking the list meanwhile (and relinking
 * its blocks into its own free list): the walk follows only links to blocks
 * of this page, at most `limit` of them, so it ends and reads nothing outside
 * the page, and its count is then a snapshot of a list in motion. */
static size_t mnemosyne_thread_freed(mi_page_t* page, uint8_t* start, size_t bsize,
                                     size_t handed_out, size_t limit) {
  size_t n = 0;
  const mi_block_t* block = mi_tf_block(mi_atomic_load_relaxed(&page->xthread_free));
  while (block != NULL && n < limit) {
    const uint8_t* b = (const uint8_t*)block;
    if (b < start || b >= start + handed_out || (size_t)(b - start) % bsize != 0) break;
    n++;
#ifdef MI_ENCODE_FREELIST
    block = mi_block_nextx(page, block, page->keys);
#else
    block = mi_block_nextx(page, block, NULL);
#endif
  }
  return n;
}

/* One segment at `segment`, at most `room` bytes long (what is left of the
 * arena). Returns the number of arena blocks it spans (at least 1). */
static size_t mnemosyne_segment_walk(mi_segment_t* segment, size_t room, mnemosyne_walk_t* walk) {
  /* The fields are read once each: another thread may change them. */
  const volatile mi_segment_t* vs = segment;
  const size_t segment_slices = vs->segment_slices;
  const size_t info_slices = vs->segment_info_slices;
  size_t entries = vs->slice_entries;
  if (vs->cookie != _mi_ptr_cookie(segment) || segment_slices == 0 || info_slices == 0 ||
      info_slices > segment_slices) {
    /* Not a segment header (being written right now, or never): copy the
     * arena block whole rather than guess; no block in it is counted. */
    if (walk->visit != NULL) {
      mnemosyne_report((uint8_t*)segment, (uint8_t*)segment + MI_ARENA_BLOCK_SIZE,
                       (uint8_t*)segment, (uint8_t*)segment + room, walk->visit, walk->arg);
    }
    return 1;
  }
  size_t bytes = segment_slices * MI_SEGMENT_SLICE_SIZE;
  if (bytes > room) bytes = room;
  uint8_t* lo = (uint8_t*)segment;
  uint8_t* hi = lo + bytes;
  if (entries > MI_SLICES_PER_SEGMENT) entries = MI_SLICES_PER_SEGMENT;

  /* The segment's own metadata: header, slice table, span queues. */
  if (walk->visit != NULL) {
    mnemosyne_report(lo, lo + info_slices * MI_SEGMENT_SLICE_SIZE, lo, hi, walk->visit, walk->arg);
  }

  for (size_t i = info_slices; i < entries;) {
    const volatile mi_slice_t* slice = &segment->slices[i];
    size_t count = slice->slice_count;
    const size_t xblock = slice->xblock_size;
    const size_t capacity = slice->capacity;
    size_t used = slice->used;
    if (count == 0 || count > entries - i) count = entries - i;
    if (xblock > 0 && capacity > 0) { /* a page in use: its blocks handed out so far */
      /* psize comes from the slice's own count: a huge page spans more slices
       * than the table has entries. */
      size_t psize = 0;
      uint8_t* start = _mi_segment_page_start_from_slice(segment, (const mi_slice_t*)slice, xblock,
                                                         &psize);
      size_t bsize = xblock < MI_HUGE_BLOCK_SIZE ? xblock : psize;
      size_t handed_out = capacity * bsize;
      if (handed_out > psize || handed_out / bsize != capacity) handed_out = psize;
      if (walk->visit != NULL) {
        mnemosyne_report(start, start + handed_out, lo, hi, walk->visit, walk->arg);
      }
      /* `used` counts the page's blocks its owner has not seen freed: less
       * those other threads freed onto the page's own list. */
      if (used > capacity) used = capacity;
      used -= mnemosyne_thread_freed((mi_page_t*)slice, start, bsize, handed_out, used);
      walk->in_use += used * bsize;
    }
    i += count;
  }
  return _mi_divide_up(bytes, MI_ARENA_BLOCK_SIZE);
}

static int (*mnemosyne_readable_hook)(const void* start, size_t size) = NULL;

void mnemosyne_mi_set_readable_hook(int (*hook)(const void* start, size_t size)) {
  mnemosyne_readable_hook = hook;
}

/* Whether the segment header at `segment` and the slice table after it
 * (its info slices) may be read: none of it when the hook refuses. */
static bool mnemosyne_header_readable(const mi_segment_t* segment) {
  int (*readable)(const void*, size_t) = mnemosyne_readable_hook;
  if (readable == NULL) return true;
  if (!readable(segment, MI_SEGMENT_SLICE_SIZE)) return false;
  const size_t info_slices = ((const volatile mi_segment_t*)segment)->segment_info_slices;
  return info_slices <= 1 || info_slices > MI_SLICES_PER_SEGMENT ||
         readable(segment, info_slices * MI_SEGMENT_SLICE_SIZE);
}

static int mnemosyne_arena_walk(const void* arena_start, mnemosyne_walk_t* walk) {
  const size_t count = mi_atomic_load_acquire(&mi_arena_count);
  for (size_t a = 0; a < count && a < MI_MAX_ARENAS; a++) {
    mi_arena_t* arena = mi_atomic_load_ptr_acquire(mi_arena_t, &mi_arenas[a]);
    if (arena == NULL) continue;
    uint8_t* start = mi_atomic_load_ptr_relaxed(uint8_t, &arena->start);
    if (start != (const uint8_t*)arena_start) continue;
    const size_t blocks = arena->block_count;
    for (size_t b = 0; b < blocks;) {
      /* Sequentially consistent, as the claim below and the embedder's count
       * of walks in progress are (a claim made after a walk began waits for
       * it). */
      const size_t field = atomic_load(&arena->blocks_inuse[b / MI_BITMAP_FIELD_BITS]);
      /* A block the embedder claimed to discard holds nothing (and its
       * memory may be changing): skipped. Claimed after the marker is set,
       * so a bit set by the claim is seen with the marker. */
      if ((field & ((size_t)1 << (b % MI_BITMAP_FIELD_BITS))) == 0 ||
          mi_atomic_load_acquire(&mnemosyne_discarding) ==
              (uintptr_t)(start + b * MI_ARENA_BLOCK_SIZE)) {
        b++;
        continue;
      }
      mi_segment_t* segment = (mi_segment_t*)(start + b * MI_ARENA_BLOCK_SIZE);
      /* A header in memory not backed now: a segment being made, or one
       * mimalloc decommitted (in its cache): nothing live. */
      if (!mnemosyne_header_readable(segment)) {
        b++;
        continue;
      }
      b += mnemosyne_segment_walk(segment, (blocks - b) * MI_ARENA_BLOCK_SIZE, walk);
    }
    return 1;
  }
  return 0;
}

int mnemosyne_mi_arena_live(const void* arena_start, mnemosyne_mi_range_fn visit, void* arg) {
  mnemosyne_walk_t walk = {visit, arg, 0};
  return mnemosyne_arena_walk(arena_start, &walk);
}

size_t mnemosyne_mi_arena_in_use(const void* arena_start) {
  mnemosyne_walk_t walk = {NULL, NULL, 0};
  mnemosyne_arena_walk(arena_start, &walk);
  return walk.in_use;
}

void mnemosyne_mi_fork_child(int heap_whole) {
  mi_heap_t* heap = mi_get_default_heap();
  if (mi_heap_is_initialized(heap) && !heap_whole) {
    /* Pages of this heap may lie where the child has nothing: none may be
     * walked (mi_collect at exit would), so the thread starts over with the
     * empty heap, as a thread that never allocated. */
    _mi_heap_set_default_direct((mi_heap_t*)&_mi_heap_empty);
  } else if (mi_heap_is_initialized(heap)) {
    mi_atomic_store_ptr_relaxed(mi_block_t, &heap->thread_delayed_free, NULL);
    for (size_t bin = 0; bin <= MI_BIN_FULL; bin++) {
      for (mi_page_t* page = heap->pages[bin].first; page != NULL; page = page->next) {
        const mi_thread_free_t tf = mi_atomic_load_relaxed(&page->xthread_free);
        if (mi_tf_delayed(tf) == MI_DELAYED_FREEING) {
          /* What the free in progress would have left. */
          mi_atomic_store_relaxed(&page->xthread_free, mi_tf_set_delayed(tf, MI_NO_DELAYED_FREE));
        }
      }
    }
  }
  mi_atomic_store_relaxed(&abandoned, (mi_tagged_segment_t)0);
  mi_atomic_store_ptr_relaxed(mi_segment_t, &abandoned_visited, NULL);
  mi_atomic_store_relaxed(&abandoned_count, (size_t)0);
  mi_atomic_store_relaxed(&abandoned_visited_count, (size_t)0);
  mi_atomic_store_relaxed(&abandoned_readers, (size_t)0);
}

void mnemosyne_mi_set_arena_free_hook(void (*hook)(void* arena_start, void* block, size_t size,
                                                    int arena_unused)) {
  mnemosyne_arena_free_hook = hook;
}

/* The committed arena that holds the arena block at `block`, and the block's
 * bit in it; NULL when there is none. */
static mi_arena_t* mnemosyne_block_arena(const void* block, size_t* field, size_t* mask) {
  const size_t count = mi_atomic_load_acquire(&mi_arena_count);
  for (size_t a = 0; a < count && a < MI_MAX_ARENAS; a++) {
    mi_arena_t* arena = mi_atomic_load_ptr_acquire(mi_arena_t, &mi_arenas[a]);
    if (arena == NULL || arena->blocks_committed != NULL) continue;
    const uint8_t* start = mi_atomic_load_ptr_relaxed(uint8_t, &arena->start);
    const uint8_t* b = (const uint8_t*)block;
    if (start == NULL || b < start || b >= start + arena->block_count * MI_ARENA_BLOCK_SIZE) continue;
    const size_t idx = (size_t)(b - start) / MI_ARENA_BLOCK_SIZE;
    if ((size_t)(b - start) % MI_ARENA_BLOCK_SIZE != 0) return NULL;
    *field = idx / MI_BITMAP_FIELD_BITS;
    *mask = (size_t)1 << (idx % MI_BITMAP_FIELD_BITS);
    return arena;
  }
  return NULL;
}

int mnemosyne_mi_block_claim(void* block) {
  size_t field;
  size_t mask;
  mi_arena_t* arena = mnemosyne_block_arena(block, &field, &mask);
  if (arena == NULL) return 0;
  mi_atomic_store_release(&mnemosyne_discarding, (uintptr_t)block);
  size_t expected = mi_atomic_load_relaxed(&arena->blocks_inuse[field]);
  do {
    if ((expected & mask) != 0) {
      mi_atomic_store_release(&mnemosyne_discarding, (uintptr_t)0);
      return 0;
    }
  } while (!atomic_compare_exchange_weak(&arena->blocks_inuse[field], &expected, expected | mask));
  return 1;
}

void mnemosyne_mi_block_release(void* block) {
  size_t field;
  size_t mask;
  mi_arena_t* arena = mnemosyne_block_arena(block, &field, &mask);
  if (arena != NULL) mi_atomic_and_acq_rel(&arena->blocks_inuse[field], ~mask);
  mi_atomic_store_release(&mnemosyne_discarding, (uintptr_t)0);
}

/* The committed arena that starts at arena_start, and its slot; NULL when
 * there is none. */
static mi_arena_t* mnemosyne_committed_arena_at(const void* arena_start, size_t* slot) {
  if (arena_start == NULL) return NULL;
  const size_t count = mi_atomic_load_acquire(&mi_arena_count);
  for (size_t a = 0; a < count && a < MI_MAX_ARENAS; a++) {
    mi_arena_t* arena = mi_atomic_load_ptr_acquire(mi_arena_t, &mi_arenas[a]);
    if (arena == NULL || arena->blocks_committed != NULL) continue;
    if (mi_atomic_load_ptr_relaxed(uint8_t, &arena->start) != (const uint8_t*)arena_start) continue;
    *slot = a;
    return arena;
  }
  return NULL;
}

int mnemosyne_mi_arena_unused(const void* arena_start) {
  size_t slot;
  mi_arena_t* arena = mnemosyne_committed_arena_at(arena_start, &slot);
  return arena != NULL && mnemosyne_arena_unused(arena) ? 1 : 0;
}

int mnemosyne_mi_arena_retire(const void* arena_start) {
  size_t slot;
  mi_arena_t* arena = mnemosyne_committed_arena_at(arena_start, &slot);
  if (arena == NULL) return 0;
  /* Claims every block, field by field, where none is in use; a field in use
   * undoes the claims made so far (nobody else can have changed a field this
   * claimed whole). */
  for (size_t f = 0; f < arena->field_count; f++) {
    size_t expected = mnemosyne_field_unused(arena, f);
    if (!mi_atomic_cas_strong_acq_rel(&arena->blocks_inuse[f], &expected, MI_BITMAP_FIELD_FULL)) {
      while (f-- > 0) {
        mi_atomic_store_release(&arena->blocks_inuse[f], mnemosyne_field_unused(arena, f));
      }
      return 0;
    }
  }
  mi_atomic_store_ptr_release(uint8_t, &arena->start, NULL);
  return (int)slot + 1;
}

int mnemosyne_mi_arena_revive(int slot, void* start, size_t size, int is_zero) {
  if (slot <= 0 || slot > MI_MAX_ARENAS || start == NULL) return 0;
  if ((uintptr_t)start % MI_SEGMENT_ALIGN != 0) return 0;
  mi_arena_t* arena = mi_atomic_load_ptr_acquire(mi_arena_t, &mi_arenas[slot - 1]);
  if (arena == NULL || arena->blocks_committed != NULL ||
      mi_atomic_load_ptr_relaxed(uint8_t, &arena->start) != NULL ||
      arena->block_count * MI_ARENA_BLOCK_SIZE != size) {
    return 0;
  }
  arena->is_zero_init = (is_zero != 0);
  for (size_t f = 0; f < arena->field_count; f++) {
    mi_atomic_store_relaxed(&arena->blocks_dirty[f], (size_t)0);
  }
  mi_atomic_store_relaxed(&arena->search_idx, (size_t)0);
  mi_atomic_store_ptr_release(uint8_t, &arena->start, (uint8_t*)start);
  /* Released last: a thread that claims a block sees all of the above. */
  for (size_t f = 0; f < arena->field_count; f++) {
    mi_atomic_store_release(&arena->blocks_inuse[f], mnemosyne_field_unused(arena, f));
  }
  return 1;
}

/* mi_malloc's fast case alone (mimalloc-live.h): _mi_page_malloc's pop from
 * a small size's page, without its call to _mi_malloc_generic; with the
 * usable size of the block read from its page on the way. In this release
 * build blocks carry no padding, so a page's usable block size is what
 * mi_usable_size says of a block that starts a block (every plain malloc's),
 * aligned blocks or not. Always inlined, here and through link-time
 * optimization into mnemosyne's paths, whichever of them calls it. */
static inline __attribute__((always_inline)) mnemosyne_mi_sized_t malloc_fast_sized(size_t size) {
  mnemosyne_mi_sized_t r = { NULL, 0 };
  if (mi_likely(size <= MI_SMALL_SIZE_MAX)) {
    mi_heap_t* const heap = mi_get_default_heap();
    mi_page_t* const page = _mi_heap_get_free_small_page(heap, size + MI_PADDING_SIZE);
    mi_block_t* const block = page->free;
    if (mi_likely(block != NULL)) {
      page->used++;
      page->free = mi_block_next(page, block);
      mi_track_mem_undefined(block, mi_page_usable_block_size(page));
      mi_track_malloc(block, size, false);
      r.p = block;
      /* A small page's block size, never MI_HUGE_BLOCK_SIZE's mark: read
       * directly, without mi_page_block_size's test for a huge page. */
      r.usable = (size_t)page->xblock_size - MI_PADDING_SIZE;
    }
  }
  return r;
}

mnemosyne_mi_sized_t mnemosyne_mi_malloc_fast_sized(size_t size) {
  return malloc_fast_sized(size);
}

void* mnemosyne_mi_malloc_fast(size_t size) {
  return malloc_fast_sized(size).p;  /* the usable size, never read, is not loaded */
}

/* What mi_malloc does when _mi_page_malloc finds its page's free list
 * empty, and for sizes above the small ones (alloc.c): the generic path,
 * here without the fast case first (the interposer tried it). */
void* mnemosyne_mi_malloc_generic(size_t size) {
  return _mi_malloc_generic(mi_get_default_heap(), size + MI_PADDING_SIZE, false, 0);
}

/* Counted malloc and free (mimalloc-live.h): the common cases above, else
 * mimalloc's own path and the usable size of what it served or frees. */
mnemosyne_mi_sized_t mnemosyne_mi_malloc_generic_sized(size_t size) {
  mnemosyne_mi_sized_t r;
  r.p = mnemosyne_mi_malloc_generic(size);
  r.usable = r.p != NULL ? mi_usable_size(r.p) : 0;
  return r;
}

static inline __attribute__((always_inline)) size_t free_local_sized(void* p) {
  mi_segment_t* const segment = _mi_ptr_segment(p);
  mi_page_t* const page = _mi_segment_page_of(segment, p);
  if (mi_likely(_mi_thread_id() == mi_atomic_load_relaxed(&segment->thread_id) &&
                page->flags.full_aligned == 0)) {
    /* Not the page's last block, whose free retires the page (mimalloc's
     * own path, the caller's to take): tested by the decrement itself, as
     * mi_free does, and undone when it was the last (only this thread
     * writes a page's `used`). */
    if (mi_unlikely(--page->used == 0)) {
      page->used = 1;
      return 0;
    }
    mi_block_t* const block = (mi_block_t*)p;
    if (mi_unlikely(mi_check_is_double_free(page, block))) {
      page->used++;
      return mi_page_usable_block_size(page);
    }
    mi_check_padding(page, block);
    mi_stat_free(page, block);
    mi_track_free(p);
    mi_block_set_next(page, block, page->local_free);
    page->local_free = block;
    /* More than one block in the page: its blocks are smaller than
     * MI_HUGE_BLOCK_SIZE (a page of a larger one holds that one alone), so
     * xblock_size is the block size itself; never 0 (a block holds at least
     * its free-list link), which lets a caller's test of the result for 0
     * go to the "not this case" branch directly. */
    const size_t usable = (size_t)page->xblock_size - MI_PADDING_SIZE;
    if (usable == 0) __builtin_unreachable();
    return usable;
  }
  return 0;
}

size_t mnemosyne_mi_free_local_sized(void* p) {
  return free_local_sized(p);
}

size_t mnemosyne_mi_free_sized(void* p) {
  const size_t local = free_local_sized(p);
  if (mi_likely(local != 0)) return local;
  const size_t usable = mi_usable_size(p);  /* another thread's, or its page's last */
  mi_free(p);
  return usable;
}
