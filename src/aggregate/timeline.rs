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
//!
//! Sites: the chart stacks the live bytes of the top [`TOP_SITES`] stacks,
//! which are only known at the end. Each interval keeps a *snapshot*: every
//! stack's live bytes at the instant the tree's live heap was highest in it
//! (first reached; the instant before the interval's first record counts,
//! as the tree's point carries that value), so the layers of a point add up
//! to the tree's point exactly. Snapshots are kept as sparse lists of the
//! stacks whose value changed since the snapshot before, built without any
//! pass over all stacks:
//! - the interval's peak is a record sequence number (`SiteTrack`); a
//!   stack that changes for the first time after it records its value then
//!   (the lazy rule the aggregator already uses for the tree's peak), so a
//!   new interval peak costs O(1);
//! - a stack changed in the interval goes once into a dirty list; when the
//!   interval closes, each dirty stack's value at the peak joins the
//!   interval's list if it differs from the value last listed, and stays
//!   dirty if it changed after the peak;
//! - when intervals merge in pairs, the merged snapshot is the one of the
//!   half with the higher tree value (the first on a tie): the lists of
//!   both halves are concatenated if it is the second, else the second's
//!   list is carried into the next pair's (order kept, the later value of a
//!   stack wins), so replaying the lists in order still gives every kept
//!   snapshot;
//! - at the end the lists are replayed twice: once for each stack's highest
//!   value, to pick the top sites, then for their series; everything else
//!   is `other_bytes`, the tree's point less the sites'.
//!
//! Memory: one entry per stack and interval in which it changed, merged
//! down as intervals merge (a list holds each stack once); past
//! [`SITE_ENTRIES_MAX`] entries the intervals double early.

use std::collections::HashMap;

use super::{StackAgg, TreeLive};
use crate::profile::timeline::{Point, ProcessSeries, Series, SiteSeries, TOP_SITES, Timeline};

/// Intervals a series keeps at most.
pub const MAX_POINTS: usize = 512;

/// The first interval's width: 1 ms.
pub const FIRST_INTERVAL_NS: u64 = 1_000_000;

/// Entries the site snapshot lists may hold (16 bytes each: 64 MiB): past
/// it, the intervals double before the run outgrows [`MAX_POINTS`], which
/// merges the lists (a run whose many stacks all change in every interval
/// gets coarser intervals rather than unbounded memory).
pub const SITE_ENTRIES_MAX: usize = 1 << 22;

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

/// A stack's part in the site snapshots, kept in its aggregator entry.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SiteMark {
    /// Its live bytes at the open interval's peak, recorded by its first
    /// change after that peak.
    at_peak: u64,
    /// The value last put in a snapshot list.
    emitted: u64,
    /// In [`SiteTrack::dirty`].
    dirty: bool,
}

/// The open interval's peak and the stacks changed in it, kept by the
/// tree's live state (every stack change goes through it).
#[derive(Debug, Default)]
pub(super) struct SiteTrack {
    /// Whether the timeline is kept.
    pub(super) on: bool,
    /// The record after which the open interval's tree live heap was at
    /// its highest (first reached), and that value.
    peak_seq: u64,
    peak_bytes: u64,
    /// Stacks whose value may differ from the one last listed.
    dirty: Vec<u64>,
}

impl StackAgg {
    /// Its live bytes at the open interval's peak, record `peak_seq`.
    #[inline]
    fn at_interval_peak(&self, peak_seq: u64) -> u64 {
        if self.changed > peak_seq {
            self.site.at_peak
        } else {
            self.live
        }
    }
}

impl SiteTrack {
    /// Before stack `id` (`s`, whose `changed` is not yet updated) changes
    /// in record `seq`.
    #[inline]
    pub(super) fn touch(&mut self, id: u64, s: &mut StackAgg, seq: u64) {
        if s.changed <= self.peak_seq && self.peak_seq < seq {
            s.site.at_peak = s.live;
        }
        if !s.site.dirty {
            s.site.dirty = true;
            self.dirty.push(id);
        }
    }

