//! Backpressure: pausing the tracked tree when a ring fills up, so a
//! capture loses nothing however fast the tree allocates.
//!
//! BPF side (bpf/memtrail.bpf.c, `check_pressure`): after submitting a
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
//! (bpf/memtrail.bpf.c, Backpressure).

pub mod room;

use std::collections::HashSet;
use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::bpf::bss::BssWord;
use crate::engine::Barrier;
use crate::proctree::cgroup::TreeCgroup;
use crate::proctree::stops::{Owner, StopState, Stops};
use crate::profile::PressureStats;
use crate::ring::RingConsumer;
use crate::sys;

/// Longest sleep of the coordinator between two looks at the latch and the
/// end of the tree (it is woken for both).
const LATCH_CHECK_MS: i32 = 100;

/// `--pressure-timeout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PressureTimeout {
    /// No pausing; loss detection only.
    #[default]
    Off,
    /// Pausing; an episode that does not recover in time kills the tree.
    After(Duration),
    /// Pausing, waiting as long as recovery takes.
    Infinite,
}

impl PressureTimeout {
    pub fn enabled(self) -> bool {
        self != Self::Off
    }
}

/// The shortest finite timeout: a pause (a wakeup, a freeze, a drain) takes
/// tens to hundreds of microseconds, so a shorter bound could not be kept.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// The longest finite timeout: anything longer is `inf` in all but name.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Why a timeout was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseTimeoutError {
    #[error(
        "invalid pressure timeout `{0}`: use 0 (no pausing), a number with a unit, ns, us, ms, \
         s or m (250ms, 2s, 1m), or inf"
    )]
    Invalid(String),
    #[error(
        "pressure timeout `{0}` has no unit: use a number with a unit, ns, us, ms, s or m \
         (`{0}s` is {0} seconds), or 0 (no pausing), or inf"
    )]
    NoUnit(String),
    #[error(
        "pressure timeout `{0}` is shorter than the {MIN_TIMEOUT:?} memtrail can keep: use at \
         least 1ms, or 0 for no pausing"
    )]
    TooShort(String),
    #[error("pressure timeout `{0}` is longer than a day: use inf to wait as long as it takes")]
    TooLong(String),
}

/// Whether `s` is a plain decimal number (`5`, `1.5`): a duration without
/// its unit.
pub fn is_plain_number(s: &str) -> bool {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

impl FromStr for PressureTimeout {
    type Err = ParseTimeoutError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseTimeoutError::Invalid(s.to_owned());
        if s == "inf" {
            return Ok(Self::Infinite);
        }
        if s == "0" {
            return Ok(Self::Off);
        }
        let (number, unit_ns) = if let Some(n) = s.strip_suffix("ns") {
            (n, 1u128)
        } else if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
            (n, 1_000)
        } else if let Some(n) = s.strip_suffix("ms") {
            (n, 1_000_000)
        } else if let Some(n) = s.strip_suffix('s') {
            (n, 1_000_000_000)
        } else if let Some(n) = s.strip_suffix('m') {
            (n, 60_000_000_000)
        } else if is_plain_number(s) {
            return Err(ParseTimeoutError::NoUnit(s.to_owned()));
        } else {
            return Err(err());
        };
        // Plain decimal numbers only: no sign, exponent or empty part.
        let valid = !number.is_empty()
            && number.chars().all(|c| c.is_ascii_digit() || c == '.')
            && number.chars().filter(|&c| c == '.').count() <= 1
            && !number.starts_with('.')
            && !number.ends_with('.');
        if !valid {
            return Err(err());
        }
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        let int: u128 = int.parse().map_err(|_| err())?;
        let mut ns = int.checked_mul(unit_ns).ok_or_else(err)?;
        let mut scale = unit_ns;
        for digit in frac.bytes() {
            // Digits past a nanosecond add nothing (they only matter to
            // tell zero from nonzero, below).
            scale /= 10;
            ns += u128::from(digit - b'0') * scale;
        }
        // One rule: zero, in any unit and with any number of zero digits,
        // is off; any other duration must be one the coordinator can keep.
        // Nothing is rounded: `0.0000000001s` is not 0.
        if number.bytes().all(|c| c == b'0' || c == b'.') {
            return Ok(Self::Off);
        }
        if ns < MIN_TIMEOUT.as_nanos() {
            return Err(ParseTimeoutError::TooShort(s.to_owned()));
        }
        if ns > MAX_TIMEOUT.as_nanos() {
            return Err(ParseTimeoutError::TooLong(s.to_owned()));
        }
        Ok(Self::After(Duration::from_nanos(ns as u64)))
    }
}

