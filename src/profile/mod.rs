//! The profile document (`--output`), versioned; schema in docs/profile.md.

pub mod compact;
pub mod regions;
pub mod timeline;
pub mod unwind;

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A field that may be `null` but must be there: serde would otherwise
/// take a missing `Option` field for `None`, and `memtrail report` promises
/// that a missing field is an invalid profile.
fn required<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}

/// Bumped on any incompatible change of the document. 2: stack ids are
/// strings; stacks carry `pid` and `exe`, frames `build_id` and `offset`,
/// stacks `live_allocations_at_peak`. 3: `stacks` is compact (issue 24):
/// string, module, function and frame tables, each stack a list of frame
/// ids ([`compact`]).
pub const PROFILE_VERSION: u32 = 3;

/// The oldest version memtrail still reads: a version 2 document's stacks
/// (each with its frames written out) read into the same [`Profile`].
pub const OLDEST_PROFILE_VERSION: u32 = 2;

/// A profile is written as this version, whatever it was read from (its
/// `stacks` are written compact).
fn current_version<S: serde::Serializer>(_: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u32(PROFILE_VERSION)
}

/// A 64-bit id as a decimal string.
pub mod id_string {
    use serde::{Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    /// Reads the id in place (no copy of its string).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        struct Id;
        impl serde::de::Visitor<'_> for Id {
            type Value = u64;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: Error>(self, s: &str) -> Result<u64, E> {
                s.parse()
                    .map_err(|_| E::custom(format!("a stack id is a decimal string, not {s:?}")))
            }
        }
        d.deserialize_str(Id)
    }
}

/// The `format` field of every profile.
pub const PROFILE_FORMAT: &str = "memtrail-profile";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Profile {
    pub format: String,
    /// The version read (2 or 3); written as [`PROFILE_VERSION`].
    #[serde(serialize_with = "current_version")]
    pub version: u32,
    pub command: Vec<String>,
    pub exit: ExitInfo,
    /// `true` when the capture was `memtrail attach`: a window of a
    /// process already running, so the `live_*_at_exit` fields hold what
    /// was allocated inside the window and still live at detach, not
    /// leaks. Absent (false) in a profile written before memtrail kept it.
    #[serde(default)]
    pub attached: bool,
    pub duration_ns: u64,
    pub totals: HeapCounters,
    pub mappings: MapCounters,
    pub processes: Vec<ProcessEntry>,
    pub lost_events: LostEvents,
    /// Where the allocator probes were: `per-process` or `system-wide`
    /// (`--probes`); system-wide in a profile written before memtrail
    /// could do otherwise.
    #[serde(default)]
    pub probe_scope: crate::profile::Scope,
    /// How many events rings the capture read: 1 (shared by every CPU) or
    /// one per CPU (`--event-rings`); 1 in a profile written before.
    #[serde(default = "one")]
    pub event_rings: u32,
    pub probes: Vec<ProbeEntry>,
    /// Executable mappings whose file memtrail did not probe: not an ELF
    /// image (a JIT's code, a PE image under Wine, data mapped executable)
    /// or a malformed one. Empty (absent) in a profile written before.
    #[serde(default)]
    pub skipped_images: Vec<SkippedImage>,
    /// Allocation sites: one entry per distinct call stack, with what was
    /// allocated from it. Empty when stacks were not captured. Written
    /// compact (tables and frame ids, [`compact`]); read from that or from a
    /// version 2 list of stacks with their frames.
    #[serde(with = "compact")]
    pub stacks: Vec<StackEntry>,
    /// Backpressure episodes and ring fill.
    pub pressure: crate::profile::PressureStats,
    /// How stacks were walked, the unwind tables of the images, and why
    /// stacks ended before their outermost frame.
    #[serde(default)]
    pub unwind: UnwindReport,
    /// The heap over time (docs/profile.md, "Timeline"); empty in a
    /// profile written before memtrail kept it.
    #[serde(default)]
    pub timeline: timeline::Timeline,
    /// USDT region markers (`include/memtrail_usdt.h`), by name; empty
    /// when the programs have none.
    #[serde(default)]
    pub regions: Vec<regions::RegionEntry>,
    /// The tree's resident memory (docs/profile.md, "Resident memory");
    /// zeros in a profile written before memtrail recorded it.
    #[serde(default)]
    pub resident: Resident,
    /// What the capture could not trust or join (issue 40): records a
    /// tracked process's own ring held malformed, allocations naming
    /// stacks never recorded. Absent when there were none.
    #[serde(default, skip_serializing_if = "Anomalies::is_empty")]
    pub anomalies: Anomalies,
}

