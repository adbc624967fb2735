//! Aggregating events into the profile, the summary and the event stream.
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
//! - exec discards the old image's blocks, regions and program break.

mod output;
mod profile;
mod stream;
mod summary;

use std::collections::{BTreeMap, HashMap};

pub use output::{AtomicOutput, OutputError};
pub use profile::{ExitInfo, LostEvents, Profile, wait_status_code, write_profile};
pub use stream::EventWriter;
pub use summary::{human_bytes, write_summary};

use crate::record::{Body, Kind, Record};

/// Heap counters of a process or the whole tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeapCounters {
    pub allocations: u64,
    pub frees: u64,
    pub reallocs: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    pub peak_live_bytes: u64,
    pub peak_live_at_ns: u64,
    pub live_bytes_at_exit: u64,
    pub live_allocations_at_exit: u64,
    pub unmatched_frees: u64,
}

/// Anonymous mappings and program break of a process or the whole tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MapCounters {
    pub mmaps: u64,
    pub munmaps: u64,
    pub mapped_bytes: u64,
    pub unmapped_bytes: u64,
    pub peak_mapped_bytes: u64,
    pub mapped_bytes_at_exit: u64,
    pub brk_peak_bytes: u64,
    pub brk_bytes_at_exit: u64,
}

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
    state: Option<Box<LiveState>>,
}

/// What a running process has live.
#[derive(Clone, Debug, Default)]
struct LiveState {
    /// address -> size of blocks it allocated.
    blocks: HashMap<u64, u64>,
    /// Blocks inherited at fork: address -> size.
    inherited: HashMap<u64, u64>,
    live_bytes: u64,
    /// Old block of a realloc in flight, by thread: (address, size, inherited).
    reallocs: HashMap<u32, (u64, u64, bool)>,
    /// Anonymous regions made outside allocator calls: start -> end.
    regions: BTreeMap<u64, u64>,
    mapped_bytes: u64,
    brk_start: Option<u64>,
    brk_now: u64,
}

impl LiveState {
    /// A fork child's view: the parent's blocks become inherited.
    fn forked(&self) -> Self {
        let mut inherited = self.inherited.clone();
        inherited.extend(self.blocks.iter().map(|(&a, &s)| (a, s)));
        Self {
            inherited,
            regions: self.regions.clone(),
            mapped_bytes: 0,
            brk_start: self.brk_start.map(|_| self.brk_now),
            brk_now: self.brk_now,
            ..Self::default()
        }
    }

