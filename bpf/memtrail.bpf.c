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
 */
#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "memtrail.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define MT_MAX_PROCS 32768
#define MT_MAX_THREADS 65536
/* Thread slots (see thread_slots): 152 bytes each; a power of two. */
#define MT_THREAD_SLOTS 16384
#define MAP_ANONYMOUS 0x20
#define PROT_EXEC 0x4
#define MT_PROT_BITS 0x7
#define EEXIST 17
#define PAGE_SHIFT 12
#define SIGKILL 9
#define SIGSTOP 19
#define SIGCONT 18
#define SIGTSTP 20
#define SIGTTIN 21
#define SIGTTOU 22
#define SIGCHLD 17
#define SIGURG 23
#define SIGWINCH 28
/* signal_struct.flags: a pid namespace's init, which ignores fatal
 * signals it has no handler for. */
#define SIGNAL_UNKILLABLE 0x40
#define SI_KERNEL 0x80
/* The kernel's siginfo for a signal sent on its own account. */
#define SEND_SIG_PRIV ((void *)1)
/* signal_generate's result (include/trace/events/signal.h). */
#define TRACE_SIGNAL_DELIVERED 0
#define TRACE_SIGNAL_ALREADY_PENDING 2
/* How far below operator new's entry its allocator call may run. */
#define NEW_FRAME_MAX 4096
#define X86_EFLAGS_OF 0x800
/* Syscall returns in [-4095, -1] are errors. */
#define IS_ERR_VALUE(x) ((unsigned long)(x) >= (unsigned long)-4095)

/*
 * Hash maps BPF programs update are preallocated: an update then fails only
 * when the map is full. Without preallocation an update allocates from
 * BPF's per-CPU caches, which a burst (a fork storm, every thread making
 * new stacks at once) can empty before they refill: a failed update of
 * `tracked` or `sysargs` is a lost event, of `known_stacks` a stack record
 * sent again. The maps only userspace writes (known_images, unwind_images)
 * are BPF_F_NO_PREALLOC: preallocating 2^16 entries costs ~3 ms at start.
 */

/*
 * The events rings: one every CPU shares, at index 0, or one per CPU
 * (cpu_rings), the ring of CPU n at index n. Userspace makes this array
 * (the object reuses it), then the rings, and inserts them in one batch,
 * all while the kernel verifies the programs: a 64 MiB ring takes ~15 ms
 * to create, and each single insertion into an array of maps waits for an
 * RCU grace period. A ring buffer's size is not part of its type here, so
 * the template's does not matter. With cpu_rings every producer
 * reserves from its own CPU's ring, so producers on different CPUs never
 * share the ring's lock; records are then stamped after they are reserved
 * (fill_header_at), and userspace merges the rings by time: a record
 * committed before another was reserved is read first, whichever rings they
 * are in (src/ring/merge.rs).
 */
struct events_ring {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct events_ring);
} event_rings SEC(".maps");

const volatile bool cpu_rings = false;
/* Every record stamped after its reservation, for the merge's sake
 * (src/ring/merge.rs): with cpu_rings, and with the preload shim's rings
 * read next to the events ring. */
const volatile bool stamp_reserved = false;

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

/* Attach requests (enum mt_request): executable images not examined yet;
 * with per-process probes, forks, exits and relinks too. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} attach_requests SEC(".maps");

struct image_id {
	__u64 dev;
	__u64 ino;
};

/* Images userspace has examined, by file identity: with tgid 0 for every
 * process (system-wide probes, or an image without allocators); with
 * per-process probes, an image with allocators is known per process, once
 * that process's own probes on it are made. */
struct known_id {
	__u64 dev;
	__u64 ino;
	__u32 tgid;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1 << 16);
	__type(key, struct known_id);
	__type(value, __u8);
} known_images SEC(".maps");

/* Probes per process (uprobe_multi links with a pid) rather than
 * system-wide: forks are held until the new process has its own. Set by
 * userspace before load, only where the kernel has bpf_send_signal_task. */
const volatile bool per_process = false;

extern int bpf_send_signal_task(struct task_struct *task, int sig, enum pid_type type,
				__u64 value) __weak __ksym;
extern struct task_struct *bpf_task_from_pid(__s32 pid) __weak __ksym;
extern struct task_struct *bpf_task_from_vpid(__s32 vpid) __weak __ksym;
extern void bpf_task_release(struct task_struct *p) __weak __ksym;

/* Processes held stopped until their per-process probes exist (tgid -> 1):
 * BPF adds one when it stops it, userspace removes it before it resumes it.
 * memtrail's own tgid (as it sees itself), whose SIGCONTs are the releases. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_MAX_PROCS);
	__type(key, __u32);
	__type(value, __u8);
} held_for_probes SEC(".maps");

const volatile __u32 memtrail_tgid = 0;

/* Processes of the tree that someone other than memtrail stopped (a
 * SIGSTOP, or a SIGTSTP, SIGTTIN or SIGTTOU the process does not catch)
 * and nobody resumed since: tgid -> 1. memtrail's releases, its guardian
 * and the safety net below never send them SIGCONT: a stop memtrail did
 * not make is not memtrail's to undo. signal_generate keeps it; userspace
 * adds a process found stopped when memtrail attaches to it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_MAX_PROCS);
	__type(key, __u32);
	__type(value, __u8);
} foreign_stops SEC(".maps");

/*
 * The safety net: whatever kills memtrail and its guardian (the guardian
 * resumes the tree when memtrail dies, see src/sys/guardian.rs), the
 * kernel runs sched_exit for each of them while its links are still
 * open (memtrail's; the guardian holds the sched_exit link until it has
 * thawed the tree). When memtrail's process exits, no program stops a
 * process any more (memtrail_gone: its uprobes may still fire while its
 * links close, and a pause or hold made then would have no end), and every
 * tracked process not stopped by someone else gets SIGCONT; when the last of the two
 * exits, a process still frozen (its cgroup frozen, and nobody left to
 * thaw it: only a write to cgroup.freeze does) is killed instead, since
 * SIGKILL is the one way out of the freezer. Userspace sets both words
 * once the guardian runs (protectors: 2 with a guardian, else 1).
 */
__u32 guardian_tgid = 0;
__u64 protectors = 0;
/* Raised as the guardian's process exits (protector_exit). */
__u64 guardian_gone = 0;

/* Held processes another process resumed before their probes existed: their
 * first allocations may have gone unseen, so the capture fails. */
__u64 drops_resumed = 0;

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
const volatile bool pressure_enabled = false;
/* Written by userspace after load (it creates the cgroup once its
 * guardian runs), before the command starts. */
bool pressure_freeze = false;
const volatile __u64 watermark_events = ~0ULL;
const volatile __u64 watermark_stacks = ~0ULL;
const volatile __u64 watermark_mappings = ~0ULL;
const volatile __u64 watermark_attach = ~0ULL;
/* Capacity and largest record (with its 8-byte ring header) of each ring. */
const volatile __u64 ring_capacity[MT_RINGS] = {};
const volatile __u64 ring_record[MT_RINGS] = {};
/* With pressure_freeze: the bytes each ring keeps between the latch and its
 * hard mark, for the tree to fill while the freeze lands (src/pressure). */
const volatile __u64 ring_freeze_room[MT_RINGS] = {};

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

/* 0, or the bpf_ktime_get_ns() of the latch: when the episode began. */
__u64 pressure_latch = 0;

/* Set as memtrail's process exits (protector_exit): from then on no
 * program stops a process (a hold or a pause nobody would end), while the
 * links close. */
__u64 memtrail_gone = 0;

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

/* Hits of each probe site (enum mt_site_hits in memtrail.h). */
__u64 site_hits[MT_HIT_ROWS][MT_MAX_SITES] = {};

/* Returns of outermost allocating calls that the kernel's return probe
 * handed back at a stack pointer other than their caller's (see
 * alloc_exit; issue 40). Read by userspace at the end. */
__u64 returns_elsewhere = 0;

/* Test fault (`MEMTRAIL_FAULT=returns-elsewhere`): every outermost return
 * is taken as handed back elsewhere, so a test sees the warning. */
const volatile bool fault_returns_elsewhere = false;

/*
 * The outermost allocator call a thread is inside, from entry to return.
 * Task-local storage: found through the task itself (no hash, no
 * insert/delete per call) and freed with the task.
 */
struct inflight {
	/* Argument registers at the outermost call's probe: rdi, rsi, rdx,
	 * rcx, rax (the cookie's argument indices). */
	__u64 args[5];
	__u64 stack_id; /* the outermost call's stack, 0 if none */
	__u64 sp;       /* stack pointer at the outermost call's entry */
	/* Stack of a C++ operator new entered on this thread, for the
	 * allocator call it makes (see alloc_enter). */
	__u64 new_stack_id;
	__u64 new_sp;
	__u64 new_ip; /* that new's probe address */
	/* Stack of a libc mmap or sbrk wrapper entered on this thread, for
	 * the syscall it makes (see syscall_stack); sys_sp is the entry's
	 * stack pointer (8-aligned) | 1 for sbrk, 0 when none is pending. */
	__u64 sys_stack_id;
	__u64 sys_sp;
	/* The stack pointer at the entry of this thread's last free made
	 * outside other allocator calls, and the return address it held then:
	 * while that word still holds it and the thread runs below it, the
	 * free has not returned (see in_free). */
	__u64 free_sp;
	__u64 free_ret;
	__u64 free_ip; /* that free's probe address */
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

/* How far below a free's entry its own calls may run the stack (glibc's
 * free -> tcache_init -> arena_get2 -> _int_new_arena -> new_heap -> mmap
 * takes a few hundred bytes). */
#define MT_FREE_FRAMES_MAX 16384

/*
 * Whether the current thread is inside the free its state remembers (free
 * has no return probe: it makes no record at return). It is while the
 * thread runs below the free's entry and the free's return address is
 * still where the entry found it: once free returns, the caller's next
 * call writes its own return address there. glibc makes a thread's arena
 * inside free when free is the thread's first malloc-family call (its
 * tcache_init), and trims heaps there: the allocator's own mappings.
 */
static __always_inline bool in_free(struct inflight *cur)
{
	__u64 usp, word = 0;

	if (!cur->free_sp)
		return false;
	usp = ((struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf()))->sp;
	if (usp >= cur->free_sp || cur->free_sp - usp >= MT_FREE_FRAMES_MAX ||
	    bpf_probe_read_user(&word, sizeof(word), (void *)cur->free_sp) ||
	    word != cur->free_ret) {
		if (usp >= cur->free_sp)
			cur->free_sp = 0; /* returned */
		return false;
	}
	return true;
}

/*
 * Whether a free entered with stack pointer sp at probe address ip is
 * called by the free the thread's state remembers (still running: at or
 * below its entry, its return address in place), so that an allocator's
 * operator delete calling its own free, or jumping to it (jemalloc's
 * aligned sized delete ends in a jump to sdallocx, at the same stack
 * pointer), makes one record. At the same stack pointer, the same free
 * entered again is the next call from the same place (a loop), not this.
 */
/* How far past a free's probe its call of another free may return. */
#define FREE_CALL_MAX 256

static __always_inline bool free_pending_above(struct inflight *cur, __u64 sp, __u64 ip)
{
	__u64 word = 0, ra = 0;

	if (!cur->free_sp || sp > cur->free_sp || cur->free_sp - sp >= MT_FREE_FRAMES_MAX ||
	    (sp == cur->free_sp && ip == cur->free_ip))
		return false;
	if (bpf_probe_read_user(&word, sizeof(word), (void *)cur->free_sp) || word != cur->free_ret)
		return false;
	if (sp == cur->free_sp)
		return true; /* a jump from that free to this one */
	/* Called by that free: the call returns into its code, just past its
	 * probe (a delete's call of its free is among its first
	 * instructions). Not a later free whose caller left the old slot in
	 * place (a constructor's free, then main's). */
	return !bpf_probe_read_user(&ra, sizeof(ra), (void *)sp) &&
	       ra - cur->free_ip < FREE_CALL_MAX;
}

/*
 * Processes that map memtrail's preload shim (`--preload`, issue 22), by
 * tgid: the offset from the thread pointer (fs base) of the shim's
 * thread-local state, plus one (0 is no entry): first its flag, set while
 * a real allocator call runs, then its buffered frees (MT_SHIM_COUNT_OFF). The shim's constructor gives it (MT_SHIM_HELLO); a fork
 * copies it, an exec or the exit drops it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_MAX_PROCS);
	__type(key, __u32);
	__type(value, __u64);
} shim_procs SEC(".maps");

/* The preload shim's flag in the current thread's TLS: 0 outside real
 * allocator calls, set inside one, MT_SHIM_OWN while the shim works for
 * itself (its ring path's unwinder, issue 22). */
#define MT_SHIM_OWN 2
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

/* Whether a syscall of the thread in cur is the allocator's own: made
 * inside an allocator call (or a free), the shim's included. */
static __always_inline bool allocator_owns(struct inflight *cur)
{
	return cur && (cur->depth > 0 || in_free(cur) || in_shim_allocator());
}

/* Whether the current thread is inside an allocator call. */
static __always_inline bool in_allocator(void)
{
	return allocator_owns(current_call());
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
struct mt_free_batch _mt_free_batch = {};
enum mt_free_batch_slots _mt_free_batch_slots = MT_FREE_BATCH_SMALL;
struct mt_stack_record _mt_stack_record = {};
struct mt_unwind_row _mt_unwind_row = {};
struct mt_unwind_image _mt_unwind_image = {};
struct mt_py_image _mt_py_image = {};
struct mt_py_code_record _mt_py_code_record = {};
enum mt_unwind_cfa _mt_unwind_cfa = MT_CFA_NONE;
enum mt_unwind_rbp _mt_unwind_rbp = MT_RBP_SAME;
enum mt_unwind_flags _mt_unwind_flags = MT_ROW_ALLOC_WRAPPER;
enum mt_stack_end _mt_stack_end = MT_END_COMPLETE;
enum mt_request _mt_request = MT_REQ_IMAGE;
enum mt_unwind_mode _mt_unwind_mode = MT_UNWIND_AUTO;
struct mt_mapping_record _mt_mapping_record = {};
struct mt_region_event _mt_region_event = {};
struct mt_rss_event _mt_rss_event = {};
enum mt_prot _mt_prot = 0;
enum mt_kind _mt_kind = 0;
enum mt_flags _mt_flags = 0;
enum mt_cookie_layout _mt_cookie_layout = 0;
enum mt_cookie_flags _mt_cookie_flags = 0;
enum mt_return_cookie _mt_return_cookie = 0;
enum mt_site_hits _mt_site_hits = 0;
enum mt_ring _mt_ring = 0;
enum mt_usdt_reg _mt_usdt_reg = 0;

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

/* The events ring this CPU writes: its own with cpu_rings, else the one
 * shared ring; NULL if userspace inserted none there. */
static __always_inline void *events_ring(void)
{
	__u32 idx = cpu_rings ? bpf_get_smp_processor_id() : 0;

	return bpf_map_lookup_elem(&event_rings, &idx);
}

static __always_inline void *reserve(void *ring, __u64 size)
{
	void *rec;

	if (!ring) {
		__sync_fetch_and_add(&drops_events, 1);
		return NULL;
	}
	rec = bpf_ringbuf_reserve(ring, size, 0);

	if (!rec)
		__sync_fetch_and_add(&drops_events, 1);
	return rec;
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

/* Events rings userspace made (one, or one per CPU). */
const volatile __u32 event_ring_count = 1;

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

/* The clock reading a record is stamped with when the caller takes it
 * before reserving: with stamp_reserved every record is stamped after it is
 * reserved instead (fill_header_at), for the merge's sake. */
static __always_inline __u64 clock_before(void)
{
	return stamp_reserved ? 0 : bpf_ktime_get_ns();
}

static __always_inline void fill_header_at(struct mt_header *hdr, __u64 ts,
					    __u64 pid_tgid, __u16 kind, __u16 flags)
{
	/* With stamp_reserved: after the reservation, so that a record
	 * reserved after the merge looked at a ring is stamped after that
	 * look. */
	hdr->ts_ns = stamp_reserved ? bpf_ktime_get_ns() : ts;
	hdr->pid = pid_tgid >> 32;
	hdr->tid = (__u32)pid_tgid;
	hdr->kind = kind;
	hdr->flags = flags;
	hdr->_pad = 0;
}

static __always_inline void fill_header(struct mt_header *hdr, __u64 pid_tgid,
					 __u16 kind, __u16 flags)
{
	fill_header_at(hdr, clock_before(), pid_tgid, kind, flags);
}

/* An event record stamped ts (0: see event_clock). */
static __always_inline void emit_event(__u64 ts, __u64 pid_tgid, __u16 kind,
					__u16 flags, __u64 addr, __u64 size,
					__u64 old_addr, __u64 aux)
{
	void *ring = events_ring();
	struct mt_alloc_event *e = reserve(ring, sizeof(*e));

	if (!e)
		return;
	fill_header_at(&e->hdr, ts, pid_tgid, kind, flags);
	e->addr = addr;
	e->size = size;
	e->old_addr = old_addr;
	e->aux = aux;
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	check_pressure(ring, MT_RING_EVENTS, watermark_events, &hwm_events);
}

/* A memory syscall's record (old_size: mremap's, in the aux field). */
static __always_inline void emit_alloc(__u64 pid_tgid, __u16 kind, __u16 flags,
					__u64 addr, __u64 size, __u64 old_addr,
					__u64 old_size)
{
	emit_event(clock_before(), pid_tgid, kind, flags, addr, size, old_addr,
		   old_size);
}

static __always_inline __u64 mix(__u64 h, __u64 v)
{
	h ^= v;
	h *= 0xff51afd7ed558ccdULL;
	return h ^ (h >> 33);
}

/*
 * Unwinding. A stack is walked in the program, frame by frame, from the
 * allocator call's entry up to the outermost frame or --stack-depth:
 *
 * - Each frame's address must fall in an executable mapping of the process
 *   (bpf_find_vma; the mapping of the previous frame is remembered, so a
 *   run of frames in one image looks once): a return address elsewhere (a
 *   heap pointer a frame-pointer step took for one) ends the walk instead of
 *   splitting one site into many stacks (issue 16).
 * - The mapping's file names its image's unwind table (`unwind_images`,
 *   loaded by userspace while the attach hold keeps the image's code from
 *   running): its rows, sorted by address in `unwind_rows`, are searched
 *   for the frame's address (a return address minus one: the call, which a
 *   noreturn call at a function's end would otherwise place in the next
 *   function). The row gives the CFA (rsp or rbp plus an offset, or the
 *   PLT's expression), the return address at CFA - 8 and where the caller's
 *   rbp was saved.
 * - Where the image has no table, or its table no row for the address,
 *   --unwind auto takes a frame-pointer step, as libunwind does (the frame
 *   without a row is marked MT_FP_STEP_FRAME, issue 41); where a rule BPF
 *   does not evaluate covers the address, and with --unwind dwarf, the
 *   walk stops there (never a made-up caller); --unwind fp always takes
 *   frame-pointer steps.
 * - A stack that began on another ends MT_END_STACK_SWITCH: at a return
 *   address no call returns to (a coroutine's trampoline), or where an
 *   rbp-based rule puts the caller's frame below the frame's (issue 41).
 * - The signal trampoline's row (__restore_rt) takes the interrupted
 *   registers from the ucontext the kernel saved: the walk goes on through
 *   a signal handler into the code it interrupted. That frame's address is
 *   the interrupted instruction itself, not a return address, so it is
 *   recorded plus one (userspace symbolizes every frame minus one).
 *
 * The walk's state lives in `struct unwind_walk` on the program's stack
 * (bpf_loop callbacks receive it by pointer); the loops are bpf_loop
 * callbacks, each verified once, so the walk's size is not the verifier's
 * problem. Every walk also hashes the frames it keeps.
 */

/*
 * The unwind tables of all images share one array of slots that grows (issue
 * 23): shards of MT_UNWIND_SHARD slots, shard 0 `unwind_rows`, shard s > 0
 * at `unwind_shards[s - 1]`, made by userspace as the tables grow (a
 * BPF_F_MMAPABLE array written through its mapping) and inserted before any
 * image entry leads to them. A slot holds a row, or an entry of an image's
 * page index: the row index a page starts at, in its `pc`. An image's slots
 * are contiguous in the slot index, whatever shards they span.
 */
#define MT_UNWIND_SHARD_SHIFT 20
#define MT_UNWIND_SHARD (1 << MT_UNWIND_SHARD_SHIFT)
/* Shards past the first: 2^30 slots in all (8 GiB of tables). */
#define MT_UNWIND_SHARDS 1023
/* Binary search steps: enough for a page's rows, whatever their number
 * (a page's rows are usually a few dozen: the search ends after 5 or 6). */
#define MT_UNWIND_SEARCH 21
#define VM_EXEC 0x4
/* Retries of a mapping look-up that found the mmap lock taken. */
#define MT_FIND_VMA_TRIES 8
#define EBUSY 16

struct unwind_shard {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, MT_UNWIND_SHARD);
	__type(key, __u32);
	__type(value, struct mt_unwind_row);
};

struct unwind_shard unwind_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MT_UNWIND_SHARDS);
	__type(key, __u32);
	__array(values, struct unwind_shard);
} unwind_shards SEC(".maps");