/// What a capture could not trust or join, counted instead of logged once
/// per record (issue 40: a million allocations naming stacks never written
/// made a million log lines).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomalies {
    /// Tracked processes whose own ring (the preload shim's) held records
    /// memtrail could not read: that process's counts are incomplete
    /// (its `incomplete` in `processes`); the rest of the capture is not.
    #[serde(default)]
    pub corrupt_rings: Vec<CorruptRing>,
    /// Allocations naming a stack that was never recorded: counted in the
    /// totals, in no stack.
    #[serde(default)]
    pub unrecorded_stacks: UnrecordedStacks,
}

impl Anomalies {
    pub fn is_empty(&self) -> bool {
        self.corrupt_rings.is_empty() && self.unrecorded_stacks.stacks == 0
    }
}

/// A tracked process's ring that held records memtrail could not read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorruptRing {
    /// The process the records were refused from.
    pub pid: u32,
    pub exe: String,
    /// Which of the preload shim's rings, when known.
    pub ring: Option<u32>,
    /// What was wrong with the first record refused.
    pub first: String,
    /// Records refused.
    pub records: u64,
}

/// Stack ids named by allocations but never recorded: one bucket, in no
/// stack, whatever the ids (issue 40: a million distinct ones must not cost
/// memtrail a million per-stack entries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnrecordedStacks {
    /// Distinct stack ids, as far as they were told apart: a process's
    /// ring file has at most `MAX_UNRECORDED_IDS` (`ring::merge`) of them
    /// told apart, the rest counted in `allocations` only (`more_stacks`).
    pub stacks: u64,
    /// The allocating calls that named them, and their bytes.
    pub allocations: u64,
    pub bytes: u64,
    /// More distinct ids were named than `stacks` counts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more_stacks: bool,
}

impl UnrecordedStacks {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Self) {
        self.stacks += other.stacks;
        self.allocations += other.allocations;
        self.bytes += other.bytes;
        self.more_stacks |= other.more_stacks;
    }
}

/// Resident memory (RSS: the kernel's file, anonymous and shared-memory
/// pages of a process) of a process or of the tree, from the kernel's
/// `rss_stat` tracepoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resident {
    /// The highest RSS. A process's is exact (as the kernel's per-CPU
    /// counters read); the tree's is the highest sum of its processes'
    /// recorded RSS (each within its recording step), and never below a
    /// process's own peak.
    pub peak_rss_bytes: u64,
    /// RSS (recorded) when the live heap peaked: the process's at its own
    /// heap peak, the tree's at the tree's.
    pub rss_at_heap_peak_bytes: u64,
    /// RSS records folded (a process's RSS is recorded when it moved by
    /// 1 MiB or 1/64 of itself, and as it exits).
    pub samples: u64,
}

/// The one frame of the site of a process's allocator arenas: the
/// reservations an allocator maps inside its own calls (glibc's per-thread
/// arenas, made by a thread's first malloc or free), whoever called it.
pub const ALLOCATOR_ARENA_FRAME: &str = "[allocator arena]";

