/*
 * The ring path (issue 22): the ring file's layout and the ring writer's
 * interface (ring_file.c sets the file up, ring.c writes to it).
 *
 * Each process has a ring file of its own (src/ring/shim.rs: a control
 * page, then rings in the layout of a BPF ring buffer: consumer page,
 * producer page, data, and a table of the stacks already written through
 * the ring), which no other process maps (issue 40): MEMTRAIL_SHM offers
 * the ring path (memtrail's pid); the process makes a memfd, names it to
 * memtrail through the hook (MT_SHIM_RINGS: BPF records which process
 * did, the kernel's word, not the file's) and waits for memtrail to take
 * it (pidfd_getfd), size it, seal it and fill its control page. The child
 * of any fork, also one made by a raw clone, finds its process's word
 * zeroed (a MADV_WIPEONFORK page) and makes its own before it writes a
 * record: its parent's rings are not mapped in it (MADV_DONTFORK).
 *
 * A thread claims a ring of its own (single producer) and writes its
 * records there itself, as BPF's ring buffer code writes them: the
 * producer position published before the record is stamped, the record's
 * header busy until it is complete. memtrail reads these rings next to
 * BPF's events ring, merged by stamp (src/ring/merge.rs), so no kernel
 * entry is made per call. The stack is walked here (stack.c), the thread's
 * Python frames after it (python.c).
 *
 * The hook path stays for everything the ring path does not cover: a
 * process without the file, libunwind or a free ring, a Python process
 * whose frames memtrail walks without a layout for its interpreter here,
 * another --unwind than the default, and a call made while the thread
 * writes to its ring (a signal handler's). While the shim looks a symbol
 * up (dladdr, dlopen) or sets up, the allocator calls those make are not
 * recorded (quiet, in_ring 2): they are the shim's, not the program's.
 *
 * The control page is memtrail's (src/ring/shim.rs writes it and its
 * tests pin the offsets checked below); the records are bpf/memtrail.h's.
 * Everything the page says is checked before it is used (ring_control_ok,
 * py_layout_fits): the file is shared with memtrail only, but a wrong one
 * must not make the shim write outside it.
 */
#ifndef MEMTRAIL_PRELOAD_RING_H
#define MEMTRAIL_PRELOAD_RING_H

#include "shim.h"

#define RING_MAGIC 0x314d48534c54524dULL /* "MTRLSHM1" */
#define RING_VERSION 3
/* How long a process waits for memtrail to take its ring file before it
 * keeps the hook path (memtrail's poller takes it within a millisecond). */
#define RING_ADOPT_NS (2ULL * 1000 * 1000 * 1000)
/* The handshake word (struct ring_control.state): memtrail took the file
 * (then the magic follows), or the process gave up waiting first. */
#define RING_ADOPTED 1
#define RING_ABANDONED 2
/* ... then memtrail stopped reading it: a record it could not take as the
 * process's (src/ring/merge.rs). */
#define RING_CLOSED 3
/* A BPF ring buffer record header's bits. */
#define RING_BUSY (1U << 31)
#define RING_DISCARD (1U << 30)
#define RING_MAX 256
#define RING_PAGE 4096
/* memtrail walks Python frames: a Python process walks them itself
 * (python.c) where the control page has its interpreter's layout, else
 * keeps the hook path. */
#define RING_F_PYTHON 1
/* No stack cache (sc_find): every stack is walked (a test's reference). */
#define RING_F_NO_STACK_CACHE 2
/* A thread that found no free ring tries again after this many calls. */
#define RING_RETRY 1024
#define RING_NONE ((struct shim_ring *)1)

