/*
 * memtrail's preload shim (`memtrail run --preload`, issue 22).
 *
 * Interposes glibc's standard allocator API and hands each call to
 * memtrail through one hook, `memtrail_hook`: a function whose first
 * instruction is a 5-byte nop, so the kernel's optimized uprobe (Linux
 * 6.18, a `call` into a trampoline page that enters the kernel by a
 * syscall instead of an int3 trap) serves it. One kernel entry per
 * allocation and one per free, where the uprobe mode takes three a pair
 * (malloc's entry and its return, free's entry).
 *
 * What memtrail's hook program reads (bpf/memtrail.bpf.c, shim_hook):
 *   rdi  the record's kind (enum mt_kind), or MT_SHIM_HELLO
 *   rsi  the block (the argument of free, the result of an allocation)
 *   rdx  the size asked (calloc/reallocarray: the product, ~0 on overflow)
 *   rcx  the old block of a realloc
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
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
	/* The shim's constructor: rsi the in-allocator flag's offset from the
	 * thread pointer. */
	MT_SHIM_HELLO = 64,
};

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
 * the interposer's frame address in r9. Only from an interposer's own
 * body (always inlined): there rbp is its frame address.
 */
#define HOOK(kind, a, b, c)                                                              \
	do {                                                                             \
		register uint64_t r_di __asm__("rdi") = (uint64_t)(kind);               \
		register uint64_t r_si __asm__("rsi") = (uint64_t)(a);                  \
		register uint64_t r_dx __asm__("rdx") = (uint64_t)(b);                  \
		register uint64_t r_cx __asm__("rcx") = (uint64_t)(c);                  \
		__asm__ volatile("mov %%rbp, %%r9\n\t"                                  \
				 "mov (%%rbp), %%rbp\n\t"                               \
				 "call mt_hook_local\n\t"                               \
				 "mov %%r9, %%rbp"                                      \
				 : "+r"(r_di), "+r"(r_si), "+r"(r_dx), "+r"(r_cx)       \
				 :                                                      \
				 : "r9", "memory");                                     \
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
			HOOK(kind, p_, size, 0);                                         \
		return p_;                                                               \
	} while (0)

static void *(*next_malloc)(size_t);
static void (*next_free)(void *);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);
static void *(*next_memalign)(size_t, size_t);
static void *(*next_valloc)(size_t);
static void *(*next_pvalloc)(size_t);

/* Set while a real allocator call runs on this thread (read by memtrail
 * at memory syscalls). */
static __thread volatile int mt_in_alloc __attribute__((tls_model("initial-exec")));

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

EXPORT void free(void *p)
{
	if (!p || in_boot(p))
		return;
	if (!ready())
		return;
	HOOK(MT_FREE, p, 0, 0);
	mt_in_alloc = 1;
	next_free(p);
	mt_in_alloc = 0;
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
		HOOK(MT_CALLOC, p, product(n, m), 0);
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
		HOOK(MT_REALLOC_BEGIN, old, 0, 0);
	mt_in_alloc = 1;
	p = next_realloc(old, size);
	mt_in_alloc = 0;
	/* A failed realloc of a live block still completes its begin. */
	if (p || old)
		HOOK(MT_REALLOC, p, size, old);
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
		HOOK(MT_REALLOC_BEGIN, old, 0, 0);
	if (size == ~0ULL) {
		errno = ENOMEM;
		p = NULL;
	} else {
		mt_in_alloc = 1;
		p = next_realloc(old, size);
		mt_in_alloc = 0;
	}
	if (p || old)
		HOOK(MT_REALLOCARRAY, p, size, old);
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
		HOOK(MT_POSIX_MEMALIGN, *out, size, 0);
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

/* Tells memtrail where the in-allocator flag is: its offset from the
 * thread pointer is the same in every thread of the process. */
__attribute__((constructor(101))) static void hello(void)
{
	uint64_t tp;

	__asm__ volatile("mov %%fs:0, %0" : "=r"(tp));
	resolve();
	HOOK(MT_SHIM_HELLO, (uint64_t)&mt_in_alloc - tp, 0, 0);
}
