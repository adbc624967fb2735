//! A session: one capture, owned from start to finish, for the CLI and for
//! programs that embed memtrail.
//!
//! Ownership: a [`Session`] owns the loaded BPF object
//! (`bpf::object::Loaded`), the probe links, and every thread it
//! starts (four pinned pollers and the pressure coordinator, in
//! `threads`). The .bss words the threads share with the programs are
//! `bpf::bss::BssWord`s, each keeping its own mapping of the
//! .bss: they stay valid whatever is dropped first. The fields still drop
//! in declaration order, for the processes the tree may have stopped: the
//! threads first (told to stop and joined, the tree resumed), then the
//! links, then the object (which resumes a process BPF held for probes
//! nobody made, once no link can hold one any more). A session under
//! construction keeps the same order in its locals (the object is declared
//! before the threads), so an error, or a panic, at any point after the
//! first thread started joins every thread first.
//!
//! The phases: [`start`](Session::start) (the `start` submodule),
//! [`finish`](Session::finish) (the `finish` submodule: the profile is
//! assembled there, in one function).
//!
//! What a session tracks ([`Target`]): a command it spawns (as `memtrail
//! run` does), its own process (every thread of the embedding program but
//! the session's own, which start before the process is tracked and so
//! never get BPF call state, and whose syscalls BPF leaves out through the
//! `excluded_threads` map), or an existing process.
//!
//! Process-wide effects are opt-in ([`SessionOptions::process_effects`], on
//! for the CLI only): forwarding SIGTERM and the like to the command,
//! ignoring SIGINT/SIGQUIT, and becoming the subreaper of the command's
//! tree. Without them, [`Session::wait`] waits for the command's root
//! process only.
//!
//! Exact points in time: [`Session::snapshot`] and regions raise the
//! pipelines' epoch barrier and wait for the events pipeline to drain
//! (see the `regions` submodule).

pub mod error;
mod finish;
pub(crate) mod markers;
pub mod options;
pub(crate) mod phases;
pub(crate) mod regions;
pub mod sinks;
pub mod stages;
mod start;
mod threads;
mod upfront;

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::attach::cache::ImageCache;
use crate::attach::{self, Links};
use crate::bpf::bss::Bss;
use crate::bpf::object::Loaded;
use crate::events::writer::EventWriter;
use crate::pressure::{self, PressureTimeout};
use crate::proctree;
use crate::proctree::cgroup::{CgroupError, TreeCgroup};
use crate::profile::Profile;
use crate::profile::regions::RegionCounts;
use crate::ring::RingError;
use crate::ring::merge;
use crate::sys::{self, ChildExit};
use threads::Threads;

pub use error::{CAPABILITIES, CaptureError, ErrorKind};
pub use options::{
    DEFAULT_RING_SIZE, DEFAULT_STACK_DEPTH, DEFAULT_STACK_RING_SIZE, Faults, MAX_STACK_DEPTH,
};
pub(crate) use options::{DRAIN_TIMEOUT, PIPELINES};
use regions::{Control, Op, Reply};
pub use regions::{NAME_MAX, ProcessTotals, Snapshot, Totals};

/// How long a detach waits for the processes it stops to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a snapshot or region call waits for the events pipeline.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(30);

/// What a session tracks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A command the session starts, tracked from its first instruction.
    Command(Vec<OsString>),
    /// The calling process, but for the session's own threads.
    SelfProcess,
    /// A running process (its threads from now on, and what it forks).
    Pid(u32),
}

