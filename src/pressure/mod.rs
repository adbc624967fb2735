//! Backpressure: pausing the tracked tree when a ring fills up, so a
//! capture loses nothing however fast the tree allocates.
//!
//! BPF side (bpf/memtrail.bpf.c): after submitting a record, a producer
//! whose ring is filled past the ring's watermark latches a pressure
//! episode (compare-and-swap on `pressure_latch` in the BPF program's .bss)
//! and, if it won, stops its own process.
//!
//! Userspace side ([`Coordinator`], one thread): it sees the latch through
//! the mmap'd .bss, takes the `Pressure` stop ownership of every process in
//! the tracked map (through [`Stops`], so pidfds, and never resuming what
//! another owner still holds), confirms each has stopped, raises the
//! pipelines' epoch barrier so each drains its ring up to the producer
//! position after the stop, then clears the latch and releases its hold.
//!
//! Timeouts: `0` turns pausing off (ring loss is still detected and fails
//! the capture); a finite duration bounds each episode — past it the tree
//! is killed and the capture fails naming the pipeline that did not drain;
//! `inf` waits as long as recovery takes.

use std::collections::HashSet;
use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::engine::Barrier;
use crate::engine::idle::IdleWait;
use crate::proctree::stops::{Owner, Stops};
use crate::sys;

/// How often the coordinator looks at the latch when pausing is on.
pub const LATCH_NAP: Duration = Duration::from_millis(1);

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

/// The shortest finite timeout: the coordinator looks at the latch every
/// [`LATCH_NAP`], so a shorter bound could not be kept.
pub const MIN_TIMEOUT: Duration = LATCH_NAP;

/// The longest finite timeout: anything longer is `inf` in all but name.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Why a timeout was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseTimeoutError {
    #[error(
        "invalid pressure timeout `{0}`: use 0 (no pausing), a duration such as 250ms, 2s or \
         1m, or inf"
    )]
    Invalid(String),
    #[error(
        "pressure timeout `{0}` is shorter than the {MIN_TIMEOUT:?} memtrail can keep: use at \
         least 1ms, or 0 for no pausing"
    )]
    TooShort(String),
    #[error("pressure timeout `{0}` is longer than a day: use inf to wait as long as it takes")]
    TooLong(String),
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

/// Pressure statistics of a capture (in the profile and the summary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PressureStats {
    pub episodes: u64,
    pub total_pause_ns: u64,
    pub longest_pause_ns: u64,
    /// Highest fill of each ring, in bytes.
    pub high_water: HighWater,
}

/// Highest fill of each ring, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HighWater {
    pub events: u64,
    pub stacks: u64,
    pub mappings: u64,
    pub attach: u64,
}

impl HighWater {
    /// Each ring's higher mark of the two.
    pub fn max(self, other: Self) -> Self {
        Self {
            events: self.events.max(other.events),
            stacks: self.stacks.max(other.stacks),
            mappings: self.mappings.max(other.mappings),
            attach: self.attach.max(other.attach),
        }
    }
}

/// Why a pressure episode failed.
#[derive(Debug, thiserror::Error)]
pub enum PressureError {
    #[error(
        "a pressure episode did not recover within {timeout:?}: the {pipeline} pipeline did \
         not drain; the tracked tree was killed"
    )]
    Timeout { timeout: Duration, pipeline: String },
    #[error(transparent)]
    Sys(#[from] sys::SysError),
}

/// The latch word in the BPF program's mmap'd .bss.
pub struct Latch(*const AtomicU64);

// SAFETY: the pointer is to a u64 in a shared memory mapping that lives as
// long as the BPF skeleton, which outlives every user of the latch (the
// coordinator thread is joined before the skeleton is dropped); all access
// is atomic.
unsafe impl Send for Latch {}

impl Latch {
    /// # Safety
    /// `word` must point to the `pressure_latch` of a loaded skeleton's
    /// .bss and stay valid as long as the `Latch`.
    pub unsafe fn new(word: *mut u64) -> Self {
        Self(word.cast_const().cast())
    }

    fn get(&self) -> &AtomicU64 {
        // SAFETY: see `new`: valid, aligned, and only accessed atomically.
        unsafe { &*self.0 }
    }

    fn is_set(&self) -> bool {
        // Acquire pairs with the BPF program's compare-and-swap (a full
        // barrier): the producer's submitted records are visible.
        self.get().load(Ordering::Acquire) != 0
    }

    fn clear(&self) {
        // Release: the drain before this store happens before producers
        // may latch again.
        self.get().store(0, Ordering::Release);
    }
}

/// The pressure coordinator (runs on its own thread).
pub struct Coordinator {
    pub latch: Latch,
    pub tracked_map: OwnedFd,
    pub stops: Arc<Stops>,
    pub barrier: Arc<Barrier>,
    /// Pipeline names, by barrier index, for error messages.
    pub pipelines: Vec<&'static str>,
    pub timeout: PressureTimeout,
    /// Set when the tree has exited.
    pub done: Arc<AtomicBool>,
}

impl Coordinator {
    /// Runs until `done`; returns the episodes' statistics.
    pub fn run(self) -> Result<PressureStats, PressureError> {
        let mut stats = PressureStats::default();
        // Without pausing the latch is never set: just wait for the end.
        // With it, a latched tree has already stopped itself, so a 1 ms nap
        // only adds to the pause, and costs ~1% of a core while idle.
        let nap = if self.timeout.enabled() {
            LATCH_NAP
        } else {
            Duration::from_millis(20)
        };
        let mut idle = IdleWait::new(nap);
        loop {
            if !self.latch.is_set() {
                if self.done.load(Ordering::Acquire) {
                    return Ok(stats);
                }
                idle.idle();
                continue;
            }
            idle.reset();
            let started = Instant::now();
            self.episode(started)?;
            let pause = started.elapsed().as_nanos() as u64;
            stats.episodes += 1;
            stats.total_pause_ns += pause;
            stats.longest_pause_ns = stats.longest_pause_ns.max(pause);
        }
    }

    fn deadline(&self, started: Instant) -> Option<Instant> {
        match self.timeout {
            PressureTimeout::After(d) => Some(started + d),
            _ => None,
        }
    }

    fn episode(&self, started: Instant) -> Result<(), PressureError> {
        let deadline = self.deadline(started);
        // Stop every process of the tree; a fork made before its parent
        // stopped adds a pid, so scan until no new one appears.
        let mut held: HashSet<u32> = HashSet::new();
        loop {
            let pids = sys::bpf_map_u32_keys(self.tracked_map.as_fd())?;
            let new: Vec<u32> = pids.into_iter().filter(|p| !held.contains(p)).collect();
            if new.is_empty() {
                break;
            }
            for pid in new {
                if let Err(err) = self.stops.stop(pid as i32, Owner::Pressure) {
                    tracing::debug!(pid, %err, "could not stop a tracked process");
                }
                held.insert(pid);
            }
            for &pid in &held {
                let _ = self.stops.wait_stopped(pid as i32);
            }
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
            self.kill_tree();
            let _ = self.stops.release_all(Owner::Pressure);
            return Err(PressureError::Timeout {
                timeout: match self.timeout {
                    PressureTimeout::After(d) => d,
                    _ => Duration::ZERO,
                },
                pipeline,
            });
        }
        self.latch.clear();
        let _ = self.stops.release_all(Owner::Pressure);
        Ok(())
    }

    fn kill_tree(&self) {
        let pids = sys::bpf_map_u32_keys(self.tracked_map.as_fd()).unwrap_or_default();
        for pid in pids {
            if let Ok(fd) = sys::pidfd_open(pid as i32) {
                let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
