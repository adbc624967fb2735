//! Each ring's room: its capacity and its largest record.

use super::RingRoom;

/// Each ring's capacity and largest record (with its ring header), by ring
/// index (`enum mt_ring`); the events ring is one of `per_cpu` per-CPU
/// rings when given.
pub(crate) fn ring_rooms(
    ring_size: usize,
    per_cpu: Option<u64>,
    stack_ring_size: usize,
) -> [RingRoom; 4] {
    use crate::bpf::skel::memtrail::types as t;
    use std::mem::size_of;
    let with_header = |n: usize| (n as u64 + 8).next_multiple_of(8);
    let event = size_of::<t::mt_alloc_event>()
        .max(size_of::<t::mt_fork_event>())
        .max(size_of::<t::mt_exec_event>())
        .max(size_of::<t::mt_exit_event>())
        .max(size_of::<t::mt_free_batch>());
    let mapping = with_header(size_of::<t::mt_mapping_record>());
    [
        RingRoom {
            name: "events",
            option: "--ring-size",
            capacity: ring_size as u64,
            record: with_header(event),
            per_cpu,
        },
        RingRoom {
            name: "stacks",
            option: "--stack-ring-size",
            capacity: stack_ring_size as u64,
            record: with_header(size_of::<t::mt_stack_record>()),
            per_cpu: None,
        },
        RingRoom {
            name: "mappings",
            option: "fixed",
            capacity: MAPPINGS_RING_SIZE,
            record: mapping,
            per_cpu: None,
        },
        RingRoom {
            name: "attach",
            option: "fixed",
            capacity: ATTACH_RING_SIZE,
            record: mapping,
            per_cpu: None,
        },
    ]
}

/// Sizes of the mappings and attach-request rings (`max_entries` in
/// bpf/memtrail.bpf.c).
const MAPPINGS_RING_SIZE: u64 = 1 << 20;

const ATTACH_RING_SIZE: u64 = 1 << 20;
