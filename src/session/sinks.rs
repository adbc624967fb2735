//! The sinks of the three pipelines: events (aggregation and the stream),
//! stacks (the distinct call stacks) and mappings (executable mappings,
//! with their files resolved while the process still exists).

use std::collections::HashMap;
use std::path::PathBuf;

use crate::aggregate::Aggregator;
use crate::attach::strip_deleted;
use crate::bpf::record::Body;
use crate::bpf::record::{self, MappingRecord};
use crate::engine::Sink;
use crate::events::writer::EventWriter;
use crate::session::markers::Markers;
use crate::session::regions::Regions;
use crate::symbolize::Mapping;

/// Aggregation and the optional event stream.
pub struct EventSink {
    pub agg: Aggregator,
    pub stream: Option<EventWriter>,
    pub stream_error: Option<std::io::Error>,
    /// The latest clock reading in ring order.
    clock: u64,
    /// Snapshots and regions of a library session.
    pub(crate) regions: Option<Regions>,
    /// USDT region markers of the tracked programs.
    pub(crate) markers: Markers,
    /// Counters for the live status line, with the records folded.
    pub(crate) live: Option<(std::sync::Arc<crate::engine::live::LiveCounters>, u64)>,
    /// Stacks the preload shim walked itself and wrote to its rings, read
    /// with the events (issue 22); joined to the stack pipeline's at the
    /// end.
    pub shim_stacks: StackSink,
    /// The preload shim's ring path: the processes' ring files are taken
    /// as their MT_SHIM_RINGS records come (issue 40).
    pub shim: Option<crate::ring::shim::Offer>,
}

impl EventSink {
    pub fn new(agg: Aggregator, stream: Option<EventWriter>) -> Self {
        Self {
            agg,
            stream,
            stream_error: None,
            clock: 0,
            regions: None,
            markers: Markers::default(),
            live: None,
            shim_stacks: StackSink::default(),
            shim: None,
        }
    }
}

impl Sink for EventSink {
    fn record(&mut self, bytes: &[u8]) {
        if let Some((pid, fd)) = record::decode_shim_rings(bytes) {
            self.take_rings(pid, fd);
            return;
        }
        // Kinds only the preload shim writes come from a tracked process's
        // ring (the merge took each as that process's): one that cannot be
        // read is its corruption; any other, memtrail's.
        if let Some(stack) = record::decode_shim_stack(bytes) {
            match stack {
                Ok(rec) => self.shim_stacks.insert(&rec),
                Err(err) => self.refuse(bytes, &err),
            }
            return;
        }
        // What names the Python frames of the shim's next stacks.
        if let Some(code) = record::decode_shim_py_code(bytes) {
            match code {
                Ok(code) => self.shim_stacks.learn(&code),
                Err(err) => self.refuse(bytes, &err),
            }
            return;
        }
        // The preload shim's batched frees: each a free of its own.
        if let Some(batch) = record::decode_free_batch(bytes) {
            match batch {
                Ok((hdr, addrs)) => self.fold_frees(hdr, addrs),
                Err(err) => self.refuse(bytes, &err),
            }
            return;
        }
        match record::decode(bytes) {
            Ok(rec) => self.fold(rec),
            Err(_) => self.agg.malformed += 1,
        }
    }

    fn drained(&mut self, epoch: u64) {
        if let Some(regions) = &mut self.regions {
            regions.drained(epoch, &self.agg);
        }
    }
}

impl EventSink {
    /// Takes the ring file process `pid` named (its descriptor `fd`); a
    /// process whose file is not taken keeps the hook path.
    fn take_rings(&mut self, pid: u32, fd: u64) {
        let Some(offer) = &self.shim else {
            return;
        };
        match offer.adopt(pid, fd) {
            Ok(()) => tracing::debug!(pid, "preload rings taken"),
            Err(err) => tracing::debug!(pid, %err, "preload rings not taken"),
        }
    }

    /// A record of a kind only the preload shim writes that cannot be read:
    /// the corruption of the process whose ring it came from (named once,
    /// its counts marked incomplete, the capture goes on: issue 40).
    fn refuse(&mut self, bytes: &[u8], err: &record::DecodeError) {
        let pid = record::header_pid(bytes).unwrap_or(0);
        self.agg.refuse_record(pid, None, &err.to_string());
    }

