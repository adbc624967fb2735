/*
 * The ring writer (ring.h): which ring a thread writes to, and how a
 * record gets there.
 *
 * Owns: the process's rings (set up by ring_file.c, read-only after),
 * each thread's claim of one (its struct mt_thread's ring, ring_gen), and
 * the records' reservation and commit in a BPF ring buffer's layout.
 *
 * Invariants: a ring has one producer, the thread whose claim word it
 * holds (tgid << 32 | tid), so reserve and commit take no lock; the
 * producer position is published (a full barrier) before the record is
 * stamped, and the record stays busy until it is complete. A thread uses a
 * ring only while its ring_gen is its process's (a fork's child sets up
 * its own). A full ring waits for memtrail, never overwrites; memtrail
 * gone or done with the file turns the ring path off for the process.
 *
 * Context: any thread, on every allocator call (ring_of is the hot path);
 * a signal handler's call while the thread writes (in_ring) takes the
 * hook path instead, so a ring is never written re-entrantly.
 */
#include "ring.h"

struct shim_ring rings[RING_MAX] DATA;
uint32_t ring_count, ring_size, ring_dedup, ring_depth;
pid_t ring_memtrail;
int ring_on;
pid_t ring_pid;
pid_t ring_offered;
struct ring_proc *ring_proc;
struct ring_control *ring_ctl;

/* The first thread of a process (the constructor's, a fork's child's,
 * one made by a raw clone) to want a ring sets the process's rings up;
 * quiet. False while it has none. */
int ring_here(struct mt_thread *t)
{
	int untried = 0;

	if (__builtin_expect(ring_proc == NULL, 0))
		return 0;
	if (__builtin_expect(ring_proc->pid != 0, 1))
		return 1;
	/* A process whose rings could not be set up: no locked instruction
	 * at every call. */
	if (__atomic_load_n(&ring_proc->tried, __ATOMIC_RELAXED) ||
	    !__atomic_compare_exchange_n(&ring_proc->tried, &untried, 1, 0, __ATOMIC_ACQ_REL,
					 __ATOMIC_RELAXED))
		return 0;
	t->in_ring = 2;
	mt_in_alloc = MT_SHIM_OWN;
	__atomic_store_n(&ring_on, 0, __ATOMIC_RELEASE);
	ring_setup();
	mt_in_alloc = 0;
	t->in_ring = 0;
	return ring_proc->pid != 0;
}

/* A ring for this thread: the one it had before its process exec'd, else
 * a free one. */
static struct shim_ring *ring_claim(struct mt_thread *t)
{
	uint64_t me, free_ = 0;
	uint32_t i;

	t->tid = gettid();
	me = (uint64_t)(uint32_t)ring_pid << 32 | (uint32_t)t->tid;
	for (i = 0; i < ring_count; i++)
		if (__atomic_load_n(rings[i].claim, __ATOMIC_ACQUIRE) == me)
			return &rings[i];
	for (i = 0; i < ring_count; i++) {
		free_ = 0;
		if (__atomic_load_n(rings[i].claim, __ATOMIC_RELAXED) == 0 &&
		    __atomic_compare_exchange_n(rings[i].claim, &free_, me, 0, __ATOMIC_ACQ_REL,
						__ATOMIC_RELAXED))
			return &rings[i];
	}
	return NULL;
}

/* A ring claimed for a thread without one (NULL if none is free: it
 * tries again after RING_RETRY calls). */
static struct shim_ring *ring_take(struct mt_thread *t)
{
	struct shim_ring *r;

	if (t->ring == RING_NONE && ++t->ring_retry % RING_RETRY != 0)
		return NULL;
	r = ring_claim(t);
	t->ring = r ? r : RING_NONE;
	if (!r)
		return NULL;
	/* Its end releases the ring (the key's destructor). */
	if (__atomic_load_n(&mt_key_made, __ATOMIC_ACQUIRE) && t->state == MT_NEW) {
		t->in_ring = 2;
		if (pthread_setspecific(mt_key, t) == 0) {
			t->owner = t->tid;
			t->state = MT_BUFFERING;
		}
		t->in_ring = 0;
	}
	return r;
}

