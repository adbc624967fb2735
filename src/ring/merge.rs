//! Per-CPU events rings read as one stream, in an order that keeps cause
//! before effect.
//!
//! With `--event-rings per-cpu` every CPU's producers reserve from a ring of
//! their own, so no two CPUs share a ring's lock. A thread that migrates
//! then leaves its records in several rings, and a block malloc'd by one
//! thread may be freed by another on another CPU: the aggregation needs the
//! malloc first whatever rings the two records are in.
//!
//! The order kept: if a record was committed before another was reserved
//! (a free can only start after the malloc that returned its pointer has
//! returned; a thread's records follow one another), the first is handed on
//! first. BPF stamps each record with the monotonic clock *after* reserving
//! it and before committing it, so such a pair has increasing stamps, and
//! records are handed on in stamp order. Records that overlap in time (both
//! reserved before either committed) are concurrent and may go either way.
//!
//! A record may be handed on once no record with an earlier stamp can still
//! appear. For each ring the merge keeps a *bound*: the clock reading taken
//! just before the last look that found the producer position and then
//! consumed every record below it. Any record it has not read was reserved
//! after that look read the producer position, so it is stamped after the
//! bound. Records read are copied out (freeing the ring's space) and held
//! until the smallest bound of all rings passes their stamp. A record still
//! being written holds its ring's bound back, as it holds a single ring's
//! reader back. At a barrier ([`Merged::drain`]) every ring is drained to the
//! producer position and everything held is handed on: a record a producer
//! that has stopped made is then never behind one it made later.
//!
//! Clock: `bpf_ktime_get_ns` and `CLOCK_MONOTONIC` are the same clock; both
//! read it with an ordered TSC read on x86, so a look's reading cannot be
//! taken after the producer position it precedes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{Consume, RingConsumer};

/// Several rings read in stamp order (see the module docs).
pub struct Merged {
    /// BPF's rings.
    rings: Vec<RingConsumer>,
    /// Per ring: no record not yet read from it is stamped before this.
    bounds: Vec<u64>,
    held: Held,
    /// The preload shim's rings (issue 22), a file per process.
    shim: Option<ShimSet>,
}

/// The ring files of the processes that write their own records.
struct ShimSet {
    taken: super::shim::Taken,
    procs: Vec<ProcRings>,
    /// The positions the files left behind reached: [`Consume::position`]
    /// only grows.
    retired: u64,
}

/// One process's ring file, read as that process's alone (issue 40).
struct ProcRings {
    file: super::shim::ShimRings,
    rings: Vec<RingConsumer>,
    bounds: Vec<u64>,
    /// Per ring: when its reader was first seen stopped at a busy record
    /// (0: it is not).
    busy_since: Vec<u64>,
    /// The file was found corrupt: it is read no further.
    broken: bool,
    /// Its process was seen gone (its unfinished records discarded).
    gone: bool,
    /// The stacks its rings carried, and the allocations that named others.
    carried: Carried,
}

/// The most distinct stack ids a process's ring file may name without
/// carrying their stacks that memtrail tells apart (issue 40: a flood of a
/// million made a million per-stack entries, 2.8× a clean capture's
/// memory); past them such allocations are only counted.
pub const MAX_UNRECORDED_IDS: usize = 1024;

/// The stack ids a process's rings carried, and the allocations of those
/// rings that named a stack id none of them carried.
///
/// The shim writes a stack into a ring before the first record of that
/// ring naming it (`ring_knows` in preload/ring.h: the ring's
/// own table of ids), so a record naming a stack its file never carried
/// names a stack never recorded (or one the shim could not write: its
/// ring full). Such a record is handed on with no stack (in the totals,
/// in no stack) and counted here: memtrail keeps no per-stack entry for
/// an id a process made up, whatever their number. The ids carried cost
/// a word each next to the stacks they name, which memtrail keeps anyway.
#[derive(Default)]
struct Carried {
    ids: foldhash::HashSet<u64>,
    /// Distinct ids named and not carried, up to [`MAX_UNRECORDED_IDS`].
    unknown: foldhash::HashSet<u64>,
    /// Counted since the last [`Carried::publish`].
    counts: crate::profile::UnrecordedStacks,
}

/// Where an allocation record keeps its stack id (`mt_alloc_event.aux`),
/// and its size (`.size`).
const AUX_AT: usize = 48;
const SIZE_AT: usize = 32;

