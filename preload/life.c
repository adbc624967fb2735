/*
 * The process's life around the interposers: exec (the thread's buffered
 * frees flushed first), fork (the child's thread is a new one, its rings
 * its own), a thread's end (its buffer flushed, its ring and stack cache
 * given back) and the process's: the constructor that starts the shim and
 * the destructor that ends it.
 *
 * Owns: the thread state (mt_self, initial-exec TLS: its offset from the
 * thread pointer is what the hello tells memtrail) and the key whose
 * destructor runs at a thread's end.
 *
 * Invariants: the hello is said before the shim's first real allocator
 * call (boot.c: resolve); the key exists before a thread buffers (else
 * its frees are made at once); nothing is buffered across a fork, an exec
 * of this thread or the process's end. A vfork child leaves its parent's
 * buffer alone (owner).
 *
 * Context: exec functions from any thread; thread_end from the key's
 * destructor; after_fork_child in the child, single-threaded.
 */
#include "ring.h"
#include "stack_cache.h"

__thread struct mt_thread mt_self __attribute__((tls_model("initial-exec")));
pthread_key_t mt_key;
int mt_key_made;

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
	struct shim_ring *r = mt_self.ring;

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