    /// Folds a batch of the preload shim's frees, each a free of its own.
    fn fold_frees(&mut self, hdr: record::Header, addrs: impl Iterator<Item = u64>) {
        for addr in addrs {
            self.fold(record::Record {
                hdr,
                body: Body::Mem(record::Mem {
                    addr,
                    size: 0,
                    old_addr: 0,
                    old_size: 0,
                    stack_id: 0,
                }),
            });
        }
    }

    /// Folds one event into the aggregation, the regions, the live
    /// counters and the stream.
    fn fold(&mut self, mut rec: record::Record<'_>) {
        // Allocator events of a busy thread skip the clock (ts 0, see
        // event_clock in bpf/task.c): they take the latest reading
        // before them in the ring, whose order is the order the events
        // were made in. Readings taken on different CPUs can be a little
        // out of ring order; taking the maximum keeps a skipped event's
        // stamp no earlier than any event before it.
        if rec.hdr.ts_ns == 0 {
            rec.hdr.ts_ns = self.clock;
        } else {
            self.clock = self.clock.max(rec.hdr.ts_ns);
        }
        let session = self.regions.as_ref().is_some_and(Regions::active);
        match &rec.body {
            Body::Mem(mem) if session || self.markers.active() => {
                let before = self.agg.heap_of(rec.hdr.pid).unwrap_or_default();
                self.agg.apply(&rec);
                let after = self.agg.heap_of(rec.hdr.pid).unwrap_or_default();
                if let Some(regions) = self.regions.as_mut().filter(|_| session) {
                    regions.observe(&rec.hdr, mem, before, after);
                }
                if self.markers.active() {
                    self.markers.observe(&rec.hdr, mem, before, after);
                }
            }
            Body::Region { name } => self.markers.marker(&rec.hdr, name),
            _ => self.agg.apply(&rec),
        }
        if let Some((live, folded)) = &mut self.live {
            *folded += 1;
            let (processes, bytes, peak) = self.agg.live_view();
            live.publish(*folded, processes, bytes, peak);
        }
        // After a failed write the stream is kept (its path names the
        // error) but written no more.
        if let Some(stream) = self.stream.as_mut().filter(|_| self.stream_error.is_none()) {
            if let Err(err) = stream.write(&rec) {
                self.stream_error = Some(err);
            }
        }
    }
}

/// A distinct call stack: the process it belongs to and its return
/// addresses, innermost first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    pub pid: u32,
    pub ips: Vec<u64>,
    /// Bit n: `ips[n]`'s caller was found by frame pointer, its image's
    /// unwind table having no row for it ([`record::FP_STEP_FRAME`]).
    pub fp_steps: u128,
    /// Why the walk stopped after these frames.
    pub end: crate::profile::unwind::StackEnd,
    /// The Python frames of each run of the interpreter loop among the
    /// native frames, innermost first (issue 25), named when the stack
    /// arrived: the process may be gone by the end.
    pub python: Vec<Vec<std::sync::Arc<crate::profile::Frame>>>,
}

/// Whether `ip` can be an x86_64 user-space code address: above the
/// unmappable first page and below the canonical user-space limit.
fn is_user_code(ip: u64) -> bool {
    (0x1000..0x0000_8000_0000_0000).contains(&ip)
}

/// Distinct stacks by id.
#[derive(Default)]
pub struct StackSink {
    pub stacks: HashMap<u64, Stack>,
    pub malformed: u64,
    python: crate::python::Resolver,
}

impl Sink for StackSink {
    fn record(&mut self, bytes: &[u8]) {
        match record::decode_py_code(bytes) {
            Some(Ok(code)) => return self.python.learn(&code),
            Some(Err(_)) => {
                self.malformed += 1;
                return;
            }
            None => {}
        }
        match record::decode_stack(bytes) {
            Ok(rec) => self.insert(&rec),
            Err(_) => self.malformed += 1,
        }
    }
}

impl StackSink {
    /// Takes a Python code object's record, for the stacks that follow.
    pub fn learn(&mut self, code: &crate::bpf::skel::memtrail::types::mt_py_code_record) {
        self.python.learn(code);
    }

