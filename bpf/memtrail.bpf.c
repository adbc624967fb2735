/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * memtrail's allocation probes.
 *
 * - Allocator uprobes: `alloc_enter`/`alloc_return` on every allocating entry
 *   point (the attach cookie is the enum mt_kind), `free_enter` on free.
 *   Only the outermost allocator call of a thread makes a record: glibc calls
 *   its own public entry points (realloc(NULL, n) -> malloc, reallocarray ->
 *   realloc, memalign -> malloc), so a per-thread nesting depth in the
 *   thread's state (a slot of `thread_slots`, else `inflight` task storage)
 *   carries the outermost call's arguments from entry to return.
 * - Syscall tracepoints for anonymous mmap, munmap, mremap and brk.
 * - Sched tracepoints keep `tracked` equal to the set of processes in the
 *   tree: a fork of a tracked process adds the child, the last thread's exit
 *   removes the process.
 *
 * Records go reserve -> fill -> submit, without a wakeup unless the ring's
 * poller sleeps (see `sleeping`): userspace busy-polls the ring. A failed reserve bumps a drop counter atomically; userspace fails
 * the capture on any drop. No scratch lives in per-CPU maps: a uprobe program
 * can be preempted and another one on the same CPU would reuse the slot.
 */
#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "memtrail.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define MT_MAX_PROCS 32768
#define MT_MAX_THREADS 65536
/* Thread slots (see thread_slots): 88 bytes each; a power of two. */
#define MT_THREAD_SLOTS 16384
#define MAP_ANONYMOUS 0x20
#define PROT_EXEC 0x4
#define EEXIST 17
#define PAGE_SHIFT 12
#define SIGSTOP 19
/* How far below operator new's entry its allocator call may run. */
#define NEW_FRAME_MAX 4096
/* Syscall returns in [-4095, -1] are errors. */
#define IS_ERR_VALUE(x) ((unsigned long)(x) >= (unsigned long)-4095)

/* Userspace sizes the ring before load (Ring sizes are tunable). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} events SEC(".maps");

/* Call stacks, one record per distinct (process, stack). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} stacks SEC(".maps");

/* Executable file mappings of tracked processes. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} mappings SEC(".maps");

/* Attach requests: executable images not examined yet. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} attach_requests SEC(".maps");

/* Images userspace has examined (and probed where it found allocators),
 * by file identity. */
struct image_id {
	__u64 dev;
	__u64 ino;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct image_id);
	__type(value, __u8);
} known_images SEC(".maps");

/* Ids of the stacks already written to the stack ring. When full, stacks
 * are written again (userspace deduplicates by id). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 18);
	__type(key, __u64);
	__type(value, __u8);
} known_stacks SEC(".maps");

/* Frames to capture per allocation stack; 0 turns capture off. Set by
 * userspace before load (at most MT_MAX_STACK). */
const volatile __u32 stack_depth = 127;

/* tgid -> parent tgid, for every process of the tracked tree. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_MAX_PROCS);
	__type(key, __u32);
	__type(value, __u32);
} tracked SEC(".maps");

/*
 * Loss counters, read by userspace from the mmap'd .bss. Any non-zero value
 * fails the capture.
 *   drops_events:   failed reserves on the events ring
 *   drops_tracking: a map update that could not be made (tracked or inflight
 *                   full), so events of that process or call were not seen
 */
__u64 drops_events = 0;
__u64 drops_tracking = 0;
__u64 drops_stacks = 0;
__u64 drops_mappings = 0;
__u64 drops_attach = 0;

/*
 * Backpressure. With pressure_enabled, a producer that finds its ring
 * filled past the ring's watermark (after submitting, never while holding a
 * reservation) latches a pressure episode with a compare-and-swap on
 * pressure_latch. Userspace, which reads and clears the latch through the
 * mmap'd .bss, pauses the tree, drains every ring and resumes it.
 *
 * With pressure_freeze, userspace pauses the tree with its cgroup's
 * freezer, which the tree cannot observe; a producer stops its own process
 * (SIGSTOP, which its parent can see) only past the ring's hard mark,
 * where the room left holds no more than what the tree's threads can still
 * produce before each stops at its own next check: MT_RECORDS_PER_THREAD
 * records of ring_record[ring] bytes per live thread of the tree. Without
 * pressure_freeze (no usable cgroup) every producer past the watermark
 * stops its own process.
 */
