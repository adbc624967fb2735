/*
 * The stack cache (issue 22): a walk libunwind would repeat, not walked
 * again (stack_cache.h has what stack.c calls).
 *
 * Owns: each thread's block of kept walks (struct sc_block, mmap'ed at its
 * SC_AFTER-th walk, given to the next thread at its end, never unmapped:
 * an unmap memtrail would see as the program's), and where libunwind's
 * TLS holds its trace cache (sc_unw_at, found once per process).
 *
 * Invariants: a walk is kept only if its replay over libunwind's trace
 * cache gives it frame for frame, reading only words of the thread's own
 * stack mapping; a kept walk is given again only while every word it read
 * holds the same value and the trace cache is the same table (sc_find).
 * An entry is emptied (sp 0) before it is rewritten. The free blocks'
 * list is changed under quiet_lock.
 *
 * Context: the ring path's walk (stack.c), on the thread's own stack; no
 * allocation (the block is an anonymous mapping), quiet while it looks.
 *
 * unw_backtrace's walk (libunwind's fast trace, Gtrace.c) is a function of
 * where it starts, the words of stack memory it reads and the rules of its
 * per-thread trace cache: from each frame's rule (CFA = rsp or rbp + an
 * offset; the return address at CFA - 8; rbp kept or saved at CFA + an
 * offset) it reads one or two words and goes on from what they hold. Each
 * lookup of an address in that cache (a hash table) waits on the word the
 * frame before it read: ~10 ns a frame, a few hundred a stack.
 *
 * After a walk, the shim replays it over the same cache entries and keeps,
 * for its starting rsp and rbp (ring_stack's, as the walk sees them after
 * unw_backtrace's own frame), every word it read (address and value) with
 * the stack it gave. A later walk from the same rsp and rbp, while those
 * words still hold the same values and the trace cache is the same table
 * (libunwind only adds to a table, and replaces it whole when it grows), is
 * the same walk: it reads the same words, finds the same rules and gives
 * the same frames. The shim then takes the kept stack (and its id) instead
 * of walking. A walk that does not replay exactly (a signal frame, a rule
 * the fast trace does not take, a word outside the thread's stack, a
 * libunwind whose cache the shim does not know) is not kept.
 */
#include "stack_cache.h"

/* Blocks of threads that ended, for the next threads (never unmapped: an
 * unmap memtrail would see as the program's). */
static struct sc_block *sc_free;
/* ring.h, stack_cache.h */
int sc_enabled;
long sc_unw_at = -1;

/* libunwind 1.6's trace cache entry (unw_tdep_frame_t, its frame types
 * STANDARD -2 and GUESSED 1; the others the fast trace does not step
 * through). Another libunwind is recognized by its cache holding a walk's
 * addresses less one (unw_cache_at), and a walk it gave is kept only if
 * the replay over these entries gives it frame for frame. */
struct unw_frame {
	uint64_t virtual_address;
	int64_t frame_type : 3;
	int64_t last_frame : 1;
	int64_t cfa_reg_rsp : 1;
	int64_t cfa_reg_offset : 29;
	int64_t rbp_cfa_offset : 15;
	int64_t rsp_cfa_offset : 15;
};
_Static_assert(sizeof(struct unw_frame) == 16, "libunwind's entries are 16 bytes");
#define UNW_HASH 0x9e3779b97f4a7c16ULL
#define UNW_STANDARD (-2)
#define UNW_GUESSED 1

typedef struct {
	unsigned long ti_module;
	unsigned long ti_offset;
} sc_tls_index;
extern void *__tls_get_addr(sc_tls_index *) __attribute__((visibility("default")));

static const struct unw_frame *unw_find(const struct unw_frame *table, uint64_t mask,
					uint64_t key)
{
	uint64_t slot = ((key * UNW_HASH) >> 43) & mask;
	int i;

	for (i = 0; i < 16; i++) {
		const struct unw_frame *f = &table[(slot + (uint64_t)i) & mask];

		if (f->virtual_address == key)
			return f;
		if (!f->virtual_address)
			return NULL;
	}
	return NULL;
}

/* Whether the word at c is libunwind's trace cache holding the lookup keys
 * of the walk that gave buf (each the address less one). */
static int unw_cache_at(uint64_t c, void *const *buf, int n)
{
	uint64_t hdr[2], entry[2], size;
	int k, probe;

	if (!c || (c & 7) || copy_checked(hdr, c, sizeof(hdr)) || !hdr[0] || hdr[1] < 4 ||
	    hdr[1] > 40)
		return 0;
	size = 1ULL << hdr[1];
	for (k = 0; k < n - 1 && k < 8; k++) {
		uint64_t key = (uint64_t)(uintptr_t)buf[k] - 1;
		uint64_t slot = ((key * UNW_HASH) >> 43) & (size - 1);

		for (probe = 0;; probe++) {
			uint64_t at = hdr[0] + 16 * ((slot + (uint64_t)probe) & (size - 1));

			if (probe == 16 || copy_checked(entry, at, sizeof(entry)) || !entry[0])
				return 0;
			if (entry[0] == key)
				break;
		}
	}
	return k >= 3;
}

/* Walks a thread makes before it gets a stack cache: one that allocates
 * less does not pay for reading its stack's mapping. */
#define SC_AFTER 64

/*
 * Finds where libunwind's TLS block holds its trace cache's pointer, after
 * the process's first walk (buf, n): early, before a sandbox the program
 * may set up forbids the system call that checks what is read. One thread
 * looks (-3 meanwhile); quiet.
 */