    /// Keeps a stack the first time its id comes.
    pub fn insert(&mut self, rec: &record::StackRecord<'_>) {
        // A stack written twice (the known-stacks map was full, or two of
        // the shim's rings carried it) is the same stack.
        if self.stacks.contains_key(&rec.id) {
            return;
        }
        let words: Vec<u64> = rec.ips().collect();
        let (native, groups) = crate::python::split(&words);
        let python = groups
            .iter()
            .map(|group| self.python.frames(rec.pid, group))
            .collect();
        // A frame-pointer walk through code built without frame pointers
        // reads arbitrary stack words: stop at the first that cannot be a
        // user code address.
        let ips: Vec<u64> = native
            .iter()
            .map(|&ip| ip & !record::FP_STEP_FRAME)
            .take_while(|&ip| is_user_code(ip))
            .collect();
        let fp_steps = native
            .iter()
            .take(ips.len().min(128))
            .enumerate()
            .filter(|(_, ip)| *ip & record::FP_STEP_FRAME != 0)
            .fold(0u128, |bits, (n, _)| bits | 1 << n);
        self.stacks.insert(
            rec.id,
            Stack {
                pid: rec.pid,
                ips,
                fp_steps,
                end: record::stack_end(rec.end),
                python,
            },
        );
    }
}

/// Executable mappings of every tracked process.
#[derive(Default)]
pub struct MappingSink {
    pub mappings: HashMap<u32, Vec<Mapping>>,
    /// Files already resolved, by (device, inode): for processes that are
    /// gone before their mapping can be looked up.
    by_inode: HashMap<(u64, u64), PathBuf>,
    pub malformed: u64,
}

impl MappingSink {
    fn add(&mut self, pid: u32, mapping: Mapping) {
        let list = self.mappings.entry(pid).or_default();
        let same = |m: &Mapping| {
            (m.start, m.end, m.pgoff, &m.path)
                == (mapping.start, mapping.end, mapping.pgoff, &mapping.path)
        };
        if !list.iter().any(same) {
            list.push(mapping);
        }
    }

    /// Adds the executable file mappings /proc lists for `pid` (the
    /// vDSO's is only found there; the dynamic loader's also comes from
    /// BPF at exec, for a process gone before /proc could be read).
    pub(crate) fn scan_proc(&mut self, pid: u32) {
        let Ok(maps) = crate::sys::read_maps(std::path::Path::new(&format!("/proc/{pid}/maps")))
        else {
            return;
        };
        for line in maps.lines() {
            let mut fields = line.split_whitespace();
            let (Some(range), Some(perms), Some(offset)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let path = fields.nth(2).unwrap_or_default();
            if !perms.contains('x') || !path.starts_with('/') {
                continue;
            }
            let Some((start, end)) = range.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end), Ok(pgoff)) = (
                u64::from_str_radix(start, 16),
                u64::from_str_radix(end, 16),
                u64::from_str_radix(offset, 16),
            ) else {
                continue;
            };
            self.add(
                pid,
                Mapping {
                    start,
                    end,
                    pgoff,
                    path: PathBuf::from(path),
                    file_id: None,
                },
            );
        }
    }

    fn resolve(&mut self, m: &MappingRecord) -> PathBuf {
        let link = format!("/proc/{}/map_files/{:x}-{:x}", m.pid, m.start, m.end);
        if let Ok(path) = std::fs::read_link(&link) {
            let path = strip_deleted(path);
            self.by_inode.insert((m.dev, m.ino), path.clone());
            return path;
        }
        self.by_inode
            .get(&(m.dev, m.ino))
            .cloned()
            .unwrap_or_else(|| PathBuf::from(&m.name))
    }
}

impl Sink for MappingSink {
    fn record(&mut self, bytes: &[u8]) {
        let Ok(m) = record::decode_mapping(bytes) else {
            self.malformed += 1;
            return;
        };
        let path = self.resolve(&m);
        self.add(
            m.pid,
            Mapping {
                start: m.start,
                end: m.end,
                pgoff: m.pgoff,
                path,
                file_id: Some(crate::sys::FileId {
                    dev: m.dev,
                    ino: m.ino,
                }),
            },
        );
        self.scan_proc(m.pid);
    }
}