/* Slot idx of the unwind tables' array, NULL past its shards. */
/* Not inlined: its temporaries would sit in mt_find_row's frame three times
 * over, past the stack budget (scripts/check-bpf-stack.sh). The two
 * look-ups stay two calls (the barrier): merged into one call of either
 * map, as clang made them, the verifier inlined neither, and every row read
 * was a helper call (issue 22: array_map_lookup_elem was 5 % of a node
 * program's time under memtrail). Apart, both are inlined (a shard's too:
 * one inner map type per call). */
static __noinline struct mt_unwind_row *unwind_slot(__u32 idx)
{
	__u32 shard = idx >> MT_UNWIND_SHARD_SHIFT;
	__u32 at = idx & (MT_UNWIND_SHARD - 1);
	struct mt_unwind_row *row;
	void *inner;

	if (!shard) {
		row = bpf_map_lookup_elem(&unwind_rows, &at);
		barrier_var(row);
		return row;
	}
	shard--;
	inner = bpf_map_lookup_elem(&unwind_shards, &shard);
	return inner ? bpf_map_lookup_elem(inner, &at) : NULL;
}

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1 << 12);
	__type(key, struct image_id);
	__type(value, struct mt_unwind_image);
} unwind_images SEC(".maps");

/* --unwind, set before load. */
const volatile __u32 unwind_mode = MT_UNWIND_AUTO;

/*
 * The rules binary searches found lately, so that a frame seen before takes
 * one look-up instead of a search (issue 22: the search was most of a
 * frame's cost): a direct-mapped cache from a frame's place in the tables
 * to its row's rule. The place is the slot of the frame's page in its
 * image's page index and the address's offset in that page (a page's slot
 * is its image's alone: 30 + 12 bits that name one address of one image);
 * a bijection of those 42 bits gives the entry's slot (its low 16 bits) and
 * its tag (the other 26), so an entry whose tag is the frame's was made
 * for the frame's own address and image, and holds the rule the search
 * found for it (the row's CFA offset, kind and rbp offset: its upper 32
 * bits): MT_ROW_CACHE_VALID | tag << 32 | rule. Words are written and read
 * whole (8 bytes, aligned: never torn), and a table's slots never change
 * while any walk can reach them. Addresses past the last page of their
 * image (the search's last row) are not cached. (Before, an entry was an
 * address and a row index, checked against the page's rows: three reads
 * of the tables a frame, the page index's two and the row's.)
 *
 * Slots are reused (issue 23): userspace releases the table of an image no
 * process maps any more, and only then, in this order: it deletes the
 * image's `unwind_images` entry; waits for an RCU grace period (every
 * program that could have copied the entry has returned); empties
 * `code_maps` (copies made before the delete); waits again (no program
 * still holds such a copy, so none reads or writes the slots or cache
 * entries naming them); clears the cache (through this map's mapping);
 * and only then writes the slots again for another image. A walk that
 * raced the release lost its table before its slots changed: it ends, or
 * takes frame-pointer steps, as in an image without a table, never reading
 * another image's rows.
 */
#define MT_ROW_CACHE (1 << 16)
#define MT_ROW_CACHE_VALID (1ULL << 63)
#define MT_ROW_CACHE_PLACE ((1ULL << 42) - 1)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, MT_ROW_CACHE);
	__type(key, __u32);
	__type(value, __u64);
} row_cache SEC(".maps");

/* Tests set 1 (MEMTRAIL_FAULT=one-row-cache-slot): the bijection becomes a
 * rotation that slots a place by its page slot's high bits, so that every
 * frame of an image (16k pages of tables) contends for one entry, and the
 * tag (the rest of the place) must tell them apart. */
const volatile __u32 row_cache_crowd = 0;

/* The bijection of a place (< 2^42): its entry's slot in the low 16 bits,
 * its tag above. */
static __always_inline __u64 row_cache_spread(__u64 x)
{
	if (row_cache_crowd)
		return (x >> 26 | x << 16) & MT_ROW_CACHE_PLACE;
	x ^= x >> 21;
	x = (x * 0x9e3779b97f4a7c15ULL) & MT_ROW_CACHE_PLACE;
	return x ^ (x >> 21);
}

/*
 * The executable mappings walks of a process found lately, so that most
 * frames need no bpf_find_vma (which costs 0.3-0.6 us, and fails while
 * another thread of the process holds its mmap lock to map or unmap, as
 * starting threads do: their stacks would end early). A process's entry is
 * dropped when it unmaps part of a cached mapping, maps code or execs, and
 * every entry when userspace releases an unwind table (see `row_cache`).
 * Threads of a process share the entry without a lock; a slot is emptied
 * (end = 0) before it is rewritten, and a reader that raced the rewrite
 * may take a half-written mapping (only while new mappings are met).
 */
#define MT_CODE_MAPS 4

struct code_map {
	__u64 start;
	__u64 end;
	__u64 shift; /* table address = pc - shift */
	__u32 pages;
	__u32 npages; /* 0: no table */
	__u32 base_page;
	__u32 py; /* the image is a Python interpreter (py_images) */
};

struct code_maps {
	struct code_map m[MT_CODE_MAPS];
	__u32 next;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_MAX_PROCS);
	__type(key, __u32);
	__type(value, struct code_maps);
} code_maps SEC(".maps");

/* A process's first entry. */
static const struct code_maps no_code_maps = {};

/* Drops tgid's cached mappings if [addr, addr + len) touches one. */
static __always_inline void forget_code_maps(__u32 tgid, __u64 addr, __u64 len)
{
	struct code_maps *cm = bpf_map_lookup_elem(&code_maps, &tgid);

	if (!cm)
		return;
	for (int i = 0; i < MT_CODE_MAPS; i++) {
		if (addr < cm->m[i].end && addr + len > cm->m[i].start) {
			bpf_map_delete_elem(&code_maps, &tgid);
			return;
		}
	}
}

/*
 * The walking thread's stack, read a window at a time (issue 22): a user
 * memory read costs ~0.1 us whatever its size (most of it the helper's
 * fixed cost), and a walk made one or two for each of its frames, each a
 * word or two just above the previous frame's. A walk's reads of the
 * return address at its start and of each frame's saved rbp and return
 * address now come from a window read at the first of them that falls
 * outside it, up to the end of that address's page and never past it (so
 * a window read fails only where a read of the word itself would: same
 * page, same protection and presence). The window is the walk's own: the
 * walk claims one when it starts (mt_stack_window: a free one, the thread
 * id's, taken by compare-and-swap, emptied) and gives it back when it ends,
 * so a word is never taken from another walk's reads, whatever the stack
 * held then, nor from a window another thread is filling. A walk that
 * finds its window taken (another thread of the same id modulo
 * MT_STACK_WINDOWS is walking) reads each word directly.
 */
#define MT_STACK_WINDOW (1 << PAGE_SHIFT)
#define MT_STACK_WINDOWS 1024
#define MT_NO_WINDOW 0xffff

struct stack_window {
	__u64 owner; /* the walking thread's id, 0: free */
	__u64 lo;    /* user address of bytes[0] */
	__u64 len;   /* bytes of the window read, 0: none */
	__u8 bytes[MT_STACK_WINDOW];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MT_STACK_WINDOWS);
	__type(key, __u32);
	__type(value, struct stack_window);
} stack_windows SEC(".maps");

/* Window index mask; tests set 0 (MEMTRAIL_FAULT=one-stack-window) so that
 * every thread contends for one window. */
const volatile __u32 stack_window_mask = MT_STACK_WINDOWS - 1;

/* A window for the current thread's walk, claimed and emptied;
 * MT_NO_WINDOW if its window is taken. A global function: its frame stays
 * off the walk's deepest chain. */
__noinline __u32 mt_stack_window(void)
{
	__u64 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 idx = tid & stack_window_mask;
	struct stack_window *sw = bpf_map_lookup_elem(&stack_windows, &idx);

	if (!sw || __sync_val_compare_and_swap(&sw->owner, 0, tid) != 0)
		return MT_NO_WINDOW;
	sw->len = 0;
	return idx;
}

/* Gives window win back (the walk that claimed it ends). */
__noinline int mt_stack_window_done(__u32 win)
{
	struct stack_window *sw = NULL;

	if (win < MT_STACK_WINDOWS)
		sw = bpf_map_lookup_elem(&stack_windows, &win);
	if (sw)
		sw->owner = 0; /* only its owner writes a claimed window */
	return 0;
}

/* A frame of the frame-pointer chain: the caller's saved frame pointer,
 * then the return address into the caller's caller. */
struct user_frame {
	__u64 next;
	__u64 ret;
};