/// How stacks were walked (`--unwind`) and how far they got.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UnwindReport {
    pub mode: crate::profile::unwind::Mode,
    /// Images examined for unwind tables, in order (empty with `fp`).
    pub images: Vec<crate::profile::unwind::ImageTable>,
    /// The tables' memory (zero with `fp`).
    #[serde(default)]
    pub tables: crate::profile::unwind::TableMemory,
    /// Distinct stacks (and the bytes allocated from them) that ended
    /// before their outermost frame, by reason.
    pub ended_early: Vec<EndedEarly>,
    /// Every distinct stack that allocated, and its bytes.
    pub stacks: u64,
    pub bytes: u64,
}

/// Stacks that ended early for one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndedEarly {
    pub reason: crate::profile::unwind::StackEnd,
    pub stacks: u64,
    pub bytes: u64,
}

/// One distinct allocation call stack and its metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackEntry {
    /// The stack's id in the event stream (`stack_id`): 64 bits, written
    /// as a decimal string so that JSON readers with 53-bit numbers (jq,
    /// JavaScript) keep it whole.
    #[serde(with = "id_string")]
    pub id: u64,
    /// The process the stack was walked in.
    pub pid: u32,
    /// The executable that process ran when the stack was made: its `exe`
    /// in `processes`, unless the stack is from before an exec. Shared
    /// by the stacks of a process (one allocation, not one a stack).
    pub exe: Arc<str>,
    /// Innermost first: `frames[0]` is the function that called the
    /// allocator. An address with inlined functions gives several frames,
    /// the inlined ones (`inlined: true`) before the function they were
    /// inlined into. A frame is shared by every stack that has it (a
    /// g++ capture's 32,000 stacks have 1.1 M frames of 9,200 addresses).
    pub frames: Vec<Arc<Frame>>,
    /// Why the walk stopped after these frames; absent when it reached the
    /// outermost frame (`complete`).
    #[serde(
        default,
        skip_serializing_if = "crate::profile::unwind::StackEnd::is_complete"
    )]
    pub end: crate::profile::unwind::StackEnd,
    #[serde(flatten)]
    pub metrics: StackMetrics,
}

impl StackEntry {
    /// Marks complete a walk that stopped in the dynamic loader's entry
    /// code (`_dl_start_user`, from which ld.so runs the libraries'
    /// constructors, then jumps to the program's entry): that code has no
    /// unwind table, and nothing calls it (clang-19's libraries'
    /// constructors: 37 % of its stacks were said to end short of the
    /// program's entry).
    pub fn end_at_loader_entry(&mut self) {
        let at_loader_entry = self.frames.last().is_some_and(|f| {
            !f.inlined
                && f.function.as_deref() == Some("_dl_start_user")
                && f.module.as_deref().is_some_and(|m| {
                    std::path::Path::new(m)
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("ld-"))
                })
        });
        if at_loader_entry && self.end == crate::profile::unwind::StackEnd::NoTable {
            self.end = crate::profile::unwind::StackEnd::Complete;
        }
    }
}

/// One symbolized frame. Its strings are shared (`Arc<str>`): a profile
/// read holds each module, build id, function and file name once, however
/// many frames name it (issue 24: a gcc run's 220,000 frames name 1,500
/// functions).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    /// The instruction address in the process.
    pub addr: u64,
    /// The file the address belongs to.
    #[serde(deserialize_with = "required")]
    pub module: Option<Arc<str>>,
    /// Demangled function name.
    #[serde(deserialize_with = "required")]
    pub function: Option<Arc<str>>,
    #[serde(deserialize_with = "required")]
    pub file: Option<Arc<str>>,
    #[serde(deserialize_with = "required")]
    pub line: Option<u32>,
    pub inlined: bool,
    /// The GNU build id of `module`, in hex, when it has one.
    #[serde(deserialize_with = "required")]
    pub build_id: Option<Arc<str>>,
    /// The offset in `module` of `addr - 1`, the byte symbolized (the call
    /// instruction), when the address is in a known file.
    #[serde(deserialize_with = "required")]
    pub offset: Option<u64>,
    /// Its image's unwind table has no row for its address, and the walk
    /// found its caller by frame pointer (`--unwind auto`; V8's embedded
    /// builtins, issue 41): the frames above it may skip one that kept no
    /// frame pointer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fp_step: bool,
}

