/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Record layouts shared by the BPF programs and userspace.
 *
 * Userspace never mirrors these by hand: each type has a dummy global instance
 * in memtrail.bpf.c, so libbpf-cargo emits it into the skeleton's `types`
 * module and src/ decodes records through those generated definitions. The
 * preload shim (preload/shim.h) includes this header as it is.
 *
 * Every ring record starts with `struct mt_header`; `kind` selects the rest.
 */
#ifndef MEMTRAIL_H
#define MEMTRAIL_H

/* Record kinds. Allocator API kinds come first and match the probe cookies. */
enum mt_kind {
	MT_MALLOC = 1,
	MT_CALLOC = 2,
	MT_REALLOC = 3,
	MT_REALLOCARRAY = 4,
	MT_ALIGNED_ALLOC = 5,
	MT_MEMALIGN = 6,
	MT_POSIX_MEMALIGN = 7,
	MT_VALLOC = 8,
	MT_PVALLOC = 9,
	MT_FREE = 10,
	/* Start of an outermost realloc of a non-NULL pointer: the old block
	 * leaves the caller's hands here, before another thread can reuse it. */
	MT_REALLOC_BEGIN = 11,
	/* Frees the preload shim batched (struct mt_free_batch, issue 22):
	 * on the events ring only, each block an MT_FREE to userspace. */
	MT_FREE_BATCH = 12,
	/* A call stack the preload shim walked in its process and wrote to
	 * its ring (struct mt_shim_stack): events pipeline only, issue 22. */
	MT_SHIM_STACK = 13,
	/* A Python code object's record the preload shim wrote to its ring
	 * (struct mt_py_code_record after the header): events pipeline only,
	 * before the first stack of that ring naming the object. */
	MT_SHIM_PY_CODE = 14,
	MT_MMAP = 16,
	MT_MUNMAP = 17,
	MT_MREMAP = 18,
	MT_BRK = 19,
	/* mprotect(addr, len, prot) of a tracked thread that succeeded. */
	MT_MPROTECT = 20,
	/* A process's resident set size moved (struct mt_rss_event). */
	MT_RSS = 21,
	MT_FORK = 32,
	MT_EXEC = 33,
	MT_EXIT = 34,
	/* USDT region markers (include/memtrail_usdt.h); they are also the
	 * attach cookies of the marker probes. */
	MT_REGION_BEGIN = 40,
	MT_REGION_END = 41,
	/* A process of the tree named its new preload-shim ring file (the
	 * shim's hook, issue 40; struct mt_alloc_event, addr its descriptor
	 * in that process): the record's ids are the kernel's, and memtrail
	 * takes the file from that process alone (src/ring/shim.rs). */
	MT_SHIM_RINGS = 66,
};

/*
 * Attach cookie of an allocating entry point: the record kind it makes and
 * where its arguments are, so one pair of programs serves every allocator
 * (glibc, jemalloc's mallocx family, mimalloc, tcmalloc...).
 *   bits  0-15  enum mt_kind
 *   bits 16-19  index of the size argument
 *   bits 20-23  index of the element count (size = count * size), or NONE
 *   bits 24-27  index of the old pointer (realloc-like) or of the out
 *               pointer (MT_CK_OUT_PTR), or NONE; a free's: where its
 *               pointer is, NONE for rdi
 *   bits 28-31  enum mt_cookie_flags
 *   bits 32-35  stack bytes / 8 the code before the probe took (entry-only
 *               probes moved past a `sub $n,%rsp`: the return address is
 *               at sp + 8 * this)
 *   bit  36     the size argument is a product whose overflow sets OF at
 *               the probe (MT_CK_SIZE_OF_BIT; the probe sits on the `jo`)
 *   bit  37     set in a call's saved cookie when OF was set: the size is
 *               ~0 (the call fails as for an overflowing count)
 *   bit  38     the probe is in a process that maps memtrail's preload
 *               shim (MT_CK_SHIM_BIT): a call made while the shim's real
 *               allocator call runs is the shim's call's own (no record)
 * Argument indices: 0 rdi, 1 rsi, 2 rdx, 3 rcx, 4 rax (where code the
 * probe was moved past put an argument).
 *   bits 48-63  the probe site's hit counter, 1-based (0: not counted; see
 *               enum mt_site_hits); in every probe's cookie, the region
 *               markers' too
 * A free's cookie has no size or count; its bits 16-23 and 40-43 say
 * where a free split past its NULL test records (issue 41,
 * src/attach/free_sites.rs):
 *   bits 16-19  the condition code of the conditional jump the site is on
 *   bit  20     MT_CK_FREE_COND_BIT: the free records only when that jump
 *               goes the way MT_CK_FREE_TAKEN_BIT says (its fast path's
 *               last exit: falling through, the free completes there;
 *               jumping, its slow path's site records it)
 *   bit  22     MT_CK_FREE_SPLIT_BIT: one of the two sites of a split
 *               free (each call records at one of them at most: the
 *               same stack pointer at the other is the next call)
 *   bits 40-43  the stack bytes / 8 above bits 32-35 (a slow path's site
 *               sits below the registers and frame it saved)
 */