impl Carried {
    /// Notes a record of the owner's ring (one `foreign` passed); returns
    /// whether it is an allocation naming a stack never carried, whose
    /// stack id is to be cleared.
    fn note(&mut self, rec: &[u8]) -> bool {
        let word = |at: usize| {
            rec.get(at..at + 8)
                .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
        };
        let kind = word(16) as u32 & 0xffff;
        if kind == super::shim::KIND_STACK {
            // struct mt_shim_stack: its id after the header.
            self.ids.insert(word(24));
            return false;
        }
        // The allocating calls (malloc .. pvalloc, realloc among them).
        use crate::bpf::skel::memtrail::types::mt_kind;
        if !(mt_kind::MT_MALLOC.0..=mt_kind::MT_PVALLOC.0).contains(&kind) {
            return false;
        }
        let id = word(AUX_AT);
        if id == 0 || self.ids.contains(&id) {
            return false;
        }
        if self.unknown.len() < MAX_UNRECORDED_IDS {
            if self.unknown.insert(id) {
                self.counts.stacks += 1;
            }
        } else if !self.unknown.contains(&id) {
            self.counts.more_stacks = true;
        }
        self.counts.allocations += 1;
        self.counts.bytes = self.counts.bytes.saturating_add(word(SIZE_AT));
        true
    }

    /// Hands what was counted since the last call to `faults`.
    fn publish(&mut self, pid: u32, faults: &super::shim::Faults) {
        if self.counts != crate::profile::UnrecordedStacks::default() {
            faults.add_unrecorded(pid, std::mem::take(&mut self.counts));
        }
    }
}

/// How long a busy record of a shim ring holds the merge back: a writer
/// stopped in the middle of one (a paused tree, a debugger, a hostile
/// program) must not make memtrail hold every other ring's records. No
/// record can depend on one not yet committed (its block is not handed
/// out before), so the others go on; it is handed on when it completes.
const BUSY_HOLD_NS: u64 = 50_000_000;

/// Why a record of a process's ring is not that process's (see
/// [`ProcRings::check`]).
fn foreign(rec: &[u8], owner: u32, now: &mut u64) -> Option<&'static str> {
    let word = |at: usize| {
        rec.get(at..at + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    };
    let (Some(pid), Some(kind)) = (word(8), word(16)) else {
        return Some("a record shorter than its header");
    };
    if pid != owner {
        return Some("a record naming another process");
    }
    if rec.len() < super::shim::shortest(kind & 0xffff) {
        return Some("a record shorter than its kind");
    }
    // The shim's stacks and code records name their process again.
    let inner = match kind & 0xffff {
        k if k == super::shim::KIND_STACK => {
            // struct mt_shim_stack: nr frames after 40 bytes.
            let nr = word(36).map_or(u32::MAX, |w| w & 0xffff) as usize;
            if nr > super::shim::MAX_FRAMES || rec.len() < 40 + 8 * nr {
                return Some("a stack of more frames than it holds or memtrail keeps");
            }
            word(32)
        }
        k if k == super::shim::KIND_PY_CODE => word(40),
        k if k == 0 || k > super::shim::KIND_PY_CODE => {
            return Some("a record of a kind only BPF writes");
        }
        _ => Some(owner),
    };
    if inner != Some(owner) {
        return Some("a stack naming another process");
    }
    let ts = stamp(rec);
    if ts > *now {
        // Stamped after its commit, before memtrail read it.
        *now = crate::sys::monotonic_ns();
        if ts > *now {
            return Some("a stamp not yet reached");
        }
    }
    None
}

impl ProcRings {
    fn new(file: super::shim::ShimRings) -> Result<Self, super::shim::ShimRingsError> {
        let rings = file.consumers()?;
        let n = rings.len();
        Ok(Self {
            file,
            rings,
            bounds: vec![0; n],
            busy_since: vec![0; n],
            broken: false,
            gone: false,
            carried: Carried::default(),
        })
    }