/// The one frame of the site of a process's anonymous mappings and break
/// growth made by direct syscalls, not through a libc wrapper memtrail
/// probes (the dynamic loader's own mmap calls, static binaries, Go).
pub const DIRECT_SYSCALL_FRAME: &str = "[no stack: direct syscall]";

/// The module of a Python function's frame (issue 25): its function is the
/// code object's qualified name, its file and line the source's.
pub const PYTHON_MODULE: &str = "[python]";

impl Frame {
    /// The frame of the direct-syscall site ([`DIRECT_SYSCALL_FRAME`]).
    pub fn direct_syscall() -> Self {
        Self {
            function: Some(DIRECT_SYSCALL_FRAME.into()),
            ..Self::unknown(0)
        }
    }

    /// The frame of the allocator-arena site ([`ALLOCATOR_ARENA_FRAME`]).
    pub fn allocator_arena() -> Self {
        Self {
            function: Some(ALLOCATOR_ARENA_FRAME.into()),
            ..Self::unknown(0)
        }
    }

    /// A frame of `addr` in no known file.
    pub fn unknown(addr: u64) -> Self {
        Self {
            addr,
            module: None,
            function: None,
            file: None,
            line: None,
            inlined: false,
            build_id: None,
            offset: None,
            fp_step: false,
        }
    }
}

/// What a stack allocated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackMetrics {
    /// Successful allocating calls (realloc included).
    pub allocations: u64,
    /// Bytes those calls asked for.
    pub bytes: u64,
    /// Bytes from this stack live when the tree's live heap peaked.
    pub live_bytes_at_peak: u64,
    /// Blocks from this stack live when the tree's live heap peaked.
    pub live_allocations_at_peak: u64,
    /// Bytes from this stack still live when their process exited.
    pub live_bytes_at_exit: u64,
    pub live_allocations_at_exit: u64,
    /// Blocks from this stack freed by their thread before it allocated or
    /// freed anything else.
    #[serde(default)]
    pub temporary_allocations: u64,
    /// Anonymous mmap calls made from this stack outside allocator calls
    /// (docs/profile.md, "Mappings by site").
    #[serde(default)]
    pub mmaps: u64,
    /// Bytes (whole pages) those calls committed (mapped with access
    /// rights, or given them later by mprotect), mremap's new lengths
    /// included, as the process's `mappings.mapped_bytes` counts them.
    #[serde(default)]
    pub mapped_bytes: u64,
    /// Bytes those calls mapped reserved: `PROT_NONE`, address space
    /// without access rights (docs/profile.md, "Reserved and committed").
    #[serde(default)]
    pub reserved_bytes: u64,
    /// Of them, bytes still reserved when their process exited.
    #[serde(default)]
    pub reserved_bytes_at_exit: u64,
    /// Of them, bytes still mapped when the tree's anonymous mappings
    /// peaked (`mappings.peak_mapped_bytes`).
    #[serde(default)]
    pub mapped_bytes_at_peak: u64,
    /// Bytes still mapped when their process exited.
    #[serde(default)]
    pub mapped_bytes_at_exit: u64,
    /// Program break growth made through `sbrk` from this stack outside
    /// allocator calls (the sum of the increases).
    #[serde(default)]
    pub brk_bytes: u64,
}

impl StackMetrics {
    /// Whether the stack allocated, mapped or moved the break.
    pub fn is_empty(&self) -> bool {
        self.allocations == 0 && self.mmaps == 0 && self.brk_bytes == 0
    }
}

