/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). Owns
 * a call's stack id (capture_stack): the native walk, then the Python
 * one, hashed, looked up in `known_stacks`, and a new stack copied into a
 * record of the stack ring.
 *
 * Invariants a change here must keep: a record is reserved only for a new
 * stack; the frames are kept in the thread's frame buffer, never a per-CPU
 * map; nothing but ctx and the call state lives across the walk (the
 * stack budget).
 */

/*
 * The id of the user stack of an allocator call at its entry, 0 if none;
 * a stack not seen before is also written to the stack ring.
 *
 * Most calls come from stacks already written, so the stack is first
 * hashed as it is walked, its frames kept in the thread's frame buffer
 * (never a per-CPU map), and looked up; only a new one is copied into a
 * record reserved on the stack ring (walked again if the buffer was
 * taken). A record is thus reserved only for new stacks, and the ring's
 * space is not taken and given back a kilobyte at a time for every
 * allocation.
 */
static __always_inline __u64 capture_stack(struct pt_regs *ctx, struct inflight *cur,
					   __u32 tgid, __u64 sp)
{
	struct mt_stack_record *rec, *kept;
	struct walk_out out = {};
	__u8 one = 1;
	__u64 h;
	long err;

	if (!stack_depth)
		return 0;
	h = walk_stack(ctx, tgid, sp, walk_frames_of(true), &out);
	if (out.py)
		h = mt_py_walk(tgid, walk_frames_of(false), &out, h, 0);
	if (bpf_map_lookup_elem(&known_stacks, &h)) {
		walk_frames_done();
		return h;
	}
	/* A new stack: the records of its code objects first, for its reader
	 * to have them when it reads it (the ring is read in the order records
	 * are reserved). */
	if (out.py)
		mt_py_walk(tgid, NULL, &out, h, 1);
	rec = bpf_ringbuf_reserve(&stacks, sizeof(*rec), 0);
	if (!rec) {
		walk_frames_done();
		__sync_fetch_and_add(&drops_stacks, 1);
		return 0;
	}
	kept = walk_frames_of(false);
	if (kept) {
		/* The frames as walked (the tail past nr is not read). */
		bpf_probe_read_kernel(rec->ips, sizeof(rec->ips), kept->ips);
		container_of(kept, struct walk_frames, rec)->owner = 0;
	} else {
		/* The same walk, into the record: the stack is the thread's
		 * own and the thread is here, so it gives the same frames and
		 * hash (but the record carries what this walk saw, whatever
		 * happens). */
		h = walk_stack(ctx, tgid, sp, rec, &out);
		if (out.py)
			h = mt_py_walk(tgid, rec, &out, h, 0);
	}
	rec->id = h;
	rec->pid = tgid;
	rec->nr = out.nr;
	rec->end = out.end;
	err = bpf_map_update_elem(&known_stacks, &h, &one, BPF_NOEXIST);
	if (err == -EEXIST)
		bpf_ringbuf_discard(rec, BPF_RB_NO_WAKEUP);
	else
		bpf_ringbuf_submit(rec, submit_flags(MT_RING_STACKS));
	check_pressure(&stacks, MT_RING_STACKS, watermark_stacks, &hwm_stacks);
	return h;
}
