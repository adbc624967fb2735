/*
 * The ring path's stack walk: the interposer's caller's stack, walked
 * in-process with libunwind (dlopen'ed, as heaptrack uses it), as
 * memtrail's BPF walk would record it, and written to the thread's ring
 * before the first event that names it (struct mt_shim_stack).
 *
 * Owns: libunwind's handle (unw_bt, unw_modid), the code ranges of the
 * shim and of libc, and the C++ operator news whose frames are left out
 * (as src/unwind/table.rs flags them for BPF: MT_ROW_ALLOC_WRAPPER).
 *
 * Invariants: the words a stack record holds, and its id (bit 63 set,
 * never 0), are what BPF's walk gives for the same stack: the shim's own
 * frames and an operator new's are skipped, a signal frame's addresses
 * are exact (no call precedes them), Python frames follow (python.c).
 * A stack is written to a ring once (ring_knows), the records of its code
 * objects before it. Found once per process, at set-up (quiet); a fork's
 * child keeps them.
 *
 * Context: a thread's allocator call on the ring path (in_ring set);
 * libunwind's own allocations during the walk are quiet (MT_SHIM_OWN).
 */
#include "ring.h"
#include "stack_cache.h"

/* Frames of the shim and of operator new unw_backtrace may give before
 * the first one kept. */
#define RING_SKIP_MAX 16

int (*unw_bt)(void **, int);
size_t unw_modid;
/* The shim's own code: frames there are not the program's. libc's. */
static uint64_t shim_lo, libc_lo, libc_hi;
uint64_t shim_hi;

/* The code segments holding the shim's own code and libc's malloc. */
static int find_texts(struct dl_phdr_info *info, size_t size, void *data)
{
	uint64_t self = (uint64_t)(uintptr_t)&find_texts, libc = (uint64_t)(uintptr_t)data;
	int i;

	(void)size;
	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uint64_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;

		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		if (self >= lo && self < hi) {
			shim_lo = lo;
			shim_hi = hi;
		}
		if (libc >= lo && libc < hi) {
			libc_lo = lo;
			libc_hi = hi;
		}
	}
	return 0;
}

/* libunwind, as heaptrack loads it: unw_backtrace with a per-thread cache. */
int load_unwinder(void)
{
	void *lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
	int (*set_policy)(void *, int);
	void **space;

	if (!lib)
		return 0;
	set_policy = (int (*)(void *, int))dlsym(lib, "_ULx86_64_set_caching_policy");
	space = (void **)dlsym(lib, "_ULx86_64_local_addr_space");
	if (set_policy && space)
		set_policy(*space, 2 /* UNW_CACHE_PER_THREAD */);
	unw_bt = (int (*)(void **, int))dlsym(lib, "unw_backtrace");
	if (dlinfo(lib, RTLD_DI_TLS_MODID, &unw_modid) != 0)
		unw_modid = 0;
	return unw_bt != NULL;
}

/* The unwind tables' OPERATOR_NEW (src/unwind/table.rs): a test of
 * src/attach/shim.rs keeps the two lists the same. */
static const char *const operator_new[] = {
	"_Znwm",
	"_Znam",
	"_ZnwmRKSt9nothrow_t",
	"_ZnamRKSt9nothrow_t",
	"_ZnwmSt11align_val_t",
	"_ZnamSt11align_val_t",
	"_ZnwmSt11align_val_tRKSt9nothrow_t",
	"_ZnamSt11align_val_tRKSt9nothrow_t",
};

/*
 * The code of the C++ operator news whose frames memtrail's walk leaves
 * out (src/unwind/table.rs, MT_ROW_ALLOC_WRAPPER): those of an image
 * without a malloc of its own (libstdc++, libc++), which only call
 * malloc. Found once, at set-up, in the program's global scope and in
 * libstdc++ and libc++ (an image loaded later keeps its new's frame).
 */
