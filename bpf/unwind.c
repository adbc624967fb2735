/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * the native unwinder: the executable mapping of a frame (mt_find_code,
 * through the process's `code_maps` cache), the row of its image's unwind
 * table (mt_find_row, through `row_cache`), a step by that row or by frame
 * pointer (unwind_frame, fp_step), the thread's stack window
 * (mt_stack_window, mt_stack_read) and frame buffer (walk_frames_of), and
 * the walk itself (walk_stack), which hashes the frames it keeps. The
 * unwind tables' maps are in maps.bpf.h; userspace loads and releases the
 * tables (src/unwind).
 *
 * Invariants a change here must keep:
 * - Every loop is bounded (bpf_loop, bpf_repeat, a named MT_* bound).
 * - The global functions (mt_find_code, mt_find_row, mt_stack_read,
 *   mt_store_frame, walk_stack, ...) stay global: each is verified once,
 *   and splitting them back in multiplies the verifier's work. The comments
 *   on walk_zero and walk_first_frame say why those are variables.
 * - Stack use: the allocator programs are at the budget of
 *   scripts/check-bpf-stack.sh; a new local across the walk, or a helper
 *   made a subprogram, must be measured there.
 * - A walk never reads another image's rows nor another walk's window
 *   (the release order of `row_cache`, the windows' owner word).
 */

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

static __always_inline __u64 mix(__u64 h, __u64 v)
{
	h ^= v;
	h *= 0xff51afd7ed558ccdULL;
	return h ^ (h >> 33);
}
/* Binary search steps: enough for a page's rows, whatever their number
 * (a page's rows are usually a few dozen: the search ends after 5 or 6). */
#define MT_UNWIND_SEARCH 21
#define VM_EXEC 0x4
/* Retries of a mapping look-up that found the mmap lock taken. */
#define MT_FIND_VMA_TRIES 8
#define EBUSY 16

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

/* unwind_frame's step through the signal trampoline's frame (its row's
 * MT_CFA_SIGNAL): the interrupted registers, from the ucontext the kernel
 * saved. */
static __always_inline bool signal_frame(struct unwind_walk *w)
{
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

/* unwind_frame's step for a frame without a rule BPF evaluates (cfa_kind:
 * MT_CFA_NONE, MT_CFA_UNSUPPORTED), through saved. */
static __always_inline bool no_rule_step(struct unwind_walk *w, __u8 cfa_kind,
					 struct user_frame *saved)
{
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
	return fp_step(w, MT_END_NO_TABLE, saved);
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
	case MT_CFA_SIGNAL:
		return signal_frame(w);
	default:
		return no_rule_step(w, cfa_kind, &saved);
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
