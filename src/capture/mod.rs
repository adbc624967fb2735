//! `memtrail run`'s capture: a [`Session`] on the command, with the CLI's
//! process effects, and its outputs; plus what sessions share: the capture
//! error type and its [`ErrorKind`], fault injection, the pipelines' sinks,
//! and building the profile.
//!
//! Ownership: the session owns the BPF skeleton, the probe links and every
//! thread (see [`crate::session`]); [`run`] owns the output files until the
//! capture ended, writes them only when it succeeded, and hands them over
//! ([`Outcome::outputs`]) to be put in place together with the caller's.

pub(crate) mod running;
pub(crate) mod sinks;

pub use running::{AttachOutcome, Detach, attach};

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::attach::{self, AttachError, Links};
use crate::engine::Fault;
use crate::pressure::{HighWater, PressureTimeout, RingRoom, RoomError};
use crate::proctree::{CommandSpec, SpawnError};
use crate::report::{
    Aggregator, CommitError, EventWriter, LostEvents, OutputError, OutputFile, Outputs, Profile,
    SameOutputError, StackEntry, StackMetrics,
};
use crate::ring::RingError;
use crate::session::{Finish, Session, SessionOptions, Target};
use crate::skel::memtrail::MemtrailSkel;
use crate::symbolize::AddressSpaces;
use crate::sys::{self, ChildExit, SysError};

use sinks::Stack;

/// Default size of the events ring: 64 MiB absorbs long bursts.
pub const DEFAULT_RING_SIZE: usize = 64 << 20;

/// Default frames per allocation stack.
pub const DEFAULT_STACK_DEPTH: u32 = 127;

/// Frames a stack record holds (`MT_MAX_STACK` in bpf/memtrail.h).
pub const MAX_STACK_DEPTH: u32 = 128;

/// How long the final drain may take before the capture is declared broken.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What to capture and where to write it.
#[derive(Debug, Clone)]
pub struct Options {
    pub command: Vec<OsString>,
    pub output: Option<PathBuf>,
    pub events: Option<PathBuf>,
    /// How `events` is written.
    pub events_format: crate::report::EventsFormat,
    /// Whether `output` and `events` may replace existing regular files
    /// (otherwise the capture fails before the command starts).
    pub replace_outputs: bool,
    /// Size in bytes of the events ring (a power of two, at least a page);
    /// with per-CPU rings, of all of them together.
    pub ring_size: usize,
    /// Frames captured per allocation stack (0: no stacks), at most
    /// [`MAX_STACK_DEPTH`].
    pub stack_depth: u32,
    /// Size in bytes of the stack ring (a power of two, at least a page).
    pub stack_ring_size: usize,
    /// How stacks are walked: unwind tables, frame pointers, or both.
    pub unwind: crate::unwind::Mode,
    /// Where allocator probes go: per process or system-wide.
    pub probes: crate::attach::per_process::Probes,
    /// One events ring, or one per CPU.
    pub event_rings: crate::ring::merge::EventRings,
    /// Backpressure: off (`0`, loss detection only), bounded, or unbounded.
    pub pressure_timeout: PressureTimeout,
    /// Fill of a ring, in percent, past which producers pause the tree.
    pub watermark_percent: u8,
    /// Fault injection for tests.
    pub faults: Faults,
    /// Counters published while the capture runs (the status line).
    pub live: Option<std::sync::Arc<crate::report::live::LiveCounters>>,
    /// Keep the timeline (the heap over time) in the profile.
    pub timeline: bool,
}