#define WRAPPERS_MAX 32
static struct {
	uint64_t lo, hi;
} wrappers[WRAPPERS_MAX] DATA;
static unsigned int wrapper_count;

/* Notes `name` in `handle` as a wrapper if its image has no malloc. */
static void note_wrapper(void *handle, const char *name)
{
	const ElfW(Sym) *sym = NULL;
	Dl_info info, mine;
	void *addr = dlsym(handle, name), *m;
	unsigned int i;
	int own;

	if (!addr || wrapper_count == WRAPPERS_MAX ||
	    !dladdr1(addr, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym || !sym->st_size)
		return;
	for (i = 0; i < wrapper_count; i++)
		if (wrappers[i].lo == (uint64_t)(uintptr_t)addr)
			return;
	m = dlsym(handle, "malloc");
	own = m && dladdr(m, &mine) && mine.dli_fbase == info.dli_fbase;
	if (own)
		return;
	wrappers[wrapper_count].lo = (uint64_t)(uintptr_t)addr;
	wrappers[wrapper_count].hi = (uint64_t)(uintptr_t)addr + sym->st_size;
	wrapper_count++;
}

static void find_wrappers(void)
{
	static const char *const runtimes[] = {"libstdc++.so.6", "libc++.so.1"};
	size_t i, j;

	for (i = 0; i < sizeof(operator_new) / sizeof(operator_new[0]); i++)
		note_wrapper(RTLD_DEFAULT, operator_new[i]);
	for (j = 0; j < sizeof(runtimes) / sizeof(runtimes[0]); j++) {
		void *h = dlopen(runtimes[j], RTLD_NOLOAD | RTLD_LAZY);

		if (!h)
			continue;
		for (i = 0; i < sizeof(operator_new) / sizeof(operator_new[0]); i++)
			note_wrapper(h, operator_new[i]);
		dlclose(h);
	}
}

void find_images(void)
{
	dl_iterate_phdr(find_texts, (void *)(uintptr_t)next_malloc);
	find_wrappers();
}

/* Whether ip returns into one of those operator news. */
static inline int new_wrapper(uint64_t ip)
{
	unsigned int i;

	for (i = 0; i < wrapper_count; i++)
		if (ip > wrappers[i].lo && ip <= wrappers[i].hi)
			return 1;
	return 0;
}

/* glibc's signal trampoline, __restore_rt (mov $15,%rax; syscall), in
 * libc's code: only there is an address read (a frame found by frame
 * pointers in code without CFI, JIT code, may name any address). */
static inline int is_sigreturn(uint64_t ip)
{
	static const unsigned char code[9] = {0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05};

	return ip >= libc_lo && ip + sizeof(code) <= libc_hi &&
	       memcmp((const void *)(uintptr_t)ip, code, sizeof(code)) == 0;
}

/* Writes a new stack's record (after its code objects'). */
static uint64_t ring_stack_record(struct shim_ring *r, struct mt_thread *t, uint64_t id,
				  const uint64_t *ips, int nr, int end)
{
	uint32_t len = offsetof(struct mt_shim_stack, ips) + 8 * (uint32_t)nr;
	struct mt_shim_stack *rec = ring_reserve(r, len);

	if (!rec)
		return 0;
	/* Stamped 0: its place among the records does not matter, only that
	 * it comes before the event that names it, in this ring. */
	ring_header(&rec->hdr, 0, t, MT_SHIM_STACK);
	rec->id = id;
	rec->pid = (uint32_t)ring_pid;
	rec->nr = (uint16_t)nr;
	rec->end = (uint16_t)end;
	memcpy(rec->ips, ips, 8 * (size_t)nr);
	ring_commit(rec, len);
	return id;
}

/* The frames unw_backtrace gave (buf[i..n)) as BPF's walk records them,
 * into ips (at most ring_depth, *end MT_END_DEPTH if cut), hashed into
 * *h; their count. */
static int ring_frames(void *const *buf, int i, int n, uint64_t *ips, uint64_t *h, int *end)
{
	int nr = n - i, k, exact = 0;

	if (nr > (int)ring_depth) {
		nr = (int)ring_depth;
		*end = MT_END_DEPTH;
	}
	for (k = 0; k < nr; k++) {
		uint64_t ip = (uint64_t)(uintptr_t)buf[i + k];
		/* As memtrail's walk records them: the trampoline and the
		 * interrupted instruction plus one (no call precedes them). */
		int sig = is_sigreturn(ip);

		ips[k] = ip + (uint64_t)(exact || sig);
		exact = sig;
		*h = mix(*h, ips[k]);
	}
	return nr;
}

/* The caller's stack: its id, written to the ring first if new there. */
__attribute__((noinline)) uint64_t ring_stack(struct shim_ring *r, struct mt_thread *t)
{
	void *buf[MT_MAX_STACK + RING_SKIP_MAX + 1];
	uint64_t ips[MT_MAX_STACK], h = (uint64_t)(uint32_t)ring_pid, id, sp, bp;
	int n, i = 0, nr, k, end = MT_END_COMPLETE, py, from_sp;
	int max = (int)ring_depth + RING_SKIP_MAX + 1;
	const struct sc_entry *kept;

	/* Where unw_backtrace's walk goes on from after its own frame. */
	__asm__ volatile("mov %%rsp, %0\n\tmov %%rbp, %1" : "=r"(sp), "=r"(bp));
	if (!py_on && (kept = sc_find(t, sp, bp)) != NULL) {
		if (ring_knows(r, kept->id))
			return kept->id;
		return ring_stack_record(r, t, kept->id, kept->ips, (int)kept->nr, (int)kept->end);
	}
	/* Quiet: libunwind's own allocations (its thread-local storage's)
	 * are not the program's. */
	t->in_alloc = MT_SHIM_OWN;
	t->in_ring = 2;
	n = unw_bt(buf, max);
	/* The walk went on from sp and bp after unw_backtrace's own frame if
	 * its first frame is this call's return address, still at sp - 8. */
	from_sp = n > 0 && *(const volatile uint64_t *)(uintptr_t)(sp - 8) ==
				   (uint64_t)(uintptr_t)buf[0];
	if (__builtin_expect(sc_unw_at == -1, 0))
		sc_discover(buf, n);
	if (!py_on && from_sp)
		sc_setup(t, sp);
	t->in_ring = 1;
	t->in_alloc = 0;
	while (i < n && (uint64_t)(uintptr_t)buf[i] >= shim_lo &&
	       (uint64_t)(uintptr_t)buf[i] < shim_hi)
		i++;
	while (i < n && new_wrapper((uint64_t)(uintptr_t)buf[i]))
		i++;
	nr = ring_frames(buf, i, n, ips, &h, &end);
	/* BPF's walk looks for Python frames once it went through the
	 * interpreter's code, the frame it stopped at for the depth too. */
	py = nr;
	for (k = 0; py_on && k < nr + (end == MT_END_DEPTH); k++) {
		uint64_t ip = (uint64_t)(uintptr_t)buf[i + k];

		if (ip >= py_lo && ip < py_hi) {
			nr = py_walk(ips, nr);
			for (k = py; k < nr; k++)
				h = mix(h, ips[k]);
			break;
		}
	}
	id = mix(h, (uint64_t)nr << 16 | (uint64_t)end) | 1ULL << 63;
	if (!py_on && from_sp)
		sc_keep(t, sp, bp, buf, n, max, id, ips, nr, end);
	if (ring_knows(r, id))
		return id;
	/* A new stack: the records of its code objects first (the ring is
	 * read in order). */
	for (k = py; k < nr; k++)
		if ((ips[k] & ~MT_PY_FRAME) != 0)
			py_code_record(r, t, ips[k] & MT_PY_CODE_MASK);
	return ring_stack_record(r, t, id, ips, nr, end);
}