enum mt_cookie_layout {
	MT_CK_SIZE_SHIFT = 16,
	MT_CK_COUNT_SHIFT = 20,
	MT_CK_PTR_SHIFT = 24,
	MT_CK_FLAGS_SHIFT = 28,
	MT_CK_ARG_NONE = 0xf,
	MT_CK_SP_SHIFT = 32,
	MT_CK_SIZE_OF_BIT = 36,
	MT_CK_SIZE_OVERFLOWED_BIT = 37,
	MT_CK_SHIM_BIT = 38,
	/* The call's result comes through a kernel return probe (a function
	 * whose return sites could not all be found, see enum
	 * mt_return_cookie): the entry asks for one, and a nested call of it
	 * counts in the depth its return takes back. */
	MT_CK_KRET_BIT = 39,
	MT_CK_FREE_CC_SHIFT = 16,
	MT_CK_FREE_COND_BIT = 20,
	MT_CK_FREE_TAKEN_BIT = 21,
	MT_CK_FREE_SPLIT_BIT = 22,
	MT_CK_FREE_SP_HI_SHIFT = 40,
	MT_CK_SITE_SHIFT = 48,
	/* The whole cookie of the preload shim's hook where alloc_session
	 * serves it (no site's: kind 0xffff is none): one program verified
	 * instead of two, issue 22. */
	MT_CK_SHIM_HOOK = 0xffff,
};

/*
 * Hits of each probe site in tracked threads, counted by the entry programs
 * in `site_hits[cpu % MT_HIT_ROWS][site]` (.bss), summed by userspace after
 * the capture. Rows spread CPUs over separate cache lines; the add is
 * atomic all the same (a preempted program and the next one on that CPU,
 * or two CPUs sharing a row, may count at once). Sites past MT_MAX_SITES
 * are not counted. 16 rows of 4096 counters: 512 KiB of .bss.
 */
enum mt_site_hits {
	MT_MAX_SITES = 4096,
	MT_HIT_ROWS = 16,
};

/*
 * Attach cookie of a return site (issue 40): an entry probe where an
 * allocating function returns, in place of a kernel return probe (this
 * kernel's corrupt a result when threads come and go). The site is the
 * `ret` itself, or an instruction the kernel emulates that every path to
 * it passes last (a jump, a conditional jump evaluated from the flags)
 * with the result already in its register (src/attach/returns.rs).
 *   bits  0-15  MT_RC_KIND
 *   bits 16-23  bytes / 8 from the stack pointer at the site to the call's
 *               entry stack pointer (where its return address is)
 *   bits 24-27  the condition code of the conditional jump (MT_RC_COND)
 *   bit  28     MT_RC_COND: the site is a conditional jump, the return
 *               follows only when its outcome is MT_RC_TAKEN's
 *   bit  29     MT_RC_TAKEN: the return follows the taken branch
 *   bits 30-33  the register holding the result (enum mt_usdt_reg)
 *   bit  38, bits 48-63  as for an entry (MT_CK_SHIM_BIT, the hit counter)
 */