const volatile bool pressure_enabled = false;
const volatile bool pressure_freeze = false;
const volatile __u64 watermark_events = ~0ULL;
const volatile __u64 watermark_stacks = ~0ULL;
const volatile __u64 watermark_mappings = ~0ULL;
const volatile __u64 watermark_attach = ~0ULL;
/* Capacity and largest record (with its 8-byte ring header) of each ring. */
const volatile __u64 ring_capacity[MT_RINGS] = {};
const volatile __u64 ring_record[MT_RINGS] = {};

/* A thread produces at most this many records into one ring between two
 * of its checks (sched_exec writes its exec event unchecked, then checks
 * after the mapping it writes). */
#define MT_RECORDS_PER_THREAD 2

/* Live threads of the tracked tree: userspace sets 1 for the root before
 * it execs; forks add, exits subtract. */
__u64 tree_threads = 0;
/* The most live threads the tree had (a statistic: racy maximum). */
__u64 tree_threads_peak = 0;

/* Processes that stopped themselves past a hard mark, for the coordinator
 * to hold and resume; hard_stops_unrecorded counts the ones this map had
 * no room for (the coordinator then looks at every process). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} hard_stops SEC(".maps");
__u64 hard_stops_unrecorded = 0;

/* The producer that latches an episode writes a record here with a forced
 * wakeup: the coordinator sleeps on this ring's epoll, so a freeze starts
 * within a wakeup's latency, not a nap's. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} pressure_wake SEC(".maps");

static __always_inline void wake_coordinator(void)
{
	__u64 *rec = bpf_ringbuf_reserve(&pressure_wake, sizeof(*rec), 0);

	/* Full: earlier wakeups not consumed yet, which wake it all the same. */
	if (!rec)
		return;
	*rec = 1;
	bpf_ringbuf_submit(rec, BPF_RB_FORCE_WAKEUP);
}

__u64 pressure_latch = 0;

/*
 * Set by userspace while a ring's poller sleeps on the ring's epoll:
 * producers then submit with BPF_RB_FORCE_WAKEUP, otherwise with
 * BPF_RB_NO_WAKEUP (the poller busy-polls). Read just before the commit:
 * src/engine/idle.rs documents the pairing and its one benign race.
 */
__u64 sleeping[MT_RINGS] = {};

static __always_inline __u64 submit_flags(enum mt_ring ring)
{
	return sleeping[ring] ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}
/* Highest fill seen by producers per ring, in bytes, with pressure on (a
 * statistic: racy maximum). */
__u64 hwm_events = 0;
__u64 hwm_stacks = 0;
__u64 hwm_mappings = 0;
__u64 hwm_attach = 0;

/*
 * The outermost allocator call a thread is inside, from entry to return.
 * Task-local storage: found through the task itself (no hash, no
 * insert/delete per call) and freed with the task.
 */
struct inflight {
	__u64 args[3];
	__u64 stack_id; /* the outermost call's stack, 0 if none */
	__u64 sp;       /* stack pointer at the outermost call's entry */
	/* Stack of a C++ operator new entered on this thread, for the
	 * allocator call it makes (see new_enter). */
	__u64 new_stack_id;
	__u64 new_sp;
	__u64 cookie; /* attach cookie of the outermost call */
	__u32 depth;  /* nested allocator calls, outermost included; 0: none */
	/* The thread's allocator events in the current kernel tick (see
	 * event_clock). */
	__u32 clock_events;
	__u64 clock_tick;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct inflight);
} inflight SEC(".maps");

/*
 * Thread slots: the state of most threads of the tree, found without a
 * helper call. bpf_task_storage_get() costs ~50 ns a call on this kind of
 * machine, and a malloc/free pair looked the state up three times; an array
 * lookup is inlined by the verifier into a few instructions. A thread takes
 * slot (tid % MT_THREAD_SLOTS) when it joins the tree, if no other live
 * thread holds it, and gives it back when it exits (or when exec hands its
 * tid to another task); a thread whose slot is taken keeps its state in
 * task storage instead. A slot's `tid` names its holder, 0 when free.
 */
struct thread_slot {
	__u64 tid; /* 64 bits: BPF's 32-bit cmpxchg needs -mcpu=v3 */
	struct inflight call;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MT_THREAD_SLOTS);
	__type(key, __u32);
	__type(value, struct thread_slot);
} thread_slots SEC(".maps");

/* Slot index mask; tests set 0 (MEMTRAIL_FAULT=one-thread-slot) so that
 * all threads but one keep their state in task storage. */
const volatile __u32 thread_slot_mask = MT_THREAD_SLOTS - 1;