/*
 * Reads the user word at addr into out->next (pair: the two words at addr
 * into out->next and out->ret) through window win of the walk; 0 on
 * success, else the read's error (as bpf_probe_read_user of the words
 * themselves). A global function, verified once.
 */
__noinline int mt_stack_read(__u32 win, __u64 addr, __u32 pair, struct user_frame *out)
{
	__u64 size = pair ? 16 : 8;
	struct stack_window *sw = NULL;
	__u64 off, room;

	if (!out)
		return -1;
	if (win < MT_STACK_WINDOWS && !(addr & 7))
		sw = bpf_map_lookup_elem(&stack_windows, &win);
	if (!sw)
		return bpf_probe_read_user(out, size, (void *)addr);
	off = addr - sw->lo;
	if (addr < sw->lo || off + size > sw->len) {
		/* A new window at addr, to the end of its page. */
		room = (1 << PAGE_SHIFT) - (addr & ((1 << PAGE_SHIFT) - 1));
		if (room > MT_STACK_WINDOW)
			room = MT_STACK_WINDOW;
		sw->len = 0;
		if (room < size || bpf_probe_read_user(sw->bytes, room, (void *)addr))
			return bpf_probe_read_user(out, size, (void *)addr);
		sw->lo = addr;
		sw->len = room;
		off = 0;
	}
	if (off > MT_STACK_WINDOW - 16) { /* never, once the above held */
		if (pair || off > MT_STACK_WINDOW - 8)
			return bpf_probe_read_user(out, size, (void *)addr);
		out->next = *(__u64 *)(sw->bytes + off);
		return 0;
	}
	out->next = *(__u64 *)(sw->bytes + off);
	if (pair)
		out->ret = *(__u64 *)(sw->bytes + off + 8);
	return 0;
}

struct unwind_walk {
	__u64 pc; /* the frame's address */
	__u64 sp; /* rsp in that frame (the CFA of the frame below) */
	__u64 bp; /* rbp in that frame, 0 when not recoverable */
	__u64 h;
	struct mt_stack_record *rec; /* where frames go, NULL on the hashing walk */
	/* The executable mapping of the last frame looked up, and its image's
	 * table. */
	struct code_map map;
	__u16 n;
	__u16 win;   /* the walk's stack window (stack_windows), MT_NO_WINDOW */
	__u16 end;   /* enum mt_stack_end */
	__u8 exact;  /* pc is an interrupted instruction, not a return address */
	__u8 py;     /* a frame was in a Python interpreter's code */
};

/*
 * Always 0, but a variable the verifier cannot see the value of (.bss, as
 * walk_first_frame below). The walk's state written with constants (a
 * step clearing `exact`, each reason a walk ends) made the verifier enter
 * unwind_step again for every constant that could reach the next step's
 * state, 51 times before its states converged: alloc_enter's verification
 * processed 39,534 instructions. Written through walk_zero (walk_end, and
 * `exact = walk_zero`), 10,804, in a fifth of the time.
 */
__u8 walk_zero = 0;

/* Ends the walk, for reason why (enum mt_stack_end). */
#define walk_end(w, why) ((w)->end = walk_zero + (why))

struct unwind_search {
	__u32 lo;
	__u32 hi;
	__u32 key;
	/* The page's first row (lo before the search), in the padding. */
	__u32 first;
};

/* One step of the search for the first row above key in [lo, hi). */
static long search_step(__u64 i, void *data)
{
	struct unwind_search *s = data;
	struct mt_unwind_row *row;
	__u32 mid;

	if (s->lo >= s->hi)
		return 1;
	mid = s->lo + (s->hi - s->lo) / 2;
	row = unwind_slot(mid);
	if (!row)
		return 1;
	if (row->pc <= s->key)
		s->lo = mid + 1;
	else
		s->hi = mid;
	return 0;
}

/* mt_find_code's look-up, on its stack (bpf_find_vma's data must be). */
/*
 * Python interpreters (issue 25). Userspace names the images that are
 * CPython interpreters (3.11+: the python executable or libpython) with
 * _PyRuntime's place and the offsets the walk reads, by file identity in
 * py_images; the mapping look-up below flags its code in code_maps. A
 * walk that went through such code then walks the thread's Python frames
 * (mt_py_walk), and the first one of a process gives it its entry in
 * py_procs, with _PyRuntime's address there.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct image_id);
	__type(value, struct mt_py_image);
} py_images SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_MAX_PROCS);
	__type(key, __u32);
	__type(value, struct mt_py_image);
} py_procs SEC(".maps");

/* Python frames in stacks; --native-only clears it before load. */
const volatile __u32 python_frames = 1;

struct code_find {
	__u32 tgid; /* the process: its key in code_maps */
	__u32 end;  /* MT_END_COMPLETE: the mapping is code, and cached */
};

/* Caches the executable mapping bpf_find_vma found, with its image's table,
 * in the process's code_maps entry. */
static long cache_code_vma(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct code_find *f = data;
	struct mt_unwind_image *img = NULL;
	struct image_id id = {};
	struct code_maps *cm;
	struct code_map *slot;
	struct file *file;

	if (!(vma->vm_flags & VM_EXEC)) {
		f->end = MT_END_NOT_CODE;
		return 0;
	}
	file = vma->vm_file;
	if (file) { /* code without a file (JIT, vDSO) has no table */
		id.ino = file->f_inode->i_ino;
		id.dev = file->f_inode->i_sb->s_dev;
		img = bpf_map_lookup_elem(&unwind_images, &id);
	}
	cm = bpf_map_lookup_elem(&code_maps, &f->tgid);
	if (!cm) {
		bpf_map_update_elem(&code_maps, &f->tgid, &no_code_maps, BPF_NOEXIST);
		cm = bpf_map_lookup_elem(&code_maps, &f->tgid);
		if (!cm) {
			f->end = MT_END_BUSY; /* no room to keep it */
			return 0;
		}
	}
	slot = &cm->m[cm->next++ % MT_CODE_MAPS];
	slot->end = 0; /* no reader takes the slot while it changes */
	barrier();
	slot->start = vma->vm_start;
	slot->pages = 0;
	slot->npages = 0;
	slot->base_page = 0;
	slot->shift = 0;
	/* A Python interpreter's code: walks through it look for Python
	 * frames (mt_py_walk). */
	slot->py = file && python_frames && bpf_map_lookup_elem(&py_images, &id);
	if (img) {
		slot->pages = img->pages;
		slot->npages = img->npages;
		slot->base_page = img->base_page;
		/* image address = pc - vm_start + file offset of vm_start + bias */
		slot->shift = vma->vm_start - (vma->vm_pgoff << PAGE_SHIFT) - img->bias;
	}
	barrier();
	slot->end = vma->vm_end;
	f->end = MT_END_COMPLETE;
	return 0;
}

/*
 * The executable mapping of the current process holding pc, copied into
 * *m: MT_END_COMPLETE if there is one, else why a walk ends there. Looked
 * for among the mappings walks of the process found lately, else looked
 * up (bpf_find_vma) and cached. A global function, verified once on its
 * own: written out in the walk, each bpf_find_vma call (one per retry) had
 * its callback verified again for every state of the walk that reached it,
 * which was most of the load time. (The mapping found goes through
 * code_maps: bpf_find_vma writes only into this function's own stack.)
 */
__noinline int mt_find_code(__u64 pc, struct code_map *m)
{
	struct code_find f = { .tgid = bpf_get_current_pid_tgid() >> 32, .end = MT_END_NOT_CODE };
	struct code_maps *cm;
	long err;
	int round;

	if (!m)
		return MT_END_NOT_CODE;
	m->end = 0; /* nothing kept, unless found */
	/* Round 0 looks in the cache; round 1 again, after a look-up cached
	 * the mapping (unless another thread took its slot in between: rare,
	 * and the walk ends as if the look-up had failed). */
	for (round = 0; round < 2; round++) {
		cm = bpf_map_lookup_elem(&code_maps, &f.tgid);
		for (int i = 0; cm && i < MT_CODE_MAPS; i++) {
			if (pc >= cm->m[i].start && pc < cm->m[i].end) {
				*m = cm->m[i];
				return MT_END_COMPLETE;
			}
		}
		if (round)
			return MT_END_BUSY;
		err = bpf_find_vma(bpf_get_current_task_btf(), pc, cache_code_vma, &f, 0);
		/* The mmap lock was contended (another thread maps or unmaps,
		 * as starting threads do): try a few more times. */
		for (int t = 0; t < MT_FIND_VMA_TRIES && err == -EBUSY; t++)
			err = bpf_find_vma(bpf_get_current_task_btf(), pc, cache_code_vma, &f, 0);
		if (err == -EBUSY)
			return MT_END_BUSY;
		if (err || f.end != MT_END_COMPLETE)
			return err ? MT_END_NOT_CODE : f.end;
	}
	return MT_END_BUSY;
}

/* Whether the walk's pc is in an executable mapping; sets end if not. */
static __always_inline bool in_code(struct unwind_walk *w)
{
	int end;

	if (w->pc >= w->map.start && w->pc < w->map.end)
		return true;
	end = mt_find_code(w->pc, &w->map);
	if (end) {
		w->end = end;
		return false;
	}
	return true;
}

/* A frame-pointer step: the frame's rbp points at the caller's saved rbp,
 * then the return address. False (with end set) when the chain ends. */
static __always_inline bool fp_step(struct unwind_walk *w, __u16 why,
				    struct user_frame *frame)
{
	if (w->bp < w->sp || (w->bp & 7)) {
		walk_end(w, why);
		return false;
	}
	if (mt_stack_read(w->win, w->bp, 1, frame)) {
		walk_end(w, MT_END_UNREADABLE);
		return false;
	}
	w->sp = w->bp + 16;
	w->bp = frame->next;
	w->pc = frame->ret;
	w->exact = walk_zero;
	return true;
}

/*
 * The row covering key (a pc's offset in the image whose table map gives):
 * its rule (the row's pc is not set). A global function, verified once on
 * its own: inlined in the walk's step, its cache check, look-ups and search
 * multiplied the step's verifier states, and the verifier processed 78,000
 * instructions for alloc_session instead of 30,000 (0.2 s of every start).
 * It takes the map, not the walk: a global function may write any bytes of
 * the memory it is given, so the walk's pointers (rec) would lose their
 * type. The search is an open-coded loop (bpf_repeat): bpf_loop's inlined
 * form spilled 24 bytes more into this frame, past the stack budget.
 */
__noinline int mt_find_row(const struct code_map *map, __u64 key, struct mt_unwind_row *out)
{
	struct unwind_search s;
	struct mt_unwind_row *row;
	__u64 *cached, h = 0, c;
	__u32 idx, page, slot;

	if (!map || !out)
		return false;
	if (key > 0xffffffffULL || (key >> 12) < map->base_page)
		return false; /* below the first row */
	page = (key >> 12) - map->base_page;
	if (page < map->npages) {
		/* The place: the page's slot in the page index, the offset. */
		h = row_cache_spread(((__u64)(map->pages + page) << 12 | (key & 0xfff)) &
				     MT_ROW_CACHE_PLACE);
		slot = h & (MT_ROW_CACHE - 1);
		cached = bpf_map_lookup_elem(&row_cache, &slot);
		if (cached) {
			c = *cached;
			if (c >> 32 == (MT_ROW_CACHE_VALID | h >> 16 << 32) >> 32) {
				*(__u64 *)out = c << 32;
				return true;
			}
		}
		h |= MT_ROW_CACHE_VALID; /* cache what the search finds */
	} else {
		page = map->npages - 1; /* past the last row's page: the last row */
	}
	idx = map->pages + page;
	row = unwind_slot(idx);
	if (!row)
		return false;
	s.first = row->pc;
	row = unwind_slot(idx + 1);
	if (!row)
		return false;
	s.hi = row->pc;
	/* The row holding key is the last one at or below it: in this page, or
	 * the one before the page's first (never another image's: page 0
	 * starts with the image's first row, which is below nothing). */
	s.key = key;
	s.lo = s.first;
	bpf_repeat(MT_UNWIND_SEARCH) {
		if (search_step(0, &s))
			break;
	}
	if (s.lo == s.first && page == 0)
		return false; /* below the first row */
	row = unwind_slot(s.lo - 1);
	if (!row)
		return false;
	*out = *row;
	if (h & MT_ROW_CACHE_VALID) {
		/* Looked up again: a pointer kept across the search costs
		 * stack. */
		slot = h & (MT_ROW_CACHE - 1);
		cached = bpf_map_lookup_elem(&row_cache, &slot);
		if (cached)
			*cached = MT_ROW_CACHE_VALID | (h & ~MT_ROW_CACHE_VALID) >> 16 << 32 |
				  *(__u64 *)out >> 32;
	}
	return true;
}

/* The rule for the walk's frame: its row, or MT_CFA_NONE without one. */
static __always_inline void frame_rule(struct unwind_walk *w, struct mt_unwind_row *row)
{
	if (unwind_mode == MT_UNWIND_FP || !w->map.npages ||
	    !mt_find_row(&w->map, w->pc - (w->exact ? 0 : 1) - w->map.shift, row))
		row->kind = MT_CFA_NONE;
}

/* Moves the walk from its frame to the caller's by the frame's rule; false
 * (with end set) when it cannot. */