    /// After record `seq` was folded and sampled: the tree has `live`
    /// bytes.
    #[inline]
    pub(super) fn sampled(&mut self, seq: u64, live: u64) {
        if live > self.peak_bytes {
            self.peak_bytes = live;
            self.peak_seq = seq;
        }
    }
}

/// Keeps one entry per stack in `list`, with its last value (later entries
/// win; order within a list does not matter, only that a later list
/// overrides an earlier one).
fn dedupe(list: &mut Vec<(u64, u64)>) {
    if list.len() < 2 {
        return;
    }
    let mut at: HashMap<u64, usize> = HashMap::with_capacity(list.len());
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(list.len());
    for &(id, v) in list.iter() {
        match at.get(&id) {
            Some(&i) => out[i].1 = v,
            None => {
                at.insert(id, out.len());
                out.push((id, v));
            }
        }
    }
    *list = out;
}

/// Builds the timeline while the aggregator folds records.
#[derive(Clone, Debug)]
pub(super) struct Builder {
    origin: Option<u64>,
    interval_ns: u64,
    /// The last interval found and its bounds `[start, end)` in ns: most
    /// records fall in it, and need no division.
    cached: (u64, u64, u64),
    /// The interval records go to now.
    open: Option<u64>,
    tree: Building,
    /// By index in the aggregator's processes.
    procs: Vec<Building>,
    /// `site_lists[i]` is interval `site_first + i`'s snapshot: (stack,
    /// live bytes) of each stack whose value differs from the snapshots
    /// before.
    site_first: u64,
    site_lists: Vec<Vec<(u64, u64)>>,
    /// Entries in `site_lists`, and the most it may hold.
    site_entries: usize,
    site_entries_max: usize,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            origin: None,
            interval_ns: FIRST_INTERVAL_NS,
            cached: (0, 1, 0),
            open: None,
            tree: Building::default(),
            procs: Vec::new(),
            site_first: 0,
            site_lists: Vec::new(),
            site_entries: 0,
            site_entries_max: SITE_ENTRIES_MAX,
        }
    }
}

impl Builder {
    /// Before a record at `ts` that will be sampled is folded (the tree's
    /// `seq` already its number): finds its interval, coarsening every
    /// series until it fits, and on a new interval closes the open one's
    /// snapshot. A clock reading behind the open interval stays in it.
    pub(super) fn begin(&mut self, ts: u64, tree: &mut TreeLive) {
        let (start, end, _) = self.cached;
        if start <= ts && ts < end && self.open.is_some() {
            return;
        }
        let origin = *self.origin.get_or_insert(ts);
        let mut slot = ts.saturating_sub(origin) / self.interval_ns;
        let mut closed = self.open;
        if let Some(open) = closed {
            if slot <= open {
                return;
            }
            self.close(open, slot, tree);
        }
        loop {
            // Coarsening early (the lists' budget) only where the new
            // interval stays apart from the one just closed: reopening a
            // closed snapshot would lose its peak.
            let over_budget = self.site_entries > self.site_entries_max
                && self.site_lists.len() > 1
                && closed.is_none_or(|c| slot / 2 > c / 2);
            if slot < MAX_POINTS as u64 && !over_budget {
                break;
            }
            closed = closed.map(|c| c / 2);
            self.interval_ns *= 2;
            // Before the tree's points merge: the sites' merge reads them.
            self.halve_sites();
            self.tree.halve();
            for p in &mut self.procs {
                p.halve();
            }
            slot = ts.saturating_sub(origin) / self.interval_ns;
        }
        let start = origin + slot * self.interval_ns;
        self.cached = (start, start + self.interval_ns, slot);
        self.open = Some(slot);
        // The state before this record is the interval's first candidate,
        // as the tree's point starts from the value carried in.
        tree.sites.peak_seq = tree.seq.saturating_sub(1);
        tree.sites.peak_bytes = tree.live_bytes;
    }

