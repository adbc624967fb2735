/*
 * The ring file's handshake and set-up (ring.h): once per process, the
 * first thread that wants a ring makes the process's file, names it to
 * memtrail through the hook, waits for memtrail to take it, checks the
 * control page memtrail filled and maps the rings.
 *
 * Owns: ring_proc's page (MADV_WIPEONFORK: a fork's child starts without
 * rings) and the set-up of ring.c's globals, written once before ring_on
 * is released (a thread reads them only after it acquired ring_on).
 *
 * Invariants: the control page is checked whole (ring_control_ok) before
 * any ring is mapped from it; the mapping is MADV_DONTFORK; the file's
 * descriptor is closed once memtrail took it or the process gave up (a
 * compare-and-swap on the handshake word decides which came first).
 *
 * Context: quiet (in_ring 2, the in-allocator flag MT_SHIM_OWN): the
 * allocations and mappings made here are the shim's, not the program's.
 */
#include "hook.h"
#include "ring.h"

/* Whether a ring file's control page, of st_size bytes, is one the shim
 * can use. */
static int ring_control_ok(const struct ring_control *ctl, uint64_t st_size)
{
	uint64_t need = ((uint64_t)1 + (uint64_t)ctl->nrings * ctl->ring_pages) * RING_PAGE;

	return ctl->version == RING_VERSION && ctl->nrings != 0 && ctl->nrings <= RING_MAX &&
	       need <= st_size && ctl->data_size >= RING_PAGE &&
	       !(ctl->data_size & (ctl->data_size - 1)) && ctl->dedup_slots != 0 &&
	       !(ctl->dedup_slots & (ctl->dedup_slots - 1)) &&
	       (uint64_t)ctl->ring_pages * RING_PAGE >=
		       2 * RING_PAGE + ctl->data_size + 8ULL * ctl->dedup_slots &&
	       64 + 8ULL * ctl->nrings <= RING_CLAIMS_END;
}

/* The control page's magic, read from the file (no mapping: a fork's
 * child sets up in the middle of its program, whose mappings and unmappings
 * memtrail records). */
static uint64_t ring_magic(int fd)
{
	uint64_t magic = 0;

	if (pread(fd, &magic, sizeof(magic), 0) != (ssize_t)sizeof(magic))
		return 0;
	return magic;
}

/* Gives up on memtrail taking the file, unless it took it meanwhile: true
 * if the process gave up first. */
static int ring_abandon(int fd)
{
	struct ring_control *ctl;
	uint32_t fresh = 0;
	int gave_up;

	ctl = mmap(NULL, RING_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ctl == MAP_FAILED)
		return 1;
	gave_up = __atomic_compare_exchange_n(&ctl->state, &fresh, RING_ABANDONED, 0,
					      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
	munmap(ctl, RING_PAGE);
	return gave_up;
}

/*
 * Makes this process's ring file and waits for memtrail to take it (see
 * ring.h): its mapping, or NULL (the hook path). The wait ends when the
 * control page's magic is set, or when memtrail is gone or RING_ADOPT_NS
 * passed and the process marked the file abandoned first.
 */
static char *ring_offer(size_t *len)
{
	uint64_t deadline = now_ns() + RING_ADOPT_NS;
	unsigned int spins = 0;
	struct stat st;
	char *base = NULL;
	int fd;

	fd = memfd_create("memtrail_rings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return NULL;
	if (ftruncate(fd, RING_PAGE) != 0)
		goto out;
	HOOK(MT_SHIM_RINGS, fd, 0, 0);
	while (ring_magic(fd) != RING_MAGIC) {
		if (++spins % 256 == 0 &&
		    (now_ns() > deadline || (kill(ring_offered, 0) != 0 && errno == ESRCH)) &&
		    ring_abandon(fd))
			goto out;
		sched_yield();
	}
	if (fstat(fd, &st) != 0)
		goto out;
	base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		base = NULL;
		goto out;
	}
	/* Not in a child: it makes its own. */
	if (madvise(base, (size_t)st.st_size, MADV_DONTFORK) != 0 ||
	    !ring_control_ok((struct ring_control *)base, (uint64_t)st.st_size)) {
		munmap(base, (size_t)st.st_size);
		base = NULL;
		goto out;
	}
	*len = (size_t)st.st_size;
out:
	close(fd);
	return base;
}

/* This process's ring file (ring_offer), and whether it takes the ring
 * path with it; quiet (the calls it makes are not recorded). */
void ring_setup(void)
{
	struct ring_control *ctl;
	struct stat st;
	size_t len = 0;
	char *base;
	uint32_t i;

	if (!ring_offered || !ring_proc)
		return;
	base = ring_offer(&len);
	if (!base)
		return;
	ctl = (struct ring_control *)base;
	if ((ctl->flags & RING_F_PYTHON) && dlsym(RTLD_DEFAULT, "_PyRuntime") &&
	    !py_setup(base))
		return;
	if (ctl->pidns && (stat("/proc/self/ns/pid", &st) != 0 || (uint64_t)st.st_ino != ctl->pidns))
		return;
	ring_depth = ctl->stack_depth < MT_MAX_STACK ? ctl->stack_depth : MT_MAX_STACK;
	sc_enabled = !(ctl->flags & RING_F_NO_STACK_CACHE);
	if (ring_depth && !unw_bt && !load_unwinder())
		return;
	/* The images': a fork's child has them from its parent. */
	if (!shim_hi)
		find_images();
	for (i = 0; i < ctl->nrings; i++) {
		char *r = base + (size_t)RING_PAGE * (1 + (size_t)i * ctl->ring_pages);

		rings[i].cons = (volatile uint64_t *)r;
		rings[i].prod = (volatile uint64_t *)(r + RING_PAGE);
		rings[i].data = r + 2 * RING_PAGE;
		rings[i].dedup = (uint64_t *)(r + 2 * RING_PAGE + ctl->data_size);
		rings[i].claim = &ctl->claims[i];
	}
	ring_count = ctl->nrings;
	ring_size = ctl->data_size;
	ring_dedup = ctl->dedup_slots;
	ring_memtrail = (pid_t)ctl->memtrail_pid;
	ring_ctl = ctl;
	ring_pid = getpid();
	ring_proc->pid = ring_pid;
	__atomic_store_n(&ring_on, 1, __ATOMIC_RELEASE);
}

/* The page of ring_proc (none without MEMTRAIL_SHM or the page). */
void ring_proc_page(void)
{
	const char *env = getenv("MEMTRAIL_SHM");
	long pid = env ? strtol(env, NULL, 10) : 0;
	void *page;

	if (pid <= 0)
		return;
	page = mmap(NULL, RING_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return;
	if (madvise(page, RING_PAGE, MADV_WIPEONFORK) != 0) {
		munmap(page, RING_PAGE);
		return;
	}
	ring_offered = (pid_t)pid;
	ring_proc = page;
}
