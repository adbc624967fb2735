/*
 * The hook path: how the shim hands a call to memtrail's BPF program
 * (bpf/shim.c, shim_hook). The hook itself, `memtrail_hook`, is
 * in boot.c: a 5-byte nop the kernel's optimized uprobe (Linux 6.18, a
 * `call` into a trampoline page that enters the kernel by a syscall
 * instead of an int3 trap) serves, then `ret`.
 *
 * What the hook program reads:
 *   rdi  the record's kind (enum mt_kind), or MT_SHIM_HELLO/MT_SHIM_FLUSH
 *        (bpf/memtrail_shim.h)
 *   rsi  the block (the argument of free, the result of an allocation)
 *   rdx  the size asked (calloc/reallocarray: the product, ~0 on overflow)
 *   rcx  the old block of a realloc
 *   r8   the thread's buffered frees (struct mt_thread's slots), r10 how
 *        many (0: none): recorded before the hook's own record
 *   r9   the interposer's frame address: its caller's return address is
 *        at r9 + 8, the caller's stack pointer at r9 + 16
 *   rbp  the caller's frame pointer (as it was at the interposer's entry)
 * so the stack walk starts at the interposer's caller exactly as a uprobe
 * at the allocator's entry starts it, and never walks the shim's frames.
 *
 * Invariant: HOOK_WITH, HOOK and HOOK_CARRY are used only in an
 * interposer's own body (always expanded there, never in a function it
 * calls): there rbp is its frame address. A call that needs no stack (the
 * hello, a flush, the ring file's name) may come from any function.
 */
#ifndef MEMTRAIL_PRELOAD_HOOK_H
#define MEMTRAIL_PRELOAD_HOOK_H

#include "shim.h"

/*
 * Calls the hook with the interposer's caller's frame pointer in rbp and
 * the interposer's frame address in r9, and n buffered frees at buf (r8,
 * r10). mt_hook_local is the hook's hidden alias (no PLT).
 */
#define HOOK_WITH(kind, a, b, c, buf, n)                                                 \
	do {                                                                             \
		register uint64_t r_di __asm__("rdi") = (uint64_t)(kind);               \
		register uint64_t r_si __asm__("rsi") = (uint64_t)(a);                  \
		register uint64_t r_dx __asm__("rdx") = (uint64_t)(b);                  \
		register uint64_t r_cx __asm__("rcx") = (uint64_t)(c);                  \
		register uint64_t r_8 __asm__("r8") = (uint64_t)(buf);                  \
		register uint64_t r_10 __asm__("r10") = (uint64_t)(n);                  \
		__asm__ volatile("mov %%rbp, %%r9\n\t"                                  \
				 "mov (%%rbp), %%rbp\n\t"                               \
				 "call mt_hook_local\n\t"                               \
				 "mov %%r9, %%rbp"                                      \
				 : "+r"(r_di), "+r"(r_si), "+r"(r_dx), "+r"(r_cx),      \
				   "+r"(r_8), "+r"(r_10)                                \
				 :                                                      \
				 : "r9", "memory");                                     \
	} while (0)

#define HOOK(kind, a, b, c) HOOK_WITH(kind, a, b, c, 0, 0)

/*
 * The hook of an allocating call, with the thread's buffered frees if it
 * has any and the buffer is free to take (not a signal handler's call
 * while the thread updates it), which are then really freed.
 */
#define HOOK_CARRY(kind, a, b, c)                                                        \
	do {                                                                             \
		struct mt_thread *t_ = &mt_self;                                         \
		if (__builtin_expect(t_->count != 0 && !t_->busy, 0)) {                  \
			unsigned int n_;                                                 \
			t_->busy = 1;                                                    \
			barrier();                                                       \
			n_ = take(t_);                                                   \
			HOOK_WITH(kind, a, b, c, t_->slots, n_);                         \
			drain(t_, n_);                                                   \
			barrier();                                                       \
			t_->busy = 0;                                                    \
		} else {                                                                 \
			HOOK(kind, a, b, c);                                             \
		}                                                                        \
	} while (0)

#endif /* MEMTRAIL_PRELOAD_HOOK_H */
