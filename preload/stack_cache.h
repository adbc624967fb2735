/*
 * The stack cache (issue 22, stack_cache.c): a walk libunwind would
 * repeat, not walked again. What stack.c calls, and the lookup it makes at
 * every walk (sc_find, inline: the hot path of a stack already kept).
 */
#ifndef MEMTRAIL_PRELOAD_STACK_CACHE_H
#define MEMTRAIL_PRELOAD_STACK_CACHE_H

#include "ring.h"

#define SC_ENTRIES 4
/* Frames of a walk kept at most (unw_backtrace's, with the shim's). */
#define SC_FRAMES 48

struct sc_entry {
	uint64_t sp, bp; /* sp 0: empty */
	uint64_t table, log_size;
	uint64_t id;
	uint32_t pid, nr, end, nreads;
	uint64_t ips[SC_FRAMES];
	uint64_t read_at[2 * SC_FRAMES];
	uint64_t read_val[2 * SC_FRAMES];
};

struct sc_block {
	struct sc_block *next_free;
	struct sc_entry e[SC_ENTRIES];
};

/* Where libunwind's TLS block holds its trace cache's pointer: -1 not
 * looked for yet, -3 being looked for, -2 not found (no stack cache in
 * the process). */
extern long sc_unw_at;

void sc_discover(void *const *buf, int n);
void sc_setup(struct mt_thread *t, uint64_t sp);
void sc_keep(struct mt_thread *t, uint64_t sp, uint64_t bp, void *const *buf, int n, int max,
	     uint64_t id, const uint64_t *ips, int nr, int end);
void sc_release(struct mt_thread *t);

/* The kept walk from sp and bp, if it is still the walk from there. */
static inline const struct sc_entry *sc_find(struct mt_thread *t, uint64_t sp, uint64_t bp)
{
	const uint64_t *c;
	unsigned int i, k;

	if (!t->sc || !(c = (const uint64_t *)*t->sc_unw))
		return NULL;
	for (i = 0; i < SC_ENTRIES; i++) {
		const struct sc_entry *e = &t->sc->e[i];

		if (e->sp != sp || e->bp != bp || e->pid != (uint32_t)ring_pid || e->table != c[0] ||
		    e->log_size != c[1])
			continue;
		for (k = 0; k < e->nreads; k++)
			if (*(const volatile uint64_t *)(uintptr_t)e->read_at[k] != e->read_val[k])
				break;
		if (k == e->nreads)
			return e;
	}
	return NULL;
}

#endif /* MEMTRAIL_PRELOAD_STACK_CACHE_H */
