/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Empty probes for the uprobe-floor benchmark (perf/): attached at the same
 * sites as memtrail's allocator probes, they measure what the kernel's
 * uprobe machinery costs on its own, so memtrail's overhead can be reported
 * as a ratio to it.
 */
#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("uprobe.multi")
int floor_enter(struct pt_regs *ctx)
{
	return 0;
}

SEC("uretprobe.multi")
int floor_return(struct pt_regs *ctx)
{
	return 0;
}

/* memtrail's alloc_session without its work: an allocating call's entry
 * asks for its return, a free's does not (the cookie's kind: MT_FREE is
 * 10, see bpf/memtrail.h). */
SEC("uprobe.session")
int floor_session(struct pt_regs *ctx)
{
	return (bpf_get_attach_cookie(ctx) & 0xffff) == 10;
}

/* Attached by the benchmark where memtrail attaches its syscall programs
 * (the raw syscall tracepoints): the cost of those tracepoints' machinery
 * without memtrail's work. */
SEC("tp_btf/sys_enter")
int floor_sys_enter(void *ctx)
{
	return 0;
}

SEC("tp_btf/sys_exit")
int floor_sys_exit(void *ctx)
{
	return 0;
}
