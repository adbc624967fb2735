/*
 * The allocator interposers: malloc, free, calloc, realloc,
 * reallocarray, posix_memalign, aligned_alloc, memalign, valloc and
 * pvalloc, and each thread's buffer of frees. The hot path: every call of
 * the program's allocator comes here.
 *
 * Owns: each thread's buffer of frees (struct mt_thread's count, slots,
 * busy, state, owner).
 *
 * Each call's record: on the thread's ring (ring.h) if it has one, else
 * through the hook (hook.h), from the interposer's own body (RECORD, in
 * the interposer: the hook's rbp is its frame). A free's and a realloc's
 * old block are recorded before the real call releases them, an
 * allocation after the real call returned it; a real call runs with the
 * in-allocator flag set (REAL). The shim's own calls (in_ring 2) are
 * served from the quiet arena and not recorded; dlsym's during resolve
 * from the bootstrap buffer (boot.c).
 *
 * Batched frees (the hook path): free() puts the block in the thread's
 * buffer and returns; the real free waits. The thread's next hook carries
 * the buffer (one kernel entry for the allocation and the frees before
 * it), then the shim really frees them and empties it. Until then no
 * allocator call can hand the blocks out again, so the records stay in
 * the uprobe mode's order. A full buffer, a fork (in the parent, before it
 * forks), an exec of this thread, the thread's end (a thread-specific
 * key's destructor) and the process's (a destructor, run after the
 * program's atexit handlers and destructors) flush it with MT_SHIM_FLUSH
 * (life.c). A large block (MT_LARGE) is freed at once, the buffer with
 * it, and so are a thread's frees after its flush at its end (one entry
 * each). What a thread leaves buffered when it ends without them (_exit,
 * a fatal signal, another thread's exit or exec) memtrail reads from its
 * TLS at its exit (bpf/shim.c, shim_thread_ends).
 *
 * Invariants: `busy` makes the buffer the thread's own while it is
 * updated: a signal handler's free or allocation then does not touch it
 * (a free is made at once). The slot is written before the count (memtrail
 * reads count slots at the thread's end); the buffer is emptied before
 * the hook that carries it, not after.
 *
 * Context: any thread, a signal handler's call included.
 */
#include "hook.h"
#include "ring.h"

/*
 * The body of an interposer that returns one block of `size`: the
 * bootstrap buffer while the real functions are looked up, else the real
 * call (the in-allocator flag set around it), then the hook with the block.
 * A macro, so that HOOK stays in the interposer's own body.
 */
#define ALLOCATE(kind, size, real_call)                                                  \
	do {                                                                             \
		void *p_;                                                                \
		if (!ready())                                                            \
			return boot_alloc(size);                                         \
		p_ = REAL(real_call);                                                    \
		if (p_)                                                                  \
			RECORD_ALLOC(kind, p_, size, 0);                                 \
		return p_;                                                               \
	} while (0)

/*
 * The record of a call: `ring_call` on the thread's ring (r_, rt_), else
 * the hook with (kind, a, b, c). None for the shim's own calls. In the
 * interposer's body (HOOK_CARRY's rbp).
 */
#define RECORD(ring_call, kind, a, b, c)                                                 \
	do {                                                                             \
		struct mt_thread *rt_ = &mt_self;                                        \
		struct shim_ring *r_;                                                    \
		if (__builtin_expect(rt_->in_ring == 2, 0))                              \
			break; /* the shim's own call */                                 \
		r_ = ring_of(rt_);                                                       \
		if (__builtin_expect(r_ != NULL, 1))                                     \
			ring_call;                                                       \
		else                                                                     \
			HOOK_CARRY(kind, a, b, c);                                       \
	} while (0)

/* An allocating call's record, and a realloc's begin (its old block). */
#define RECORD_ALLOC(kind, p, size, old)                                                 \
	RECORD(ring_alloc(r_, rt_, kind, p, size, old), kind, p, size, old)
#define RECORD_BEGIN(old)                                                                \
	RECORD(ring_release(r_, rt_, MT_REALLOC_BEGIN, old), MT_REALLOC_BEGIN, old, 0, 0)

