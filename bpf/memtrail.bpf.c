/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * memtrail's allocation probes.
 *
 * - Allocator uprobes: `alloc_session` (Linux 6.13+), else `alloc_enter`,
 *   on every allocating entry point (the attach cookie is the enum mt_kind)
 *   and on its return sites (enum mt_return_cookie: entry probes where it
 *   returns, no kernel return probe, issue 40), and on free (`free_enter`
 *   before 6.13). A function whose return sites cannot all be found takes a
 *   kernel return probe instead (MT_CK_KRET_BIT; `alloc_return` before
 *   6.13).
 *   Only the outermost allocator call of a thread makes a record: glibc calls
 *   its own public entry points (realloc(NULL, n) -> malloc, reallocarray ->
 *   realloc, memalign -> malloc), so the thread's state (a slot of
 *   `thread_slots`, else `inflight` task storage) carries the outermost
 *   call's arguments and entry stack pointer from entry to return.
 * - Syscall tracepoints for anonymous mmap, munmap, mremap and brk.
 * - Sched tracepoints keep `tracked` equal to the set of processes in the
 *   tree: a fork of a tracked process adds the child, the last thread's exit
 *   removes the process.
 *
 * Records go reserve -> fill -> submit, without a wakeup unless the ring's
 * poller sleeps (see `sleeping`): userspace busy-polls the ring. A failed reserve bumps a drop counter atomically; userspace fails
 * the capture on any drop. No scratch lives in per-CPU maps: a uprobe program
 * can be preempted and another one on the same CPU would reuse the slot.
 *
 * One object, built from one translation unit (a unity build): this file
 * includes its parts in order, each using only what the ones above it
 * define, so the verifier sees the program the single file made. Each part
 * opens with what it owns and the invariants a change there must keep:
 *
 *   maps.bpf.h     every map and global, limits, the skeleton's record types
 *   task.c         thread ids (PID namespaces), thread slots, call state
 *   pressure.c     backpressure: watermarks, hard marks, latch, own stops
 *   records.bpf.h  reserve -> fill -> submit of event records
 *   unwind.c       the native unwinder (unwind tables, frame pointers)
 *   python.c       Python frames (CPython 3.11+)
 *   stack.c        a call's stack id and the stack ring
 *   shim.c         the preload shim's hook and its buffered frees
 *   alloc.c        allocator probes, return sites, USDT region markers
 *   memory.c       mmap/munmap/mremap/brk/mprotect, images, RSS
 *   process.c      fork, exec, signals, exit, the safety net
 *
 * Only *.bpf.c files are objects (build.rs, scripts/bpf_stack.rs): the
 * parts are .c and .bpf.h files compiled through this one.
 */
#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "memtrail.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The parts, in order (see above). */
#include "maps.bpf.h"
#include "task.c"
#include "pressure.c"
#include "records.bpf.h"
#include "unwind.c"
#include "python.c"
#include "stack.c"
#include "shim.c"
#include "alloc.c"
#include "memory.c"
#include "process.c"
