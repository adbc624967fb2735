/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * every map and global of the object: its limits and kernel constants,
 * the rings, the per-process and per-thread maps and their value types,
 * the tunables userspace sets before load (`const volatile`, .rodata), the
 * words and counters it reads and writes through the mmap'd .bss, and the
 * dummy record instances that make libbpf-cargo emit memtrail.h's types
 * into the skeleton. Each comment says who writes and who reads.
 *
 * Invariants a change here must keep:
 * - Names are ABI: the Rust side opens maps, programs and globals by name
 *   through the skeleton (src/bpf/skel.rs); a renamed or removed one breaks
 *   the build or the session's start.
 * - Definitions stay in this file and in this order: the object's .maps,
 *   .bss and .rodata are laid out in definition order, so a global defined
 *   in another part moves every later one.
 * - Hash maps BPF updates are preallocated (a failed update is a lost
 *   event); only maps userspace alone writes are BPF_F_NO_PREALLOC.
 * - No per-CPU scratch map: scratch lives in the reserved ring record.
 * - Record layouts and the constants they use belong in memtrail.h, not
 *   here.
 */

/*
 * Who writes and who reads each map (parts of this object by file; "user":
 * memtrail's Rust side, by the map's name through the skeleton):
 *
 *   event_rings       user inserts the rings; records.bpf.h writes (every
 *                     part's events); user's pollers read (src/ring)
 *   stacks            stack.c (stacks), python.c (code objects); user reads
 *   mappings          memory.c writes; user reads
 *   attach_requests   memory.c (images), process.c (fork, relink, exit);
 *                     user's attach worker reads
 *   known_images      user writes; memory.c reads
 *   held_for_probes   process.c adds; user removes; process.c reads
 *   foreign_stops     process.c (signal_generate), user; process.c reads
 *   known_stacks      stack.c
 *   tracked           process.c (fork adds, exit removes), user (the root);
 *                     task.c, process.c read
 *   hard_stops        pressure.c adds; user's coordinator reads, removes
 *   pressure_wake     pressure.c writes; user's coordinator sleeps on it
 *   inflight,
 *   thread_slots      task.c (every probe's call state goes through it)
 *   shim_procs        shim.c (hello), process.c (fork copies, exec and
 *                     exit drop); shim.c reads
 *   sysargs           memory.c; process.c drops a dying thread's
 *   excluded_threads  user writes; task.c reads
 *   unwind_rows,
 *   unwind_shards,
 *   unwind_images     user writes (src/unwind); unwind.c reads
 *   row_cache         unwind.c; user clears it when it releases a table
 *   code_maps         unwind.c; python.c reads; memory.c, process.c and
 *                     user drop entries
 *   stack_windows,
 *   walk_frames       unwind.c, python.c, stack.c: one walk's own, claimed
 *   py_images         user writes; unwind.c, python.c read
 *   py_procs          python.c; process.c drops
 *   py_codes          python.c
 *   rss_states        memory.c; process.c writes the final peak, drops
 *
 * The .bss words and .rodata tunables below say who sets them.
 */

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

/* Backpressure (pressure.c): the tunables set before load, then the
 * latch, marks and statistics. */
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

/* 0, or the bpf_ktime_get_ns() of the latch: when the episode began. */
__u64 pressure_latch = 0;

/* Set as memtrail's process exits (protector_exit): from then on no
 * program stops a process (a hold or a pause nobody would end), while the
 * links close. */
__u64 memtrail_gone = 0;

/*
 * Set by userspace while a ring's poller sleeps on the ring's epoll:
 * producers then submit with BPF_RB_FORCE_WAKEUP, otherwise with
 * BPF_RB_NO_WAKEUP (the poller busy-polls). Read just before the commit:
 * src/engine/idle.rs documents the pairing and its one benign race.
 */
__u64 sleeping[MT_RINGS] = {};
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

/* Whether a process that maps a new image is stopped until its allocators
 * are probed. Off when memtrail tracks its own process (src/session): the
 * attach worker is one of its threads. */
const volatile bool attach_hold = true;

/* Events rings userspace made (one, or one per CPU). */
const volatile __u32 event_ring_count = 1;

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

/*
 * The walk's first frame index: always 0, but a variable the verifier
 * cannot see the value of. Starting from a constant 0, the frame count is
 * a different constant in every step, so the verifier checked unwind_step
 * once per frame up to MT_MAX_STACK (380,000 instructions processed, most
 * of the load time); from an unknown value its states converge after a
 * few steps.
 */
__u32 walk_first_frame = 0;

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

/* Test fault (`MEMTRAIL_FAULT=find-vma-busy`): every bpf_find_vma at an
 * mmap is taken as failed. */
const volatile bool fault_find_vma_busy = false;

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