/* Hot path. */
EXPORT void *malloc(size_t size)
{
	if (__builtin_expect(mt_self.in_ring == 2, 0)) {
		void *q = quiet_alloc(size);

		if (q)
			return q;
	}
	ALLOCATE(MT_MALLOC, size, next_malloc(size));
}

/* realloc of a quiet block, or a quiet realloc (see quiet_arena). */
static void *quiet_realloc(void *old, size_t size)
{
	void *p = quiet_alloc(size);
	int was = mt_in_alloc;

	if (!p) {
		mt_in_alloc = was ? was : 1;
		p = next_malloc(size);
		mt_in_alloc = was;
	}
	if (p && old) {
		size_t have = quiet_size(old);

		memcpy(p, old, have < size ? have : size);
		quiet_release(old);
	}
	return p;
}

/*
 * How many frees are buffered, the buffer emptied (its slots kept until
 * drain); with busy held, just before the hook that carries them. Emptied
 * before the hook, not after: a thread killed as the hook returns (where
 * the kernel delivers the kill of another thread's exit_group) has nothing
 * left for memtrail to read again at its end. (Killed in the few
 * instructions before the hook, it loses them.)
 */
unsigned int take(struct mt_thread *t)
{
	unsigned int n = t->count;

	t->count = 0;
	barrier();
	return n < MT_FREE_BATCH_MAX ? n : MT_FREE_BATCH_MAX;
}

/* Really frees the n blocks taken, which the hook just recorded; with busy
 * held. The flag is restored, not cleared: the caller may be a signal
 * handler's call inside a real call. */
void drain(struct mt_thread *t, unsigned int n)
{
	unsigned int i;
	int was = t->in_alloc;

	t->in_alloc = 1;
	for (i = 0; i < n; i++)
		next_free(t->slots[i]);
	t->in_alloc = was;
}

/* Records and makes the buffered frees; with busy held. */
static void flush(struct mt_thread *t)
{
	unsigned int n = take(t);

	if (!n)
		return;
	HOOK_WITH(MT_SHIM_FLUSH, 0, 0, 0, t->slots, n);
	drain(t, n);
}

/* Flushes this thread's buffer if it is free to take. */
void flush_self(void)
{
	struct mt_thread *t = &mt_self;

	if (t->busy || !t->count)
		return;
	t->busy = 1;
	barrier();
	flush(t);
	barrier();
	t->busy = 0;
}

/* The real free of p, flagged; the flag restored, not cleared (see drain). */
static void real_free(struct mt_thread *t, void *p)
{
	int was = t->in_alloc;

	t->in_alloc = 1;
	next_free(p);
	t->in_alloc = was;
}

/* A free made at once: recorded, then made. */
static void free_now(void *p)
{
	HOOK(MT_FREE, p, 0, 0);
	real_free(&mt_self, p);
}

/* A large block's free, made at once with the buffered ones (one entry):
 * its memory, often a mapping of its own, goes back when the program
 * gave it. With busy held. */
static void free_carrying(struct mt_thread *t, void *p)
{
	unsigned int n = take(t);

	HOOK_WITH(MT_FREE, p, 0, 0, t->slots, n);
	drain(t, n);
	real_free(t, p);
}

/* A thread's first buffered free: its key's destructor will flush what it
 * leaves at its end. Before the constructor made the key (a free in
 * another library's constructor), frees are made at once, for now. */
static int start_buffering(struct mt_thread *t)
{
	if (!__atomic_load_n(&mt_key_made, __ATOMIC_ACQUIRE))
		return 0;
	if (pthread_setspecific(mt_key, t) != 0) {
		t->state = MT_DIRECT;
		return 0;
	}
	t->owner = gettid();
	t->state = MT_BUFFERING;
	return 1;
}

