//! Aggregating events into the profile's counters, stacks and timeline.
//!
//! [`Aggregator`] folds records in ring order. Its memory is O(live
//! allocations): a process keeps a map of its live blocks and anonymous
//! regions while it runs and only its counters once it has exited.
//!
//! Accounting rules (documented for users in docs/profile.md):
//! - an outermost realloc of a live block opens with `ReallocBegin`, which
//!   takes the old block out of the live map before another thread can be
//!   handed the same address; the realloc record then settles it;
//! - a forked child inherits its parent's live blocks as *inherited*: their
//!   frees match (and count as frees) but they are neither the child's live
//!   bytes nor its leaks;
//! - exec discards the old image's blocks, regions and program break;
//! - per call stack, live bytes at the tree's peak are kept lazily: a stack
//!   remembers when it last changed, and the first change after a new peak
//!   (or the end of the capture) records its value at that peak, so a peak
//!   costs O(1) however many stacks there are;
//! - a *temporary* allocation is one its thread frees before allocating or
//!   freeing anything else (heaptrack's rule, kept per thread): each thread
//!   remembers the address of its last allocation until its next free, and
//!   a free of that address counts the block as temporary, in its process
//!   and at the stack that allocated it. realloc is a free of the old block
//!   then an allocation of the new one, as in heaptrack;
//! - an anonymous region mapped outside allocator calls belongs to the stack
//!   of the libc `mmap` that made it (the event's `stack_id`), or, made by a
//!   direct syscall, to its process's direct-syscall site (when stacks are
//!   captured); the pieces of a region unmapped in part keep its stack, and
//!   mremap moves it to the new range. Per stack, bytes mapped at the
//!   tree's mapping peak are kept lazily like live bytes at the heap peak.
//!   Program break growth outside allocator calls goes to the stack of the
//!   `sbrk` that made it likewise;
//! - a region is *reserved* while it has no access rights (mapped
//!   `PROT_NONE`, or made so by mprotect) and *committed* otherwise: the
//!   `mapped_bytes` counters and the timeline count committed bytes, the
//!   `reserved_bytes` ones the rest; mprotect moves a range between the
//!   two, at the stack that mapped it;
//! - a reservation mapped inside an allocator call (a free's included) is
//!   an *allocator arena*, counted apart from the program's regions (the
//!   heap counters count the blocks in it) and given to its process's
//!   allocator-arena site; the allocator's mprotect and munmap calls apply
//!   to its arenas; its other mappings (a large block's) are the heap's;
//! - resident memory: each process's latest recorded RSS, its exact peak
//!   from BPF, and the tree's sum of the latest values.

mod corrupt;
mod mapping;
pub mod timeline;

use foldhash::HashMap;

use crate::bpf::record::{Body, Header, Kind, Mem, Record};
use crate::profile::timeline::{Point, Timeline};
use crate::profile::{HeapCounters, MapCounters, Resident, StackMetrics};
use mapping::{Region, Regions};

/// A process of the tree.
#[derive(Clone, Debug, Default)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub exe: String,
    pub start_ns: u64,
    pub end_ns: Option<u64>,
    /// The kernel's wait status, once the process exited.
    pub exit_status: Option<i32>,
    pub heap: HeapCounters,
    pub maps: MapCounters,
    pub resident: Resident,
    /// `exe` interned (`Aggregator::exe_names`), for the stacks it makes.
    exe_id: u32,
    state: Option<Box<LiveState>>,
}

/// A live block: its size and the stack that allocated it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Block {
    size: u64,
    stack: u64,
}

/// The old block of a realloc in flight.
#[derive(Clone, Copy, Debug)]
struct PendingRealloc {
    addr: u64,
    block: Block,
    inherited: bool,
}

/// What a running process has live.
#[derive(Clone, Debug, Default)]
struct LiveState {
    /// Blocks it allocated, by address.
    blocks: HashMap<u64, Block>,
    /// Blocks inherited at fork, by address: they are the parent's.
    inherited: HashMap<u64, Block>,
    live_bytes: u64,
    /// Old block of a realloc in flight, by thread.
    reallocs: HashMap<u32, PendingRealloc>,
    /// Anonymous regions made outside allocator calls, by start.
    regions: Regions,
    /// Their committed and reserved bytes.
    mapped_bytes: u64,
    reserved_bytes: u64,
    /// Allocator arenas, by start, their bytes and committed bytes.
    arenas: Regions,
    arena_bytes: u64,
    arena_committed: u64,
    /// The latest recorded RSS.
    rss: u64,
    brk_start: Option<u64>,
    brk_now: u64,
    /// The address of each thread's last allocation, until that thread
    /// frees something: the temporary-allocation rule.
    last_alloc: HashMap<u32, u64>,
}

impl LiveState {
    /// A fork child's view: the parent's blocks become inherited; its
    /// regions and break stay the parent's.
    fn forked(&self) -> Self {
        let mut inherited = self.inherited.clone();
        inherited.extend(self.blocks.iter().map(|(&a, &b)| (a, b)));
        Self {
            inherited,
            brk_start: self.brk_start.map(|_| self.brk_now),
            brk_now: self.brk_now,
            ..Self::default()
        }
    }

    /// Removes [start, end) from the regions, and their committed bytes
    /// from their stacks' mapped bytes; returns the pieces removed, the
    /// lowest last.
    fn unmap(&mut self, start: u64, end: u64, tree: &mut TreeLive) -> Vec<mapping::Piece> {
        let pieces = mapping::cut(&mut self.regions, start, end);
        for &(s, e, r) in &pieces {
            if !r.reserved {
                tree.unmapped(r.stack, e - s);
            }
        }
        pieces
    }
}

/// The id of the direct-syscall site of process `pid` running executable
/// `exe_id` (see [`DIRECT_SYSCALL_FRAME`]; an exec starts a new site): a
/// reserved pattern no stack hash is expected to take.
fn direct_syscall_id(pid: u32, exe_id: u32) -> u64 {
    0xd1ec_0000_0000_0000 ^ u64::from(exe_id & 0xffff) << 32 ^ u64::from(pid)
}

/// The id of the allocator-arena site of process `pid` running executable
/// `exe_id` ([`crate::profile::ALLOCATOR_ARENA_FRAME`]), likewise.
fn arena_site_id(pid: u32, exe_id: u32) -> u64 {
    0xa7e0_0000_0000_0000 ^ u64::from(exe_id & 0xffff) << 32 ^ u64::from(pid)
}

