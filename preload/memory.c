/*
 * Reads of this process's own memory that cannot fault, and where its
 * mappings are: for the Python walker (python.c) and the stack cache
 * (stack_cache.c), which follow pointers the program's memory holds.
 *
 * Owns nothing. Invariants: copy_checked never faults, whatever the
 * address (process_vm_readv on this process: a bad address is an error,
 * not a signal); mapping_of reads /proc/self/maps with no allocation (a
 * buffer on the stack), a line longer than the buffer skipped.
 *
 * Context: any thread, async-signal-safe (system calls only).
 */
#include "shim.h"

/* Copies len bytes at a possibly unmapped address; 0 on success. */
int copy_checked(void *dst, uint64_t src, size_t len)
{
	struct iovec local = {dst, len}, remote = {(void *)(uintptr_t)src, len};

	return syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL) ==
			       (long)len
		       ? 0
		       : -1;
}

/* The mapping that holds addr (the thread's stack), from /proc/self/maps
 * (read with no allocation); 0 if not found. */
int mapping_of(uint64_t addr, uint64_t *lo, uint64_t *hi)
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