/* Hot path. */
EXPORT void free(void *p)
{
	struct mt_thread *t = &mt_self;
	struct shim_ring *r;
	unsigned int n;

	if (!p || in_boot(p))
		return;
	if (__builtin_expect(in_quiet(p), 0)) {
		quiet_release(p);
		return;
	}
	if (!ready())
		return;
	if (__builtin_expect(t->in_ring == 2, 0)) {
		/* The shim's own calls free only its own (quiet) blocks: a
		 * signal handler's free, recorded at once. */
		free_now(p);
		return;
	}
	r = ring_of(t);
	if (__builtin_expect(r != NULL, 1)) {
		ring_release(r, t, MT_FREE, p);
		real_free(t, p);
		return;
	}
	if (__builtin_expect(t->busy, 0)) {
		free_now(p);
		return;
	}
	t->busy = 1;
	barrier();
	if (__builtin_expect(t->state != MT_BUFFERING, 0) &&
	    (t->state == MT_DIRECT || !start_buffering(t))) {
		barrier();
		t->busy = 0;
		free_now(p);
		return;
	}
	if (__builtin_expect(next_usable_size(p) >= MT_LARGE, 0)) {
		free_carrying(t, p);
	} else {
		/* The slot first: memtrail reads count slots at the thread's
		 * end. */
		n = t->count;
		t->slots[n] = p;
		barrier();
		t->count = n + 1;
		if (n + 1 == MT_FREE_BATCH_MAX)
			flush(t);
	}
	barrier();
	t->busy = 0;
}

EXPORT void *calloc(size_t n, size_t m)
{
	void *p;

	if (!ready()) {
		uint64_t size = product(n, m);

		/* The buffer is zeroed (static, never reused). */
		return size == ~0ULL ? NULL : boot_alloc(size);
	}
	if (__builtin_expect(mt_self.in_ring == 2, 0)) {
		uint64_t size = product(n, m);

		p = size == ~0ULL ? NULL : quiet_alloc(size);
		if (p)
			return p;
	}
	p = REAL(next_calloc(n, m));
	if (p)
		RECORD_ALLOC(MT_CALLOC, p, product(n, m), 0);
	return p;
}

EXPORT void *realloc(void *old, size_t size)
{
	void *p;

	if (in_boot(old) || !ready()) {
		p = ready() ? malloc(size) : boot_alloc(size);
		/* A bootstrap block's size is not kept: copy what the new one
		 * holds, within the buffer. */
		if (p && old) {
			size_t room = (size_t)(boot + sizeof(boot) - (char *)old);

			memcpy(p, old, size < room ? size : room);
		}
		return p;
	}
	if (__builtin_expect(in_quiet(old) || (mt_self.in_ring == 2 && !old), 0))
		return quiet_realloc(old, size);
	if (old)
		RECORD_BEGIN(old);
	p = REAL(next_realloc(old, size));
	/* A failed realloc of a live block still completes its begin. */
	if (p || old)
		RECORD_ALLOC(MT_REALLOC, p, size, old);
	return p;
}

/*
 * glibc's reallocarray calls realloc through the PLT, which is the shim's:
 * it is done here (the product checked, then the real realloc), one call
 * and one record, as the uprobe mode sees it.
 */
EXPORT void *reallocarray(void *old, size_t n, size_t m)
{
	uint64_t size = product(n, m);
	void *p;

	if (in_boot(old) || !ready() || in_quiet(old) || (mt_self.in_ring == 2 && !old)) {
		if (size == ~0ULL) {
			errno = ENOMEM;
			return NULL;
		}
		return realloc(old, size);
	}
	if (old)
		RECORD_BEGIN(old);
	if (size == ~0ULL) {
		errno = ENOMEM;
		p = NULL;
	} else {
		p = REAL(next_realloc(old, size));
	}
	if (p || old)
		RECORD_ALLOC(MT_REALLOCARRAY, p, size, old);
	return p;
}

EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
	int err;

	if (!ready()) {
		*out = boot_alloc(size);
		return *out ? 0 : ENOMEM;
	}
	err = REAL(next_posix_memalign(out, align, size));
	if (err == 0 && *out)
		RECORD_ALLOC(MT_POSIX_MEMALIGN, *out, size, 0);
	return err;
}

EXPORT void *aligned_alloc(size_t align, size_t size)
{
	ALLOCATE(aligned_alloc_kind, size, next_aligned_alloc(align, size));
}

EXPORT void *memalign(size_t align, size_t size)
{
	ALLOCATE(MT_MEMALIGN, size, next_memalign(align, size));
}

EXPORT void *valloc(size_t size)
{
	ALLOCATE(MT_VALLOC, size, next_valloc(size));
}

EXPORT void *pvalloc(size_t size)
{
	ALLOCATE(MT_PVALLOC, size, next_pvalloc(size));
}