/// A pseudo-site: a site with one made-up frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PseudoSite {
    /// Mappings and break growth made by direct syscalls.
    DirectSyscall,
    /// The allocator's arenas.
    AllocatorArena,
}

fn page_end(addr: u64, len: u64) -> u64 {
    addr.saturating_add(len).saturating_add(4095) & !4095
}

/// Per-stack accounting.
#[derive(Clone, Copy, Debug, Default)]
struct StackAgg {
    metrics: StackMetrics,
    live: u64,
    /// Blocks from this stack live now.
    live_blocks: u64,
    /// Record sequence number of the last change of `live`.
    changed: u64,
    /// Bytes of regions from this stack mapped now.
    mapped: u64,
    /// Record sequence number of the last change of `mapped`.
    mapped_changed: u64,
    /// The executable its process ran at its first allocation, mapping or
    /// break move (an index in `Aggregator::exe_names`): a stack made
    /// before an exec belongs to the program that ran then, not to the one
    /// the process ends as.
    exe_id: u32,
    /// Its part in the timeline's site snapshots.
    site: timeline::SiteMark,
}

/// The tree's live heap and its peak, with per-stack live bytes.
#[derive(Debug, Default)]
struct TreeLive {
    live_bytes: u64,
    live_blocks: u64,
    peak_live_bytes: u64,
    peak_live_at_ns: u64,
    /// Sequence number of the record that made the peak.
    peak_seq: u64,
    /// Sequence number of the record being folded.
    seq: u64,
    /// Sequence number of the record that made the tree's mapping peak.
    mapped_peak_seq: u64,
    stacks: HashMap<u64, StackAgg>,
    /// The timeline's site snapshots: the open interval's peak and the
    /// stacks changed in it.
    sites: timeline::SiteTrack,
}

impl TreeLive {
    /// The stack's entry, its value at the last peak recorded first if it
    /// has not changed since that peak.
    fn stack(&mut self, id: u64) -> &mut StackAgg {
        let (peak_seq, seq) = (self.peak_seq, self.seq);
        let s = self.stacks.entry(id).or_default();
        if s.changed <= peak_seq && peak_seq < seq {
            s.metrics.live_bytes_at_peak = s.live;
            s.metrics.live_allocations_at_peak = s.live_blocks;
        }
        if self.sites.on {
            self.sites.touch(id, s, seq);
        }
        s.changed = seq;
        s
    }

    /// The stack's entry, its mapped bytes at the last mapping peak
    /// recorded first if they have not changed since that peak.
    fn map_stack(&mut self, id: u64) -> &mut StackAgg {
        let (peak_seq, seq) = (self.mapped_peak_seq, self.seq);
        let s = self.stacks.entry(id).or_default();
        if s.mapped_changed <= peak_seq && peak_seq < seq {
            s.metrics.mapped_bytes_at_peak = s.mapped;
        }
        s.mapped_changed = seq;
        s
    }

    /// A region of `bytes` mapped from `stack` by a process running
    /// executable `exe_id`; `new` for an mmap (an mremap moves a region).
    fn mapped(&mut self, stack: u64, bytes: u64, new: bool, exe_id: u32) {
        if stack != 0 {
            let s = self.map_stack(stack);
            if s.metrics.is_empty() {
                s.exe_id = exe_id;
            }
            s.mapped += bytes;
            s.metrics.mapped_bytes += bytes;
            s.metrics.mmaps += u64::from(new);
        }
    }

    /// A region of `bytes` reserved (no access rights) from `stack`; `new`
    /// for an mmap.
    fn reserved(&mut self, stack: u64, bytes: u64, new: bool, exe_id: u32) {
        if stack != 0 {
            let s = self.map_stack(stack);
            if s.metrics.is_empty() {
                s.exe_id = exe_id;
            }
            s.metrics.reserved_bytes += bytes;
            s.metrics.mmaps += u64::from(new);
        }
    }

    fn unmapped(&mut self, stack: u64, bytes: u64) {
        if stack != 0 {
            self.map_stack(stack).mapped -= bytes;
        }
    }

    fn grow(&mut self, block: Block) {
        self.live_bytes += block.size;
        self.live_blocks += 1;
        if block.stack != 0 {
            let s = self.stack(block.stack);
            s.live += block.size;
            s.live_blocks += 1;
        }
    }

    fn shrink(&mut self, block: Block) {
        self.live_bytes -= block.size;
        self.live_blocks -= 1;
        if block.stack != 0 {
            let s = self.stack(block.stack);
            s.live -= block.size;
            s.live_blocks -= 1;
        }
    }

    fn check_peak(&mut self, ts: u64) {
        if self.live_bytes > self.peak_live_bytes {
            self.peak_live_bytes = self.live_bytes;
            self.peak_live_at_ns = ts;
            self.peak_seq = self.seq;
        }
    }
}

/// Folds the records of one capture. Times are `CLOCK_MONOTONIC` ns.
#[derive(Debug, Default)]
pub struct Aggregator {
    /// Every process seen, in order of appearance (a reused pid gets a new
    /// entry).
    procs: Vec<Process>,
    /// pid -> index in `procs` of the newest process with that pid.
    by_pid: HashMap<u32, usize>,
    tree: TreeLive,
    mapped_bytes: u64,
    peak_mapped_bytes: u64,
    reserved_bytes: u64,
    peak_reserved_bytes: u64,
    arena_bytes: u64,
    peak_arena_bytes: u64,
    /// The sum of the running processes' latest RSS, and the tree's
    /// resident memory.
    rss_total: u64,
    resident: Resident,
    /// Whether mappings and break growth without a stack go to their
    /// process's direct-syscall site (when stacks are captured).
    direct_syscall_sites: bool,
    /// Direct-syscall and allocator-arena sites seen: id -> pid.
    direct_sites: HashMap<u64, (u32, PseudoSite)>,
    /// Records this version does not understand.
    pub malformed: u64,
    /// Records refused from tracked processes' own rings.
    corrupt: corrupt::Corrupt,
    /// The heap over time; `None` when not kept.
    timeline: Option<timeline::Builder>,
    /// Every executable exec'd in the tree, once, by id ("" first: none
    /// seen yet); `exe_ids` the other way round.
    exe_names: Vec<String>,
    exe_ids: HashMap<String, u32>,
}