impl fmt::Display for PressureTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => write!(f, "0"),
            Self::After(d) => write!(f, "{d:?}"),
            Self::Infinite => write!(f, "inf"),
        }
    }
}

/// Records one thread can write into one ring between two of its pressure
/// checks (`MT_RECORDS_PER_THREAD` in bpf/memtrail.bpf.c).
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

/// Why a pressure episode failed.
#[derive(Debug, thiserror::Error)]
pub enum PressureError {
    #[error(
        "a pressure episode did not recover within {timeout:?}: the {pipeline} pipeline did \
         not drain; {fate}"
    )]
    Timeout {
        timeout: Duration,
        pipeline: String,
        fate: Fate,
    },
    #[error(
        "a pressure episode did not recover within {timeout:?}: the tree did not pause \
         ({what}); {fate}"
    )]
    PauseTimeout {
        timeout: Duration,
        what: String,
        fate: Fate,
    },
    #[error(
        "a pressure pause lasted {paused:?}, longer than the {timeout:?} of \
         --pressure-timeout: memtrail could not resume the tree in time (its own threads \
         were late: a loaded machine?); {fate}"
    )]
    ResumeTimeout {
        timeout: Duration,
        paused: Duration,
        fate: Fate,
    },
    #[error("pausing the tree through its cgroup failed")]
    Cgroup(#[from] crate::proctree::cgroup::CgroupError),
    #[error(transparent)]
    Sys(#[from] sys::SysError),
}

/// What became of the tree after a late pressure episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Killed (`memtrail run`: memtrail started it).
    Killed,
    /// Resumed and left running; the capture ends (`memtrail attach`).
    Detached,
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Killed => "the tracked tree was killed",
            Self::Detached => {
                "memtrail resumed the tracked processes and detached, leaving them running"
            }
        })
    }
}

impl PressureError {
    /// Whether the tree was left running (a detach) rather than killed.
    pub fn detached(&self) -> bool {
        matches!(
            self,
            Self::Timeout {
                fate: Fate::Detached,
                ..
            } | Self::PauseTimeout {
                fate: Fate::Detached,
                ..
            } | Self::ResumeTimeout {
                fate: Fate::Detached,
                ..
            }
        )
    }
}

/// When the latched episode began (`bpf_ktime_get_ns()`, which is
/// `CLOCK_MONOTONIC`) in `pressure_latch`, `None` when no episode is latched.
fn latched_ns(latch: &BssWord) -> Option<u64> {
    // Acquire pairs with the BPF program's compare-and-swap (a full
    // barrier): the producer's submitted records are visible.
    match latch.get().load(Ordering::Acquire) {
        0 => None,
        ns => Some(ns),
    }
}

/// Clears `pressure_latch`: producers may latch again.
fn clear_latch(latch: &BssWord) {
    // Release: the drain before this store happens before producers may
    // latch again.
    latch.get().store(0, Ordering::Release);
}

/// How the coordinator pauses the tree.
pub enum Pause {
    /// Freezing the tree's cgroup; BPF stops a process itself only past a
    /// ring's hard mark and records it in `hard_stops`.
    Freeze {
        cgroup: Arc<TreeCgroup>,
        /// The `hard_stops` map: tgids that stopped themselves.
        hard_stops: OwnedFd,
        /// `hard_stops_unrecorded` in .bss: self-stops `hard_stops` had no
        /// room for.
        unrecorded: BssWord,
    },
    /// SIGSTOP to every process of the tree through pidfds.
    Signal,
}

/// The pressure coordinator (runs on its own thread).
pub struct Coordinator {
    /// `pressure_latch` in .bss (see check_pressure in the BPF).
    pub latch: BssWord,
    pub tracked_map: OwnedFd,
    pub stops: Arc<Stops>,
    pub barrier: Arc<Barrier>,
    /// Pipeline names, by barrier index, for error messages.
    pub pipelines: Vec<&'static str>,
    pub timeout: PressureTimeout,
    pub pause: Pause,
    /// The `pressure_wake` ring, which the latching producer writes to with
    /// a forced wakeup.
    pub wake: RingConsumer,
    /// An epoll set over `wake` and `done_fd`.
    pub wake_epoll: OwnedFd,
    /// Set when the tree has exited, then `done_fd` signalled.
    pub done: Arc<AtomicBool>,
    /// Whether a late episode kills the tree (a command memtrail started)
    /// or resumes it and gives up (a process memtrail attached to, which
    /// it must never kill).
    pub kill_on_failure: bool,
    /// Counts pauses for the live status line.
    pub live: Option<std::sync::Arc<crate::engine::live::LiveCounters>>,
    /// Test-only: a late freeze or a late release.
    pub fault: PressureFault,
}