enum mt_return_cookie {
	MT_RC_KIND = 0xfffe,
	MT_RC_DELTA_SHIFT = 16,
	MT_RC_CC_SHIFT = 24,
	MT_RC_COND_BIT = 28,
	MT_RC_TAKEN_BIT = 29,
	MT_RC_REG_SHIFT = 30,
};

enum mt_cookie_flags {
	/* The result is written through the pointer argument; the call
	 * returns 0 on success (posix_memalign). */
	MT_CK_OUT_PTR = 1,
	/* Resizes in place and returns the new size (jemalloc's xallocx). */
	MT_CK_RESULT_IS_SIZE = 2,
	/* C++ operator new: captures the stack for the allocator call it
	 * makes, makes no record itself (see alloc_enter). */
	MT_CK_NEW = 4,
	/* A libc wrapper of a memory syscall (mmap, sbrk): captures the stack
	 * for the syscall it makes, makes no record itself; the kind says
	 * which syscall (MT_MMAP or MT_BRK). See alloc_enter. */
	MT_CK_SYSCALL = 8,
};

/* Rings, as indices of the pollers' `sleeping` flags. */
enum mt_ring {
	MT_RING_EVENTS = 0,
	MT_RING_STACKS = 1,
	MT_RING_MAPPINGS = 2,
	MT_RING_ATTACH = 3,
	MT_RINGS = 4,
};

/* mt_header.flags */
enum mt_flags {
	/* A syscall made inside an allocator call on the same thread: the
	 * allocator's own backing memory, not a user allocation. */
	MT_F_IN_ALLOCATOR = 1,
};

/* PROT_* bits of mmap and mprotect records (mt_alloc_event.old_addr). */
enum mt_prot {
	MT_PROT_READ = 1,
	MT_PROT_WRITE = 2,
	MT_PROT_EXEC = 4,
};

/* Bounded copy of an exec'd file name. */
#define MT_PATH_MAX 256

/* Frames a stack record holds (the first is the allocator's return
 * address, read from the stack at entry). */
#define MT_MAX_STACK 128

/* Bounded copy of a mapped file's name (its last path component). */
#define MT_NAME_MAX 64

struct mt_header {
	/* bpf_ktime_get_ns() when the record was made; 0 on allocator events
	 * that skipped the clock (memtrail.bpf.c: event_clock), which take
	 * the latest reading before them in the ring. */
	__u64 ts_ns;
	__u32 pid;   /* tgid */
	__u32 tid;
	__u16 kind;  /* enum mt_kind */
	__u16 flags; /* enum mt_flags */
	__u32 _pad;
};

/*
 * Allocator calls, frees and memory syscalls.
 *   malloc & co: addr = result, size = bytes asked (calloc n*m, saturating)
 *   realloc:     addr = result, size = new size, old_addr = argument
 *   free:        addr = argument
 *   mmap:        addr = result, size = length, old_addr = prot (enum
 *                mt_prot; 0: PROT_NONE, a reservation), aux = the stack of
 *                the libc wrapper that made it (0: none, see exit_mmap)
 *   mprotect:    addr, size = arguments, old_addr = the new prot
 *   munmap:      addr, size = arguments
 *   mremap:      addr = result, size = new length, old_addr/aux = the old
 *                address and length
 *   brk:         addr = new program break, size = requested break,
 *                aux = the stack of the sbrk that made it (0: none)
 */
struct mt_alloc_event {
	struct mt_header hdr;
	__u64 addr;
	__u64 size;
	__u64 old_addr;
	/* mremap: old_size; allocator calls, mmap and brk: the call stack's
	 * id, 0 if none.
	 * One field for the two keeps the record at 56 bytes, 64 in the ring:
	 * one cache line. */
	__u64 aux;
};

/*
 * A call stack, on the stack ring. Written once per distinct (process,
 * stack): the BPF program hashes a stack as it walks it, and only for a new
 * hash walks it again into a reserved record (discarded if another thread
 * wrote the same stack meanwhile).
 *   ips[0 .. nr): return addresses, innermost first.
 */