static __always_inline bool unwind_frame(struct unwind_walk *w, struct mt_unwind_row *rowp)
{
	const struct mt_unwind_row *row = rowp;
	struct user_frame saved;
	__u64 cfa, ra;
	__s64 cfa_off = row->kind & MT_CFA_OFF_X8 ? (__s64)row->cfa_off * 8 : row->cfa_off;
	__u8 cfa_kind;

	if (unwind_mode == MT_UNWIND_FP)
		return fp_step(w, MT_END_COMPLETE, &saved);
	cfa_kind = row->kind & 0xf;
	switch (cfa_kind) {
	case MT_CFA_RSP:
		cfa = w->sp + cfa_off;
		break;
	case MT_CFA_RSP_FAR:
		cfa = w->sp + 8 * ((__u64)(__u16)row->cfa_off | (__u64)(__u8)row->rbp_off << 16);
		rowp->rbp_off = -16;
		break;
	case MT_CFA_RBP:
		if (!w->bp) {
			walk_end(w, MT_END_UNREADABLE);
			return false;
		}
		cfa = w->bp + cfa_off;
		break;
	case MT_CFA_PLT:
		cfa = w->sp + 8 + ((w->pc & 15) >= (__u64)row->rbp_off ? 8 : 0);
		break;
	case MT_CFA_END:
		walk_end(w, MT_END_COMPLETE);
		return false;
	case MT_CFA_SIGNAL: {
		/* struct ucontext at sp: uc_mcontext at 40, its rbp, rsp and
		 * rip at 80, 120 and 128 past it. */
		__u64 uc = w->sp;

		if (bpf_probe_read_user(&w->bp, 8, (void *)(uc + 120)) ||
		    bpf_probe_read_user(&w->pc, 8, (void *)(uc + 168)) ||
		    bpf_probe_read_user(&w->sp, 8, (void *)(uc + 160))) {
			walk_end(w, MT_END_UNREADABLE);
			return false;
		}
		w->exact = 1;
		return true;
	}
	default:
		/* A frame-pointer step where the image has no table, and with
		 * --unwind auto where its table has no row for the frame (V8's
		 * embedded builtins keep frame pointers, issue 41: unwind_step
		 * marks the frame MT_FP_STEP_FRAME), as libunwind does. Not
		 * through a rule BPF does not evaluate: code with CFI keeps
		 * rbp for data, and the step made up callers (issue 23). */
		if (unwind_mode == MT_UNWIND_DWARF ||
		    (w->map.npages && cfa_kind != MT_CFA_NONE)) {
			walk_end(w, cfa_kind == MT_CFA_UNSUPPORTED ? MT_END_UNSUPPORTED
								      : MT_END_NO_TABLE);
			return false;
		}
		return fp_step(w, MT_END_NO_TABLE, &saved);
	}
	/* The caller's frame is above this one; below it by an rbp-based
	 * rule (the rbp a stack switch saved), it is on another stack. */
	if (cfa <= w->sp || cfa & 7) {
		walk_end(w, cfa_kind == MT_CFA_RBP && !(cfa & 7) ? MT_END_STACK_SWITCH
								  : MT_END_UNREADABLE);
		return false;
	}
	switch ((row->kind & MT_ROW_RBP_MASK) >> 4) {
	case MT_RBP_AT:
		if (row->rbp_off == -16) {
			/* The usual frame: saved rbp right below the return
			 * address, one read for both. */
			if (mt_stack_read(w->win, cfa - 16, 1, &saved)) {
				walk_end(w, MT_END_UNREADABLE);
				return false;
			}
			w->bp = saved.next;
			ra = saved.ret;
			goto done;
		}
		if (mt_stack_read(w->win, cfa + row->rbp_off, 0, &saved)) {
			walk_end(w, MT_END_UNREADABLE);
			return false;
		}
		w->bp = saved.next;
		break;
	case MT_RBP_LOST:
		w->bp = 0;
		break;
	}
	if (mt_stack_read(w->win, cfa - 8, 0, &saved)) {
		walk_end(w, MT_END_UNREADABLE);
		return false;
	}
	ra = saved.next;
done:
	w->sp = cfa;
	w->pc = ra;
	w->exact = walk_zero;
	return true;
}

/*
 * Stores frame n of a stack record. A global function, verified once on
 * its own: the frame's index, which rises every step, stays out of the
 * walk's verifier state, so the walk's loop converges instead of being
 * verified once per frame.
 */
__noinline int mt_store_frame(struct mt_stack_record *rec, __u32 n, __u64 ip)
{
	if (rec && n < MT_MAX_STACK)
		rec->ips[n] = ip;
	return 0;
}

/*
 * Whether the walk's frame, which its image's table has no row for, is a
 * return address at the first instruction of code that has one: no call
 * returns there (pc - 1, the call, is outside every function), so the
 * stack's maker pushed it, as makecontext pushes __start_context at the
 * top of a coroutine's stack (issue 41). *row is the row at pc after.
 */
static __always_inline bool trampoline_frame(struct unwind_walk *w, struct mt_unwind_row *row)
{
	if ((row->kind & 0xf) != MT_CFA_NONE || !w->map.npages || w->exact ||
	    unwind_mode == MT_UNWIND_FP)
		return false;
	if (!mt_find_row(&w->map, w->pc - w->map.shift, row)) {
		row->kind = MT_CFA_NONE;
		return false;
	}
	if ((row->kind & 0xf) == MT_CFA_NONE)
		return false;
	row->kind = MT_CFA_NONE;
	return true;
}

/* Keeps the walk's frame as the last, where its stack began
 * (MT_END_STACK_SWITCH): plus one, the trampoline's own first instruction
 * (userspace symbolizes every frame minus one). */
static __always_inline long stack_switch_frame(struct unwind_walk *w, __u32 n)
{
	if (w->rec)
		mt_store_frame(w->rec, n, w->pc + 1);
	w->h = mix(w->h, w->pc + 1);
	w->n = n + 1;
	walk_end(w, MT_END_STACK_SWITCH);
	return 1;
}

/* One frame: keep the walk's pc if it is code and within the depth, then
 * step to the caller. */
static long unwind_step(__u64 i, void *data)
{
	struct unwind_walk *w = data;
	struct mt_unwind_row row __attribute__((aligned(8))) = {};
	__u32 n = w->n;
	__u64 ip;

	if (!w->pc) {
		walk_end(w, MT_END_COMPLETE);
		return 1;
	}
	if (!in_code(w))
		return 1;
	w->py |= w->map.py;
	if (n >= stack_depth || n >= MT_MAX_STACK) {
		walk_end(w, MT_END_DEPTH);
		return 1;
	}
	frame_rule(w, &row);
	if (trampoline_frame(w, &row))
		return stack_switch_frame(w, n);
	/* The allocator was called by C++ operator new, whose code has no
	 * probe: the stack starts at new's caller. */
	if (n == 0 && (row.kind & MT_ROW_ALLOC_WRAPPER))
		return unwind_frame(w, &row) ? 0 : 1;
	/* Userspace symbolizes every frame minus one (the call of a return
	 * address): an interrupted instruction, and the signal trampoline
	 * (which the kernel made the handler's return address; no call
	 * precedes it), are recorded plus one. */
	ip = w->pc + (w->exact || (row.kind & 0xf) == MT_CFA_SIGNAL);
	/* No row in its image's table: its caller comes by frame pointer. */
	if ((row.kind & 0xf) == MT_CFA_NONE && w->map.npages && unwind_mode == MT_UNWIND_AUTO)
		ip |= MT_FP_STEP_FRAME;
	if (w->rec)
		mt_store_frame(w->rec, n, ip);
	w->h = mix(w->h, ip);
	w->n = n + 1;
	return unwind_frame(w, &row) ? 0 : 1;
}

/*
 * The walk's first frame index: always 0, but a variable the verifier
 * cannot see the value of. Starting from a constant 0, the frame count is
 * a different constant in every step, so the verifier checked unwind_step
 * once per frame up to MT_MAX_STACK (380,000 instructions processed, most
 * of the load time); from an unknown value its states converge after a
 * few steps.
 */
__u32 walk_first_frame = 0;

struct walk_out {
	__u32 nr;
	__u16 end;
	__u8 py; /* the walk went through a Python interpreter's code */
};

/*
 * Walks the user stack of an allocator call at its entry, hashing its
 * frames (seeded with the process id) and, with rec, storing them in its
 * ips. Returns the hash, never 0; out gets the number of frames and why
 * the walk stopped. A global function, verified once on its own for both
 * calls (the hashing walk and the recording one) and with arguments it
 * cannot assume: the two programs that walk stacks load in 0.15 s instead
 * of 0.55 s.
 *
 * At entry the caller's frame is not yet set up past the return address
 * on top of the stack (at sp: the entry's rsp, which a probe moved past a
 * `sub $n,%rsp` finds n bytes above its own): the walk starts there, with
 * the caller's rsp just above it and its rbp still in rbp.
 */
__noinline __u64 walk_stack(struct pt_regs *ctx, __u32 tgid, __u64 sp,
			    struct mt_stack_record *rec, struct walk_out *out)
{
	struct unwind_walk w = {
		.sp = sp + 8,
		.bp = PT_REGS_FP(ctx),
		.h = tgid,
		.rec = rec,
		.n = walk_first_frame,
	};

	if (!ctx || !out)
		return 1;
	w.win = mt_stack_window();
	/* The return address at sp (the window's first word: the walk reads
	 * upwards from there). pc and sp are the 16 bytes the read may
	 * write, of which it writes pc. */
	if (mt_stack_read(w.win, sp, 0, (struct user_frame *)&w.pc))
		w.pc = 0;
	bpf_loop(MT_MAX_STACK + 1, unwind_step, &w, 0);
	mt_stack_window_done(w.win);
	out->nr = w.n;
	out->end = w.end;
	out->py = w.py;
	return w.h ? w.h : 1;
}

/*
 * The Python frames of the current thread (issue 25), appended to a stack
 * after its native frames (MT_PY_FRAME in memtrail.h), hashed with them.
 * The thread's state is the one of the interpreter's threads whose
 * thread_id (its pthread_self(), which glibc makes the thread's fs base)
 * is the current task's fsbase (first looked for as 3.11's GIL holder or
 * 3.12+'s thread-local current state: one read instead of the list's
 * three); its current frame leads the chain of _PyInterpreterFrame
 * through `previous`. An interpreter loop's run ends at
 * its entry frame: 3.11 flags its first frame (is_entry), 3.12+ pushes a
 * shim frame owned by the C stack before it. Frames not started yet
 * (their instruction pointer before the code) are left out.
 */
#define MT_PY_THREADS 256
#define MT_PY_OWNED_BY_CSTACK 3

struct py_walk {
	/* In the process's py_procs entry (not copied: the walk's frames are
	 * at the stack budget). */
	const struct mt_py_offsets *off;
	__u32 tgid;
	__u32 win;  /* the walk's stack window (stack_windows), MT_NO_WINDOW */
	struct mt_stack_record *rec;
	__u64 at;   /* the thread state, then the frame to look at */
	__u64 h;
	__u32 n;
	__u16 found;
	__u16 codes; /* send the records of code objects (py_code_record) */
};

/* The 8-byte word at a user address, 0 if unreadable. */
static __always_inline __u64 py_read(__u64 addr)
{
	__u64 v = 0;

	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		return 0;
	return v;
}

static __always_inline void py_emit(struct py_walk *p, __u64 ip)
{
	if (p->n >= MT_MAX_STACK)
		return;
	if (p->rec)
		mt_store_frame(p->rec, p->n, ip);
	p->h = mix(p->h, ip);
	p->n++;
}

/* The code objects whose record went out, by process and address: the
 * value tells the object at that address from an earlier one. */
struct py_code_key {
	__u64 code;
	__u32 tgid;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct py_code_key);
	__type(value, __u64);
} py_codes SEC(".maps");

/* Copies a compact str object's characters; returns the bytes copied. */
static __always_inline __u32 py_copy_str(const struct mt_py_offsets *off, __u64 obj, __u8 *dst,
					 __u32 *state)
{
	__u64 len = 0, at;
	__u32 st = 0, kind;

	if (bpf_probe_read_user(&len, 8, (void *)(obj + 16)) ||
	    bpf_probe_read_user(&st, 4, (void *)(obj + 32)))
		return 0;
	*state = st;
	kind = (st >> 2) & 7;
	if (!((st >> 5) & 1))
		return 0; /* not compact: no characters in the object */
	if ((st >> 6) & 1) {
		at = obj + off->str_ascii_data;
	} else {
		at = obj + off->str_compact_data;
		len *= kind;
	}
	if (len > MT_PY_NAME)
		len = MT_PY_NAME;
	if (bpf_probe_read_user(dst, len, (void *)at))
		return 0;
	return len;
}

/* Slots of a walk's code objects already looked at (py_code_sent). */
#define MT_PY_CODES_SENT 16

/*
 * The frames of the walking thread's stack, kept as they are walked (issue
 * 22): a new stack's record is copied from them instead of walked a second
 * time. A buffer is the walk's own, as a stack window is (claimed by
 * compare-and-swap on its owner, the thread id's index; never a per-CPU
 * buffer, which a preempted program's successor on that CPU would
 * overwrite). A walk that finds its buffer taken walks a new stack twice.
 */
struct walk_frames {
	__u64 owner; /* the walking thread's id, 0: free */
	struct mt_stack_record rec; /* its ips only */
	/* A code object's pointers, read at once (py_code_words). */
	__u64 code_words[4];
	/* Code objects the codes pass has sent or found sent (py_code_sent). */
	__u64 codes_sent[MT_PY_CODES_SENT];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MT_STACK_WINDOWS);
	__type(key, __u32);
	__type(value, struct walk_frames);
} walk_frames SEC(".maps");

/* The current thread's frame buffer: claimed if claim (NULL if taken),
 * else the one it claimed (NULL if none). Looked up at each use: a pointer
 * kept across the walk costs stack. */
static __noinline struct mt_stack_record *walk_frames_of(bool claim)
{
	__u64 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 idx = tid & stack_window_mask;
	struct walk_frames *f = bpf_map_lookup_elem(&walk_frames, &idx);

	if (!f)
		return NULL;
	if (claim ? __sync_val_compare_and_swap(&f->owner, 0, tid) != 0 : f->owner != tid)
		return NULL;
	return &f->rec;
}

/* Gives the current thread's frame buffer back, if it claimed it. */
static __always_inline void walk_frames_done(void)
{
	struct mt_stack_record *kept = walk_frames_of(false);

	if (kept)
		container_of(kept, struct walk_frames, rec)->owner = 0;
}

/*
 * Whether this walk's codes pass looked at code already (its record sent,
 * or found sent), else notes it: a stack's frames repeat its code objects
 * (python3.11's imports: 22.6 Python frames a new stack, 10.3 distinct
 * code objects), and each look is a read of the object and a lookup. A
 * code object a frame of the walked thread runs stays alive (the frame
 * holds it), so its address names it for the whole walk. The slots are
 * cleared when the pass starts; without a frame buffer, every frame is
 * looked at.
 */
static __always_inline bool py_code_sent(__u64 code)
{
	struct mt_stack_record *kept = walk_frames_of(false);
	__u64 *slot;

	if (!kept)
		return false;
	slot = &container_of(kept, struct walk_frames, rec)
			->codes_sent[(code >> 4 ^ code >> 10) & (MT_PY_CODES_SENT - 1)];
	if (*slot == code)
		return true;
	*slot = code;
	return false;
}

/* Clears the current thread's codes_sent (py_code_sent). */
static __always_inline void py_codes_sent_clear(void)
{
	struct mt_stack_record *kept = walk_frames_of(false);

	if (kept)
		__builtin_memset(container_of(kept, struct walk_frames, rec)->codes_sent, 0,
				 sizeof(((struct walk_frames *)0)->codes_sent));
}

/* A code object's name, file and line table pointers: read at once into
 * the thread's frame buffer where they lie within 32 bytes (every
 * version's layout: filename, name, qualname, linetable, consecutive),
 * else one at a time (no buffer, another layout). */
static __always_inline void py_code_words(const struct mt_py_offsets *o, __u64 code,
					  __u64 *name, __u64 *file, __u64 *table)
{
	__u64 lo = o->code_filename, *w;
	struct mt_stack_record *kept;

	if (o->code_qualname < lo)
		lo = o->code_qualname;
	if (o->code_linetable < lo)
		lo = o->code_linetable;
	kept = walk_frames_of(false);
	if (kept && o->code_filename - lo < 32 && o->code_qualname - lo < 32 &&
	    o->code_linetable - lo < 32 &&
	    !((o->code_filename | o->code_qualname | o->code_linetable) & 7)) {
		w = container_of(kept, struct walk_frames, rec)->code_words;
		if (bpf_probe_read_user(w, 32, (void *)(code + lo))) {
			*name = *file = *table = 0;
			return;
		}
		*name = w[((o->code_qualname - lo) >> 3) & 3];
		*file = w[((o->code_filename - lo) >> 3) & 3];
		*table = w[((o->code_linetable - lo) >> 3) & 3];
		return;
	}
	*name = py_read(code + o->code_qualname);
	*file = py_read(code + o->code_filename);
	*table = py_read(code + o->code_linetable);
}

