/*
 * memtrail's preload shim (`memtrail run --preload`, issue 22): what every
 * file of it shares. One shared object, built by build.rs from every .c
 * file here and embedded in memtrail (src/attach/shim.rs).
 *
 * Interposes glibc's standard allocator API. Where it can, a thread
 * writes each call's record itself into a ring of memtrail's shared
 * memory (the ring path, ring.h: no kernel entry). Elsewhere (the hook
 * path, hook.h) it hands each call to memtrail through one hook,
 * `memtrail_hook`: a function whose first instruction is a 5-byte nop, so
 * the kernel's optimized uprobe serves it. One kernel entry per
 * allocation, and frees ride along (batched, interpose.c), where the
 * uprobe mode takes three a pair (malloc's entry and its return, free's
 * entry).
 *
 * Order, for exact counts: a free's and a realloc's old block are handed
 * over before the real call releases them (no other thread can get the
 * block back before its release is recorded), an allocation after the
 * real call returned it. Allocations the shim makes for dlsym while it
 * looks the real functions up come from a static buffer, are not
 * reported, and their frees are ignored (boot.c).
 *
 * While a real allocator call runs, a thread-local flag is set: memtrail
 * reads it at memory syscalls (the allocator's own arenas and trims), at
 * the offset from the thread pointer the constructor's hello gives.
 *
 * The files, each opening with what it owns:
 *   boot.c         the hook's code, the real functions' lookup, the hello,
 *                  the bootstrap buffer and the shim's quiet arena
 *   interpose.c    the allocator interposers and the buffer of frees
 *   life.c         exec, fork, a thread's and the process's end
 *   ring_file.c    the ring file's handshake with memtrail and its set-up
 *   ring.c         the ring writer: a thread's ring, reserve, commit
 *   stack.c        the ring path's stack walk (libunwind) and its record
 *   stack_cache.c  the walks kept and given again without a walk
 *   python.c       the thread's Python frames and code records
 *   memory.c       reads of this process's memory that cannot fault
 * Record layouts, kinds and the constants memtrail's BPF program reads
 * come from bpf/memtrail.h (and bpf/memtrail_shim.h, which it includes),
 * never from a copy here.
 *
 * The shim runs inside the tracked process, whose memory, symbols and
 * allocator may be anything: every value read from them is checked before
 * it is used. No shim function may fault on what the program controls.
 *
 * Built with clang -O2 -fPIC -shared -fno-omit-frame-pointer
 * -mno-red-zone -fvisibility=hidden (the hook call changes rbp around a
 * call the compiler does not see). Everything here is hidden: the
 * object's dynamic symbols are the interposers (EXPORT) and the hook.
 */
#ifndef MEMTRAIL_PRELOAD_SHIM_H
#define MEMTRAIL_PRELOAD_SHIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
/* Every system header any file of the shim needs, before the visibility
 * pragma below (their functions are libc's, not hidden ones). */
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
#include <linux/types.h>

#include "memtrail.h"

/* Every declaration from here on is the object's own (not exported). */
#pragma GCC visibility push(hidden)

#define EXPORT __attribute__((visibility("default")))
/* In .data, as everything large here: a .bss past the file's last page
 * would be an anonymous mapping ld.so makes, one the uprobe mode's process
 * does not have. */
#define DATA __attribute__((section(".data")))
#define barrier() __asm__ volatile("" ::: "memory")

/* Blocks this large (malloc_usable_size) are freed at once: glibc's
 * default mmap threshold, a mapping of their own. */
#define MT_LARGE (128 * 1024)

/* A thread's buffer: not started, buffering (its key's destructor set),
 * or every free made at once (the thread or the process is ending, or the
 * key could not be made). */
enum { MT_NEW = 0, MT_BUFFERING = 1, MT_DIRECT = 2 };

struct shim_ring;
struct sc_block;

/*
 * A thread's state. memtrail reads the first three fields, at the hello's
 * offset from the thread pointer (MT_SHIM_COUNT_OFF, MT_SHIM_SLOTS_OFF in
 * bpf/memtrail_shim.h, checked below): keep them where they are.
 */