impl Aggregator {
    /// An aggregator that keeps the timeline.
    pub fn new() -> Self {
        let mut agg = Self {
            timeline: Some(timeline::Builder::default()),
            ..Self::default()
        };
        agg.tree.sites.on = true;
        agg
    }

    /// Processes seen, the tree's live heap bytes and its peak, for the
    /// live status line.
    pub(crate) fn live_view(&self) -> (u64, u64, u64) {
        (
            self.procs.len() as u64,
            self.tree.live_bytes,
            self.tree.peak_live_bytes,
        )
    }

    /// Gives anonymous mappings and break growth made by direct syscalls
    /// (no libc wrapper's stack) their process's direct-syscall site: on
    /// when stacks are captured.
    pub fn set_direct_syscall_sites(&mut self, on: bool) {
        self.direct_syscall_sites = on;
    }

    /// The process of a direct-syscall or allocator-arena site, if `id` is
    /// one, and which.
    pub fn pseudo_site(&self, id: u64) -> Option<(u32, PseudoSite)> {
        self.direct_sites.get(&id).copied()
    }

    /// The tree's resident memory.
    pub fn resident(&self) -> Resident {
        let mut r = self.resident;
        // Never below a process's exact peak (the sum is of recorded
        // values).
        for p in &self.procs {
            r.peak_rss_bytes = r.peak_rss_bytes.max(p.resident.peak_rss_bytes);
        }
        r
    }

    /// An aggregator without the timeline (to measure what it costs).
    pub fn without_timeline() -> Self {
        Self::default()
    }

    /// The timeline, times relative to `start_ns` (`None` when not kept).
    pub fn timeline(&self, start_ns: u64) -> Option<Timeline> {
        self.timeline.as_ref().map(|b| {
            b.build(
                start_ns,
                self.procs.iter().map(|p| p.pid),
                (self.tree.peak_live_bytes, self.tree.peak_live_at_ns),
                &self.tree,
            )
        })
    }

    /// Samples the tree and process `idx` into the timeline, in the
    /// interval [`timeline::Builder::begin`] found for the record.
    fn sample(&mut self, idx: usize) {
        let Some(b) = self.timeline.as_mut() else {
            return;
        };
        let tree = Point {
            live_bytes: self.tree.live_bytes,
            live_blocks: self.tree.live_blocks,
            mapped_bytes: self.mapped_bytes,
            rss_bytes: self.rss_total,
        };
        let proc = self.procs[idx]
            .state
            .as_deref()
            .map_or_else(Point::default, |s| Point {
                live_bytes: s.live_bytes,
                live_blocks: s.blocks.len() as u64,
                mapped_bytes: s.mapped_bytes,
                rss_bytes: s.rss,
            });
        b.record(tree, idx, proc);
        self.tree.sites.sampled(self.tree.seq, self.tree.live_bytes);
    }

    /// The tree's live heap now: bytes and blocks.
    pub fn live_now(&self) -> (u64, u64) {
        (self.tree.live_bytes, self.tree.live_blocks)
    }

    /// Names the parent of a process whose fork was not recorded (the root).
    pub fn set_parent(&mut self, pid: u32, ppid: u32) {
        if let Some(&idx) = self.by_pid.get(&pid) {
            self.procs[idx].ppid = ppid;
        }
    }

    /// Adds a process that was running before the capture (one memtrail
    /// attaches to), with its parent and executable as they are now: no
    /// exec or fork record names them. Call before any record of `pid`.
    pub fn add_running(&mut self, pid: u32, ppid: u32, exe: &str, ts: u64) {
        let exe_id = self.intern_exe(exe);
        self.insert(Process {
            pid,
            ppid,
            exe: exe.to_owned(),
            exe_id,
            start_ns: ts,
            state: Some(Box::default()),
            ..Process::default()
        });
    }

    /// The kernel's wait status of the newest process with `pid`, once it
    /// exited.
    pub fn exit_status(&self, pid: u32) -> Option<i32> {
        self.procs[*self.by_pid.get(&pid)?].exit_status
    }

    fn insert(&mut self, proc: Process) {
        self.by_pid.insert(proc.pid, self.procs.len());
        self.procs.push(proc);
    }

    /// Processes in order of appearance.
    pub fn processes(&self) -> impl Iterator<Item = &Process> {
        self.procs.iter()
    }

    /// Tree-wide heap counters.
    pub fn totals(&self) -> HeapCounters {
        let mut t = HeapCounters::default();
        for p in self.processes() {
            let h = &p.heap;
            t.allocations += h.allocations;
            t.frees += h.frees;
            t.reallocs += h.reallocs;
            t.allocated_bytes += h.allocated_bytes;
            t.freed_bytes += h.freed_bytes;
            t.live_bytes_at_exit += h.live_bytes_at_exit;
            t.live_allocations_at_exit += h.live_allocations_at_exit;
            t.unmatched_frees += h.unmatched_frees;
            t.temporary_allocations += h.temporary_allocations;
        }
        t.peak_live_bytes = self.tree.peak_live_bytes;
        t.peak_live_at_ns = self.tree.peak_live_at_ns;
        t
    }

    /// The heap counters of the newest process with `pid`, if seen.
    pub fn heap_of(&self, pid: u32) -> Option<HeapCounters> {
        self.by_pid.get(&pid).map(|&idx| self.procs[idx].heap)
    }

    /// What a running process has live now: bytes and blocks (zero once
    /// it has exited).
    pub fn live_of(&self, proc: &Process) -> (u64, u64) {
        proc.state
            .as_deref()
            .map_or((0, 0), |s| (s.live_bytes, s.blocks.len() as u64))
    }