    /// Reads ring `i` up to its producer position (without waiting for a
    /// busy record), holding each record that is the owner's; the first
    /// that is not, or a producer position no writer could have, breaks
    /// the file. Returns the records read.
    fn read(&mut self, i: usize, held: &mut Held, faults: &super::shim::Faults) -> usize {
        let owner = self.file.owner();
        let ring = &mut self.rings[i];
        let (pos, prod) = (ring.position(), ring.producer_pos());
        if prod < pos || prod - pos > self.file.data_size() {
            self.fault(i, pos, "a producer position more than a ring ahead", faults);
            return 0;
        }
        let mut bad = None;
        let mut now = crate::sys::monotonic_ns();
        let mut at = pos;
        let carried = &mut self.carried;
        let read = ring.poll_to(prod, |rec| {
            if bad.is_some() {
                return;
            }
            match foreign(rec, owner, &mut now) {
                Some(what) => bad = Some(what),
                None if carried.note(rec) => {
                    // In no stack: the id names nothing memtrail keeps.
                    held.hold(rec)[AUX_AT..AUX_AT + 8].fill(0);
                }
                None => {
                    held.hold(rec);
                }
            }
            at += ((super::HEADER_LEN + rec.len() + 7) & !7) as u64;
        });
        self.carried.publish(owner, faults);
        let ring = &self.rings[i];
        if let Some(what) = bad {
            self.fault(i, at, what, faults);
        } else if ring.stopped_at_invalid() {
            let at = ring.position();
            self.fault(i, at, "a record length no writer makes", faults);
        } else if ring
            .busy_head()
            .is_some_and(|stride| ring.position() + stride < prod)
        {
            // One writer, which completes a record before it reserves the
            // next (a signal handler's calls take the hook path): a busy
            // record with others reserved after it is never completed.
            let at = ring.position();
            self.fault(
                i,
                at,
                "a record left unfinished while its writer went on",
                faults,
            );
        }
        read
    }

    fn fault(
        &mut self,
        ring: usize,
        offset: u64,
        what: &'static str,
        faults: &super::shim::Faults,
    ) {
        self.broken = true;
        self.bounds.fill(u64::MAX);
        self.file.close();
        faults.add(super::shim::RingFault {
            pid: self.file.owner(),
            ring: ring as u32,
            offset,
            what,
        });
    }

    /// Sets ring `i`'s bound after a look that began at `looked`.
    fn settle(&mut self, i: usize, looked: u64) {
        if self.broken {
            return;
        }
        let ring = &self.rings[i];
        if ring.position() >= ring.producer_pos() {
            self.bounds[i] = looked;
            self.busy_since[i] = 0;
        } else if self.busy_since[i] == 0 {
            self.busy_since[i] = looked;
        } else if looked - self.busy_since[i] > BUSY_HOLD_NS {
            self.bounds[i] = looked;
        }
    }

    /// Whether the file is done with: its process is gone and every record
    /// it wrote was read (or the file is broken).
    fn done(&self) -> bool {
        self.broken || (self.gone && self.rings.iter().all(|r| r.position() >= r.producer_pos()))
    }
}

/// Records read and not yet handed on.
#[derive(Default)]
struct Held {
    /// (stamp, arrival, slot), smallest first.
    order: BinaryHeap<Reverse<(u64, u64, u32)>>,
    /// Copies of the held records; `free` lists the slots to reuse.
    slots: Vec<Vec<u8>>,
    free: Vec<u32>,
    arrivals: u64,
    /// The most records held at once (logged at the end of a capture).
    most: usize,
}

impl Held {
    /// Holds a copy of `rec`; returns the copy.
    fn hold(&mut self, rec: &[u8]) -> &mut [u8] {
        let slot = match self.free.pop() {
            Some(slot) => {
                let buf = &mut self.slots[slot as usize];
                buf.clear();
                buf.extend_from_slice(rec);
                slot
            }
            None => {
                self.slots.push(rec.to_vec());
                (self.slots.len() - 1) as u32
            }
        };
        self.order.push(Reverse((stamp(rec), self.arrivals, slot)));
        self.arrivals += 1;
        self.most = self.most.max(self.order.len());
        &mut self.slots[slot as usize]
    }

    /// Hands on, in stamp order, the records stamped before `limit`.
    fn release(&mut self, limit: u64, f: &mut impl FnMut(&[u8])) -> usize {
        let mut handed = 0;
        while let Some(&Reverse((ts, _, slot))) = self.order.peek() {
            if ts >= limit {
                break;
            }
            self.order.pop();
            f(&self.slots[slot as usize]);
            self.free.push(slot);
            handed += 1;
        }
        handed
    }
}

