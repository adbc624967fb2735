/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * process life: forks (sched_fork: a child joins the tree and, with
 * per-process probes, is held until its probes exist), execs (sched_exec:
 * the root joins, a new image's state), stops and resumes by others
 * (signal_generate, foreign_stops), exits (sched_exit, process_exit), and
 * the safety net when memtrail or its guardian exits (protector_exit).
 *
 * Invariants a change here must keep:
 * - `tracked` is exactly the set of processes of the tree: a fork of a
 *   tracked process adds the child, its last thread's exit removes it.
 * - tree_threads counts the tree's live threads (the hard marks depend on
 *   it): added at fork, taken back last at exit.
 * - A stop memtrail did not make is not memtrail's to undo (foreign_stops).
 */

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = task_ids(parent) >> 32, ctgid = task_ids(child) >> 32;
	struct mt_fork_event *e;
	bool stopped;
	void *ring;

	if (!is_tracked(ptgid))
		return 0;
	track_task(child);
	if (__sync_fetch_and_add(&tree_threads, 1) + 1 > tree_threads_peak)
		tree_threads_peak = tree_threads;
	if (ptgid == ctgid) {
		fork_check(child, ctgid); /* a thread */
		return 0;
	}
	if (bpf_map_update_elem(&tracked, &ctgid, &ptgid, BPF_ANY)) {
		__sync_fetch_and_add(&drops_tracking, 1);
		return 0;
	}
	/* A child of a process with the preload shim has it too. */
	{
		__u64 *shim = bpf_map_lookup_elem(&shim_procs, &ptgid);

		if (shim)
			bpf_map_update_elem(&shim_procs, &ctgid, shim, BPF_ANY);
	}
	/* After the child is tracked: the coordinator finds it in the map. */
	stopped = fork_check(child, ctgid);
	ring = events_ring();
	e = reserve(ring, sizeof(*e));
	if (e) {
		fill_header(&e->hdr, current_ids(), MT_FORK, 0);
		e->hdr.pid = ptgid;
		e->child_pid = ctgid;
		e->_pad = 0;
		bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
		check_pressure(ring, MT_RING_EVENTS, watermark_events, &hwm_events);
	}
	/* The child has not run yet: it stops before its first instruction
	 * and stays stopped until its probes exist. (One SIGSTOP serves both
	 * holds: a second send from this program could find the CPU's
	 * deferred-signal work still busy.) */
	if (per_process && request(ctgid, MT_REQ_FORK, ptgid) && bpf_ksym_exists(bpf_send_signal_task)) {
		__u8 one = 1;

		bpf_map_update_elem(&held_for_probes, &ctgid, &one, BPF_ANY);
		if (!stopped && may_stop())
			stop_task(child);
		check_pressure(&attach_requests, MT_RING_ATTACH, watermark_attach, &hwm_attach);
	}
	return 0;
}

/* Whether stop signal sig, being generated for task, is memtrail's own:
 * sent by memtrail itself, or by its BPF programs (SIGSTOP only: to the
 * current process, with the kernel's own siginfo, or to another task by
 * bpf_send_signal_task, whose siginfo says SI_KERNEL and no process). */
static __always_inline bool own_stop(int sig, struct kernel_siginfo *info,
				     struct task_struct *task)
{
	__u32 sender = current_ids() >> 32;

	if (sender == memtrail_tgid)
		return true;
	if (sig != SIGSTOP || !info)
		return false;
	if ((void *)info == SEND_SIG_PRIV)
		return sender == (__u32)(task_ids(task) >> 32);
	return BPF_CORE_READ(info, si_code) == SI_KERNEL;
}

/* Whether stop signal sig stops task: SIGSTOP always; the others only
 * where the process leaves them at their default action. */
static __always_inline bool stops_task(int sig, struct task_struct *task)
{
	struct sighand_struct *sighand;
	void *handler = (void *)1;
	__u64 off;

	if (sig == SIGSTOP)
		return true;
	sighand = BPF_CORE_READ(task, sighand);
	if (!sighand)
		return false;
	off = bpf_core_field_offset(struct sighand_struct, action) +
	      (__u64)(sig - 1) * bpf_core_type_size(struct k_sigaction) +
	      bpf_core_field_offset(struct k_sigaction, sa) +
	      bpf_core_field_offset(struct sigaction, sa_handler);
	bpf_probe_read_kernel(&handler, sizeof(handler), (void *)sighand + off);
	return handler == NULL; /* SIG_DFL */
}

