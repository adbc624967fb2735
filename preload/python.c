/*
 * Python frames on the ring path (issue 22). In a Python process (an
 * interpreter exporting _PyRuntime, whose layout memtrail put in the
 * control page: by version, or by image) the shim appends the thread's
 * Python frames to its stack as memtrail's BPF walk does (mt_py_walk in
 * bpf/python.c: the same words, MT_PY_FRAME in bpf/memtrail.h), and
 * before a new stack it writes the records of the code objects its frames
 * run that its ring has not carried yet (struct mt_py_code_record), for
 * memtrail to name them. The thread's state is its own
 * (PyGILState_GetThisThreadState: a thread-specific value, set and
 * cleared by the thread's interpreter, read without a lock), checked by
 * its thread id; its frames are the thread's own, which only it changes,
 * read as CPython's faulthandler reads them. A walk only through native
 * code (no frame in the interpreter's code) has no Python frames.
 *
 * Owns: the interpreter's layout (py_layout, from the control page, set
 * once at set-up and checked by py_layout_fits), the interpreter's code
 * range, and each thread's ranges known mapped (py_self).
 *
 * Invariants: no read of the interpreter's memory faults (below, "Reads
 * of the interpreter's memory"); a walk ends at MT_MAX_STACK words; a
 * code record's strings and table are cut at MT_PY_NAME and MT_PY_TABLE.
 *
 * Context: the ring path's walk (stack.c) of a thread's allocator call;
 * set-up quiet. No allocation, async-signal-safe (a thread's first walk
 * reads /proc/self/maps once).
 */
#include "ring.h"

static struct ring_py_layout py_layout DATA;
int py_on;
static void *(*py_this_state)(void);
/* The interpreter's code (the object defining _PyRuntime). */
uint64_t py_lo, py_hi;

static int find_py_text(struct dl_phdr_info *info, size_t size, void *data)
{
	uint64_t at = (uint64_t)(uintptr_t)data;
	int i, found = 0;

	(void)size;
	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uint64_t lo = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && at >= lo && at < lo + ph->p_memsz)
			found = 1;
	}
	for (i = 0; found && i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uint64_t lo = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
			py_lo = lo;
			py_hi = lo + ph->p_memsz;
		}
	}
	return found;
}

/* The layout memtrail found for the interpreter image defining runtime, of
 * version 3.minor, in the control page; NULL if none. */
static const struct ring_py_layout *py_image_layout(const char *control, void *runtime,
						     uint32_t minor)
{
	const struct ring_py_image *images =
		(const struct ring_py_image *)(control + RING_PY_IMAGES_AT);
	const char *path;
	struct stat st;
	Dl_info info;
	uint64_t dev;
	uint32_t i;

	if (!dladdr(runtime, &info) || !info.dli_fname)
		return NULL;
	/* The executable's own name may not be a path. */
	path = info.dli_fname[0] == '/' ? info.dli_fname : "/proc/self/exe";
	if (stat(path, &st) != 0)
		return NULL;
	dev = (uint64_t)major(st.st_dev) << 20 | minor(st.st_dev);
	for (i = 0; i < RING_PY_IMAGES; i++)
		if (__atomic_load_n(&images[i].layout.minor, __ATOMIC_ACQUIRE) == minor &&
		    images[i].dev == dev && images[i].ino == (uint64_t)st.st_ino)
			return &images[i].layout;
	return NULL;
}

/* Whether the walk can read a frame's fields in the window it reads at
 * once (memtrail checks each layout it gives: this is its second line). */
static int py_layout_fits(const struct ring_py_layout *l)
{
	const uint16_t win = l->off.frame_win, span = l->off.frame_span;
	const uint16_t words[] = {l->off.frame_code, l->off.frame_instr, l->off.frame_previous};
	unsigned int i;

	if (span > 72)
		return 0;
	for (i = 0; i < 3; i++)
		if (words[i] < win || words[i] - win + 8 > span)
			return 0;
	return l->off.frame_owner >= win && l->off.frame_owner - win < span &&
	       (l->off.frame_is_entry == MT_PY_NONE ||
		(l->off.frame_is_entry >= win && l->off.frame_is_entry - win < span));
}

/* Whether the dynamic symbol at fn is a function's (a fake interpreter's
 * PyGILState_GetThisThreadState may be data, which the walk would call). */