    /// Tree-wide mapping counters.
    pub fn mapping_totals(&self) -> MapCounters {
        let mut t = MapCounters::default();
        for p in self.processes() {
            let m = &p.maps;
            t.mmaps += m.mmaps;
            t.munmaps += m.munmaps;
            t.mapped_bytes += m.mapped_bytes;
            t.unmapped_bytes += m.unmapped_bytes;
            t.mapped_bytes_at_exit += m.mapped_bytes_at_exit;
            t.brk_peak_bytes = t.brk_peak_bytes.max(m.brk_peak_bytes);
            t.brk_bytes_at_exit += m.brk_bytes_at_exit;
            t.brk_grown_bytes += m.brk_grown_bytes;
            t.mprotects += m.mprotects;
            t.reserved_bytes += m.reserved_bytes;
            t.reserved_bytes_at_exit += m.reserved_bytes_at_exit;
            t.arena_mmaps += m.arena_mmaps;
            t.arena_bytes_at_exit += m.arena_bytes_at_exit;
            t.arena_committed_bytes_at_exit += m.arena_committed_bytes_at_exit;
        }
        t.peak_mapped_bytes = self.peak_mapped_bytes;
        t.peak_reserved_bytes = self.peak_reserved_bytes;
        t.peak_arena_bytes = self.peak_arena_bytes;
        t
    }

    /// The executable the process of stack `id` ran when the stack first
    /// allocated, if known.
    pub fn stack_exe(&self, id: u64) -> Option<&str> {
        let s = self.tree.stacks.get(&id)?;
        let name = self.exe_names.get(usize::try_from(s.exe_id).ok()?)?;
        (!name.is_empty()).then_some(name.as_str())
    }

    /// The id of executable `exe` in `exe_names`, added if new.
    fn intern_exe(&mut self, exe: &str) -> u32 {
        if let Some(&id) = self.exe_ids.get(exe) {
            return id;
        }
        if self.exe_names.is_empty() {
            self.exe_names.push(String::new());
        }
        let id = u32::try_from(self.exe_names.len()).unwrap_or(0);
        self.exe_names.push(exe.to_owned());
        self.exe_ids.insert(exe.to_owned(), id);
        id
    }