    /// Removes [start, end) from the regions; returns the bytes removed.
    fn unmap(&mut self, start: u64, end: u64) -> u64 {
        let overlapping: Vec<(u64, u64)> = self
            .regions
            .range(..end)
            .rev()
            .take_while(|&(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        let mut removed = 0;
        for (s, e) in overlapping {
            self.regions.remove(&s);
            if s < start {
                self.regions.insert(s, start);
            }
            if e > end {
                self.regions.insert(end, e);
            }
            removed += e.min(end) - s.max(start);
        }
        removed
    }
}

fn page_end(addr: u64, len: u64) -> u64 {
    addr.saturating_add(len).saturating_add(4095) & !4095
}

/// Folds the records of one capture. Times are `CLOCK_MONOTONIC` ns.
#[derive(Debug, Default)]
pub struct Aggregator {
    /// Every process seen, in order of appearance (a reused pid gets a new
    /// entry).
    procs: Vec<Process>,
    /// pid -> index in `procs` of the newest process with that pid.
    by_pid: HashMap<u32, usize>,
    live_bytes: u64,
    peak_live_bytes: u64,
    peak_live_at_ns: u64,
    mapped_bytes: u64,
    peak_mapped_bytes: u64,
    /// Records this version does not understand.
    pub malformed: u64,
}

impl Aggregator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Names the parent of a process whose fork was not recorded (the root).
    pub fn set_parent(&mut self, pid: u32, ppid: u32) {
        if let Some(&idx) = self.by_pid.get(&pid) {
            self.procs[idx].ppid = ppid;
        }
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
        }
        t.peak_live_bytes = self.peak_live_bytes;
        t.peak_live_at_ns = self.peak_live_at_ns;
        t
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
        }
        t.peak_mapped_bytes = self.peak_mapped_bytes;
        t
    }

    /// Folds one record.
    pub fn apply(&mut self, rec: &Record<'_>) {
        let ts = rec.hdr.ts_ns;
        let pid = rec.hdr.pid;
        match rec.body {
            Body::Fork { child_pid } => self.fork(pid, child_pid, ts),
            Body::Exec { filename } => {
                let exe = String::from_utf8_lossy(filename).into_owned();
                let p = self.process(pid, ts);
                p.exe = exe;
                let dropped = p.state.replace(Box::default());
                if let Some(old) = dropped {
                    self.live_bytes -= old.live_bytes;
                    self.mapped_bytes -= old.mapped_bytes;
                }
            }
            Body::Exit { exit_code } => self.exit(pid, ts, exit_code),
            Body::Mem {
                addr,
                size,
                old_addr,
                old_size,
            } => self.mem(
                rec.hdr.kind,
                pid,
                rec.hdr.tid,
                rec.hdr.in_allocator,
                ts,
                addr,
                size,
                old_addr,
                old_size,
            ),
        }
    }

    fn process(&mut self, pid: u32, ts: u64) -> &mut Process {
        let idx = match self.by_pid.get(&pid) {
            Some(&idx) => idx,
            None => {
                // A process whose fork we did not see.
                self.insert(Process {
                    pid,
                    start_ns: ts,
                    state: Some(Box::default()),
                    ..Process::default()
                });
                self.procs.len() - 1
            }
        };
        &mut self.procs[idx]
    }

    fn fork(&mut self, parent: u32, child: u32, ts: u64) {
        let parent_proc = self.process(parent, ts);
        let exe = parent_proc.exe.clone();
        let state = parent_proc
            .state
            .as_deref()
            .map(LiveState::forked)
            .unwrap_or_default();
        self.insert(Process {
            pid: child,
            ppid: parent,
            exe,
            start_ns: ts,
            state: Some(Box::new(state)),
            ..Process::default()
        });
    }

    fn exit(&mut self, pid: u32, ts: u64, status: i32) {
        self.process(pid, ts).exit_status = Some(status);
        self.close(pid, ts);
    }

    /// Ends a process: what it still has live is its leaks.
    fn close(&mut self, pid: u32, ts: u64) {
        let Some(&idx) = self.by_pid.get(&pid) else {
            return;
        };
        let p = &mut self.procs[idx];
        p.end_ns = Some(ts);
        if let Some(state) = p.state.take() {
            p.heap.live_bytes_at_exit = state.live_bytes;
            p.heap.live_allocations_at_exit = state.blocks.len() as u64;
            p.maps.mapped_bytes_at_exit = state.mapped_bytes;
            if let Some(start) = state.brk_start {
                p.maps.brk_bytes_at_exit = state.brk_now.saturating_sub(start);
            }
            self.live_bytes -= state.live_bytes;
            self.mapped_bytes -= state.mapped_bytes;
        }
    }

    #[expect(clippy::too_many_arguments, reason = "the fields of one record")]
    fn mem(
        &mut self,
        kind: Kind,
        pid: u32,
        tid: u32,
        in_allocator: bool,
        ts: u64,
        addr: u64,
        size: u64,
        old_addr: u64,
        old_size: u64,
    ) {
        let p = self.process(pid, ts);
        let Some(state) = p.state.as_deref_mut() else {
            return;
        };
        let heap = &mut p.heap;
        let maps = &mut p.maps;
        // Change of this process's live heap bytes, applied to the tree below.
        let mut grew = 0u64;
        let mut shrank = 0u64;
        let mut mapped_grew = 0u64;
        let mut mapped_shrank = 0u64;
        match kind {
            Kind::ReallocBegin => {
                if let Some(size) = state.blocks.remove(&addr) {
                    state.reallocs.insert(tid, (addr, size, false));
                } else if let Some(size) = state.inherited.remove(&addr) {
                    state.reallocs.insert(tid, (addr, size, true));
                }
            }
            k if k.is_realloc() => {
                let old = state.reallocs.remove(&tid).filter(|o| o.0 == old_addr);
                let (old_bytes, old_inherited) = match old {
                    Some((_, s, inh)) => (s, inh),
                    None => (0, false),
                };
                let own_old = if old_inherited { 0 } else { old_bytes };
                if addr != 0 {
                    heap.allocations += 1;
                    heap.reallocs += 1;
                    heap.allocated_bytes += size;
                    heap.freed_bytes += own_old;
                    state.blocks.insert(addr, size);
                    grew = size;
                    shrank = own_old;
                } else if old.is_some() && size == 0 {
                    // realloc(p, 0): glibc frees p and returns NULL.
                    heap.freed_bytes += own_old;
                    shrank = own_old;
                } else if let Some((a, s, inh)) = old {
                    // Failed: the old block stays.
                    if inh {
                        state.inherited.insert(a, s);
                    } else {
                        state.blocks.insert(a, s);
                    }
                }
            }
            k if k.is_allocation() => {
                heap.allocations += 1;
                heap.allocated_bytes += size;
                if let Some(prev) = state.blocks.insert(addr, size) {
                    // The allocator reused an address we never saw freed.
                    shrank = prev;
                }
                state.inherited.remove(&addr);
                grew = size;
            }
            Kind::Free => {
                if let Some(size) = state.blocks.remove(&addr) {
                    heap.frees += 1;
                    heap.freed_bytes += size;
                    shrank = size;
                } else if state.inherited.remove(&addr).is_some() {
                    heap.frees += 1;
                } else {
                    // Not a block we saw allocated: e.g. glibc releasing a
                    // thread's tcache at thread exit through free().
                    heap.unmatched_frees += 1;
                }
            }
            Kind::Mmap if !in_allocator => {
                let end = page_end(addr, size);
                // MAP_FIXED may replace regions we hold.
                mapped_shrank = state.unmap(addr, end);
                state.regions.insert(addr, end);
                maps.mmaps += 1;
                maps.mapped_bytes += end - addr;
                mapped_grew = end - addr;
            }
            Kind::Munmap if !in_allocator => {
                let removed = state.unmap(addr, page_end(addr, size));
                if removed > 0 {
                    maps.munmaps += 1;
                    maps.unmapped_bytes += removed;
                    mapped_shrank = removed;
                }
            }
            Kind::Mremap if !in_allocator => {
                let removed = state.unmap(old_addr, page_end(old_addr, old_size));
                if removed > 0 {
                    let end = page_end(addr, size);
                    mapped_shrank = removed + state.unmap(addr, end);
                    state.regions.insert(addr, end);
                    maps.unmapped_bytes += removed;
                    maps.mapped_bytes += end - addr;
                    mapped_grew = end - addr;
                }
            }
            Kind::Brk => {
                // brk returns the current break, whatever was asked.
                let start = *state.brk_start.get_or_insert(addr);
                state.brk_now = addr;
                maps.brk_peak_bytes = maps.brk_peak_bytes.max(addr.saturating_sub(start));
            }
            _ => {}
        }
        state.live_bytes = state.live_bytes + grew - shrank;
        if state.live_bytes > heap.peak_live_bytes {
            heap.peak_live_bytes = state.live_bytes;
            heap.peak_live_at_ns = ts;
        }
        state.mapped_bytes = state.mapped_bytes + mapped_grew - mapped_shrank;
        maps.peak_mapped_bytes = maps.peak_mapped_bytes.max(state.mapped_bytes);
        self.live_bytes = self.live_bytes + grew - shrank;
        if self.live_bytes > self.peak_live_bytes {
            self.peak_live_bytes = self.live_bytes;
            self.peak_live_at_ns = ts;
        }
        self.mapped_bytes = self.mapped_bytes + mapped_grew - mapped_shrank;
        self.peak_mapped_bytes = self.peak_mapped_bytes.max(self.mapped_bytes);
    }

    /// Ends processes that never reported an exit (the capture ended
    /// first): what they have live counts as live at exit.
    pub fn finish(&mut self, ts_ns: u64) {
        let ts = ts_ns;
        let open: Vec<u32> = self
            .processes()
            .filter(|p| p.state.is_some())
            .map(|p| p.pid)
            .collect();
        for pid in open {
            self.close(pid, ts);
        }
    }
}