static int py_is_function(void *fn)
{
	const ElfW(Sym) *sym = NULL;
	Dl_info info;

	if (!fn || !dladdr1(fn, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym ||
	    info.dli_saddr != fn)
		return 0;
	return ELF64_ST_TYPE(sym->st_info) == STT_FUNC ||
	       ELF64_ST_TYPE(sym->st_info) == STT_GNU_IFUNC;
}

/* Whether this Python process walks its Python frames itself: memtrail
 * gave the layout of its version, or of its interpreter's image. */
int py_setup(const char *control)
{
	const struct ring_py_layout *layouts =
		(const struct ring_py_layout *)(control + RING_CLAIMS_END), *found = NULL;
	const uint32_t *at = dlsym(RTLD_DEFAULT, "Py_Version");
	void *runtime = dlsym(RTLD_DEFAULT, "_PyRuntime");
	uint32_t minor, i, version;

	py_this_state = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
	/* A symbol of any image may point anywhere: read checked, and only a
	 * function called. */
	if (!at || !runtime || !py_is_function((void *)py_this_state) ||
	    copy_checked(&version, (uint64_t)(uintptr_t)at, sizeof(version)) || version >> 24 != 3)
		return 0;
	minor = (version >> 16) & 0xff;
	for (i = 0; i < RING_PY_LAYOUTS && minor; i++)
		if (layouts[i].minor == minor)
			found = &layouts[i];
	if (!found && minor)
		found = py_image_layout(control, runtime, minor);
	if (!found || !py_layout_fits(found))
		return 0;
	py_layout = *found;
	dl_iterate_phdr(find_py_text, runtime);
	if (!py_hi)
		return 0;
	py_on = 1;
	return 1;
}

/*
 * Reads of the interpreter's memory (issue 40). The walk follows pointers
 * the program's memory holds, which a corrupted frame chain or a fake
 * interpreter can set to anything: no read may fault, as none of BPF's
 * (bpf_probe_read_user) does. A read is made in place only inside a range
 * known to be mapped:
 *   - the thread state's bytes the walk reads, checked by a read that
 *     cannot fault (process_vm_readv on this process) when
 *     PyGILState_GetThisThreadState first returns it, and trusted while it
 *     returns it;
 *   - the thread's datastack chunk (where its newest frames are: in 3.11+
 *     the frames of functions are pushed there), checked whole when the
 *     thread state first names it, and trusted while it names it with the
 *     same size (the interpreter frees neither while it names them, and
 *     would itself fault on them);
 *   - the thread's stack from the walk's own stack pointer up to the end of
 *     the mapping (/proc/self/maps) that held it at the thread's first walk
 *     (3.11's and 3.12's _PyCFrame, 3.12+'s entry frames);
 * and anything else (frames of generators, in older chunks; code objects,
 * their strings and tables, read for a new stack's code records) by
 * process_vm_readv, about 1 us a read (the headers of a new stack's code
 * objects: one read for 32): a read that fails ends the walk, or leaves
 * the record out. Per thread, no allocation, async-signal-safe (the
 * thread's first walk reads /proc/self/maps once).
 */
struct py_thread {
	uint64_t ts, ts_end;	     /* the thread state, [ts, ts_end) */
	uint64_t chunk, chunk_end;   /* its datastack chunk, [chunk, chunk_end) */
	uint64_t stack_lo, stack_hi; /* the thread's stack mapping; hi 1: not found */
	/* The last walk's Python words (in ring_stack's frame, which calls
	 * py_code_record after it), until its code records are written. */
	const uint64_t *words;
	int nwords;
};
static __thread struct py_thread py_self __attribute__((tls_model("initial-exec")));
/* A datastack chunk larger is read checked, frame by frame (CPython's are
 * 16 KiB unless a frame needs more). */
#define PY_CHUNK_MAX (1U << 20)
/* What a range's check reads into, never looked at (threads may write it
 * at once): 16 pages, one system call for each 64 KiB checked. */
static char py_scratch[4096] DATA;

/* Whether [lo, lo + len) is mapped readable now (len > 0). */
static int py_readable(uint64_t lo, uint64_t len)
{
	struct iovec local[16], remote;
	uint64_t n;
	int i;

	for (i = 0; i < 16; i++) {
		local[i].iov_base = py_scratch;
		local[i].iov_len = sizeof(py_scratch);
	}
	if (lo + len < lo)
		return 0;
	for (; len; lo += n, len -= n) {
		n = len < 16 * sizeof(py_scratch) ? len : 16 * sizeof(py_scratch);
		remote.iov_base = (void *)(uintptr_t)lo;
		remote.iov_len = n;
		if (syscall(SYS_process_vm_readv, getpid(), local,
			    (n + sizeof(py_scratch) - 1) / sizeof(py_scratch), &remote, 1UL,
			    0UL) != (long)n)
			return 0;
	}
	return 1;
}

/* Whether [at, at + len) lies in [lo, hi). */
static inline int py_within(uint64_t at, uint64_t len, uint64_t lo, uint64_t hi)
{
	return at >= lo && at <= hi && len <= hi - at;
}

/* Whether [addr, addr + len) lies in a range known mapped (sp: the walk's
 * stack pointer). */
static int py_known(uint64_t addr, uint64_t len, uint64_t sp)
{
	const struct py_thread *p = &py_self;

	return py_within(addr, len, p->chunk, p->chunk_end) ||
	       py_within(addr, len, p->ts, p->ts_end) ||
	       (sp >= p->stack_lo && py_within(addr, len, sp, p->stack_hi));
}

/* Copies len bytes of the interpreter's memory at addr into dst, in place
 * within a range known mapped, else by a read that cannot fault; 0 on
 * success. */
static int py_read(void *dst, uint64_t addr, size_t len, uint64_t sp)
{
	if (py_known(addr, len, sp)) {
		memcpy(dst, (const void *)(uintptr_t)addr, len);
		return 0;
	}
	return copy_checked(dst, addr, len);
}

/* The word at addr, 0 if it cannot be read. */
static inline uint64_t py_word(uint64_t addr, uint64_t sp)
{
	uint64_t w;

	return py_read(&w, addr, sizeof(w), sp) ? 0 : w;
}

/* Makes ts the thread's checked thread state (the bytes its walk reads);
 * 0 if they cannot be read. */
static int py_take_state(struct py_thread *p, uint64_t ts)
{
	const uint16_t fields[] = {py_layout.off.tstate_thread_id, py_layout.off.tstate_frame,
				   py_layout.off.tstate_datastack};
	uint64_t need = 0;
	unsigned int i;

	for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
		if (fields[i] != MT_PY_NONE && fields[i] + 8U > need)
			need = fields[i] + 8U;
	p->ts = p->ts_end = 0;
	p->chunk = p->chunk_end = 0;
	if (!py_readable(ts, need))
		return 0;
	p->ts = ts;
	p->ts_end = ts + need;
	return 1;
}

/* Follows the thread state's datastack chunk (struct _PyStackChunk:
 * previous, size, then frames): trusted once checked whole, while it is
 * the thread's chunk with the same size. */
static void py_take_chunk(struct py_thread *p, uint64_t sp)
{
	uint64_t chunk = 0, size;

	if (py_layout.off.tstate_datastack != MT_PY_NONE)
		chunk = py_word(p->ts + py_layout.off.tstate_datastack, sp);
	if (!chunk) {
		p->chunk = p->chunk_end = 0;
		return;
	}
	if (chunk == p->chunk) {
		size = *(const volatile uint64_t *)(uintptr_t)(chunk + 8);
		if (size == p->chunk_end - p->chunk)
			return;
	} else if (copy_checked(&size, chunk + 8, sizeof(size))) {
		p->chunk = p->chunk_end = 0;
		return;
	}
	p->chunk = p->chunk_end = 0;
	if (size >= 24 && size <= PY_CHUNK_MAX && py_readable(chunk, size)) {
		p->chunk = chunk;
		p->chunk_end = chunk + size;
	}
}

/* The thread's state if it is this thread's and readable, with its chunk
 * and stack known; 0 if none. */
static uint64_t py_thread_state(uint64_t sp)
{
	struct py_thread *p = &py_self;
	uint64_t ts = (uint64_t)(uintptr_t)py_this_state();

	if (!ts || (ts != p->ts && !py_take_state(p, ts)))
		return 0;
	if (py_word(ts + py_layout.off.tstate_thread_id, sp) != (uint64_t)pthread_self())
		return 0;
	py_take_chunk(p, sp);
	if (!p->stack_hi && !mapping_of(sp, &p->stack_lo, &p->stack_hi))
		p->stack_hi = 1; /* not found: its reads are checked */
	return ts;
}

/* Appends the thread's Python frames to ips (nr of them so far, at most
 * MT_MAX_STACK in all); returns the new count. Each frame's fields are read
 * at once (BPF's window: frame_span bytes at frame_win, at most 72). */
int py_walk(uint64_t *ips, int nr)
{
	uint64_t sp = (uint64_t)(uintptr_t)__builtin_frame_address(0), ts, frame, code, instr,
		 start, off;
	const uint16_t win = py_layout.off.frame_win, span = py_layout.off.frame_span;
	uint8_t owner, entry, w[72];

	py_self.words = ips + nr;
	py_self.nwords = 0;
	ts = py_thread_state(sp);
	if (!ts || span > sizeof(w))
		return nr;
	frame = py_word(ts + py_layout.off.tstate_frame, sp);
	if (frame && py_layout.off.cframe_frame != MT_PY_NONE)
		frame = py_word(frame + py_layout.off.cframe_frame, sp);
	for (int i = 0; frame && i < MT_MAX_STACK && nr < MT_MAX_STACK; i++) {
		if (py_read(w, frame + win, span, sp))
			break;
		memcpy(&code, w + (uint16_t)(py_layout.off.frame_code - win), 8);
		memcpy(&instr, w + (uint16_t)(py_layout.off.frame_instr - win), 8);
		memcpy(&frame, w + (uint16_t)(py_layout.off.frame_previous - win), 8);
		owner = w[(uint16_t)(py_layout.off.frame_owner - win)];
		entry = py_layout.off.frame_is_entry != MT_PY_NONE &&
			w[(uint16_t)(py_layout.off.frame_is_entry - win)];
		if (owner == MT_PY_OWNED_BY_CSTACK) {
			ips[nr++] = MT_PY_FRAME;
			continue;
		}
		start = code + py_layout.off.code_adaptive;
		if (code && instr >= start) {
			off = (instr - start) / 2;
			if (off > MT_PY_OFF_MAX)
				off = MT_PY_OFF_MAX;
			ips[nr++] = MT_PY_FRAME | off << MT_PY_OFF_SHIFT | (code & MT_PY_CODE_MASK);
		}
		if (entry && nr < MT_MAX_STACK)
			ips[nr++] = MT_PY_FRAME;
	}
	py_self.nwords = (int)(ips + nr - py_self.words);
	return nr;
}

/* A compact str object's characters into dst (at most MT_PY_NAME bytes);
 * returns the bytes copied (0 if it cannot be read). */
static uint32_t py_copy_str(uint64_t obj, uint8_t *dst, uint32_t *state, uint64_t sp)
{
	uint64_t head[5], len, at;
	uint32_t st, kind;

	/* ob_refcnt, ob_type, length, hash, then the state word. */
	if (!obj || py_read(head, obj, sizeof(head), sp))
		return 0;
	len = head[2];
	memcpy(&st, &head[4], sizeof(st));
	*state = st;
	kind = (st >> 2) & 7;
	if (!((st >> 5) & 1))
		return 0; /* not compact: no characters in the object */
	if ((st >> 6) & 1) {
		at = obj + py_layout.off.str_ascii_data;
	} else {
		at = obj + py_layout.off.str_compact_data;
		len *= kind;
	}
	if (len > MT_PY_NAME)
		len = MT_PY_NAME;
	return py_read(dst, at, len, sp) ? 0 : (uint32_t)len;
}

/* What a code record takes from a code object's header. */
struct py_head {
	uint64_t name, file, table;
	int32_t first;
	int32_t ok;
};

/* Code objects whose headers are read at once, and the bytes read of each
 * at most (from its first field the record takes past its last: 72 in
 * 3.11 and 3.12; a layout with more is read field by field). */
#define PY_HEADS 32
#define PY_HEAD_SPAN 128

/* The header fields of the code objects codes[0..n) (n <= PY_HEADS): in
 * place in a range known mapped, else by one process_vm_readv for all
 * the others (one more past each that cannot be read); 0 if the layout's
 * span is too wide for that. */
static int py_read_heads(const uint64_t *codes, int n, struct py_head *heads, uint64_t sp)
{
	const uint16_t f[4] = {py_layout.off.code_qualname, py_layout.off.code_filename,
			       py_layout.off.code_linetable, py_layout.off.code_firstlineno};
	uint16_t lo = f[0], hi = 0;
	struct iovec local[PY_HEADS], remote[PY_HEADS];
	uint8_t bytes[PY_HEADS * PY_HEAD_SPAN];
	int i, at = 0, m = 0, idx[PY_HEADS];
	long got;

	for (i = 0; i < 4; i++) {
		lo = f[i] < lo ? f[i] : lo;
		hi = f[i] + 8 > hi ? f[i] + 8 : hi;
	}
	if (hi - lo > PY_HEAD_SPAN)
		return 0;
	for (i = 0; i < n; i++) {
		heads[i].ok = py_known(codes[i] + lo, hi - lo, sp);
		if (heads[i].ok) {
			memcpy(bytes + i * PY_HEAD_SPAN, (const void *)(uintptr_t)(codes[i] + lo),
			       hi - lo);
			continue;
		}
		idx[m] = i;
		local[m].iov_base = bytes + i * PY_HEAD_SPAN;
		local[m].iov_len = remote[m].iov_len = hi - lo;
		remote[m++].iov_base = (void *)(uintptr_t)(codes[i] + lo);
	}
	/* A read stops at the first header it cannot read: the next goes on
	 * past it. */
	while (at < m) {
		got = syscall(SYS_process_vm_readv, getpid(), local + at, (unsigned long)(m - at),
			      remote + at, (unsigned long)(m - at), 0UL);
		for (; got >= (long)(hi - lo) && at < m; got -= hi - lo)
			heads[idx[at++]].ok = 1;
		at++;
	}
	for (i = 0; i < n; i++) {
		const uint8_t *h = bytes + i * PY_HEAD_SPAN;

		if (!heads[i].ok)
			continue;
		memcpy(&heads[i].name, h + (f[0] - lo), 8);
		memcpy(&heads[i].file, h + (f[1] - lo), 8);
		memcpy(&heads[i].table, h + (f[2] - lo), 8);
		memcpy(&heads[i].first, h + (f[3] - lo), 4);
	}
	return 1;
}

/* The header fields of the code object at code, read field by field. */
static void py_read_head(uint64_t code, struct py_head *head, uint64_t sp)
{
	head->name = py_word(code + py_layout.off.code_qualname, sp);
	head->file = py_word(code + py_layout.off.code_filename, sp);
	head->table = py_word(code + py_layout.off.code_linetable, sp);
	head->ok = !py_read(&head->first, code + py_layout.off.code_firstlineno,
			    sizeof(head->first), sp);
}

/* Writes the record of the code object at code (a frame of the thread
 * runs it; head: its header's fields) unless this ring carried it. */
static void py_write_code(struct shim_ring *r, struct mt_thread *t, uint64_t code,
			  const struct py_head *h, uint64_t sp)
{
	/* As BPF's py_codes: another object at the address has other
	 * strings. Bit 62, never bit 63: not a stack's id in the table. */
	uint64_t key = (mix(mix((uint64_t)(uint32_t)ring_pid, code),
			    h->name ^ h->file << 1 ^ h->table << 2) &
			~(3ULL << 62)) |
		       1ULL << 62;
	uint32_t len = sizeof(struct mt_header) + sizeof(struct mt_py_code_record), n;
	struct mt_py_code_record *c;
	struct mt_header *rec;

	if (ring_knows(r, key))
		return;
	rec = ring_reserve(r, len);
	if (!rec)
		return;
	ring_header(rec, 0, t, MT_SHIM_PY_CODE);
	c = (struct mt_py_code_record *)(rec + 1);
	c->zero = 0;
	c->code = code;
	c->pid = (uint32_t)ring_pid;
	c->first = h->first;
	c->name_state = c->file_state = 0;
	c->name_len = py_copy_str(h->name, c->name, &c->name_state, sp);
	c->file_len = py_copy_str(h->file, c->file, &c->file_state, sp);
	c->_pad = 0;
	c->table_len = 0;
	/* ob_size's low half: a table is far below 4 GiB. */
	if (h->table && !py_read(&c->table_len, h->table + 16, sizeof(c->table_len), sp)) {
		n = c->table_len < MT_PY_TABLE ? c->table_len : MT_PY_TABLE;
		if (py_read(c->table, h->table + 32, n, sp))
			c->table_len = 0;
	}
	ring_commit(rec, len);
}

/* Writes the records of the code objects the thread's last walk found
 * that this ring did not carry yet, at ring_stack's first call for them
 * (later calls for the same walk do nothing): their headers read
 * PY_HEADS at a time, each code object's strings and table only for a
 * record. */
void py_code_record(struct shim_ring *r, struct mt_thread *t, uint64_t code)
{
	uint64_t sp = (uint64_t)(uintptr_t)__builtin_frame_address(0), codes[PY_HEADS];
	struct py_head heads[PY_HEADS];
	int k = 0, n, i, batched;

	(void)code;
	while (k < py_self.nwords) {
		/* Each code object once (a walk repeats importlib's, a
		 * recursion's): the read's cost is by header. */
		for (n = 0; k < py_self.nwords && n < PY_HEADS; k++) {
			uint64_t c = py_self.words[k] & MT_PY_CODE_MASK;

			for (i = 0; i < n && codes[i] != c; i++)
				;
			if (c && i == n)
				codes[n++] = c;
		}
		batched = py_read_heads(codes, n, heads, sp);
		for (i = 0; i < n; i++) {
			if (!batched)
				py_read_head(codes[i], &heads[i], sp);
			if (heads[i].ok)
				py_write_code(r, t, codes[i], &heads[i], sp);
		}
	}
	py_self.nwords = 0;
}