    /// Metrics of every stack that allocated, by stack id. Call after
    /// [`finish`](Self::finish).
    pub fn stack_metrics(&self) -> impl Iterator<Item = (u64, StackMetrics)> + '_ {
        self.tree.stacks.iter().map(|(&id, s)| (id, s.metrics))
    }

    /// Folds one record.
    pub fn apply(&mut self, rec: &Record<'_>) {
        self.tree.seq += 1;
        let ts = rec.hdr.ts_ns;
        let pid = rec.hdr.pid;
        if let Some(b) = self.timeline.as_mut()
            && !matches!(rec.body, Body::Region { .. })
        {
            b.begin(ts, &mut self.tree);
        }
        match rec.body {
            Body::Fork { child_pid } => self.fork(pid, child_pid, ts),
            Body::Exec { filename } => {
                let exe = String::from_utf8_lossy(filename).into_owned();
                let exe_id = self.intern_exe(&exe);
                let idx = self.index(pid, ts);
                self.procs[idx].exe = exe;
                self.procs[idx].exe_id = exe_id;
                let old = self.procs[idx].state.replace(Box::default());
                if let Some(old) = old {
                    // The old image is gone: its blocks are neither freed
                    // nor leaked.
                    for block in old.blocks.values() {
                        self.tree.shrink(*block);
                    }
                    for (start, r) in &old.regions {
                        if !r.reserved {
                            self.tree.unmapped(r.stack, r.end - start);
                        }
                    }
                    self.mapped_bytes -= old.mapped_bytes;
                    self.reserved_bytes -= old.reserved_bytes;
                    self.arena_bytes -= old.arena_bytes;
                    // Its RSS goes on in the new image's records.
                    if let Some(new) = self.procs[idx].state.as_deref_mut() {
                        new.rss = old.rss;
                    }
                }
                self.sample(idx);
            }
            Body::Exit { exit_code } => {
                let idx = self.index(pid, ts);
                self.procs[idx].exit_status = Some(exit_code);
                self.close(idx, ts);
            }
            Body::Mem(mem) => {
                let idx = self.mem(&rec.hdr, mem);
                self.sample(idx);
            }
            Body::Rss { rss, peak } => {
                let idx = self.index(pid, ts);
                self.rss(idx, rss, peak);
                self.sample(idx);
            }
            // Folded by the region markers (the session's region markers).
            Body::Region { .. } => {}
        }
    }

    /// Index of the newest process with `pid`, created if unseen.
    fn index(&mut self, pid: u32, ts: u64) -> usize {
        if let Some(&idx) = self.by_pid.get(&pid) {
            return idx;
        }
        // A process whose fork we did not see (the root).
        self.insert(Process {
            pid,
            start_ns: ts,
            state: Some(Box::default()),
            ..Process::default()
        });
        self.procs.len() - 1
    }

    fn fork(&mut self, parent: u32, child: u32, ts: u64) {
        let idx = self.index(parent, ts);
        let parent_proc = &self.procs[idx];
        let exe = parent_proc.exe.clone();
        let exe_id = parent_proc.exe_id;
        let state = parent_proc
            .state
            .as_deref()
            .map(LiveState::forked)
            .unwrap_or_default();
        self.insert(Process {
            pid: child,
            ppid: parent,
            exe,
            exe_id,
            start_ns: ts,
            state: Some(Box::new(state)),
            ..Process::default()
        });
        self.sample(self.procs.len() - 1);
    }

    /// Ends a process: what it still has live is its leaks.
    fn close(&mut self, idx: usize, ts: u64) {
        let p = &mut self.procs[idx];
        p.end_ns = Some(ts);
        let Some(state) = p.state.take() else {
            return;
        };
        p.heap.live_bytes_at_exit = state.live_bytes;
        p.heap.live_allocations_at_exit = state.blocks.len() as u64;
        p.maps.mapped_bytes_at_exit = state.mapped_bytes;
        p.maps.reserved_bytes_at_exit = state.reserved_bytes;
        p.maps.arena_bytes_at_exit = state.arena_bytes;
        p.maps.arena_committed_bytes_at_exit = state.arena_committed;
        self.rss_total -= state.rss;
        self.arena_bytes -= state.arena_bytes;
        self.reserved_bytes -= state.reserved_bytes;
        if let Some(start) = state.brk_start {
            p.maps.brk_bytes_at_exit = state.brk_now.saturating_sub(start);
        }
        for block in state.blocks.values() {
            self.tree.shrink(*block);
            if block.stack != 0 {
                let m = &mut self.tree.stack(block.stack).metrics;
                m.live_bytes_at_exit += block.size;
                m.live_allocations_at_exit += 1;
            }
        }
        for (start, r) in &state.regions {
            let bytes = r.end - start;
            if r.stack == 0 {
                continue;
            }
            if r.reserved {
                self.tree.map_stack(r.stack).metrics.reserved_bytes_at_exit += bytes;
            } else {
                self.tree.unmapped(r.stack, bytes);
                self.tree.map_stack(r.stack).metrics.mapped_bytes_at_exit += bytes;
            }
        }
        // An arena site's bytes are apart from the mapping peak's.
        for (start, r) in state.arenas.iter().filter(|(_, r)| r.stack != 0) {
            let m = &mut self.tree.stacks.entry(r.stack).or_default().metrics;
            if r.reserved {
                m.reserved_bytes_at_exit += r.end - start;
            } else {
                m.mapped_bytes_at_exit += r.end - start;
            }
        }
        self.mapped_bytes -= state.mapped_bytes;
        self.sample(idx);
    }

    /// Folds an allocator or memory-syscall record; returns its process's
    /// index.
    fn mem(&mut self, hdr: &Header, mem: Mem) -> usize {
        let idx = self.index(hdr.pid, hdr.ts_ns);
        // The site of a mapping or break growth made outside allocators.
        let site = self.site_of(hdr, mem, idx);
        let p = &mut self.procs[idx];
        let exe_id = p.exe_id;
        let Some(state) = p.state.as_deref_mut() else {
            return idx;
        };
        let resident = &mut p.resident;
        let live_before = state.live_bytes;
        let mut f = Fold {
            state,
            heap: &mut p.heap,
            maps: &mut p.maps,
            tree: &mut self.tree,
            exe_id,
            tid: hdr.tid,
            mapped: Moved::default(),
            reserved: Moved::default(),
            arena: Moved::default(),
        };
        match hdr.kind {
            Kind::ReallocBegin => f.realloc_begin(mem.addr),
            k if k.is_realloc() => f.realloc(mem),
            k if k.is_allocation() => f.allocation(mem),
            Kind::Free => f.free(mem.addr),
            Kind::Mmap if !hdr.in_allocator => f.mmap(mem, site),
            Kind::Mmap if mem.prot() == 0 => f.arena_mmap(mem, site),
            Kind::Munmap if !hdr.in_allocator => f.munmap(mem),
            Kind::Munmap => f.arena_munmap(mem),
            Kind::Mremap if !hdr.in_allocator => f.mremap(mem),
            Kind::Mprotect if !hdr.in_allocator => f.mprotect(mem),
            Kind::Mprotect => f.arena_mprotect(mem),
            Kind::Brk => f.brk(mem.addr, site, hdr.in_allocator),
            _ => {}
        }
        let Fold {
            state,
            heap,
            maps,
            tree,
            mapped,
            reserved,
            arena,
            ..
        } = f;
        if state.live_bytes > heap.peak_live_bytes {
            heap.peak_live_bytes = state.live_bytes;
            heap.peak_live_at_ns = hdr.ts_ns;
            resident.rss_at_heap_peak_bytes = state.rss;
        }
        if state.live_bytes > live_before {
            tree.check_peak(hdr.ts_ns);
            if tree.peak_seq == tree.seq {
                self.resident.rss_at_heap_peak_bytes = self.rss_total;
            }
        }
        state.mapped_bytes = mapped.apply(state.mapped_bytes);
        maps.peak_mapped_bytes = maps.peak_mapped_bytes.max(state.mapped_bytes);
        state.reserved_bytes = reserved.apply(state.reserved_bytes);
        maps.peak_reserved_bytes = maps.peak_reserved_bytes.max(state.reserved_bytes);
        state.arena_bytes = arena.apply(state.arena_bytes);
        maps.peak_arena_bytes = maps.peak_arena_bytes.max(state.arena_bytes);
        self.mapped_bytes = mapped.apply(self.mapped_bytes);
        if self.mapped_bytes > self.peak_mapped_bytes {
            self.peak_mapped_bytes = self.mapped_bytes;
            self.tree.mapped_peak_seq = self.tree.seq;
        }
        self.reserved_bytes = reserved.apply(self.reserved_bytes);
        self.peak_reserved_bytes = self.peak_reserved_bytes.max(self.reserved_bytes);
        self.arena_bytes = arena.apply(self.arena_bytes);
        self.peak_arena_bytes = self.peak_arena_bytes.max(self.arena_bytes);
        idx
    }

    /// The site of a mapping or break growth made outside allocators (its
    /// stack, else the direct-syscall site), or of an allocator's arena
    /// (its arena site); 0 for none.
    fn site_of(&mut self, hdr: &Header, mem: Mem, idx: usize) -> u64 {
        let pseudo = match hdr.kind {
            Kind::Mmap | Kind::Brk if !hdr.in_allocator => {
                if mem.stack_id != 0 {
                    return mem.stack_id;
                }
                PseudoSite::DirectSyscall
            }
            Kind::Mmap if mem.prot() == 0 => PseudoSite::AllocatorArena,
            _ => return 0,
        };
        if !self.direct_syscall_sites {
            return 0;
        }
        let exe_id = self.procs[idx].exe_id;
        let id = match pseudo {
            PseudoSite::DirectSyscall => direct_syscall_id(hdr.pid, exe_id),
            PseudoSite::AllocatorArena => arena_site_id(hdr.pid, exe_id),
        };
        self.direct_sites.insert(id, (hdr.pid, pseudo));
        id
    }

    /// Folds an RSS record of process `idx`.
    fn rss(&mut self, idx: usize, rss: u64, peak: u64) {
        let p = &mut self.procs[idx];
        p.resident.samples += 1;
        p.resident.peak_rss_bytes = p.resident.peak_rss_bytes.max(peak).max(rss);
        self.resident.samples += 1;
        let Some(state) = p.state.as_deref_mut() else {
            return;
        };
        self.rss_total = self.rss_total - state.rss + rss;
        state.rss = rss;
        self.resident.peak_rss_bytes = self.resident.peak_rss_bytes.max(self.rss_total);
    }

    /// A record from process `pid`'s own ring (the preload shim's; `ring`
    /// its index when known) could not be read, for reason `what`: logged
    /// on the process's first, counted, and the process's counts marked
    /// incomplete (see `corrupt`).
    pub fn refuse_record(&mut self, pid: u32, ring: Option<u32>, what: &str) {
        // The record may come before the process's own (ring order): then
        // the kernel names it, until `finish` names it as the capture does.
        let exe = match self.by_pid.get(&pid) {
            Some(&i) => self.procs[i].exe.clone(),
            None => std::fs::read_link(format!("/proc/{pid}/exe")).map_or_else(
                |_| "(not known yet)".to_owned(),
                |p| p.to_string_lossy().into_owned(),
            ),
        };
        self.corrupt.refuse(pid, &exe, ring, what);
    }

    /// The processes whose own rings held records that could not be read.
    pub fn corrupt_rings(&self) -> &[crate::profile::CorruptRing] {
        self.corrupt.rings()
    }

    /// Allocations from process `pid`'s own ring named stacks it never
    /// carried (`ring::merge` handed them on in no stack): `counts`,
    /// logged once per process at [`finish`](Self::finish).
    pub fn ring_unrecorded(&mut self, pid: u32, counts: crate::profile::UnrecordedStacks) {
        self.corrupt.unrecorded(pid, counts);
    }

    /// What every process's own ring named and never carried.
    pub fn ring_unrecorded_total(&self) -> crate::profile::UnrecordedStacks {
        self.corrupt.unrecorded_total()
    }

    /// Ends processes that never reported an exit (the capture ended
    /// first): what they have live counts as live at exit. Then settles
    /// every stack's live bytes at the peak.
    pub fn finish(&mut self, ts_ns: u64) {
        let (procs, by_pid) = (&self.procs, &self.by_pid);
        self.corrupt
            .finish(|pid| by_pid.get(&pid).map(|&i| procs[i].exe.as_str()));
        // The closes below come after every record, the peak's included.
        self.tree.seq += 1;
        if let Some(b) = self.timeline.as_mut() {
            b.begin(ts_ns, &mut self.tree);
        }
        let open: Vec<usize> = (0..self.procs.len())
            .filter(|&i| self.procs[i].state.is_some())
            .collect();
        for idx in open {
            self.close(idx, ts_ns);
        }
        let (peak_seq, mapped_peak_seq) = (self.tree.peak_seq, self.tree.mapped_peak_seq);
        for s in self.tree.stacks.values_mut() {
            if s.changed <= peak_seq {
                s.metrics.live_bytes_at_peak = s.live;
                s.metrics.live_allocations_at_peak = s.live_blocks;
            }
            if s.mapped_changed <= mapped_peak_seq {
                s.metrics.mapped_bytes_at_peak = s.mapped;
            }
        }
    }
}