/*
 * PID namespaces. Every pid or tid userspace sees (record headers, fork
 * children, the tracked and hard_stops maps) is as memtrail's own PID
 * namespace numbers it, so that memtrail running inside a container (PID 1
 * of a namespace included) opens pidfds and reads /proc with the ids it
 * gets. Thread slots stay indexed by the kernel's global tid: they are
 * internal. In the initial namespace pidns_translate is false and the
 * verifier drops the translation.
 */
const volatile bool pidns_translate = false;
const volatile __u32 pidns_ino = 0;

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

/* tgid << 32 | tid of task, as memtrail's namespace numbers them. */
static __always_inline __u64 task_ids(struct task_struct *task)
{
	if (!pidns_translate)
		return (__u64)(__u32)task->tgid << 32 | (__u32)task->pid;
	return (__u64)pid_in_ns(BPF_CORE_READ(task, group_leader, thread_pid)) << 32 |
	       pid_in_ns(BPF_CORE_READ(task, thread_pid));
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
	__u64 tick = bpf_jiffies64();
	__u32 n;

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

/* Whether the current thread is inside an allocator call. */
static __always_inline bool in_allocator(void)
{
	struct inflight *cur = current_call();

	return cur && cur->depth > 0;
}

/* Syscall arguments carried from sys_enter to sys_exit. */
struct sysargs {
	__u64 args[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_MAX_THREADS);
	__type(key, __u32); /* tid */
	__type(value, struct sysargs);
} sysargs SEC(".maps");


/* Dummy instances: make libbpf-cargo emit the record types for Rust. */
struct mt_alloc_event _mt_alloc_event = {};
struct mt_fork_event _mt_fork_event = {};
struct mt_exec_event _mt_exec_event = {};
struct mt_exit_event _mt_exit_event = {};
struct mt_stack_record _mt_stack_record = {};
struct mt_mapping_record _mt_mapping_record = {};
enum mt_kind _mt_kind = 0;
enum mt_flags _mt_flags = 0;
enum mt_cookie_layout _mt_cookie_layout = 0;
enum mt_cookie_flags _mt_cookie_flags = 0;
enum mt_ring _mt_ring = 0;

static __always_inline bool is_tracked(__u32 tgid)
{
	return bpf_map_lookup_elem(&tracked, &tgid) != NULL;
}

/*
 * Threads of a tracked process that are not part of the tree: memtrail's
 * own pollers and coordinator when it tracks its own process
 * (src/session). They start before the process enters `tracked`, so they
 * never get call state (see task_call) and their allocator calls are not
 * seen; this map leaves their syscalls out too. Userspace fills it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} excluded_threads SEC(".maps");

/* Set with excluded_threads: without it the test is the process's alone. */
const volatile bool threads_excluded = false;

/* Whether the current thread (pid_tgid) belongs to the tree. */
static __always_inline bool thread_tracked(__u64 pid_tgid)
{
	__u32 tid = (__u32)pid_tgid;

	if (!is_tracked(pid_tgid >> 32))
		return false;
	return !threads_excluded || !bpf_map_lookup_elem(&excluded_threads, &tid);
}

/* Whether a process that maps a new image is stopped until its allocators
 * are probed. Off when memtrail tracks its own process (src/session): the
 * attach worker is one of its threads. */
const volatile bool attach_hold = true;

static __always_inline void *reserve(__u64 size)
{
	void *rec = bpf_ringbuf_reserve(&events, size, 0);

	if (!rec)
		__sync_fetch_and_add(&drops_events, 1);
	return rec;
}

static __always_inline void check_pressure(void *ring, enum mt_ring idx, __u64 watermark,
					   __u64 *hwm)
{
	__u64 avail, reserve_for, tgid;
	__u32 one = 1;

	/* A constant at load time: without pressure the verifier drops the
	 * rest, and with it the query (~20 ns a record here). The pollers
	 * then keep the high-water marks from what they see. */
	if (!pressure_enabled)
		return;
	avail = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);
	if (avail > *hwm)
		*hwm = avail;
	if (avail <= watermark)
		return;
	/* The first producer over the watermark latches the episode. */
	if (__sync_val_compare_and_swap(&pressure_latch, 0, 1) == 0)
		wake_coordinator();
	if (pressure_freeze) {
		reserve_for = tree_threads * MT_RECORDS_PER_THREAD * ring_record[idx & (MT_RINGS - 1)];
		if (avail + reserve_for <= ring_capacity[idx & (MT_RINGS - 1)])
			return;
		tgid = current_ids() >> 32;
		if (bpf_map_update_elem(&hard_stops, &tgid, &one, BPF_ANY))
			__sync_fetch_and_add(&hard_stops_unrecorded, 1);
	}
	/* Every producer past the mark stops its own process, so a wide tree
	 * cannot overrun the room left before the coordinator has paused it
	 * all. The coordinator holds and resumes them: it waits until each
	 * held process has stopped (and so left this program) before it
	 * clears the latch, so no self-stop can land after its SIGCONT. To
	 * this thread: it dequeues the stop on its way back to user space and
	 * so cannot produce again before the whole group stops. */
	bpf_send_signal_thread(SIGSTOP);
}