/// A session's settings. [`Default`] is `memtrail run`'s defaults.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Size in bytes of the events ring (a power of two, at least a page).
    pub ring_size: usize,
    /// Size in bytes of the stack ring (a power of two, at least a page).
    pub stack_ring_size: usize,
    /// Frames per allocation stack (0: none), at most [`MAX_STACK_DEPTH`].
    pub stack_depth: u32,
    /// How stacks are walked: unwind tables, frame pointers, or both.
    pub unwind: crate::profile::unwind::Mode,
    /// Python functions in stacks through CPython 3.11 to 3.13 interpreters
    /// (false: `--native-only`, the interpreter's own frames).
    pub python_frames: bool,
    /// Where allocator probes go: per process or system-wide.
    pub probes: crate::attach::per_process::Probes,
    /// One events ring, or one per CPU.
    pub event_rings: merge::EventRings,
    /// Backpressure (must be off for [`Target::SelfProcess`]: a process
    /// cannot pause itself).
    pub pressure_timeout: PressureTimeout,
    /// Ring fill, in percent (1 to 99), past which the tree is paused.
    pub watermark_percent: u8,
    /// Signal forwarding, SIGINT/SIGQUIT ignored, subreaper: for the CLI.
    pub process_effects: bool,
    /// Fault injection for tests.
    pub faults: Faults,
    /// Counters published while the capture runs (the CLI's status line).
    pub live: Option<Arc<crate::engine::live::LiveCounters>>,
    /// Keep the timeline (the heap over time) in the profile; without it
    /// the profile's `timeline` is empty.
    pub timeline: bool,
    /// Directories of debug files by build id (`DIR/.build-id/xx/rest.debug`)
    /// looked in after `/usr/lib/debug` (`--debuginfo-dir`).
    pub debuginfo_dirs: Vec<std::path::PathBuf>,
    /// The preload shim (`--preload`, issue 22): a command's processes that
    /// load it hand their allocator calls to memtrail in-process (into
    /// rings of memtrail's shared memory, or one kernel entry a call where
    /// they cannot); the others keep the allocator probes. Probes
    /// are then per process. Only for a command memtrail starts.
    pub preload: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            ring_size: crate::session::DEFAULT_RING_SIZE,
            stack_ring_size: crate::session::DEFAULT_STACK_RING_SIZE,
            stack_depth: crate::session::DEFAULT_STACK_DEPTH,
            unwind: crate::profile::unwind::Mode::default(),
            python_frames: true,
            probes: crate::attach::per_process::Probes::default(),
            event_rings: merge::EventRings::default(),
            pressure_timeout: PressureTimeout::Off,
            watermark_percent: 75,
            process_effects: false,
            faults: Faults::default(),
            live: None,
            timeline: true,
            debuginfo_dirs: Vec::new(),
            preload: false,
        }
    }
}

impl SessionOptions {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self, target: &Target) -> Result<(), CaptureError> {
        for size in [self.ring_size, self.stack_ring_size] {
            if !size.is_power_of_two() || size < rustix::param::page_size() || size > 1 << 31 {
                return Err(RingError::BadSize(size).into());
            }
        }
        if self.stack_depth > MAX_STACK_DEPTH {
            return Err(CaptureError::StackDepth(self.stack_depth));
        }
        if !(1..=99).contains(&self.watermark_percent) {
            return Err(CaptureError::InvalidOptions(
                "the watermark must be 1 to 99 percent",
            ));
        }
        // Checked before the capture starts: found missing only when the
        // capture ends, the run would be lost.
        if let Some(dir) = self.debuginfo_dirs.iter().find(|d| !d.is_dir()) {
            return Err(CaptureError::DebuginfoDir(dir.clone()));
        }
        if self.preload && !matches!(target, Target::Command(_)) {
            return Err(CaptureError::InvalidOptions(
                "the preload shim is for a command memtrail starts",
            ));
        }
        if self.preload && self.probes == crate::attach::per_process::Probes::SystemWide {
            return Err(CaptureError::InvalidOptions(
                "the preload shim needs per-process probes: not with --probes system-wide",
            ));
        }
        match target {
            Target::SelfProcess if self.pressure_timeout.enabled() => {
                Err(CaptureError::InvalidOptions(
                    "a session tracking its own process cannot pause it: the pressure timeout must be 0",
                ))
            }
            // Pids are positive `pid_t`s: 0 and those past i32::MAX name
            // no process (the kernel would call them invalid arguments).
            Target::Pid(pid) if *pid == 0 || i32::try_from(*pid).is_err() => {
                Err(CaptureError::NoProcess(*pid))
            }
            Target::Pid(pid) if *pid == std::process::id() => Err(CaptureError::NotAttachable {
                pid: *pid,
                why: "it is memtrail's own process (track it with Target::SelfProcess)",
            }),
            Target::Command(argv) if argv.is_empty() => {
                Err(CaptureError::InvalidOptions("the command is empty"))
            }
            _ => Ok(()),
        }
    }
}

/// How a session's tree ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeExit {
    /// How the root process ended, when the session could wait for it
    /// (a command it spawned).
    pub root: Option<ChildExit>,
}