    /// Records the tree's values and process `idx`'s, after a record
    /// [`begin`](Self::begin) placed.
    pub(super) fn record(&mut self, tree: Point, idx: usize, proc: Point) {
        let slot = self.open.unwrap_or(0);
        self.tree.record(slot, tree);
        if self.procs.len() <= idx {
            self.procs.resize_with(idx + 1, Building::default);
        }
        self.procs[idx].record(slot, proc);
    }

    /// The open interval's snapshot list as it would close now.
    fn pending(tree: &TreeLive) -> Vec<(u64, u64)> {
        let peak_seq = tree.sites.peak_seq;
        tree.sites
            .dirty
            .iter()
            .filter_map(|&id| {
                let s = tree.stacks.get(&id)?;
                let at = s.at_interval_peak(peak_seq);
                (at != s.site.emitted).then_some((id, at))
            })
            .collect()
    }

    /// Closes interval `open`'s snapshot; `next` is the interval that
    /// opens. Stacks that changed after the peak stay dirty, or, when
    /// intervals without records follow, give the first of them the state
    /// at the end.
    fn close(&mut self, open: u64, next: u64, tree: &mut TreeLive) {
        let peak_seq = tree.sites.peak_seq;
        let gap = next > open + 1;
        let mut list = Vec::new();
        let mut gap_list = Vec::new();
        let mut still = Vec::new();
        for id in std::mem::take(&mut tree.sites.dirty) {
            let Some(s) = tree.stacks.get_mut(&id) else {
                continue;
            };
            let at = s.at_interval_peak(peak_seq);
            if at != s.site.emitted {
                list.push((id, at));
                s.site.emitted = at;
            }
            if s.live == at {
                s.site.dirty = false;
            } else if gap {
                gap_list.push((id, s.live));
                s.site.emitted = s.live;
                s.site.dirty = false;
            } else {
                still.push(id);
            }
        }
        self.put(open, list);
        if !gap_list.is_empty() {
            self.put(open + 1, gap_list);
        }
        tree.sites.dirty = still;
    }

    /// Appends `list` to interval `slot`'s (later entries win).
    fn put(&mut self, slot: u64, mut list: Vec<(u64, u64)>) {
        if self.site_lists.is_empty() {
            self.site_first = slot;
        }
        let Some(i) = slot.checked_sub(self.site_first) else {
            return;
        };
        let i = i as usize;
        if self.site_lists.len() <= i {
            self.site_lists.resize_with(i + 1, Vec::new);
        }
        let l = &mut self.site_lists[i];
        self.site_entries -= l.len();
        if l.is_empty() {
            *l = list;
        } else if !list.is_empty() {
            l.append(&mut list);
            dedupe(l);
        }
        self.site_entries += l.len();
    }