/*
 * Sends code's record on the stack ring unless it went out already (see
 * struct mt_py_code_record). Only when a stack is recorded, before it: the
 * ring is ordered, so the stack's reader has the names first.
 */
static __noinline void py_code_record(struct py_walk *p, __u64 code)
{
	struct py_code_key key = { .code = code };
	struct mt_py_code_record *r;
	__u64 name = 0, file = 0, table = 0, id, *seen;
	__u32 len;

	if (!p)
		return;
	key.tgid = p->tgid;
	py_code_words(p->off, code, &name, &file, &table);
	id = name ^ file << 1 ^ table << 2;
	seen = bpf_map_lookup_elem(&py_codes, &key);
	if (seen && *seen == id)
		return;
	r = bpf_ringbuf_reserve(&stacks, sizeof(*r), 0);
	if (!r) {
		__sync_fetch_and_add(&drops_stacks, 1);
		return;
	}
	r->zero = 0;
	r->code = code;
	r->pid = p->tgid;
	r->first = 0;
	bpf_probe_read_user(&r->first, 4, (void *)(code + p->off->code_firstlineno));
	r->name_state = 0;
	r->file_state = 0;
	r->name_len = py_copy_str(p->off, name, r->name, &r->name_state);
	r->file_len = py_copy_str(p->off, file, r->file, &r->file_state);
	/* ob_size's low half: a table is far below 4 GiB. */
	if (bpf_probe_read_user(&r->table_len, 4, (void *)(table + 16)))
		r->table_len = 0;
	len = r->table_len;
	if (len > MT_PY_TABLE)
		len = MT_PY_TABLE;
	if (bpf_probe_read_user(r->table, len, (void *)(table + 32)))
		r->table_len = 0;
	bpf_ringbuf_submit(r, submit_flags(MT_RING_STACKS));
	bpf_map_update_elem(&py_codes, &key, &id, BPF_ANY);
}

struct py_word_out;
__noinline int mt_py_word(__u32 win, __u64 addr, struct py_word_out *out);

/* One thread state of the interpreter's list: the thread's, or the next
 * (its words through the walk's window: the thread's state, then its
 * frame pointer, come from one read). */
static long py_thread_step(__u64 i, void *data)
{
	struct py_walk *p = data;
	__u64 v = 0;

	if (!p->at)
		return 1;
	/* The thread's pthread_self(), loaded from the task again each step
	 * (a load, no helper call): a word less on the stack. */
	mt_py_word(p->win, p->at + p->off->tstate_thread_id, (struct py_word_out *)&v);
	if (v == bpf_get_current_task_btf()->thread.fsbase) {
		p->found = 1;
		return 1;
	}
	mt_py_word(p->win, p->at + p->off->tstate_next, (struct py_word_out *)&p->at);
	return 0;
}

/* Bytes of a frame the walk reads at once, from frame_win. */
#define MT_PY_FRAME_READ 72

/* Bytes from a frame's first field read its fields' places may point to,
 * for the verifier (masks, not comparisons: a comparison doubles the
 * frame step's states). */
#define MT_PY_FIELD_REACH 128

/* Bytes below a frame's end a Python window reads (the frames of a
 * thread's data stack lie one above the other, the previous one below):
 * all of its page below it but the last MT_PY_FIELD_REACH of the window's
 * array, so the fields of every frame in the window are within it. */
#define MT_PY_WINDOW (MT_STACK_WINDOW - MT_PY_FIELD_REACH)
/* Bytes below a thread state's words read with them (mt_py_word). */
#define MT_PY_WORD_WINDOW 256

/* The walk's window win when it holds [addr, end) (read now if it did
 * not: a window ending at end, down to `below` bytes below it but never
 * below addr's page, so it fails only where a read of the bytes would),
 * else NULL: no window, an unreadable page. */
static __always_inline struct stack_window *py_window(__u32 win, __u64 addr, __u64 end,
						       __u64 below)
{
	struct stack_window *sw = NULL;
	__u64 n;

	if (win < MT_STACK_WINDOWS && !(addr & 7) && end > addr && end - addr <= below)
		sw = bpf_map_lookup_elem(&stack_windows, &win);
	if (!sw)
		return NULL;
	if (addr >= sw->lo && end <= sw->lo + sw->len)
		return sw;
	/* From addr's page (the bytes may cross into the next one), at most
	 * below. */
	n = end - (addr & ~((1ULL << PAGE_SHIFT) - 1));
	if (n > below)
		n = below;
	sw->len = 0;
	if (bpf_probe_read_user(sw->bytes, n, (void *)(end - n)))
		return NULL;
	sw->lo = end - n;
	sw->len = n;
	return sw;
}

/* One user word, as the walk reads a thread state's. */
struct py_word_out {
	__u64 v;
};

/* The 8-byte word at user address addr through window win; 0 if
 * unreadable (as py_read). A global function, verified once. */
__noinline int mt_py_word(__u32 win, __u64 addr, struct py_word_out *out)
{
	struct stack_window *sw;
	__u64 off;

	if (!out)
		return -1;
	out->v = 0;
	sw = py_window(win, addr, addr + 8, MT_PY_WORD_WINDOW);
	if (!sw)
		return bpf_probe_read_user(&out->v, 8, (void *)addr);
	off = addr - sw->lo;
	barrier_var(off);
	if (off > MT_STACK_WINDOW - 8) /* never, once the above held */
		return bpf_probe_read_user(&out->v, 8, (void *)addr);
	out->v = *(__u64 *)(sw->bytes + off);
	return 0;
}

/* A frame's fields, wherever they were read: its word of the stack (none
 * for one not started yet), then an entry frame's group end. */
static __always_inline void py_frame_emit(struct py_walk *p, __u64 code, __u64 instr, __u8 owner,
					  __u8 entry)
{
	__u64 start, off;

	if (owner == MT_PY_OWNED_BY_CSTACK) {
		py_emit(p, MT_PY_FRAME);
		return;
	}
	start = code + p->off->code_adaptive;
	if (code && instr >= start) {
		off = (instr - start) / 2;
		if (off > MT_PY_OFF_MAX)
			off = MT_PY_OFF_MAX;
		py_emit(p, MT_PY_FRAME | off << MT_PY_OFF_SHIFT | (code & MT_PY_CODE_MASK));
	}
	if (entry)
		py_emit(p, MT_PY_FRAME);
}

/* A frame's fields: the previous frame, code, instruction, owner and
 * whether it is an entry frame (3.11). */
struct py_frame_fields {
	__u64 previous;
	__u64 code;
	__u64 instr;
	__u8 owner;
	__u8 entry;
	__u8 _pad[6];
};

/* The fields of the frame at user address frame, read directly, a field
 * at a time: without a window (another thread of the walk's window index
 * is walking). 0 on success. A global function, verified once (inline, it
 * doubled the program's verification), with no buffer of its own (the
 * stack budget). */
__noinline int mt_py_frame_direct(__u64 frame, const struct mt_py_offsets *o,
				  struct py_frame_fields *f)
{
	if (!o || !f)
		return -1;
	f->entry = 0;
	if (bpf_probe_read_user(&f->previous, 8, (void *)(frame + o->frame_previous)) ||
	    bpf_probe_read_user(&f->code, 8, (void *)(frame + o->frame_code)) ||
	    bpf_probe_read_user(&f->instr, 8, (void *)(frame + o->frame_instr)) ||
	    bpf_probe_read_user(&f->owner, 1, (void *)(frame + o->frame_owner)) ||
	    (o->frame_is_entry != MT_PY_NONE &&
	     bpf_probe_read_user(&f->entry, 1, (void *)(frame + o->frame_is_entry))))
		return -1;
	return 0;
}

/*
 * Where the span bytes at user address addr lie in the walk's window win
 * (read now if it did not hold them, as py_window): their offset in its
 * bytes, at most MT_STACK_WINDOW - MT_PY_FRAME_READ; -1 without one. A
 * global function, verified once (inline, its branches multiplied the
 * frame step's states: the program took seconds to load).
 */
__noinline long mt_py_window_at(__u32 win, __u64 addr, __u32 span)
{
	struct stack_window *sw;
	__u64 off;

	if (!span || span > MT_PY_FRAME_READ)
		return -1;
	sw = py_window(win, addr, addr + span, MT_PY_WINDOW);
	if (!sw)
		return -1;
	off = addr - sw->lo;
	if (off > MT_STACK_WINDOW - MT_PY_FRAME_READ) /* never, once the above held */
		return -1;
	return off;
}

/* Where a field at frame offset at lies in the frame's bytes (from
 * frame_win; userspace keeps each within MT_PY_FRAME_READ, the pointers
 * 8-aligned), masked within MT_PY_FIELD_REACH. */
#define MT_PY_WORD_AT(o, at) (((at) - (o)->frame_win) & 0x78)
#define MT_PY_BYTE_AT(o, at) (((at) - (o)->frame_win) & 0x7f)

/*
 * Where the frame at user address frame lies in the walk's window win: the
 * offset of its bytes from frame_win (fields at MT_PY_WORD_AT,
 * MT_PY_BYTE_AT), read now if the window did not hold them; -1 without a
 * window. The window holds the frames below it too (one read for several
 * frames: each user read costs, and a walk reads every frame of the thread
 * at every allocation, perf/python_frames.sh). A global function, verified
 * once for both passes' steps.
 */
__noinline long mt_py_frame_at(__u32 win, __u64 frame, const struct mt_py_offsets *o)
{
	struct stack_window *sw = NULL;
	__u64 addr;
	__u32 span;
	long off;

	if (!o)
		return -1;
	span = o->frame_span;
	if (span > MT_PY_FRAME_READ)
		span = MT_PY_FRAME_READ;
	addr = frame + o->frame_win;
	if (win < MT_STACK_WINDOWS)
		sw = bpf_map_lookup_elem(&stack_windows, &win);
	if (!sw)
		return -1;
	/* Most frames are in the window already (the previous frame's). */
	if (addr >= sw->lo && addr + span <= sw->lo + sw->len)
		return addr - sw->lo;
	off = mt_py_window_at(win, addr, span);
	return off < 0 ? -1 : off;
}

/* The bytes of the frame at user address frame in the walk's window
 * (mt_py_frame_at), NULL without one. */
static __always_inline __u8 *py_frame_bytes(struct py_walk *p, __u64 frame)
{
	struct stack_window *sw;
	__u32 win = p->win;
	long off;

	off = mt_py_frame_at(win, frame, p->off);
	barrier_var(off); /* clang knows its range; the verifier does not */
	if (off < 0 || off > MT_STACK_WINDOW - MT_PY_FIELD_REACH)
		return NULL;
	sw = bpf_map_lookup_elem(&stack_windows, &win);
	return sw ? sw->bytes + off : NULL;
}

/* One _PyInterpreterFrame: its code and instruction, then the previous. */
static long py_frame_step(__u64 i, void *data)
{
	struct py_walk *p = data;
	const struct mt_py_offsets *o = p->off;
	struct py_frame_fields f;
	__u64 frame = p->at;
	__u8 *b;

	if (!frame || p->n >= MT_MAX_STACK)
		return 1;
	p->at = 0;
	b = py_frame_bytes(p, frame);
	if (b) {
		f.previous = *(__u64 *)(b + MT_PY_WORD_AT(o, o->frame_previous));
		f.code = *(__u64 *)(b + MT_PY_WORD_AT(o, o->frame_code));
		f.instr = *(__u64 *)(b + MT_PY_WORD_AT(o, o->frame_instr));
		f.owner = b[MT_PY_BYTE_AT(o, o->frame_owner)];
		f.entry = o->frame_is_entry != MT_PY_NONE && b[MT_PY_BYTE_AT(o, o->frame_is_entry)];
	} else if (mt_py_frame_direct(frame, o, &f)) {
		return 1;
	}
	p->at = f.previous;
	py_frame_emit(p, f.code, f.instr, f.owner, f.entry);
	return 0;
}

/* One _PyInterpreterFrame of the codes pass: its code object's record
 * (py_code_record), then the previous frame. Its fields come from the
 * walk's window as the frame pass's do (read a field at a time, they made
 * this pass nine times as costly as the frame pass on python3.11 imports);
 * without a window, a field at a time, in registers (the stack budget). */
static long py_code_step(__u64 i, void *data)
{
	struct py_walk *p = data;
	const struct mt_py_offsets *o = p->off;
	__u64 frame = p->at, code, instr;
	__u8 owner = 0, *b;

	if (!frame)
		return 1;
	b = py_frame_bytes(p, frame);
	if (b) {
		p->at = *(__u64 *)(b + MT_PY_WORD_AT(o, o->frame_previous));
		code = *(__u64 *)(b + MT_PY_WORD_AT(o, o->frame_code));
		instr = *(__u64 *)(b + MT_PY_WORD_AT(o, o->frame_instr));
		owner = b[MT_PY_BYTE_AT(o, o->frame_owner)];
	} else {
		p->at = py_read(frame + o->frame_previous);
		if (bpf_probe_read_user(&owner, 1, (void *)(frame + o->frame_owner))) {
			p->at = 0;
			return 1;
		}
		code = py_read(frame + o->frame_code);
		instr = py_read(frame + o->frame_instr);
	}
	if (owner == MT_PY_OWNED_BY_CSTACK)
		return 0;
	if (code && instr >= code + o->code_adaptive && !py_code_sent(code))
		py_code_record(p, code);
	return 0;
}

/* What py_note_vma needs and finds. */
struct py_find {
	__u32 tgid;
	__u32 found;
};

/* Records the interpreter mapped at vma as the process's (py_procs). */
static long py_note_vma(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct py_find *f = data;
	struct mt_py_image *img, *proc;
	struct image_id id = {};
	struct file *file = vma->vm_file;

	if (!file)
		return 0;
	id.ino = file->f_inode->i_ino;
	id.dev = file->f_inode->i_sb->s_dev;
	img = bpf_map_lookup_elem(&py_images, &id);
	if (!img || bpf_map_update_elem(&py_procs, &f->tgid, img, BPF_ANY))
		return 0;
	proc = bpf_map_lookup_elem(&py_procs, &f->tgid);
	if (!proc)
		return 0;
	/* runtime is relative to the address of the file's offset 0. A walk
	 * of another thread in between reads where no interpreter is, and
	 * finds no thread. */
	proc->runtime = img->runtime + vma->vm_start - (vma->vm_pgoff << PAGE_SHIFT);
	if (img->tls_index)
		proc->tls_index = img->tls_index + vma->vm_start - (vma->vm_pgoff << PAGE_SHIFT);
	proc->tls_tpoff = 0;
	f->found = 1;
	return 0;
}

