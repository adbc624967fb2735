/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Record layouts shared by the BPF programs and userspace.
 *
 * Userspace never mirrors these by hand: each type has a dummy global instance
 * in memtrail.bpf.c, so libbpf-cargo emits it into the skeleton's `types`
 * module and src/ decodes records through those generated definitions.
 *
 * Every ring record starts with `struct mt_header`; `kind` selects the rest.
 */
#ifndef MEMTRAIL_H
#define MEMTRAIL_H

/* Record kinds. Allocator API kinds come first and match the probe cookies. */
enum mt_kind {
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
	/* Start of an outermost realloc of a non-NULL pointer: the old block
	 * leaves the caller's hands here, before another thread can reuse it. */
	MT_REALLOC_BEGIN = 11,
	MT_MMAP = 16,
	MT_MUNMAP = 17,
	MT_MREMAP = 18,
	MT_BRK = 19,
	MT_FORK = 32,
	MT_EXEC = 33,
	MT_EXIT = 34,
};

/*
 * Attach cookie of an allocating entry point: the record kind it makes and
 * where its arguments are, so one pair of programs serves every allocator
 * (glibc, jemalloc's mallocx family, mimalloc, tcmalloc...).
 *   bits  0-15  enum mt_kind
 *   bits 16-19  index of the size argument
 *   bits 20-23  index of the element count (size = count * size), or NONE
 *   bits 24-27  index of the old pointer (realloc-like) or of the out
 *               pointer (MT_CK_OUT_PTR), or NONE
 *   bits 28-31  enum mt_cookie_flags
 */
enum mt_cookie_layout {
	MT_CK_SIZE_SHIFT = 16,
	MT_CK_COUNT_SHIFT = 20,
	MT_CK_PTR_SHIFT = 24,
	MT_CK_FLAGS_SHIFT = 28,
	MT_CK_ARG_NONE = 0xf,
};

enum mt_cookie_flags {
	/* The result is written through the pointer argument; the call
	 * returns 0 on success (posix_memalign). */
	MT_CK_OUT_PTR = 1,
	/* Resizes in place and returns the new size (jemalloc's xallocx). */
	MT_CK_RESULT_IS_SIZE = 2,
};

/* Rings, as indices of the pollers' `sleeping` flags. */
enum mt_ring {
	MT_RING_EVENTS = 0,
	MT_RING_STACKS = 1,
	MT_RING_MAPPINGS = 2,
	MT_RING_ATTACH = 3,
	MT_RINGS = 4,
};

/* mt_header.flags */
enum mt_flags {
	/* A syscall made inside an allocator call on the same thread: the
	 * allocator's own backing memory, not a user allocation. */
	MT_F_IN_ALLOCATOR = 1,
};

/* Bounded copy of an exec'd file name. */
#define MT_PATH_MAX 256

/* Frames a stack record holds (the first is the allocator's return
 * address, read from the stack at entry). */
#define MT_MAX_STACK 128

/* Bounded copy of a mapped file's name (its last path component). */
#define MT_NAME_MAX 64

struct mt_header {
	/* bpf_ktime_get_ns() when the record was made; 0 on allocator events
	 * that skipped the clock (memtrail.bpf.c: event_clock), which take
	 * the latest reading before them in the ring. */
	__u64 ts_ns;
	__u32 pid;   /* tgid */
	__u32 tid;
	__u16 kind;  /* enum mt_kind */
	__u16 flags; /* enum mt_flags */
	__u32 _pad;
};

/*
 * Allocator calls, frees and memory syscalls.
 *   malloc & co: addr = result, size = bytes asked (calloc n*m, saturating)
 *   realloc:     addr = result, size = new size, old_addr = argument
 *   free:        addr = argument
 *   mmap:        addr = result, size = length
 *   munmap:      addr, size = arguments
 *   mremap:      addr = result, size = new length, old_addr/aux = the old
 *                address and length
 *   brk:         addr = new program break, size = requested break
 */
struct mt_alloc_event {
	struct mt_header hdr;
	__u64 addr;
	__u64 size;
	__u64 old_addr;
	/* mremap: old_size; allocator calls: the call stack's id, 0 if none.
	 * One field for the two keeps the record at 56 bytes, 64 in the ring:
	 * one cache line. */
	__u64 aux;
};

/*
 * A call stack, on the stack ring. Written once per distinct (process,
 * stack): the BPF program hashes a stack as it walks it, and only for a new
 * hash walks it again into a reserved record (discarded if another thread
 * wrote the same stack meanwhile).
 *   ips[0 .. nr): return addresses, innermost first.
 */
struct mt_stack_record {
	__u64 id;   /* hash of pid and frames; never 0 */
	__u32 pid;  /* tgid: frames are addresses of this process */
	__u16 nr;   /* end of the frames in ips */
	__u16 _pad;
	__u64 ips[MT_MAX_STACK];
};

/*
 * An executable file mapping of a tracked process, on the mappings ring:
 * enough to turn its addresses into file offsets after the process exited.
 */
/* Mappings ring records, and attach requests on the attach ring: an
 * executable image memtrail has not examined yet; its process is stopped
 * until userspace has attached probes to it. */
struct mt_mapping_record {
	__u64 ts_ns;
	__u32 pid;
	__u32 _pad;
	__u64 start;
	__u64 end;
	__u64 pgoff; /* file offset of start, in bytes */
	__u64 dev;
	__u64 ino;
	char name[MT_NAME_MAX];
};

/* fork: a new process (not a thread) in the tracked tree. */
struct mt_fork_event {
	struct mt_header hdr; /* pid = parent */
	__u32 child_pid;
	__u32 _pad;
};

struct mt_exec_event {
	struct mt_header hdr;
	char filename[MT_PATH_MAX];
};

/* exit: the last thread of a process exits. */
struct mt_exit_event {
	struct mt_header hdr;
	__s32 exit_code; /* wait status as the kernel keeps it */
	__u32 _pad;
};

#endif /* MEMTRAIL_H */
