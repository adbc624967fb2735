/*
 * memtrail's preload shim (`memtrail run --preload`, issue 22).
 *
 * Interposes glibc's standard allocator API. Where it can, a thread
 * writes each call's record itself into a ring of memtrail's shared
 * memory (the ring path, below: no kernel entry). Elsewhere (the hook
 * path) it hands each call to
 * memtrail through one hook, `memtrail_hook`: a function whose first
 * instruction is a 5-byte nop, so the kernel's optimized uprobe (Linux
 * 6.18, a `call` into a trampoline page that enters the kernel by a
 * syscall instead of an int3 trap) serves it. One kernel entry per
 * allocation, and frees ride along (below), where the uprobe mode takes
 * three a pair (malloc's entry and its return, free's entry).
 *
 * What memtrail's hook program reads (bpf/memtrail.bpf.c, shim_hook):
 *   rdi  the record's kind (enum mt_kind), or MT_SHIM_HELLO
 *   rsi  the block (the argument of free, the result of an allocation)
 *   rdx  the size asked (calloc/reallocarray: the product, ~0 on overflow)
 *   rcx  the old block of a realloc
 *   r8   the thread's buffered frees (struct mt_thread's slots), r10 how
 *        many (0: none): recorded before the hook's own record
 *   r9   the interposer's frame address: its caller's return address is
 *        at r9 + 8, the caller's stack pointer at r9 + 16
 *   rbp  the caller's frame pointer (as it was at the interposer's entry)
 * so the stack walk starts at the interposer's caller exactly as a uprobe
 * at the allocator's entry starts it, and never walks the shim's frames.
 *
 * Order, for exact counts: a free's and a realloc's old block are handed
 * over before the real call releases them (no other thread can get the
 * block back before its release is recorded), an allocation after the
 * real call returned it. Allocations the shim makes for dlsym while it
 * looks the real functions up come from a static buffer, are not
 * reported, and their frees are ignored.
 *
 * Batched frees: free() puts the block in the thread's buffer and returns;
 * the real free waits. The thread's next hook carries the buffer (one
 * kernel entry for the allocation and the frees before it), then the
 * shim really frees them and empties it. Until then no allocator call can
 * hand the blocks out again, so the records stay in the uprobe mode's
 * order. A full buffer, a fork (in the parent, before it forks), an exec
 * of this thread, the thread's end (a thread-specific key's destructor)
 * and the process's (a destructor, run after the program's atexit
 * handlers and destructors) flush it with MT_SHIM_FLUSH. A large block
 * (MT_LARGE) is freed at once, the buffer with it, and so are a thread's
 * frees after its flush at its end (one entry each). What a
 * thread leaves buffered when it ends without them (_exit, a fatal
 * signal, another thread's exit or exec) memtrail reads from its TLS at
 * its exit (bpf/memtrail.bpf.c, shim_exit). `busy` makes the buffer the
 * thread's own while it is updated: a signal handler's free or allocation
 * then does not touch it (a free is made at once).
 *
 * While a real allocator call runs, a thread-local flag is set: memtrail
 * reads it at memory syscalls (the allocator's own arenas and trims), at
 * the offset from the thread pointer the constructor's hello gives.
 *
 * Built by build.rs with clang, -O2 -fPIC -shared -fno-omit-frame-pointer
 * -mno-red-zone (the hook call below changes rbp around a call the
 * compiler does not see).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* enum mt_kind (bpf/memtrail.h). */
enum {
	MT_MALLOC = 1,
	MT_CALLOC = 2,
	MT_REALLOC = 3,
	MT_REALLOCARRAY = 4,
	MT_ALIGNED_ALLOC = 5,
	MT_MEMALIGN = 6,
	MT_POSIX_MEMALIGN = 7,
	MT_VALLOC = 8,
	MT_PVALLOC = 9,
	MT_FREE = 10,
	MT_REALLOC_BEGIN = 11,
	/* The shim's constructor: rsi the offset of struct mt_thread (its
	 * in-allocator flag first) from the thread pointer. */
	MT_SHIM_HELLO = 64,
	/* Only the buffered frees (r8, r10). */
	MT_SHIM_FLUSH = 65,
};

/* The buffer's size: MT_FREE_BATCH_MAX (bpf/memtrail.h). */
#define MT_BATCH 32
/* Blocks this large (malloc_usable_size) are freed at once: glibc's
 * default mmap threshold, a mapping of their own. */
#define MT_LARGE (128 * 1024)

#define EXPORT __attribute__((visibility("default")))

/*
 * The hook: `nopl 0(%rax,%rax,1)` (0f 1f 44 00 00), the instruction the
 * kernel optimizes a uprobe on, then ret. memtrail_hook is the exported
 * name memtrail probes; the shim calls the local alias directly (no PLT).
 */
__asm__(".text\n"
	".p2align 4\n"
	".globl memtrail_hook\n"
	".type memtrail_hook,@function\n"
	"memtrail_hook:\n"
	"mt_hook_local:\n"
	".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"ret\n"
	".size memtrail_hook, .-memtrail_hook\n");

/*
 * Calls the hook with the interposer's caller's frame pointer in rbp and
 * the interposer's frame address in r9, and n buffered frees at buf (r8,
 * r10). Only from an interposer's own body (always inlined): there rbp is
 * its frame address. (A flush has no stack: any function will do.)
 */
#define HOOK_WITH(kind, a, b, c, buf, n)                                                 \
	do {                                                                             \
		register uint64_t r_di __asm__("rdi") = (uint64_t)(kind);               \
		register uint64_t r_si __asm__("rsi") = (uint64_t)(a);                  \
		register uint64_t r_dx __asm__("rdx") = (uint64_t)(b);                  \
		register uint64_t r_cx __asm__("rcx") = (uint64_t)(c);                  \
		register uint64_t r_8 __asm__("r8") = (uint64_t)(buf);                  \
		register uint64_t r_10 __asm__("r10") = (uint64_t)(n);                  \
		__asm__ volatile("mov %%rbp, %%r9\n\t"                                  \
				 "mov (%%rbp), %%rbp\n\t"                               \
				 "call mt_hook_local\n\t"                               \
				 "mov %%r9, %%rbp"                                      \
				 : "+r"(r_di), "+r"(r_si), "+r"(r_dx), "+r"(r_cx),      \
				   "+r"(r_8), "+r"(r_10)                                \
				 :                                                      \
				 : "r9", "memory");                                     \
	} while (0)

#define HOOK(kind, a, b, c) HOOK_WITH(kind, a, b, c, 0, 0)

/*
 * The hook of an allocating call, with the thread's buffered frees if it
 * has any and the buffer is free to take (not a signal handler's call
 * while the thread updates it), which are then really freed.
 */
#define HOOK_CARRY(kind, a, b, c)                                                        \
	do {                                                                             \
		struct mt_thread *t_ = &mt_self;                                         \
		if (__builtin_expect(t_->count != 0 && !t_->busy, 0)) {                  \
			unsigned int n_;                                                 \
			t_->busy = 1;                                                    \
			barrier();                                                       \
			n_ = take(t_);                                                   \
			HOOK_WITH(kind, a, b, c, t_->slots, n_);                         \
			drain(t_, n_);                                                   \
			barrier();                                                       \
			t_->busy = 0;                                                    \
		} else {                                                                 \
			HOOK(kind, a, b, c);                                             \
		}                                                                        \
	} while (0)

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

#define barrier() __asm__ volatile("" ::: "memory")

/* A real allocator call, with the in-allocator flag set around it (its
 * value kept if set: a call inside one, or the shim's own, 2). */
#define REAL(call)                                                                       \
	({                                                                               \
		int was_ = mt_in_alloc;                                                  \
		__typeof__(call) r_;                                                     \
		mt_in_alloc = was_ ? was_ : 1;                                           \
		r_ = (call);                                                             \
		mt_in_alloc = was_;                                                      \
		r_;                                                                      \
	})


/*
 * The ring path (issue 22). Each process has a ring file of its own
 * (src/ring/shim.rs: a control page, then rings in the layout of
 * a BPF ring buffer: consumer page, producer page, data, and a table of
 * the stacks already written through the ring), which no other process
 * maps (issue 40): MEMTRAIL_SHM offers the ring path (memtrail's pid);
 * the process makes a memfd, names it to memtrail through the hook
 * (MT_SHIM_RINGS: BPF records which process did, the kernel's word,
 * not the file's) and waits for memtrail to take it (pidfd_getfd),
 * size it, seal it and fill its control page. The child of any fork,
 * also one made by a raw clone, finds its process's word zeroed (a
 * MADV_WIPEONFORK page) and makes its own before it writes a record:
 * its parent's rings are not mapped in it (MADV_DONTFORK).
 * A thread claims a ring
 * of its own (single producer) and writes its records there itself, as
 * BPF's ring buffer code writes them: the producer position published
 * before the record is stamped, the record's header busy until it is
 * complete. memtrail reads these rings next to BPF's events ring, merged
 * by stamp (src/ring/merge.rs), so no kernel entry is made per call. The
 * stack is walked here, with libunwind (dlopen'ed, as heaptrack uses it),
 * from the interposer's caller, the C++ runtime's operator new left out
 * as memtrail's BPF walk leaves it out, then the thread's Python frames
 * (below).
 *
 * The hook path stays for everything the ring path does not cover: a
 * process without the file, libunwind or a free ring, a Python process
 * whose frames memtrail walks without a layout for its interpreter here,
 * another --unwind than the default, and a call made while the thread
 * writes to its ring (a signal handler's).
 * While the shim looks a symbol up (dladdr, dlopen) or sets up, the
 * allocator calls those make are not recorded (quiet): they are the
 * shim's, not the program's.
 */
