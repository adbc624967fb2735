/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * backpressure and the programs' own stops: whether a program may stop a
 * process (may_stop, gone_since), the stops themselves, the latch of a
 * pressure episode and the coordinator's wakeup, each ring's watermark and
 * hard mark (check_pressure, after every submit), and a new thread's
 * room check at fork (fork_check). Its state is in maps.bpf.h; the
 * coordinator is src/pressure.
 *
 * Invariants a change here must keep:
 * - check_pressure runs after a submit, never while a reservation is held.
 * - Every stop a program sends is checked against memtrail_gone after the
 *   send (gone_since) and undone if memtrail began to exit meanwhile.
 * - The hard mark leaves MT_RECORDS_PER_THREAD records of room per live
 *   thread of the tree, so no ring overflows however late a pause lands.
 * - Without pressure_enabled the verifier drops all of it (a constant at
 *   load time).
 */

/*
 * Backpressure. With pressure_enabled, a producer that finds its ring
 * filled past the ring's watermark (after submitting, never while holding a
 * reservation) latches a pressure episode with a compare-and-swap on
 * pressure_latch, which then holds the clock reading of the latch (never
 * 0). Userspace, which reads and clears the latch through the mmap'd .bss,
 * pauses the tree, drains every ring and resumes it.
 *
 * Each ring's *hard mark* leaves room for what the tree's threads can
 * still write before each stops at its own next check: MT_RECORDS_PER_THREAD
 * records of ring_record[ring] bytes per live thread of the tree
 * (tree_threads). A producer past it stops its own process (SIGSTOP, which
 * its parent can see) and latches, wherever the watermark is: so no ring
 * overflows however many threads the tree has, and however late the pause
 * lands. A new thread or process counts from its fork on, and it could
 * write its records before any check of its own: sched_fork checks every
 * ring for it, and stops it before its first instruction if one has not
 * that room (fork_check). With pressure_freeze, userspace pauses the tree
 * with its cgroup's freezer, which the tree cannot observe, and the hard
 * mark is the only self-stop. Without pressure_freeze (no usable cgroup)
 * every producer past the watermark stops its own process too.
 */

static __always_inline void wake_coordinator(void)
{
	__u64 *rec = bpf_ringbuf_reserve(&pressure_wake, sizeof(*rec), 0);

	/* Full: earlier wakeups not consumed yet, which wake it all the same. */
	if (!rec)
		return;
	*rec = 1;
	bpf_ringbuf_submit(rec, BPF_RB_FORCE_WAKEUP);
}

/* Whether a program may stop a process of the tree now. */
static __always_inline bool may_stop(void)
{
	return !memtrail_gone;
}

/*
 * A stop sent after may_stop() said yes, undone if memtrail's process
 * began to exit meanwhile: a program preempted between the check and its
 * send (uprobe programs are preemptible) would otherwise stop a process
 * after protector_exit's SIGCONT pass, and nothing would resume it. The
 * second look is an atomic read-modify-write, a full barrier: if it sees 0,
 * the stop was pending before protector_exit raised the word, so its
 * SIGCONT pass (which comes after) resumes it; if it sees the word raised,
 * this program resumes what it stopped itself.
 */
static __always_inline bool gone_since(void)
{
	return __sync_fetch_and_add(&memtrail_gone, 0) != 0;
}

/* Stops the current thread (and so its process), see gone_since. */
static __always_inline void stop_current_thread(void)
{
	bpf_send_signal_thread(SIGSTOP);
	if (gone_since())
		bpf_send_signal_thread(SIGCONT);
}

/* Stops the current process, see gone_since. */
static __always_inline void stop_current(void)
{
	bpf_send_signal(SIGSTOP);
	if (gone_since())
		bpf_send_signal(SIGCONT);
}

/* Records process tgid in hard_stops (a subprogram: its map key and value
 * take no room in the producers' frames). */
static __noinline void record_hard_stop(__u32 tgid)
{
	__u32 one = 1;

	if (bpf_map_update_elem(&hard_stops, &tgid, &one, BPF_ANY))
		__sync_fetch_and_add(&hard_stops_unrecorded, 1);
}

/* Latches an episode unless one is latched; the first latch wakes the
 * coordinator. The latch holds the time it was set. */
static __always_inline void latch_episode(void)
{
	if (__sync_val_compare_and_swap(&pressure_latch, 0, bpf_ktime_get_ns() | 1) == 0)
		wake_coordinator();
}

/* Bytes ring idx has left past its hard mark with avail bytes in it:
 * negative once the tree's live threads may write more than it holds
 * (see Backpressure above). */
static __always_inline __s64 past_hard_mark_room(__u64 avail, enum mt_ring idx)
{
	__u32 i = idx & (MT_RINGS - 1);

	return (__s64)ring_capacity[i] - (__s64)avail -
	       (__s64)(tree_threads * MT_RECORDS_PER_THREAD * ring_record[i]);
}