    /// Merges the snapshot lists in pairs (before the tree's points do).
    fn halve_sites(&mut self) {
        let first = self.site_first;
        let mut lists: Vec<Option<Vec<(u64, u64)>>> = std::mem::take(&mut self.site_lists)
            .into_iter()
            .map(Some)
            .collect();
        self.site_first = first / 2;
        if lists.is_empty() {
            return;
        }
        let last = first + lists.len() as u64 - 1;
        let tree = &self.tree.series;
        let value = |slot: u64| {
            slot.checked_sub(tree.first)
                .and_then(|i| tree.points.get(i as usize))
                .map(|p| p.live_bytes)
        };
        let mut take = |slot: u64| {
            slot.checked_sub(first)
                .and_then(|i| lists.get_mut(i as usize))
                .and_then(Option::take)
                .unwrap_or_default()
        };
        let mut out = Vec::with_capacity(lists_len(last, first));
        let mut carry: Vec<(u64, u64)> = Vec::new();
        for k in first / 2..=last / 2 {
            let (a, b) = (2 * k, 2 * k + 1);
            let second = match (value(a), value(b)) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(x), Some(y)) => y > x,
            };
            let mut merged = std::mem::take(&mut carry);
            merged.extend(take(a));
            if second {
                merged.extend(take(b));
            } else {
                carry = take(b);
            }
            dedupe(&mut merged);
            out.push(merged);
        }
        // The last pair's second half: the state after the last snapshot,
        // which the next interval starts from.
        if !carry.is_empty() {
            out.push(carry);
        }
        self.site_entries = out.iter().map(Vec::len).sum();
        self.site_lists = out;
    }

    /// The top sites' series and `other_bytes`, the open interval's
    /// snapshot as it stands.
    fn sites(&self, tree: &TreeLive) -> (Vec<SiteSeries>, Vec<u64>) {
        let t = &self.tree.series;
        if t.points.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let pending = Self::pending(tree);
        let open = self.open;
        let lists = |slot: u64| {
            let stored = slot
                .checked_sub(self.site_first)
                .and_then(|i| self.site_lists.get(i as usize))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let extra = if Some(slot) == open {
                pending.as_slice()
            } else {
                &[]
            };
            stored.iter().chain(extra)
        };
        let from = self.site_first.min(t.first);
        // Each stack's highest value in the tree's points.
        let mut now: HashMap<u64, u64> = HashMap::new();
        let mut highest: HashMap<u64, u64> = HashMap::new();
        for slot in from..t.first + t.points.len() as u64 {
            for &(id, v) in lists(slot) {
                now.insert(id, v);
                if slot >= t.first {
                    let h = highest.entry(id).or_default();
                    *h = (*h).max(v);
                }
            }
            if slot == t.first {
                for (&id, &v) in &now {
                    let h = highest.entry(id).or_default();
                    *h = (*h).max(v);
                }
            }
        }
        let mut top: Vec<(u64, u64)> = highest.into_iter().filter(|&(_, v)| v > 0).collect();
        top.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        top.truncate(TOP_SITES);
        let index: HashMap<u64, usize> = top
            .iter()
            .enumerate()
            .map(|(i, &(id, _))| (id, i))
            .collect();
        let mut sites: Vec<SiteSeries> = top
            .iter()
            .map(|&(stack, peak_bytes)| SiteSeries {
                stack,
                peak_bytes,
                live_bytes: Vec::with_capacity(t.points.len()),
            })
            .collect();
        let mut values = vec![0u64; sites.len()];
        let mut other = Vec::with_capacity(t.points.len());
        for slot in from..t.first + t.points.len() as u64 {
            for &(id, v) in lists(slot) {
                if let Some(&i) = index.get(&id) {
                    values[i] = v;
                }
            }
            if let Some(p) = slot
                .checked_sub(t.first)
                .and_then(|i| t.points.get(i as usize))
            {
                for (s, &v) in sites.iter_mut().zip(&values) {
                    s.live_bytes.push(v);
                }
                other.push(p.live_bytes.saturating_sub(values.iter().sum()));
            }
        }
        (sites, other)
    }

    /// The timeline, times relative to `start_ns`; `pids` are the
    /// aggregator's processes in order.
    pub(super) fn build(
        &self,
        start_ns: u64,
        pids: impl Iterator<Item = u32>,
        (peak_live_bytes, peak_at): (u64, u64),
        tree: &TreeLive,
    ) -> Timeline {
        let origin = self.origin.unwrap_or(start_ns);
        let (sites, other_bytes) = self.sites(tree);
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
            sites,
            other_bytes,
        }
    }
}

