/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * memory outside the allocators: the syscalls (mmap, munmap, mremap, brk,
 * mprotect through the raw syscall tracepoints), the executable mappings
 * and the attach requests they make (request_attach, emit_mapping, which
 * stop a process until its new image's allocators are probed), and
 * resident memory (rss_stat).
 *
 * Invariants a change here must keep:
 * - munmap is recorded at entry, the others at exit (a range another
 *   thread gets back must come after its unmap).
 * - A mapping whose image cannot be read is counted lost (drops_mappings:
 *   the capture fails), never quietly skipped.
 * - RSS records give way to the tree's events (no pressure episode, no
 *   lost event of theirs).
 */

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
