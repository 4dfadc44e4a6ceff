/* mnemosyne's extension of its private mimalloc 2.0.9: which bytes of an arena
 * may hold live data. A forked child's copy of the heap needs those bytes and no
 * others (see src/arena/fork/). */
#ifndef MNEMOSYNE_MIMALLOC_LIVE_H
#define MNEMOSYNE_MIMALLOC_LIVE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One range [start, start + size), page aligned. */
typedef void (*mnemosyne_mi_range_fn)(void* start, size_t size, void* arg);

/* Calls visit for every range of the arena that starts at arena_start (as given
 * to mi_manage_os_memory_ex) that may hold live data: the metadata of every
 * segment in use, and in each page in use the blocks it has handed out so far
 * (free ones included: they hold the free lists). Ranges come in address order.
 * Everything else in the arena (free arena blocks, free spans, the untouched
 * tail of each page) holds nothing a program can reach. Other threads may be
 * allocating meanwhile: what they change during the walk may or may not be
 * reported. Returns 0 when no arena starts at arena_start, 1 otherwise.
 * Allocates nothing, takes no lock, calls nothing but visit. */
int mnemosyne_mi_arena_live(const void* arena_start, mnemosyne_mi_range_fn visit, void* arg);

/* The bytes of the blocks in use in the arena that starts at arena_start
 * (0 when there is none), as their pages count them. A block another thread
 * freed onto its page counts as free at once; one freed into a running
 * thread's full page counts until that thread next allocates (mimalloc keeps
 * those in that thread's heap, which only that thread may read). Each block
 * counts at its size class (what malloc_usable_size reports). Other threads
 * may be allocating meanwhile: the sum is a snapshot, slightly off for pages
 * changed during the walk. Same constraints as the walk above. For mallinfo2
 * and malloc_stats. */
size_t mnemosyne_mi_arena_in_use(const void* arena_start);

/* In a forked child whose heap was copied before the fork's system call,
 * before anything else uses the heap: makes mimalloc's cross-thread state
 * consistent with what the child inherited at the fork itself. Between the
 * copy and the fork other threads went on (and some were already inside
 * mimalloc when the copy began): a block one of them freed into a full page
 * of the forking thread's heap is linked into that heap's delayed-free list,
 * whose head the child inherits as of the fork while the block's link lies
 * in memory the child has only the copy of; such a free in progress leaves
 * the page marked as being freed into, which the child would wait on
 * forever; a thread that exited (or took over an exited thread's segment)
 * changed the list of abandoned segments the same way. So the child's heap
 * drops its delayed frees, clears those marks, and forgets the abandoned
 * segments: blocks and free space that only those lists held stay unused in
 * the child (a leak bounded by what was pending at the fork), and every
 * block the program can reach stays valid. Frees other threads pushed onto
 * a page's own list are consistent already: the copy reads each segment's
 * page table before its blocks, and a free writes the block before the page.
 * heap_whole is 0 in a child that lacks some of the heap's segments (their
 * copy could not be made): the forking thread's heap is then forgotten, not
 * walked, and the embedder must not call mimalloc again in that child.
 * Async-signal-safe: it only writes memory (pthread_setspecific of a key
 * mimalloc made at start only writes the thread's own slot). */
void mnemosyne_mi_fork_child(int heap_whole);

/* Starts mimalloc (mimalloc-embedder-load.patch: no constructor does):
 * reads its options, seeds the main heap, registers its exit and thread-exit
 * handlers. Once, after the options and hooks are set and before the first
 * allocation; later calls do nothing. */
void mnemosyne_mi_load(void);

/* Who clears a huge block (above 16 MiB) that calloc asks for when its
 * memory is not known zero (mimalloc-huge-calloc.patch); NULL, the default:
 * mimalloc's memset. Set once, before the first allocation. */
void mnemosyne_mi_set_huge_clear(void (*clear)(void* p, size_t size));

/* Who commits (op 1), decommits (op 0) and resets (op 2) the page-aligned
 * range [start, start + size) (mimalloc-os-hooks.patch): asked before the OS
 * calls, it returns -1 for memory that is not its own (mimalloc then calls
 * the OS as upstream does), else 1 when done and 0 when it failed. NULL, the
 * default: the OS calls alone. Set once, before the first allocation. */
#define MNEMOSYNE_MI_DECOMMIT 0
#define MNEMOSYNE_MI_COMMIT 1
#define MNEMOSYNE_MI_RESET 2
void mnemosyne_mi_set_os_hook(int (*hook)(void* start, size_t size, int op));

/* Whether [start, start + size) of an arena may be read now: memory the
 * embedder's provider backs only where mimalloc commits may be inaccessible
 * elsewhere (a driver's reserved address space), and the walks above read
 * the header of every arena block in use, which in a segment being made or
 * one mimalloc decommitted may lie there. A range the hook refuses is not
 * read (its arena block holds nothing live then). The hook must allocate
 * nothing and take no lock. NULL, the default: every byte is readable. Set
 * once, before the first allocation. */