static __always_inline void fill_header_at(struct mt_header *hdr, __u64 ts,
					    __u64 pid_tgid, __u16 kind, __u16 flags)
{
	hdr->ts_ns = ts;
	hdr->pid = pid_tgid >> 32;
	hdr->tid = (__u32)pid_tgid;
	hdr->kind = kind;
	hdr->flags = flags;
	hdr->_pad = 0;
}

static __always_inline void fill_header(struct mt_header *hdr, __u64 pid_tgid,
					 __u16 kind, __u16 flags)
{
	fill_header_at(hdr, bpf_ktime_get_ns(), pid_tgid, kind, flags);
}

/* An event record stamped ts (0: see event_clock). */
static __always_inline void emit_event(__u64 ts, __u64 pid_tgid, __u16 kind,
					__u16 flags, __u64 addr, __u64 size,
					__u64 old_addr, __u64 aux)
{
	struct mt_alloc_event *e = reserve(sizeof(*e));

	if (!e)
		return;
	fill_header_at(&e->hdr, ts, pid_tgid, kind, flags);
	e->addr = addr;
	e->size = size;
	e->old_addr = old_addr;
	e->aux = aux;
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	check_pressure(&events, MT_RING_EVENTS, watermark_events, &hwm_events);
}

/* A memory syscall's record (old_size: mremap's, in the aux field). */
static __always_inline void emit_alloc(__u64 pid_tgid, __u16 kind, __u16 flags,
					__u64 addr, __u64 size, __u64 old_addr,
					__u64 old_size)
{
	emit_event(bpf_ktime_get_ns(), pid_tgid, kind, flags, addr, size, old_addr,
		   old_size);
}

static __always_inline __u64 mix(__u64 h, __u64 v)
{
	h ^= v;
	h *= 0xff51afd7ed558ccdULL;
	return h ^ (h >> 33);
}

/* A frame of the frame-pointer chain: the caller's saved frame pointer,
 * then the return address into the caller's caller. */
struct user_frame {
	__u64 next;
	__u64 ret;
};

/*
 * Walks the user stack of an allocator call at its entry, hashing its
 * frames (seeded with the process id) and, with ips, storing them there.
 * Returns the hash, never 0; *nr gets the number of frames.
 *
 * At entry the caller's frame is not yet linked: its return address, ra,
 * read from the top of the stack, goes first; the chain of saved frame
 * pointers from the caller's frame pointer gives the rest. The chain is
 * walked here rather than with bpf_get_stack(): the kernel's walker reads
 * on until a read faults, and the chain of every stack ends in a frame
 * pointer of 0 (set by _start), so each call paid a page fault (~1 us a
 * call on this kind of machine). This walk stops where the chain does: at
 * a frame pointer that is not above the previous one (0 included), or not
 * 8-aligned, or unreadable.
 */
static __always_inline __u64 walk_stack(struct pt_regs *ctx, __u32 tgid, __u64 ra,
					__u32 depth, __u64 *ips, __u32 *nr)
{
	struct user_frame frame;
	__u64 h = mix(tgid, ra), below = PT_REGS_SP(ctx), fp = PT_REGS_FP(ctx);
	__u32 n;

	if (ips)
		ips[0] = ra;
	for (n = 1; n < MT_MAX_STACK; n++) {
		if (n >= depth || fp <= below || (fp & 7))
			break;
		if (bpf_probe_read_user(&frame, sizeof(frame), (void *)fp))
			break;
		if (ips)
			ips[n] = frame.ret;
		h = mix(h, frame.ret);
		below = fp;
		fp = frame.next;
	}
	*nr = n;
	return h ? h : 1;
}