/// The stamp a record starts with (`mt_header.ts_ns`).
fn stamp(rec: &[u8]) -> u64 {
    rec.get(..8)
        .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
}

impl Merged {
    pub fn new(rings: Vec<RingConsumer>) -> Self {
        let n = rings.len();
        Self {
            rings,
            bounds: vec![0; n],
            held: Held::default(),
            shim: None,
        }
    }

    /// Reads the preload shim's rings too: the files its processes name
    /// (see [`super::shim::Offer`]). Their writers are threads of the
    /// tree, which can stop or die between reserving a record and
    /// committing it: a drain does not wait for their busy records (a
    /// stopped writer's comes later; a dead one's is discarded by
    /// [`super::shim::ShimRings::reap`]). Records that depend on each
    /// other are never both in flight: a block is handed over only after
    /// its allocation's record is committed, and freed only after its
    /// free's.
    pub fn with_shim(mut self, taken: super::shim::Taken) -> Self {
        self.shim = Some(ShimSet {
            taken,
            procs: Vec::new(),
            retired: 0,
        });
        self
    }

    /// The most records the merge held at once.
    pub fn most_held(&self) -> usize {
        self.held.most
    }

    /// Takes in the files taken since the last look, and leaves those
    /// done with; reaps the rings of threads that are gone.
    fn shim_files(&mut self, clock: u64, now: bool) {
        let Some(shim) = &mut self.shim else {
            return;
        };
        while let Ok(file) = shim.taken.files.try_recv() {
            match ProcRings::new(file) {
                Ok(proc) => shim.procs.push(proc),
                Err(err) => tracing::warn!(%err, "a process's preload rings could not be mapped"),
            }
        }
        for proc in &mut shim.procs {
            if proc.broken {
                continue;
            }
            // The owner is looked for at the reaps only (each a read of
            // /proc).
            let looked = proc.file.reap(&proc.rings, clock, now);
            // A busy record of a process that is gone (in a ring its
            // thread gave back: a record it never completed) is never
            // completed: what follows it is read.
            if looked && !proc.gone && proc.file.owner_gone() {
                proc.gone = true;
                proc.file.discard_all_unfinished(&proc.rings);
            }
        }
        let mut retired = 0;
        shim.procs.retain(|p| {
            let done = p.done();
            if done {
                retired += p.rings.iter().map(RingConsumer::position).sum::<u64>();
            }
            !done
        });
        shim.retired += retired;
    }

    /// Reads every shim ring (without waiting for busy records); `drain`:
    /// every bound is the look's.
    fn read_shim(&mut self, drain: bool) -> usize {
        let Some(shim) = &mut self.shim else {
            return 0;
        };
        let mut read = 0;
        for proc in shim.procs.iter_mut().filter(|p| !p.broken) {
            for i in 0..proc.rings.len() {
                // CLOCK_MONOTONIC: the clock the shim stamps records with.
                let looked = crate::sys::monotonic_ns();
                read += proc.read(i, &mut self.held, &shim.taken.faults);
                if drain && !proc.broken {
                    proc.bounds[i] = looked;
                } else {
                    proc.settle(i, looked);
                }
            }
        }
        read
    }

    /// The smallest bound of every ring.
    fn limit(&self) -> u64 {
        let bpf = self.bounds.iter().copied().min().unwrap_or(u64::MAX);
        let shim = self.shim.as_ref().map_or(u64::MAX, |s| {
            s.procs
                .iter()
                .flat_map(|p| p.bounds.iter().copied())
                .min()
                .unwrap_or(u64::MAX)
        });
        bpf.min(shim)
    }
}

impl Consume for Merged {
    /// Reads every ring (without waiting for records still being written),
    /// then hands on what no unread record can precede. Returns the number
    /// of records read (they are handed on now or at a later call).
    fn poll(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        let mut read = 0;
        // CLOCK_MONOTONIC: the clock BPF stamps records with. A reading
        // before each BPF ring's look.
        self.shim_files(crate::sys::monotonic_ns(), false);
        for (ring, bound) in self.rings.iter_mut().zip(&mut self.bounds) {
            let looked = crate::sys::monotonic_ns();
            let prod = ring.producer_pos();
            let held = &mut self.held;
            read += ring.poll_to(prod, |rec| {
                held.hold(rec);
            });
            if ring.position() >= prod {
                *bound = looked;
            }
        }
        read += self.read_shim(false);
        let limit = self.limit();
        self.held.release(limit, &mut f);
        read
    }

