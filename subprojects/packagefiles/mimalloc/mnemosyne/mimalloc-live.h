/* mnemosyne's extension of its private mimalloc 2.0.9: which bytes of an arena
 * may hold live data. A forked child's copy of the heap needs those bytes and no
 * others (see src/arena/fork_copy.cpp). */
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

#ifdef __cplusplus
}
#endif

#endif