enum { MT_SHIM_STACK = 13 };
#define MT_MAX_STACK 128
#define MT_END_COMPLETE 0
#define MT_END_DEPTH 1
#define RING_MAGIC 0x314d48534c54524dULL /* "MTRLSHM1" */
#define RING_VERSION 3
/* The hook's kind naming a process's new ring file (rsi its descriptor):
 * bpf/memtrail.bpf.c. */
#define MT_SHIM_RINGS 66
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
#define RING_BUSY (1U << 31)
#define RING_DISCARD (1U << 30)
#define RING_MAX 256
#define RING_PAGE 4096
/* memtrail walks Python frames: a Python process walks them itself (below)
 * where the control page has its interpreter's layout, else keeps the hook
 * path. */
#define RING_F_PYTHON 1
/* No stack cache (sc_find): every stack is walked (a test's reference). */
#define RING_F_NO_STACK_CACHE 2
/* A thread that found no free ring tries again after this many calls. */
#define RING_RETRY 1024
#define RING_NONE ((struct mt_ring *)1)
/* The in-allocator flag's value while the shim works for itself: memtrail
 * leaves out the anonymous mappings made then (MT_SHIM_OWN in
 * bpf/memtrail.bpf.c: ld.so's for libunwind, libunwind's caches). */
#define MT_SHIM_OWN 2
/* Frames of the shim and of operator new unw_backtrace may give before
 * the first one kept. */
#define RING_SKIP_MAX 16

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

/* Where the Python layouts start in the control page: RING_PY_LAYOUTS of
 * struct ring_py_layout (src/ring/shim.rs). */
#define RING_CLAIMS_END 2048
#define RING_PY_LAYOUTS 4

/* One CPython version's layout (3.minor, 0: none), as memtrail gives BPF:
 * struct mt_py_offsets in bpf/memtrail.h, its fields in its order (a test
 * of src/ring/shim.rs keeps the two the same). */
struct ring_py_layout {
	uint32_t minor;
	uint32_t _pad;
	union {
		struct {
			uint16_t runtime_interp_head;
			uint16_t interp_threads_head;
			uint16_t tstate_next;
			uint16_t tstate_thread_id;
			uint16_t tstate_frame;
			uint16_t cframe_frame;
			uint16_t frame_code;
			uint16_t frame_instr;
			uint16_t frame_previous;
			uint16_t frame_owner;
			uint16_t frame_is_entry;
			uint16_t code_adaptive;
			uint16_t code_qualname;
			uint16_t code_filename;
			uint16_t code_firstlineno;
			uint16_t code_linetable;
			uint16_t str_ascii_data;
			uint16_t str_compact_data;
			uint16_t frame_win;
			uint16_t frame_span;
			uint16_t runtime_tstate;
			uint16_t tstate_datastack;
		} off;
		uint8_t _size[56];
	};
};
_Static_assert(sizeof(struct ring_py_layout) == 64, "memtrail writes 64-byte layouts");

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

struct mt_ring {
	volatile uint64_t *cons;
	volatile uint64_t *prod;
	char *data;
	uint64_t *dedup;
	uint64_t *claim;
};

/* In .data, as everything large here: a .bss past the file's last page
 * would be an anonymous mapping ld.so makes (see `boot`). */
#define DATA __attribute__((section(".data")))
static struct mt_ring rings[RING_MAX] DATA;
static uint32_t ring_count, ring_size, ring_dedup, ring_depth;
static pid_t ring_memtrail;
static int ring_on;
static pid_t ring_pid;
/* memtrail's pid from MEMTRAIL_SHM: the ring path is offered. */
static pid_t ring_offered;
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
static struct ring_proc *ring_proc;
static struct ring_control *ring_ctl;
/* The shim's own code: frames there are not the program's. libc's. */
static uint64_t shim_lo, shim_hi, libc_lo, libc_hi;
static int (*unw_bt)(void **, int);
/* libunwind's TLS module id (the stack cache finds libunwind's trace cache
 * through it). */
static size_t unw_modid;
static int sc_enabled;

static void *(*next_malloc)(size_t);
static void (*next_free)(void *);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);
static void *(*next_memalign)(size_t, size_t);
static void *(*next_valloc)(size_t);
static void *(*next_pvalloc)(size_t);
static size_t (*next_usable_size)(void *);

static int (*next_execve)(const char *, char *const[], char *const[]);
static int (*next_execvpe)(const char *, char *const[], char *const[]);
static int (*next_fexecve)(int, char *const[], char *const[]);
static int (*next_execveat)(int, const char *, char *const[], char *const[], int);

/* A thread's buffer: not started, buffering (its key's destructor set),
 * or every free made at once (the thread or the process is ending, or the
 * key could not be made). */
enum { MT_NEW = 0, MT_BUFFERING = 1, MT_DIRECT = 2 };

/*
 * A thread's state. memtrail reads the first three fields, at the hello's
 * offset from the thread pointer (bpf/memtrail.bpf.c: MT_SHIM_COUNT_OFF,
 * MT_SHIM_SLOTS_OFF): keep them where they are.
 */
struct mt_thread {
	/* Set while a real allocator call runs on this thread (read by
	 * memtrail at memory syscalls). */
	volatile int in_alloc;
	/* Frees in slots, not yet recorded nor made. */
	volatile unsigned int count;
	void *volatile slots[MT_BATCH];
	/* Set while the thread updates the buffer (see the top). */
	volatile int busy;
	int state;
	/* The thread that buffers here (gettid): a vfork child runs on its
	 * parent's thread's TLS, and leaves its buffer alone. */
	pid_t owner;
	/* The ring path (below): the thread's ring, 0 if it has none yet;
	 * RING_NONE if none could be had (the hook path, retried now and
	 * then); set while the shim writes to it (a signal handler's call
	 * then takes the hook path, and the shim's own calls are not
	 * recorded). */
	struct mt_ring *ring;
	unsigned int ring_retry;
	int in_ring;
	pid_t tid;
	/* The process (ring_proc->pid) whose ring `ring` is. */
	pid_t ring_gen;
	/* The thread's stack cache (see sc_find), made at its SC_AFTER-th
	 * walk (NULL: none); where libunwind keeps the pointer to the
	 * thread's trace cache; the thread's stack's mapping; the next entry
	 * to replace, the walks counted toward the cache. */
	struct sc_block *sc;
	void *const *sc_unw;
	uint64_t sc_lo, sc_hi;
	uint32_t sc_next, sc_walks;
};

static __thread struct mt_thread mt_self __attribute__((tls_model("initial-exec")));
#define mt_in_alloc (mt_self.in_alloc)

static unsigned int take(struct mt_thread *t);
static void drain(struct mt_thread *t, unsigned int n);

/* Its destructor flushes a thread's buffer at the thread's end. */
static pthread_key_t mt_key;
static int mt_key_made;

/* The bootstrap buffer: dlsym's own allocations while it resolves (none
 * on glibc 2.36 unless a lookup fails). In .data, not .bss: a .bss past
 * the file's last page would be an anonymous mapping ld.so makes, one the
 * uprobe mode's process does not have. */
static char boot[4096] __attribute__((aligned(64), section(".data")));
static size_t boot_used;
static int resolving;
static int aligned_alloc_kind = MT_ALIGNED_ALLOC;

static int in_boot(const void *p)
{
	return (const char *)p >= boot && (const char *)p < boot + sizeof(boot);
}

static void *boot_alloc(size_t size)
{
	size_t at = (boot_used + 15) & ~(size_t)15;

	if (size > sizeof(boot) || at + size > sizeof(boot))
		return NULL;
	boot_used = at + size;
	return boot + at;
}

/*
 * The shim's own allocations (quiet: libunwind's thread-local storage,
 * what dlopen and dladdr allocate for the shim) come from this arena, not
 * from the program's allocator: they are not the program's, and whoever
 * frees one later (glibc frees a thread's TLS blocks at its end, often in
 * another thread) finds it here and is not recorded either. Size classes
 * of 32 bytes to 64 KiB, each block after a 16-byte header naming its class;
 * what does not fit goes to the real allocator, unrecorded. In .data, as
 * the bootstrap buffer.
 */