    /// Drains every ring to the producer position it has now (waiting for
    /// records still being written, but not for the shim's), then hands on
    /// every record held.
    fn drain(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        let mut read = 0;
        self.shim_files(crate::sys::monotonic_ns(), true);
        for (ring, bound) in self.rings.iter_mut().zip(&mut self.bounds) {
            // CLOCK_MONOTONIC: the clock BPF stamps records with.
            let looked = crate::sys::monotonic_ns();
            let target = ring.producer_pos();
            let held = &mut self.held;
            read += ring.drain_to(target, |rec| {
                held.hold(rec);
            });
            *bound = looked;
        }
        read += self.read_shim(true);
        self.held.release(u64::MAX, &mut f);
        read
    }

    fn position(&self) -> u64 {
        let shim: u64 = self.shim.as_ref().map_or(0, |s| {
            s.retired
                + s.procs
                    .iter()
                    .flat_map(|p| p.rings.iter().map(RingConsumer::position))
                    .sum::<u64>()
        });
        self.rings.iter().map(RingConsumer::position).sum::<u64>() + shim
    }

    fn size(&self) -> usize {
        self.rings.iter().map(RingConsumer::size).sum()
    }

    fn pending(&self) -> u64 {
        let shim: u64 = self.shim.as_ref().map_or(0, |s| {
            s.procs
                .iter()
                .filter(|p| !p.broken)
                .flat_map(|p| p.rings.iter().map(RingConsumer::pending))
                .sum()
        });
        let unread: u64 = self.rings.iter().map(RingConsumer::pending).sum();
        unread + shim + self.held.order.len() as u64
    }

    fn unwoken_latency(&self) -> Option<std::time::Duration> {
        self.shim.as_ref().map(|_| super::shim::UNWOKEN_LATENCY)
    }

    fn high_water(&self) -> u64 {
        self.rings
            .iter()
            .map(RingConsumer::high_water)
            .max()
            .unwrap_or(0)
    }
}

/// The events pipeline's rings: the one shared ring, or per-CPU rings.
pub enum EventsRing {
    One(RingConsumer),
    PerCpu(Merged),
}

impl Consume for EventsRing {
    fn poll(&mut self, f: impl FnMut(&[u8])) -> usize {
        match self {
            Self::One(r) => r.poll(f),
            Self::PerCpu(m) => m.poll(f),
        }
    }

    fn drain(&mut self, f: impl FnMut(&[u8])) -> usize {
        match self {
            Self::One(r) => Consume::drain(r, f),
            Self::PerCpu(m) => m.drain(f),
        }
    }

    fn position(&self) -> u64 {
        match self {
            Self::One(r) => Consume::position(r),
            Self::PerCpu(m) => Consume::position(m),
        }
    }

    fn size(&self) -> usize {
        match self {
            Self::One(r) => Consume::size(r),
            Self::PerCpu(m) => Consume::size(m),
        }
    }

    fn pending(&self) -> u64 {
        match self {
            Self::One(r) => Consume::pending(r),
            Self::PerCpu(m) => Consume::pending(m),
        }
    }

    fn high_water(&self) -> u64 {
        match self {
            Self::One(r) => Consume::high_water(r),
            Self::PerCpu(m) => Consume::high_water(m),
        }
    }

    fn unwoken_latency(&self) -> Option<std::time::Duration> {
        match self {
            Self::One(_) => None,
            Self::PerCpu(m) => m.unwoken_latency(),
        }
    }
}

/// How many events rings a capture uses (`--event-rings`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventRings {
    /// Per CPU on machines with at least 4 CPUs online, else one.
    // The number is AUTO_PER_CPU's, written out: this is `--help` text
    // (a unit test checks that they agree).
    #[default]
    Auto,
    /// One ring every CPU reserves from.
    Shared,
    /// One ring per CPU, merged by time (`--ring-size` is split between
    /// them).
    PerCpu,
}

/// The fewest CPUs on which `auto` gives each its own ring: see
/// perf/RESULTS.md ("Per-CPU events rings").
pub const AUTO_PER_CPU: usize = 4;

/// The smallest per-CPU ring: a page, the smallest ring the kernel makes.
pub const MIN_CPU_RING: usize = 4096;