/* How far below a thread's fs base its static TLS blocks may be. */
#define MT_PY_STATIC_TLS (1 << 20)

/*
 * The current thread's _Py_tss_tstate (3.12+): its thread state while it
 * holds the GIL, else 0. The first walk of a process finds where the
 * variable is from the thread's fs base: the module id and offset of its
 * tls_index (in the interpreter's GOT, set by the dynamic loader), the
 * module's block in the thread's DTV. A block in static TLS (an
 * interpreter loaded at start, not dlopen()ed) lies just below the fs
 * base, at the same distance in every thread: that distance is kept. Any
 * other (a dynamic block, not found) gives MT_PY_NO_TLS, and walks search
 * the list.
 */
static __noinline __u64 py_tls_state(struct mt_py_image *py)
{
	__u64 fs, index[2] = {}, dtv, block;
	__s64 tp;

	if (!py)
		return 0;
	fs = bpf_get_current_task_btf()->thread.fsbase;
	tp = py->tls_tpoff;
	if (!tp) {
		tp = MT_PY_NO_TLS;
		/* tcbhead_t's dtv, at 8; dtv[module] is 16 bytes, the
		 * block's address first. */
		if (!bpf_probe_read_user(index, sizeof(index), (void *)py->tls_index) &&
		    index[0] && index[0] < 4096 && (dtv = py_read(fs + 8))) {
			block = py_read(dtv + index[0] * 16);
			if (block && block < fs && fs - block < MT_PY_STATIC_TLS)
				tp = (__s64)(block + index[1] - fs);
		}
		py->tls_tpoff = tp;
	}
	if (tp == MT_PY_NO_TLS)
		return 0;
	return py_read(fs + tp);
}

/* The process's interpreter: its entry, or one made from the flagged code
 * mapping a walk of it just went through. */
static __noinline struct mt_py_image *py_proc(__u32 tgid)
{
	struct py_find f = { .tgid = tgid };
	struct mt_py_image *py = bpf_map_lookup_elem(&py_procs, &tgid);
	struct code_maps *cm;
	__u64 at = 0;

	if (py)
		return py;
	cm = bpf_map_lookup_elem(&code_maps, &tgid);
	for (int i = 0; cm && i < MT_CODE_MAPS; i++) {
		if (cm->m[i].py && cm->m[i].end)
			at = cm->m[i].start;
	}
	if (!at || bpf_find_vma(bpf_get_current_task_btf(), at, py_note_vma, &f, 0) || !f.found)
		return NULL;
	return bpf_map_lookup_elem(&py_procs, &tgid);
}

/*
 * Appends the current thread's Python frames to a stack of out->nr frames
 * (into rec's ips when rec is set), mixing them into its hash h; returns
 * the hash, never 0, and moves out->nr past them. A global function,
 * verified once, outside the native walk's call chain (the stack budget).
 */
__noinline __u64 mt_py_walk(__u32 tgid, struct mt_stack_record *rec, struct walk_out *out,
			    __u64 h, __u32 codes)
{
	struct py_walk p = { .rec = rec, .h = h, .tgid = tgid, .codes = !!codes };
	struct mt_py_image *py;
	__u64 at;

	if (!out)
		return h ? h : 1;
	py = py_proc(tgid);
	if (!py)
		return h ? h : 1;
	p.win = mt_stack_window();
	p.off = &py->off;
	p.n = out->nr;
	/* The thread's own state while it holds the GIL (runs Python code:
	 * most allocations), at one read: 3.11's GIL holder (cleared before a
	 * thread state is freed, so one with this thread's id is live), 3.12's
	 * thread-local one. Checked by its thread id like the list's; without
	 * the GIL (0, or another thread's), the list. */
	if (p.off->runtime_tstate != MT_PY_NONE)
		p.at = py_read(py->runtime + p.off->runtime_tstate);
	else if (py->tls_index)
		p.at = py_tls_state(py);
	if (p.at)
		py_thread_step(0, &p);
	if (!p.found) {
		at = py_read(py->runtime + p.off->runtime_interp_head);
		p.at = at ? py_read(at + p.off->interp_threads_head) : 0;
		bpf_loop(MT_PY_THREADS, py_thread_step, &p, 0);
		if (!p.found) {
			mt_stack_window_done(p.win);
			return h ? h : 1;
		}
	}
	mt_py_word(p.win, p.at + p.off->tstate_frame, (struct py_word_out *)&p.at);
	at = p.at;
	if (at && p.off->cframe_frame != MT_PY_NONE)
		at = py_read(at + p.off->cframe_frame);
	p.at = at;
	if (codes) {
		py_codes_sent_clear();
		bpf_loop(MT_MAX_STACK, py_code_step, &p, 0);
		mt_stack_window_done(p.win);
		return h ? h : 1;
	}
	bpf_loop(MT_MAX_STACK, py_frame_step, &p, 0);
	mt_stack_window_done(p.win);
	out->nr = p.n;
	return p.h ? p.h : 1;
}

/*
 * The id of the user stack of an allocator call at its entry, 0 if none;
 * a stack not seen before is also written to the stack ring.
 *
 * Most calls come from stacks already written, so the stack is first
 * hashed as it is walked, its frames kept in the thread's frame buffer
 * (never a per-CPU map), and looked up; only a new one is copied into a
 * record reserved on the stack ring (walked again if the buffer was
 * taken). A record is thus reserved only for new stacks, and the ring's
 * space is not taken and given back a kilobyte at a time for every
 * allocation.
 */
static __always_inline __u64 capture_stack(struct pt_regs *ctx, struct inflight *cur,
					   __u32 tgid, __u64 sp)
{
	struct mt_stack_record *rec, *kept;
	struct walk_out out = {};
	__u8 one = 1;
	__u64 h;
	long err;

	if (!stack_depth)
		return 0;
	h = walk_stack(ctx, tgid, sp, walk_frames_of(true), &out);
	if (out.py)
		h = mt_py_walk(tgid, walk_frames_of(false), &out, h, 0);
	if (bpf_map_lookup_elem(&known_stacks, &h)) {
		walk_frames_done();
		return h;
	}
	/* A new stack: the records of its code objects first, for its reader
	 * to have them when it reads it (the ring is read in the order records
	 * are reserved). */
	if (out.py)
		mt_py_walk(tgid, NULL, &out, h, 1);
	rec = bpf_ringbuf_reserve(&stacks, sizeof(*rec), 0);
	if (!rec) {
		walk_frames_done();
		__sync_fetch_and_add(&drops_stacks, 1);
		return 0;
	}
	kept = walk_frames_of(false);
	if (kept) {
		/* The frames as walked (the tail past nr is not read). */
		bpf_probe_read_kernel(rec->ips, sizeof(rec->ips), kept->ips);
		container_of(kept, struct walk_frames, rec)->owner = 0;
	} else {
		/* The same walk, into the record: the stack is the thread's
		 * own and the thread is here, so it gives the same frames and
		 * hash (but the record carries what this walk saw, whatever
		 * happens). */
		h = walk_stack(ctx, tgid, sp, rec, &out);
		if (out.py)
			h = mt_py_walk(tgid, rec, &out, h, 0);
	}
	rec->id = h;
	rec->pid = tgid;
	rec->nr = out.nr;
	rec->end = out.end;
	err = bpf_map_update_elem(&known_stacks, &h, &one, BPF_NOEXIST);
	if (err == -EEXIST)
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
 * returned (a longjmp out of a signal handler that interrupted it, an
 * exception thrown out of an allocator's operator new): the entry starts
 * afresh rather than let every later call of the thread pass for nested.
 */
static __always_inline bool nested_in(struct inflight *cur, __u64 sp)
{
	return sp <= cur->sp;
}

static __always_inline __u64 arg(const struct inflight *call, __u32 idx)
{
	return idx < 5 ? call->args[idx] : 0;
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

/* Counts a hit of the probe site in the cookie (MT_CK_SITE_SHIFT). */
static __always_inline void count_hit(__u64 cookie)
{
	__u64 site = cookie >> MT_CK_SITE_SHIFT;

	if (site == 0 || site > MT_MAX_SITES)
		return;
	__sync_fetch_and_add(&site_hits[bpf_get_smp_processor_id() % MT_HIT_ROWS][site - 1], 1);
}

/* How far past the pending operator new's probe the call of a nested one
 * may be (libstdc++'s nothrow new makes it a few instructions in). */
#define NEW_CALL_MAX 256

/*
 * Whether an operator new entered with stack pointer sp is called by the
 * operator new pending on this thread (entered, its malloc not come yet):
 * below it on the stack, and its return address just past the pending
 * new's probe. Not the stack alone: an operator new that calls no probed
 * allocator (one of an allocator's own) leaves its state pending, and a
 * later new below it is no call of it. A subprogram: its read stays out of
 * the allocator programs' frames (the stack budget).
 */
static __noinline bool called_by_pending_new(struct inflight *cur, __u64 sp)
{
	__u64 ra;

	if (!cur || !cur->new_sp || sp >= cur->new_sp || cur->new_sp - sp >= NEW_FRAME_MAX)
		return false;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)sp))
		return false;
	return ra - cur->new_ip < NEW_CALL_MAX;
}

/*
 * C++ operator new's part of alloc_enter, and a libc syscall wrapper's
 * (MT_CK_SYSCALL: mmap, sbrk). No uretprobe on new: its return address
 * would be the uretprobe trampoline, which C++ unwinders cannot step
 * through, so a std::bad_alloc thrown out of new would terminate the
 * program. new is not counted itself (the malloc it calls is); it captures
 * the stack, whose first frame is the user's new expression, for that
 * malloc to use. A wrapper likewise captures its caller's stack for the
 * syscall it makes (exit_mmap and exit_brk take it); called from
 * inside an allocator, it is the allocator's own and captures nothing.
 */
static __always_inline int new_enter(struct pt_regs *ctx)
{
	__u64 pid_tgid = current_ids(), id, cookie, sp;
	struct inflight *cur = current_call();

	if (!cur)
		return 0;
	cookie = bpf_get_attach_cookie(ctx);
	count_hit(cookie);
	if (!stack_depth)
		return 0;
	/* The entry's stack pointer: the probe may sit past a `sub $n,%rsp`
	 * (MT_CK_SP_SHIFT). */
	sp = PT_REGS_SP(ctx) + 8 * ((cookie >> MT_CK_SP_SHIFT) & 0xf);
	if ((cur->depth > 0 && nested_in(cur, sp)) || in_shim_call(cookie))
		return 0; /* called from inside an allocator: no site */
	/* An operator new called by another one whose malloc has not come yet
	 * (libstdc++'s nothrow and array forms call the plain one): the outer
	 * new's stack, whose first frame is the user's, stands (issue 22:
	 * with --unwind fp this walk started inside libstdc++'s nothrow new,
	 * which keeps no frame pointer, and skipped the user's frame). */
	if (!((cookie >> MT_CK_FLAGS_SHIFT) & MT_CK_SYSCALL) && called_by_pending_new(cur, sp))
		return 0;
	id = capture_stack(ctx, cur, pid_tgid >> 32, sp);
	/* Read again rather than kept across the walk: alloc_enter's stack
	 * is at its budget. */
	cookie = bpf_get_attach_cookie(ctx);
	sp = PT_REGS_SP(ctx) + 8 * ((cookie >> MT_CK_SP_SHIFT) & 0xf);
	if ((cookie >> MT_CK_FLAGS_SHIFT) & MT_CK_SYSCALL) {
		cur->sys_stack_id = id;
		cur->sys_sp = sp | ((cookie & 0xffff) == MT_BRK);
		return 0;
	}
	cur->new_stack_id = id;
	cur->new_sp = sp;
	cur->new_ip = PT_REGS_IP(ctx);
	return 0;
}

/* Whether an allocating entry's result comes through a kernel return
 * probe (MT_CK_KRET_BIT), not its return sites. */
static __always_inline bool kret(__u64 cookie)
{
	return (cookie >> MT_CK_KRET_BIT) & 1;
}

/* Entry of an allocating call (its attach cookie: one helper call a probe
 * hit, read by the caller); returns whether a kernel return probe must
 * bring its return (the thread is tracked and the site has no return
 * sites), which a session's entry turns into its verdict. */
static __always_inline bool alloc_entry(struct pt_regs *ctx, __u64 cookie)
{
	__u64 pid_tgid = 0;
	struct inflight *cur;
	__u64 old;

	cur = current_call_ids(&pid_tgid);
	if (!cur)
		return false;
	count_hit(cookie);
	if (cur->depth > 0 && nested_in(cur, PT_REGS_SP(ctx))) {
		/* Nested: the outermost call makes the record. A call whose
		 * return a kernel return probe brings counts in the depth that
		 * return takes back; a return site's return of a nested call
		 * is not the outermost's (its stack pointer) and takes nothing. */
		if (!kret(cookie))
			return false;
		cur->depth++;
		return true;
	}
	if (in_shim_call(cookie))
		return false; /* the shim's call makes the record */
	cur->depth = 1;
	cur->sp = PT_REGS_SP(ctx);
	cur->args[0] = PT_REGS_PARM1(ctx);
	cur->args[1] = PT_REGS_PARM2(ctx);
	cur->args[2] = PT_REGS_PARM3(ctx);
	cur->args[3] = PT_REGS_PARM4(ctx);
	cur->args[4] = PT_REGS_RC(ctx);
	cur->cookie = cookie;
	/* The probe sits on the `jo` after a count × size multiply: OF says
	 * it overflowed. */
	if ((cur->cookie >> MT_CK_SIZE_OF_BIT) & 1 && (ctx->flags & X86_EFLAGS_OF))
		cur->cookie |= 1ULL << MT_CK_SIZE_OVERFLOWED_BIT;
	if (cur->new_sp && cur->sp < cur->new_sp && cur->new_sp - cur->sp < NEW_FRAME_MAX)
		cur->stack_id = cur->new_stack_id; /* called by operator new */
	else
		cur->stack_id = capture_stack(ctx, cur, pid_tgid >> 32, cur->sp);
	cur->new_sp = 0;
	old = old_ptr(cur);
	if (old)
		emit_event(event_clock(cur), pid_tgid, MT_REALLOC_BEGIN, 0, old, 0, 0,
			   0);
	return kret(cur->cookie);
}

/* The record of the outermost allocating call of the thread, returning
 * ret: read in place, nothing else runs on this thread until we return.
 * Not inlined: in alloc_session its locals would add to the frame of the
 * entry's stack walk (the stack budget). */
