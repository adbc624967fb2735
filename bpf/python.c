/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * the Python walker: the process's interpreter (py_proc, from `py_images`
 * and the code mapping the native walk flagged), the thread's state
 * (py_tls_state, the interpreter's thread list), its frames appended to a
 * stack (mt_py_walk, py_frame_step), and the records of their code objects
 * on the stack ring (py_code_record). The offsets it reads come from
 * userspace (src/python), in memtrail.h's struct mt_py_offsets.
 *
 * Invariants a change here must keep:
 * - Everything read from the tracked process is bounded and may be
 *   garbage: every read checked, every length clamped (MT_PY_NAME,
 *   MT_PY_TABLE, MT_PY_FRAME_READ), every loop bounded.
 * - A code object's record goes out before the stack naming it (the ring is
 *   read in order).
 * - The walk's global functions (mt_py_walk, mt_py_word, mt_py_frame_at,
 *   ...) stay global: verified once, off the native walk's call chain
 *   (the stack budget).
 */

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
/* MT_PY_OWNED_BY_CSTACK: bpf/memtrail_shim.h (the shim's walk reads it too). */

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