#define QUIET_CLASSES 12
#define QUIET_HEADER 16
static char quiet_arena[256 * 1024] __attribute__((aligned(64), section(".data")));
static size_t quiet_used;
static void *quiet_free_list[QUIET_CLASSES];
static int quiet_lock;

static int in_quiet(const void *p)
{
	return (const char *)p >= quiet_arena && (const char *)p < quiet_arena + sizeof(quiet_arena);
}

static void *quiet_alloc(size_t size)
{
	unsigned int c = 0;
	size_t block;
	void *p;

	while (c < QUIET_CLASSES && ((size_t)32 << c) < size)
		c++;
	if (c == QUIET_CLASSES)
		return NULL;
	block = QUIET_HEADER + ((size_t)32 << c);
	while (__atomic_exchange_n(&quiet_lock, 1, __ATOMIC_ACQUIRE))
		;
	p = quiet_free_list[c];
	if (p) {
		quiet_free_list[c] = *(void **)p;
	} else if (quiet_used + block <= sizeof(quiet_arena)) {
		char *h = quiet_arena + quiet_used;

		quiet_used += block;
		*(unsigned int *)h = c;
		p = h + QUIET_HEADER;
	}
	__atomic_store_n(&quiet_lock, 0, __ATOMIC_RELEASE);
	if (p)
		memset(p, 0, (size_t)32 << c);
	return p;
}

static size_t quiet_size(const void *p)
{
	return (size_t)32 << *(const unsigned int *)((const char *)p - QUIET_HEADER);
}

static void quiet_release(void *p)
{
	unsigned int c = *(unsigned int *)((char *)p - QUIET_HEADER);

	while (__atomic_exchange_n(&quiet_lock, 1, __ATOMIC_ACQUIRE))
		;
	*(void **)p = quiet_free_list[c];
	quiet_free_list[c] = p;
	__atomic_store_n(&quiet_lock, 0, __ATOMIC_RELEASE);
}

/* For an allocator without malloc_usable_size: no block is large. */
static size_t no_usable_size(void *p)
{
	(void)p;
	return 0;
}

/*
 * Tells memtrail where the thread's state is (MT_SHIM_HELLO): its offset
 * from the thread pointer is the same in every thread of the process.
 * Once per process, before the shim's first real allocator call: from the
 * constructor, or from resolve when another library's constructor, run
 * before this one (libstdc++'s, making its emergency pool), calls the
 * allocator first. Until BPF has the offset it cannot see the flag, and
 * the allocator's own probes (jemalloc's malloc) recorded the shim's call
 * a second time (issue 41). A fork's child keeps the parent's hello.
 */
static int hello_said;
static void say_hello(void)
{
	uint64_t tp;

	if (__atomic_exchange_n(&hello_said, 1, __ATOMIC_RELAXED))
		return;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(tp));
	HOOK(MT_SHIM_HELLO, (uint64_t)&mt_self - tp, 0, 0);
}

static void resolve(void)
{
	if (next_malloc || resolving)
		return;
	resolving = 1;
	next_free = dlsym(RTLD_NEXT, "free");
	next_calloc = dlsym(RTLD_NEXT, "calloc");
	next_realloc = dlsym(RTLD_NEXT, "realloc");
	next_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
	next_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
	next_memalign = dlsym(RTLD_NEXT, "memalign");
	/* glibc's aligned_alloc is memalign (one address): the uprobe mode
	 * names the site memalign, and so does the shim. */
	aligned_alloc_kind = next_aligned_alloc == next_memalign ? MT_MEMALIGN : MT_ALIGNED_ALLOC;
	next_valloc = dlsym(RTLD_NEXT, "valloc");
	next_pvalloc = dlsym(RTLD_NEXT, "pvalloc");
	next_usable_size = dlsym(RTLD_NEXT, "malloc_usable_size");
	if (!next_usable_size)
		next_usable_size = no_usable_size;
	next_execve = dlsym(RTLD_NEXT, "execve");
	next_execvpe = dlsym(RTLD_NEXT, "execvpe");
	next_fexecve = dlsym(RTLD_NEXT, "fexecve");
	next_execveat = dlsym(RTLD_NEXT, "execveat");
	/* Before the first real call, which follows. */
	say_hello();
	/* Last: its being set says every other one is. */
	__atomic_store_n(&next_malloc, dlsym(RTLD_NEXT, "malloc"), __ATOMIC_RELEASE);
	resolving = 0;
}

/* Whether the real functions are there; false only inside dlsym's own
 * calls during resolve (served from the bootstrap buffer). */
static inline int ready(void)
{
	if (__builtin_expect(__atomic_load_n(&next_malloc, __ATOMIC_ACQUIRE) != NULL, 1))
		return 1;
	resolve();
	return next_malloc != NULL;
}

static uint64_t product(size_t n, size_t m)
{
	size_t size;

	if (__builtin_mul_overflow(n, m, &size))
		return ~0ULL;
	return size;
}

/* ---- The ring path's functions (see above) ---- */

static void flush_self(void);
static void find_wrappers(void);

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The code segments holding the shim's own code and libc's malloc. */
static int find_texts(struct dl_phdr_info *info, size_t size, void *data)
{
	uint64_t self = (uint64_t)(uintptr_t)&find_texts, libc = (uint64_t)(uintptr_t)data;
	int i;

	(void)size;
	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uint64_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;

		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		if (self >= lo && self < hi) {
			shim_lo = lo;
			shim_hi = hi;
		}
		if (libc >= lo && libc < hi) {
			libc_lo = lo;
			libc_hi = hi;
		}
	}
	return 0;
}

/* libunwind, as heaptrack loads it: unw_backtrace with a per-thread cache. */
static int load_unwinder(void)
{
	void *lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
	int (*set_policy)(void *, int);
	void **space;

	if (!lib)
		return 0;
	set_policy = (int (*)(void *, int))dlsym(lib, "_ULx86_64_set_caching_policy");
	space = (void **)dlsym(lib, "_ULx86_64_local_addr_space");
	if (set_policy && space)
		set_policy(*space, 2 /* UNW_CACHE_PER_THREAD */);
	unw_bt = (int (*)(void **, int))dlsym(lib, "unw_backtrace");
	if (dlinfo(lib, RTLD_DI_TLS_MODID, &unw_modid) != 0)
		unw_modid = 0;
	return unw_bt != NULL;
}

static int py_setup(const char *control);

/* Whether a ring file's control page, of st_size bytes, is one the shim
 * can use. */
static int ring_control_ok(const struct ring_control *ctl, uint64_t st_size)
{
	uint64_t need = ((uint64_t)1 + (uint64_t)ctl->nrings * ctl->ring_pages) * RING_PAGE;

	return ctl->version == RING_VERSION && ctl->nrings != 0 && ctl->nrings <= RING_MAX &&
	       need <= st_size && ctl->data_size >= RING_PAGE &&
	       !(ctl->data_size & (ctl->data_size - 1)) && ctl->dedup_slots != 0 &&
	       !(ctl->dedup_slots & (ctl->dedup_slots - 1)) &&
	       (uint64_t)ctl->ring_pages * RING_PAGE >=
		       2 * RING_PAGE + ctl->data_size + 8ULL * ctl->dedup_slots &&
	       64 + 8ULL * ctl->nrings <= RING_CLAIMS_END;
}

/* The control page's magic, read from the file (no mapping: a fork's
 * child sets up in the middle of its program, whose mappings and unmappings
 * memtrail records). */
static uint64_t ring_magic(int fd)
{
	uint64_t magic = 0;

	if (pread(fd, &magic, sizeof(magic), 0) != (ssize_t)sizeof(magic))
		return 0;
	return magic;
}

/* Gives up on memtrail taking the file, unless it took it meanwhile: true
 * if the process gave up first. */
