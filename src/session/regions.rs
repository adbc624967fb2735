//! Snapshots and regions, answered on the events poller thread.
//!
//! A caller (any thread of the embedding program) posts one [`Op`] in the
//! [`Control`] with the least epoch that may answer it (the barrier's
//! current epoch plus one, read after posting), raises the barrier and
//! waits for the events pipeline to acknowledge. The poller answers the op
//! in [`Regions::drained`], once it has drained the ring for an epoch at
//! least that one: every record the calling thread made before the call is
//! then folded, and none it makes after (it is blocked until the answer).
//!
//! Regions are per thread: a region counts the heap events of the thread
//! that began it (allocations, frees and their bytes), and the blocks that
//! thread allocated within it, freed by any thread or still live at its
//! end. Regions of one thread nest (a stack); an inner region's events
//! count in the outer ones too. Peak and live are of the blocks allocated
//! within the region: `peak_live_bytes` is the most of them live at once
//! (an inner region's included), `live_*` what is left at its end.
//!
//! No allocation happens on the caller's side: ops and answers are plain
//! values in a mutex the poller locks only when it drains for a barrier.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::aggregate::Aggregator;
use crate::bpf::record::{Header, Kind, Mem};
use crate::profile::HeapCounters;
use crate::profile::regions::RegionCounts;

/// Longest region name kept (bytes); longer names are cut.
pub const NAME_MAX: usize = 63;

/// Heap totals at a point in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub allocations: u64,
    pub frees: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    /// Blocks and bytes live now.
    pub live_allocations: u64,
    pub live_bytes: u64,
    /// Highest live bytes so far.
    pub peak_live_bytes: u64,
}

/// One process's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessTotals {
    pub pid: u32,
    pub totals: Totals,
}

/// Totals of the tracked processes, exact at the moment of the call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub totals: Totals,
    /// Every process seen, in order of appearance.
    pub processes: Vec<ProcessTotals>,
}

/// A request to the poller.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Snapshot,
    Totals,
    Begin { tid: u32, name: [u8; NAME_MAX + 1] },
    End { tid: u32 },
}

/// The poller's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    Snapshot(Snapshot),
    Totals(Totals),
    Begun,
    Ended(RegionCounts),
    /// `End` on a thread with no region open.
    NoRegion,
}

#[derive(Debug, Default)]
struct Pending {
    op: Option<Op>,
    /// The least epoch whose drain may answer `op`.
    min_epoch: u64,
    reply: Option<Reply>,
}

/// The mailbox between callers and the events poller.
#[derive(Debug, Default)]
pub(crate) struct Control {
    pending: Mutex<Pending>,
}

impl Control {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts `op`, answerable from the epoch after `current` on.
    pub(crate) fn post(&self, op: Op, current: impl FnOnce() -> u64) {
        let mut p = self.lock();
        p.op = Some(op);
        p.reply = None;
        // Read after the op is visible to the poller (the mutex orders it):
        // any epoch above this one is raised after the post.
        p.min_epoch = current() + 1;
    }

    /// The answer, once given.
    pub(crate) fn take_reply(&self) -> Option<Reply> {
        let mut p = self.lock();
        p.op = None;
        p.reply.take()
    }
}

#[derive(Clone, Copy, Debug)]
struct Open {
    uid: u64,
    counts: RegionCounts,
    name: [u8; NAME_MAX + 1],
}

/// A block allocated in a region: the thread and region that made it.
#[derive(Clone, Copy, Debug)]
struct Born {
    tid: u32,
    uid: u64,
    size: u64,
}

/// The poller's side: open regions and the blocks born in them.
pub(crate) struct Regions {
    control: std::sync::Arc<Control>,
    open: HashMap<u32, Vec<Open>>,
    born: HashMap<(u32, u64), Born>,
    next_uid: u64,
}

impl Regions {
    pub(crate) fn new(control: std::sync::Arc<Control>) -> Self {
        Self {
            control,
            open: HashMap::new(),
            born: HashMap::new(),
            next_uid: 1,
        }
    }

    /// Whether records need [`observe`](Self::observe).
    pub(crate) fn active(&self) -> bool {
        !self.open.is_empty() || !self.born.is_empty()
    }

    /// Accounts one heap record of `hdr.pid`, given the process's counters
    /// before and after the aggregator folded it.
    pub(crate) fn observe(
        &mut self,
        hdr: &Header,
        mem: &Mem,
        before: HeapCounters,
        after: HeapCounters,
    ) {
        let d_alloc = after.allocations - before.allocations;
        // A free, or the old block a realloc gave back.
        let gone = match hdr.kind {
            Kind::Free => Some(mem.addr),
            k if k.is_realloc() && (mem.addr != 0 || mem.size == 0) => Some(mem.old_addr),
            _ => None,
        };
        if let Some(addr) = gone {
            if let Some(b) = self.born.remove(&(hdr.pid, addr)) {
                self.forget(b);
            }
        }
        let Some(stack) = self.open.get_mut(&hdr.tid) else {
            return;
        };
        for r in stack.iter_mut() {
            let c = &mut r.counts;
            c.allocations += d_alloc;
            c.frees += after.frees - before.frees;
            c.allocated_bytes += after.allocated_bytes - before.allocated_bytes;
            c.freed_bytes += after.freed_bytes - before.freed_bytes;
        }
        if d_alloc == 0 || mem.addr == 0 {
            return;
        }
        let Some(top) = stack.last_mut() else {
            return;
        };
        top.counts.live_allocations += 1;
        top.counts.live_bytes += mem.size;
        let born = Born {
            tid: hdr.tid,
            uid: top.uid,
            size: mem.size,
        };
        // Live of a region and of everything open inside it.
        let mut live = 0;
        for r in stack.iter_mut().rev() {
            live += r.counts.live_bytes;
            r.counts.peak_live_bytes = r.counts.peak_live_bytes.max(live);
        }
        if let Some(prev) = self.born.insert((hdr.pid, mem.addr), born) {
            // An address reused without a free we saw.
            self.forget(prev);
        }
    }