void mnemosyne_mi_set_readable_hook(int (*hook)(const void* start, size_t size));

/* Requests of at least `bytes` are not served from arenas: mimalloc returns
 * NULL for them at once (its generic path, which every request above 1 KiB
 * reaches, checks first), and the embedder serves them from memory of their
 * own. 0, the default: no limit. May change while other threads allocate. */
void mnemosyne_mi_set_huge_limit(size_t bytes);

/* Giving committed arenas back (arenas whose memory mimalloc cannot decommit:
 * the driver frees managed memory only whole). mimalloc 2.0.9 never removes
 * an arena; these let the embedder retire one that no block is in use in,
 * give its memory back, and later put the arena's slot back to use over new
 * memory of the same size; and discard what a free arena block of a kept
 * arena held.
 *
 * The hook is called, from inside mimalloc's free path (it must not allocate,
 * lock or call a driver), each time arena blocks [block, block + size) of a
 * committed arena are freed, with arena_unused 1 when the arena has no block
 * in use any more. While a hook is set, segments of committed arenas skip
 * mimalloc's segment cache (which would keep their blocks in use). Set once,
 * before the first allocation. */
void mnemosyne_mi_set_arena_free_hook(void (*hook)(void* arena_start, void* block, size_t size,
                                                   int arena_unused));

/* Claims the one arena block (MI_SEGMENT_SIZE bytes) at `block` of a committed
 * arena, if it is free: mimalloc hands it out to nobody, and the walks above
 * skip it, until mnemosyne_mi_block_release. One block at a time. Returns 1
 * when claimed, 0 when it is in use or no arena holds it. */
int mnemosyne_mi_block_claim(void* block);
void mnemosyne_mi_block_release(void* block);

/* 1 when the committed arena that starts at arena_start has no block in use
 * right now, else 0. Takes no lock. */
int mnemosyne_mi_arena_unused(const void* arena_start);

/* Takes every block of the committed arena that starts at arena_start out of
 * use at once, if none is in use: mimalloc never hands out a block of it
 * again, and it no longer starts anywhere (the walks above do not find it).
 * Returns the arena's slot (1 and up) for mnemosyne_mi_arena_revive, or 0
 * when there is no such arena or a block of it is in use (the arena is then
 * as it was). The caller may then give the memory back. */
int mnemosyne_mi_arena_retire(const void* arena_start);

/* Puts retired arena `slot` back to use over the `size` bytes at `start`
 * (aligned as mi_manage_os_memory_ex requires; size must be the retired
 * arena's), committed, zero or not. Returns 1 when done, 0 when the slot is
 * not a retired arena of that size. */
int mnemosyne_mi_arena_revive(int slot, void* start, size_t size, int is_zero);

/* mi_malloc(size) where it is served at once: a small block from the free
 * list of its size's page; NULL where mi_malloc would go on to its generic
 * path (any other size, an empty free list). The interposer's malloc inlines
 * this and leaves every other case to one tail call, so that it keeps
 * nothing across a call: with mi_malloc inlined, the size waited in a saved
 * register for the case where mi_malloc returns NULL and the arena grows. */
void* mnemosyne_mi_malloc_fast(size_t size);

/* mi_malloc(size) where mnemosyne_mi_malloc_fast(size) returned NULL:
 * mimalloc's generic path (a page to refill or find, a large block), with
 * no second try of the fast case. */
void* mnemosyne_mi_malloc_generic(size_t size);

/* A block and its usable size (what mi_usable_size says of it). */
typedef struct mnemosyne_mi_sized_s {
  void* p;
  size_t usable;
} mnemosyne_mi_sized_t;

/* mnemosyne_mi_malloc_generic(size), and the usable size of the block:
 * statistics count every block's usable size. { NULL, 0 } when it returns
 * NULL. */
mnemosyne_mi_sized_t mnemosyne_mi_malloc_generic_sized(size_t size);

/* mi_free(p) of a block of mimalloc's (not NULL), returning its usable size
 * as mi_usable_size(p) said before the free: the same page is found once. */
size_t mnemosyne_mi_free_sized(void* p);

/* The common cases of the two above alone, with no call in them, so that a
 * counted malloc or free whose case this is saves no register: a small
 * block from its page's free list ({ NULL, 0 } otherwise, nothing done), and
 * the free of a block of this thread's page that is not the page's last
 * (0 otherwise, nothing done). */
mnemosyne_mi_sized_t mnemosyne_mi_malloc_fast_sized(size_t size);
size_t mnemosyne_mi_free_local_sized(void* p);

#ifdef __cplusplus
}
#endif

#endif
