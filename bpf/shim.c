/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * the preload shim's side in BPF: its flag in a thread's TLS (shim_flag:
 * calls the shim made itself are nested), the hook program (shim_hook,
 * and shim_hook_run for alloc_session), the batches of frees a hook
 * carries, and the frees a thread leaves buffered when it ends
 * (shim_thread_ends, shim_signal). The shim is preload/.
 *
 * Invariants a change here must keep:
 * - The hook's registers and the TLS offsets are the shim's ABI
 *   (MT_SHIM_*; preload/ writes them).
 * - What the shim's process writes is hostile input: a batch is at most
 *   MT_FREE_BATCH_MAX blocks, read with bpf_probe_read_user.
 * - The walk's frames are at the stack budget: the hook's helpers are
 *   subprograms off the walk's frame.
 */

/*
 * The preload shim's hook (`memtrail run --preload`, issue 22;
 * preload/, its calls in preload/hook.h): one program for every record the shim
 * hands over, one kernel entry each, on a 5-byte nop the kernel optimizes
 * (a syscall-entered trampoline instead of an int3 trap). Its registers:
 * rdi the kind (enum mt_kind, or MT_SHIM_HELLO), rsi the block, rdx the
 * size, rcx a realloc's old block, r9 the interposer's frame address (its
 * caller's return address at r9 + 8: where a probe at the allocator's
 * entry finds it at sp) and rbp the caller's frame pointer. So the walk
 * starts at the interposer's caller as the uprobe mode's does at the
 * allocator's entry, and never walks the shim's frames.
 *
 * The records are the uprobe mode's: a free's and a realloc's begin come
 * before the real call releases the block, an allocation after it
 * returned it (the shim calls the hook then); failed allocations make no
 * record, a realloc of a live block always completes its begin.
 *
 * Frees come batched: the shim buffers a thread's frees (up to
 * MT_FREE_BATCH_MAX, their real calls delayed) and the thread's next hook
 * carries them (r8 the buffer, r10 how many; r10 0: none), recorded as one
 * MT_FREE_BATCH before the hook's own record. MT_SHIM_FLUSH carries them
 * alone (a full buffer, a fork, an exec, the thread's or the process's
 * end). What a thread leaves buffered when it ends otherwise (_exit, a
 * fatal signal, another thread's exit_group) shim_thread_ends reads from
 * its TLS.
 *
 * MT_SHIM_HELLO and MT_SHIM_FLUSH (the hook's kinds past enum mt_kind),
 * MT_SHIM_COUNT_OFF and MT_SHIM_SLOTS_OFF (the shim's thread-local state,
 * struct mt_thread in preload/shim.h, at the hello's offset from the
 * thread pointer: the in-allocator flag, the count of buffered frees, the
 * buffer) are bpf/memtrail_shim.h's, which the shim includes too.
 */

/* The preload shim's flag in the current thread's TLS: 0 outside real
 * allocator calls, set inside one, MT_SHIM_OWN (bpf/memtrail_shim.h)
 * while the shim works for itself (its ring path's unwinder, issue 22). */
static __noinline __u32 shim_flag(void)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 *off = bpf_map_lookup_elem(&shim_procs, &tgid);
	__u32 flag = 0;

	if (!off || !*off)
		return 0;
	if (bpf_probe_read_user(&flag, sizeof(flag),
				(void *)(BPF_CORE_READ(bpf_get_current_task_btf(), thread.fsbase) +
					 *off - 1)))
		return 0;
	return flag;
}

/* Whether the current thread is inside a real allocator call made by the
 * preload shim. */
static __always_inline bool in_shim_allocator(void)
{
	return shim_flag() != 0;
}

/* Whether a probe with attach cookie `cookie` fired inside a real allocator
 * call the preload shim made (the shim recorded that call: nested). Looked
 * at only in processes that map the shim (MT_CK_SHIM_BIT). */