static int ring_abandon(int fd)
{
	struct ring_control *ctl;
	uint32_t fresh = 0;
	int gave_up;

	ctl = mmap(NULL, RING_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ctl == MAP_FAILED)
		return 1;
	gave_up = __atomic_compare_exchange_n(&ctl->state, &fresh, RING_ABANDONED, 0,
					      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
	munmap(ctl, RING_PAGE);
	return gave_up;
}

/*
 * Makes this process's ring file and waits for memtrail to take it (see
 * the top of the ring path): its mapping, or NULL (the hook path). The
 * wait ends when the control page's magic is set, or when memtrail is gone
 * or RING_ADOPT_NS passed and the process marked the file abandoned first.
 */
static char *ring_offer(size_t *len)
{
	uint64_t deadline = now_ns() + RING_ADOPT_NS;
	unsigned int spins = 0;
	struct stat st;
	char *base = NULL;
	int fd;

	fd = memfd_create("memtrail_rings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return NULL;
	if (ftruncate(fd, RING_PAGE) != 0)
		goto out;
	HOOK(MT_SHIM_RINGS, fd, 0, 0);
	while (ring_magic(fd) != RING_MAGIC) {
		if (++spins % 256 == 0 &&
		    (now_ns() > deadline || (kill(ring_offered, 0) != 0 && errno == ESRCH)) &&
		    ring_abandon(fd))
			goto out;
		sched_yield();
	}
	if (fstat(fd, &st) != 0)
		goto out;
	base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		base = NULL;
		goto out;
	}
	/* Not in a child: it makes its own. */
	if (madvise(base, (size_t)st.st_size, MADV_DONTFORK) != 0 ||
	    !ring_control_ok((struct ring_control *)base, (uint64_t)st.st_size)) {
		munmap(base, (size_t)st.st_size);
		base = NULL;
		goto out;
	}
	*len = (size_t)st.st_size;
out:
	close(fd);
	return base;
}

/* This process's ring file (ring_offer), and whether it takes the ring
 * path with it; quiet (the calls it makes are not recorded). */
static void ring_setup(void)
{
	struct ring_control *ctl;
	struct stat st;
	size_t len = 0;
	char *base;
	uint32_t i;

	if (!ring_offered || !ring_proc)
		return;
	base = ring_offer(&len);
	if (!base)
		return;
	ctl = (struct ring_control *)base;
	if ((ctl->flags & RING_F_PYTHON) && dlsym(RTLD_DEFAULT, "_PyRuntime") &&
	    !py_setup(base))
		return;
	if (ctl->pidns && (stat("/proc/self/ns/pid", &st) != 0 || (uint64_t)st.st_ino != ctl->pidns))
		return;
	ring_depth = ctl->stack_depth < MT_MAX_STACK ? ctl->stack_depth : MT_MAX_STACK;
	sc_enabled = !(ctl->flags & RING_F_NO_STACK_CACHE);
	if (ring_depth && !unw_bt && !load_unwinder())
		return;
	/* The image's: a fork's child has them from its parent. */
	if (!shim_hi) {
		dl_iterate_phdr(find_texts, (void *)(uintptr_t)next_malloc);
		find_wrappers();
	}
	for (i = 0; i < ctl->nrings; i++) {
		char *r = base + (size_t)RING_PAGE * (1 + (size_t)i * ctl->ring_pages);

		rings[i].cons = (volatile uint64_t *)r;
		rings[i].prod = (volatile uint64_t *)(r + RING_PAGE);
		rings[i].data = r + 2 * RING_PAGE;
		rings[i].dedup = (uint64_t *)(r + 2 * RING_PAGE + ctl->data_size);
		rings[i].claim = &ctl->claims[i];
	}
	ring_count = ctl->nrings;
	ring_size = ctl->data_size;
	ring_dedup = ctl->dedup_slots;
	ring_memtrail = (pid_t)ctl->memtrail_pid;
	ring_ctl = ctl;
	ring_pid = getpid();
	ring_proc->pid = ring_pid;
	__atomic_store_n(&ring_on, 1, __ATOMIC_RELEASE);
}

/* The first thread of a process (the constructor's, a fork's child's,
 * one made by a raw clone) to want a ring sets the process's rings up;
 * quiet. False while it has none. */
static int ring_here(struct mt_thread *t)
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

/* The page of ring_proc (none without MEMTRAIL_SHM or the page). */
static void ring_proc_page(void)
{
	const char *env = getenv("MEMTRAIL_SHM");
	long pid = env ? strtol(env, NULL, 10) : 0;
	void *page;

	if (pid <= 0)
		return;
	page = mmap(NULL, RING_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return;
	if (madvise(page, RING_PAGE, MADV_WIPEONFORK) != 0) {
		munmap(page, RING_PAGE);
		return;
	}
	ring_offered = (pid_t)pid;
	ring_proc = page;
}

/* A ring for this thread: the one it had before its process exec'd, else
 * a free one. */
static struct mt_ring *ring_claim(struct mt_thread *t)
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
static struct mt_ring *ring_take(struct mt_thread *t)
{
	struct mt_ring *r;

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
 * hook path left buffered go first. */
static inline struct mt_ring *ring_of(struct mt_thread *t)
{
	struct mt_ring *r;

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
 * past the data's end: a discarded filler takes the rest first. */
static void *ring_reserve(struct mt_ring *r, uint32_t len)
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

static inline void ring_commit(void *rec, uint32_t len)
{
	__atomic_store_n((uint32_t *)rec - 2, len, __ATOMIC_RELEASE);
}

/* struct mt_header, then what follows it. */
static inline void ring_header(uint64_t *w, uint64_t ts, struct mt_thread *t, uint16_t kind)
{
	w[0] = ts;
	w[1] = (uint64_t)(uint32_t)t->tid << 32 | (uint32_t)ring_pid;
	w[2] = kind;
}

/* An event (struct mt_alloc_event), stamped after its reservation. */
static void ring_event(struct mt_ring *r, struct mt_thread *t, uint16_t kind, uint64_t addr,
		       uint64_t size, uint64_t old, uint64_t stack)
{
	uint64_t *e = ring_reserve(r, 56);

	if (!e)
		return;
	ring_header(e, now_ns(), t, kind);
	e[3] = addr;
	e[4] = size;
	e[5] = old;
	e[6] = stack;
	ring_commit(e, 56);
}

/* The unwind tables' OPERATOR_NEW (src/unwind/table.rs): a test of
 * src/attach/shim.rs keeps the two lists the same. */
static const char *const operator_new[] = {
	"_Znwm",
	"_Znam",
	"_ZnwmRKSt9nothrow_t",
	"_ZnamRKSt9nothrow_t",
	"_ZnwmSt11align_val_t",
	"_ZnamSt11align_val_t",
	"_ZnwmSt11align_val_tRKSt9nothrow_t",
	"_ZnamSt11align_val_tRKSt9nothrow_t",
};

/*
 * The code of the C++ operator news whose frames memtrail's walk leaves
 * out (src/unwind/table.rs, MT_ROW_ALLOC_WRAPPER): those of an image
 * without a malloc of its own (libstdc++, libc++), which only call
 * malloc. Found once, at set-up, in the program's global scope and in
 * libstdc++ and libc++ (an image loaded later keeps its new's frame).
 */
#define WRAPPERS_MAX 32
static struct {
	uint64_t lo, hi;
} wrappers[WRAPPERS_MAX] DATA;
static unsigned int wrapper_count;

/* Notes `name` in `handle` as a wrapper if its image has no malloc. */
static void note_wrapper(void *handle, const char *name)
{
	const ElfW(Sym) *sym = NULL;
	Dl_info info, mine;
	void *addr = dlsym(handle, name), *m;
	unsigned int i;
	int own;

	if (!addr || wrapper_count == WRAPPERS_MAX ||
	    !dladdr1(addr, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym || !sym->st_size)
		return;
	for (i = 0; i < wrapper_count; i++)
		if (wrappers[i].lo == (uint64_t)(uintptr_t)addr)
			return;
	m = dlsym(handle, "malloc");
	own = m && dladdr(m, &mine) && mine.dli_fbase == info.dli_fbase;
	if (own)
		return;
	wrappers[wrapper_count].lo = (uint64_t)(uintptr_t)addr;
	wrappers[wrapper_count].hi = (uint64_t)(uintptr_t)addr + sym->st_size;
	wrapper_count++;
}

static void find_wrappers(void)
{
	static const char *const runtimes[] = {"libstdc++.so.6", "libc++.so.1"};
	size_t i, j;

	for (i = 0; i < sizeof(operator_new) / sizeof(operator_new[0]); i++)
		note_wrapper(RTLD_DEFAULT, operator_new[i]);
	for (j = 0; j < sizeof(runtimes) / sizeof(runtimes[0]); j++) {
		void *h = dlopen(runtimes[j], RTLD_NOLOAD | RTLD_LAZY);

		if (!h)
			continue;
		for (i = 0; i < sizeof(operator_new) / sizeof(operator_new[0]); i++)
			note_wrapper(h, operator_new[i]);
		dlclose(h);
	}
}

/* Whether ip returns into one of those operator news. */
static inline int new_wrapper(uint64_t ip)
{
	unsigned int i;

	for (i = 0; i < wrapper_count; i++)
		if (ip > wrappers[i].lo && ip <= wrappers[i].hi)
			return 1;
	return 0;
}

/* glibc's signal trampoline, __restore_rt (mov $15,%rax; syscall), in
 * libc's code: only there is an address read (a frame found by frame
 * pointers in code without CFI, JIT code, may name any address). */
static inline int is_sigreturn(uint64_t ip)
{
	static const unsigned char code[9] = {0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05};

	return ip >= libc_lo && ip + sizeof(code) <= libc_hi &&
	       memcmp((const void *)(uintptr_t)ip, code, sizeof(code)) == 0;
}

static inline uint64_t mix(uint64_t h, uint64_t v)
{
	h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
	return h ^ h >> 29;
}

/* Whether the ring has written stack id (its table of ids), noting it. */
static int ring_knows(struct mt_ring *r, uint64_t id)
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

/*
 * Python frames on the ring path (issue 22). In a Python process (an
 * interpreter exporting _PyRuntime, whose layout memtrail put in the
 * control page: by version, or by image) the shim appends the thread's Python frames to its
 * stack as memtrail's BPF walk does (mt_py_walk in bpf/memtrail.bpf.c: the
 * same words, MT_PY_FRAME in bpf/memtrail.h), and before a new stack it
 * writes the records of the code objects its frames run that its ring has
 * not carried yet (struct mt_py_code_record), for memtrail to name them.
 * The thread's state is its own (PyGILState_GetThisThreadState: a
 * thread-specific value, set and cleared by the thread's interpreter,
 * read without a lock), checked by its thread id; its frames are the
 * thread's own, which only it changes, read as CPython's faulthandler
 * reads them. A walk only through native code (no frame in the
 * interpreter's code) has no Python frames.
 */
#define MT_PY_FRAME (1ULL << 63)
#define MT_PY_OFF_SHIFT 47
#define MT_PY_OFF_MAX 0xffffULL
#define MT_PY_CODE_MASK ((1ULL << MT_PY_OFF_SHIFT) - 1)
#define MT_PY_NONE 0xffff
#define MT_PY_OWNED_BY_CSTACK 3
#define MT_PY_NAME 256
#define MT_PY_TABLE 1024
enum { MT_SHIM_PY_CODE = 14 };

/* struct mt_py_code_record (bpf/memtrail.h). */
struct py_code_record {
	uint64_t zero;
	uint64_t code;
	uint32_t pid;
	int32_t first;
	uint32_t name_state;
	uint32_t name_len;
	uint32_t file_state;
	uint32_t file_len;
	uint32_t table_len;
	uint32_t _pad;
	uint8_t name[MT_PY_NAME];
	uint8_t file[MT_PY_NAME];
	uint8_t table[MT_PY_TABLE];
};

static struct ring_py_layout py_layout DATA;
static int py_on;
static void *(*py_this_state)(void);
/* The interpreter's code (the object defining _PyRuntime). */
static uint64_t py_lo, py_hi;

static int find_py_text(struct dl_phdr_info *info, size_t size, void *data)
{
	uint64_t at = (uint64_t)(uintptr_t)data;
	int i, found = 0;

	(void)size;
	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uint64_t lo = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && at >= lo && at < lo + ph->p_memsz)
			found = 1;
	}
	for (i = 0; found && i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uint64_t lo = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
			py_lo = lo;
			py_hi = lo + ph->p_memsz;
		}
	}
	return found;
}

/* The layout memtrail found for the interpreter image defining runtime, of
 * version 3.minor, in the control page; NULL if none. */
static const struct ring_py_layout *py_image_layout(const char *control, void *runtime,
						     uint32_t minor)
{
	const struct ring_py_image *images =
		(const struct ring_py_image *)(control + RING_PY_IMAGES_AT);
	const char *path;
	struct stat st;
	Dl_info info;
	uint64_t dev;
	uint32_t i;

	if (!dladdr(runtime, &info) || !info.dli_fname)
		return NULL;
	/* The executable's own name may not be a path. */
	path = info.dli_fname[0] == '/' ? info.dli_fname : "/proc/self/exe";
	if (stat(path, &st) != 0)
		return NULL;
	dev = (uint64_t)major(st.st_dev) << 20 | minor(st.st_dev);
	for (i = 0; i < RING_PY_IMAGES; i++)
		if (__atomic_load_n(&images[i].layout.minor, __ATOMIC_ACQUIRE) == minor &&
		    images[i].dev == dev && images[i].ino == (uint64_t)st.st_ino)
			return &images[i].layout;
	return NULL;
}

static int copy_checked(void *dst, uint64_t src, size_t len);
static int mapping_of(uint64_t addr, uint64_t *lo, uint64_t *hi);

/* Whether the walk can read a frame's fields in the window it reads at
 * once (memtrail checks each layout it gives: this is its second line). */
static int py_layout_fits(const struct ring_py_layout *l)
{
	const uint16_t win = l->off.frame_win, span = l->off.frame_span;
	const uint16_t words[] = {l->off.frame_code, l->off.frame_instr, l->off.frame_previous};
	unsigned int i;

	if (span > 72)
		return 0;
	for (i = 0; i < 3; i++)
		if (words[i] < win || words[i] - win + 8 > span)
			return 0;
	return l->off.frame_owner >= win && l->off.frame_owner - win < span &&
	       (l->off.frame_is_entry == MT_PY_NONE ||
		(l->off.frame_is_entry >= win && l->off.frame_is_entry - win < span));
}

/* Whether the dynamic symbol at fn is a function's (a fake interpreter's
 * PyGILState_GetThisThreadState may be data, which the walk would call). */
static int py_is_function(void *fn)
{
	const ElfW(Sym) *sym = NULL;
	Dl_info info;

	if (!fn || !dladdr1(fn, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym ||
	    info.dli_saddr != fn)
		return 0;
	return ELF64_ST_TYPE(sym->st_info) == STT_FUNC ||
	       ELF64_ST_TYPE(sym->st_info) == STT_GNU_IFUNC;
}

/* Whether this Python process walks its Python frames itself: memtrail
 * gave the layout of its version, or of its interpreter's image. */
static int py_setup(const char *control)
{
	const struct ring_py_layout *layouts =
		(const struct ring_py_layout *)(control + RING_CLAIMS_END), *found = NULL;
	const uint32_t *at = dlsym(RTLD_DEFAULT, "Py_Version");
	void *runtime = dlsym(RTLD_DEFAULT, "_PyRuntime");
	uint32_t minor, i, version;

	py_this_state = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
	/* A symbol of any image may point anywhere: read checked, and only a
	 * function called. */
	if (!at || !runtime || !py_is_function((void *)py_this_state) ||
	    copy_checked(&version, (uint64_t)(uintptr_t)at, sizeof(version)) || version >> 24 != 3)
		return 0;
	minor = (version >> 16) & 0xff;
	for (i = 0; i < RING_PY_LAYOUTS && minor; i++)
		if (layouts[i].minor == minor)
			found = &layouts[i];
	if (!found && minor)
		found = py_image_layout(control, runtime, minor);
	if (!found || !py_layout_fits(found))
		return 0;
	py_layout = *found;
	dl_iterate_phdr(find_py_text, runtime);
	if (!py_hi)
		return 0;
	py_on = 1;
	return 1;
}

/*
 * Reads of the interpreter's memory (issue 40). The walk follows pointers
 * the program's memory holds, which a corrupted frame chain or a fake
 * interpreter can set to anything: no read may fault, as none of BPF's
 * (bpf_probe_read_user) does. A read is made in place only inside a range
 * known to be mapped:
 *   - the thread state's bytes the walk reads, checked by a read that
 *     cannot fault (process_vm_readv on this process) when
 *     PyGILState_GetThisThreadState first returns it, and trusted while it
 *     returns it;
 *   - the thread's datastack chunk (where its newest frames are: in 3.11+
 *     the frames of functions are pushed there), checked whole when the
 *     thread state first names it, and trusted while it names it with the
 *     same size (the interpreter frees neither while it names them, and
 *     would itself fault on them);
 *   - the thread's stack from the walk's own stack pointer up to the end of
 *     the mapping (/proc/self/maps) that held it at the thread's first walk
 *     (3.11's and 3.12's _PyCFrame, 3.12+'s entry frames);
 * and anything else (frames of generators, in older chunks; code objects,
 * their strings and tables, read for a new stack's code records) by
 * process_vm_readv, about 1 us a read (the headers of a new stack's code
 * objects: one read for 32): a read that fails ends the walk, or leaves
 * the record out. Per thread, no allocation, async-signal-safe (the
 * thread's first walk reads /proc/self/maps once).
 */
struct py_thread {
	uint64_t ts, ts_end;	     /* the thread state, [ts, ts_end) */
	uint64_t chunk, chunk_end;   /* its datastack chunk, [chunk, chunk_end) */
	uint64_t stack_lo, stack_hi; /* the thread's stack mapping; hi 1: not found */
	/* The last walk's Python words (in ring_stack's frame, which calls
	 * py_code_record after it), until its code records are written. */
	const uint64_t *words;
	int nwords;
};
static __thread struct py_thread py_self __attribute__((tls_model("initial-exec")));
/* A datastack chunk larger is read checked, frame by frame (CPython's are
 * 16 KiB unless a frame needs more). */
#define PY_CHUNK_MAX (1U << 20)
/* What a range's check reads into, never looked at (threads may write it
 * at once): 16 pages, one system call for each 64 KiB checked. */
static char py_scratch[4096] DATA;

/* Whether [lo, lo + len) is mapped readable now (len > 0). */
static int py_readable(uint64_t lo, uint64_t len)
{
	struct iovec local[16], remote;
	uint64_t n;
	int i;

	for (i = 0; i < 16; i++) {
		local[i].iov_base = py_scratch;
		local[i].iov_len = sizeof(py_scratch);
	}
	if (lo + len < lo)
		return 0;
	for (; len; lo += n, len -= n) {
		n = len < 16 * sizeof(py_scratch) ? len : 16 * sizeof(py_scratch);
		remote.iov_base = (void *)(uintptr_t)lo;
		remote.iov_len = n;
		if (syscall(SYS_process_vm_readv, getpid(), local,
			    (n + sizeof(py_scratch) - 1) / sizeof(py_scratch), &remote, 1UL,
			    0UL) != (long)n)
			return 0;
	}
	return 1;
}

/* Whether [at, at + len) lies in [lo, hi). */
static inline int py_within(uint64_t at, uint64_t len, uint64_t lo, uint64_t hi)
{
	return at >= lo && at <= hi && len <= hi - at;
}

/* Whether [addr, addr + len) lies in a range known mapped (sp: the walk's
 * stack pointer). */
static int py_known(uint64_t addr, uint64_t len, uint64_t sp)
{
	const struct py_thread *p = &py_self;

	return py_within(addr, len, p->chunk, p->chunk_end) ||
	       py_within(addr, len, p->ts, p->ts_end) ||
	       (sp >= p->stack_lo && py_within(addr, len, sp, p->stack_hi));
}

/* Copies len bytes of the interpreter's memory at addr into dst, in place
 * within a range known mapped, else by a read that cannot fault; 0 on
 * success. */
static int py_read(void *dst, uint64_t addr, size_t len, uint64_t sp)
{
	if (py_known(addr, len, sp)) {
		memcpy(dst, (const void *)(uintptr_t)addr, len);
		return 0;
	}
	return copy_checked(dst, addr, len);
}

/* The word at addr, 0 if it cannot be read. */
static inline uint64_t py_word(uint64_t addr, uint64_t sp)
{
	uint64_t w;

	return py_read(&w, addr, sizeof(w), sp) ? 0 : w;
}

/* Makes ts the thread's checked thread state (the bytes its walk reads);
 * 0 if they cannot be read. */
static int py_take_state(struct py_thread *p, uint64_t ts)
{
	const uint16_t fields[] = {py_layout.off.tstate_thread_id, py_layout.off.tstate_frame,
				   py_layout.off.tstate_datastack};
	uint64_t need = 0;
	unsigned int i;

	for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
		if (fields[i] != MT_PY_NONE && fields[i] + 8U > need)
			need = fields[i] + 8U;
	p->ts = p->ts_end = 0;
	p->chunk = p->chunk_end = 0;
	if (!py_readable(ts, need))
		return 0;
	p->ts = ts;
	p->ts_end = ts + need;
	return 1;
}

/* Follows the thread state's datastack chunk (struct _PyStackChunk:
 * previous, size, then frames): trusted once checked whole, while it is
 * the thread's chunk with the same size. */
static void py_take_chunk(struct py_thread *p, uint64_t sp)
{
	uint64_t chunk = 0, size;

	if (py_layout.off.tstate_datastack != MT_PY_NONE)
		chunk = py_word(p->ts + py_layout.off.tstate_datastack, sp);
	if (!chunk) {
		p->chunk = p->chunk_end = 0;
		return;
	}
	if (chunk == p->chunk) {
		size = *(const volatile uint64_t *)(uintptr_t)(chunk + 8);
		if (size == p->chunk_end - p->chunk)
			return;
	} else if (copy_checked(&size, chunk + 8, sizeof(size))) {
		p->chunk = p->chunk_end = 0;
		return;
	}
	p->chunk = p->chunk_end = 0;
	if (size >= 24 && size <= PY_CHUNK_MAX && py_readable(chunk, size)) {
		p->chunk = chunk;
		p->chunk_end = chunk + size;
	}
}

/* The thread's state if it is this thread's and readable, with its chunk
 * and stack known; 0 if none. */
static uint64_t py_thread_state(uint64_t sp)
{
	struct py_thread *p = &py_self;
	uint64_t ts = (uint64_t)(uintptr_t)py_this_state();

	if (!ts || (ts != p->ts && !py_take_state(p, ts)))
		return 0;
	if (py_word(ts + py_layout.off.tstate_thread_id, sp) != (uint64_t)pthread_self())
		return 0;
	py_take_chunk(p, sp);
	if (!p->stack_hi && !mapping_of(sp, &p->stack_lo, &p->stack_hi))
		p->stack_hi = 1; /* not found: its reads are checked */
	return ts;
}

/* Appends the thread's Python frames to ips (nr of them so far, at most
 * MT_MAX_STACK in all); returns the new count. Each frame's fields are read
 * at once (BPF's window: frame_span bytes at frame_win, at most 72). */
static int py_walk(uint64_t *ips, int nr)
{
	uint64_t sp = (uint64_t)(uintptr_t)__builtin_frame_address(0), ts, frame, code, instr,
		 start, off;
	const uint16_t win = py_layout.off.frame_win, span = py_layout.off.frame_span;
	uint8_t owner, entry, w[72];

	py_self.words = ips + nr;
	py_self.nwords = 0;
	ts = py_thread_state(sp);
	if (!ts || span > sizeof(w))
		return nr;
	frame = py_word(ts + py_layout.off.tstate_frame, sp);
	if (frame && py_layout.off.cframe_frame != MT_PY_NONE)
		frame = py_word(frame + py_layout.off.cframe_frame, sp);
	for (int i = 0; frame && i < MT_MAX_STACK && nr < MT_MAX_STACK; i++) {
		if (py_read(w, frame + win, span, sp))
			break;
		memcpy(&code, w + (uint16_t)(py_layout.off.frame_code - win), 8);
		memcpy(&instr, w + (uint16_t)(py_layout.off.frame_instr - win), 8);
		memcpy(&frame, w + (uint16_t)(py_layout.off.frame_previous - win), 8);
		owner = w[(uint16_t)(py_layout.off.frame_owner - win)];
		entry = py_layout.off.frame_is_entry != MT_PY_NONE &&
			w[(uint16_t)(py_layout.off.frame_is_entry - win)];
		if (owner == MT_PY_OWNED_BY_CSTACK) {
			ips[nr++] = MT_PY_FRAME;
			continue;
		}
		start = code + py_layout.off.code_adaptive;
		if (code && instr >= start) {
			off = (instr - start) / 2;
			if (off > MT_PY_OFF_MAX)
				off = MT_PY_OFF_MAX;
			ips[nr++] = MT_PY_FRAME | off << MT_PY_OFF_SHIFT | (code & MT_PY_CODE_MASK);
		}
		if (entry && nr < MT_MAX_STACK)
			ips[nr++] = MT_PY_FRAME;
	}
	py_self.nwords = (int)(ips + nr - py_self.words);
	return nr;
}

/* A compact str object's characters into dst (at most MT_PY_NAME bytes);
 * returns the bytes copied (0 if it cannot be read). */
static uint32_t py_copy_str(uint64_t obj, uint8_t *dst, uint32_t *state, uint64_t sp)
{
	uint64_t head[5], len, at;
	uint32_t st, kind;

	/* ob_refcnt, ob_type, length, hash, then the state word. */
	if (!obj || py_read(head, obj, sizeof(head), sp))
		return 0;
	len = head[2];
	memcpy(&st, &head[4], sizeof(st));
	*state = st;
	kind = (st >> 2) & 7;
	if (!((st >> 5) & 1))
		return 0; /* not compact: no characters in the object */
	if ((st >> 6) & 1) {
		at = obj + py_layout.off.str_ascii_data;
	} else {
		at = obj + py_layout.off.str_compact_data;
		len *= kind;
	}
	if (len > MT_PY_NAME)
		len = MT_PY_NAME;
	return py_read(dst, at, len, sp) ? 0 : (uint32_t)len;
}

/* What a code record takes from a code object's header. */
struct py_head {
	uint64_t name, file, table;
	int32_t first;
	int32_t ok;
};

/* Code objects whose headers are read at once, and the bytes read of each
 * at most (from its first field the record takes past its last: 72 in
 * 3.11 and 3.12; a layout with more is read field by field). */
#define PY_HEADS 32
#define PY_HEAD_SPAN 128

/* The header fields of the code objects codes[0..n) (n <= PY_HEADS): in
 * place in a range known mapped, else by one process_vm_readv for all
 * the others (one more past each that cannot be read); 0 if the layout's
 * span is too wide for that. */
static int py_read_heads(const uint64_t *codes, int n, struct py_head *heads, uint64_t sp)
{
	const uint16_t f[4] = {py_layout.off.code_qualname, py_layout.off.code_filename,
			       py_layout.off.code_linetable, py_layout.off.code_firstlineno};
	uint16_t lo = f[0], hi = 0;
	struct iovec local[PY_HEADS], remote[PY_HEADS];
	uint8_t bytes[PY_HEADS * PY_HEAD_SPAN];
	int i, at = 0, m = 0, idx[PY_HEADS];
	long got;

	for (i = 0; i < 4; i++) {
		lo = f[i] < lo ? f[i] : lo;
		hi = f[i] + 8 > hi ? f[i] + 8 : hi;
	}
	if (hi - lo > PY_HEAD_SPAN)
		return 0;
	for (i = 0; i < n; i++) {
		heads[i].ok = py_known(codes[i] + lo, hi - lo, sp);
		if (heads[i].ok) {
			memcpy(bytes + i * PY_HEAD_SPAN, (const void *)(uintptr_t)(codes[i] + lo),
			       hi - lo);
			continue;
		}
		idx[m] = i;
		local[m].iov_base = bytes + i * PY_HEAD_SPAN;
		local[m].iov_len = remote[m].iov_len = hi - lo;
		remote[m++].iov_base = (void *)(uintptr_t)(codes[i] + lo);
	}
	/* A read stops at the first header it cannot read: the next goes on
	 * past it. */
	while (at < m) {
		got = syscall(SYS_process_vm_readv, getpid(), local + at, (unsigned long)(m - at),
			      remote + at, (unsigned long)(m - at), 0UL);
		for (; got >= (long)(hi - lo) && at < m; got -= hi - lo)
			heads[idx[at++]].ok = 1;
		at++;
	}
	for (i = 0; i < n; i++) {
		const uint8_t *h = bytes + i * PY_HEAD_SPAN;

		if (!heads[i].ok)
			continue;
		memcpy(&heads[i].name, h + (f[0] - lo), 8);
		memcpy(&heads[i].file, h + (f[1] - lo), 8);
		memcpy(&heads[i].table, h + (f[2] - lo), 8);
		memcpy(&heads[i].first, h + (f[3] - lo), 4);
	}
	return 1;
}

/* The header fields of the code object at code, read field by field. */
static void py_read_head(uint64_t code, struct py_head *head, uint64_t sp)
{
	head->name = py_word(code + py_layout.off.code_qualname, sp);
	head->file = py_word(code + py_layout.off.code_filename, sp);
	head->table = py_word(code + py_layout.off.code_linetable, sp);
	head->ok = !py_read(&head->first, code + py_layout.off.code_firstlineno,
			    sizeof(head->first), sp);
}

/* Writes the record of the code object at code (a frame of the thread
 * runs it; head: its header's fields) unless this ring carried it. */
static void py_write_code(struct mt_ring *r, struct mt_thread *t, uint64_t code,
			  const struct py_head *h, uint64_t sp)
{
	/* As BPF's py_codes: another object at the address has other
	 * strings. Bit 62, never bit 63: not a stack's id in the table. */
	uint64_t key = (mix(mix((uint64_t)(uint32_t)ring_pid, code),
			    h->name ^ h->file << 1 ^ h->table << 2) &
			~(3ULL << 62)) |
		       1ULL << 62;
	uint32_t len = 24 + sizeof(struct py_code_record), n;
	struct py_code_record *c;
	uint64_t *rec;

	if (ring_knows(r, key))
		return;
	rec = ring_reserve(r, len);
	if (!rec)
		return;
	ring_header(rec, 0, t, MT_SHIM_PY_CODE);
	c = (struct py_code_record *)(rec + 3);
	c->zero = 0;
	c->code = code;
	c->pid = (uint32_t)ring_pid;
	c->first = h->first;
	c->name_state = c->file_state = 0;
	c->name_len = py_copy_str(h->name, c->name, &c->name_state, sp);
	c->file_len = py_copy_str(h->file, c->file, &c->file_state, sp);
	c->_pad = 0;
	c->table_len = 0;
	/* ob_size's low half: a table is far below 4 GiB. */
	if (h->table && !py_read(&c->table_len, h->table + 16, sizeof(c->table_len), sp)) {
		n = c->table_len < MT_PY_TABLE ? c->table_len : MT_PY_TABLE;
		if (py_read(c->table, h->table + 32, n, sp))
			c->table_len = 0;
	}
	ring_commit(rec, len);
}

/* Writes the records of the code objects the thread's last walk found
 * that this ring did not carry yet, at ring_stack's first call for them
 * (later calls for the same walk do nothing): their headers read
 * PY_HEADS at a time, each code object's strings and table only for a
 * record. */
static void py_code_record(struct mt_ring *r, struct mt_thread *t, uint64_t code)
{
	uint64_t sp = (uint64_t)(uintptr_t)__builtin_frame_address(0), codes[PY_HEADS];
	struct py_head heads[PY_HEADS];
	int k = 0, n, i, batched;

	(void)code;
	while (k < py_self.nwords) {
		/* Each code object once (a walk repeats importlib's, a
		 * recursion's): the read's cost is by header. */
		for (n = 0; k < py_self.nwords && n < PY_HEADS; k++) {
			uint64_t c = py_self.words[k] & MT_PY_CODE_MASK;

			for (i = 0; i < n && codes[i] != c; i++)
				;
			if (c && i == n)
				codes[n++] = c;
		}
		batched = py_read_heads(codes, n, heads, sp);
		for (i = 0; i < n; i++) {
			if (!batched)
				py_read_head(codes[i], &heads[i], sp);
			if (heads[i].ok)
				py_write_code(r, t, codes[i], &heads[i], sp);
		}
	}
	py_self.nwords = 0;
}

/*
 * The stack cache (issue 22): a walk libunwind would repeat, not walked
 * again.
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

/* Blocks of threads that ended, for the next threads (never unmapped: an
 * unmap memtrail would see as the program's). */
static struct sc_block *sc_free;
/* Where libunwind's TLS block holds its trace cache's pointer: -1 not
 * looked for yet, -3 being looked for, -2 not found (no stack cache in
 * the process). */
static long sc_unw_at = -1;

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
extern void *__tls_get_addr(sc_tls_index *);

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

/* Copies len bytes at a possibly unmapped address; 0 on success. */
static int copy_checked(void *dst, uint64_t src, size_t len)
{
	struct iovec local = {dst, len}, remote = {(void *)(uintptr_t)src, len};

	return syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL) ==
			       (long)len
		       ? 0
		       : -1;
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

/* The mapping that holds addr (the thread's stack), from /proc/self/maps
 * (read with no allocation); 0 if not found. */
static int mapping_of(uint64_t addr, uint64_t *lo, uint64_t *hi)
{
	char text[4096];
	size_t have = 0;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC), found = 0;

	if (fd < 0)
		return 0;
	while (!found) {
		ssize_t got = read(fd, text + have, sizeof(text) - 1 - have);
		char *line = text, *nl;

		if (got <= 0)
			break;
		have += (size_t)got;
		while (!found && (nl = memchr(line, '\n', have - (size_t)(line - text))) != NULL) {
			char *at = line;
			uint64_t a = 0, b = 0;

			for (; *at != '-' && at < nl; at++)
				a = a << 4 | (uint64_t)(*at <= '9' ? *at - '0' : *at - 'a' + 10);
			for (at++; *at != ' ' && at < nl; at++)
				b = b << 4 | (uint64_t)(*at <= '9' ? *at - '0' : *at - 'a' + 10);
			if (a <= addr && addr < b) {
				*lo = a;
				*hi = b;
				found = 1;
			}
			line = nl + 1;
		}
		have -= (size_t)(line - text);
		memmove(text, line, have);
		if (have == sizeof(text) - 1)
			have = 0; /* a line longer than the buffer: not a stack's */
	}
	close(fd);
	return found;
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
static void sc_discover(void *const *buf, int n)
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
static void sc_setup(struct mt_thread *t, uint64_t sp)
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
static void sc_release(struct mt_thread *t)
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

/*
 * Keeps the walk that gave buf (n frames of at most max), from sp and bp,
 * if it replays exactly over libunwind's trace cache: its frames after
 * the shim's (ips, nr, end) and id.
 */
static void sc_keep(struct mt_thread *t, uint64_t sp, uint64_t bp, void *const *buf, int n,
		    int max, uint64_t id, const uint64_t *ips, int nr, int end)
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

/* Writes a new stack's record (after its code objects'). */
static uint64_t ring_stack_record(struct mt_ring *r, struct mt_thread *t, uint64_t id,
				  const uint64_t *ips, int nr, int end)
{
	uint32_t len = 40 + 8 * (uint32_t)nr;
	uint64_t *rec = ring_reserve(r, len);

	if (!rec)
		return 0;
	/* Stamped 0: its place among the records does not matter, only that
	 * it comes before the event that names it, in this ring. */
	ring_header(rec, 0, t, MT_SHIM_STACK);
	rec[3] = id;
	rec[4] = (uint64_t)(uint32_t)ring_pid | (uint64_t)(uint32_t)nr << 32 |
		 (uint64_t)(uint32_t)end << 48;
	memcpy(rec + 5, ips, 8 * (size_t)nr);
	ring_commit(rec, len);
	return id;
}

/* The caller's stack: its id, written to the ring first if new there. */
static __attribute__((noinline)) uint64_t ring_stack(struct mt_ring *r, struct mt_thread *t)
{
	void *buf[MT_MAX_STACK + RING_SKIP_MAX + 1];
	uint64_t ips[MT_MAX_STACK], h = (uint64_t)(uint32_t)ring_pid, id, sp, bp;
	int n, i = 0, nr, k, exact = 0, end = MT_END_COMPLETE, py, from_sp;
	int max = (int)ring_depth + RING_SKIP_MAX + 1;
	const struct sc_entry *kept;

	/* Where unw_backtrace's walk goes on from after its own frame. */
	__asm__ volatile("mov %%rsp, %0\n\tmov %%rbp, %1" : "=r"(sp), "=r"(bp));
	if (!py_on && (kept = sc_find(t, sp, bp)) != NULL) {
		if (ring_knows(r, kept->id))
			return kept->id;
		return ring_stack_record(r, t, kept->id, kept->ips, (int)kept->nr, (int)kept->end);
	}
	/* Quiet: libunwind's own allocations (its thread-local storage's)
	 * are not the program's. */
	t->in_alloc = MT_SHIM_OWN;
	t->in_ring = 2;
	n = unw_bt(buf, max);
	/* The walk went on from sp and bp after unw_backtrace's own frame if
	 * its first frame is this call's return address, still at sp - 8. */
	from_sp = n > 0 && *(const volatile uint64_t *)(uintptr_t)(sp - 8) ==
				   (uint64_t)(uintptr_t)buf[0];
	if (__builtin_expect(sc_unw_at == -1, 0))
		sc_discover(buf, n);
	if (!py_on && from_sp)
		sc_setup(t, sp);
	t->in_ring = 1;
	t->in_alloc = 0;
	while (i < n && (uint64_t)(uintptr_t)buf[i] >= shim_lo &&
	       (uint64_t)(uintptr_t)buf[i] < shim_hi)
		i++;
	while (i < n && new_wrapper((uint64_t)(uintptr_t)buf[i]))
		i++;
	nr = n - i;
	if (nr > (int)ring_depth) {
		nr = (int)ring_depth;
		end = MT_END_DEPTH;
	}
	for (k = 0; k < nr; k++) {
		uint64_t ip = (uint64_t)(uintptr_t)buf[i + k];
		/* As memtrail's walk records them: the trampoline and the
		 * interrupted instruction plus one (no call precedes them). */
		int sig = is_sigreturn(ip);

		ips[k] = ip + (uint64_t)(exact || sig);
		exact = sig;
		h = mix(h, ips[k]);
	}
	/* BPF's walk looks for Python frames once it went through the
	 * interpreter's code, the frame it stopped at for the depth too. */
	py = nr;
	for (k = 0; py_on && k < nr + (end == MT_END_DEPTH); k++) {
		uint64_t ip = (uint64_t)(uintptr_t)buf[i + k];

		if (ip >= py_lo && ip < py_hi) {
			nr = py_walk(ips, nr);
			for (k = py; k < nr; k++)
				h = mix(h, ips[k]);
			break;
		}
	}
	id = mix(h, (uint64_t)nr << 16 | (uint64_t)end) | 1ULL << 63;
	if (!py_on && from_sp)
		sc_keep(t, sp, bp, buf, n, max, id, ips, nr, end);
	if (ring_knows(r, id))
		return id;
	/* A new stack: the records of its code objects first (the ring is
	 * read in order). */
	for (k = py; k < nr; k++)
		if ((ips[k] & ~MT_PY_FRAME) != 0)
			py_code_record(r, t, ips[k] & MT_PY_CODE_MASK);
	return ring_stack_record(r, t, id, ips, nr, end);
}

/* An allocation's record, its stack first. */
static __attribute__((noinline)) void ring_alloc(struct mt_ring *r, struct mt_thread *t,
						 uint16_t kind, void *p, uint64_t size, void *old)
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

/* A free's (or a realloc's begin's) record. */
static void ring_release(struct mt_ring *r, struct mt_thread *t, uint16_t kind, void *p)
{
	t->in_ring = 1;
	barrier();
	ring_event(r, t, kind, (uint64_t)(uintptr_t)p, 0, 0, 0);
	barrier();
	t->in_ring = 0;
}

/*
 * The record of a call: `ring_call` on the thread's ring (r_, rt_), else
 * the hook with (kind, a, b, c). None for the shim's own calls. In the
 * interposer's body (HOOK_CARRY's rbp).
 */
#define RECORD(ring_call, kind, a, b, c)                                                 \
	do {                                                                             \
		struct mt_thread *rt_ = &mt_self;                                        \
		struct mt_ring *r_;                                                      \
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
static unsigned int take(struct mt_thread *t)
{
	unsigned int n = t->count;

	t->count = 0;
	barrier();
	return n < MT_BATCH ? n : MT_BATCH;
}

/* Really frees the n blocks taken, which the hook just recorded; with busy
 * held. The flag is restored, not cleared: the caller may be a signal
 * handler's call inside a real call. */
static void drain(struct mt_thread *t, unsigned int n)
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
static void flush_self(void)
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

EXPORT void free(void *p)
{
	struct mt_thread *t = &mt_self;
	struct mt_ring *r;
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
		if (n + 1 == MT_BATCH)
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

/*
 * exec replaces the image: this thread's buffered frees first (the other
 * threads', which exec ends, memtrail reads at their exit). Not in a
 * vfork child, whose buffer is its parent's. glibc's exec functions call
 * its own execve, not this one: each is here.
 */
static void before_exec(void)
{
	struct mt_thread *t = &mt_self;

	if (t->count && t->owner == gettid())
		flush_self();
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	before_exec();
	return next_execve(path, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
	before_exec();
	return next_execve(path, argv, environ);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	before_exec();
	return next_execvpe(file, argv, envp);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	before_exec();
	return next_execvpe(file, argv, environ);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	before_exec();
	return next_fexecve(fd, argv, envp);
}

/* glibc 2.34 and later. */
EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[],
		    int flags)
{
	if (!next_execveat) {
		errno = ENOSYS;
		return -1;
	}
	before_exec();
	return next_execveat(dirfd, path, argv, envp, flags);
}

/* The list forms: their arguments gathered into an argv (and execle's
 * environment after its NULL), as glibc does. */
#define GATHER_ARGS(first, argv)                                                         \
	size_t n_ = 1;                                                                   \
	va_list ap_;                                                                     \
	va_start(ap_, first);                                                            \
	while (va_arg(ap_, char *))                                                      \
		n_++;                                                                    \
	va_end(ap_);                                                                     \
	char *argv[n_ + 1];                                                              \
	argv[0] = (char *)(first);                                                       \
	va_start(ap_, first);                                                            \
	for (size_t i_ = 1; i_ <= n_; i_++)                                              \
		argv[i_] = va_arg(ap_, char *)

EXPORT int execl(const char *path, const char *arg, ...)
{
	GATHER_ARGS(arg, argv);
	va_end(ap_);
	before_exec();
	return next_execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	GATHER_ARGS(arg, argv);
	va_end(ap_);
	before_exec();
	return next_execvpe(file, argv, environ);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	char *const *envp;

	GATHER_ARGS(arg, argv);
	envp = va_arg(ap_, char *const *);
	va_end(ap_);
	before_exec();
	return next_execve(path, argv, envp);
}

/* A thread's end: its key's destructor flushes its buffer, and its frees
 * after that (other destructors', glibc's own) are made at once. */
static void thread_end(void *arg)
{
	struct mt_ring *r = mt_self.ring;

	(void)arg;
	flush_self();
	sc_release(&mt_self);
	mt_self.state = MT_DIRECT;
	/* Its later calls take the hook; the ring is free for another. */
	mt_self.ring = RING_NONE;
	if (r && r != RING_NONE)
		__atomic_store_n(r->claim, 0, __ATOMIC_RELEASE);
}

/* In the child of a fork: its thread is a new one. */
static void after_fork_child(void)
{
	if (mt_self.state == MT_BUFFERING)
		mt_self.owner = gettid();
	/* Its parent's thread's ring is not its own: ring_here makes the
	 * child's rings (its ring_proc page is zero). */
	/* Another thread of the parent may have held the arena's lock: it is
	 * not in the child. */
	__atomic_store_n(&quiet_lock, 0, __ATOMIC_RELEASE);
}

/* The constructor's hello: its work, once the hello is said. */
__attribute__((constructor(101))) static void hello(void)
{
	resolve();
	say_hello();
	__atomic_store_n(&mt_key_made, pthread_key_create(&mt_key, thread_end) == 0,
			 __ATOMIC_RELEASE);
	/* Before a fork, in the parent: the child starts with nothing
	 * buffered. */
	pthread_atfork(flush_self, NULL, after_fork_child);
	/* After the hello: memtrail then knows where the flag is. */
	mt_self.in_ring = 2;
	mt_in_alloc = MT_SHIM_OWN;
	ring_proc_page();
	mt_in_alloc = 0;
	mt_self.in_ring = 0;
	ring_here(&mt_self);
}

/* The process's end (exit, or main's return): after the program's atexit
 * handlers and destructors (ld.so runs this object's, preloaded first,
 * after theirs). The thread's later frees are made at once. */
__attribute__((destructor(101))) static void goodbye(void)
{
	thread_end(NULL);
}