fn lists_len(last: u64, first: u64) -> usize {
    (last / 2 - first / 2 + 2) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Aggregator;
    use crate::bpf::record::{Body, Header, Kind, Mem, Record};

    /// A malloc (`size` > 0 or `alloc`) or a free of `addr` at `ts` by
    /// process 7.
    fn rec(ts: u64, kind: Kind, addr: u64, size: u64, stack_id: u64) -> Record<'static> {
        Record {
            hdr: Header {
                ts_ns: ts,
                pid: 7,
                tid: 7,
                kind,
                in_allocator: false,
            },
            body: Body::Mem(Mem {
                addr,
                size,
                old_addr: 0,
                old_size: 0,
                stack_id,
            }),
        }
    }

    /// Check that a long run stays within MAX_POINTS, keeps each merged
    /// interval's maximum, carries values over intervals without events,
    /// and that the sites' series follow the tree's points.
    #[test]
    fn timeline_coarsens_keeping_maxima() {
        let mut agg = Aggregator::new();
        // 0 at t=0, 7 at 3 ms (stack 2), back to 0 then 1 at 3.5 ms (stack
        // 1), 5 s later 2.
        agg.apply(&rec(0, Kind::Malloc, 0x10, 0, 1));
        agg.apply(&rec(3_000_000, Kind::Malloc, 0x20, 7, 2));
        agg.apply(&rec(3_500_000, Kind::Free, 0x20, 0, 0));
        agg.apply(&rec(3_500_000, Kind::Malloc, 0x30, 1, 1));
        agg.apply(&rec(5_000_000_000, Kind::Malloc, 0x40, 1, 1));
        let t = agg.timeline(0).expect("kept");
        assert!(t.tree.points.len() <= MAX_POINTS);
        // 5 s over 512 intervals: 1 ms doubled 4 times (16 ms, 313 points).
        assert_eq!(t.interval_ns, 16_000_000);
        assert_eq!(t.tree.points.len(), 313);
        assert_eq!(t.tree.points[0].live_bytes, 7);
        assert!(t.tree.points[1..312].iter().all(|x| x.live_bytes == 1));
        assert_eq!(t.tree.points[312].live_bytes, 2);
        assert_eq!(t.processes[0].pid, 7);
        assert_eq!(t.processes[0].series, t.tree);
        let stacks: Vec<(u64, u64)> = t.sites.iter().map(|s| (s.stack, s.peak_bytes)).collect();
        assert_eq!(stacks, [(2, 7), (1, 2)]);
        let mut two = vec![0; 313];
        two[0] = 7;
        assert_eq!(t.sites[0].live_bytes, two);
        let mut one = vec![1; 313];
        one[0] = 0;
        one[312] = 2;
        assert_eq!(t.sites[1].live_bytes, one);
        assert_eq!(t.other_bytes, vec![0; 313]);
    }

    /// The sites' values at each interval's first highest tree value,
    /// computed directly at the final interval width: (tree points, per
    /// stack series).
    fn reference(recs: &[Record<'_>], interval: u64, stacks: u64) -> (Vec<u64>, Vec<Vec<u64>>) {
        let origin = recs[0].hdr.ts_ns;
        let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut per = vec![0u64; stacks as usize + 1];
        let mut total = 0u64;
        let mut points: Vec<u64> = Vec::new();
        let mut snaps: Vec<Vec<u64>> = Vec::new();
        for r in recs {
            let slot = ((r.hdr.ts_ns - origin) / interval) as usize;
            while points.len() <= slot {
                // Opens with the value carried in.
                points.push(total);
                snaps.push(per.clone());
            }
            let Body::Mem(m) = r.body else { continue };
            if r.hdr.kind == Kind::Free {
                if let Some((size, stack)) = live.remove(&m.addr) {
                    total -= size;
                    per[stack as usize] -= size;
                }
            } else {
                live.insert(m.addr, (m.size, m.stack_id));
                total += m.size;
                per[m.stack_id as usize] += m.size;
            }
            if total > points[slot] {
                points[slot] = total;
                snaps[slot] = per.clone();
            }
        }
        let series = (1..=stacks as usize)
            .map(|k| snaps.iter().map(|s| s[k]).collect())
            .collect();
        (points, series)
    }

    /// Check that the site lists stay within their budget by coarsening
    /// early, and that the series stay exact: 100 stacks each changing
    /// every millisecond for 200 ms, a budget of 1000 entries.
    #[test]
    fn timeline_sites_budget_coarsens() {
        let mut recs = Vec::new();
        // Each millisecond: a block from every stack, then the blocks of
        // the millisecond before freed (the tree peaks inside each
        // interval, not at its end, and not always higher than the one
        // before).
        for ms in 0..200u64 {
            for k in 0..100u64 {
                let ts = ms * 1_000_000 + k * 1000;
                let addr = 0x1000 + (ms * 100 + k) * 16;
                recs.push(rec(ts, Kind::Malloc, addr, 1 + (ms * k * 37) % 700, 1 + k));
            }
            for k in (0..100u64).filter(|_| ms > 0) {
                let ts = ms * 1_000_000 + 100_000 + k * 1000;
                let addr = 0x1000 + ((ms - 1) * 100 + k) * 16;
                recs.push(rec(ts, Kind::Free, addr, 0, 0));
            }
        }
        let mut agg = Aggregator::new();
        agg.timeline.as_mut().expect("kept").site_entries_max = 1000;
        for r in &recs {
            agg.apply(r);
        }
        let b = agg.timeline.as_ref().expect("kept");
        assert!(b.site_entries <= 2000, "{} entries", b.site_entries);
        let t = agg.timeline(0).expect("kept");
        // 200 ms would fit 512 intervals of 1 ms.
        assert!(t.interval_ns >= 8 * FIRST_INTERVAL_NS, "{}", t.interval_ns);
        let (points, series) = reference(&recs, t.interval_ns, 100);
        let tree: Vec<u64> = t.tree.points.iter().map(|p| p.live_bytes).collect();
        assert_eq!(tree, points);
        assert_eq!(t.sites.len(), TOP_SITES);
        for s in &t.sites {
            assert_eq!(
                s.live_bytes,
                series[s.stack as usize - 1],
                "stack {}",
                s.stack
            );
        }
    }

    /// Check that the sites' series are exactly each interval's snapshot at
    /// its tree peak, through 5 coarsenings, bursts, gaps of several
    /// intervals and blocks without a stack (in `other_bytes`): 20,000
    /// pseudo-random mallocs and frees over 6 stacks (and stack 0), against
    /// a direct computation at the final width.
    #[test]
    fn timeline_sites_exact_snapshots() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut recs = Vec::new();
        let mut ts = 1_000_000_000u64;
        let mut addrs: Vec<u64> = Vec::new();
        for i in 0..20_000u64 {
            ts += match next(100) {
                0 => 20_000_000 + next(50_000_000),
                1..=9 => next(2_000_000),
                _ => next(50_000),
            };
            if addrs.is_empty() || next(100) < 55 {
                let addr = 0x1000 + i * 16;
                addrs.push(addr);
                recs.push(rec(ts, Kind::Malloc, addr, 1 + next(5000), next(7)));
            } else {
                let addr = addrs.swap_remove(next(addrs.len() as u64) as usize);
                recs.push(rec(ts, Kind::Free, addr, 0, 0));
            }
        }
        let mut agg = Aggregator::new();
        for r in &recs {
            agg.apply(r);
        }
        let t = agg.timeline(0).expect("kept");
        assert_eq!(t.interval_ns, 32 * FIRST_INTERVAL_NS, "5 coarsenings");
        let (points, series) = reference(&recs, t.interval_ns, 6);
        let tree: Vec<u64> = t.tree.points.iter().map(|p| p.live_bytes).collect();
        assert_eq!(t.tree.first, 0);
        assert_eq!(tree, points);
        assert_eq!(t.sites.len(), 6);
        for s in &t.sites {
            let want = &series[s.stack as usize - 1];
            assert_eq!(&s.live_bytes, want, "stack {}", s.stack);
            assert_eq!(s.peak_bytes, want.iter().copied().max().unwrap());
        }
        for (i, &p) in points.iter().enumerate() {
            let sites: u64 = t.sites.iter().map(|s| s.live_bytes[i]).sum();
            assert_eq!(t.other_bytes[i], p - sites, "interval {i}");
        }
        assert!(t.other_bytes.iter().any(|&o| o > 0), "stack 0 is other");
        // Ranked by their highest value.
        assert!(
            t.sites
                .windows(2)
                .all(|w| w[0].peak_bytes >= w[1].peak_bytes)
        );
    }
}