static __noinline int alloc_record(struct inflight *cur, __u64 pid_tgid, __u64 ret)
{
	__u64 addr = ret, size, old;
	__u32 kind, count, flags;

	if (!cur)
		return 0;
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
	if ((cur->cookie >> MT_CK_SIZE_OVERFLOWED_BIT) & 1)
		size = ~0ULL;
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

/* Return of an allocating call through a kernel return probe (a site
 * without return sites, MT_CK_KRET_BIT). */
static __noinline int alloc_exit(struct pt_regs *ctx)
{
	__u64 pid_tgid = 0;
	struct inflight *cur = current_call_ids(&pid_tgid);

	if (!cur || cur->depth == 0)
		return 0;
	if (--cur->depth > 0)
		return 0;
	/* The outermost call returns to its caller with the return address
	 * popped: at the entry's stack pointer + 8 (a return-probed site is
	 * never placed past a stack pointer change). Anywhere else the
	 * kernel's return probe handed back a return that is not this call's
	 * (issue 40: a program killed by glibc's heap check under return
	 * probes): counted, the capture warns. */
	if (PT_REGS_SP(ctx) != cur->sp + 8 || fault_returns_elsewhere)
		__sync_fetch_and_add(&returns_elsewhere, 1);
	return alloc_record(cur, pid_tgid, PT_REGS_RC(ctx));
}

/* Where the register `reg` (enum mt_usdt_reg) is in struct pt_regs. */
static __always_inline __u32 usdt_reg_off(__u32 reg)
{
	switch (reg) {
	case MT_REG_AX: return offsetof(struct pt_regs, ax);
	case MT_REG_BX: return offsetof(struct pt_regs, bx);
	case MT_REG_CX: return offsetof(struct pt_regs, cx);
	case MT_REG_DX: return offsetof(struct pt_regs, dx);
	case MT_REG_SI: return offsetof(struct pt_regs, si);
	case MT_REG_DI: return offsetof(struct pt_regs, di);
	case MT_REG_BP: return offsetof(struct pt_regs, bp);
	case MT_REG_SP: return offsetof(struct pt_regs, sp);
	case MT_REG_R8: return offsetof(struct pt_regs, r8);
	case MT_REG_R9: return offsetof(struct pt_regs, r9);
	case MT_REG_R10: return offsetof(struct pt_regs, r10);
	case MT_REG_R11: return offsetof(struct pt_regs, r11);
	case MT_REG_R12: return offsetof(struct pt_regs, r12);
	case MT_REG_R13: return offsetof(struct pt_regs, r13);
	case MT_REG_R14: return offsetof(struct pt_regs, r14);
	default: return offsetof(struct pt_regs, r15);
	}
}

/* x86 EFLAGS bits a condition code reads. */
#define X86_EFLAGS_CF 0x0001
#define X86_EFLAGS_PF 0x0004
#define X86_EFLAGS_ZF 0x0040
#define X86_EFLAGS_SF 0x0080

/* Whether condition code cc (the low nibble of a jcc's opcode: an even
 * code tests, the odd one after it negates) holds for flags. */
static __always_inline bool cc_holds(__u64 flags, __u32 cc)
{
	bool of = flags & X86_EFLAGS_OF, sf = flags & X86_EFLAGS_SF;
	bool zf = flags & X86_EFLAGS_ZF, cf = flags & X86_EFLAGS_CF;
	bool holds;

	switch (cc >> 1) {
	case 0: holds = of; break;
	case 1: holds = cf; break;
	case 2: holds = zf; break;
	case 3: holds = cf || zf; break;
	case 4: holds = sf; break;
	case 5: holds = flags & X86_EFLAGS_PF; break;
	case 6: holds = sf != of; break;
	default: holds = zf || sf != of; break;
	}
	return holds != (cc & 1);
}

/*
 * A return site of an allocating function (enum mt_return_cookie, issue
 * 40): where the outermost pending call of the thread returns, its result
 * in a register, without a kernel return probe. A conditional jump's site
 * returns only on the outcome its cookie names. The call it ends is the
 * one whose entry stack pointer the site's is, with the bytes the code
 * between site and `ret` pops: a nested call's return, or the function's
 * code run by another caller (a tail-called part shared with other
 * functions), is deeper and not this call's.
 */
static __noinline int return_site(struct pt_regs *ctx, __u64 cookie)
{
	__u64 pid_tgid = 0, sp, ret;
	struct inflight *cur = current_call_ids(&pid_tgid);

	if (!cur)
		return 0;
	count_hit(cookie);
	if (cur->depth == 0)
		return 0;
	if (((cookie >> MT_RC_COND_BIT) & 1) &&
	    cc_holds(ctx->flags, (cookie >> MT_RC_CC_SHIFT) & 0xf) != ((cookie >> MT_RC_TAKEN_BIT) & 1))
		return 0;
	sp = PT_REGS_SP(ctx) + 8 * ((cookie >> MT_RC_DELTA_SHIFT) & 0xff);
	if (sp != cur->sp)
		return 0;
	if (bpf_probe_read_kernel(&ret, sizeof(ret),
				  (void *)ctx + usdt_reg_off((cookie >> MT_RC_REG_SHIFT) & 0xf)))
		return 0;
	cur->depth = 0;
	return alloc_record(cur, pid_tgid, ret);
}

/* The pointer a free's probe sees: in rdi, or where code the probe was
 * moved past copied it (the cookie's MT_CK_PTR_SHIFT index: mimalloc's
 * mi_free keeps it in rsi and reuses rdi, issue 41). */
static __always_inline __u64 freed_ptr(struct pt_regs *ctx, __u64 cookie)
{
	/* Each register read at its fixed offset (the verifier refuses a
	 * context read at a computed one, which a switch compiles to). */
	__u64 di = PT_REGS_PARM1(ctx), si = PT_REGS_PARM2(ctx), dx = PT_REGS_PARM3(ctx);
	__u64 cx = PT_REGS_PARM4(ctx), ax = PT_REGS_RC(ctx);
	__u32 at = (cookie >> MT_CK_PTR_SHIFT) & 0xf;

	barrier_var(di);
	barrier_var(si);
	barrier_var(dx);
	barrier_var(cx);
	barrier_var(ax);
	if (at == 1)
		return si;
	if (at == 2)
		return dx;
	if (at == 3)
		return cx;
	if (at == 4)
		return ax;
	return di;
}

/* Entry of a free (not inlined either, for the same reason); cookie is
 * its attach cookie. */
static __noinline int free_entry(struct pt_regs *ctx, __u64 cookie)
{
	__u64 ptr = freed_ptr(ctx, cookie), pid_tgid = 0, sp, ip;
	struct inflight *cur = current_call_ids(&pid_tgid);

	if (!cur)
		return 0; /* untracked */
	count_hit(cookie);
	/* A split free's fast path leaving for its slow path: recorded there. */
	if (((cookie >> MT_CK_FREE_COND_BIT) & 1) &&
	    cc_holds(ctx->flags, (cookie >> MT_CK_FREE_CC_SHIFT) & 0xf) !=
		    ((cookie >> MT_CK_FREE_TAKEN_BIT) & 1))
		return 0;
	/* free(NULL), or free() inside realloc(p, 0) or another allocator
	 * (below its entry's stack pointer: a call pending above it is one a
	 * longjmp or an exception left). */
	/* Where the return address is (the probe may sit past a `sub $n,%rsp`,
	 * MT_CK_SP_SHIFT). */
	sp = PT_REGS_SP(ctx) +
	     8 * (((cookie >> MT_CK_SP_SHIFT) & 0xf) | ((cookie >> MT_CK_FREE_SP_HI_SHIFT) & 0xf) << 4);
	/* A split free's two sites are one free's: the same stack pointer at
	 * either is the next call from the same place, not a jump between
	 * frees (free_pending_above). */
	ip = (cookie >> MT_CK_FREE_SPLIT_BIT) & 1 ? 1 : PT_REGS_IP(ctx);
	if (!ptr || (cur->depth > 0 && nested_in(cur, sp)) || in_shim_call(cookie) ||
	    free_pending_above(cur, sp, ip))
		return 0;
	/* For in_free: that place, and what it holds. */
	cur->free_sp = sp;
	cur->free_ip = ip;
	if (bpf_probe_read_user(&cur->free_ret, sizeof(cur->free_ret), (void *)cur->free_sp))
		cur->free_sp = 0;
	emit_event(event_clock(cur), pid_tgid, MT_FREE, 0, ptr, 0, 0, 0);
	return 0;
}

/*
 * The allocator programs, in one of two sets (userspace loads one):
 *
 * - Linux 6.13 and later: one uprobe session program, `alloc_session`,
 *   for every site of an image, so one link per image. Its entry returns
 *   1 (no return probe) for frees, operator new, the syscall wrappers,
 *   return sites, untracked threads and allocating calls whose return
 *   sites bring their result, 0 for the other allocating calls of a
 *   tracked thread (MT_CK_KRET_BIT). The
 *   kernel detaches links one after another, each after RCU grace periods
 *   of its own: fewer links, a shorter end.
 * - Before: `alloc_enter` (allocating calls, operator new and the syscall
 *   wrappers, told apart by the cookie), `alloc_return` and `free_enter`,
 *   a link each per image.
 *
 * One entry program for allocators and operator new: the verifier checks
 * walk_stack, a global function and most of the load time, once per
 * program.
 */
static __always_inline bool entry_only(__u64 cookie)
{
	return (cookie >> MT_CK_FLAGS_SHIFT) & (MT_CK_NEW | MT_CK_SYSCALL);
}

/* The kfunc takes no argument up to Linux 6.18 at least; the fentry/fexit
 * session work of 2026 gives it the program's context. libbpf resolves the
 * flavour whose prototype the kernel has (the part after `___` is not part
 * of the name), the other stays missing, and its branch is dead to the
 * verifier. */
extern bool bpf_session_is_return___noctx(void) __ksym __weak;
extern bool bpf_session_is_return___ctx(void *ctx) __ksym __weak;

static __always_inline bool session_is_return(struct pt_regs *ctx)
{
	if (bpf_ksym_exists(bpf_session_is_return___ctx))
		return bpf_session_is_return___ctx(ctx);
	return bpf_session_is_return___noctx();
}

SEC("uprobe.multi")
int alloc_enter(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);

	if ((cookie & 0xffff) == MT_RC_KIND)
		return return_site(ctx, cookie);
	if (entry_only(cookie))
		return new_enter(ctx);
	alloc_entry(ctx, cookie);
	return 0;
}

SEC("uretprobe.multi")
int alloc_return(struct pt_regs *ctx)
{
	return alloc_exit(ctx);
}

SEC("uprobe.multi")
int free_enter(struct pt_regs *ctx)
{
	return free_entry(ctx, bpf_get_attach_cookie(ctx));
}

/*
 * The preload shim's hook (`memtrail run --preload`, issue 22;
 * preload/memtrail_preload.c): one program for every record the shim
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
 */
#define MT_SHIM_HELLO 64
#define MT_SHIM_FLUSH 65

/* The shim's thread-local state (struct mt_thread in
 * preload/memtrail_preload.c), at the hello's offset from the thread
 * pointer: the in-allocator flag, the count of buffered frees, the
 * buffer. */
#define MT_SHIM_COUNT_OFF 4
#define MT_SHIM_SLOTS_OFF 8

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

/* Allocator sites' entries and returns, in one program (Linux 6.13); and
 * the preload shim's hook (entry only), so that the walk's code is
 * verified once, not also for shim_hook (~50 ms of start-up). */
SEC("uprobe.session")
int alloc_session(struct pt_regs *ctx)
{
	__u64 cookie;

	if (session_is_return(ctx))
		return alloc_exit(ctx);
	/* Read once: each read is a helper call (issue 22). */
	cookie = bpf_get_attach_cookie(ctx);
	if (cookie == MT_CK_SHIM_HOOK) {
		shim_hook_run(ctx);
		return 1;
	}
	if ((cookie & 0xffff) == MT_FREE) {
		free_entry(ctx, cookie);
		return 1;
	}
	if ((cookie & 0xffff) == MT_RC_KIND) {
		return_site(ctx, cookie);
		return 1;
	}
	if (entry_only(cookie)) {
		new_enter(ctx);
		return 1;
	}
	return alloc_entry(ctx, cookie) ? 0 : 1;
}

/*
 * A USDT region marker of provider `memtrail` (include/memtrail_usdt.h),
 * on the `nop` the marker sits on (emulated: no single-step). The cookie
 * says begin or end and, for begin, which register holds the name. The
 * record goes on the events ring, in order with the thread's heap events.
 * The name is copied straight into the reserved record; the header touched
 * its pages, and a name that cannot be read is left empty.
 */
SEC("uprobe.multi")
int region_marker(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx), pid_tgid = 0, name;
	__u16 kind = cookie & 0xffff;
	struct mt_region_event *e;
	void *ring;

	if (!current_call_ids(&pid_tgid))
		return 0;
	count_hit(cookie);
	ring = events_ring();
	e = reserve(ring, sizeof(*e));
	if (!e)
		return 0;
	fill_header(&e->hdr, pid_tgid, kind, 0);
	e->name[0] = 0;
	if (kind == MT_REGION_BEGIN) {
		/* The register, read at a variable offset of the registers
		 * (a direct ctx access needs a constant one). */
		if (bpf_probe_read_kernel(&name, sizeof(name),
					  (void *)ctx + usdt_reg_off((cookie >> MT_USDT_REG_SHIFT) & 0xf)) ||
		    bpf_probe_read_user_str(e->name, sizeof(e->name), (void *)name) < 0)
			e->name[0] = 0;
	}
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	check_pressure(ring, MT_RING_EVENTS, watermark_events, &hwm_events);
	return 0;
}

static __always_inline __u16 syscall_flags(void)
{
	return in_allocator() ? MT_F_IN_ALLOCATOR : 0;
}

/*
 * The stack a libc wrapper (kind MT_MMAP or MT_BRK) captured for the
 * syscall the current thread is returning from, 0 if none: a syscall made
 * inside an allocator call, or not through a probed wrapper (a direct
 * syscall: the dynamic loader's own mmap, a static binary, Go). The
 * wrapper's capture is taken once; it is trusted only when the syscall runs
 * just below the wrapper's entry (the user stack pointer at the syscall
 * within NEW_FRAME_MAX under it), so a capture left by a wrapper that made
 * no syscall of that kind (sbrk(0), a failed argument check) is not handed
 * to a later direct syscall of a caller.
 */