struct mt_stack_record {
	__u64 id;   /* hash of pid and frames; never 0 */
	__u32 pid;  /* tgid: frames are addresses of this process */
	__u16 nr;   /* end of the frames in ips */
	__u16 end;  /* enum mt_stack_end: why the walk stopped there */
	__u64 ips[MT_MAX_STACK];
};

/*
 * A call stack the preload shim walked in-process (its ring path, issue 22),
 * on one of its rings, before the first record that names it. The same
 * fields as mt_stack_record after a header, with nr frames only.
 */
struct mt_shim_stack {
	struct mt_header hdr; /* kind MT_SHIM_STACK */
	__u64 id;             /* never 0; bit 63 set (BPF's ids may have it too) */
	__u32 pid;
	__u16 nr;
	__u16 end;
	__u64 ips[MT_MAX_STACK];
};

/* Why a stack walk stopped (mt_stack_record.end). */
enum mt_stack_end {
	/* The outermost frame: a return address the unwind table marks
	 * undefined (_start, clone), or a frame-pointer chain's end. */
	MT_END_COMPLETE = 0,
	/* --stack-depth frames were kept and there was another one. */
	MT_END_DEPTH = 1,
	/* A frame in code without an unwind table (an image without CFI,
	 * JIT code, a table the maps could not hold) or without a row in its
	 * image's table, where the frame-pointer step could not go on (or
	 * was not allowed: --unwind dwarf). */
	MT_END_NO_TABLE = 2,
	/* Stack memory the unwinder needed could not be read, or a step did
	 * not move up the stack. */
	MT_END_UNREADABLE = 3,
	/* A return address outside every executable mapping of the process. */
	MT_END_NOT_CODE = 4,
	/* A CFI rule the BPF unwinder does not evaluate. */
	MT_END_UNSUPPORTED = 5,
	/* The process's mappings could not be looked at (mmap lock held). */
	MT_END_BUSY = 6,
	/* The stack began at this frame, switched to from another (issue
	 * 41): a return address at a function's first instruction, which no
	 * call returns to (makecontext's trampoline a coroutine returns to),
	 * or a frame whose rules put its caller's frame below it (a stack
	 * segment above the stack it was called from: psm, fibers). */
	MT_END_STACK_SWITCH = 7,
};

/* --unwind (the `unwind_mode` tunable). */
enum mt_unwind_mode {
	/* Unwind tables where an image has them, frame pointers elsewhere. */
	MT_UNWIND_AUTO = 0,
	MT_UNWIND_FP = 1,
	MT_UNWIND_DWARF = 2,
};

/*
 * Unwind tables (src/unwind compiles them from .eh_frame/.debug_frame): one
 * per image, its rows sorted by address in the `unwind_rows` array, found
 * by image in `unwind_images`. A row holds from its pc to the next row's.
 *   kind = enum mt_unwind_cfa | enum mt_unwind_rbp << 4 | MT_CFA_OFF_X8?
 *   the return address is at CFA - 8.
 */
enum mt_unwind_cfa {
	/* No CFI covers this address. */
	MT_CFA_NONE = 0,
	MT_CFA_RSP = 1, /* CFA = rsp + cfa_off */
	MT_CFA_RBP = 2, /* CFA = rbp + cfa_off */
	/* The PLT's expression: CFA = rsp + 8, + 8 more when
	 * (pc & 15) >= rbp_off. */
	MT_CFA_PLT = 3,
	/* The outermost frame: the return address is undefined. */
	MT_CFA_END = 4,
	/* The signal trampoline (__restore_rt): rsp points at the ucontext
	 * the kernel saved; the interrupted registers are in it. */
	MT_CFA_SIGNAL = 5,
	/* A rule BPF does not evaluate (another register, an expression). */
	MT_CFA_UNSUPPORTED = 6,
	/* CFA = rsp + 8 * the 24-bit word count (u16)cfa_off | (u8)rbp_off
	 * << 16: a frame past MT_CFA_OFF_X8's 256 KiB (rustc's run_compiler
	 * keeps 527 KiB, issue 41). rbp_off holds no offset: MT_RBP_AT means
	 * saved at CFA - 16. */
	MT_CFA_RSP_FAR = 7,
};