/* The thread's ring, or NULL: the hook path. Not while it writes to it
 * (a signal handler's call) or updates its buffer of frees. Frees the
 * hook path left buffered go first. Hot path: every recorded call. */
struct shim_ring *ring_of(struct mt_thread *t)
{
	struct shim_ring *r;

	if (__builtin_expect(t->in_ring || t->busy || !ring_here(t), 0))
		return NULL;
	/* ring_on drops when memtrail is gone (ring_wait): a thread with a
	 * ring would otherwise wait on it at every call. */
	if (__builtin_expect(!__atomic_load_n(&ring_on, __ATOMIC_ACQUIRE), 0))
		return NULL;
	/* memtrail reads the file no more (a record it could not take as the
	 * process's): the hook path from now on. */
	if (__builtin_expect(__atomic_load_n(&ring_ctl->state, __ATOMIC_RELAXED) == RING_CLOSED, 0)) {
		__atomic_store_n(&ring_on, 0, __ATOMIC_RELEASE);
		return NULL;
	}
	/* A thread of a fork's child: its ring was its parent's. */
	if (__builtin_expect(t->ring_gen != ring_proc->pid, 0)) {
		t->ring_gen = ring_proc->pid;
		t->ring = t->state == MT_DIRECT ? RING_NONE : NULL;
	}
	r = t->ring;
	if (__builtin_expect(r == NULL || r == RING_NONE, 0)) {
		r = ring_take(t);
		if (!r)
			return NULL;
	}
	if (__builtin_expect(t->count != 0, 0))
		flush_self();
	return r;
}

/* Waits for room in a full ring; false if memtrail is gone or reads the
 * process's file no more (the ring path is then off for the process). */
static int ring_wait(unsigned int *spins)
{
	if (++*spins % 4096 == 0 &&
	    (__atomic_load_n(&ring_ctl->state, __ATOMIC_ACQUIRE) == RING_CLOSED ||
	     (ring_memtrail > 0 && kill(ring_memtrail, 0) != 0 && errno == ESRCH))) {
		__atomic_store_n(&ring_on, 0, __ATOMIC_RELEASE);
		return 0;
	}
	sched_yield();
	return 1;
}

/* Reserves a record of len bytes (BPF's ring buffer layout: an 8-byte
 * header, 8-byte aligned), busy until ring_commit. A record never wraps
 * past the data's end: a discarded filler takes the rest first. Hot path:
 * every record. */
void *ring_reserve(struct shim_ring *r, uint32_t len)
{
	uint64_t stride = (8 + (uint64_t)len + 7) & ~7ULL, size = ring_size, p = *r->prod;
	uint64_t off = p & (size - 1), pad = off + stride > size ? size - off : 0;
	unsigned int spins = 0;
	volatile uint32_t *hdr;

	while (p + pad + stride - __atomic_load_n(r->cons, __ATOMIC_ACQUIRE) > size)
		if (!ring_wait(&spins))
			return NULL;
	if (pad) {
		*(volatile uint32_t *)(r->data + off) = (uint32_t)(pad - 8) | RING_DISCARD;
		p += pad;
		off = 0;
	}
	hdr = (volatile uint32_t *)(r->data + off);
	*hdr = len | RING_BUSY;
	/* A full barrier: the position is visible before the stamp is read. */
	__atomic_exchange_n(r->prod, p + stride, __ATOMIC_SEQ_CST);
	return (void *)(r->data + off + 8);
}

/* An allocation's record, its stack first. */
__attribute__((noinline)) void ring_alloc(struct shim_ring *r, struct mt_thread *t, uint16_t kind,
					  void *p, uint64_t size, void *old)
{
	uint64_t id = 0;

	t->in_ring = 1;
	barrier();
	if (ring_depth)
		id = ring_stack(r, t);
	ring_event(r, t, kind, (uint64_t)(uintptr_t)p, size, (uint64_t)(uintptr_t)old, id);
	barrier();
	t->in_ring = 0;
}
