/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * A deterministic ring producer for the ring consumer's tests and benchmarks.
 *
 * `produce` is a BPF_PROG_TYPE_SYSCALL program: userspace runs it with
 * BPF_PROG_TEST_RUN on a thread of its choice, passing a `struct rt_args` as
 * the context. The kernel copies the context back after the run, so the
 * `out` fields tell what the run did. Nothing else triggers it: a test fully
 * controls what lands in the ring and when.
 *
 * Each run makes `count` records of `size` bytes with consecutive sequence
 * numbers from `seq`, every one reserve -> fill -> submit, or discard for
 * every `discard_every`-th sequence number. A record is a `struct rt_record`
 * followed by a pattern: body byte i (counted from the record's start) is
 * (u8)seq ^ (u8)i, so a byte read from the wrong record or the wrong offset
 * shows. A failed reserve bumps `drops` atomically and the run goes on.
 *
 * The ring's size is its `max_entries`, set by userspace before load.
 */
#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Records one run makes at most: bpf_for's own limit is 1 << 23. */
#define RT_MAX_RECORDS (1 << 22)
/* Largest record body: the pattern fill loops over it. */
#define RT_MAX_SIZE 4096

/* rt_args.flags: choose the wakeup per record from `sleeping`. */
#define RT_AUTO_WAKEUP 4

/* Set by a consumer in deep sleep (memtrail's engine::idle::DeepSleep). */
__u64 sleeping = 0;

/* The context of one run. */
struct rt_args {
	__u64 seq;           /* in: sequence number of the first record */
	__u32 count;         /* in: records to make, at most RT_MAX_RECORDS */
	__u32 size;          /* in: body bytes, sizeof(struct rt_record)..RT_MAX_SIZE */
	__u32 discard_every; /* in: discard seq % n == n - 1; 0 discards none */
	__u32 flags;         /* in: BPF_RB_NO_WAKEUP or BPF_RB_FORCE_WAKEUP, or 0, or
	                      * RT_AUTO_WAKEUP: like memtrail's probes, wake the
	                      * consumer only while `sleeping` is set */
	__u32 submitted;     /* out: records submitted */
	__u32 discarded;     /* out: records discarded */
	__u32 dropped;       /* out: failed reserves */
	__u32 _pad;
};

/* The start of every record body. */
struct rt_record {
	__u64 seq;   /* consecutive across the records of a run */
	__u64 ts_ns; /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) when filled */
	__u32 size;  /* body bytes, this header included */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} rt_ring SEC(".maps");

/* Failed reserves over the object's life. */
__u64 drops = 0;

/* Dummy instances: make libbpf-cargo emit the types for Rust. */
struct rt_args _rt_args = {};
struct rt_record _rt_record = {};

/* Fills body bytes [sizeof(struct rt_record), size) with the pattern: whole
 * little-endian words first, then the tail byte by byte. */
static __always_inline void fill_pattern(struct bpf_dynptr *rec, __u64 seq, __u32 size)
{
	int w, i;

	bpf_for(w, sizeof(struct rt_record) / 8, size / 8) {
		__u64 *word = bpf_dynptr_data(rec, w * 8, sizeof(*word));

		if (!word)
			return;
		/* Bytes 8w..8w+7: (u8)seq ^ (u8)(8w + j) = rep((u8)(seq ^ 8w)) ^ j. */
		*word = ((__u8)(seq ^ (w * 8)) * 0x0101010101010101ULL) ^ 0x0706050403020100ULL;
	}
	bpf_for(i, size & ~7U, size) {
		__u8 *byte = bpf_dynptr_data(rec, i, 1);

		if (!byte)
			return;
		*byte = (__u8)seq ^ (__u8)i;
	}
}

/* Makes one record; returns false if the ring had no room. */
static __always_inline bool emit(struct rt_args *args, __u64 seq, __u32 size, __u64 flags)
{
	struct bpf_dynptr rec;
	struct rt_record *hdr;

	if (bpf_ringbuf_reserve_dynptr(&rt_ring, size, 0, &rec)) {
		/* A failed reserve still hands back a dynptr to release. */
		bpf_ringbuf_discard_dynptr(&rec, 0);
		__sync_fetch_and_add(&drops, 1);
		args->dropped++;
		return false;
	}
	hdr = bpf_dynptr_data(&rec, 0, sizeof(*hdr));
	if (!hdr) {
		/* Cannot happen: size >= sizeof(*hdr) was checked. */
		bpf_ringbuf_discard_dynptr(&rec, flags);
		args->discarded++;
		return true;
	}
	hdr->seq = seq;
	hdr->ts_ns = bpf_ktime_get_ns();
	hdr->size = size;
	hdr->_pad = 0;
	fill_pattern(&rec, seq, size);
	if (args->discard_every && seq % args->discard_every == args->discard_every - 1) {
		bpf_ringbuf_discard_dynptr(&rec, flags);
		args->discarded++;
	} else {
		bpf_ringbuf_submit_dynptr(&rec, flags);
		args->submitted++;
	}
	return true;
}

SEC("syscall")
int produce(struct rt_args *args)
{
	__u32 count = args->count, size = args->size;
	__u64 flags = args->flags & (BPF_RB_NO_WAKEUP | BPF_RB_FORCE_WAKEUP | RT_AUTO_WAKEUP);
	__u64 seq = args->seq;
	int i;

	args->submitted = 0;
	args->discarded = 0;
	args->dropped = 0;
	if (count > RT_MAX_RECORDS || size < sizeof(struct rt_record) || size > RT_MAX_SIZE)
		return 1;
	bpf_for(i, 0, count) {
		__u64 f = flags;

		if (f & RT_AUTO_WAKEUP)
			f = sleeping ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
		emit(args, seq + i, size, f);
	}
	return 0;
}
