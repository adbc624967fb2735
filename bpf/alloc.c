/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * the allocator probes: entries of allocating calls (alloc_entry), their
 * returns (return sites, or a kernel return probe: alloc_exit), operator
 * new and the libc syscall wrappers (new_enter), frees (free_entry), and
 * the programs that dispatch by attach cookie (alloc_session from Linux
 * 6.13, else alloc_enter, alloc_return, free_enter); and the USDT region
 * markers (region_marker). The cookie's layout is memtrail.h's.
 *
 * Invariants a change here must keep:
 * - Only the outermost allocator call of a thread makes a record; a call
 *   is nested while it runs at or below the outermost one's entry stack
 *   pointer.
 * - A realloc of a live block always completes the MT_REALLOC_BEGIN
 *   record it opened; a failed allocation makes no record.
 * - alloc_entry, alloc_record, free_entry and return_site keep their
 *   inline/noinline choices: the stack budget.
 */

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
