//! Each ring's room above its watermark: the rule pausing needs
//! ([`check_room`]; the module's docs, Room above the watermark, say why)
//! and the sizes it takes, and each ring's capacity and largest record
//! ([`ring_rooms`]).

/// Records one thread can write into one ring between two of its pressure
/// checks (`MT_RECORDS_PER_THREAD` in bpf/maps.bpf.h).
pub const RECORDS_PER_THREAD: u64 = 2;

/// A ring's size and its largest record, for [`check_room`].
#[derive(Clone, Copy, Debug)]
pub struct RingRoom {
    pub name: &'static str,
    /// The option that sets its size, for the error message.
    pub option: &'static str,
    pub capacity: u64,
    /// Largest record, with its 8-byte ring header.
    pub record: u64,
    /// `Some(n)`: one such ring per CPU, the option's size split between
    /// `n` of them; only its own CPU's producers write each.
    pub per_cpu: Option<u64>,
}

/// The watermark, in bytes, of a ring of `capacity` at `percent`.
pub fn watermark_bytes(capacity: u64, percent: u8) -> u64 {
    capacity * u64::from(percent.clamp(1, 99)) / 100
}

/// The room the cgroup freeze has, per CPU writing into a ring: bytes the
/// tree may add between the latch and the freeze with no producer at a hard
/// mark. Measured on two vCPUs with the coordinator at real-time priority
/// and two CPU hogs beside the fastest storm (perf/RESULTS.md, "Pauses the
/// tree cannot see"): 4 KiB per CPU already saw no stop; this is 16 times
/// that.
pub const FREEZE_ROOM_PER_CPU: u64 = 64 << 10;

/// The most freeze room a ring needs: producers on a shared ring serialize
/// on its lock, so a ring fills no faster with more CPUs.
pub const FREEZE_ROOM_MAX: u64 = 128 << 10;

/// The freeze room of a ring `producers` CPUs write into.
pub fn freeze_room(producers: u64) -> u64 {
    (FREEZE_ROOM_PER_CPU * producers.max(1)).min(FREEZE_ROOM_MAX)
}

/// Bytes a ring must hold above its watermark with pausing on: the
/// crossing record plus [`RECORDS_PER_THREAD`] records for each CPU's
/// producer, plus `freeze` bytes for the freeze to land.
pub fn min_room(record: u64, cpus: u64, freeze: u64) -> u64 {
    (RECORDS_PER_THREAD * cpus.max(1) + 1) * record + freeze
}

/// The smallest ring, doubling from `capacity`, that leaves `needed` bytes
/// above a `percent` watermark.
pub fn min_ring_size(capacity: u64, percent: u8, needed: u64) -> u64 {
    let mut size = capacity;
    while size - watermark_bytes(size, percent) < needed {
        size *= 2;
    }
    size
}

/// A ring whose room above the watermark is too small.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the {name} ring ({capacity} bytes, {option}) leaves {room} bytes above a {percent}% \
     watermark; pausing needs at least {needed} ({cpus} CPUs x {RECORDS_PER_THREAD} records \
     of {record} bytes, plus one{}): use a ring of at least {min_size} bytes at this watermark{}",
    if *freeze > 0 {
        format!(
            ", plus {freeze} for the tree to fill before its cgroup freeze lands, so that no \
             process stops itself where its parent could see it"
        )
    } else {
        String::new()
    },
    if *max_percent > 0 { format!(", or a watermark of at most {max_percent}%") } else { String::new() }
)]
pub struct RoomError {
    pub name: &'static str,
    pub option: &'static str,
    pub capacity: u64,
    pub percent: u8,
    pub room: u64,
    pub needed: u64,
    pub cpus: u64,
    pub record: u64,
    /// The freeze room in `needed` (0: pauses stop processes anyway).
    pub freeze: u64,
    /// The highest watermark this ring allows (0: none).
    pub max_percent: u64,
    /// The smallest ring (a power of two) that has the room at `percent`.
    pub min_size: u64,
}