enum mt_unwind_rbp {
	MT_RBP_SAME = 0, /* the caller's rbp is still in rbp */
	MT_RBP_AT = 1,   /* saved at CFA + rbp_off */
	MT_RBP_LOST = 2, /* not recoverable by this unwinder */
};

/* Flags in a row's kind, above the rbp rule. */
enum mt_unwind_flags {
	MT_ROW_RBP_MASK = 0x30,
	/* Code of a C++ operator new that only calls malloc (libstdc++,
	 * libc++: no probe of its own, issue 22): a stack walked from an
	 * allocator entry whose first frame is here starts at the caller,
	 * the user's new expression. */
	MT_ROW_ALLOC_WRAPPER = 0x80,
};
/* In a row's kind: cfa_off counts 8-byte words (a frame of more than 32 KiB:
 * LLVM's loop strength reduction keeps 38 KiB on the stack). */
#define MT_CFA_OFF_X8 0x40

struct mt_unwind_row {
	__u32 pc;       /* image address (ELF virtual address) */
	__s16 cfa_off;
	__u8 kind;
	__s8 rbp_off;
};

/*
 * An image's table: its rows, and a page index into them that narrows each
 * search to one page's rows. Page p of the image (addresses from
 * (base_page + p) << 12) starts at the row the `pc` of slot pages + p names
 * (the first row at or above it); slot pages + npages names the end of the
 * rows. Slots are the unwind tables' shared array (`unwind_slot` in BPF).
 */
struct mt_unwind_image {
	__u32 pages;     /* slot of the image's first page index entry */
	__u32 npages;
	__u32 base_page; /* the first row's address >> 12 */
	__u32 _pad;
	/* image address = file offset + bias (of the executable segment) */
	__s64 bias;
};

/*
 * Python frames (issue 25). A stack walked through a CPython interpreter
 * (3.11 and later) carries, after its native frames, the thread's Python
 * frames innermost first: MT_PY_FRAME | instruction offset (code units,
 * clamped to MT_PY_OFF_MAX) << MT_PY_OFF_SHIFT | the code object's address.
 * MT_PY_FRAME alone ends the frames one run of the interpreter loop
 * (`_PyEval_EvalFrameDefault`) executed: the n-th such group stands for the
 * n-th interpreter-loop frame among the native ones.
 */
#define MT_PY_FRAME (1ULL << 63)
/* In a native frame's word: its image's unwind table has no row for it, and
 * the walk found its caller by frame pointer (--unwind auto, issue 41). */
#define MT_FP_STEP_FRAME (1ULL << 62)
#define MT_PY_OFF_SHIFT 47
#define MT_PY_OFF_MAX 0xffffULL
#define MT_PY_CODE_MASK ((1ULL << MT_PY_OFF_SHIFT) - 1)
/* An offset that does not apply to this version. */
#define MT_PY_NONE 0xffff

/* Where an interpreter keeps what the walk reads: byte offsets into
 * _PyRuntime, PyInterpreterState, PyThreadState, _PyCFrame,
 * _PyInterpreterFrame and PyCodeObject (per-version tables in src/python,
 * or the interpreter's own _Py_DebugOffsets). */