/*
 * The id of the user stack of an allocator call at its entry, 0 if none;
 * a stack not seen before is also written to the stack ring.
 *
 * Most calls come from stacks already written, so the stack is first only
 * hashed as it is walked (in registers and 16 bytes of the program's own
 * stack, never a per-CPU map) and looked up; only a new one is walked
 * again into a record reserved on the stack ring. A record is thus
 * reserved only for new stacks, and the ring's space is not taken and
 * given back a kilobyte at a time for every allocation.
 */
static __always_inline __u64 capture_stack(struct pt_regs *ctx, __u32 tgid)
{
	const __u32 depth = stack_depth < MT_MAX_STACK ? stack_depth : MT_MAX_STACK;
	struct mt_stack_record *rec;
	__u64 ra, h;
	__u8 one = 1;
	__u32 n;

	if (!stack_depth)
		return 0;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)PT_REGS_SP(ctx)))
		ra = 0;
	h = walk_stack(ctx, tgid, ra, depth, NULL, &n);
	if (bpf_map_lookup_elem(&known_stacks, &h))
		return h;
	rec = bpf_ringbuf_reserve(&stacks, sizeof(*rec), 0);
	if (!rec) {
		__sync_fetch_and_add(&drops_stacks, 1);
		return 0;
	}
	/* The same walk, into the record: the stack is the thread's own and
	 * the thread is here, so it gives the same frames and hash (but the
	 * record carries what this walk saw, whatever happens). */
	h = walk_stack(ctx, tgid, ra, depth, rec->ips, &n);
	rec->id = h;
	rec->pid = tgid;
	rec->nr = n;
	rec->_pad = 0;
	if (bpf_map_update_elem(&known_stacks, &h, &one, BPF_NOEXIST) == -EEXIST)
		bpf_ringbuf_discard(rec, BPF_RB_NO_WAKEUP);
	else
		bpf_ringbuf_submit(rec, submit_flags(MT_RING_STACKS));
	check_pressure(&stacks, MT_RING_STACKS, watermark_stacks, &hwm_stacks);
	return h;
}

/*
 * Whether an allocator entry with stack pointer sp runs inside the call
 * recorded in cur. A call made from inside runs deeper (lower sp); a tail
 * call from inside (glibc's realloc(NULL, n) jumps to malloc) runs at the
 * same sp. An entry above the outermost call's frame means that call never
 * returned through its uretprobe (a longjmp out of a signal handler that
 * interrupted it): the entry starts afresh rather than let every later call
 * of the thread pass for nested. (operator new, which can throw, has no
 * uretprobe and so never holds a depth.)
 */
static __always_inline bool nested_in(struct inflight *cur, __u64 sp)
{
	return sp <= cur->sp;
}

static __always_inline __u64 arg(const struct inflight *call, __u32 idx)
{
	return idx < 3 ? call->args[idx] : 0;
}

/* The block a realloc-like call resizes, 0 if none. */
static __always_inline __u64 old_ptr(const struct inflight *call)
{
	__u32 ptr = (call->cookie >> MT_CK_PTR_SHIFT) & 0xf;
	__u32 flags = (call->cookie >> MT_CK_FLAGS_SHIFT) & 0xf;

	if (ptr == MT_CK_ARG_NONE || (flags & MT_CK_OUT_PTR))
		return 0;
	return arg(call, ptr);
}

SEC("uprobe.multi")
int alloc_enter(struct pt_regs *ctx)
{
	__u64 pid_tgid = 0;
	struct inflight *cur;
	__u64 old;

	cur = current_call_ids(&pid_tgid);
	if (!cur)
		return 0;
	if (cur->depth > 0 && nested_in(cur, PT_REGS_SP(ctx))) {
		cur->depth++;
		return 0; /* nested: the outermost call makes the record */
	}
	cur->depth = 1;
	cur->sp = PT_REGS_SP(ctx);
	cur->args[0] = PT_REGS_PARM1(ctx);
	cur->args[1] = PT_REGS_PARM2(ctx);
	cur->args[2] = PT_REGS_PARM3(ctx);
	cur->cookie = bpf_get_attach_cookie(ctx);
	if (cur->new_sp && cur->sp < cur->new_sp && cur->new_sp - cur->sp < NEW_FRAME_MAX)
		cur->stack_id = cur->new_stack_id; /* called by operator new */
	else
		cur->stack_id = capture_stack(ctx, pid_tgid >> 32);
	cur->new_sp = 0;
	old = old_ptr(cur);
	if (old)
		emit_event(event_clock(cur), pid_tgid, MT_REALLOC_BEGIN, 0, old, 0, 0,
			   0);
	return 0;
}