/// Test-only faults of the coordinator (`MEMTRAIL_FAULT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PressureFault {
    #[default]
    None,
    /// `late-pause`: pause the tree only once none of its threads runs
    /// (each busy one stopped itself at a mark; or after
    /// [`LATE_PAUSE_MAX`]), as a coordinator that gets no CPU would: the
    /// path that keeps a capture lossless when the pause comes late.
    LatePause,
    /// `late-release`: wait out the timeout after the drain, before the
    /// release: a coordinator too slow to resume the tree in time.
    LateRelease,
}

/// The longest a `late-pause` coordinator waits for the tree to stop itself.
pub const LATE_PAUSE_MAX: Duration = Duration::from_secs(2);

/// The `Instant` of a `CLOCK_MONOTONIC` reading in nanoseconds (`Instant` is
/// that clock on Linux).
fn instant_of(ns: u64) -> Instant {
    let (now, now_ns) = (Instant::now(), sys::monotonic_ns());
    now.checked_sub(Duration::from_nanos(now_ns.saturating_sub(ns)))
        .unwrap_or(now)
}

impl Coordinator {
    /// Runs until `done`; returns the episodes' statistics.
    pub fn run(mut self) -> Result<PressureStats, PressureError> {
        if let Err(err) = sys::set_thread_realtime() {
            tracing::debug!(%err, "the pressure coordinator runs at normal priority");
        }
        let mut stats = PressureStats::default();
        let mut unrecorded_seen = 0;
        loop {
            // Consume the wakeups first: the ring's epoll is level
            // triggered, so a latch set after this look still wakes us.
            self.wake.poll(|_| {});
            let Some(latched) = latched_ns(&self.latch) else {
                if self.done.load(Ordering::Acquire) {
                    return Ok(stats);
                }
                // The timeout only guards against a missed `done` signal.
                sys::epoll_wait(self.wake_epoll.as_fd(), LATCH_CHECK_MS);
                continue;
            };
            // The pause counts from the latch: no process of the tree is
            // stopped or frozen before it.
            let began = instant_of(latched);
            let resumed = self.episode(began, &mut unrecorded_seen)?;
            let pause = resumed.saturating_duration_since(began).as_nanos() as u64;
            stats.episodes += 1;
            if let Some(live) = &self.live {
                live.pauses
                    .store(stats.episodes, std::sync::atomic::Ordering::Relaxed);
            }
            stats.total_pause_ns += pause;
            stats.longest_pause_ns = stats.longest_pause_ns.max(pause);
        }
    }

    fn deadline(&self, began: Instant) -> Option<Instant> {
        match self.timeout {
            PressureTimeout::After(d) => Some(began + d),
            _ => None,
        }
    }

    fn timeout_duration(&self) -> Duration {
        match self.timeout {
            PressureTimeout::After(d) => d,
            _ => Duration::ZERO,
        }
    }