/*
 * Stops and resumes of the tree by others. A stop signal someone else
 * sends marks the process in foreign_stops; a SIGCONT from anyone but
 * memtrail clears it. With per-process probes, a SIGCONT from another
 * process than memtrail to one held for its probes (a parent that saw the
 * hold as its child stopping, and resumed it: a job-control shell) lets it
 * run unprobed, and is counted.
 */
SEC("tp_btf/signal_generate")
int BPF_PROG(signal_generate, int sig, struct kernel_siginfo *info, struct task_struct *task,
	     int group, int result)
{
	__u32 tgid;
	__u8 one = 1;

	if (sig != SIGCONT && sig != SIGSTOP && sig != SIGTSTP && sig != SIGTTIN &&
	    sig != SIGTTOU)
		return 0;
	tgid = task_ids(task) >> 32;
	if (!is_tracked(tgid))
		return 0;
	if (sig == SIGCONT) {
		if ((__u32)(current_ids() >> 32) == memtrail_tgid)
			return 0;
		bpf_map_delete_elem(&foreign_stops, &tgid);
		if (per_process && bpf_map_lookup_elem(&held_for_probes, &tgid))
			__sync_fetch_and_add(&drops_resumed, 1);
		return 0;
	}
	if (result != TRACE_SIGNAL_DELIVERED && result != TRACE_SIGNAL_ALREADY_PENDING)
		return 0;
	if (own_stop(sig, info, task) || !stops_task(sig, task))
		return 0;
	bpf_map_update_elem(&foreign_stops, &tgid, &one, BPF_ANY);
	return 0;
}

/*
 * The dynamic loader's code mapping, which the kernel made at exec too:
 * the new image's first instruction is the loader's entry (a static
 * image's own, in its code: the record repeats the image's, which
 * userspace keeps once). Its record only: the loader is prepared up
 * front, no attach request. Else a process that exits before memtrail
 * reads its /proc maps leaves its loader's frames (its libraries'
 * constructors, dlopen) unnamed.
 */
static __noinline void exec_loader_mapping(struct task_struct *p, __u64 pid_tgid)
{
	struct vma_info info = {};
	__u64 ip;

	if (!p)
		return;
	ip = BPF_CORE_READ((struct pt_regs *)bpf_task_pt_regs(p), ip);
	if (bpf_find_vma(p, ip, read_vma, &info, 0) || !info.name)
		return;
	send_mapping(pid_tgid, &info);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(sched_exec, struct task_struct *p, int old_pid, struct linux_binprm *bprm)
{
	__u64 pid_tgid = current_ids();
	struct mt_exec_event *e;
	void *ring;

	if (!is_tracked(pid_tgid >> 32))
		return 0;
	/* A thread other than the leader that execs takes the leader's tid
	 * (de_thread); its old tid is no longer anyone's. */
	if ((__u32)old_pid != (__u32)p->pid) {
		release_slot(old_pid);
		/* Per-process probes name the old leader, gone now. */
		if (per_process && request(pid_tgid >> 32, MT_REQ_RELINK, 0)) {
			__u32 tgid = pid_tgid >> 32;
			__u8 one = 1;

			bpf_map_update_elem(&held_for_probes, &tgid, &one, BPF_ANY);
			if (may_stop())
				stop_current();
			check_pressure(&attach_requests, MT_RING_ATTACH, watermark_attach,
				       &hwm_attach);
		}
	}
	/* The root enters the tree here (the others at fork); every thread
	 * starts the new image with fresh state. */
	{
		__u32 tgid = pid_tgid >> 32;

		bpf_map_delete_elem(&code_maps, &tgid); /* a new image */
		bpf_map_delete_elem(&py_procs, &tgid);
		bpf_map_delete_elem(&shim_procs, &tgid);
	}
	track_task(bpf_get_current_task_btf());
	ring = events_ring();
	e = reserve(ring, sizeof(*e));
	if (!e)
		return 0;
	fill_header(&e->hdr, pid_tgid, MT_EXEC, 0);
	if (bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), bprm->filename) < 0)
		e->filename[0] = 0;
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	/* The kernel mapped the new image itself: no mmap to see it by. */
	emit_mapping(pid_tgid, BPF_CORE_READ(p, mm, start_code), -1, 0, 0);
	exec_loader_mapping(p, pid_tgid);
	return 0;
}

