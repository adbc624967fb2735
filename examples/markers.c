/* Region markers in a program tracked from outside: include/memtrail_usdt.h
 * is a header alone (no library to link); each marker is a `nop` with an
 * ELF note, which `memtrail run` (and `bench`, `attach`) finds and probes.
 *
 * Build and run (as root, or with memtrail's capabilities):
 *   cc -O2 -Iinclude examples/markers.c -o markers
 *   memtrail run -o markers.json -- ./markers
 * The summary prints a table of regions, and the profile's `regions`
 * section holds each one's counts (docs/profile.md, "Regions"): "load" 2
 * allocations (3,000 bytes), 1 free, 1 block of 1,000 bytes live at its
 * end; "lookup", entered 4 times, 4 allocations and 4 frees of 64 bytes.
 * tests/examples.rs builds it and checks those counts exactly. */
#include <stdlib.h>
#include <string.h>

#include "memtrail_usdt.h"

/* Stores through a volatile pointer keep the compiler from folding the
 * calls away. */
static void *volatile sink;

static char *load(void)
{
	char *table = malloc(1000);
	char *scratch = malloc(2000);

	memset(scratch, 1, 2000);
	memcpy(table, scratch, 1000);
	sink = scratch;
	free(sink);
	return table;
}

static int lookup(const char *table, int key)
{
	char *copy = malloc(64);
	int found;

	memcpy(copy, table + key, 64);
	sink = copy;
	found = copy[0] == 1;
	free(sink);
	return found;
}

int main(void)
{
	char *table;
	int hits = 0;

	MEMTRAIL_REGION_BEGIN("load");
	table = load();
	MEMTRAIL_REGION_END();

	for (int key = 0; key < 4; key++) {
		MEMTRAIL_REGION_BEGIN("lookup");
		hits += lookup(table, key);
		MEMTRAIL_REGION_END();
	}
	free(table);
	return hits == 4 ? 0 : 1;
}