struct mt_py_offsets {
	__u16 runtime_interp_head; /* _PyRuntime.interpreters.head */
	__u16 interp_threads_head; /* PyInterpreterState.threads.head */
	__u16 tstate_next;
	__u16 tstate_thread_id;    /* pthread_self() of the thread */
	/* tstate->cframe (3.11, 3.12) or tstate->current_frame (3.13+) */
	__u16 tstate_frame;
	/* _PyCFrame.current_frame; MT_PY_NONE: tstate_frame is the frame */
	__u16 cframe_frame;
	__u16 frame_code;     /* f_code / f_executable */
	__u16 frame_instr;    /* prev_instr / instr_ptr */
	__u16 frame_previous;
	__u16 frame_owner;    /* FRAME_OWNED_BY_CSTACK (3): an entry shim, 3.12+ */
	__u16 frame_is_entry; /* 3.11; MT_PY_NONE later */
	__u16 code_adaptive;  /* co_code_adaptive: the first code unit */
	/* What a code record copies (struct mt_py_code_record). */
	__u16 code_qualname;
	__u16 code_filename;
	__u16 code_firstlineno;
	__u16 code_linetable;
	__u16 str_ascii_data;   /* sizeof(PyASCIIObject) */
	__u16 str_compact_data; /* sizeof(PyCompactUnicodeObject) */
	/* The bytes of a frame the walk reads at once: frame_span (at most
	 * 72) from frame_win, holding the frame_* fields above (each pointer
	 * 8-aligned from frame_win). */
	__u16 frame_win;
	__u16 frame_span;
	/* _PyRuntime.gilstate.tstate_current (3.11: the thread state holding
	 * the GIL); MT_PY_NONE later */
	__u16 runtime_tstate;
	/* PyThreadState.datastack_chunk: the chunk of the thread's newest
	 * frames (the preload shim reads frames there unchecked; BPF does not
	 * read it) */
	__u16 tstate_datastack;
};

/* An interpreter image (py_images, by file identity: runtime is
 * _PyRuntime's address minus the image's load address) or a process
 * running it (py_procs, by tgid: runtime is the address). */
struct mt_py_image {
	__u64 runtime;
	struct mt_py_offsets off;
	/* 3.12+: the tls_index ({module id, offset}) of _Py_tss_tstate, the
	 * thread-local current thread state (NULL while the thread does not
	 * hold the GIL), as runtime; 0 when not found. */
	__u64 tls_index;
	/* py_procs: where the thread's _Py_tss_tstate is, from its fs base
	 * (the same for every thread of a process when the module's block is
	 * in static TLS); 0 until a walk found it, MT_PY_NO_TLS if not found. */
	__s64 tls_tpoff;
};

#define MT_PY_NO_TLS 1

/* Bytes of a name and of a location table a code record holds (longer
 * ones are cut: userspace reads the rest while the process lives). */
#define MT_PY_NAME 256
#define MT_PY_TABLE 1024

/*
 * A code object, on the stack ring, before the first stack that names it
 * in its process: what names its frames, copied while the process runs
 * (it may be gone when the stack is read). `zero` tells it from a stack
 * record, whose id is never 0. A code object freed and another made at its
 * address gets a record of its own (the pointers to its strings and table
 * differ). Strings are CPython's compact ones: `*_state` their state word
 * (kind, compact, ascii), `*_len` the bytes copied.
 */
struct mt_py_code_record {
	__u64 zero;
	__u64 code;
	__u32 pid;
	__s32 first; /* co_firstlineno */
	__u32 name_state;
	__u32 name_len;
	__u32 file_state;
	__u32 file_len;
	__u32 table_len; /* co_linetable's size; table holds at most MT_PY_TABLE */
	__u32 _pad;
	__u8 name[MT_PY_NAME]; /* co_qualname */
	__u8 file[MT_PY_NAME]; /* co_filename */
	__u8 table[MT_PY_TABLE];
};

/*
 * An executable file mapping of a tracked process, on the mappings ring:
 * enough to turn its addresses into file offsets after the process exited.
 */
/* What an attach-ring record asks (mt_mapping_record.kind; every record of
 * the mappings ring is MT_REQ_IMAGE). With per-process probes (`per_process`
 * in BPF) each process of the tree is also announced when it forks, held
 * until its own probes are made; when it exits, for its probes to go; and
 * when a thread other than its leader execs, since its probes named the old
 * leader. */
enum mt_request {
	MT_REQ_IMAGE = 0, /* an image the process maps; held unless attach_hold is off */
	MT_REQ_FORK = 1, /* pid = the new process (held), start = its parent */
	MT_REQ_EXIT = 2,
	MT_REQ_RELINK = 3, /* held */
};