/// Logs why pauses stop processes with SIGSTOP instead of freezing a cgroup.
fn no_freezer(err: CgroupError) {
    tracing::info!(
        error = &err as &(dyn std::error::Error + 'static),
        "no cgroup freezer: pressure pauses will stop processes with SIGSTOP"
    );
}

/// The command a session started.
struct Root {
    pid: u32,
    /// Set once waited for.
    exit: Option<Option<ChildExit>>,
    /// Signals passed on to it while it runs (CLI only).
    forward: Option<sys::signals::Forward>,
}

/// One capture, from start to finish. See the module docs.
pub struct Session {
    // Field order is drop order: threads, then links, then the BPF object.
    threads: Threads,
    links: Links,
    /// The only field neither `Send` nor `Sync` by itself: it asserts
    /// both, with its reasons.
    loaded: Loaded,
    /// The object's .bss words the session writes (`tree_threads`).
    bss: Bss,
    control: Arc<Control>,
    /// Serializes snapshot and region calls.
    ops: Mutex<()>,
    target: Target,
    root: Option<Root>,
    /// For a tracked existing process: its pidfd, to wait on.
    pidfd: Option<OwnedFd>,
    cgroup: Option<Arc<TreeCgroup>>,
    /// Dropped after the threads (which resume what they hold) and the
    /// cgroup (thawed and removed): it is then told the session ended, and
    /// reaped.
    _guardian: Option<sys::Guardian>,
    sites: Vec<attach::Site>,
    /// Mapped images of a running target not probed up front (see
    /// `attach::AttachError::skip_reason`); the attach worker's come later.
    skipped_images: Vec<crate::profile::SkippedImage>,
    image_cache: ImageCache,
    /// The symbolizer, loading ahead the files every capture symbolizes.
    symbols: crate::symbolize::Background,
    start_ns: u64,
    command: Vec<String>,
    /// The rings' sizes and records, the pausing mode and the watermark:
    /// for the advice of a loss.
    rooms: [pressure::RingRoom; 4],
    opts_pressure: crate::pressure::PressureTimeout,
    opts_watermark: u8,
    /// How stacks were walked, for the profile.
    unwind: crate::profile::unwind::Mode,
    /// `SessionOptions::debuginfo_dirs`.
    debuginfo_dirs: Vec<std::path::PathBuf>,
    /// Per-process probes: the command gets its probes on libc here,
    /// before it runs (a conflicting tracer fails the capture then, as
    /// with system-wide probes); the attach worker makes the rest.
    first_probes: Option<FirstProbes>,
    /// Whether probes were made per process (see [`attach::per_process`]).
    per_process: bool,
    /// The events rings: one, or one per CPU. The events poller's deep
    /// sleep waits on their descriptors.
    event_ring_maps: Vec<libbpf_rs::MapHandle>,
}

// A session is used from any thread (the C ABI's callers, an embedding
// program's threads taking snapshots): checked here, at compile time, with
// no assertion of its own (only `Loaded` asserts `Send`/`Sync`).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Session>();
};

/// What the session needs to make the command's probes on libc.
struct FirstProbes {
    registry: attach::per_process::Shared,
    progs: attach::AllocPrograms,
    libc: crate::sys::FileId,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// The result of [`Session::finish`].
pub struct Finish {
    pub profile: Profile,
    /// Probe sites the kernel single-steps that the tree went through.
    pub slow_probes: Vec<crate::profile::SlowProbe>,
    /// How the tree ended (what [`Session::wait`] saw).
    pub exit: TreeExit,
    pub(crate) stream: Option<EventWriter>,
    /// Why `stream` stopped being written, if it did: the capture's numbers
    /// stand, the stream output fails (issue 28).
    pub(crate) stream_error: Option<std::io::Error>,
    /// The probes being detached (the kernel waits for RCU grace periods,
    /// ~100 ms): joined when this is dropped, so that the outputs are
    /// written meanwhile.
    pub(crate) detaching: Option<Background<()>>,
}

impl Session {
    /// Starts a session tracking `target`.
    pub fn start(opts: &SessionOptions, target: Target) -> Result<Self, CaptureError> {
        Self::start_with(opts, target, None)
    }

    /// An eventfd that becomes readable when the pressure coordinator gave
    /// up (a late episode): [`finish`](Self::finish) then returns its error.
    pub(crate) fn pressure_failed_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.threads.failed_fd.as_fd()
    }