/// Checks that every ring has [`min_room`] above its watermark; with
/// `freezer` (pauses freeze a cgroup), the freeze room included.
pub fn check_room(
    rings: &[RingRoom],
    percent: u8,
    cpus: u64,
    freezer: bool,
) -> Result<(), RoomError> {
    for ring in rings {
        let producers = if ring.per_cpu.is_some() { 1 } else { cpus };
        let room = ring.capacity - watermark_bytes(ring.capacity, percent);
        let freeze = if freezer { freeze_room(producers) } else { 0 };
        let needed = min_room(ring.record, producers, freeze);
        if room < needed {
            let max_percent = ring.capacity.saturating_sub(needed) * 100 / ring.capacity;
            // The advice is for the option, which per-CPU rings share.
            let min_size =
                min_ring_size(ring.capacity, percent, needed) * ring.per_cpu.unwrap_or(1);
            return Err(RoomError {
                name: ring.name,
                option: ring.option,
                capacity: ring.capacity,
                percent,
                room,
                needed,
                cpus: producers,
                record: ring.record,
                freeze,
                max_percent,
                min_size,
            });
        }
    }
    Ok(())
}

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
/// bpf/maps.bpf.h).
const MAPPINGS_RING_SIZE: u64 = 1 << 20;

const ATTACH_RING_SIZE: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// Check that the room rule accepts a ring at exactly its minimum and
    /// refuses it one byte short, naming the highest watermark and the
    /// smallest ring that would do (issue 11).
    #[test]
    fn pressure_room_minimum_exact() {
        let ring = |capacity| RingRoom {
            per_cpu: None,
            name: "events",
            option: "--ring-size",
            capacity,
            record: 64,
        };
        // 4 KiB at 92%: 4096 - 3768 = 328 >= (2*2+1)*64 = 320.
        assert_eq!(check_room(&[ring(4096)], 92, 2, false), Ok(()));
        let err = check_room(&[ring(4096)], 93, 2, false).unwrap_err();
        assert_eq!((err.room, err.needed, err.max_percent), (287, 320, 92));
        assert_eq!(err.min_size, 8192);
        assert!(err.to_string().contains("at most 92%"), "{err}");
        // No watermark makes a ring smaller than the room work.
        let err = check_room(&[ring(256)], 50, 2, false).unwrap_err();
        assert_eq!((err.max_percent, err.min_size), (0, 1024));
        assert!(!err.to_string().contains("at most"), "{err}");
    }

    /// Check that with the cgroup freezer a ring must also leave the freeze
    /// room above its watermark (issue 28: on 64 KiB rings a parent saw
    /// 16-32 stops), per producing CPU up to the cap, and that the error
    /// says what that room is for.
    #[test]
    fn pressure_room_includes_freeze_room() {
        let ring = |capacity, per_cpu| RingRoom {
            per_cpu,
            name: "events",
            option: "--ring-size",
            capacity,
            record: 64,
        };
        // Shared, 2 CPUs: 320 + 128 KiB; 1 MiB at 75% leaves 256 KiB.
        assert_eq!(check_room(&[ring(1 << 20, None)], 75, 2, true), Ok(()));
        let err = check_room(&[ring(64 << 10, None)], 75, 2, true).unwrap_err();
        assert_eq!((err.needed, err.freeze), (320 + (128 << 10), 128 << 10));
        assert_eq!(err.min_size, 1 << 20);
        assert!(err.to_string().contains("cgroup freeze"), "{err}");
        // Without the freezer (SIGSTOP pauses), 64 KiB does.
        assert_eq!(check_room(&[ring(64 << 10, None)], 75, 2, false), Ok(()));
        // A per-CPU ring has one producer: 64 KiB of freeze room.
        let err = check_room(&[ring(256 << 10, Some(4))], 75, 4, true).unwrap_err();
        assert_eq!(err.needed, 3 * 64 + (64 << 10));
        assert_eq!(err.min_size, 4 * (512 << 10));
        // Many CPUs on one ring: the cap.
        assert_eq!(freeze_room(16), FREEZE_ROOM_MAX);
    }
}