impl EventRings {
    /// Whether a machine of `cpus` CPUs gets one ring per CPU.
    pub fn per_cpu(self, cpus: usize) -> bool {
        match self {
            Self::Auto => cpus >= AUTO_PER_CPU,
            Self::Shared => false,
            Self::PerCpu => true,
        }
    }
}

/// The CPUs in a kernel CPU list (`/sys/devices/system/cpu/online`:
/// `0-3,8,10-11`); `None` if it does not parse.
pub fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last): (usize, usize) = match part.split_once('-') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None => {
                let n = part.parse().ok()?;
                (n, n)
            }
        };
        if first > last {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

/// The CPUs online now (all `possible` of them if the list cannot be
/// read). A ring per CPU is made for every possible CPU, but only the
/// online ones share `--ring-size`: a VM may have many more possible CPUs
/// than it runs on.
pub fn online_cpus(possible: usize) -> Vec<usize> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|l| parse_cpu_list(&l))
        .map(|cpus| {
            cpus.into_iter()
                .filter(|&c| c < possible)
                .collect::<Vec<_>>()
        })
        .filter(|cpus| !cpus.is_empty())
        .unwrap_or_else(|| (0..possible).collect())
}

/// The size of each of `cpus` rings sharing `total` bytes: the largest
/// power of two at most `total / cpus`, and at least [`MIN_CPU_RING`].
pub fn per_cpu_size(total: usize, cpus: usize) -> usize {
    let share = total / cpus.max(1);
    share
        .checked_ilog2()
        .map_or(0, |bits| 1 << bits)
        .max(MIN_CPU_RING)
}

/// The events rings of a capture.
pub struct Layout {
    /// Each ring's bytes, by its index in `event_rings` (the CPU's).
    pub sizes: Vec<usize>,
    /// The shared ring's size, or each online CPU's.
    pub each: usize,
    /// With a ring per CPU, the online CPUs `--ring-size` is split
    /// between.
    pub per_cpu: Option<u64>,
}