/*
 * Entry of C++ operator new. No uretprobe here: its return address would be
 * the uretprobe trampoline, which C++ unwinders cannot step through, so a
 * std::bad_alloc thrown out of new would terminate the program. new is not
 * counted itself (the malloc it calls is); it captures the stack, whose
 * first frame is the user's new expression, for that malloc to use.
 */
SEC("uprobe.multi")
int new_enter(struct pt_regs *ctx)
{
	__u64 pid_tgid = current_ids();
	struct inflight *cur;

	if (!stack_depth)
		return 0;
	cur = current_call();
	if (!cur)
		return 0;
	if (cur->depth > 0 && nested_in(cur, PT_REGS_SP(ctx)))
		return 0; /* new called from inside an allocator: no new site */
	cur->new_stack_id = capture_stack(ctx, pid_tgid >> 32);
	cur->new_sp = PT_REGS_SP(ctx);
	return 0;
}

SEC("uretprobe.multi")
int alloc_return(struct pt_regs *ctx)
{
	__u64 ret = PT_REGS_RC(ctx), addr = ret, size, old, pid_tgid = 0;
	struct inflight *cur = current_call_ids(&pid_tgid);
	__u32 kind, count, flags;

	if (!cur || cur->depth == 0)
		return 0;
	if (--cur->depth > 0)
		return 0;

	/* The outermost call, read in place: nothing else runs on this thread
	 * until we return. */
	kind = cur->cookie & 0xffff;
	count = (cur->cookie >> MT_CK_COUNT_SHIFT) & 0xf;
	flags = (cur->cookie >> MT_CK_FLAGS_SHIFT) & 0xf;
	size = arg(cur, (cur->cookie >> MT_CK_SIZE_SHIFT) & 0xf);
	if (count != MT_CK_ARG_NONE) {
		__u64 n = arg(cur, count), m = size;

		size = n * m;
		/* Keeps clang from turning the check into a 128-bit multiply. */
		barrier_var(size);
		/* An overflowing product fails like ENOMEM; never mistake its
		 * wrapped value for realloc(p, 0). */
		if (n && size / n != m)
			size = ~0ULL;
	}
	old = old_ptr(cur);
	if (flags & MT_CK_OUT_PTR) {
		/* int posix_memalign(void **memptr, size_t align, size_t size) */
		__u64 out = arg(cur, (cur->cookie >> MT_CK_PTR_SHIFT) & 0xf);

		addr = 0;
		if ((int)ret == 0 && bpf_probe_read_user(&addr, sizeof(addr), (void *)out))
			addr = 0;
	} else if (flags & MT_CK_RESULT_IS_SIZE) {
		/* Resized in place: same block, new size. */
		addr = old;
		size = ret;
	}
	/* A failed allocation makes no record, but a realloc of a live block
	 * always completes the MT_REALLOC_BEGIN record it opened. */
	if (!addr && !old)
		return 0;
	emit_event(event_clock(cur), pid_tgid, kind, 0, addr, size, old,
		   cur->stack_id);
	return 0;
}

SEC("uprobe.multi")
int free_enter(struct pt_regs *ctx)
{
	__u64 ptr = PT_REGS_PARM1(ctx), pid_tgid = 0;
	struct inflight *cur;

	if (!ptr)
		return 0;
	cur = current_call_ids(&pid_tgid);
	/* Untracked, or free() inside realloc(p, 0) or another allocator. */
	if (!cur || cur->depth > 0)
		return 0;
	emit_event(event_clock(cur), pid_tgid, MT_FREE, 0, ptr, 0, 0, 0);
	return 0;
}

static __always_inline __u16 syscall_flags(void)
{
	return in_allocator() ? MT_F_IN_ALLOCATOR : 0;
}

static __always_inline int stash_args(__u64 a0, __u64 a1, __u64 a2)
{
	__u64 pid_tgid = current_ids();
	__u32 tid = (__u32)pid_tgid;
	struct sysargs args = { .args = { a0, a1, a2 } };

	if (!thread_tracked(pid_tgid))
		return 0;
	if (bpf_map_update_elem(&sysargs, &tid, &args, BPF_ANY))
		__sync_fetch_and_add(&drops_tracking, 1);
	return 0;
}

/* Takes the arguments stashed at sys_enter; false if there were none. */
static __always_inline bool take_args(__u32 tid, struct sysargs *out)
{
	struct sysargs *args = bpf_map_lookup_elem(&sysargs, &tid);

	if (!args)
		return false;
	*out = *args;
	bpf_map_delete_elem(&sysargs, &tid);
	return true;
}

