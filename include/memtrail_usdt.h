/* memtrail region markers for programs tracked from outside.
 *
 * Header only, no library to link: include it and mark regions of code
 *
 *     #include "memtrail_usdt.h"
 *
 *     MEMTRAIL_REGION_BEGIN("parse");
 *     parse(input);                    // allocations counted in "parse"
 *     MEMTRAIL_REGION_END();
 *
 * and run the program under `memtrail run` (or `memtrail bench`): the
 * summary, the profile's `regions` section and the bench results give each
 * region's allocations, frees, bytes, peak live bytes and what was still
 * live at its end (docs/profile.md). Without memtrail the markers cost one
 * `nop` and the load of the name's address; nothing is called.
 *
 * Rules:
 * - The name is a string literal (a compile error otherwise), at most 31
 *   bytes (longer names are cut).
 * - Regions are per thread and nest: END closes the innermost region the
 *   calling thread began. An inner region's events count in the outer ones.
 * - Regions of the same name are added up over every entry, on every
 *   thread and process (peak live is the largest of one entry).
 *
 * What it emits: SystemTap SDT probes (an ELF note in `.note.stapsdt`,
 * provider `memtrail`, probes `region_begin` with the name's address as its
 * one argument and `region_end` without one), the format bpftrace, perf and
 * gdb read too, so `bpftrace -l 'usdt:./prog:memtrail:*'` lists them. No
 * semaphore: the probe site is a `nop` the kernel emulates when memtrail
 * puts a uprobe there, and a semaphore would only save the name's address
 * load while making attaching bump a counter in the process.
 *
 * x86_64 only for now (other architectures get empty markers). Define
 * MEMTRAIL_USDT_DISABLE to compile the markers out. */

#ifndef MEMTRAIL_USDT_H
#define MEMTRAIL_USDT_H

#if defined(__x86_64__) && !defined(MEMTRAIL_USDT_DISABLE)

/* One probe: the nop it sits on (label 990), then its note. The note's
 * descriptor holds the probe's address, the address of `_.stapsdt.base`
 * (a one-byte section every object with probes shares, so a reader can
 * tell how far the image moved from its link-time addresses: prelink),
 * the semaphore's address (0: none), then provider, name and argument
 * description, each NUL-terminated. The "?" flag keeps the note in the
 * section group of the code around it (an inline function's COMDAT). */
#define MEMTRAIL_USDT_NOTE_(probe, args)                                     \
	"990:	nop\n"                                                       \
	"	.pushsection .note.stapsdt,\"?\",\"note\"\n"                 \
	"	.balign 4\n"                                                 \
	"	.4byte 992f-991f, 994f-993f, 3\n"                            \
	"991:	.asciz \"stapsdt\"\n"                                        \
	"992:	.balign 4\n"                                                 \
	"993:	.8byte 990b\n"                                               \
	"	.8byte _.stapsdt.base\n"                                     \
	"	.8byte 0\n"                                                  \
	"	.asciz \"memtrail\"\n"                                       \
	"	.asciz \"" probe "\"\n"                                      \
	"	.asciz \"" args "\"\n"                                       \
	"994:	.balign 4\n"                                                 \
	"	.popsection\n"                                               \
	"	.ifndef _.stapsdt.base\n"                                    \
	"	.pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n" \
	"	.weak _.stapsdt.base\n"                                      \
	"	.hidden _.stapsdt.base\n"                                    \
	"_.stapsdt.base:\n"                                                  \
	"	.space 1\n"                                                  \
	"	.size _.stapsdt.base, 1\n"                                   \
	"	.popsection\n"                                               \
	"	.endif\n"

/* Begins a region named by the string literal `name` on this thread. The
 * name's first and last bytes are read first, so its pages are in memory
 * when the probe's program copies it (it cannot fault them in). */
#define MEMTRAIL_REGION_BEGIN(name)                                          \
	do {                                                                 \
		static const char memtrail_name_[] = "" name;                \
		(void)*(volatile const char *)&memtrail_name_[0];            \
		(void)*(volatile const char *)&memtrail_name_[sizeof(memtrail_name_) - 1]; \
		__asm__ __volatile__(MEMTRAIL_USDT_NOTE_("region_begin", "8@%0") \
				     : : "r"(memtrail_name_) : "memory");   \
	} while (0)

/* Ends the innermost region this thread began. */
#define MEMTRAIL_REGION_END()                                                \
	do {                                                                 \
		__asm__ __volatile__(MEMTRAIL_USDT_NOTE_("region_end", "")  \
				     : : : "memory");                        \
	} while (0)

#else

#define MEMTRAIL_REGION_BEGIN(name) do { (void)("" name); } while (0)
#define MEMTRAIL_REGION_END() do { } while (0)

#endif

#endif /* MEMTRAIL_USDT_H */
