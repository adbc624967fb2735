/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Part of memtrail.bpf.c (a unity build: compiled only through it). The
 * shared helpers every event record goes out through: the events ring this
 * CPU writes, reserve (a failed reserve counted in drops_events), the
 * header (stamped before or after the reservation, see stamp_reserved),
 * submit flags (a wakeup only while the ring's poller sleeps) and
 * emit_event, which checks the ring's pressure after submitting.
 *
 * Invariants a change here must keep: reserve -> fill -> submit, never
 * silently dropped (every failed reserve counted); with stamp_reserved a
 * record is stamped after its reservation (the merge of src/ring/merge.rs
 * depends on it).
 */

static __always_inline __u64 submit_flags(enum mt_ring ring)
{
	return sleeping[ring] ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* The events ring this CPU writes: its own with cpu_rings, else the one
 * shared ring; NULL if userspace inserted none there. */
static __always_inline void *events_ring(void)
{
	__u32 idx = cpu_rings ? bpf_get_smp_processor_id() : 0;

	return bpf_map_lookup_elem(&event_rings, &idx);
}

static __always_inline void *reserve(void *ring, __u64 size)
{
	void *rec;

	if (!ring) {
		__sync_fetch_and_add(&drops_events, 1);
		return NULL;
	}
	rec = bpf_ringbuf_reserve(ring, size, 0);

	if (!rec)
		__sync_fetch_and_add(&drops_events, 1);
	return rec;
}

/* The clock reading a record is stamped with when the caller takes it
 * before reserving: with stamp_reserved every record is stamped after it is
 * reserved instead (fill_header_at), for the merge's sake. */
static __always_inline __u64 clock_before(void)
{
	return stamp_reserved ? 0 : bpf_ktime_get_ns();
}

static __always_inline void fill_header_at(struct mt_header *hdr, __u64 ts,
					    __u64 pid_tgid, __u16 kind, __u16 flags)
{
	/* With stamp_reserved: after the reservation, so that a record
	 * reserved after the merge looked at a ring is stamped after that
	 * look. */
	hdr->ts_ns = stamp_reserved ? bpf_ktime_get_ns() : ts;
	hdr->pid = pid_tgid >> 32;
	hdr->tid = (__u32)pid_tgid;
	hdr->kind = kind;
	hdr->flags = flags;
	hdr->_pad = 0;
}

static __always_inline void fill_header(struct mt_header *hdr, __u64 pid_tgid,
					 __u16 kind, __u16 flags)
{
	fill_header_at(hdr, clock_before(), pid_tgid, kind, flags);
}

/* An event record stamped ts (0: see event_clock). */
static __always_inline void emit_event(__u64 ts, __u64 pid_tgid, __u16 kind,
					__u16 flags, __u64 addr, __u64 size,
					__u64 old_addr, __u64 aux)
{
	void *ring = events_ring();
	struct mt_alloc_event *e = reserve(ring, sizeof(*e));

	if (!e)
		return;
	fill_header_at(&e->hdr, ts, pid_tgid, kind, flags);
	e->addr = addr;
	e->size = size;
	e->old_addr = old_addr;
	e->aux = aux;
	bpf_ringbuf_submit(e, submit_flags(MT_RING_EVENTS));
	check_pressure(ring, MT_RING_EVENTS, watermark_events, &hwm_events);
}

/* A memory syscall's record (old_size: mremap's, in the aux field). */
static __always_inline void emit_alloc(__u64 pid_tgid, __u16 kind, __u16 flags,
					__u64 addr, __u64 size, __u64 old_addr,
					__u64 old_size)
{
	emit_event(clock_before(), pid_tgid, kind, flags, addr, size, old_addr,
		   old_size);
}