struct ring_control {
	uint64_t magic;
	uint32_t version;
	uint32_t nrings;
	uint32_t data_size;
	uint32_t dedup_slots;
	uint32_t stack_depth;
	uint32_t flags;
	uint32_t memtrail_pid;
	uint32_t ring_pages;
	/* memtrail's PID namespace (its inode): ids are memtrail's only there. */
	uint64_t pidns;
	/* RING_ADOPTED or RING_ABANDONED, whoever is first (compare-and-swap). */
	uint32_t state;
	uint32_t reserved[3];
	/* tgid << 32 | tid of each ring's thread, 0 for a free ring (up to
	 * RING_CLAIMS_END). */
	uint64_t claims[];
};
/* src/ring/shim.rs: STATE_AT, CLAIMS_AT. */
_Static_assert(offsetof(struct ring_control, state) == 48, "memtrail's STATE_AT");
_Static_assert(offsetof(struct ring_control, claims) == 64, "memtrail's CLAIMS_AT");

/* Where the Python layouts start in the control page: RING_PY_LAYOUTS of
 * struct ring_py_layout (src/ring/shim.rs). */
#define RING_CLAIMS_END 2048
#define RING_PY_LAYOUTS 4

/* One CPython version's layout (3.minor, 0: none), as memtrail gives BPF:
 * bpf/memtrail.h's struct mt_py_offsets after the version word. */
struct ring_py_layout {
	uint32_t minor;
	uint32_t _pad;
	union {
		struct mt_py_offsets off;
		uint8_t _size[56];
	};
};
_Static_assert(sizeof(struct ring_py_layout) == 64, "memtrail writes 64-byte layouts");
_Static_assert(offsetof(struct ring_py_layout, off) == 8, "the offsets follow the version");

/* The layouts of interpreter images memtrail found (3.13+: read from the
 * image), after the per-version ones: the image's device (the kernel's
 * encoding) and inode, then its layout, set once its minor is (written
 * last). */
struct ring_py_image {
	uint64_t dev;
	uint64_t ino;
	struct ring_py_layout layout;
};
#define RING_PY_IMAGES_AT (RING_CLAIMS_END + RING_PY_LAYOUTS * 64)
#define RING_PY_IMAGES 16
_Static_assert(RING_PY_IMAGES_AT + RING_PY_IMAGES * sizeof(struct ring_py_image) <= RING_PAGE,
	       "the image layouts end in the control page");

/* The records the shim writes (bpf/memtrail.h): what memtrail reads. */
_Static_assert(sizeof(struct mt_header) == 24, "a record's header: three words");
_Static_assert(sizeof(struct mt_alloc_event) == 56, "an event: 64 bytes in the ring");
_Static_assert(offsetof(struct mt_shim_stack, ips) == 40, "a stack's frames after 5 words");

/* One ring of the file, as the thread that claimed it writes it. */
struct shim_ring {
	volatile uint64_t *cons;
	volatile uint64_t *prod;
	char *data;
	uint64_t *dedup;
	uint64_t *claim;
};

/* ---- ring.c: the rings and the writer ---- */

extern struct shim_ring rings[RING_MAX];
extern uint32_t ring_count, ring_size, ring_dedup, ring_depth;
extern pid_t ring_memtrail;
/* The ring path is on for the process (dropped when memtrail is gone). */
extern int ring_on;
/* The process whose rings `rings` are (getpid at set-up). */
extern pid_t ring_pid;
/* memtrail's pid from MEMTRAIL_SHM: the ring path is offered. */
extern pid_t ring_offered;
/*
 * The process the rings are set up in, in a page the kernel zeroes in the
 * child of a fork (MADV_WIPEONFORK): pid the process whose rings `rings`
 * are (0: none yet), tried set once a thread of the process began to set
 * them up. A thread's ring is its process's only while its gen is pid.
 */
struct ring_proc {
	volatile pid_t pid;
	int tried;
};
extern struct ring_proc *ring_proc;
extern struct ring_control *ring_ctl;

int ring_here(struct mt_thread *t);
struct shim_ring *ring_of(struct mt_thread *t);
void *ring_reserve(struct shim_ring *r, uint32_t len);
void ring_alloc(struct shim_ring *r, struct mt_thread *t, uint16_t kind, void *p, uint64_t size,
		void *old);

