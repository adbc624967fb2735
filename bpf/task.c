/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * a thread's identity and state: ids as memtrail's PID namespace numbers
 * them (task_ids, current_ids), the thread's call state (its slot of
 * `thread_slots`, else its `inflight` task storage: task_call,
 * current_call), a thread joining the tree (track_task) or giving its slot
 * back (release_slot), membership of the tree (is_tracked,
 * thread_tracked), and the clock reading of an allocator event
 * (event_clock).
 *
 * Invariants a change here must keep:
 * - A thread of the tree has a slot or task storage from the moment it
 *   joins (sched_fork, or sched_exec for the root): their presence is the
 *   uprobes' test of membership, and an untracked thread returns at once.
 * - A slot is taken and given back by compare-and-swap on its tid only.
 * - Every pid and tid userspace sees is memtrail's namespace's; slots stay
 *   indexed by the kernel's global tid.
 * - mt_ids_in_ns stays a global function (verified once, not at each of
 *   its call sites).
 */

/* Namespaces nest at most this deep (MAX_PID_NS_LEVEL). */
#define MT_PIDNS_LEVELS 33

/* pid's number in memtrail's namespace; 0 when it has none there (a
 * process outside it, which cannot be in the tracked tree). */
static __always_inline __u32 pid_in_ns(struct pid *pid)
{
	unsigned int level = BPF_CORE_READ(pid, level);
	struct upid up;

	for (int i = 0; i < MT_PIDNS_LEVELS; i++) {
		if (i > level)
			break;
		if (bpf_core_read(&up, sizeof(up), &pid->numbers[i]))
			break;
		if (BPF_CORE_READ(up.ns, ns.inum) == pidns_ino)
			return up.nr;
	}
	return 0;
}

/* tgid << 32 | tid in memtrail's namespace, of the task whose leader's and
 * own struct pid are at leader and thread. A global function, verified
 * once on its own: as a static one it was verified at each of its ~30
 * call sites, its loop each time (77 % of alloc_session's verification,
 * ~90 ms of every start-up in a container). */
__noinline __u64 mt_ids_in_ns(__u64 leader, __u64 thread)
{
	return (__u64)pid_in_ns((struct pid *)leader) << 32 | pid_in_ns((struct pid *)thread);
}

/* task_ids in a namespace: the reads of task's pids in a frame of their
 * own, not the allocator probes' (they stay under the stack budget). */
static __noinline __u64 task_ids_in_ns(struct task_struct *task)
{
	return mt_ids_in_ns((__u64)BPF_CORE_READ(task, group_leader, thread_pid),
			    (__u64)BPF_CORE_READ(task, thread_pid));
}

/* tgid << 32 | tid of task, as memtrail's namespace numbers them. */
static __always_inline __u64 task_ids(struct task_struct *task)
{
	if (!pidns_translate)
		return (__u64)(__u32)task->tgid << 32 | (__u32)task->pid;
	return task_ids_in_ns(task);
}

/* current_ids(), as memtrail's namespace numbers them. */
static __always_inline __u64 current_ids(void)
{
	if (!pidns_translate)
		return bpf_get_current_pid_tgid();
	return task_ids(bpf_get_current_task_btf());
}

static __always_inline struct thread_slot *slot_of(__u32 tid)
{
	__u32 idx = tid & thread_slot_mask;

	return bpf_map_lookup_elem(&thread_slots, &idx);
}

/*
 * The state of task, if it belongs to the tracked tree: its slot, else its
 * task storage. A thread of the tree has one or the other from the moment
 * it joins (sched_fork for new threads and processes, sched_exec for the
 * root), so their presence is the uprobes' test of membership; untracked
 * threads (whose task has no BPF storage at all) return at once.
 */
static __always_inline struct inflight *task_call(struct task_struct *task, __u32 tid)
{
	struct thread_slot *slot = slot_of(tid);

	if (slot && slot->tid == tid)
		return &slot->call;
	return bpf_task_storage_get(&inflight, task, 0, 0);
}

static __always_inline struct inflight *current_call(void)
{
	struct task_struct *task = bpf_get_current_task_btf();

	return task_call(task, task->pid);
}

/* The current thread's state and its ids, as current_ids()
 * gives them (tgid << 32 | pid), read from the task without a helper call. */
static __always_inline struct inflight *current_call_ids(__u64 *pid_tgid)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tid = task->pid;
	struct inflight *cur = task_call(task, tid);

	if (cur)
		*pid_tgid = task_ids(task);
	return cur;
}

/* Gives back tid's slot if tid holds it. */
static __always_inline void release_slot(__u32 tid)
{
	struct thread_slot *slot = slot_of(tid);

	if (slot && tid)
		__sync_val_compare_and_swap(&slot->tid, tid, 0);
}

/*
 * The clock reading for an allocator event of the thread in cur, or 0 for
 * none: userspace then gives the event the latest reading before it in the
 * events ring (src/capture/sinks.rs), which orders every event exactly.
 *
 * bpf_ktime_get_ns() costs ~50 ns in a uprobe on this kind of machine, a
 * sixth of what tracking adds to a malloc/free pair, so a thread reads the
 * clock for its first MT_CLOCK_BURST events in each kernel tick and for
 * every MT_CLOCK_EVERY-th one after that. A thread making fewer than
 * MT_CLOCK_BURST events a tick (4 ms at HZ=250) has every event read; a
 * busier one has its events stamped at most MT_CLOCK_EVERY - 1 of its own
 * events late, and never more than a tick.
 */
#define MT_CLOCK_BURST 16
#define MT_CLOCK_EVERY 16

static __always_inline __u64 event_clock(struct inflight *cur)
{
	__u64 tick;
	__u32 n;

	/* Stamped after reserving (fill_header_at): every record is. */
	if (stamp_reserved)
		return 0;
	tick = bpf_jiffies64();

	if (tick != cur->clock_tick) {
		cur->clock_tick = tick;
		cur->clock_events = 0;
	}
	n = cur->clock_events++;
	if (n < MT_CLOCK_BURST || n % MT_CLOCK_EVERY == 0)
		return bpf_ktime_get_ns();
	return 0;
}

/* Gives a thread of the tree fresh state: its slot if free (or already its
 * own), else task storage. */
static __always_inline void track_task(struct task_struct *task)
{
	__u32 tid = task->pid;
	struct thread_slot *slot = slot_of(tid);
	struct inflight *call;
	__u64 holder;

	if (slot && tid) {
		holder = __sync_val_compare_and_swap(&slot->tid, 0, tid);
		if (holder == 0 || holder == tid) {
			/* The thread has not run yet (fork) or is in exec:
			 * nothing reads the slot meanwhile. */
			__builtin_memset(&slot->call, 0, sizeof(slot->call));
			return;
		}
	}
	call = bpf_task_storage_get(&inflight, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (call)
		__builtin_memset(call, 0, sizeof(*call));
	else
		__sync_fetch_and_add(&drops_tracking, 1);
}

static __always_inline bool is_tracked(__u32 tgid)
{
	return bpf_map_lookup_elem(&tracked, &tgid) != NULL;
}

/* Whether the current thread (pid_tgid) belongs to the tree. */
static __always_inline bool thread_tracked(__u64 pid_tgid)
{
	__u32 tid = (__u32)pid_tgid;

	if (!is_tracked(pid_tgid >> 32))
		return false;
	return !threads_excluded || !bpf_map_lookup_elem(&excluded_threads, &tid);
}