SEC("tracepoint/syscalls/sys_enter_mmap")
int sys_enter_mmap(struct trace_event_raw_sys_enter *ctx)
{
	/* mmap(addr, len, prot, flags, fd, off): anonymous mappings, and
	 * executable file mappings (code whose addresses stacks hold). */
	if (!(ctx->args[3] & MAP_ANONYMOUS) && !(ctx->args[2] & PROT_EXEC))
		return 0;
	return stash_args(ctx->args[1], ctx->args[3], ctx->args[2]);
}

struct vma_info {
	__u64 start, end, pgoff, dev, ino;
	const unsigned char *name;
};

static long read_vma(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct vma_info *info = data;
	struct file *file = BPF_CORE_READ(vma, vm_file);

	info->start = BPF_CORE_READ(vma, vm_start);
	info->end = BPF_CORE_READ(vma, vm_end);
	info->pgoff = BPF_CORE_READ(vma, vm_pgoff) << PAGE_SHIFT;
	if (file) {
		info->ino = BPF_CORE_READ(file, f_inode, i_ino);
		info->dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
		info->name = BPF_CORE_READ(file, f_path.dentry, d_name.name);
	}
	return 0;
}

static __always_inline void fill_mapping(struct mt_mapping_record *m, __u64 pid_tgid,
					 const struct vma_info *info)
{
	m->ts_ns = bpf_ktime_get_ns();
	m->pid = pid_tgid >> 32;
	m->_pad = 0;
	m->start = info->start;
	m->end = info->end;
	m->pgoff = info->pgoff;
	m->dev = info->dev;
	m->ino = info->ino;
	if (bpf_probe_read_kernel_str(m->name, sizeof(m->name), info->name) < 0)
		m->name[0] = 0;
}

/*
 * An executable image userspace has not examined: ask for it, and stop the
 * process before it returns to user space, so that no code of the image
 * (constructors included) runs before its allocators are probed. The
 * attach worker resumes it.
 */
static __always_inline void request_attach(__u64 pid_tgid, const struct vma_info *info)
{
	struct image_id id = { .dev = info->dev, .ino = info->ino };
	struct mt_mapping_record *m;

	if (bpf_map_lookup_elem(&known_images, &id))
		return;
	m = bpf_ringbuf_reserve(&attach_requests, sizeof(*m), 0);
	if (!m) {
		__sync_fetch_and_add(&drops_attach, 1);
		return;
	}
	fill_mapping(m, pid_tgid, info);
	bpf_ringbuf_submit(m, submit_flags(MT_RING_ATTACH));
	if (attach_hold)
		bpf_send_signal(SIGSTOP);
	check_pressure(&attach_requests, MT_RING_ATTACH, watermark_attach, &hwm_attach);
}

/* Writes the file mapping of the current process that contains addr, and
 * asks for its image to be examined if it is new. */
static __always_inline void emit_mapping(__u64 pid_tgid, __u64 addr)
{
	struct vma_info info = {};
	struct mt_mapping_record *m;

	if (bpf_find_vma(bpf_get_current_task_btf(), addr, read_vma, &info, 0) || !info.name)
		return;
	request_attach(pid_tgid, &info);
	m = bpf_ringbuf_reserve(&mappings, sizeof(*m), 0);
	if (!m) {
		__sync_fetch_and_add(&drops_mappings, 1);
		return;
	}
	fill_mapping(m, pid_tgid, &info);
	bpf_ringbuf_submit(m, submit_flags(MT_RING_MAPPINGS));
	check_pressure(&mappings, MT_RING_MAPPINGS, watermark_mappings, &hwm_mappings);
}

SEC("tracepoint/syscalls/sys_exit_mmap")
int sys_exit_mmap(struct trace_event_raw_sys_exit *ctx)
{
	__u64 pid_tgid = current_ids();
	__u32 tid = (__u32)pid_tgid;
	struct sysargs args;

	if (!take_args(tid, &args) || IS_ERR_VALUE(ctx->ret))
		return 0;
	if (args.args[1] & MAP_ANONYMOUS)
		emit_alloc(pid_tgid, MT_MMAP, syscall_flags(), ctx->ret, args.args[0], 0, 0);
	else
		emit_mapping(pid_tgid, ctx->ret);
	return 0;
}

/* munmap is recorded at entry: once it returns, another thread may get the
 * same range from mmap, and that record must come after this one. */
