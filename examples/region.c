/* Exact allocation counts of a piece of C code, through memtrail's C ABI
 * (include/memtrail.h): the process tracks itself, and a region counts the
 * heap events of the code between its begin and its end.
 *
 * Build and run (as root, or with memtrail's capabilities):
 *   cargo build --release --lib
 *   cc -Iinclude examples/region.c -Ltarget/release -lmemtrail \
 *      -Wl,-rpath,$PWD/target/release -o region && ./region
 * It prints the region's counts: 3 allocations, 1 free, 600 bytes
 * allocated, 200 freed, a peak of 600, 2 blocks (400 bytes) live at its
 * end. tests/examples.rs builds and runs it. */
#include <stdio.h>
#include <stdlib.h>

#include "memtrail.h"

/* The code measured: three blocks, one of them freed. noinline and the
 * volatile pointer keep the compiler from folding the calls away. */
static void *volatile kept[3];

__attribute__((noinline)) static void work(void)
{
	kept[0] = malloc(100);
	kept[1] = malloc(200);
	kept[2] = malloc(300);
	free(kept[1]);
}

int main(void)
{
	memtrail_session *session = NULL;
	memtrail_region_counts counts = { .size = sizeof counts };

	/* NULL options: the defaults. */
	if (memtrail_track_self(NULL, &session) != MEMTRAIL_OK) {
		fprintf(stderr, "memtrail: %s\n", memtrail_last_error());
		return 1;
	}
	/* begin and end allocate nothing on this thread: the region holds
	 * exactly work()'s calls. */
	if (memtrail_region_begin(session, "work") != MEMTRAIL_OK)
		goto fail;
	work();
	if (memtrail_region_end(session, &counts) != MEMTRAIL_OK)
		goto fail;
	free(kept[0]);
	free(kept[2]);

	printf("allocations=%llu frees=%llu allocated_bytes=%llu freed_bytes=%llu "
	       "peak_live_bytes=%llu live_allocations=%llu live_bytes=%llu\n",
	       (unsigned long long)counts.allocations, (unsigned long long)counts.frees,
	       (unsigned long long)counts.allocated_bytes, (unsigned long long)counts.freed_bytes,
	       (unsigned long long)counts.peak_live_bytes,
	       (unsigned long long)counts.live_allocations,
	       (unsigned long long)counts.live_bytes);
	return memtrail_session_free(session) == MEMTRAIL_OK ? 0 : 1;

fail:
	fprintf(stderr, "memtrail: %s\n", memtrail_last_error());
	memtrail_session_free(session);
	return 1;
}