/// One record's fold into its process's live state and the tree's
/// stacks (`Aggregator::mem`, one method per record kind).
struct Fold<'a> {
    state: &'a mut LiveState,
    heap: &'a mut HeapCounters,
    maps: &'a mut MapCounters,
    tree: &'a mut TreeLive,
    exe_id: u32,
    tid: u32,
    /// Committed, reserved and arena bytes the record added and removed.
    mapped: Moved,
    reserved: Moved,
    arena: Moved,
}

/// Bytes a record added to a count and removed from it.
#[derive(Clone, Copy, Debug, Default)]
struct Moved {
    grew: u64,
    shrank: u64,
}

impl Moved {
    fn apply(self, count: u64) -> u64 {
        count + self.grew - self.shrank
    }
}

impl Fold<'_> {
    /// The outermost realloc of a live block opens: the old block leaves
    /// the live map before another thread can be handed its address.
    fn realloc_begin(&mut self, addr: u64) {
        let state = &mut *self.state;
        let pending = if let Some(block) = state.blocks.remove(&addr) {
            Some((block, false))
        } else {
            state.inherited.remove(&addr).map(|b| (b, true))
        };
        if let Some((block, inherited)) = pending {
            state.reallocs.insert(
                self.tid,
                PendingRealloc {
                    addr,
                    block,
                    inherited,
                },
            );
        }
    }

    /// A realloc settles the block its `ReallocBegin` took out.
    fn realloc(&mut self, mem: Mem) {
        let Mem {
            addr,
            size,
            old_addr,
            stack_id,
            ..
        } = mem;
        let (state, heap, tree) = (&mut *self.state, &mut *self.heap, &mut *self.tree);
        let old = state
            .reallocs
            .remove(&self.tid)
            .filter(|o| o.addr == old_addr);
        // Only the process's own old block leaves its live bytes.
        let own_old = old.filter(|o| !o.inherited).map(|o| o.block);
        if addr != 0 || (old.is_some() && size == 0) {
            // The old block is freed (heaptrack: a free, then an
            // allocation of the new block).
            let last = state.last_alloc.remove(&self.tid);
            if let Some(b) = own_old.filter(|_| last == Some(old_addr)) {
                temporary(heap, tree, b);
            }
            if addr != 0 {
                state.last_alloc.insert(self.tid, addr);
            }
        }
        if addr != 0 {
            let block = Block {
                size,
                stack: stack_id,
            };
            heap.allocations += 1;
            heap.reallocs += 1;
            heap.allocated_bytes += size;
            if let Some(b) = own_old {
                heap.freed_bytes += b.size;
                state.live_bytes -= b.size;
                tree.shrink(b);
            }
            state.blocks.insert(addr, block);
            state.live_bytes += size;
            tree.grow(block);
            stack_allocated(tree, block, self.exe_id);
        } else if old.is_some() && size == 0 {
            // realloc(p, 0): glibc frees p and returns NULL.
            if let Some(b) = own_old {
                heap.freed_bytes += b.size;
                state.live_bytes -= b.size;
                tree.shrink(b);
            }
        } else if let Some(o) = old {
            // Failed: the old block stays.
            let map = if o.inherited {
                &mut state.inherited
            } else {
                &mut state.blocks
            };
            map.insert(o.addr, o.block);
        }
    }

    fn allocation(&mut self, mem: Mem) {
        let (state, heap, tree) = (&mut *self.state, &mut *self.heap, &mut *self.tree);
        let block = Block {
            size: mem.size,
            stack: mem.stack_id,
        };
        heap.allocations += 1;
        heap.allocated_bytes += mem.size;
        if let Some(prev) = state.blocks.insert(mem.addr, block) {
            // The allocator reused an address we never saw freed.
            state.live_bytes -= prev.size;
            tree.shrink(prev);
        }
        state.inherited.remove(&mem.addr);
        state.live_bytes += mem.size;
        tree.grow(block);
        stack_allocated(tree, block, self.exe_id);
        state.last_alloc.insert(self.tid, mem.addr);
    }

    fn free(&mut self, addr: u64) {
        let (state, heap, tree) = (&mut *self.state, &mut *self.heap, &mut *self.tree);
        let last = if addr == 0 {
            None
        } else {
            state.last_alloc.remove(&self.tid)
        };
        if let Some(block) = state.blocks.remove(&addr) {
            if last == Some(addr) {
                temporary(heap, tree, block);
            }
            heap.frees += 1;
            heap.freed_bytes += block.size;
            state.live_bytes -= block.size;
            tree.shrink(block);
        } else if state.inherited.remove(&addr).is_some() {
            heap.frees += 1;
        } else {
            // Not a block we saw allocated: e.g. glibc releasing a
            // thread's cache at thread exit through free().
            heap.unmatched_frees += 1;
        }
    }

    /// An anonymous mapping made outside allocator calls, at `site`:
    /// committed, or reserved when mapped without access rights.
    fn mmap(&mut self, mem: Mem, site: u64) {
        let (addr, end) = (mem.addr, page_end(mem.addr, mem.size));
        let reserved = mem.prot() == 0;
        // MAP_FIXED may replace regions we hold.
        let (c, r) = mapping::bytes(&self.state.unmap(addr, end, self.tree));
        (self.mapped.shrank, self.reserved.shrank) = (c, r);
        let region = Region {
            end,
            stack: site,
            reserved,
        };
        self.state.regions.insert(addr, region);
        self.maps.mmaps += 1;
        if reserved {
            self.tree.reserved(site, end - addr, true, self.exe_id);
            self.maps.reserved_bytes += end - addr;
            self.reserved.grew = end - addr;
        } else {
            self.tree.mapped(site, end - addr, true, self.exe_id);
            self.maps.mapped_bytes += end - addr;
            self.mapped.grew = end - addr;
        }
    }

    fn munmap(&mut self, mem: Mem) {
        let pieces = self
            .state
            .unmap(mem.addr, page_end(mem.addr, mem.size), self.tree);
        let (c, r) = mapping::bytes(&pieces);
        if c + r > 0 {
            self.maps.munmaps += 1;
            self.maps.unmapped_bytes += c;
            (self.mapped.shrank, self.reserved.shrank) = (c, r);
        }
    }

    /// mprotect gives a range of our regions access rights (committed) or
    /// takes them (reserved), at the stacks that mapped them.
    fn mprotect(&mut self, mem: Mem) {
        let reserved = mem.prot() == 0;
        let end = page_end(mem.addr, mem.size);
        let changed = mapping::protect(&mut self.state.regions, mem.addr, end, reserved);
        if changed.is_empty() {
            return;
        }
        self.maps.mprotects += 1;
        for (s, e, r) in changed {
            let len = e - s;
            if reserved {
                self.tree.unmapped(r.stack, len);
                self.tree.reserved(r.stack, len, false, self.exe_id);
                self.maps.unmapped_bytes += len;
                self.maps.reserved_bytes += len;
                self.mapped.shrank += len;
                self.reserved.grew += len;
            } else {
                self.tree.mapped(r.stack, len, false, self.exe_id);
                self.maps.mapped_bytes += len;
                self.reserved.shrank += len;
                self.mapped.grew += len;
            }
        }
    }

    /// A reservation an allocator mapped in its own call: an arena of its
    /// process, at its arena site.
    fn arena_mmap(&mut self, mem: Mem, site: u64) {
        let (addr, end) = (mem.addr, page_end(mem.addr, mem.size));
        let (c, r) = mapping::bytes(&mapping::cut(&mut self.state.arenas, addr, end));
        self.state.arena_committed -= c;
        self.arena.shrank = c + r;
        let region = Region {
            end,
            stack: site,
            reserved: true,
        };
        self.state.arenas.insert(addr, region);
        self.arena.grew = end - addr;
        self.maps.arena_mmaps += 1;
        if site != 0 {
            let s = self.tree.stacks.entry(site).or_default();
            s.exe_id = self.exe_id;
            s.metrics.mmaps += 1;
            s.metrics.reserved_bytes += end - addr;
        }
    }

    fn arena_munmap(&mut self, mem: Mem) {
        let end = page_end(mem.addr, mem.size);
        let (c, r) = mapping::bytes(&mapping::cut(&mut self.state.arenas, mem.addr, end));
        self.state.arena_committed -= c;
        self.arena.shrank = c + r;
    }

    /// The allocator commits part of an arena (or decommits it).
    fn arena_mprotect(&mut self, mem: Mem) {
        let reserved = mem.prot() == 0;
        let end = page_end(mem.addr, mem.size);
        for (s, e, r) in mapping::protect(&mut self.state.arenas, mem.addr, end, reserved) {
            if reserved {
                self.state.arena_committed -= e - s;
            } else {
                self.state.arena_committed += e - s;
                if let Some(site) = self.tree.stacks.get_mut(&r.stack) {
                    site.metrics.mapped_bytes += e - s;
                }
            }
        }
    }

    /// mremap moves a region we hold (with its stack) to the new range.
    fn mremap(&mut self, mem: Mem) {
        let Mem {
            addr,
            size,
            old_addr,
            old_size,
            ..
        } = mem;
        let (state, tree) = (&mut *self.state, &mut *self.tree);
        let old = state.unmap(old_addr, page_end(old_addr, old_size), tree);
        let (c, r) = mapping::bytes(&old);
        if c + r > 0 {
            let stack = old.last().map_or(0, |&(_, _, r)| r.stack);
            // Reserved if all it moved was.
            let reserved = c == 0;
            let end = page_end(addr, size);
            let (c2, r2) = mapping::bytes(&state.unmap(addr, end, tree));
            (self.mapped.shrank, self.reserved.shrank) = (c + c2, r + r2);
            let region = Region {
                end,
                stack,
                reserved,
            };
            state.regions.insert(addr, region);
            if reserved {
                tree.reserved(stack, end - addr, false, self.exe_id);
                self.maps.reserved_bytes += end - addr;
                self.reserved.grew = end - addr;
            } else {
                tree.mapped(stack, end - addr, false, self.exe_id);
                self.maps.unmapped_bytes += c;
                self.maps.mapped_bytes += end - addr;
                self.mapped.grew = end - addr;
            }
        }
    }

    /// brk returns the current break, whatever was asked; growth outside
    /// allocator calls goes to `site`.
    fn brk(&mut self, addr: u64, site: u64, in_allocator: bool) {
        let (state, maps) = (&mut *self.state, &mut *self.maps);
        let known = state.brk_start.is_some();
        let start = *state.brk_start.get_or_insert(addr);
        if known && !in_allocator && addr > state.brk_now {
            let grown = addr - state.brk_now;
            maps.brk_grown_bytes += grown;
            if site != 0 {
                let s = self.tree.stack(site);
                if s.metrics.is_empty() {
                    s.exe_id = self.exe_id;
                }
                s.metrics.brk_bytes += grown;
            }
        }
        state.brk_now = addr;
        maps.brk_peak_bytes = maps.brk_peak_bytes.max(addr.saturating_sub(start));
    }
}