SEC("tracepoint/syscalls/sys_enter_munmap")
int sys_enter_munmap(struct trace_event_raw_sys_enter *ctx)
{
	__u64 pid_tgid = current_ids();

	if (!thread_tracked(pid_tgid))
		return 0;
	emit_alloc(pid_tgid, MT_MUNMAP, syscall_flags(), ctx->args[0], ctx->args[1], 0, 0);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_mremap")
int sys_enter_mremap(struct trace_event_raw_sys_enter *ctx)
{
	/* mremap(old_addr, old_len, new_len, flags, new_addr) */
	return stash_args(ctx->args[0], ctx->args[1], ctx->args[2]);
}

SEC("tracepoint/syscalls/sys_exit_mremap")
int sys_exit_mremap(struct trace_event_raw_sys_exit *ctx)
{
	__u64 pid_tgid = current_ids();
	__u32 tid = (__u32)pid_tgid;
	struct sysargs args;

	if (!take_args(tid, &args) || IS_ERR_VALUE(ctx->ret))
		return 0;
	emit_alloc(pid_tgid, MT_MREMAP, syscall_flags(), ctx->ret, args.args[2],
		   args.args[0], args.args[1]);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_brk")
int sys_enter_brk(struct trace_event_raw_sys_enter *ctx)
{
	return stash_args(ctx->args[0], 0, 0);
}

SEC("tracepoint/syscalls/sys_exit_brk")
int sys_exit_brk(struct trace_event_raw_sys_exit *ctx)
{
	__u64 pid_tgid = current_ids();
	__u32 tid = (__u32)pid_tgid;
	struct sysargs args;

	if (!take_args(tid, &args))
		return 0;
	emit_alloc(pid_tgid, MT_BRK, syscall_flags(), ctx->ret, args.args[0], 0, 0);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = task_ids(parent) >> 32, ctgid = task_ids(child) >> 32;
	struct mt_fork_event *e;

	if (!is_tracked(ptgid))
		return 0;
	track_task(child);
	if (__sync_fetch_and_add(&tree_threads, 1) + 1 > tree_threads_peak)
		tree_threads_peak = tree_threads;
	if (ptgid == ctgid)
		return 0; /* a thread */
	if (bpf_map_update_elem(&tracked, &ctgid, &ptgid, BPF_ANY)) {
		__sync_fetch_and_add(&drops_tracking, 1);
		return 0;
	}
	e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_header(&e->hdr, current_ids(), MT_FORK, 0);
	e->hdr.pid = ptgid;
	e->child_pid = ctgid;
	e->_pad = 0;
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	check_pressure(&events, MT_RING_EVENTS, watermark_events, &hwm_events);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(sched_exec, struct task_struct *p, int old_pid, struct linux_binprm *bprm)
{
	__u64 pid_tgid = current_ids();
	struct mt_exec_event *e;

	if (!is_tracked(pid_tgid >> 32))
		return 0;
	/* A thread other than the leader that execs takes the leader's tid
	 * (de_thread); its old tid is no longer anyone's. */
	if ((__u32)old_pid != (__u32)p->pid)
		release_slot(old_pid);
	/* The root enters the tree here (the others at fork); every thread
	 * starts the new image with fresh state. */
	track_task(bpf_get_current_task_btf());
	e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_header(&e->hdr, pid_tgid, MT_EXEC, 0);
	if (bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), bprm->filename) < 0)
		e->filename[0] = 0;
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	/* The kernel mapped the new image itself: no mmap to see it by. */
	emit_mapping(pid_tgid, BPF_CORE_READ(p, mm, start_code));
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_exit, struct task_struct *p)
{
	__u64 pid_tgid = current_ids();
	__u32 tid = (__u32)pid_tgid, tgid = pid_tgid >> 32;
	struct mt_exit_event *e;

	/* A thread that dies inside a syscall (its task storage goes with it). */
	bpf_map_delete_elem(&sysargs, &tid);
	release_slot(p->pid);
	if (!is_tracked(tgid))
		return 0;
	__sync_fetch_and_add(&tree_threads, -1);
	/* do_exit() drops signal->live before this tracepoint: zero means
	 * the last thread of the process is exiting. */
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0;
	bpf_map_delete_elem(&tracked, &tgid);
	e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_header(&e->hdr, pid_tgid, MT_EXIT, 0);
	e->exit_code = BPF_CORE_READ(p, exit_code);
	e->_pad = 0;
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	return 0;
}