/* Mappings ring records, and attach requests on the attach ring: an
 * executable image memtrail has not examined yet (its process is stopped
 * until userspace has attached probes to it), or with per-process probes
 * one of the other mt_request kinds. */
struct mt_mapping_record {
	__u64 ts_ns;
	__u32 pid;
	__u32 kind; /* enum mt_request */
	__u64 start;
	__u64 end;
	__u64 pgoff; /* file offset of start, in bytes */
	__u64 dev;
	__u64 ino;
	char name[MT_NAME_MAX];
};

/*
 * A tracked process's resident set size (the kernel's rss_stat tracepoint):
 * file + anonymous + shared-memory pages, in bytes, as get_mm_counter()
 * reads them (per-CPU counters: within a batch of pages a CPU of the exact
 * value). Written at the process's first change, then when it moved by
 * rss_step bytes (256 KiB) or 1/64 of the value last written since that
 * record, and as its last thread exits (then `rss` is the last value
 * written, and `peak` final).
 */
struct mt_rss_event {
	struct mt_header hdr;
	__u64 rss;
	/* The process's highest rss at any rss_stat so far (exact: every
	 * change is compared, written or not). */
	__u64 peak;
};

/* fork: a new process (not a thread) in the tracked tree. */
struct mt_fork_event {
	struct mt_header hdr; /* pid = parent */
	__u32 child_pid;
	__u32 _pad;
};

struct mt_exec_event {
	struct mt_header hdr;
	char filename[MT_PATH_MAX];
};

/*
 * The preload shim's batched frees (issue 22): the blocks one thread freed
 * since its last hook, in the order it freed them, each an MT_FREE (the
 * header's kind is MT_FREE_BATCH); the first 0 or the record's end ends
 * them. Reserved with MT_FREE_BATCH_SMALL slots (56 bytes, 64 in the ring,
 * as an allocation's) or MT_FREE_BATCH_MAX (280 bytes: an exec's record,
 * so the events ring's largest record stays what it was). The shim's
 * buffer holds MT_FREE_BATCH_MAX blocks.
 */
enum mt_free_batch_slots {
	MT_FREE_BATCH_SMALL = 4,
	MT_FREE_BATCH_MAX = 32,
};

struct mt_free_batch {
	struct mt_header hdr;
	__u64 addrs[MT_FREE_BATCH_MAX];
};

/* exit: the last thread of a process exits. */
struct mt_exit_event {
	struct mt_header hdr;
	__s32 exit_code; /* wait status as the kernel keeps it */
	__u32 _pad;
};

/* Bounded copy of a region marker's name (31 bytes and a NUL): the record
 * is 56 bytes, 64 in the ring, like an allocation's. */
#define MT_REGION_NAME_MAX 32

/*
 * A USDT region marker hit (region_begin / region_end of provider
 * `memtrail`), on the events ring so it is ordered with the thread's heap
 * events. begin: the name read from the process (empty if unreadable);
 * end: no name.
 *
 * Attach cookie of a marker probe: bits 0-15 the kind, bits 16-23 the
 * register holding the begin probe's name pointer (enum mt_usdt_reg).
 */
struct mt_region_event {
	struct mt_header hdr;
	char name[MT_REGION_NAME_MAX];
};

/* Registers a marker's argument may be in (its note's `8@%reg`). */
enum mt_usdt_reg {
	MT_REG_AX = 0, MT_REG_BX = 1, MT_REG_CX = 2, MT_REG_DX = 3,
	MT_REG_SI = 4, MT_REG_DI = 5, MT_REG_BP = 6, MT_REG_SP = 7,
	MT_REG_R8 = 8, MT_REG_R9 = 9, MT_REG_R10 = 10, MT_REG_R11 = 11,
	MT_REG_R12 = 12, MT_REG_R13 = 13, MT_REG_R14 = 14, MT_REG_R15 = 15,
	MT_USDT_REG_SHIFT = 16,
};

/* What the preload shim and the BPF program agree on beyond these records
 * (its hook's kinds, its thread state's layout). */
#include "memtrail_shim.h"

#endif /* MEMTRAIL_H */