static __always_inline bool in_shim_call(__u64 cookie)
{
	return (cookie >> MT_CK_SHIM_BIT) & 1 && in_shim_allocator();
}

/* One MT_FREE_BATCH record of `slots` slots: n (1 to slots) blocks read
 * from the shim's buffer at buf, the rest 0. */
static __always_inline void emit_free_batch_in(__u64 ts, __u64 pid_tgid, __u64 buf, __u32 n,
					       const __u32 slots)
{
	void *ring = events_ring();
	struct mt_free_batch *e = reserve(ring, offsetof(struct mt_free_batch, addrs) + slots * 8);
	__u64 size = (__u64)n * 8;
	__u32 i;

	if (!e)
		return;
	barrier_var(size);
	if (size > slots * 8 || bpf_probe_read_user(e->addrs, size, (void *)buf)) {
		bpf_ringbuf_discard(e, BPF_RB_NO_WAKEUP);
		__sync_fetch_and_add(&drops_events, 1);
		return;
	}
	for (i = 1; i < slots; i++)
		if (i >= n)
			e->addrs[i] = 0;
	fill_header_at(&e->hdr, ts, pid_tgid, MT_FREE_BATCH, 0);
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	check_pressure(ring, MT_RING_EVENTS, watermark_events, &hwm_events);
}

/* The n frees buffered at buf (none if n is 0), as one record: a small
 * one for a few (one cache line), else one with every slot. */
static __always_inline void emit_free_batch(__u64 ts, __u64 pid_tgid, __u64 buf, __u32 n)
{
	if (n == 0 || n > MT_FREE_BATCH_MAX)
		return;
	if (n <= MT_FREE_BATCH_SMALL)
		emit_free_batch_in(ts, pid_tgid, buf, n, MT_FREE_BATCH_SMALL);
	else
		emit_free_batch_in(ts, pid_tgid, buf, n, MT_FREE_BATCH_MAX);
}

/* The frees a hook carries (r8, r10). Not inlined: its frame stays off
 * the walk's. */
static __noinline void shim_frees(struct pt_regs *ctx, struct inflight *cur)
{
	emit_free_batch(event_clock(cur), current_ids(), ctx->r8, ctx->r10);
}

/*
 * The current thread is about to end without its shim's destructors
 * (exit or exit_group, a fatal signal: _exit, a crash, another thread's
 * exit_group or exec, a kill): the frees its shim still holds, read from
 * its TLS. Before the thread enters do_exit, so before it drops
 * signal->live: before the last thread's sched_exit writes the process's
 * exit.
 */
static __noinline void shim_thread_ends(void)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tgid = bpf_get_current_pid_tgid() >> 32, n = 0;
	__u64 *off = bpf_map_lookup_elem(&shim_procs, &tgid), base;

	if (!off || !*off)
		return;
	/* A vfork child (posix_spawn's, system's) runs on its parent's
	 * thread's stack and TLS until it execs or exits: its parent's. */
	if (BPF_CORE_READ(task, vfork_done))
		return;
	base = BPF_CORE_READ(task, thread.fsbase) + *off - 1;
	if (bpf_probe_read_user(&n, sizeof(n), (void *)(base + MT_SHIM_COUNT_OFF)))
		return;
	emit_free_batch(clock_before(), current_ids(), base + MT_SHIM_SLOTS_OFF, n);
}

/* Whether signal sig, delivered with action ka, ends the process. */
static __always_inline bool signal_ends(int sig, struct k_sigaction *ka)
{
	struct task_struct *task = bpf_get_current_task_btf();

	if (sig == SIGKILL)
		return true; /* a kill, or another thread's exit_group or exec */
	if (BPF_CORE_READ(ka, sa.sa_handler) != NULL ||
	    (BPF_CORE_READ(task, signal, flags) & SIGNAL_UNKILLABLE))
		return false;
	switch (sig) {
	case SIGCHLD: case SIGCONT: case SIGURG: case SIGWINCH: /* ignored */
	case SIGSTOP: case SIGTSTP: case SIGTTIN: case SIGTTOU: /* stop */
		return false;
	}
	return true;
}