    /// The pidfd of the tracked running process ([`Target::Pid`]).
    pub(crate) fn target_pidfd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.pidfd.as_ref().map(AsFd::as_fd)
    }

    /// What the session tracks.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The root process: the command's, or the tracked process.
    pub fn pid(&self) -> u32 {
        match self.target {
            Target::SelfProcess => std::process::id(),
            Target::Pid(pid) => pid,
            Target::Command(_) => self.root.as_ref().map_or(0, |r| r.pid),
        }
    }

    /// Waits until the tracked tree has exited: with process effects (the
    /// CLI), the command's whole tree; otherwise the command's root
    /// process, or the tracked existing process. A session tracking its
    /// own process has nothing to wait for.
    pub fn wait(&mut self) -> Result<TreeExit, CaptureError> {
        match self.target {
            Target::SelfProcess => Err(CaptureError::State(
                "a session tracking its own process has no tree to wait for",
            )),
            Target::Pid(_) => {
                if let Some(fd) = &self.pidfd {
                    sys::wait_pidfd(fd.as_fd())?;
                }
                Ok(TreeExit { root: None })
            }
            Target::Command(_) => {
                let Some(root) = &mut self.root else {
                    return Err(CaptureError::State("the command did not start"));
                };
                if let Some(exit) = root.exit {
                    return Ok(TreeExit { root: exit });
                }
                let exit = if root.forward.is_some() {
                    proctree::wait_tree(root.pid)?
                } else {
                    match sys::wait_pid(root.pid.into()) {
                        Ok(exit) => Some(exit),
                        // Not our child any more: reaped by another wait
                        // of the embedding program's (issue 28).
                        Err(err) if err.errno() == Some(libc::ECHILD) => {
                            return Err(CaptureError::State(
                                "the command's process was reaped already, by a wait of the \
                                 caller's own (or SIGCHLD is ignored): its exit status is lost",
                            ));
                        }
                        Err(err) => return Err(err.into()),
                    }
                };
                root.exit = Some(exit);
                root.forward = None;
                Ok(TreeExit { root: exit })
            }
        }
    }

    /// Runs `op` on the events poller once it has drained what was made
    /// before this call.
    fn ask(&self, op: Op) -> Result<Reply, CaptureError> {
        let _one = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let barrier = &self.threads.barrier;
        self.control.post(op, || barrier.current());
        let epoch = barrier.raise();
        if !barrier.wait_one(0, epoch, Some(BARRIER_TIMEOUT)) {
            let _ = self.control.take_reply();
            return Err(CaptureError::DrainTimeout(BARRIER_TIMEOUT));
        }
        self.control
            .take_reply()
            .ok_or(CaptureError::State("the events pipeline has stopped"))
    }

    /// Totals of the tracked processes including every event made before
    /// the call. The returned value is allocated by the events poller: a
    /// process tracking itself sees its drop as frees of blocks it never
    /// allocated (`unmatched_frees`), not as frees.
    pub fn snapshot(&self) -> Result<Snapshot, CaptureError> {
        match self.ask(Op::Snapshot)? {
            Reply::Snapshot(snap) => Ok(snap),
            _ => Err(CaptureError::State("unexpected reply")),
        }
    }

    /// The totals of [`snapshot`](Self::snapshot) alone: returns nothing
    /// allocated, so a process tracking itself sees no event of the call
    /// (and the events poller is not pacing at the next one).
    pub fn totals(&self) -> Result<Totals, CaptureError> {
        match self.ask(Op::Totals)? {
            Reply::Totals(t) => Ok(t),
            _ => Err(CaptureError::State("unexpected reply")),
        }
    }

    /// Begins a region on the calling thread (regions are per thread and
    /// nest: see the `regions` module). `name` is cut to [`NAME_MAX`] bytes.
    pub fn region_begin(&self, name: &str) -> Result<(), CaptureError> {
        let mut buf = [0u8; NAME_MAX + 1];
        let n = name.len().min(NAME_MAX);
        buf[..n].copy_from_slice(&name.as_bytes()[..n]);
        let tid = sys::gettid().get();
        match self.ask(Op::Begin { tid, name: buf })? {
            Reply::Begun => Ok(()),
            _ => Err(CaptureError::State("unexpected reply")),
        }
    }

    /// Ends the calling thread's innermost region; its counts.
    pub fn region_end(&self) -> Result<RegionCounts, CaptureError> {
        match self.ask(Op::End {
            tid: sys::gettid().get(),
        })? {
            Reply::Ended(counts) => Ok(counts),
            Reply::NoRegion => Err(CaptureError::State("no region is open on this thread")),
            _ => Err(CaptureError::State("unexpected reply")),
        }
    }

    /// A region that ends when [`Region::end`] is called or when dropped.
    pub fn region<'s>(&'s self, name: &str) -> Result<Region<'s>, CaptureError> {
        self.region_begin(name)?;
        Ok(Region {
            session: self,
            open: true,
        })
    }
}