/// Test-only fault injection (`MEMTRAIL_FAULT=stall-events,slow-events,
/// wedge-events,stall-stacks,one-thread-slot,one-row-cache-slot,no-cgroup,fail-after-start,
/// late-pause,late-release,stop-after-cgroup` in
/// the CLI; see
/// [`engine::Fault`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub events: Fault,
    pub stacks: Fault,
    /// One thread slot for the whole tree (`thread_slots` in
    /// bpf/memtrail.bpf.c): the other threads keep their state in task
    /// storage, the path a thread takes when its slot is held.
    pub one_thread_slot: bool,
    /// One slot in BPF's cache of unwind rows (`row_cache`): every frame
    /// contends for it, so an entry is mostly another frame's (the path
    /// whose checks make a cached row the searched one).
    pub one_row_cache_slot: bool,
    /// Fail a session right after its threads started
    /// (`fail-after-start`): the path every later error takes.
    pub fail_after_start: bool,
    /// No cgroup for the tree: pressure pauses stop processes with SIGSTOP,
    /// the path taken where there is no usable cgroup v2 freezer.
    pub no_cgroup: bool,
    /// `memtrail run` stops itself (SIGSTOP) once its outputs are open,
    /// before any other thread starts (`stop-after-outputs`): a test can
    /// then signal the set-up at a known point.
    pub stop_after_outputs: bool,
    /// BPF takes every `bpf_find_vma` at an mmap as failed, as it does
    /// while another thread holds the mmap lock (`find-vma-busy`): the path
    /// that reads a mapping from the call's own file descriptor.
    pub find_vma_busy: bool,
    /// The pressure coordinator pauses late (`late-pause`) or resumes
    /// late (`late-release`).
    pub pressure: crate::pressure::PressureFault,
    /// memtrail stops itself (SIGSTOP) right after making the tree's
    /// cgroup (`stop-after-cgroup`): a test can kill it at that point.
    pub stop_after_cgroup: bool,
}

impl Faults {
    /// Parses a comma-separated list; unknown names are ignored.
    pub fn parse(spec: &str) -> Self {
        let mut faults = Self::default();
        for name in spec.split(',').map(str::trim) {
            if name == "one-thread-slot" {
                faults.one_thread_slot = true;
                continue;
            }
            if name == "one-row-cache-slot" {
                faults.one_row_cache_slot = true;
                continue;
            }
            if name == "no-cgroup" {
                faults.no_cgroup = true;
                continue;
            }
            if name == "stop-after-outputs" {
                faults.stop_after_outputs = true;
                continue;
            }
            if name == "fail-after-start" {
                faults.fail_after_start = true;
                continue;
            }
            if name == "find-vma-busy" {
                faults.find_vma_busy = true;
                continue;
            }
            if name == "stop-after-cgroup" {
                faults.stop_after_cgroup = true;
                continue;
            }
            if name == "late-pause" {
                faults.pressure = crate::pressure::PressureFault::LatePause;
                continue;
            }
            if name == "late-release" {
                faults.pressure = crate::pressure::PressureFault::LateRelease;
                continue;
            }
            let (fault, pipeline) = match name.split_once('-') {
                Some(("stall", p)) => (Fault::Stall, p),
                Some(("slow", p)) => (Fault::Slow, p),
                Some(("wedge", p)) => (Fault::Wedge, p),
                _ => continue,
            };
            match pipeline {
                "events" => faults.events = fault,
                "stacks" => faults.stacks = fault,
                _ => {}
            }
        }
        faults
    }
}

/// Default size of the stack ring.
pub const DEFAULT_STACK_RING_SIZE: usize = 16 << 20;