/* A signal being delivered to a thread of the tree: one that ends the
 * process takes the thread's buffered frees first (the preload shim's). */
SEC("tp_btf/signal_deliver")
int BPF_PROG(shim_signal, int sig, struct kernel_siginfo *info, struct k_sigaction *ka)
{
	if (signal_ends(sig, ka))
		shim_thread_ends();
	return 0;
}

/* The record of a call the shim hands over (its stack in cur->stack_id
 * for an allocation). Not inlined: its frame stays off the walk's. */
static __noinline void shim_emit(struct pt_regs *ctx, struct inflight *cur)
{
	__u64 kind = PT_REGS_PARM1(ctx), ts = event_clock(cur);

	if (kind == MT_FREE || kind == MT_REALLOC_BEGIN)
		emit_event(ts, current_ids(), kind, 0, PT_REGS_PARM2(ctx), 0, 0, 0);
	else
		emit_event(ts, current_ids(), kind, 0, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
			   PT_REGS_PARM4(ctx), cur->stack_id);
}

/* An allocation the shim hands over: its stack (walked from r9 + 8), then
 * its record. The walk's frames are at the stack budget: nothing but ctx
 * and cur lives across it (the ids and arguments are read again). */
static __always_inline void shim_alloc(struct pt_regs *ctx, struct inflight *cur, __u32 tgid)
{
	__u64 sp = ctx->r9 + 8;

	/* Called by a probed operator new (--unwind fp): its stack, whose
	 * first frame is the user's new expression, as alloc_entry takes it. */
	if (cur->new_sp && sp < cur->new_sp && cur->new_sp - sp < NEW_FRAME_MAX)
		cur->stack_id = cur->new_stack_id;
	else
		cur->stack_id = capture_stack(ctx, cur, tgid, sp);
	cur->new_sp = 0;
	shim_emit(ctx, cur);
}

/* A process of the tree names its ring file (MT_SHIM_RINGS): an event
 * of that kind, its descriptor as the block. Not inlined: off the walk's
 * frame. */
static __noinline void shim_rings(struct pt_regs *ctx)
{
	if (is_tracked(bpf_get_current_pid_tgid() >> 32))
		emit_event(clock_before(), current_ids(), MT_SHIM_RINGS, 0, PT_REGS_PARM2(ctx), 0, 0,
			   0);
}

/* The shim's hook: shim_hook's, and alloc_session's where it serves it. */
static __always_inline int shim_hook_run(struct pt_regs *ctx)
{
	__u64 pid_tgid = 0, kind = PT_REGS_PARM1(ctx);
	struct inflight *cur;

	if (kind == MT_SHIM_HELLO) {
		__u32 tgid = bpf_get_current_pid_tgid() >> 32;
		__u64 off = PT_REGS_PARM2(ctx) + 1;

		if (is_tracked(tgid))
			bpf_map_update_elem(&shim_procs, &tgid, &off, BPF_ANY);
		return 0;
	}
	if (kind == MT_SHIM_RINGS) {
		shim_rings(ctx);
		return 0;
	}
	cur = current_call_ids(&pid_tgid);
	if (!cur)
		return 0;
	/* Before the hook's own record: the frees came first. */
	if (ctx->r10)
		shim_frees(ctx, cur);
	if (kind == MT_FREE || kind == MT_REALLOC_BEGIN)
		shim_emit(ctx, cur);
	else if (kind >= MT_MALLOC && kind <= MT_PVALLOC)
		shim_alloc(ctx, cur, pid_tgid >> 32);
	return 0;
}

/* The shim's hook where uprobe sessions are not (Linux before 6.13): with
 * sessions, alloc_session serves it (cookie MT_CK_SHIM_HOOK, no return). */
SEC("uprobe.multi")
int shim_hook(struct pt_regs *ctx)
{
	return shim_hook_run(ctx);
}
