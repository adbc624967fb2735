//! The heap over time: live heap bytes, live blocks and anonymous-mmap
//! bytes of the tree and of each process, in fixed intervals.
//!
//! Size is bounded whatever the run's length: intervals start at
//! [`FIRST_INTERVAL_NS`] and a series never has more than [`MAX_POINTS`]
//! of them; when the run outgrows that, the interval doubles and every
//! series merges its points in pairs, keeping each value's maximum. So a
//! point holds the highest value of each quantity over its interval (the
//! three maxima may come from different instants), a 1-hour run keeps 512
//! points of about 7 s, and the exact peak instant is kept apart.
//!
//! Cost: one division and a few comparisons per folded record; a merge
//! pass over every series each time the interval doubles (log2 of the
//! run's length over 512 ms times in all).

use serde::{Deserialize, Serialize};

/// Intervals a series keeps at most.
pub const MAX_POINTS: usize = 512;

/// The first interval's width: 1 ms.
pub const FIRST_INTERVAL_NS: u64 = 1_000_000;

/// The maxima of one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// Anonymous mappings made outside allocator calls.
    pub mapped_bytes: u64,
}

impl Point {
    fn merge(&mut self, o: &Point) {
        self.live_bytes = self.live_bytes.max(o.live_bytes);
        self.live_blocks = self.live_blocks.max(o.live_blocks);
        self.mapped_bytes = self.mapped_bytes.max(o.mapped_bytes);
    }
}

/// One series: `points[i]` is interval `first + i`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    pub first: u64,
    pub points: Vec<Point>,
}

/// A process's series.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSeries {
    pub pid: u32,
    #[serde(flatten)]
    pub series: Series,
}

/// The profile's `timeline` (docs/profile.md, "Timeline").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// When interval 0 starts, ns since the command was started.
    pub start_ns: u64,
    /// Every interval's width.
    pub interval_ns: u64,
    /// The whole tree.
    pub tree: Series,
    /// One per process of the profile's `processes`, in the same order.
    pub processes: Vec<ProcessSeries>,
    /// The tree's live heap peak and the exact instant it was reached
    /// (ns since the command was started), as in `totals`.
    pub peak_live_bytes: u64,
    pub peak_live_at_ns: u64,
}

impl Timeline {
    /// The interval holding `ns` (ns since the command was started).
    pub fn interval_of(&self, ns: u64) -> u64 {
        ns.saturating_sub(self.start_ns) / self.interval_ns.max(1)
    }
}

/// A series being built: its points and the value it has now, carried
/// into the intervals that follow.
#[derive(Clone, Debug, Default)]
struct Building {
    series: Series,
    now: Point,
}

impl Building {
    fn record(&mut self, slot: u64, value: Point) {
        let s = &mut self.series;
        if s.points.is_empty() {
            s.first = slot;
        }
        let want = (slot - s.first + 1) as usize;
        while s.points.len() < want {
            s.points.push(self.now);
        }
        if let Some(last) = s.points.last_mut() {
            last.merge(&value);
        }
        self.now = value;
    }

    /// Merges intervals in pairs.
    fn halve(&mut self) {
        let s = &mut self.series;
        let first = s.first / 2;
        let mut out: Vec<Point> = Vec::with_capacity(s.points.len() / 2 + 1);
        for (i, p) in s.points.iter().enumerate() {
            let k = ((s.first + i as u64) / 2 - first) as usize;
            if k < out.len() {
                out[k].merge(p);
            } else {
                out.push(*p);
            }
        }
        s.first = first;
        s.points = out;
    }
}

/// Builds the timeline while the aggregator folds records.
#[derive(Clone, Debug)]
pub(super) struct Builder {
    origin: Option<u64>,
    interval_ns: u64,
    /// The last interval found and its bounds `[start, end)` in ns: most
    /// records fall in it, and need no division.
    cached: (u64, u64, u64),
    tree: Building,
    /// By index in the aggregator's processes.
    procs: Vec<Building>,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            origin: None,
            interval_ns: FIRST_INTERVAL_NS,
            cached: (0, 1, 0),
            tree: Building::default(),
            procs: Vec::new(),
        }
    }
}

impl Builder {
    /// The interval of `ts`, coarsening every series until it fits.
    fn slot(&mut self, ts: u64) -> u64 {
        let (start, end, slot) = self.cached;
        if start <= ts && ts < end {
            return slot;
        }
        let origin = *self.origin.get_or_insert(ts);
        loop {
            let slot = ts.saturating_sub(origin) / self.interval_ns;
            if slot < MAX_POINTS as u64 {
                let start = origin + slot * self.interval_ns;
                self.cached = (start, start + self.interval_ns, slot);
                return slot;
            }
            self.interval_ns *= 2;
            self.tree.halve();
            for p in &mut self.procs {
                p.halve();
            }
        }
    }

    /// Records the tree's values and process `idx`'s at `ts`.
    pub(super) fn record(&mut self, ts: u64, tree: Point, idx: usize, proc: Point) {
        let slot = self.slot(ts);
        self.tree.record(slot, tree);
        if self.procs.len() <= idx {
            self.procs.resize_with(idx + 1, Building::default);
        }
        self.procs[idx].record(slot, proc);
    }

    /// The timeline, times relative to `start_ns`; `pids` are the
    /// aggregator's processes in order.
    pub(super) fn build(
        &self,
        start_ns: u64,
        pids: impl Iterator<Item = u32>,
        (peak_live_bytes, peak_at): (u64, u64),
    ) -> Timeline {
        let origin = self.origin.unwrap_or(start_ns);
        Timeline {
            start_ns: origin.saturating_sub(start_ns),
            interval_ns: self.interval_ns,
            tree: self.tree.series.clone(),
            processes: pids
                .enumerate()
                .map(|(i, pid)| ProcessSeries {
                    pid,
                    series: self
                        .procs
                        .get(i)
                        .map(|b| b.series.clone())
                        .unwrap_or_default(),
                })
                .collect(),
            peak_live_bytes,
            peak_live_at_ns: peak_at.saturating_sub(start_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(live: u64) -> Point {
        Point {
            live_bytes: live,
            live_blocks: live,
            mapped_bytes: 0,
        }
    }

    /// Check that a long run stays within MAX_POINTS, keeps each merged
    /// interval's maximum and carries values over intervals without events.
    #[test]
    fn timeline_coarsens_keeping_maxima() {
        let mut b = Builder::default();
        // 0 at t=0, 7 at 3 ms, back to 1 at 3.5 ms, 5 s later 2.
        b.record(0, p(0), 0, p(0));
        b.record(3_000_000, p(7), 0, p(7));
        b.record(3_500_000, p(1), 0, p(1));
        b.record(5_000_000_000, p(2), 0, p(2));
        let t = b.build(0, [42].into_iter(), (7, 3_000_000));
        assert!(t.tree.points.len() <= MAX_POINTS);
        // 5 s over 512 intervals: 1 ms doubled 4 times (16 ms, 313 points).
        assert_eq!(t.interval_ns, 16_000_000);
        assert_eq!(t.tree.points.len(), 313);
        assert_eq!(t.tree.points[0].live_bytes, 7);
        assert!(t.tree.points[1..312].iter().all(|x| x.live_bytes == 1));
        assert_eq!(t.tree.points[312].live_bytes, 2);
        assert_eq!(t.processes[0].pid, 42);
        assert_eq!(t.processes[0].series, t.tree);
    }
}