/* The safety net's pass over one tracked process (see foreign_stops). */
static long net_one(void *map, __u32 *pid, __u32 *ppid, bool *kill_frozen)
{
	struct task_struct *task;
	bool frozen;

	task = pidns_translate ? bpf_task_from_vpid(*pid) : bpf_task_from_pid(*pid);
	if (!task)
		return 0;
	frozen = BPF_CORE_READ(task, cgroups, dfl_cgrp, freezer.e_freeze);
	if (frozen && *kill_frozen)
		bpf_send_signal_task(task, SIGKILL, PIDTYPE_TGID, 0);
	else if (!bpf_map_lookup_elem(&foreign_stops, pid))
		bpf_send_signal_task(task, SIGCONT, PIDTYPE_TGID, 0);
	bpf_task_release(task);
	return 0;
}

/* memtrail's process (memtrail) or its guardian's is exiting: see the
 * safety net above. */
static __noinline void protector_exit(bool memtrail)
{
	bool kill_frozen;
	__s64 left;

	/* Each protector counts once. Every thread of an exiting process
	 * drops signal->live before it reaches this tracepoint, so two
	 * threads of a process killed at once (memtrail's, by SIGKILL) can
	 * both find it 0: counted twice, memtrail's exit alone would leave
	 * 0 protectors, and a tree frozen by a pause would be killed while
	 * the guardian was about to thaw it. */
	if (__sync_fetch_and_add(memtrail ? &memtrail_gone : &guardian_gone, 1) != 0)
		return;
	if (!bpf_ksym_exists(bpf_send_signal_task) || !bpf_ksym_exists(bpf_task_release) ||
	    !(pidns_translate ? bpf_ksym_exists(bpf_task_from_vpid) :
				bpf_ksym_exists(bpf_task_from_pid)))
		return;
	left = (__s64)__sync_fetch_and_add(&protectors, -1) - 1;
	/* The guardian leaving while memtrail lives: memtrail resumes what it
	 * holds itself. */
	if (!memtrail && left > 0)
		return;
	kill_frozen = left <= 0;
	bpf_for_each_map_elem(&tracked, net_one, &kill_frozen, 0);
}

/* The last thread of tracked process p is exiting. */
static __always_inline void process_exit(struct task_struct *p, __u64 pid_tgid)
{
	__u32 tgid = pid_tgid >> 32;
	struct mt_exit_event *e;
	struct rss_state *rss;
	void *ring;

	bpf_map_delete_elem(&tracked, &tgid);
	bpf_map_delete_elem(&code_maps, &tgid);
	bpf_map_delete_elem(&py_procs, &tgid);
	bpf_map_delete_elem(&shim_procs, &tgid);
	bpf_map_delete_elem(&foreign_stops, &tgid);
	if (per_process) {
		bpf_map_delete_elem(&held_for_probes, &tgid);
		request(tgid, MT_REQ_EXIT, 0);
	}
	rss = bpf_map_lookup_elem(&rss_states, &tgid);
	if (rss) {
		/* Its final peak, before the exit that ends the process. */
		emit_rss(pid_tgid, rss->last == ~0ULL ? 0 : rss->last, rss->peak, false);
		bpf_map_delete_elem(&rss_states, &tgid);
	}
	ring = events_ring();
	e = reserve(ring, sizeof(*e));
	if (!e)
		return;
	fill_header(&e->hdr, pid_tgid, MT_EXIT, 0);
	e->exit_code = BPF_CORE_READ(p, exit_code);
	e->_pad = 0;
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_exit, struct task_struct *p)
{
	__u64 pid_tgid = current_ids();
	__u32 tid = (__u32)pid_tgid, tgid = pid_tgid >> 32;

	/* A thread that dies inside a syscall (its task storage goes with it). */
	bpf_map_delete_elem(&sysargs, &tid);
	release_slot(p->pid);
	if ((tgid == memtrail_tgid || (guardian_tgid && tgid == guardian_tgid)) &&
	    BPF_CORE_READ(p, signal, live.counter) == 0)
		protector_exit(tgid == memtrail_tgid);
	if (!is_tracked(tgid))
		return 0;
	/* do_exit() drops signal->live before this tracepoint: zero means
	 * the last thread of the process is exiting. */
	if (BPF_CORE_READ(p, signal, live.counter) == 0)
		process_exit(p, pid_tgid);
	/* Last: the thread's records are all written, its room past the hard
	 * marks may go. */
	__sync_fetch_and_add(&tree_threads, -1);
	return 0;
}