/// Why a capture failed. Each variant maps to a documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The outputs of a capture that succeeded could not all be written:
    /// none was put in place.
    #[error(transparent)]
    Outputs(#[from] CommitError),
    #[error(transparent)]
    SameOutput(#[from] SameOutputError),
    #[error(
        "{} received before the command started: nothing was run and no output written",
        sys::signals::name(*.0)
    )]
    Interrupted(i32),
    #[error(
        "memtrail lacks {}: run it as root, or give it the capabilities it needs \
         (setcap {CAPABILITIES}+ep memtrail)",
        .0.join(", ")
    )]
    Privileges(Vec<&'static str>),
    #[error("this kernel lacks {feature}: {hint}")]
    KernelFeature {
        feature: &'static str,
        hint: &'static str,
    },
    #[error("loading the BPF programs failed (the kernel rejected them; see the log above)")]
    Load(#[source] libbpf_rs::Error),
    #[error("attaching the {what} failed")]
    AttachTracepoint {
        what: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error("probing {image} (mapped by process {pid}) failed")]
    AttachImage {
        image: String,
        pid: u32,
        #[source]
        source: AttachError,
    },
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(
        "events were lost ({} on the events ring, {} on the stack ring, {} on the \
         mappings ring, {} attach requests, {} untracked calls or processes, {} \
         processes resumed before their probes existed): the capture is incomplete \
         and no report was written; {}",
        .0.events, .0.stacks, .0.mappings, .0.attach, .0.tracking, .0.resumed, .1
    )]
    Lost(LostEvents, String),
    #[error("--stack-depth {0} is more than the {MAX_STACK_DEPTH} frames a stack record holds")]
    StackDepth(u32),
    #[error(transparent)]
    Pressure(#[from] crate::pressure::PressureError),
    #[error(transparent)]
    Room(#[from] RoomError),
    #[error("{0} records could not be decoded: memtrail's BPF and userspace disagree")]
    Malformed(u64),
    #[error("writing the event stream failed")]
    EventStream(#[source] std::io::Error),
    #[error("the events pipeline did not drain within {0:?}")]
    DrainTimeout(Duration),
    #[error("a poller thread panicked")]
    PollerPanicked,
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error("invalid options: {0}")]
    InvalidOptions(&'static str),
    #[error("no process has pid {0}")]
    NoProcess(u32),
    #[error("cannot attach to process {pid}: {why}")]
    NotAttachable { pid: u32, why: &'static str },
    #[error("{tid} is a thread of process {pid}, not a process: attach to {pid}")]
    ThreadOf { tid: u32, pid: u32 },
    #[error("{0}")]
    State(&'static str),
    #[error("injected failure (MEMTRAIL_FAULT=fail-after-start)")]
    Injected,
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// What kind of failure a [`CaptureError`] is: the CLI maps it to an exit
/// code, the C ABI to an error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad options or arguments (usage).
    InvalidArgument,
    /// A call that does not fit the session's state (no region open, no
    /// tree to wait for).
    State,
    /// The command was not found.
    NotFound,
    /// The command is not executable.
    NotExecutable,
    /// An output cannot be written.
    Output,
    /// Missing privileges or kernel feature, or the BPF programs did not load.
    Unsupported,
    /// Another tracer holds a conflicting uprobe.
    Conflict,
    /// An image the tree loaded could not be examined or probed.
    Attach,
    /// Events were lost.
    Lost,
    /// A pressure pause did not recover in time.
    Pressure,
    /// A terminating signal came before the command started.
    Interrupted,
    /// Anything else: memtrail itself failed.
    Internal,
}

impl CaptureError {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        use crate::sys::ExecFailure;
        match self {
            Self::Spawn(SpawnError::NotFound(_)) => ErrorKind::NotFound,
            Self::Spawn(SpawnError::NotExecutable(_) | SpawnError::PermissionDenied { .. }) => {
                ErrorKind::NotExecutable
            }
            Self::Spawn(SpawnError::Nul(_)) => ErrorKind::InvalidArgument,
            Self::Spawn(SpawnError::Exec { source, .. }) => match source {
                ExecFailure::Exec(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    ErrorKind::NotFound
                }
                ExecFailure::Exec(_) => ErrorKind::NotExecutable,
                _ => ErrorKind::Internal,
            },
            Self::Output(_) | Self::Outputs(_) | Self::EventStream(_) => ErrorKind::Output,
            Self::SameOutput(_)
            | Self::Room(_)
            | Self::InvalidOptions(_)
            | Self::StackDepth(_)
            | Self::Ring(RingError::BadSize(_)) => ErrorKind::InvalidArgument,
            Self::State(_) => ErrorKind::State,
            Self::NoProcess(_) => ErrorKind::NotFound,
            Self::NotAttachable { .. } | Self::ThreadOf { .. } => ErrorKind::InvalidArgument,
            Self::Interrupted(_) => ErrorKind::Interrupted,
            Self::Privileges(_) | Self::KernelFeature { .. } | Self::Load(_) => {
                ErrorKind::Unsupported
            }
            Self::Attach(AttachError::Conflict { .. })
            | Self::AttachImage {
                source: AttachError::Conflict { .. },
                ..
            } => ErrorKind::Conflict,
            Self::Attach(_) | Self::AttachTracepoint { .. } => ErrorKind::Unsupported,
            Self::AttachImage { .. } => ErrorKind::Attach,
            Self::Lost(..) => ErrorKind::Lost,
            Self::Pressure(_) => ErrorKind::Pressure,
            _ => ErrorKind::Internal,
        }
    }
}

/// A finished capture.
#[derive(Debug)]
pub struct Outcome {
    pub profile: Profile,
    /// Probe sites the kernel single-steps that the command went through.
    pub slow_probes: Vec<crate::report::SlowProbe>,
    /// The exit code memtrail passes on: the command's, or 128 + signal.
    pub exit_code: i32,
    /// `--output` and `--events`, written but not yet in place: the caller
    /// adds its own (a report) and commits them together.
    pub outputs: Outputs,
}

/// The capabilities memtrail needs without root, as `setcap` spells them.
/// CAP_SYS_ADMIN can stand for all three. (Every program attaches by BTF
/// name or through `uprobe_multi` links: nothing is looked up in tracefs,
/// which only root may search.)
pub const CAPABILITIES: &str = "cap_bpf,cap_perfmon,cap_checkpoint_restore";

/// Checks, before anything is loaded, that memtrail may do what a capture
/// does; names every capability that is missing.
pub(crate) fn check_environment() -> Result<(), CaptureError> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    const CAP_CHECKPOINT_RESTORE: u32 = 40;
    let has = sys::has_capability;
    let admin = has(CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !admin && !has(CAP_BPF) {
        missing.push("CAP_BPF (to load BPF programs)");
    }
    if !admin && !has(CAP_PERFMON) {
        missing.push("CAP_PERFMON (to attach uprobes and tracepoints)");
    }
    if !admin && !has(CAP_CHECKPOINT_RESTORE) {
        missing.push(
            "CAP_CHECKPOINT_RESTORE (to open the files processes map, through /proc/PID/map_files)",
        );
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(CaptureError::KernelFeature {
            feature: "BTF (/sys/kernel/btf/vmlinux)",
            hint: "memtrail needs a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        });
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CaptureError::Privileges(missing))
    }
}

impl Options {
    /// Fails when --output and --events name the same file.
    pub(crate) fn check_outputs(&self) -> Result<(), CaptureError> {
        let outputs: Vec<_> = [("--output", &self.output), ("--events", &self.events)]
            .into_iter()
            .filter_map(|(flag, path)| Some((flag, path.as_deref()?)))
            .collect();
        crate::report::check_distinct(&outputs)?;
        Ok(())
    }

    /// The session's settings; `process_effects` for a command memtrail
    /// starts (see [`SessionOptions::process_effects`]).
    pub(crate) fn session_options(&self, process_effects: bool) -> SessionOptions {
        SessionOptions {
            ring_size: self.ring_size,
            stack_ring_size: self.stack_ring_size,
            stack_depth: self.stack_depth,
            unwind: self.unwind,
            probes: self.probes,
            event_rings: self.event_rings,
            pressure_timeout: self.pressure_timeout,
            watermark_percent: self.watermark_percent,
            process_effects,
            faults: self.faults,
            live: self.live.clone(),
            timeline: self.timeline,
        }
    }

    /// Opens --output and --events, given to `owner` (uid, gid) when set.
    pub(crate) fn open_outputs(
        &self,
        owner: Option<(u32, u32)>,
    ) -> Result<(Option<OutputFile>, Option<OutputFile>), OutputError> {
        let create = |path| {
            let out = OutputFile::create_with(path, self.replace_outputs)?;
            owner.map_or(Ok(()), |owner| out.give_to(owner))?;
            Ok::<_, OutputError>(out)
        };
        Ok((
            self.output.as_deref().map(create).transpose()?,
            self.events.as_deref().map(create).transpose()?,
        ))
    }

    /// The event stream writing into `events`, in --events' format.
    pub(crate) fn event_stream(
        &self,
        events: Option<OutputFile>,
    ) -> Result<Option<EventWriter>, CaptureError> {
        events
            .map(|out| EventWriter::new(out, self.events_format))
            .transpose()
            .map_err(CaptureError::EventStream)
    }
}

/// Runs one capture: `memtrail run`. Starts a [`Session`] on the command
/// (with the CLI's process effects), waits for its tree, and writes the
/// outputs if the capture succeeded (the caller commits them:
/// [`Outcome::outputs`]).
pub fn run(opts: &Options) -> Result<Outcome, CaptureError> {
    // Everything that can fail on bad input fails before the command runs.
    opts.check_outputs()?;
    let session_opts = opts.session_options(true);
    let target = Target::Command(opts.command.clone());
    let spec = CommandSpec::new(opts.command.clone())?;
    // Under sudo, the files are the invoking user's, as the command is.
    let (output, events) = opts.open_outputs(spec.creds.as_ref().map(|c| (c.uid, c.gid)))?;
    if opts.faults.stop_after_outputs {
        crate::sys::stop_self();
    }
    session_opts.validate(&target)?;
    let stream = opts.event_stream(events)?;
    let mut session = Session::start_with(&session_opts, target, stream)?;
    let waited = session.wait();
    let Finish {
        profile,
        slow_probes,
        exit,
        stream,
        stream_error,
        detaching,
    } = session.finish()?;
    waited?;
    let outputs = write_outputs(&profile, stream, stream_error, output);
    drop(detaching);
    Ok(Outcome {
        profile,
        slow_probes,
        exit_code: exit.root.map_or(0, ChildExit::code),
        outputs,
    })
}

/// Writes a finished capture's event stream and profile, not yet in place:
/// the caller commits them together with its own outputs, so that a file
/// appears only if every output could be written (issue 28). A stream whose
/// writing failed while the capture ran is that failure.
pub(crate) fn write_outputs(
    profile: &Profile,
    stream: Option<EventWriter>,
    stream_error: Option<std::io::Error>,
    output: Option<OutputFile>,
) -> Outputs {
    let mut outputs = Outputs::default();
    if let Some(stream) = stream {
        outputs.add(match stream_error {
            Some(source) => Err(OutputError {
                path: stream.path().to_owned(),
                source,
            }),
            None => stream.finish(),
        });
    }
    if let Some(output) = output {
        outputs.write(output, |out| crate::report::stage_profile(profile, out));
    }
    outputs
}

/// Why a paused capture still lost records, and what ring sizes would do:
/// each live thread of the tree may write two records past a ring's mark
/// before it stops, so a tree with more threads than the ring has room for
/// above its watermark can overrun it before the freeze lands.
pub(crate) fn loss_advice(
    lost: &LostEvents,
    rooms: &[RingRoom],
    percent: u8,
    threads: u64,
) -> String {
    if lost.resumed != 0 {
        return lost.advice();
    }
    let counts = [lost.events, lost.stacks, lost.mappings, lost.attach];
    let needs: Vec<String> = rooms
        .iter()
        .zip(counts)
        .filter(|&(room, n)| n != 0 && room.option != "fixed")
        .map(|(room, _)| {
            let needed = crate::pressure::min_room(room.record, threads, 0);
            let size = crate::pressure::min_ring_size(room.capacity, percent, needed);
            format!("{} {size}", room.option)
        })
        .collect();
    if needs.is_empty() {
        return lost.advice();
    }
    format!(
        "the tree had up to {threads} live threads, and each may write {} records past a \
         ring's watermark before it stops: retry with {} (or a lower --watermark)",
        crate::pressure::RECORDS_PER_THREAD,
        needs.join(" and ")
    )
}

/// Builds the allocation sites: every stack that allocated, symbolized,
/// largest allocated bytes first.
pub(crate) fn symbolize_stacks(
    agg: &Aggregator,
    stacks: &HashMap<u64, Stack>,
    mut mappings: HashMap<u32, Vec<crate::symbolize::Mapping>>,
    symbolizer: &crate::symbolize::Background,
) -> Vec<StackEntry> {
    let hints: Vec<PathBuf> = agg
        .processes()
        .filter_map(|p| std::fs::canonicalize(&p.exe).ok())
        .chain(attach::libc_path().ok())
        .collect();
    crate::symbolize::resolve_paths(&mut mappings, &hints);
    let spaces = AddressSpaces {
        mappings,
        parents: agg.processes().map(|p| (p.pid, p.ppid)).collect(),
    };
    /// A stack to symbolize: id, metrics, return addresses.
    type Site<'a> = (u64, StackMetrics, &'a Stack);
    let mut by_pid: HashMap<u32, Vec<Site<'_>>> = HashMap::new();
    let exes: HashMap<u32, &str> = agg.processes().map(|p| (p.pid, &p.exe[..])).collect();
    let exe_of = |pid: u32| exes.get(&pid).copied().unwrap_or_default().to_owned();
    let mut entries = Vec::new();
    for (id, metrics) in agg.stack_metrics() {
        if metrics.is_empty() {
            continue;
        }
        match (stacks.get(&id), agg.direct_syscall_pid(id)) {
            (Some(stack), _) => by_pid
                .entry(stack.pid)
                .or_default()
                .push((id, metrics, stack)),
            (None, Some(pid)) => entries.push(StackEntry {
                id,
                pid,
                frames: vec![crate::report::Frame::direct_syscall()],
                exe: agg.stack_exe(id).map_or_else(|| exe_of(pid), str::to_owned),
                end: crate::unwind::StackEnd::Complete,
                metrics,
            }),
            (None, None) => {
                tracing::warn!(id, "an allocation names a stack that was never recorded")
            }
        }
    }
    let by_pid: Vec<(u32, Vec<Site<'_>>)> = by_pid.into_iter().collect();
    let request = by_pid
        .iter()
        .map(|(pid, list)| {
            let ips = list.iter().map(|(_, _, stack)| stack.ips.clone()).collect();
            (*pid, ips)
        })
        .collect();
    let frames = symbolizer.symbolize(spaces, request);
    for ((pid, list), frames) in by_pid.into_iter().zip(frames) {
        entries.extend(
            list.into_iter()
                .zip(frames)
                .map(|((id, metrics, stack), frames)| StackEntry {
                    id,
                    pid,
                    // What ran when the stack was made: a stack from
                    // before an exec keeps the executable of then.
                    exe: agg.stack_exe(id).map_or_else(|| exe_of(pid), str::to_owned),
                    frames,
                    end: stack.end,
                    metrics,
                }),
        );
    }
    entries.sort_by(|a, b| b.metrics.bytes.cmp(&a.metrics.bytes).then(a.id.cmp(&b.id)));
    entries
}

/// The unwind tables' maps, when stacks are walked with tables; without
/// them (the maps cannot be mapped) stacks take frame-pointer steps.
pub(crate) fn unwind_tables(
    skel: &MemtrailSkel<'_>,
    mode: crate::unwind::Mode,
    stack_depth: u32,
) -> Option<crate::unwind::Tables> {
    if !mode.uses_tables() || stack_depth == 0 {
        return None;
    }
    use libbpf_rs::MapCore;
    use std::os::fd::AsFd;
    let maps = &skel.maps;
    crate::unwind::Tables::new(
        (maps.unwind_rows.as_fd(), maps.unwind_rows.max_entries()),
        (maps.unwind_pages.as_fd(), maps.unwind_pages.max_entries()),
        maps.unwind_images.as_fd(),
    )
    .inspect_err(|err| tracing::warn!(%err, "no unwind tables: stacks take frame-pointer steps"))
    .ok()
}

/// Attaches the syscall and sched tracepoint programs, and `signal_generate`
/// with `signals` (stops and resumes by others). Returns a descriptor of
/// the `sched_exit` link, for the guardian to hold (see `sys::Guardian`).
pub(crate) fn attach_tracepoints(
    skel: &MemtrailSkel<'_>,
    links: &mut Links,
    signals: bool,
) -> Result<std::os::fd::OwnedFd, CaptureError> {
    let p = &skel.progs;
    let attach = |prog: &libbpf_rs::ProgramMut<'_>| {
        prog.attach()
            .map_err(|source| CaptureError::AttachTracepoint {
                what: "syscall and sched tracepoints",
                source,
            })
    };
    let exit = attach(&p.sched_exit)?;
    let exit_fd = std::os::fd::AsFd::as_fd(&exit)
        .try_clone_to_owned()
        .map_err(|source| CaptureError::Io {
            what: "duplicating a BPF link descriptor",
            source,
        })?;
    links.push(exit);
    let held = signals.then_some(&p.signal_generate);
    for prog in [&p.sched_fork, &p.sched_exec, &p.sys_enter, &p.sys_exit]
        .into_iter()
        .chain(held)
    {
        links.push(attach(prog)?);
    }
    Ok(exit_fd)
}

/// Each ring's capacity and largest record (with its ring header), by ring
/// index (`enum mt_ring`); the events ring is one of `per_cpu` per-CPU
/// rings when given.
pub(crate) fn ring_rooms(
    ring_size: usize,
    per_cpu: Option<u64>,
    stack_ring_size: usize,
) -> [RingRoom; 4] {
    use crate::skel::memtrail::types as t;
    use std::mem::size_of;
    let with_header = |n: usize| (n as u64 + 8).next_multiple_of(8);
    let event = size_of::<t::mt_alloc_event>()
        .max(size_of::<t::mt_fork_event>())
        .max(size_of::<t::mt_exec_event>())
        .max(size_of::<t::mt_exit_event>());
    let mapping = with_header(size_of::<t::mt_mapping_record>());
    [
        RingRoom {
            name: "events",
            option: "--ring-size",
            capacity: ring_size as u64,
            record: with_header(event),
            per_cpu,
        },
        RingRoom {
            name: "stacks",
            option: "--stack-ring-size",
            capacity: stack_ring_size as u64,
            record: with_header(size_of::<t::mt_stack_record>()),
            per_cpu: None,
        },
        RingRoom {
            name: "mappings",
            option: "fixed",
            capacity: MAPPINGS_RING_SIZE,
            record: mapping,
            per_cpu: None,
        },
        RingRoom {
            name: "attach",
            option: "fixed",
            capacity: ATTACH_RING_SIZE,
            record: mapping,
            per_cpu: None,
        },
    ]
}

/// Sizes of the mappings and attach-request rings (`max_entries` in
/// bpf/memtrail.bpf.c).
const MAPPINGS_RING_SIZE: u64 = 1 << 20;
const ATTACH_RING_SIZE: u64 = 1 << 20;

/// Pipeline names by barrier index.
pub(crate) const PIPELINES: [&str; 4] = ["events", "stacks", "mappings", "attach"];

/// The high-water marks the producers kept (only with pressure on: see
/// check_pressure in bpf/memtrail.bpf.c).
pub(crate) fn read_high_water(skel: &MemtrailSkel<'_>) -> HighWater {
    let bss = skel
        .maps
        .bss_data
        .as_deref()
        .expect("the BPF object has a .bss");
    HighWater {
        events: bss.hwm_events,
        stacks: bss.hwm_stacks,
        mappings: bss.hwm_mappings,
        attach: bss.hwm_attach,
    }
}

pub(crate) fn read_lost(skel: &MemtrailSkel<'_>) -> LostEvents {
    let bss = skel
        .maps
        .bss_data
        .as_deref()
        .expect("the BPF object has a .bss with its loss counters");
    // The programs update these with atomic adds; the pipeline barrier
    // already ordered every producer's work before this read.
    LostEvents {
        events: bss.drops_events,
        tracking: bss.drops_tracking,
        stacks: bss.drops_stacks,
        mappings: bss.drops_mappings,
        attach: bss.drops_attach,
        resumed: bss.drops_resumed,
    }
}
