//! The profile document (`--output`), versioned; schema in docs/profile.md.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::output::{OutputError, OutputFile};
use super::{Aggregator, HeapCounters, MapCounters};
use crate::attach::Site;

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
/// stacks `live_allocations_at_peak`.
pub const PROFILE_VERSION: u32 = 2;

/// A 64-bit id as a decimal string.
pub mod id_string {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse()
            .map_err(|_| D::Error::custom(format!("a stack id is a decimal string, not {s:?}")))
    }
}

/// The `format` field of every profile.
pub const PROFILE_FORMAT: &str = "memtrail-profile";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Profile {
    pub format: String,
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
    pub probe_scope: crate::attach::per_process::Scope,
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
    /// allocated from it. Empty when stacks were not captured.
    pub stacks: Vec<StackEntry>,
    /// Backpressure episodes and ring fill.
    pub pressure: crate::pressure::PressureStats,
    /// How stacks were walked, the unwind tables of the images, and why
    /// stacks ended before their outermost frame.
    #[serde(default)]
    pub unwind: UnwindReport,
    /// The heap over time (docs/profile.md, "Timeline"); empty in a
    /// profile written before memtrail kept it.
    #[serde(default)]
    pub timeline: super::Timeline,
    /// USDT region markers (`include/memtrail_usdt.h`), by name; empty
    /// when the programs have none.
    #[serde(default)]
    pub regions: Vec<super::RegionEntry>,
}

/// How stacks were walked (`--unwind`) and how far they got.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UnwindReport {
    pub mode: crate::unwind::Mode,
    /// Images examined for unwind tables, in order (empty with `fp`).
    pub images: Vec<crate::unwind::ImageTable>,
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
    pub reason: crate::unwind::StackEnd,
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
    /// in `processes`, unless the stack is from before an exec.
    pub exe: String,
    /// Innermost first: `frames[0]` is the function that called the
    /// allocator. An address with inlined functions gives several frames,
    /// the inlined ones (`inlined: true`) before the function they were
    /// inlined into.
    pub frames: Vec<Frame>,
    /// Why the walk stopped after these frames; absent when it reached the
    /// outermost frame (`complete`).
    #[serde(default, skip_serializing_if = "crate::unwind::StackEnd::is_complete")]
    pub end: crate::unwind::StackEnd,
    #[serde(flatten)]
    pub metrics: StackMetrics,
}

/// One symbolized frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// The instruction address in the process.
    pub addr: u64,
    /// The file the address belongs to.
    #[serde(deserialize_with = "required")]
    pub module: Option<String>,
    /// Demangled function name.
    #[serde(deserialize_with = "required")]
    pub function: Option<String>,
    #[serde(deserialize_with = "required")]
    pub file: Option<String>,
    #[serde(deserialize_with = "required")]
    pub line: Option<u32>,
    pub inlined: bool,
    /// The GNU build id of `module`, in hex, when it has one.
    #[serde(deserialize_with = "required")]
    pub build_id: Option<String>,
    /// The offset in `module` of `addr - 1`, the byte symbolized (the call
    /// instruction), when the address is in a known file.
    #[serde(deserialize_with = "required")]
    pub offset: Option<u64>,
}

/// The one frame of the site of a process's anonymous mappings and break
/// growth made by direct syscalls, not through a libc wrapper memtrail
/// probes (the dynamic loader's own mmap calls, static binaries, Go).
pub const DIRECT_SYSCALL_FRAME: &str = "[no stack: direct syscall]";

impl Frame {
    /// The frame of the direct-syscall site ([`DIRECT_SYSCALL_FRAME`]).
    pub fn direct_syscall() -> Self {
        Self {
            function: Some(DIRECT_SYSCALL_FRAME.to_owned()),
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
    /// Bytes (whole pages) those calls mapped, mremap's new lengths
    /// included, as the process's `mappings.mapped_bytes` counts them.
    #[serde(default)]
    pub mapped_bytes: u64,
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

impl From<&Site> for ProbeEntry {
    fn from(site: &Site) -> Self {
        Self {
            image: site.image.display().to_string(),
            symbol: site.symbol.clone(),
            offset: site.offset,
            emulated: site.emulated,
            hits: None,
        }
    }
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

impl Profile {
    /// Builds the document; times become relative to `start_ns`, when
    /// the command was started.
    pub fn build(
        agg: &Aggregator,
        command: Vec<String>,
        exit: ExitInfo,
        (start_ns, end_ns): (u64, u64),
        lost_events: LostEvents,
        sites: &[Site],
    ) -> Self {
        let rel = |ts: u64| ts.saturating_sub(start_ns);
        let mut totals = agg.totals();
        totals.peak_live_at_ns = rel(totals.peak_live_at_ns);
        Self {
            format: PROFILE_FORMAT.to_owned(),
            version: PROFILE_VERSION,
            command,
            exit,
            attached: false,
            duration_ns: rel(end_ns),
            totals,
            mappings: agg.mapping_totals(),
            processes: agg
                .processes()
                .map(|p| ProcessEntry {
                    pid: p.pid,
                    ppid: p.ppid,
                    exe: p.exe.clone(),
                    exit_code: p.exit_status.map(wait_status_code),
                    start_ns: rel(p.start_ns),
                    end_ns: p.end_ns.map(rel),
                    heap: HeapCounters {
                        peak_live_at_ns: rel(p.heap.peak_live_at_ns),
                        ..p.heap
                    },
                    mappings: p.maps,
                })
                .collect(),
            lost_events,
            probe_scope: Default::default(),
            event_rings: 1,
            probes: sites.iter().map(ProbeEntry::from).collect(),
            skipped_images: Vec::new(),
            stacks: Vec::new(),
            pressure: Default::default(),
            unwind: Default::default(),
            timeline: agg.timeline(start_ns).unwrap_or_default(),
            regions: Vec::new(),
        }
    }
}

/// Writes the profile and renames it into place.
pub fn write_profile(profile: &Profile, out: OutputFile) -> Result<(), OutputError> {
    stage_profile(profile, &out)?;
    out.commit()
}

/// Writes `profile` into `out` without putting it in place (see
/// [`super::Outputs`]).
pub fn stage_profile(profile: &Profile, out: &OutputFile) -> Result<(), OutputError> {
    let err = |source| OutputError {
        path: out.path().to_owned(),
        source,
    };
    // Compact: a python3.11 capture's profile took 4.6 MB and ~40 ms
    // indented, about half as compact (`jq .` indents it for reading).
    let mut w = std::io::BufWriter::with_capacity(1 << 20, out.file());
    serde_json::to_writer(&mut w, profile).map_err(|e| err(e.into()))?;
    w.write_all(b"\n").map_err(err)?;
    w.flush().map_err(err)
}

fn one() -> u32 {
    1
}