void sc_discover(void *const *buf, int n)
{
	sc_tls_index ti = {unw_modid, 0};
	long unknown = -1;
	const uint64_t *block;
	int at;

	if (n < 5 || !__atomic_compare_exchange_n(&sc_unw_at, &unknown, -3, 0, __ATOMIC_ACQ_REL,
						   __ATOMIC_ACQUIRE))
		return;
	block = sc_enabled && unw_modid ? __tls_get_addr(&ti) : NULL;
	/* libunwind 1.6's TLS is 16 bytes: tls_cache is the second word. */
	for (at = 0; block && at < 2; at++)
		if (unw_cache_at(block[at], buf, n)) {
			__atomic_store_n(&sc_unw_at, 8L * at, __ATOMIC_RELEASE);
			return;
		}
	__atomic_store_n(&sc_unw_at, -2, __ATOMIC_RELEASE);
}

/* The thread's cache, made at its SC_AFTER-th walk (from sp), once
 * sc_discover found libunwind's; tried once; quiet. */
void sc_setup(struct mt_thread *t, uint64_t sp)
{
	sc_tls_index ti = {unw_modid, 0};
	struct sc_block *b;
	char *block;

	if (t->sc || t->sc_walks >= SC_AFTER ||
	    __atomic_load_n(&sc_unw_at, __ATOMIC_ACQUIRE) < 0 || ++t->sc_walks < SC_AFTER)
		return;
	block = __tls_get_addr(&ti);
	if (!block)
		return;
	t->sc_unw = (void *const *)(block + sc_unw_at);
	/* The thread's stack: a walk is kept only if it starts there and
	 * reads nothing past its end, memory that stays mapped while the
	 * thread runs (a walk from another stack, a coroutine's, is not). */
	if (!mapping_of(sp, &t->sc_lo, &t->sc_hi))
		return;
	while (__atomic_exchange_n(&quiet_lock, 1, __ATOMIC_ACQUIRE))
		;
	b = sc_free;
	if (b)
		sc_free = b->next_free;
	__atomic_store_n(&quiet_lock, 0, __ATOMIC_RELEASE);
	if (!b) {
		void *p = mmap(NULL, sizeof(struct sc_block), PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (p == MAP_FAILED)
			return;
		b = p;
	}
	memset(b, 0, sizeof(*b));
	t->sc = b;
}

/* Gives the thread's block back at its end. */
void sc_release(struct mt_thread *t)
{
	struct sc_block *b = t->sc;

	if (!b)
		return;
	t->sc = NULL;
	while (__atomic_exchange_n(&quiet_lock, 1, __ATOMIC_ACQUIRE))
		;
	b->next_free = sc_free;
	sc_free = b;
	__atomic_store_n(&quiet_lock, 0, __ATOMIC_RELEASE);
}

/*
 * Keeps the walk that gave buf (n frames of at most max), from sp and bp,
 * if it replays exactly over libunwind's trace cache: its frames after
 * the shim's (ips, nr, end) and id.
 */
void sc_keep(struct mt_thread *t, uint64_t sp, uint64_t bp, void *const *buf, int n, int max,
	      uint64_t id, const uint64_t *ips, int nr, int end)
{
	const uint64_t *c;
	const struct unw_frame *table;
	struct sc_entry *e;
	uint64_t mask, rsp = sp, rbp = bp, lo = sp, hi = t->sc_hi;
	uint32_t reads = 0;
	int j;

	if (!t->sc || n < 1 || n > SC_FRAMES || nr > SC_FRAMES || sp < t->sc_lo ||
	    sp >= hi || !(c = (const uint64_t *)*t->sc_unw))
		return;
	table = (const struct unw_frame *)(uintptr_t)c[0];
	mask = (1ULL << c[1]) - 1;
	e = &t->sc->e[t->sc_next % SC_ENTRIES];
	/* Emptied first: a replay that fails leaves it half written. */
	e->sp = 0;
	for (j = 1;; j++) {
		const struct unw_frame *f;
		uint64_t cfa, rip, at;

		if (j >= max) {
			if (n != max)
				return;
			break;
		}
		f = unw_find(table, mask, (uint64_t)(uintptr_t)buf[j - 1] - 1);
		if (!f)
			return;
		if (f->last_frame) {
			if (n != j)
				return;
			break;
		}
		if (f->frame_type != UNW_STANDARD && f->frame_type != UNW_GUESSED)
			return;
		cfa = (f->cfa_reg_rsp ? rsp : rbp) + (uint64_t)(int64_t)f->cfa_reg_offset;
		at = cfa - 8;
		if (at < lo || at > hi - 8)
			return;
		rip = *(const uint64_t *)(uintptr_t)at;
		e->read_at[reads] = at;
		e->read_val[reads++] = rip;
		if (f->rbp_cfa_offset != -1) {
			at = cfa + (uint64_t)(int64_t)f->rbp_cfa_offset;
			if (at < lo || at > hi - 8)
				return;
			rbp = *(const uint64_t *)(uintptr_t)at;
			e->read_at[reads] = at;
			e->read_val[reads++] = rbp;
		}
		rsp = cfa;
		if (rip < 0x4000) {
			if (n != j)
				return;
			break;
		}
		if (j >= n || (uint64_t)(uintptr_t)buf[j] != rip)
			return;
	}
	e->sp = sp;
	e->bp = bp;
	e->table = c[0];
	e->log_size = c[1];
	e->id = id;
	e->pid = (uint32_t)ring_pid;
	e->nr = (uint32_t)nr;
	e->end = (uint32_t)end;
	e->nreads = reads;
	memcpy(e->ips, ips, 8 * (size_t)nr);
	t->sc_next++;
}

