/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * What the preload shim (preload/, `memtrail run --preload`) and the BPF
 * program agree on beyond memtrail.h's records: the hook's kinds past
 * enum mt_kind, the values of the shim's in-allocator flag, where BPF finds
 * the shim's thread-local state, and the CPython value both Python walkers
 * compare. memtrail.h includes this file; the shim includes memtrail.h
 * (after <linux/types.h>) and checks its own layout against these with
 * _Static_assert (preload/shim.h).
 *
 * Plain #defines: a BPF or shim source that defines one again with
 * another value fails to build (clang's -Wmacro-redefined under -Werror),
 * and src/attach/shim.rs's test fails on any second definition.
 */
#ifndef MEMTRAIL_SHIM_H
#define MEMTRAIL_SHIM_H

/* The shim's hook (memtrail_hook, rdi): kinds beyond enum mt_kind.
 * HELLO: the constructor's, rsi the offset of the thread's state from the
 * thread pointer; FLUSH: only the buffered frees (r8, r10). */
#define MT_SHIM_HELLO 64
#define MT_SHIM_FLUSH 65

/* The shim's in-allocator flag (the first word of its thread state): 0
 * outside real allocator calls, 1 inside one, MT_SHIM_OWN while the shim
 * works for itself (its ring path's unwinder, its set-up): BPF leaves out
 * the anonymous mappings made then. */
#define MT_SHIM_OWN 2

/* The shim's thread state (struct mt_thread in preload/shim.h), at the
 * hello's offset from the thread pointer: the flag at 0, the count of
 * buffered frees at MT_SHIM_COUNT_OFF, then MT_FREE_BATCH_MAX block
 * pointers at MT_SHIM_SLOTS_OFF. */
#define MT_SHIM_COUNT_OFF 4
#define MT_SHIM_SLOTS_OFF 8

/* CPython's FRAME_OWNED_BY_CSTACK (3.12+: an entry frame the interpreter
 * loop pushes), as both Python walkers read a frame's owner. */
#define MT_PY_OWNED_BY_CSTACK 3

#endif /* MEMTRAIL_SHIM_H */