impl EventRings {
    /// The rings for `total` bytes (`--ring-size`) on a machine of
    /// `possible` CPUs: one, or one per CPU (each online CPU's share of
    /// `total`; a CPU offline now gets a page: it writes there only if it
    /// comes online during the capture).
    pub fn layout(self, total: usize, possible: usize) -> Layout {
        let online = online_cpus(possible);
        if !self.per_cpu(online.len()) {
            return Layout {
                sizes: vec![total],
                each: total,
                per_cpu: None,
            };
        }
        let each = per_cpu_size(total, online.len());
        Layout {
            sizes: (0..possible)
                .map(|cpu| {
                    if online.contains(&cpu) {
                        each
                    } else {
                        MIN_CPU_RING
                    }
                })
                .collect(),
            each,
            per_cpu: Some(online.len() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_sizes_split_the_total() {
        assert_eq!(per_cpu_size(16 << 20, 2), 8 << 20);
        assert_eq!(per_cpu_size(16 << 20, 3), 4 << 20);
        assert_eq!(per_cpu_size(16 << 20, 64), 256 << 10);
        assert_eq!(per_cpu_size(4096, 2), MIN_CPU_RING);
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0-2,5,7-8"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_cpu_list("3"), Some(vec![3]));
        assert_eq!(parse_cpu_list("2-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn auto_is_per_cpu_from_four_cpus() {
        assert!(!EventRings::Auto.per_cpu(2));
        assert!(EventRings::Auto.per_cpu(AUTO_PER_CPU));
        assert!(EventRings::PerCpu.per_cpu(1));
        assert!(!EventRings::Shared.per_cpu(64));
    }

    #[test]
    fn held_records_leave_in_stamp_order() {
        let mut held = Held::default();
        for ts in [30u64, 10, 20, 10] {
            let mut rec = ts.to_ne_bytes().to_vec();
            rec.push(held.arrivals as u8);
            held.hold(&rec);
        }
        let mut out = Vec::new();
        assert_eq!(
            held.release(20, &mut |r: &[u8]| out.push((stamp(r), r[8]))),
            2
        );
        // Equal stamps leave in arrival order.
        assert_eq!(out, [(10, 1), (10, 3)]);
        held.release(u64::MAX, &mut |r: &[u8]| out.push((stamp(r), r[8])));
        assert_eq!(out[2..], [(20, 2), (30, 0)]);
        assert_eq!(held.most, 4);
    }

    /// A record of `kind` from pid 7: its header, then `words`.
    fn shim_record(kind: u32, words: &[u64]) -> Vec<u8> {
        let mut rec = vec![0u8; 24];
        rec[8..12].copy_from_slice(&7u32.to_ne_bytes());
        rec[16..20].copy_from_slice(&kind.to_ne_bytes());
        for w in words {
            rec.extend_from_slice(&w.to_ne_bytes());
        }
        rec
    }

    /// Check that a process's ring keeps no state per stack id it names
    /// without carrying its stack (issue 40: a million made-up ids cost
    /// memtrail 2.8× a clean capture's memory): an allocation naming a
    /// stack the ring carried is its own; one naming no stack or another
    /// kind is left alone; one naming an id never carried is cleared and
    /// counted, and past MAX_UNRECORDED_IDS distinct ids nothing more is
    /// kept, only counted.
    #[test]
    fn unrecorded_stack_ids_bounded() {
        use crate::bpf::skel::memtrail::types::mt_kind;
        let mut c = Carried::default();
        let alloc = |id: u64| shim_record(mt_kind::MT_MALLOC.0, &[0x1000, 64, 0, id]);
        assert!(!c.note(&shim_record(super::super::shim::KIND_STACK, &[42, 7, 0])));
        assert!(!c.note(&alloc(42)));
        assert!(!c.note(&alloc(0)));
        assert!(!c.note(&shim_record(mt_kind::MT_FREE.0, &[0x1000, 0, 0, 99])));
        let n = MAX_UNRECORDED_IDS as u64 + 1000;
        for i in 0..n {
            assert!(c.note(&alloc(1000 + i)));
        }
        assert!(c.note(&alloc(1000)));
        assert_eq!(c.unknown.len(), MAX_UNRECORDED_IDS);
        assert_eq!(c.ids.len(), 1);
        let want = crate::profile::UnrecordedStacks {
            stacks: MAX_UNRECORDED_IDS as u64,
            allocations: n + 1,
            bytes: 64 * (n + 1),
            more_stacks: true,
        };
        assert_eq!(c.counts, want);
        let faults = super::super::shim::Faults::default();
        c.publish(7, &faults);
        c.publish(7, &faults);
        assert_eq!(faults.unrecorded(), [(7, want)]);
    }

    /// Check that the judge of a process's records is total and that what
    /// it takes as the process's reads (issue 40): deterministic mutants
    /// of the records the shim writes (lengths, kinds, pids, frame counts,
    /// stamps, random bytes) never panic it or the decoders after it, and
    /// none it takes names another process.
    #[test]
    fn shim_records_fuzz() {
        use crate::bpf::record;
        let owner = 4242u32;
        let mut x = std::env::var("MEMTRAIL_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x9e37_79b9_7f4a_7c15u64);
        let iters = std::env::var("MEMTRAIL_FUZZ_ITERS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(200_000u64);
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut taken, mut now) = (0u64, crate::sys::monotonic_ns());
        for _ in 0..iters {
            let len = (next() % 1200) as usize;
            let mut rec: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Mostly plausible headers: the owner, a kind the shim writes.
            if len >= 24 && next() % 4 != 0 {
                rec[..8].copy_from_slice(&(next() % now).to_ne_bytes());
                rec[8..12].copy_from_slice(&owner.to_ne_bytes());
                rec[16..18].copy_from_slice(&((next() % 16) as u16).to_ne_bytes());
                if len >= 40 && next() % 2 == 0 {
                    rec[32..36].copy_from_slice(&owner.to_ne_bytes());
                    rec[36..38].copy_from_slice(&((next() % 260) as u16).to_ne_bytes());
                }
            }
            if foreign(&rec, owner, &mut now).is_some() {
                continue;
            }
            taken += 1;
            assert_eq!(record::header_pid(&rec), Some(owner));
            if let Some(Ok(stack)) = record::decode_shim_stack(&rec) {
                assert_eq!(stack.pid, owner);
            } else if let Some(Ok(code)) = record::decode_shim_py_code(&rec) {
                assert_eq!(code.pid, owner);
            } else if record::decode_free_batch(&rec).is_none() {
                let _ = record::decode(&rec);
            }
        }
        assert!(taken > 0, "no mutant was taken: the fuzz tests nothing");
    }
}