/// How the command ended: an exit code, or the signal that killed it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ExitInfo {
    #[serde(deserialize_with = "required")]
    pub code: Option<i32>,
    #[serde(deserialize_with = "required")]
    pub signal: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessEntry {
    pub pid: u32,
    pub ppid: u32,
    pub exe: String,
    /// Exit code (or 128 + signal), when the process was seen to exit.
    #[serde(deserialize_with = "required")]
    pub exit_code: Option<i32>,
    pub start_ns: u64,
    #[serde(deserialize_with = "required")]
    pub end_ns: Option<u64>,
    #[serde(flatten)]
    pub heap: HeapCounters,
    pub mappings: MapCounters,
    /// Its resident memory; zeros in a profile written before.
    #[serde(default)]
    pub resident: Resident,
    /// Whether it loaded memtrail's preload shim (`run --preload`): its
    /// allocator calls came through the shim, not through probes. Absent
    /// (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preloaded: bool,
    /// Whether its counts are incomplete: its own ring held records
    /// memtrail could not read (`anomalies.corrupt_rings`). Absent (false)
    /// otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub incomplete: bool,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct LostEvents {
    /// Records the events ring could not take.
    pub events: u64,
    /// Processes or calls that could not be tracked (a BPF map was full).
    pub tracking: u64,
    /// Records the stack ring could not take.
    pub stacks: u64,
    /// Records the mappings ring could not take.
    pub mappings: u64,
    /// Attach requests the attach ring could not take.
    pub attach: u64,
    /// Processes another process resumed (SIGCONT) while memtrail held them
    /// at fork for their per-process probes: they ran unprobed a moment.
    #[serde(default)]
    pub resumed: u64,
}

impl LostEvents {
    pub fn any(&self) -> bool {
        self.events != 0
            || self.tracking != 0
            || self.stacks != 0
            || self.mappings != 0
            || self.attach != 0
            || self.resumed != 0
    }

    /// What may avoid the loss next time, for the error message, when the
    /// tree was not paused (see `capture::loss_advice` otherwise).
    pub fn advice(&self) -> String {
        let larger: Vec<&str> = [
            (self.events, "--ring-size"),
            (self.stacks, "--stack-ring-size"),
        ]
        .into_iter()
        .filter(|&(lost, _)| lost != 0)
        .map(|(_, option)| option)
        .collect();
        let pause = "--pressure-timeout inf, which pauses the tree instead of losing records";
        if self.resumed != 0 {
            "a process of the tree resumed another (SIGCONT) that memtrail held at fork for its \
             per-process probes, as a job-control shell does with a child it sees stopped: \
             retry with --probes system-wide"
                .to_owned()
        } else if !larger.is_empty() {
            format!(
                "retry with a larger {}, or with {pause}",
                larger.join(" and ")
            )
        } else if self.events + self.stacks + self.mappings + self.attach != 0 {
            format!("retry with {pause}")
        } else {
            "the tree had more processes or threads at once than memtrail's BPF maps hold"
                .to_owned()
        }
    }
}

/// An executable image a tracked process mapped that memtrail left alone,
/// and why (see `attach::AttachError::skip_reason`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedImage {
    pub image: String,
    /// The first process that mapped it.
    pub pid: u32,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeEntry {
    pub image: String,
    pub symbol: String,
    pub offset: u64,
    pub emulated: bool,
    /// Times the probe fired in the tracked tree, nested calls included
    /// (an allocator calling another probed entry point), counted in BPF.
    /// None for a site past the last counter (`attach::MAX_COUNTED_SITES`)
    /// and in profiles written before memtrail counted hits.
    #[serde(default)]
    pub hits: Option<u64>,
}

/// Turns a kernel wait status into the shell's exit code.
pub fn wait_status_code(status: i32) -> i32 {
    let sig = status & 0x7f;
    if sig == 0 {
        (status >> 8) & 0xff
    } else {
        128 + sig
    }
}