/* Commits a record ring_reserve gave: its header's length, busy bit off. */
static inline void ring_commit(void *rec, uint32_t len)
{
	__atomic_store_n((uint32_t *)rec - 2, len, __ATOMIC_RELEASE);
}

/* struct mt_header, stamped ts, of the thread's process and thread. */
static inline void ring_header(struct mt_header *h, uint64_t ts, struct mt_thread *t,
			       uint16_t kind)
{
	h->ts_ns = ts;
	h->pid = (uint32_t)ring_pid;
	h->tid = (uint32_t)t->tid;
	h->kind = kind;
	h->flags = 0;
	h->_pad = 0;
}

/* An event (struct mt_alloc_event), stamped after its reservation. Hot
 * path (inline: a free's record is made in free's own body). */
static inline void ring_event(struct shim_ring *r, struct mt_thread *t, uint16_t kind,
			      uint64_t addr, uint64_t size, uint64_t old, uint64_t stack)
{
	struct mt_alloc_event *e = ring_reserve(r, sizeof(*e));

	if (!e)
		return;
	ring_header(&e->hdr, now_ns(), t, kind);
	e->addr = addr;
	e->size = size;
	e->old_addr = old;
	e->aux = stack;
	ring_commit(e, sizeof(*e));
}

/* A free's (or a realloc's begin's) record. */
static inline void ring_release(struct shim_ring *r, struct mt_thread *t, uint16_t kind, void *p)
{
	t->in_ring = 1;
	barrier();
	ring_event(r, t, kind, (uint64_t)(uintptr_t)p, 0, 0, 0);
	barrier();
	t->in_ring = 0;
}

/* Whether the ring has written stack id (its table of ids), noting it. */
static inline int ring_knows(struct shim_ring *r, uint64_t id)
{
	uint64_t mask = ring_dedup - 1, at = id & mask;
	uint32_t i;

	for (i = 0; i < 4; i++) {
		uint64_t v = r->dedup[(at + i) & mask];

		if (v == id)
			return 1;
		if (v == 0) {
			r->dedup[(at + i) & mask] = id;
			return 0;
		}
	}
	r->dedup[at] = id;
	return 0;
}

/* ---- ring_file.c: the file's handshake and set-up ---- */

/* Maps the page of ring_proc (none without MEMTRAIL_SHM). */
void ring_proc_page(void);
/* Sets up this process's rings (ring_here, once per process); quiet. */
void ring_setup(void);

/* ---- stack.c: the stack walk ---- */

uint64_t ring_stack(struct shim_ring *r, struct mt_thread *t);
/* Loads libunwind (0 if it cannot be had). */
int load_unwinder(void);
/* Finds the shim's and libc's code and the operator news the walk skips. */
void find_images(void);
/* Whether the walk can be made (libunwind loaded, the images found). */
extern int (*unw_bt)(void **, int);
/* libunwind's TLS module id (the stack cache finds libunwind's trace cache
 * through it). */
extern size_t unw_modid;
extern uint64_t shim_hi;

/* ---- stack_cache.c ---- */

/* Whether the stack cache is on (the control page's flags). */
extern int sc_enabled;

/* ---- python.c ---- */

/* Whether this Python process walks its frames itself (the control page,
 * at `control`, has its interpreter's layout). */
int py_setup(const char *control);
/* py_setup found the layout; the interpreter's code is [py_lo, py_hi). */
extern int py_on;
extern uint64_t py_lo, py_hi;
/* Appends the thread's Python frames to ips[0..nr); the new count. */
int py_walk(uint64_t *ips, int nr);
/* Writes the code records of the last walk's frames the ring lacks. */
void py_code_record(struct shim_ring *r, struct mt_thread *t, uint64_t code);

#endif /* MEMTRAIL_PRELOAD_RING_H */