static __always_inline __u64 syscall_stack(struct inflight *cur, __u16 kind)
{
	__u64 sp, usp;

	if (!cur || cur->depth > 0 || !cur->sys_sp)
		return 0;
	sp = cur->sys_sp;
	if ((sp & 1) != (kind == MT_BRK))
		return 0; /* another wrapper's */
	cur->sys_sp = 0;
	sp &= ~1ULL;
	usp = ((struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf()))->sp;
	if (usp > sp || sp - usp >= NEW_FRAME_MAX)
		return 0;
	return cur->sys_stack_id;
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

/* mmap(addr, len, prot, flags, fd, off): anonymous mappings, and
 * executable file mappings (code whose addresses stacks hold). */
static __always_inline int enter_mmap(__u64 len, __u64 prot, __u64 flags)
{
	if (!(flags & MAP_ANONYMOUS) && !(prot & PROT_EXEC))
		return 0;
	return stash_args(len, flags, prot);
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
	m->kind = MT_REQ_IMAGE;
	m->start = info->start;
	m->end = info->end;
	m->pgoff = info->pgoff;
	m->dev = info->dev;
	m->ino = info->ino;
	if (bpf_probe_read_kernel_str(m->name, sizeof(m->name), info->name) < 0)
		m->name[0] = 0;
}

/* A request about process tgid other than an image (enum mt_request);
 * false when the ring has no room (counted: the capture fails). The caller
 * checks the ring's pressure where its thread may stop itself. */
static __always_inline bool request(__u32 tgid, __u32 kind, __u32 other)
{
	struct mt_mapping_record *m;

	m = bpf_ringbuf_reserve(&attach_requests, sizeof(*m), 0);
	if (!m) {
		__sync_fetch_and_add(&drops_attach, 1);
		return false;
	}
	__builtin_memset(m, 0, sizeof(*m));
	m->ts_ns = bpf_ktime_get_ns();
	m->pid = tgid;
	m->kind = kind;
	m->start = other;
	bpf_ringbuf_submit(m, submit_flags(MT_RING_ATTACH));
	return true;
}

/*
 * An executable image userspace has not examined: ask for it, and stop the
 * process before it returns to user space, so that no code of the image
 * (constructors included) runs before its allocators are probed. The
 * attach worker resumes it.
 */
static __always_inline void request_attach(__u64 pid_tgid, const struct vma_info *info)
{
	struct known_id id = { .dev = info->dev, .ino = info->ino };
	struct mt_mapping_record *m;

	if (bpf_map_lookup_elem(&known_images, &id))
		return;
	if (per_process) {
		id.tgid = pid_tgid >> 32;
		if (bpf_map_lookup_elem(&known_images, &id))
			return;
	}
	m = bpf_ringbuf_reserve(&attach_requests, sizeof(*m), 0);
	if (!m) {
		__sync_fetch_and_add(&drops_attach, 1);
		return;
	}
	fill_mapping(m, pid_tgid, info);
	bpf_ringbuf_submit(m, submit_flags(MT_RING_ATTACH));
	if (attach_hold && may_stop())
		stop_current();
	check_pressure(&attach_requests, MT_RING_ATTACH, watermark_attach, &hwm_attach);
}

/* Test fault (`MEMTRAIL_FAULT=find-vma-busy`): every bpf_find_vma at an
 * mmap is taken as failed. */
const volatile bool fault_find_vma_busy = false;

/* The mapping an mmap of `fd` made at `start`, from the call's own
 * arguments and the process's file table. */
static __always_inline bool mapping_of_fd(long fd, __u64 start, __u64 len, __u64 off,
					  struct vma_info *info)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct file **fds = BPF_CORE_READ(task, files, fdt, fd);
	unsigned int max = BPF_CORE_READ(task, files, fdt, max_fds);
	struct file *file = NULL;

	if (fd < 0 || fd >= max || bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]) || !file)
		return false;
	info->start = start;
	info->end = start + ((len + (1 << PAGE_SHIFT) - 1) & ~((1ULL << PAGE_SHIFT) - 1));
	info->pgoff = off;
	info->ino = BPF_CORE_READ(file, f_inode, i_ino);
	info->dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
	info->name = BPF_CORE_READ(file, f_path.dentry, d_name.name);
	return true;
}

/* A mapping's record, on the mappings ring. */
static __always_inline void send_mapping(__u64 pid_tgid, const struct vma_info *info)
{
	struct mt_mapping_record *m = bpf_ringbuf_reserve(&mappings, sizeof(*m), 0);

	if (!m) {
		__sync_fetch_and_add(&drops_mappings, 1);
		return;
	}
	fill_mapping(m, pid_tgid, info);
	bpf_ringbuf_submit(m, submit_flags(MT_RING_MAPPINGS));
	check_pressure(&mappings, MT_RING_MAPPINGS, watermark_mappings, &hwm_mappings);
}

/* Writes the file mapping of the current process that contains addr, and
 * asks for its image to be examined if it is new. bpf_find_vma only tries
 * the process's mmap lock: it fails (EBUSY) while another thread maps or
 * unmaps, and an mmap's image (`fd` >= 0: its file, length and offset)
 * is then read from the call itself (`fd` < 0, the executable at exec:
 * nothing else to read); a lost image request would leave the
 * image unprobed for the whole capture (8 threads dlopen'ing mimalloc while
 * others mapped their heaps lost all 24,000 of its calls that way). */
static __always_inline void emit_mapping(__u64 pid_tgid, __u64 addr, long fd, __u64 len,
					 __u64 off)
{
	struct vma_info info = {};

	if ((fault_find_vma_busy && fd >= 0) ||
	    bpf_find_vma(bpf_get_current_task_btf(), addr, read_vma, &info, 0) || !info.name) {
		if (fd < 0)
			return;
		__builtin_memset(&info, 0, sizeof(info));
		/* Unknown, the mapping is lost: the capture fails, never quietly
		 * misses an image's calls. */
		if (!mapping_of_fd(fd, addr, len, off, &info) || !info.name) {
			__sync_fetch_and_add(&drops_mappings, 1);
			return;
		}
	}
	request_attach(pid_tgid, &info);
	send_mapping(pid_tgid, &info);
}

static __always_inline int exit_mmap(long ret, __u64 regs_fd, __u64 regs_off)
{
	__u64 pid_tgid = current_ids(), stack;
	__u32 tid = (__u32)pid_tgid;
	struct sysargs args;
	bool stashed = take_args(tid, &args);
	struct inflight *cur;

	/* Every mmap of the tree takes the wrapper's capture, a file mapping
	 * (not stashed) too; a thread outside the tree has no state. */
	cur = current_call();
	stack = syscall_stack(cur, MT_MMAP);
	if (!stashed || IS_ERR_VALUE(ret))
		return 0;
	if (args.args[1] & MAP_ANONYMOUS) {
		/* Not the program's: the preload shim's own (issue 22). */
		if (shim_flag() != MT_SHIM_OWN)
			emit_alloc(pid_tgid, MT_MMAP,
				   allocator_owns(cur) ? MT_F_IN_ALLOCATOR : 0, ret, args.args[0],
				   args.args[2] & MT_PROT_BITS, stack);
	} else
		emit_mapping(pid_tgid, ret, (long)regs_fd, args.args[0], regs_off);
	/* A new mapping may replace cached ones (MAP_FIXED). */
	forget_code_maps(pid_tgid >> 32, ret, args.args[0]);
	return 0;
}

/* munmap is recorded at entry: once it returns, another thread may get the
 * same range from mmap, and that record must come after this one. */
static __always_inline int enter_munmap(__u64 addr, __u64 len)
{
	__u64 pid_tgid = current_ids();

	if (!thread_tracked(pid_tgid))
		return 0;
	forget_code_maps(pid_tgid >> 32, addr, len);
	emit_alloc(pid_tgid, MT_MUNMAP, syscall_flags(), addr, len, 0, 0);
	return 0;
}

static __always_inline int exit_mremap(long ret)
{
	__u64 pid_tgid = current_ids();
	__u32 tid = (__u32)pid_tgid;
	struct sysargs args;

	if (!take_args(tid, &args) || IS_ERR_VALUE(ret))
		return 0;
	emit_alloc(pid_tgid, MT_MREMAP, syscall_flags(), ret, args.args[2],
		   args.args[0], args.args[1]);
	return 0;
}

static __always_inline int exit_brk(long ret)
{
	__u64 pid_tgid = current_ids(), stack = 0;
	__u32 tid = (__u32)pid_tgid;
	struct sysargs args;
	struct inflight *cur;

	if (!take_args(tid, &args))
		return 0;
	cur = current_call();
	/* brk(0) only asks where the break is: glibc's sbrk asks first when
	 * it does not know, then moves it. */
	if (args.args[0])
		stack = syscall_stack(cur, MT_BRK);
	emit_alloc(pid_tgid, MT_BRK, allocator_owns(cur) ? MT_F_IN_ALLOCATOR : 0,
		   ret, args.args[0], 0, stack);
	return 0;
}

/* mprotect(addr, len, prot), recorded when it succeeded: what turns a
 * reservation (PROT_NONE) into committed memory and back. */
static __always_inline int exit_mprotect(long ret)
{
	__u64 pid_tgid = current_ids();
	struct sysargs args;

	if (!take_args((__u32)pid_tgid, &args) || ret != 0)
		return 0;
	emit_alloc(pid_tgid, MT_MPROTECT, syscall_flags(), args.args[0], args.args[1],
		   args.args[2] & MT_PROT_BITS, 0);
	return 0;
}

/*
 * The syscalls, through the raw syscall tracepoints: one program at entry
 * and one at exit for every syscall of every process, which leaves at once
 * for any other than these five. (The per-syscall tracepoints of
 * syscalls/ attach through perf events, and the kernel detaches those one
 * at a time, two RCU grace periods each under a global mutex: ~30 ms a
 * tracepoint, 200 ms at the end of every capture for seven of them.)
 * x86-64 numbers and argument registers.
 */
#define NR_MMAP 9
#define NR_MPROTECT 10
#define NR_MUNMAP 11
#define NR_BRK 12
#define NR_MREMAP 25
#define NR_EXIT 60
#define NR_EXIT_GROUP 231

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	switch (id) {
	case NR_MMAP:
		return enter_mmap(regs->si, regs->dx, regs->r10);
	case NR_MUNMAP:
		return enter_munmap(regs->di, regs->si);
	case NR_MPROTECT:
		/* mprotect(addr, len, prot) */
		return stash_args(regs->di, regs->si, regs->dx);
	case NR_MREMAP:
		/* mremap(old_addr, old_len, new_len, flags, new_addr) */
		return stash_args(regs->di, regs->si, regs->dx);
	case NR_BRK:
		return stash_args(regs->di, 0, 0);
	case NR_EXIT:
	case NR_EXIT_GROUP:
		/* The preload shim's buffered frees of the thread. */
		shim_thread_ends();
		return 0;
	}
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	switch (regs->orig_ax) {
	case NR_MMAP:
		/* mmap(addr, len, prot, flags, fd, offset) */
		return exit_mmap(ret, regs->r8, regs->r9);
	case NR_MREMAP:
		return exit_mremap(ret);
	case NR_MPROTECT:
		return exit_mprotect(ret);
	case NR_BRK:
		return exit_brk(ret);
	}
	return 0;
}

/*
 * Resident memory. The kernel's rss_stat tracepoint fires at every change
 * of a process's page counters (each page fault, each zap), so most
 * changes are only compared: a process's highest RSS is kept exactly in
 * rss_states, and a record is written at its first change and then when
 * its RSS moved by rss_step bytes, or by 1/64 of the value last written if
 * that is more, since that value (so a process growing to 1 GiB writes a
 * few hundred records, not 262,144). The last thread's exit writes the final peak (process_exit).
 *
 * A record gives way to the tree's own events: none is written while the
 * events ring is past half its size or past its watermark (the change is
 * written at the next one that finds room, as `last` is not moved), so
 * these records never make a pressure episode nor lose an event. A zap of
 * many pages in one syscall may fire the tracepoint many times before the
 * thread returns to user space and any stop takes it: the hard-mark rule
 * (MT_RECORDS_PER_THREAD) counts on records that check.
 */
#define MM_FILEPAGES 0
#define MM_ANONPAGES 1
#define MM_SHMEMPAGES 3

/* The smallest move of a process's RSS that is written (bytes). */
const volatile __u64 rss_step = 256 << 10;

struct rss_state {
	__u64 last; /* the rss last written */
	__u64 peak;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MT_MAX_PROCS);
	__type(key, __u32); /* tgid */
	__type(value, struct rss_state);
} rss_states SEC(".maps");

/* A counter's pages, as percpu_counter_read_positive() reads them. */
static __always_inline __u64 positive(__s64 pages)
{
	return pages > 0 ? pages : 0;
}

/* get_mm_rss(): file, anonymous and shared-memory pages, in bytes. Direct
 * loads (mm is a BTF pointer), each index a constant in its expression: a
 * CO-RE relocation then scales it by the kernel's element size (a variable
 * index would be scaled by this file's 8-byte percpu_counter). */
static __always_inline __u64 mm_rss(struct mm_struct *mm)
{
	return (positive(mm->rss_stat[MM_FILEPAGES].count) +
		positive(mm->rss_stat[MM_ANONPAGES].count) +
		positive(mm->rss_stat[MM_SHMEMPAGES].count))
	       << PAGE_SHIFT;
}

/* Writes process pid_tgid's RSS record; false when the ring had no room
 * to spare (nothing written, nothing lost). */
static __always_inline bool emit_rss(__u64 pid_tgid, __u64 rss, __u64 peak, bool spare)
{
	void *ring = events_ring();
	struct mt_rss_event *e;
	__u64 avail, cap = ring_capacity[MT_RING_EVENTS];

	if (!ring)
		return false;
	if (spare) {
		avail = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);
		if (avail > watermark_events || (cap && avail > cap / 2))
			return false;
	}
	e = bpf_ringbuf_reserve(ring, sizeof(*e), 0);
	if (!e) {
		if (!spare)
			__sync_fetch_and_add(&drops_events, 1);
		return false;
	}
	fill_header(&e->hdr, pid_tgid, MT_RSS, 0);
	e->rss = rss;
	e->peak = peak;
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	return true;
}

SEC("tp_btf/rss_stat")
int BPF_PROG(rss_stat, struct mm_struct *mm, int member)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct rss_state *st, zero = {};
	__u64 pid_tgid, rss, last, step;
	__u32 tgid;

	if (member != MM_FILEPAGES && member != MM_ANONPAGES && member != MM_SHMEMPAGES)
		return 0;
	if (task->mm == mm) {
		/* A thread of the tree: the root from its exec on (before it,
		 * its pages are memtrail's, copied at fork). */
		if (!task_call(task, task->pid))
			return 0;
		pid_tgid = task_ids(task);
		tgid = pid_tgid >> 32;
	} else {
		/* Another task's mm (reclaim, a fork copying the parent's
		 * pages): its owner's, if still its owner's own (not the mm an
		 * exec left, torn down after the new one is in place). */
		if (!bpf_core_field_exists(mm->owner))
			return 0;
		task = mm->owner;
		if (!task || task->mm != mm)
			return 0;
		pid_tgid = task_ids(task);
		tgid = pid_tgid >> 32;
		if (!is_tracked(tgid))
			return 0;
	}
	rss = mm_rss(mm);
	st = bpf_map_lookup_elem(&rss_states, &tgid);
	if (!st) {
		/* ~0: the process's first change is written whatever it is. */
		zero.last = ~0ULL;
		bpf_map_update_elem(&rss_states, &tgid, &zero, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&rss_states, &tgid);
		if (!st)
			return 0;
	}
	/* Threads of a process race here: a peak may be a page short. */
	if (rss > st->peak)
		st->peak = rss;
	last = st->last;
	step = last >> 6 > rss_step ? last >> 6 : rss_step;
	if (last != ~0ULL && rss < last + step && rss + step > last)
		return 0;
	if (emit_rss(pid_tgid, rss, st->peak, true))
		st->last = rss;
	return 0;
}

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
