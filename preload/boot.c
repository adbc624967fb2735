/*
 * The shim's start: the hook's code, the lookup of the real allocator
 * functions (dlsym RTLD_NEXT), the hello that tells memtrail where the
 * thread state is, and the two allocators the shim serves itself from.
 *
 * Owns: next_* (set once by resolve, next_malloc last: its being set says
 * every other one is), the bootstrap buffer and the quiet arena.
 *
 * The bootstrap buffer serves dlsym's own allocations while resolve runs
 * (none on glibc 2.36 unless a lookup fails): never recorded, never freed,
 * never reused. The quiet arena serves the shim's own allocations while it
 * works for itself (libunwind's thread-local storage, what dlopen and
 * dladdr allocate for the shim): not the program's, and whoever frees one
 * later (glibc frees a thread's TLS blocks at its end, often in another
 * thread) finds it here and is not recorded either. Both are in .data, not
 * .bss (shim.h: DATA).
 *
 * Context: resolve runs on the first allocator call (the constructor's or
 * an earlier library's); the arena's functions from any thread, a signal
 * handler's included (a spin lock held over no call).
 */
#include "hook.h"

/*
 * The hook: `nopl 0(%rax,%rax,1)` (0f 1f 44 00 00), the instruction the
 * kernel optimizes a uprobe on, then ret. memtrail_hook is the exported
 * name memtrail probes; the shim calls the hidden alias mt_hook_local
 * directly (no PLT).
 */
__asm__(".text\n"
	".p2align 4\n"
	".globl memtrail_hook\n"
	".type memtrail_hook,@function\n"
	".globl mt_hook_local\n"
	".hidden mt_hook_local\n"
	"memtrail_hook:\n"
	"mt_hook_local:\n"
	".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"ret\n"
	".size memtrail_hook, .-memtrail_hook\n");

void *(*next_malloc)(size_t);
void (*next_free)(void *);
void *(*next_calloc)(size_t, size_t);
void *(*next_realloc)(void *, size_t);
int (*next_posix_memalign)(void **, size_t, size_t);
void *(*next_aligned_alloc)(size_t, size_t);
void *(*next_memalign)(size_t, size_t);
void *(*next_valloc)(size_t);
void *(*next_pvalloc)(size_t);
size_t (*next_usable_size)(void *);
int (*next_execve)(const char *, char *const[], char *const[]);
int (*next_execvpe)(const char *, char *const[], char *const[]);
int (*next_fexecve)(int, char *const[], char *const[]);
int (*next_execveat)(int, const char *, char *const[], char *const[], int);
int aligned_alloc_kind = MT_ALIGNED_ALLOC;

char boot[4096] __attribute__((aligned(64), section(".data")));
static size_t boot_used;
static int resolving;

void *boot_alloc(size_t size)
{
	size_t at = (boot_used + 15) & ~(size_t)15;

	if (size > sizeof(boot) || at + size > sizeof(boot))
		return NULL;
	boot_used = at + size;
	return boot + at;
}

/*
 * The quiet arena: size classes of 32 bytes to 64 KiB, each block after a
 * 16-byte header naming its class; what does not fit goes to the real
 * allocator, unrecorded.
 */
#define QUIET_CLASSES 12
#define QUIET_HEADER 16
char quiet_arena[256 * 1024] __attribute__((aligned(64), section(".data")));
static size_t quiet_used;
static void *quiet_free_list[QUIET_CLASSES];
int quiet_lock;

void *quiet_alloc(size_t size)
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

size_t quiet_size(const void *p)
{
	return (size_t)32 << *(const unsigned int *)((const char *)p - QUIET_HEADER);
}

void quiet_release(void *p)
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
void say_hello(void)
{
	uint64_t tp;

	if (__atomic_exchange_n(&hello_said, 1, __ATOMIC_RELAXED))
		return;
	__asm__ volatile("mov %%fs:0, %0" : "=r"(tp));
	HOOK(MT_SHIM_HELLO, (uint64_t)&mt_self - tp, 0, 0);
}

void resolve(void)
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