/// Work on a thread of its own, joined when dropped (whatever path the
/// session leaves by); none when the thread could not start, in which case
/// the work's closure was dropped unrun.
pub(crate) struct Background<T>(Option<JoinHandle<T>>);

impl<T: Send + 'static> Background<T> {
    pub(crate) fn spawn(name: &str, work: impl FnOnce() -> T + Send + 'static) -> Self {
        match std::thread::Builder::new().name(name.into()).spawn(work) {
            Ok(handle) => Self(Some(handle)),
            Err(err) => {
                tracing::debug!(%err, thread = name, "no thread: the work is done in place");
                Self(None)
            }
        }
    }

    /// The work's result; None if the thread never started. A panic on
    /// the thread goes on here.
    pub(crate) fn join(mut self) -> Option<T> {
        let handle = self.0.take()?;
        Some(
            handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        )
    }
}

impl<T> Drop for Background<T> {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A command not waited for is killed and reaped: nothing is left
        // running untracked, or as a zombie of the embedder.
        if let Some(root) = &mut self.root {
            if root.exit.is_none() {
                let _ = sys::kill(root.pid.into(), sys::Signal::KILL);
                let _ = sys::wait_pid(root.pid.into());
                root.exit = Some(None);
            }
        }
        // The fields drop next, threads first (see the struct).
    }
}

/// A region of the calling thread (see [`Session::region`]).
#[derive(Debug)]
pub struct Region<'s> {
    session: &'s Session,
    open: bool,
}

impl Region<'_> {
    /// Ends the region; its counts.
    pub fn end(mut self) -> Result<RegionCounts, CaptureError> {
        self.open = false;
        self.session.region_end()
    }
}

impl Drop for Region<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.session.region_end();
        }
    }
}

/// A pidfd of running process `pid`, which memtrail may attach to: it
/// exists, is not a zombie and is not a kernel thread.
fn open_running(pid: u32) -> Result<OwnedFd, CaptureError> {
    // `/proc/TID` of a thread other than its process's main thread exists
    // too (unlisted); pidfd_open refuses it.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:")?.trim().parse::<u32>().ok());
    if let Some(tgid) = tgid.filter(|&tgid| tgid != pid) {
        return Err(CaptureError::ThreadOf {
            tid: pid,
            pid: tgid,
        });
    }
    let fd = sys::pidfd_open(pid.into()).map_err(|err| match err.errno() {
        Some(libc::ESRCH) => CaptureError::NoProcess(pid),
        _ => err.into(),
    })?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // `pid (comm) S ...`: the state follows the last parenthesis.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    match state {
        None => Err(CaptureError::NoProcess(pid)),
        Some('Z' | 'X') => Err(CaptureError::NotAttachable {
            pid,
            why: "it has exited (a zombie)",
        }),
        // A kernel thread has no executable.
        _ if std::fs::read_link(format!("/proc/{pid}/exe")).is_err() => {
            Err(CaptureError::NotAttachable {
                pid,
                why: "it is a kernel thread (no user-space memory to track)",
            })
        }
        _ => Ok(fd),
    }
}

/// The parent and the executable of running process `pid`, as `/proc`
/// has them now (0 and "" where it cannot tell).
fn running_identity(pid: u32) -> (u32, String) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // `pid (comm) S ppid ...`: the fields after the last parenthesis.
    let ppid = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    (ppid, exe)
}

/// The thread ids of process `pid`.
fn thread_ids(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The executable files process `pid` has mapped, each once.
fn mapped_images(pid: u32) -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut seen = HashSet::new();
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let perms = fields.nth(1)?;
            let path = fields.nth(3)?;
            (perms.contains('x') && path.starts_with('/')).then(|| PathBuf::from(path))
        })
        .filter(|p| seen.insert(p.clone()))
        .collect()
}