    /// A block born in a region is no longer live: the innermost open
    /// region of its thread that contains its birth loses it.
    fn forget(&mut self, b: Born) {
        let Some(stack) = self.open.get_mut(&b.tid) else {
            return;
        };
        if let Some(owner) = stack.iter_mut().rev().find(|r| r.uid <= b.uid) {
            owner.counts.live_allocations -= 1;
            owner.counts.live_bytes -= b.size;
        }
    }

    /// Answers a posted op if this drain may (see the module docs).
    pub(crate) fn drained(&mut self, epoch: u64, agg: &Aggregator) {
        let control = self.control.clone();
        let mut p = control.lock();
        if p.reply.is_some() || p.min_epoch > epoch {
            return;
        }
        let Some(op) = p.op.take() else {
            return;
        };
        p.reply = Some(match op {
            Op::Snapshot => Reply::Snapshot(snapshot(agg)),
            Op::Totals => Reply::Totals(snapshot_totals(agg)),
            Op::Begin { tid, name } => {
                self.begin(tid, name);
                Reply::Begun
            }
            Op::End { tid } => match self.end(tid) {
                Some((_, counts)) => Reply::Ended(counts),
                None => Reply::NoRegion,
            },
        });
    }

    /// Opens a region named `name` (NUL-padded) on thread `tid`, inside
    /// the ones it has open.
    pub(crate) fn begin(&mut self, tid: u32, name: [u8; NAME_MAX + 1]) {
        let uid = self.next_uid;
        self.next_uid += 1;
        self.open.entry(tid).or_default().push(Open {
            uid,
            counts: RegionCounts::default(),
            name,
        });
    }

    /// Threads with a region open.
    pub(crate) fn open_threads(&self) -> Vec<u32> {
        self.open.keys().copied().collect()
    }

    /// Closes the innermost region of thread `tid`: its name and counts;
    /// None when the thread has none open.
    pub(crate) fn end(&mut self, tid: u32) -> Option<([u8; NAME_MAX + 1], RegionCounts)> {
        let stack = self.open.get_mut(&tid)?;
        let region = stack.pop()?;
        if let Some(parent) = stack.last_mut() {
            // The region's live blocks are now its parent's (see forget).
            parent.counts.live_allocations += region.counts.live_allocations;
            parent.counts.live_bytes += region.counts.live_bytes;
        } else {
            self.open.remove(&tid);
            self.born.retain(|_, b| b.tid != tid);
        }
        let len = region.name.iter().position(|&c| c == 0).unwrap_or(NAME_MAX);
        tracing::debug!(
            tid,
            region = %String::from_utf8_lossy(&region.name[..len]),
            counts = ?region.counts,
            "region ended"
        );
        Some((region.name, region.counts))
    }
}

/// The tree's totals alone: nothing allocated for the caller to free.
fn snapshot_totals(agg: &Aggregator) -> Totals {
    let mut t = Totals::default();
    for p in agg.processes() {
        let (live_bytes, live_allocations) = agg.live_of(p);
        t.allocations += p.heap.allocations;
        t.frees += p.heap.frees;
        t.allocated_bytes += p.heap.allocated_bytes;
        t.freed_bytes += p.heap.freed_bytes;
        t.live_allocations += live_allocations;
        t.live_bytes += live_bytes;
    }
    t.peak_live_bytes = agg.totals().peak_live_bytes;
    t
}

fn snapshot(agg: &Aggregator) -> Snapshot {
    let mut snap = Snapshot::default();
    for p in agg.processes() {
        let (live_bytes, live_allocations) = agg.live_of(p);
        let t = Totals {
            allocations: p.heap.allocations,
            frees: p.heap.frees,
            allocated_bytes: p.heap.allocated_bytes,
            freed_bytes: p.heap.freed_bytes,
            live_allocations,
            live_bytes,
            peak_live_bytes: p.heap.peak_live_bytes,
        };
        let s = &mut snap.totals;
        s.allocations += t.allocations;
        s.frees += t.frees;
        s.allocated_bytes += t.allocated_bytes;
        s.freed_bytes += t.freed_bytes;
        s.live_allocations += t.live_allocations;
        s.live_bytes += t.live_bytes;
        snap.processes.push(ProcessTotals {
            pid: p.pid,
            totals: t,
        });
    }
    snap.totals.peak_live_bytes = agg.totals().peak_live_bytes;
    snap
}