    /// One episode, from its latch (`began`) to the resume; returns when
    /// the tree was resumed.
    fn episode(&self, began: Instant, unrecorded_seen: &mut u64) -> Result<Instant, PressureError> {
        let deadline = self.deadline(began);
        if self.fault == PressureFault::LatePause {
            self.wait_for_self_stops();
        }
        match &self.pause {
            Pause::Freeze { .. } => self.freeze_tree(began, deadline, unrecorded_seen)?,
            Pause::Signal => self.stop_tree(deadline)?,
        }
        let epoch = self.barrier.raise();
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if !self.barrier.wait(epoch, remaining) {
            let lagging = self.barrier.lagging(epoch);
            let pipeline = lagging
                .iter()
                .map(|&i| self.pipelines.get(i).copied().unwrap_or("?"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(self.fail(PressureError::Timeout {
                timeout: self.timeout_duration(),
                pipeline,
                fate: self.fate(),
            }));
        }
        tracing::debug!(drained_after = ?began.elapsed(), "pipelines drained");
        if self.fault == PressureFault::LateRelease {
            std::thread::sleep(self.timeout_duration());
        }
        // The last look before the resume: a release past the deadline
        // would make the pause longer than the timeout.
        self.check_deadline(began, deadline)?;
        clear_latch(&self.latch);
        // SIGCONT first: while frozen, it discards a self-stop not yet
        // acted on, which the parent then never sees. Frozen, every
        // self-stop has been generated: nothing to wait for.
        let _ = match self.pause {
            Pause::Freeze { .. } => self.stops.release_all_generated(Owner::Pressure),
            Pause::Signal => self.stops.release_all(Owner::Pressure),
        };
        if let Pause::Freeze { cgroup, .. } = &self.pause {
            cgroup.thaw()?;
        }
        // Resuming took time too: a pause that ended past the deadline
        // fails the capture, as one that would have.
        self.check_deadline(began, deadline)?;
        Ok(Instant::now())
    }

    /// Fails the episode (killing the tree) if `deadline` has passed.
    fn check_deadline(
        &self,
        began: Instant,
        deadline: Option<Instant>,
    ) -> Result<(), PressureError> {
        match deadline {
            Some(d) if Instant::now() > d => Err(self.fail(PressureError::ResumeTimeout {
                timeout: self.timeout_duration(),
                paused: began.elapsed(),
                fate: self.fate(),
            })),
            _ => Ok(()),
        }
    }

    /// Freezes the tree's cgroup (waiting until the deadline) and holds the
    /// processes that stopped themselves at a hard mark.
    fn freeze_tree(
        &self,
        began: Instant,
        deadline: Option<Instant>,
        unrecorded_seen: &mut u64,
    ) -> Result<(), PressureError> {
        let Pause::Freeze {
            cgroup,
            hard_stops,
            unrecorded,
        } = &self.pause
        else {
            return Ok(());
        };
        let frozen = cgroup
            .freeze()
            .and_then(|()| cgroup.wait_frozen(deadline))
            .map_err(|e| self.fail(e.into()))?;
        if !frozen {
            let what = format!(
                "its cgroup {} was not frozen in time",
                cgroup.path().display()
            );
            return Err(self.fail(PressureError::PauseTimeout {
                timeout: self.timeout_duration(),
                what,
                fate: self.fate(),
            }));
        }
        // Frozen: no thread of the tree runs a BPF program now, so the
        // self-stops are all recorded.
        let pids = sys::bpf_map_u32_keys(hard_stops.as_fd())?;
        tracing::debug!(
            frozen_after = ?began.elapsed(),
            self_stopped = pids.len(),
            "tree frozen"
        );
        for &pid in &pids {
            if let Err(err) = self.stops.hold_stopped(pid.into(), Owner::Pressure) {
                tracing::debug!(pid, %err, "could not hold a self-stopped process");
            }
            let _ = sys::bpf_map_delete(hard_stops.as_fd(), &pid.to_ne_bytes());
        }
        // Relaxed: a counter read after the tree is paused, which the
        // cgroup file read (a syscall) orders after the BPF writes.
        let unrecorded = unrecorded.get().load(Ordering::Relaxed);
        if unrecorded != *unrecorded_seen {
            *unrecorded_seen = unrecorded;
            self.hold_stopping()?;
        }
        Ok(())
    }

    /// `late-pause`: waits until no thread of the tree runs, the tree is
    /// done, or [`LATE_PAUSE_MAX`] passed.
    fn wait_for_self_stops(&self) {
        let until = Instant::now() + LATE_PAUSE_MAX;
        while Instant::now() < until && !self.done.load(Ordering::Acquire) {
            let pids = sys::bpf_map_u32_keys(self.tracked_map.as_fd()).unwrap_or_default();
            let running = pids
                .into_iter()
                .any(|pid| sys::thread_states(pid.into()).is_ok_and(|t| t.running > 0));
            if !running {
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Holds every process of the tree that is stopped or has a stop
    /// pending (self-stops `hard_stops` had no room for).
    fn hold_stopping(&self) -> Result<(), PressureError> {
        for pid in sys::bpf_map_u32_keys(self.tracked_map.as_fd())? {
            let states = sys::thread_states(pid.into());
            if states.is_ok_and(|t| t.stop_pending || t.stopped > 0) {
                let _ = self.stops.hold_stopped(pid.into(), Owner::Pressure);
            }
        }
        Ok(())
    }

    /// Stops every process of the tree through pidfds, waiting for each
    /// stop until the episode's deadline. A fork made before its parent
    /// stopped adds a pid, so scan until no new one appears.
    fn stop_tree(&self, deadline: Option<Instant>) -> Result<(), PressureError> {
        let mut held: HashSet<u32> = HashSet::new();
        loop {
            let pids = sys::bpf_map_u32_keys(self.tracked_map.as_fd())?;
            let new: Vec<u32> = pids.into_iter().filter(|p| !held.contains(p)).collect();
            if new.is_empty() {
                return Ok(());
            }
            for pid in new {
                if let Err(err) = self.stops.stop(pid.into(), Owner::Pressure) {
                    tracing::debug!(pid, %err, "could not stop a tracked process");
                }
                held.insert(pid);
            }
            for &pid in &held {
                let state = self.stops.wait_stopped_until(pid.into(), deadline);
                if deadline.is_some_and(|d| Instant::now() >= d)
                    && !matches!(state, Ok(Some(StopState::Stopped | StopState::Exited)))
                {
                    return Err(self.fail(PressureError::PauseTimeout {
                        timeout: self.timeout_duration(),
                        what: format!("process {pid} did not stop in time"),
                        fate: self.fate(),
                    }));
                }
            }
        }
    }

    fn fate(&self) -> Fate {
        if self.kill_on_failure {
            Fate::Killed
        } else {
            Fate::Detached
        }
    }

    /// Kills the tree (unless [`kill_on_failure`](Self::kill_on_failure)
    /// is off) and lets go of it after a late episode.
    fn fail(&self, err: PressureError) -> PressureError {
        if self.kill_on_failure {
            self.kill_tree();
        }
        let _ = self.stops.release_all(Owner::Pressure);
        if let Pause::Freeze { cgroup, .. } = &self.pause {
            // SIGKILL reaches frozen tasks; thawing lets them die at once.
            let _ = cgroup.thaw();
        }
        err
    }

    fn kill_tree(&self) {
        let mut pids = sys::bpf_map_u32_keys(self.tracked_map.as_fd()).unwrap_or_default();
        if let Pause::Freeze { cgroup, .. } = &self.pause {
            pids.extend(cgroup.pids().unwrap_or_default());
        }
        for pid in pids {
            if let Ok(fd) = sys::pidfd_open(pid.into()) {
                let _ = sys::pidfd_send_signal(fd.as_fd(), sys::Signal::KILL);
            }
        }
    }
}

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

    /// Check that every documented form of --pressure-timeout parses.
    #[test]
    fn pressure_timeout_accepted_forms() {
        let ok = |s: &str| s.parse::<PressureTimeout>().unwrap();
        assert_eq!(ok("0"), PressureTimeout::Off);
        assert_eq!(ok("0s"), PressureTimeout::Off);
        assert_eq!(ok("inf"), PressureTimeout::Infinite);
        assert_eq!(
            ok("250ms"),
            PressureTimeout::After(Duration::from_millis(250))
        );
        assert_eq!(ok("2s"), PressureTimeout::After(Duration::from_secs(2)));
        assert_eq!(ok("1m"), PressureTimeout::After(Duration::from_secs(60)));
        assert_eq!(
            ok("1.5s"),
            PressureTimeout::After(Duration::from_millis(1500))
        );
        assert_eq!(ok("0.000ms"), PressureTimeout::Off);
        assert_eq!(ok("0ns"), PressureTimeout::Off);
        assert_eq!(ok("1ms"), PressureTimeout::After(MIN_TIMEOUT));
        assert_eq!(ok("1000us"), PressureTimeout::After(MIN_TIMEOUT));
        assert_eq!(ok("1000000ns"), PressureTimeout::After(MIN_TIMEOUT));
        assert_eq!(ok("0.001s"), PressureTimeout::After(MIN_TIMEOUT));
        assert_eq!(ok("1440m"), PressureTimeout::After(MAX_TIMEOUT));
    }

    /// Check that a nonzero timeout below the 1 ms minimum is rejected as
    /// too short, whatever its unit and however many digits it has, rather
    /// than rounded to 0 (off) (issue 11: `0.0000000001s` became 0 while
    /// `1us` was rejected as malformed).
    #[test]
    fn pressure_timeout_below_minimum_rejected() {
        for short in [
            "0.0000000001s",
            "0.00000000000000000000000000000000000001s",
            "1us",
            "1µs",
            "999us",
            "999999ns",
            "1ns",
            "0.5ms",
            "0.000999s",
        ] {
            assert_eq!(
                short.parse::<PressureTimeout>(),
                Err(ParseTimeoutError::TooShort(short.to_owned())),
                "{short:?}"
            );
        }
        assert_eq!(
            "1441m".parse::<PressureTimeout>(),
            Err(ParseTimeoutError::TooLong("1441m".to_owned()))
        );
    }

    /// Check that malformed, negative, exponent and absurd timeouts are
    /// rejected.
    #[test]
    fn pressure_timeout_rejected_forms() {
        for bad in [
            "",
            "-1",
            "abc",
            "1e99s",
            "1e3ms",
            "-1s",
            "s",
            "1",
            "10h",
            ".5s",
            "5.s",
            "1..2s",
            "99999999999999999999999m",
            "2d",
            "inf ",
            " 1s",
        ] {
            assert!(bad.parse::<PressureTimeout>().is_err(), "{bad:?} accepted");
        }
    }
}