fn one() -> u32 {
    1
}

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
    /// Blocks freed by their thread before it allocated or freed anything
    /// else (see docs/profile.md, "Temporary allocations").
    #[serde(default)]
    pub temporary_allocations: u64,
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
    /// Program break growth made outside allocator calls: the sum of the
    /// increases (what the stacks' `brk_bytes` add up to).
    #[serde(default)]
    pub brk_grown_bytes: u64,
    /// mprotect calls that changed the access of anonymous mappings made
    /// outside allocator calls (docs/profile.md, "Reserved and committed").
    #[serde(default)]
    pub mprotects: u64,
    /// Bytes those mappings reserved: mapped `PROT_NONE`, or made so by
    /// mprotect. The `mapped_bytes` family counts committed bytes only.
    #[serde(default)]
    pub reserved_bytes: u64,
    /// The most bytes reserved at once.
    #[serde(default)]
    pub peak_reserved_bytes: u64,
    #[serde(default)]
    pub reserved_bytes_at_exit: u64,
    /// Allocator arenas: reservations an allocator mapped inside its own
    /// calls (a free's included), their address space at its highest, and
    /// what was left at exit, in all and committed (made accessible by the
    /// allocator's mprotect: where its blocks live, which the heap
    /// counters count).
    #[serde(default)]
    pub arena_mmaps: u64,
    #[serde(default)]
    pub peak_arena_bytes: u64,
    #[serde(default)]
    pub arena_bytes_at_exit: u64,
    #[serde(default)]
    pub arena_committed_bytes_at_exit: u64,
}

/// The `tracing` target of notes about a capture: what the capture's
/// profile or summary records too, or what concerns the tracked program
/// alone (an image without unwind tables, probe sites past the counted
/// ones, USDT markers memtrail skips). `-q` silences them (main); warnings
/// about memtrail's own environment (a process it could not resume, a
/// cgroup it could not thaw, BPF maps it could not set up) and errors stay.
pub const NOTE: &str = "memtrail::note";

/// The reason of a [`SkippedImage`] that is a statically linked program
/// in which memtrail found no allocator, by name or by its code (see
/// `attach::static_image`): its heap is not counted, only its brk and
/// mmap calls.
pub const STATIC_HEAP_UNCOUNTED: &str = "statically linked, and no allocator memtrail knows was \
    found in it (by name or by matching the system's libc.a): its heap is not counted";

/// A probe site the kernel single-steps (~14 µs a hit), that the command
/// went through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowProbe {
    pub symbol: String,
    pub image: PathBuf,
    /// Times its probe fired in the tracked tree (the profile's `hits`).
    pub hits: u64,
}

/// The single-stepping probes of a profile that were hit, most hits first.
pub fn slow_probes(probes: &[ProbeEntry]) -> Vec<SlowProbe> {
    let mut slow: Vec<SlowProbe> = probes
        .iter()
        .filter(|p| !p.emulated)
        .filter_map(|p| {
            Some(SlowProbe {
                symbol: p.symbol.clone(),
                image: PathBuf::from(&p.image),
                hits: p.hits.filter(|&h| h > 0)?,
            })
        })
        .collect();
    slow.sort_by(|a, b| b.hits.cmp(&a.hits).then(a.symbol.cmp(&b.symbol)));
    slow
}

/// Formats a byte count with a binary unit.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// What became of the command, or of the process memtrail attached to,
/// and when: `exited with code 0 after 1.20 s`, `was killed by signal 9
/// after …`; for an attach window, `still running: detached after 3.00 s`
/// (it had not exited when memtrail detached) or `exited with code 0 after
/// 1.20 s attached`.
pub fn ending(p: &Profile) -> String {
    let after = human_ns(p.duration_ns);
    let attached = if p.attached { " attached" } else { "" };
    match (p.exit.code, p.exit.signal) {
        (_, Some(sig)) => format!("was killed by signal {sig} after {after}{attached}"),
        (Some(code), None) => format!("exited with code {code} after {after}{attached}"),
        (None, None) if p.attached => format!("still running: detached after {after}"),
        (None, None) => format!("ended after {after}"),
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

/// Where a capture's allocator probes were (the profile's `probe_scope`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    PerProcess,
    #[default]
    SystemWide,
}

pub fn human_ns(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}