struct mt_thread {
	/* Set while a real allocator call runs on this thread (read by
	 * memtrail at memory syscalls). */
	volatile int in_alloc;
	/* Frees in slots, not yet recorded nor made. */
	volatile unsigned int count;
	void *volatile slots[MT_FREE_BATCH_MAX];
	/* Set while the thread updates the buffer (interpose.c). */
	volatile int busy;
	int state;
	/* The thread that buffers here (gettid): a vfork child runs on its
	 * parent's thread's TLS, and leaves its buffer alone. */
	pid_t owner;
	/* The ring path (ring.h): the thread's ring, 0 if it has none yet;
	 * RING_NONE if none could be had (the hook path, retried now and
	 * then); set while the shim writes to it (a signal handler's call
	 * then takes the hook path, and the shim's own calls are not
	 * recorded). */
	struct shim_ring *ring;
	unsigned int ring_retry;
	int in_ring;
	pid_t tid;
	/* The process (ring_proc->pid) whose ring `ring` is. */
	pid_t ring_gen;
	/* The thread's stack cache (stack_cache.h), made at its SC_AFTER-th
	 * walk (NULL: none); where libunwind keeps the pointer to the
	 * thread's trace cache; the thread's stack's mapping; the next entry
	 * to replace, the walks counted toward the cache. */
	struct sc_block *sc;
	void *const *sc_unw;
	uint64_t sc_lo, sc_hi;
	uint32_t sc_next, sc_walks;
};
_Static_assert(offsetof(struct mt_thread, in_alloc) == 0, "BPF reads the flag first");
_Static_assert(offsetof(struct mt_thread, count) == MT_SHIM_COUNT_OFF, "MT_SHIM_COUNT_OFF");
_Static_assert(offsetof(struct mt_thread, slots) == MT_SHIM_SLOTS_OFF, "MT_SHIM_SLOTS_OFF");
_Static_assert(sizeof(((struct mt_thread *)0)->slots) == 8 * MT_FREE_BATCH_MAX,
	       "BPF reads MT_FREE_BATCH_MAX slots");

/* The thread's state (life.c). */
extern __thread struct mt_thread mt_self __attribute__((tls_model("initial-exec")));
#define mt_in_alloc (mt_self.in_alloc)

/* A real allocator call, with the in-allocator flag set around it (its
 * value kept if set: a call inside one, or the shim's own, MT_SHIM_OWN). */
#define REAL(call)                                                                       \
	({                                                                               \
		int was_ = mt_in_alloc;                                                  \
		__typeof__(call) r_;                                                     \
		mt_in_alloc = was_ ? was_ : 1;                                           \
		r_ = (call);                                                             \
		mt_in_alloc = was_;                                                      \
		r_;                                                                      \
	})

/* ---- boot.c: the real functions, the hello, the bootstrap buffer ---- */

extern void *(*next_malloc)(size_t);
extern void (*next_free)(void *);
extern void *(*next_calloc)(size_t, size_t);
extern void *(*next_realloc)(void *, size_t);
extern int (*next_posix_memalign)(void **, size_t, size_t);
extern void *(*next_aligned_alloc)(size_t, size_t);
extern void *(*next_memalign)(size_t, size_t);
extern void *(*next_valloc)(size_t);
extern void *(*next_pvalloc)(size_t);
extern size_t (*next_usable_size)(void *);
extern int (*next_execve)(const char *, char *const[], char *const[]);
extern int (*next_execvpe)(const char *, char *const[], char *const[]);
extern int (*next_fexecve)(int, char *const[], char *const[]);
extern int (*next_execveat)(int, const char *, char *const[], char *const[], int);
/* MT_MEMALIGN where glibc's aligned_alloc is its memalign, else
 * MT_ALIGNED_ALLOC. */
extern int aligned_alloc_kind;

void resolve(void);
void say_hello(void);

/* Whether the real functions are there; false only inside dlsym's own
 * calls during resolve (served from the bootstrap buffer). */
static inline int ready(void)
{
	if (__builtin_expect(__atomic_load_n(&next_malloc, __ATOMIC_ACQUIRE) != NULL, 1))
		return 1;
	resolve();
	return next_malloc != NULL;
}

/* The bootstrap buffer (dlsym's allocations while resolve runs). */
extern char boot[4096];
static inline int in_boot(const void *p)
{
	return (const char *)p >= boot && (const char *)p < boot + sizeof(boot);
}
void *boot_alloc(size_t size);

/* The quiet arena: the shim's own allocations (boot.c). */
extern char quiet_arena[256 * 1024];
/* Held while the arena's free lists or the stack cache's free blocks
 * change (a spin lock: never held across a call). */
extern int quiet_lock;
static inline int in_quiet(const void *p)
{
	return (const char *)p >= quiet_arena && (const char *)p < quiet_arena + sizeof(quiet_arena);
}
void *quiet_alloc(size_t size);
size_t quiet_size(const void *p);
void quiet_release(void *p);

/* n * m, ~0 if it overflows. */
static inline uint64_t product(size_t n, size_t m)
{
	size_t size;

	if (__builtin_mul_overflow(n, m, &size))
		return ~0ULL;
	return size;
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mix(uint64_t h, uint64_t v)
{
	h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
	return h ^ h >> 29;
}

/* ---- interpose.c: the buffer of frees ---- */

unsigned int take(struct mt_thread *t);
void drain(struct mt_thread *t, unsigned int n);
void flush_self(void);

/* ---- life.c: a thread's end ---- */

/* Its destructor flushes a thread's buffer at the thread's end; set once
 * the constructor made it. */
extern pthread_key_t mt_key;
extern int mt_key_made;

/* ---- memory.c: reads that cannot fault ---- */

int copy_checked(void *dst, uint64_t src, size_t len);
int mapping_of(uint64_t addr, uint64_t *lo, uint64_t *hi);

#endif /* MEMTRAIL_PRELOAD_SHIM_H */