/// Counts a freed block as temporary, in its process and at its stack.
fn temporary(heap: &mut HeapCounters, tree: &mut TreeLive, block: Block) {
    heap.temporary_allocations += 1;
    if block.stack != 0 {
        tree.stack(block.stack).metrics.temporary_allocations += 1;
    }
}

/// Counts an allocation at its stack; the stack's first one sets the
/// executable it belongs to.
fn stack_allocated(tree: &mut TreeLive, block: Block, exe_id: u32) {
    if block.stack != 0 {
        let s = tree.stack(block.stack);
        if s.metrics.is_empty() {
            s.exe_id = exe_id;
        }
        s.metrics.allocations += 1;
        s.metrics.bytes += block.size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A memory record of process 7 at `ts`; `old_addr` is mmap's and
    /// mprotect's protection.
    fn mem(
        ts: u64,
        kind: Kind,
        in_allocator: bool,
        addr: u64,
        size: u64,
        prot: u64,
    ) -> Record<'static> {
        Record {
            hdr: Header {
                ts_ns: ts,
                pid: 7,
                tid: 7,
                kind,
                in_allocator,
            },
            body: Body::Mem(Mem {
                addr,
                size,
                old_addr: prot,
                old_size: 0,
                stack_id: 5,
            }),
        }
    }

    fn rss(ts: u64, rss: u64, peak: u64) -> Record<'static> {
        Record {
            hdr: Header {
                ts_ns: ts,
                pid: 7,
                tid: 7,
                kind: Kind::Rss,
                in_allocator: false,
            },
            body: Body::Rss { rss, peak },
        }
    }

    /// Check that a reservation committed in part counts reserved and
    /// committed bytes apart (in the process, the tree and at its stack),
    /// that an allocator's reservation is an arena at the arena site, and
    /// that RSS records give the peak and the RSS at the heap peak.
    #[test]
    fn aggregate_reserved_committed_arena_rss() {
        let mut agg = Aggregator::new();
        agg.set_direct_syscall_sites(true);
        let base = 0x7f00_0000_0000;
        agg.apply(&rss(1, MIB, MIB));
        agg.apply(&mem(2, Kind::Mmap, false, base, 256 * MIB, 0));
        agg.apply(&mem(3, Kind::Mprotect, false, base + 64 * MIB, 8 * MIB, 3));
        agg.apply(&mem(4, Kind::Malloc, false, 0x1000, 100, 0));
        agg.apply(&rss(5, 9 * MIB, 9 * MIB));
        // An arena: 128 MiB reserved, trimmed to 64, 132 KiB committed.
        let arena = 0x7e00_0000_0000;
        agg.apply(&mem(6, Kind::Mmap, true, arena, 128 * MIB, 0));
        agg.apply(&mem(7, Kind::Munmap, true, arena + 64 * MIB, 64 * MIB, 0));
        agg.apply(&mem(8, Kind::Mprotect, true, arena, 132 << 10, 3));
        // The allocator's large block: the heap's, not a mapping.
        agg.apply(&mem(9, Kind::Mmap, true, 0x7d00_0000_0000, 4 * MIB, 3));
        agg.apply(&rss(10, 2 * MIB, 10 * MIB));
        agg.finish(11);
        let m = agg.mapping_totals();
        assert_eq!(
            (
                m.mmaps,
                m.mapped_bytes,
                m.peak_mapped_bytes,
                m.mapped_bytes_at_exit
            ),
            (1, 8 * MIB, 8 * MIB, 8 * MIB)
        );
        assert_eq!(
            (
                m.reserved_bytes,
                m.peak_reserved_bytes,
                m.reserved_bytes_at_exit,
                m.mprotects
            ),
            (256 * MIB, 256 * MIB, 248 * MIB, 1)
        );
        assert_eq!(
            (m.arena_mmaps, m.peak_arena_bytes, m.arena_bytes_at_exit),
            (1, 128 * MIB, 64 * MIB)
        );
        assert_eq!(m.arena_committed_bytes_at_exit, 132 << 10);
        let stack = agg
            .stack_metrics()
            .find(|&(id, _)| id == 5)
            .expect("stack")
            .1;
        assert_eq!(
            (stack.mmaps, stack.mapped_bytes, stack.reserved_bytes),
            (1, 8 * MIB, 256 * MIB)
        );
        assert_eq!(
            (stack.mapped_bytes_at_exit, stack.reserved_bytes_at_exit),
            (8 * MIB, 248 * MIB)
        );
        let arena_site: Vec<(u64, StackMetrics)> = agg
            .stack_metrics()
            .filter(|&(id, _)| agg.pseudo_site(id) == Some((7, PseudoSite::AllocatorArena)))
            .collect();
        assert_eq!(arena_site.len(), 1);
        let a = arena_site[0].1;
        assert_eq!(
            (a.mmaps, a.reserved_bytes, a.mapped_bytes),
            (1, 128 * MIB, 132 << 10)
        );
        assert_eq!(a.reserved_bytes_at_exit + a.mapped_bytes_at_exit, 64 * MIB);
        let r = agg.resident();
        assert_eq!(
            (r.peak_rss_bytes, r.rss_at_heap_peak_bytes, r.samples),
            (10 * MIB, MIB, 3)
        );
    }
}