static __always_inline bool past_hard_mark(__u64 avail, enum mt_ring idx)
{
	return past_hard_mark_room(avail, idx) < 0;
}

static __always_inline void check_pressure(void *ring, enum mt_ring idx, __u64 watermark,
					   __u64 *hwm)
{
	__u64 avail;
	__s64 left;
	bool hard;

	/* A constant at load time: without pressure the verifier drops the
	 * rest, and with it the query (~20 ns a record here). The pollers
	 * then keep the high-water marks from what they see. */
	if (!pressure_enabled || !may_stop())
		return;
	avail = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);
	if (avail > *hwm)
		*hwm = avail;
	left = past_hard_mark_room(avail, idx);
	hard = left < 0;
	/* With the freezer, latch too while the freeze room is all that is
	 * left before the hard mark, wherever the watermark is: a tree with
	 * more threads than CPUs reserves more than the room rule counted,
	 * and the freeze must still land before a producer stops itself. */
	if (avail <= watermark && !hard &&
	    !(pressure_freeze && left < (__s64)ring_freeze_room[idx & (MT_RINGS - 1)]))
		return;
	latch_episode();
	if (pressure_freeze) {
		if (!hard)
			return;
		record_hard_stop(current_ids() >> 32);
	}
	/* A producer past the hard mark (every one past the watermark
	 * without a cgroup) stops its own process, so a wide tree cannot
	 * overrun the room left before the coordinator has paused it all.
	 * The coordinator holds and resumes them: it waits until each held
	 * process has stopped (and so left this program) before it clears
	 * the latch, so no self-stop can land after its SIGCONT. To this
	 * thread: it dequeues the stop on its way back to user space and so
	 * cannot produce again before the whole group stops. */
	stop_current_thread();
}

/* Whether ring idx lacks the room a new thread needs: past its hard mark
 * (tree_threads counts the new thread already), or, without a cgroup,
 * past its watermark. */
static __always_inline bool ring_lacks_room(void *ring, enum mt_ring idx, __u64 watermark)
{
	__u64 avail;

	if (!ring)
		return false;
	avail = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);
	return past_hard_mark(avail, idx) || (!pressure_freeze && avail > watermark);
}

static long events_ring_lacks_room(__u64 i, bool *lacks)
{
	__u32 idx = i;
	void *ring = bpf_map_lookup_elem(&event_rings, &idx);

	if (ring_lacks_room(ring, MT_RING_EVENTS, watermark_events)) {
		*lacks = true;
		return 1;
	}
	return 0;
}

/* Whether any ring lacks the room a new thread of the tree needs. */
static __noinline bool tree_lacks_room(void)
{
	bool lacks = false;

	if (ring_lacks_room(&stacks, MT_RING_STACKS, watermark_stacks) ||
	    ring_lacks_room(&mappings, MT_RING_MAPPINGS, watermark_mappings) ||
	    ring_lacks_room(&attach_requests, MT_RING_ATTACH, watermark_attach))
		return true;
	bpf_loop(event_ring_count, events_ring_lacks_room, &lacks, 0);
	return lacks;
}

/* Tells signal_generate that a stop is memtrail's own (bpf_send_signal_task
 * puts it in the signal's si_value). */
#define MT_STOP_COOKIE 0x6d74726c73746f70ULL /* "mtrlstop" */

/* Stops task (a new one: the whole process), see gone_since. */
static __always_inline void stop_task(struct task_struct *task)
{
	bpf_send_signal_task(task, SIGSTOP, PIDTYPE_PID, MT_STOP_COOKIE);
	if (gone_since())
		bpf_send_signal_task(task, SIGCONT, PIDTYPE_PID, 0);
}

/* sched_fork's pressure check for a new thread or process of the tree
 * (tree_threads counts it already): its records would come before any
 * check of its own, so if a ring has not the room for them it stops
 * before its first instruction (the whole process, for a thread), is
 * recorded for the coordinator and latches an episode. Returns whether
 * it stopped it. Kernels without bpf_send_signal_task stop the parent
 * instead, which holds a new thread (it joins the group stop) but not a
 * new process. */
static __always_inline bool fork_check(struct task_struct *child, __u32 ctgid)
{
	if (!pressure_enabled || !may_stop() || !tree_lacks_room())
		return false;
	latch_episode();
	if (pressure_freeze)
		record_hard_stop(ctgid);
	if (bpf_ksym_exists(bpf_send_signal_task)) {
		stop_task(child);
		return true;
	}
	if (pressure_freeze)
		record_hard_stop(current_ids() >> 32);
	stop_current_thread();
	return false;
}
