/*
 * memtrail's preload shim (`memtrail run --preload`, issue 22).
 *
 * Interposes glibc's standard allocator API and hands each call to
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
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
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
		mt_in_alloc = 1;                                                         \
		p_ = (real_call);                                                        \
		mt_in_alloc = 0;                                                         \
		if (p_)                                                                  \
			HOOK_CARRY(kind, p_, size, 0);                                   \
		return p_;                                                               \
	} while (0)

#define barrier() __asm__ volatile("" ::: "memory")

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

/* For an allocator without malloc_usable_size: no block is large. */
static size_t no_usable_size(void *p)
{
	(void)p;
	return 0;
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

EXPORT void *malloc(size_t size)
{
	ALLOCATE(MT_MALLOC, size, next_malloc(size));
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
	unsigned int n;

	if (!p || in_boot(p))
		return;
	if (!ready())
		return;
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
	mt_in_alloc = 1;
	p = next_calloc(n, m);
	mt_in_alloc = 0;
	if (p)
		HOOK_CARRY(MT_CALLOC, p, product(n, m), 0);
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
	if (old)
		HOOK_CARRY(MT_REALLOC_BEGIN, old, 0, 0);
	mt_in_alloc = 1;
	p = next_realloc(old, size);
	mt_in_alloc = 0;
	/* A failed realloc of a live block still completes its begin. */
	if (p || old)
		HOOK_CARRY(MT_REALLOC, p, size, old);
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

	if (in_boot(old) || !ready()) {
		if (size == ~0ULL) {
			errno = ENOMEM;
			return NULL;
		}
		return realloc(old, size);
	}
	if (old)
		HOOK_CARRY(MT_REALLOC_BEGIN, old, 0, 0);
	if (size == ~0ULL) {
		errno = ENOMEM;
		p = NULL;
	} else {
		mt_in_alloc = 1;
		p = next_realloc(old, size);
		mt_in_alloc = 0;
	}
	if (p || old)
		HOOK_CARRY(MT_REALLOCARRAY, p, size, old);
	return p;
}

EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
	int err;

	if (!ready()) {
		*out = boot_alloc(size);
		return *out ? 0 : ENOMEM;
	}
	mt_in_alloc = 1;
	err = next_posix_memalign(out, align, size);
	mt_in_alloc = 0;
	if (err == 0 && *out)
		HOOK_CARRY(MT_POSIX_MEMALIGN, *out, size, 0);
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
	(void)arg;
	flush_self();
	mt_self.state = MT_DIRECT;
}

/* In the child of a fork: its thread is a new one. */
static void after_fork_child(void)
{
	if (mt_self.state == MT_BUFFERING)
		mt_self.owner = gettid();
}

/* Tells memtrail where the thread's state is: its offset from the thread
 * pointer is the same in every thread of the process. */
__attribute__((constructor(101))) static void hello(void)
{
	uint64_t tp;

	__asm__ volatile("mov %%fs:0, %0" : "=r"(tp));
	resolve();
	__atomic_store_n(&mt_key_made, pthread_key_create(&mt_key, thread_end) == 0,
			 __ATOMIC_RELEASE);
	/* Before a fork, in the parent: the child starts with nothing
	 * buffered. */
	pthread_atfork(flush_self, NULL, after_fork_child);
	HOOK(MT_SHIM_HELLO, (uint64_t)&mt_self - tp, 0, 0);
}

/* The process's end (exit, or main's return): after the program's atexit
 * handlers and destructors (ld.so runs this object's, preloaded first,
 * after theirs). The thread's later frees are made at once. */
__attribute__((destructor(101))) static void goodbye(void)
{
	thread_end(NULL);
}
