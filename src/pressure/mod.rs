//! Backpressure: pausing the tracked tree when a ring fills up, so a
//! capture loses nothing however fast the tree allocates.
//!
//! BPF side (bpf/pressure.c, `check_pressure`): after submitting a
//! record, a producer whose ring is filled past the ring's watermark
//! latches a pressure episode (compare-and-swap on `pressure_latch` in the
//! BPF program's .bss). Past the ring's *hard mark* it also stops its own
//! process: the hard mark leaves room for [`RECORDS_PER_THREAD`] records of
//! the ring's largest size per live thread of the tree, which is all the
//! tree can still produce before each thread stops at its own next check.
//! Without a usable cgroup every producer past the watermark stops itself.
//!
//! Userspace side ([`Coordinator`], one thread): it sees the latch through
//! the mmap'd .bss and pauses the tree, preferably by freezing the tree's
//! cgroup ([`TreeCgroup`]: no signal, nothing the tree can observe), else by
//! taking the `Pressure` stop ownership of every process in the tracked map
//! (through [`Stops`], so pidfds, SIGSTOP). It holds the processes that
//! stopped themselves, raises the pipelines' epoch barrier so each drains
//! its ring up to the producer position after the pause, then clears the
//! latch, resumes what it holds and thaws the cgroup.
//!
//! Timeouts: `0` turns pausing off (ring loss is still detected and fails
//! the capture); a finite duration is the longest the tree may stay paused,
//! from the latch (BPF stamps it with the time: no process of the tree is
//! paused before) to the resume (the thaw, the last SIGCONT): freezing or
//! stopping the tree, draining, releasing and thawing all count, and every
//! wait gives up at the deadline. Past it the tree is killed and the
//! capture fails naming what was late — on a machine too loaded for
//! memtrail's threads to drain the rings in time too: the timeout is a
//! bound memtrail keeps, never one it stretches. `inf` waits as long as
//! recovery takes. A process memtrail attached to (`memtrail attach`) is
//! never killed: past the timeout the coordinator resumes it and the
//! capture fails as detached ([`Coordinator::kill_on_failure`] off).
//!
//! Priority: the coordinator thread runs at real-time priority
//! (`SCHED_FIFO` 1, where memtrail may) so that its wakeup, and with it
//! the freeze, does not wait for a CPU behind the tree or anything else the
//! machine runs: a pause stays invisible only if the freeze lands before a
//! producer reaches a hard mark. It never spins for long (its waits nap).
//!
//! Room above the watermark ([`check_room`]): with pausing on, each ring
//! must hold, above its watermark, [`RECORDS_PER_THREAD`] of its largest
//! records per CPU plus one (the record that crossed), so that the
//! producers running when the mark is crossed fit; with the freezer, also
//! [`freeze_room`] bytes, which the tree may fill between the latch and
//! the freeze without any producer reaching a hard mark (the freeze, and so
//! the pause, stays invisible). Smaller combinations are refused before the
//! command starts. A tree with more threads than CPUs reserves more past
//! the hard mark: BPF then latches early enough to keep the freeze room
//! (bpf/pressure.c, Backpressure).
//!
//! Files: [`timeout`] parses `--pressure-timeout`; [`room`] holds the room
//! rule and each ring's room; [`coordinator`] pauses, drains and resumes.

mod coordinator;
pub mod room;
mod timeout;

pub use coordinator::{Coordinator, Fate, LATE_PAUSE_MAX, Pause, PressureError, PressureFault};
pub use room::{
    FREEZE_ROOM_MAX, FREEZE_ROOM_PER_CPU, RECORDS_PER_THREAD, RingRoom, RoomError, check_room,
    freeze_room, min_ring_size, min_room, watermark_bytes,
};
pub use timeout::{MAX_TIMEOUT, MIN_TIMEOUT, ParseTimeoutError, PressureTimeout, is_plain_number};
