//! A session: one capture, owned from start to finish, for the CLI and for
//! programs that embed memtrail.
//!
//! Ownership and the one invariant that matters: a [`Session`] owns the
//! loaded BPF object (its maps, whose .bss words the threads read through
//! raw pointers: `SleepFlag`, `Latch`, `BssWord`), the probe links, and
//! every thread it starts (four pinned pollers and the pressure
//! coordinator). Its fields drop in declaration order: the threads first
//! (told to stop and joined), then the links, then the object. A session
//! under construction keeps the same order in its locals (the object is
//! declared before the threads), so an error, or a panic, at any point
//! after the first thread started joins every thread before the mappings
//! go: no thread can outlive them, by construction.
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

pub(crate) mod markers;
mod phases;
pub(crate) mod regions;
mod upfront;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, OpenObject};

use crate::attach::cache::ImageCache;
use crate::attach::worker::AttachWorker;
use crate::attach::{self, Links};
use crate::capture::sinks::{EventSink, MappingSink, StackSink};
use crate::capture::{CaptureError, Faults, MAX_STACK_DEPTH};
use crate::engine::idle::{DeepSleep, SleepFlag};
use crate::engine::{self, Barrier, Fault, Finished, Pipeline, ThreadIds};
use crate::pressure::{
    self, BssWord, Coordinator, HighWater, Latch, Pause, PressureError, PressureStats,
    PressureTimeout,
};
use crate::proctree::cgroup::{CgroupError, CgroupPlace, TreeCgroup};
use crate::proctree::stops::Stops;
use crate::proctree::{self, CommandSpec};
use crate::report::{Aggregator, EventWriter, ExitInfo, Profile};
use crate::ring::merge::{self, EventsRing, Merged};
use crate::ring::{RingConsumer, RingError};
use crate::skel::memtrail::{MemtrailSkel, MemtrailSkelBuilder, OpenMemtrailSkel};
use crate::sys::{self, ChildExit};

use regions::{Control, Op, Regions, Reply};
pub use regions::{NAME_MAX, ProcessTotals, RegionCounts, Snapshot, Totals};

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
    pub unwind: crate::unwind::Mode,
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
    pub live: Option<Arc<crate::report::live::LiveCounters>>,
    /// Keep the timeline (the heap over time) in the profile; without it
    /// the profile's `timeline` is empty.
    pub timeline: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            ring_size: crate::capture::DEFAULT_RING_SIZE,
            stack_ring_size: crate::capture::DEFAULT_STACK_RING_SIZE,
            stack_depth: crate::capture::DEFAULT_STACK_DEPTH,
            unwind: crate::unwind::Mode::default(),
            probes: crate::attach::per_process::Probes::default(),
            event_rings: merge::EventRings::default(),
            pressure_timeout: PressureTimeout::Off,
            watermark_percent: 75,
            process_effects: false,
            faults: Faults::default(),
            live: None,
            timeline: true,
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

/// The loaded BPF object: the skeleton and the storage it borrows.
struct Loaded {
    skel: ManuallyDrop<MemtrailSkel<'static>>,
    storage: NonNull<MaybeUninit<OpenObject>>,
}

impl Loaded {
    /// Opens, configures and loads the BPF object.
    fn load(
        configure: impl FnOnce(&mut OpenMemtrailSkel<'_>) -> Result<(), CaptureError>,
    ) -> Result<Self, CaptureError> {
        let storage = NonNull::from(Box::leak(Box::new(MaybeUninit::<OpenObject>::uninit())));
        let free = || {
            // SAFETY: `storage` came from Box::leak above and nothing
            // borrows it any more (the skeleton failed or was dropped).
            drop(unsafe { Box::from_raw(storage.as_ptr()) });
        };
        // SAFETY: the box lives until `Loaded::drop` (or `free` on failure),
        // which first drops the skeleton that borrows it; it is never
        // moved (it is on the heap) and borrowed by nothing else.
        let object: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *storage.as_ptr() };
        let loaded = MemtrailSkelBuilder::default()
            .open(object)
            .map_err(CaptureError::Load)
            .and_then(|mut open| {
                configure(&mut open)?;
                open.load().map_err(CaptureError::Load)
            });
        match loaded {
            Ok(skel) => Ok(Self {
                skel: ManuallyDrop::new(skel),
                storage,
            }),
            Err(err) => {
                free();
                Err(err)
            }
        }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // Every link is closed by now (the object drops after them, in a
        // session and in start-up's `Object`), so no program holds a
        // process any more. A process BPF held at fork (or at a relink)
        // and nobody released is still in `held_for_probes`: its request
        // was left in the ring when the attach worker stopped, or its fork
        // came after (between the pollers' join and the links' close).
        // Resumed here, or it stays stopped for good, and a parent in
        // `vfork` with it (issue 27).
        resume_held_for_probes(&self.skel);
        // SAFETY: dropped once, here, before the storage it borrows.
        unsafe { ManuallyDrop::drop(&mut self.skel) };
        // SAFETY: from Box::leak in `load`; the skeleton is gone.
        drop(unsafe { Box::from_raw(self.storage.as_ptr()) });
    }
}

/// Sends SIGCONT to every process left in BPF's `held_for_probes` map.
fn resume_held_for_probes(skel: &MemtrailSkel<'_>) {
    let Ok(held) = sys::bpf_map_u32_keys(skel.maps.held_for_probes.as_fd()) else {
        return;
    };
    for pid in held {
        tracing::debug!(pid, "resuming a process held for probes nobody made");
        if let Err(err) = sys::kill(pid.into(), sys::Signal::CONT) {
            tracing::debug!(pid, %err, "could not resume a held process (gone?)");
        }
    }
}

/// Every thread of a session. Dropping it stops and joins them all, and
/// resumes whatever the session still holds stopped.
struct Threads {
    barrier: Arc<Barrier>,
    done: Arc<AtomicBool>,
    done_fd: OwnedFd,
    /// Signalled when the pressure coordinator gave up (a late episode).
    failed_fd: Arc<OwnedFd>,
    stops: Arc<Stops>,
    tids: Arc<ThreadIds>,
    started: usize,
    events: Option<JoinHandle<Finished<EventSink, EventsRing>>>,
    stacks: Option<JoinHandle<Finished<StackSink>>>,
    mappings: Option<JoinHandle<Finished<MappingSink>>>,
    attach: Option<JoinHandle<Finished<AttachWorker>>>,
    pressure: Option<JoinHandle<Result<PressureStats, PressureError>>>,
}

/// What the pollers handed back.
struct Joined {
    events: Finished<EventSink, EventsRing>,
    stacks: Finished<StackSink>,
    mappings: Finished<MappingSink>,
    attach: Finished<AttachWorker>,
}

impl Threads {
    /// Stops the coordinator; its result (None if it was not started).
    fn stop_pressure(
        &mut self,
    ) -> Option<std::thread::Result<Result<PressureStats, PressureError>>> {
        self.done.store(true, Ordering::Release);
        sys::eventfd_signal(self.done_fd.as_fd());
        self.pressure.take().map(JoinHandle::join)
    }

    /// Stops and joins the pollers; None if one panicked or was not started.
    fn join_pollers(&mut self) -> Option<Joined> {
        self.barrier.stop();
        let events = self.events.take().map(JoinHandle::join);
        let stacks = self.stacks.take().map(JoinHandle::join);
        let mappings = self.mappings.take().map(JoinHandle::join);
        let attach = self.attach.take().map(JoinHandle::join);
        Some(Joined {
            events: events?.ok()?,
            stacks: stacks?.ok()?,
            mappings: mappings?.ok()?,
            attach: attach?.ok()?,
        })
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        let _ = self.stop_pressure();
        let _ = self.join_pollers();
        // Nothing of the tree may stay stopped, whatever happened.
        let _ = self.stops.resume_everything();
    }
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
    loaded: Loaded,
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
    skipped_images: Vec<crate::report::SkippedImage>,
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
    unwind: crate::unwind::Mode,
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

/// What the session needs to make the command's probes on libc.
struct FirstProbes {
    registry: attach::per_process::Shared,
    progs: attach::AllocPrograms,
    libc: (u64, u64),
}

// SAFETY: the BPF object is only touched through `&mut self` (start,
// finish, drop); libbpf objects are not tied to the thread that made them.
// The `&self` methods (snapshot, regions) use only the control mailbox and
// the barrier, which are Sync.
unsafe impl Send for Session {}
// SAFETY: as above.
unsafe impl Sync for Session {}

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
    pub slow_probes: Vec<crate::report::SlowProbe>,
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

    /// [`start`](Self::start), streaming every event to `stream`.
    pub(crate) fn start_with(
        opts: &SessionOptions,
        target: Target,
        stream: Option<EventWriter>,
    ) -> Result<Self, CaptureError> {
        opts.validate(&target)?;
        let per_process = opts
            .probes
            .per_process(!matches!(target, Target::Command(_)))?;
        let mut sessions = attach::uprobe_sessions();
        let mut phases = phases::Phases::new("start-up");
        let spec = match &target {
            Target::Command(argv) => Some(CommandSpec::new(argv.clone())?),
            _ => None,
        };
        let is_self = target == Target::SelfProcess;
        let cpus = libbpf_rs::num_possible_cpus().map_or(1, |n| n as u64);
        let rings = opts.event_rings.layout(opts.ring_size, cpus as usize);
        if let Some(online) = rings.per_cpu {
            tracing::debug!(
                rings = cpus,
                online,
                bytes_each = rings.each,
                "events rings per CPU"
            );
        }
        let rooms = crate::capture::ring_rooms(rings.each, rings.per_cpu, opts.stack_ring_size);
        if opts.pressure_timeout.enabled() {
            pressure::check_room(&rooms, opts.watermark_percent, cpus, false)?;
        }
        crate::capture::check_environment()?;
        // An existing process is not moved into a cgroup of ours: it is
        // paused with SIGSTOP. The cgroup is made once the guardian runs.
        let place = if opts.pressure_timeout.enabled() && spec.is_some() && !opts.faults.no_cgroup {
            CgroupPlace::locate().map_err(no_freezer).ok()
        } else {
            None
        };
        if place.is_some() {
            pressure::check_room(&rooms, opts.watermark_percent, cpus, true)?;
        }
        // A process that exists already is looked at before the object
        // loads: its pid must still name it.
        let pidfd = match target {
            Target::Pid(pid) => Some(open_running(pid)?),
            _ => None,
        };

        // The up-front images' entry points and tables are prepared while
        // the kernel verifies the programs.
        let with_tables = opts.unwind.uses_tables() && opts.stack_depth > 0;
        let preparing = upfront::Preparing::start(with_tables);
        // So are the files every capture symbolizes: libc and the command
        // (not in a process tracking itself, where a thread of its own
        // would be tracked).
        let symbols = if target == Target::SelfProcess {
            crate::symbolize::Background::in_place()
        } else {
            crate::symbolize::Background::start(
                (opts.stack_depth > 0)
                    .then(|| {
                        let command = spec
                            .as_ref()
                            .and_then(|s| std::fs::canonicalize(&s.path).ok());
                        attach::libc_path().ok().into_iter().chain(command)
                    })
                    .into_iter()
                    .flatten()
                    .collect(),
            )
        };
        // The events rings are made while the kernel verifies the
        // programs, and inserted after (see `event_rings` in the BPF).
        // The array of rings is made here and the object reuses it; the
        // rings are made and inserted on a thread while the kernel
        // verifies (each insertion waits for an RCU grace period).
        let outer = make_ring_array(rings.sizes.len())?;
        let making_rings = Background::spawn("memtrail-mkring", {
            let sizes = rings.sizes.clone();
            let outer = libbpf_rs::MapHandle::try_from(&outer);
            move || make_event_rings(&sizes, &outer.map_err(CaptureError::Load)?)
        });
        let configure = |open: &mut OpenMemtrailSkel<'_>, sessions: bool| {
            // Its size and template come with it.
            open.maps
                .event_rings
                .reuse_fd(outer.as_fd())
                .map_err(CaptureError::Load)?;
            open.maps
                .stacks
                .set_max_entries(opts.stack_ring_size as u32)
                .map_err(CaptureError::Load)?;
            // Stops and resumes by others (and, with per-process probes,
            // resumes of processes held at fork); a process tracking itself
            // is never stopped.
            open.progs.signal_generate.set_autoload(!is_self);
            // One set of allocator programs: the session program or the
            // split ones.
            open.progs.alloc_session.set_autoload(sessions);
            for prog in [
                &mut open.progs.alloc_enter,
                &mut open.progs.alloc_return,
                &mut open.progs.free_enter,
            ] {
                prog.set_autoload(!sessions);
            }
            let mappings = u64::from(open.maps.mappings.max_entries());
            let attach = u64::from(open.maps.attach_requests.max_entries());
            let ro = open
                .maps
                .rodata_data
                .as_deref_mut()
                .expect("the BPF object has .rodata tunables");
            let mark = |size: u64| pressure::watermark_bytes(size, opts.watermark_percent);
            ro.stack_depth = opts.stack_depth;
            ro.unwind_mode = opts.unwind.raw();
            ro.pressure_enabled = opts.pressure_timeout.enabled();
            // In a PID namespace of its own (a container), BPF reports ids
            // as memtrail sees them.
            if let Some(ino) = sys::pid_namespace().filter(|&ino| ino != sys::INIT_PID_NS_INO) {
                ro.pidns_translate = true;
                ro.pidns_ino = ino;
            }
            ro.attach_hold = !is_self;
            ro.per_process = per_process;
            ro.memtrail_tgid = std::process::id();
            ro.threads_excluded = is_self;
            for (i, room) in rooms.iter().enumerate() {
                ro.ring_capacity[i] = room.capacity;
                ro.ring_record[i] = room.record;
                let producers = if room.per_cpu.is_some() { 1 } else { cpus };
                ro.ring_freeze_room[i] = pressure::freeze_room(producers);
            }
            if opts.faults.one_thread_slot {
                ro.thread_slot_mask = 0;
            }
            if opts.faults.one_row_cache_slot {
                ro.row_cache_mask = 0;
            }
            ro.fault_find_vma_busy = opts.faults.find_vma_busy;
            ro.cpu_rings = rings.per_cpu.is_some();
            ro.event_ring_count = rings.sizes.len() as u32;
            ro.watermark_events = mark(rings.each as u64);
            ro.watermark_stacks = mark(opts.stack_ring_size as u64);
            ro.watermark_mappings = mark(mappings);
            ro.watermark_attach = mark(attach);
            Ok(())
        };
        let mut loaded = match Loaded::load(|open| configure(open, sessions)) {
            // A kernel that refuses the session program (its session kfunc
            // gone or changed again) gets the split programs.
            Err(CaptureError::Load(err)) if sessions => {
                tracing::debug!(%err, "the uprobe session program did not load: the split programs instead");
                sessions = false;
                Loaded::load(|open| configure(open, sessions))?
            }
            loaded => loaded?,
        };
        phases.done("BPF programs loaded and verified");
        // The tracepoints first: the guardian holds sched_exit's link.
        let mut links = Links::default();
        let exit_link = crate::capture::attach_tracepoints(&loaded.skel, &mut links, !is_self)?;
        phases.done("tracepoints attached");
        // Before any process can be stopped and before the cgroup exists:
        // the guardian resumes the tree and removes the cgroup if memtrail
        // dies, however it dies. A process tracking itself is never
        // stopped.
        let guardian = if is_self {
            None
        } else {
            let maps = &loaded.skel.maps;
            sys::Guardian::spawn(
                &sys::GuardianMaps {
                    tracked: maps.tracked.as_fd(),
                    foreign_stops: maps.foreign_stops.as_fd(),
                    exit_link: Some(exit_link.as_fd()),
                },
                place.as_ref().map(CgroupPlace::for_guardian).as_ref(),
            )?
        };
        drop(exit_link);
        let cgroup = place
            .and_then(|place| place.create().map_err(no_freezer).ok())
            .map(Arc::new);
        if opts.faults.stop_after_cgroup && cgroup.is_some() {
            sys::stop_self();
        }
        phases.done("guardian");
        let event_ring_maps = match making_rings.join() {
            Some(made) => made?,
            None => make_event_rings(&rings.sizes, &outer)?,
        };
        drop(outer);
        phases.done("events rings made and inserted");
        // The large rings are mapped on a thread while the up-front images
        // are probed (after the guardian's fork, which would wait for the
        // mapping's hold on the address space): the kernel inserts every
        // page of a ring at mmap (~10 ms for the 16 MiB events ring and the
        // 4 MiB stack ring). The stack ring first, then the events rings.
        let ring_fd = |fd: BorrowedFd<'_>, size: u32| {
            fd.try_clone_to_owned()
                .map(|fd| (fd, size as usize))
                .map_err(|source| CaptureError::Io {
                    what: "duplicating a BPF map descriptor",
                    source,
                })
        };
        let mut big_rings = vec![ring_fd(
            loaded.skel.maps.stacks.as_fd(),
            loaded.skel.maps.stacks.max_entries(),
        )?];
        for (ring, &size) in event_ring_maps.iter().zip(&rings.sizes) {
            big_rings.push(ring_fd(ring.as_fd(), size as u32)?);
        }
        let map_rings = |rings: &[(OwnedFd, usize)]| -> Result<Vec<RingConsumer>, RingError> {
            rings
                .iter()
                .map(|(fd, size)| RingConsumer::new(fd.as_fd(), *size))
                .collect()
        };
        let mapping_rings = Background::spawn("memtrail-rings", {
            let fds: Option<Vec<_>> = big_rings
                .iter()
                .map(|(fd, size)| fd.try_clone().ok().map(|fd| (fd, *size)))
                .collect();
            move || fds.map(|fds| map_rings(&fds))
        });
        let skel = &mut *loaded.skel;
        let bss = skel
            .maps
            .bss_data
            .as_deref_mut()
            .expect("the BPF object has a .bss");
        bss.pressure_freeze = cgroup.is_some();
        // The safety net's protectors: memtrail, and its guardian if any.
        bss.guardian_tgid = guardian.as_ref().map_or(0, |g| g.pid().get());
        bss.protectors = 1 + u64::from(guardian.is_some());
        let latch_word: *mut u64 = &raw mut bss.pressure_latch;
        let unrecorded_word: *mut u64 = &raw mut bss.hard_stops_unrecorded;
        let sleeping: Vec<*mut u64> = bss.sleeping.iter_mut().map(std::ptr::from_mut).collect();

        // libc is probed up front (every command loads it), and so are the
        // images a running process has mapped; other images as the attach
        // worker meets them (the C++ runtimes and the image cache's from
        // what was examined up front, see `deferred` below).
        let progs =
            attach::AllocPrograms::memtrail(skel, sessions).map_err(|source| CaptureError::Io {
                what: "duplicating BPF program descriptors",
                source,
            })?;
        let mut tables = crate::capture::unwind_tables(skel, opts.unwind, opts.stack_depth);
        let mut sites = Vec::new();
        let mut slots = attach::HitSlots::default();
        let mut known = HashSet::new();
        let mut cached = Vec::new();
        // With per-process probes, images are recorded here and probed for
        // each process that maps them (a running target's right below).
        let mut registry = per_process.then(attach::per_process::PerProcess::new);
        let known_fd = skel.maps.known_images.as_fd();
        let mut libc_id = None;
        // libc, the C++ runtimes and the dynamic loader (images known up
        // front are never held, so this is their only chance to get their
        // tables).
        let upfront::Prepared {
            images,
            image_cache,
        } = preparing.finish(with_tables)?;
        phases.done("up-front images prepared");
        // System-wide, images with allocator sites other than libc (the C++
        // runtimes, the image cache's) are linked when a tracked process
        // first maps them (held, by the attach worker, from what was
        // prepared here), not up front: the kernel detaches links one after
        // another, each after grace periods of its own (~20 ms), and a C
        // program's capture waited for libstdc++'s. Not in a session on
        // its own process, which is not held while the worker links.
        let defer = registry.is_none() && !is_self;
        let mut deferred: HashMap<(u64, u64), Vec<attach::Site>> = HashMap::new();
        for (nth, image) in images.into_iter().enumerate() {
            if image.why == upfront::Why::Cached {
                cached.push(image);
                continue;
            }
            let mut link_later = false;
            if let Some(found) = image.sites {
                let mut found = found?;
                match (&mut registry, image.id) {
                    (Some(registry), Some(id)) if !found.is_empty() => {
                        slots.assign(&mut found);
                        registry.add_image(id, &image.path, &found)?;
                        // libc comes first.
                        if image.why == upfront::Why::Runtime {
                            libc_id.get_or_insert(id);
                        }
                    }
                    // images[0] is libc (upfront::prepare).
                    (None, Some(id)) if defer && nth > 0 && !found.is_empty() => {
                        deferred.insert(id, found);
                        link_later = true;
                    }
                    _ => {
                        attach::attach_sites(&progs, &mut found, &mut slots, &mut links)?;
                        sites.extend(found);
                    }
                }
            }
            let Some(id) = image.id else { continue };
            if let (Some(tables), Some(table)) = (&mut tables, image.table) {
                tables.load_prepared(&image.path, id, table);
            }
            if image.why == upfront::Why::Runtime && !link_later {
                known_everywhere(&registry, known_fd, id)?;
                known.insert(id);
            }
        }
        // Loads an image's unwind table.
        let mut load_table = |image: &std::path::Path, id: (u64, u64)| {
            if let Some(tables) = &mut tables {
                tables.load(image, image, id);
            }
        };
        let running = match target {
            Target::SelfProcess => Some(std::process::id()),
            Target::Pid(pid) => Some(pid),
            Target::Command(_) => None,
        };
        let mut skipped_images = Vec::new();
        if let Some(pid) = running {
            for image in mapped_images(pid) {
                let Ok(id) = sys::kernel_file_id(&image) else {
                    continue;
                };
                // An image probed per process already (libc, the runtimes).
                if let Some(registry) = registry.as_mut().filter(|r| r.has_image(id)) {
                    registry.link(&progs, known_fd, pid, id)?;
                    continue;
                }
                if known.contains(&id) {
                    continue;
                }
                if let Some(mut found) = deferred.remove(&id) {
                    attach::attach_sites(&progs, &mut found, &mut slots, &mut links)?;
                    sites.extend(found);
                    known_everywhere(&registry, known_fd, id)?;
                    known.insert(id);
                    continue;
                }
                let probed = attach::capture_sites(&image, with_tables).and_then(|mut f| {
                    match &mut registry {
                        Some(registry) if !f.is_empty() => {
                            slots.assign(&mut f);
                            registry.add_image(id, &image, &f)?;
                            registry.link(&progs, known_fd, pid, id)?;
                        }
                        // All of an image's links or none (a skipped one).
                        _ => {
                            let mut made = Links::default();
                            attach::attach_sites(&progs, &mut f, &mut slots, &mut made)?;
                            links.append(&mut made);
                        }
                    }
                    Ok(f)
                });
                match probed {
                    Ok(found) => {
                        sites.extend(found);
                        load_table(&image, id);
                    }
                    Err(err) => {
                        if matches!(err, attach::AttachError::NotElf { .. }) {
                            tracing::info!(image = %image.display(), "not an ELF image: nothing to probe");
                        } else {
                            tracing::warn!(image = %image.display(), %err, "a mapped image could not be probed");
                        }
                        if let Some(reason) = err.skip_reason() {
                            // Its probes could not be made: no process
                            // gets any (a fork would fail to).
                            if let Some(registry) = registry.as_mut() {
                                registry.remove_image(id);
                            }
                            skipped_images.push(crate::report::SkippedImage {
                                image: image.display().to_string(),
                                pid,
                                reason,
                            });
                        } else {
                            load_table(&image, id);
                        }
                    }
                }
                known_everywhere(&registry, known_fd, id)?;
                known.insert(id);
            }
        }
        phases.done("known images probed, their unwind tables loaded");
        for image in cached {
            let Some(id) = image.id else { continue };
            if known.contains(&id) {
                continue;
            }
            // The image cache's tables (newest first) take at most half of
            // the rows; the other half stays for the images the tree maps
            // that no capture examined yet, its own program often among
            // them (a cache full of other programs' tables once left it
            // none). An image past that is left to be examined, held, if
            // a process maps it: it gets its table then.
            if let (Some(tables), Some(_)) = (&tables, &image.table)
                && tables.rows_used() >= crate::unwind::CACHED_ROWS
            {
                tracing::debug!(image = %image.path.display(), "cached image left to be examined when mapped: the cache's half of the unwind rows is taken");
                continue;
            }
            let mut link_later = false;
            if let Some(found) = image.sites {
                let placed = found.and_then(|mut found| {
                    match &mut registry {
                        // Linked when mapped, as the C++ runtimes above.
                        None if defer && !found.is_empty() => {
                            deferred.insert(id, found);
                            link_later = true;
                            return Ok(());
                        }
                        Some(registry) if !found.is_empty() => {
                            slots.assign(&mut found);
                            registry.add_image(id, &image.path, &found)?;
                        }
                        None => attach::attach_sites(&progs, &mut found, &mut slots, &mut links)?,
                        _ => {}
                    }
                    sites.extend(found);
                    Ok(())
                });
                if let Err(err) = placed {
                    tracing::debug!(image = %image.path.display(), %err, "cached image not probed up front");
                    continue;
                }
            }
            if let (Some(tables), Some(table)) = (&mut tables, image.table) {
                tables.load_prepared(&image.path, id, table);
            }
            if !link_later {
                known_everywhere(&registry, known_fd, id)?;
                known.insert(id);
            }
        }
        phases.done("cached images probed, their unwind tables loaded");
        for site in sites.iter().filter(|s| !s.emulated) {
            tracing::info!(%site, "probe site single-steps its first instruction (~14 µs a hit)");
        }

        // From here on every thread started is in `threads`, declared
        // after `loaded`: any return joins them before the object goes.
        let barrier = Barrier::new(4).map_err(|source| CaptureError::Io {
            what: "creating the pipeline barrier",
            source,
        })?;
        let stops = Arc::new(Stops::new());
        // A stop someone else made is theirs to end: releases leave such
        // processes stopped.
        stops.set_foreign_stops(
            skel.maps
                .foreign_stops
                .as_fd()
                .try_clone_to_owned()
                .map_err(|source| CaptureError::Io {
                    what: "duplicating a BPF map descriptor",
                    source,
                })?,
        );
        let mut threads = Threads {
            barrier: barrier.clone(),
            done: Arc::new(AtomicBool::new(false)),
            done_fd: sys::eventfd()?,
            failed_fd: Arc::new(sys::eventfd()?),
            stops: stops.clone(),
            tids: Arc::new(ThreadIds::default()),
            started: 0,
            events: None,
            stacks: None,
            mappings: None,
            attach: None,
            pressure: None,
        };
        let control = Arc::new(Control::default());
        let maps = &skel.maps;
        let deep = |ring: usize, maps: &[BorrowedFd<'_>]| {
            // SAFETY: the .bss mapping lives with `loaded`, which outlives
            // the pollers (`threads` joins them first, see above).
            let flag = unsafe { SleepFlag::new(sleeping[ring]) };
            DeepSleep::new(flag, maps, barrier.kick_fd()).map_err(|source| CaptureError::Io {
                what: "setting up a poller's deep sleep",
                source,
            })
        };
        let cores = engine::poller_cores(4);
        let spawn_err = |source| CaptureError::Io {
            what: "starting a poller thread",
            source,
        };
        let mut mapped = match mapping_rings.join().flatten() {
            Some(mapped) => mapped?,
            None => map_rings(&big_rings)?,
        }
        .into_iter();
        let Some(stacks_ring) = mapped.next() else {
            unreachable!("the stack ring is mapped");
        };
        let events_ring = if rings.per_cpu.is_some() {
            EventsRing::PerCpu(Merged::new(mapped.collect()))
        } else {
            let Some(ring) = mapped.next() else {
                unreachable!("the events ring is mapped");
            };
            EventsRing::One(ring)
        };
        let event_fds: Vec<BorrowedFd<'_>> = event_ring_maps.iter().map(AsFd::as_fd).collect();
        let mut agg = if opts.timeline {
            Aggregator::new()
        } else {
            Aggregator::without_timeline()
        };
        agg.set_direct_syscall_sites(opts.stack_depth != 0);
        // No exec or fork record will name a process that runs already.
        if let Some(pid) = running {
            let (ppid, exe) = running_identity(pid);
            agg.add_running(pid, ppid, &exe, sys::monotonic_ns());
        }
        let mut event_sink = EventSink::new(agg, stream);
        event_sink.regions = Some(Regions::new(control.clone()));
        event_sink.live = opts.live.clone().map(|live| (live, 0));
        threads.events = Some(
            engine::spawn(
                Pipeline {
                    name: "events",
                    ring: events_ring,
                    sink: event_sink,
                    fault: opts.faults.events,
                    deep_sleep: Some(deep(0, &event_fds)?),
                    paced: true,
                },
                barrier.clone(),
                0,
                cores[0],
                threads.tids.clone(),
            )
            .map_err(spawn_err)?,
        );
        threads.started += 1;
        threads.stacks = Some(
            engine::spawn(
                Pipeline {
                    name: "stacks",
                    ring: stacks_ring,
                    sink: StackSink::default(),
                    fault: opts.faults.stacks,
                    deep_sleep: Some(deep(1, &[maps.stacks.as_fd()])?),
                    paced: true,
                },
                barrier.clone(),
                1,
                cores[1],
                threads.tids.clone(),
            )
            .map_err(spawn_err)?,
        );
        threads.started += 1;
        let mut mapping_sink = MappingSink::default();
        if let Some(pid) = running {
            mapping_sink.scan_proc(pid);
        }
        threads.mappings = Some(
            engine::spawn(
                Pipeline {
                    name: "mappings",
                    ring: RingConsumer::new(
                        maps.mappings.as_fd(),
                        maps.mappings.max_entries() as usize,
                    )?,
                    sink: mapping_sink,
                    fault: Fault::None,
                    deep_sleep: Some(deep(2, &[maps.mappings.as_fd()])?),
                    paced: false,
                },
                barrier.clone(),
                2,
                cores[2],
                threads.tids.clone(),
            )
            .map_err(spawn_err)?,
        );
        threads.started += 1;
        let dup = |fd: std::os::fd::BorrowedFd<'_>| {
            fd.try_clone_to_owned().map_err(|source| CaptureError::Io {
                what: "duplicating a BPF map descriptor",
                source,
            })
        };
        let registry = registry.map(|r| Arc::new(Mutex::new(r)));
        let first_probes = match (&registry, libc_id, &target) {
            (Some(registry), Some(libc), Target::Command(_)) => Some(FirstProbes {
                registry: registry.clone(),
                progs: attach::AllocPrograms::memtrail(skel, sessions).map_err(|source| {
                    CaptureError::Io {
                        what: "duplicating BPF program descriptors",
                        source,
                    }
                })?,
                libc,
            }),
            _ => None,
        };
        let mut worker = AttachWorker::new(
            progs,
            dup(maps.known_images.as_fd())?,
            known,
            stops.clone(),
            tables,
            slots,
            registry,
        );
        worker.held_for_probes = Some(dup(maps.held_for_probes.as_fd())?);
        worker.deferred = deferred;
        worker.hold = !is_self;
        threads.attach = Some(
            engine::spawn(
                Pipeline {
                    name: "attach",
                    ring: RingConsumer::new(
                        maps.attach_requests.as_fd(),
                        maps.attach_requests.max_entries() as usize,
                    )?,
                    sink: worker,
                    fault: Fault::None,
                    deep_sleep: Some(deep(3, &[maps.attach_requests.as_fd()])?),
                    paced: false,
                },
                barrier.clone(),
                3,
                cores[3],
                threads.tids.clone(),
            )
            .map_err(spawn_err)?,
        );
        threads.started += 1;
        let wake_epoll = sys::epoll_for(&[
            (maps.pressure_wake.as_fd(), false),
            (threads.done_fd.as_fd(), false),
        ])?;
        let coordinator = Coordinator {
            wake: RingConsumer::new(
                maps.pressure_wake.as_fd(),
                maps.pressure_wake.max_entries() as usize,
            )?,
            wake_epoll,
            // SAFETY: `loaded` (and so its .bss mapping) outlives the
            // coordinator thread, which `threads` joins first.
            latch: unsafe { Latch::new(latch_word) },
            tracked_map: dup(maps.tracked.as_fd())?,
            stops: stops.clone(),
            barrier: barrier.clone(),
            pipelines: crate::capture::PIPELINES.to_vec(),
            live: opts.live.clone(),
            timeout: opts.pressure_timeout,
            pause: match &cgroup {
                Some(cgroup) => Pause::Freeze {
                    cgroup: cgroup.clone(),
                    hard_stops: dup(maps.hard_stops.as_fd())?,
                    // SAFETY: as for the latch.
                    unrecorded: unsafe { BssWord::new(unrecorded_word) },
                },
                None => Pause::Signal,
            },
            done: threads.done.clone(),
            // A process memtrail did not start is never killed.
            kill_on_failure: !matches!(target, Target::Pid(_)),
            fault: opts.faults.pressure,
        };
        let tids = threads.tids.clone();
        let failed_fd = threads.failed_fd.clone();
        threads.pressure = Some(
            std::thread::Builder::new()
                .name("memtrail-pressure".into())
                .spawn(move || {
                    tids.add_current();
                    let result = coordinator.run();
                    if result.is_err() {
                        sys::eventfd_signal(failed_fd.as_fd());
                    }
                    result
                })
                .map_err(|source| CaptureError::Io {
                    what: "starting the pressure coordinator",
                    source,
                })?,
        );
        threads.started += 1;
        if opts.faults.fail_after_start {
            return Err(CaptureError::Injected);
        }

        let mut session = Session {
            threads,
            links,
            loaded,
            control,
            ops: Mutex::new(()),
            target: target.clone(),
            root: None,
            pidfd,
            cgroup,
            _guardian: guardian,
            sites,
            skipped_images,
            image_cache,
            symbols,
            start_ns: sys::monotonic_ns(),
            command: Vec::new(),
            rooms,
            opts_pressure: opts.pressure_timeout,
            opts_watermark: opts.watermark_percent,
            unwind: opts.unwind,
            first_probes,
            per_process,
            event_ring_maps,
        };
        match target {
            Target::Command(argv) => {
                session.command = argv
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect();
                let spec = spec.expect("resolved above");
                phases.done("pollers and coordinator started");
                session.start_command(&spec, opts.process_effects)?;
                phases.done("command started");
            }
            Target::SelfProcess | Target::Pid(_) => {
                let pid = running.expect("a running target");
                session.command = vec![running_identity(pid).1];
                let own = if is_self {
                    session.threads.tids.wait_for(session.threads.started)
                } else {
                    Vec::new()
                };
                phases.done("pollers and coordinator started");
                session.track_running(pid, &own)?;
                phases.done("running process tracked");
            }
        }
        Ok(session)
    }

    /// Starts the command held, tracks it and lets it exec.
    fn start_command(&mut self, spec: &CommandSpec, effects: bool) -> Result<(), CaptureError> {
        if effects {
            // memtrail stays alive for Ctrl-C and Ctrl-\: the command decides.
            sys::ignore_signal(libc::SIGINT)?;
            sys::ignore_signal(libc::SIGQUIT)?;
            // SIGTERM or SIGHUP during the set-up: give up before anything
            // runs. One that comes from here on is passed on to the command.
            if let Some(sig) = sys::signals::termination() {
                return Err(CaptureError::Interrupted(sig));
            }
        }
        let held = proctree::spawn_held(spec, effects)?;
        let pid = held.pid();
        if let Some(first) = self.first_probes.take() {
            let known = self.loaded.skel.maps.known_images.as_fd();
            attach::per_process::lock(&first.registry).link(
                &first.progs,
                known,
                pid,
                first.libc,
            )?;
        }
        // From here a drop kills and reaps the child, whatever happens.
        self.root = Some(Root {
            pid,
            exit: None,
            forward: None,
        });
        let skel = &mut *self.loaded.skel;
        skel.maps
            .bss_data
            .as_deref_mut()
            .expect("the BPF object has a .bss")
            .tree_threads = 1;
        if effects {
            // Until the whole tree is waited for: SIGTERM, SIGHUP, SIGUSR1
            // and SIGUSR2 reach the command. On failure, dropping `held`
            // closes the go pipe: the child exits unexec'd.
            let forward = sys::signals::Forward::new(pid.into())?;
            if let Some(root) = &mut self.root {
                root.forward = Some(forward);
            }
        }
        skel.maps
            .tracked
            .update(
                &pid.to_ne_bytes(),
                &0u32.to_ne_bytes(),
                libbpf_rs::MapFlags::ANY,
            )
            .map_err(CaptureError::Load)?;
        if let Some(cg) = &self.cgroup {
            cg.add(pid)
                .map_err(|e| CaptureError::Pressure(PressureError::Cgroup(e)))?;
        }
        self.start_ns = sys::monotonic_ns();
        held.release()?;
        Ok(())
    }

    /// Tracks the threads of running process `pid` but `own` (the
    /// session's), and what they start from now on.
    fn track_running(&mut self, pid: u32, own: &[u32]) -> Result<(), CaptureError> {
        let skel = &mut *self.loaded.skel;
        for tid in own {
            skel.maps
                .excluded_threads
                .update(
                    &tid.to_ne_bytes(),
                    &1u32.to_ne_bytes(),
                    libbpf_rs::MapFlags::ANY,
                )
                .map_err(CaptureError::Load)?;
        }
        let mut given: HashSet<u32> = own.iter().copied().collect();
        let value = vec![0u8; skel.maps.inflight.value_size() as usize];
        let give = |tid: u32| -> Result<(), CaptureError> {
            let fd = match sys::pidfd_open_thread(tid.into()) {
                Ok(fd) => fd,
                // Exited meanwhile.
                Err(err) if err.errno() == Some(libc::ESRCH) => return Ok(()),
                Err(err) => return Err(err.into()),
            };
            skel.maps
                .inflight
                .update(
                    &fd.as_raw_fd().to_ne_bytes(),
                    &value,
                    libbpf_rs::MapFlags::NO_EXIST,
                )
                .map_err(CaptureError::Load)
        };
        let mut threads = 0u64;
        for tid in thread_ids(pid) {
            if given.insert(tid) {
                give(tid)?;
                threads += 1;
            }
        }
        skel.maps
            .tracked
            .update(
                &pid.to_ne_bytes(),
                &0u32.to_ne_bytes(),
                libbpf_rs::MapFlags::ANY,
            )
            .map_err(CaptureError::Load)?;
        // Stopped by someone else before memtrail came (`kill -STOP`, a
        // debugger): theirs to resume, not memtrail's (issue 28). Tracked
        // first, so that a SIGCONT from now on clears the mark (BPF's
        // signal_generate); looked at again after marking, for one that
        // came in between.
        let stopped = |pid: u32| {
            sys::thread_states(pid.into()).is_ok_and(|t| t.stopped > 0 || t.stop_pending)
        };
        if stopped(pid) {
            let foreign = skel.maps.foreign_stops.as_fd();
            sys::bpf_map_update(foreign, &pid.to_ne_bytes(), &[1])?;
            if !stopped(pid) {
                sys::bpf_map_delete(foreign, &pid.to_ne_bytes())?;
            }
        }
        // Threads started between the listing and `tracked`: their parent
        // had state, but the process was not tracked yet (see sched_fork).
        for tid in thread_ids(pid) {
            if given.insert(tid) {
                give(tid)?;
                threads += 1;
            }
        }
        skel.maps
            .bss_data
            .as_deref_mut()
            .expect("the BPF object has a .bss")
            .tree_threads = threads;
        self.start_ns = sys::monotonic_ns();
        Ok(())
    }

    /// Removes every process from `tracked`, so that BPF ignores them from
    /// now on; returns their pids. A process forked meanwhile by one still
    /// tracked is listed and removed in the next round.
    fn untrack_all(&mut self) -> Result<Vec<u32>, CaptureError> {
        let tracked = self.loaded.skel.maps.tracked.as_fd();
        let mut all = Vec::new();
        loop {
            let pids = sys::bpf_map_u32_keys(tracked)?;
            if pids.is_empty() {
                return Ok(all);
            }
            for pid in pids {
                // ENOENT: its exit removed it meanwhile.
                let _ = sys::bpf_map_delete(tracked, &pid.to_ne_bytes());
                all.push(pid);
            }
        }
    }

    /// After `pids` left `tracked`, with pausing on: stops each of them and
    /// waits until it has stopped, holding it until the pollers are joined
    /// (the release is `resume_everything`'s, on every path). A producer
    /// past a ring's watermark stops its own process (check_pressure in
    /// bpf/memtrail.bpf.c), and one that saw the process tracked just
    /// before it left `tracked` can still do so, with no coordinator left
    /// to resume it. Once every thread has stopped, none is inside a BPF
    /// program, so no such stop can come any more, and the one SIGCONT of
    /// the release discards any that is pending.
    fn settle(&self, pids: &[u32]) {
        use crate::proctree::stops::Owner;
        let stops = &self.threads.stops;
        let deadline = std::time::Instant::now() + SETTLE_TIMEOUT;
        for &pid in pids {
            if let Err(err) = stops.stop(pid.into(), Owner::Pressure) {
                tracing::debug!(pid, %err, "could not stop a process to detach from it");
            }
        }
        for &pid in pids {
            let _ = stops.wait_stopped_until(pid.into(), Some(deadline));
        }
    }

    /// Removes the BPF call state (thread slot or task storage) of every
    /// thread of `pids`: the allocator probes' test of membership (see
    /// task_call in bpf/memtrail.bpf.c), so their calls are not seen any
    /// more.
    fn forget_threads(&mut self, pids: &[u32]) {
        let skel = &mut *self.loaded.skel;
        let mask = skel.maps.rodata_data.map_or(0, |ro| ro.thread_slot_mask);
        let slot_size = skel.maps.thread_slots.value_size() as usize;
        for &pid in pids {
            for tid in thread_ids(pid) {
                if let Ok(fd) = sys::pidfd_open_thread(tid.into()) {
                    let _ = skel.maps.inflight.delete(&fd.as_raw_fd().to_ne_bytes());
                }
                let idx = (tid & mask).to_ne_bytes();
                let held = skel
                    .maps
                    .thread_slots
                    .lookup(&idx, libbpf_rs::MapFlags::ANY)
                    .ok()
                    .flatten()
                    .is_some_and(|slot| slot.get(..8) == Some(&u64::from(tid).to_ne_bytes()[..]));
                if held {
                    let _ = skel.maps.thread_slots.update(
                        &idx,
                        &vec![0u8; slot_size],
                        libbpf_rs::MapFlags::ANY,
                    );
                }
            }
        }
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

    /// Ends the capture: stops tracking, drains every ring, joins the
    /// threads and builds the profile. Call [`wait`](Self::wait) first to
    /// capture a command to its end; otherwise the profile holds what the
    /// tree did so far.
    pub fn finish(mut self) -> Result<Finish, CaptureError> {
        let mut phases = phases::Phases::new("finish");
        // A running process memtrail attached to keeps running: BPF lets go
        // of it first (no event, no stop, no attach hold from here on).
        let detached = match self.target {
            Target::Pid(_) => self.untrack_all()?,
            _ => Vec::new(),
        };
        let pressure = self.threads.stop_pressure();
        if !detached.is_empty() {
            if self.opts_pressure.enabled() {
                self.settle(&detached);
            }
            self.forget_threads(&detached);
        }
        let mut pressure_stats = match pressure {
            Some(Ok(Ok(stats))) => stats,
            Some(Ok(Err(err))) => return Err(CaptureError::Pressure(err)),
            Some(Err(_)) => return Err(CaptureError::PollerPanicked),
            None => PressureStats::default(),
        };
        // The kernel detaches a link in two steps: the breakpoints go at
        // once, then it waits for uprobe handlers to finish everywhere (RCU
        // grace periods: ~100 ms for all the links, closed together). With
        // no process tracked any more (the tree has exited, or a running
        // process was let go above), no probe can change a count or write
        // a record: the links are closed on a thread from here on, while
        // the rings are drained and the profile is built and written,
        // joined when the `Finish` goes (or at once if finish fails). A
        // session still tracking processes (its own, or a tree it did not
        // wait for) detaches here and now, before the drain, so that the
        // counts below are final.
        let untracked = sys::bpf_map_u32_keys(self.loaded.skel.maps.tracked.as_fd())
            .is_ok_and(|pids| pids.is_empty());
        let links = std::mem::take(&mut self.links);
        let detaching = if untracked {
            Some(detach_on_thread(links, None))
        } else {
            drop(links);
            None
        };
        phases.done("detaching started");
        // Whatever happened to the tree, drain and join the pollers.
        let barrier = self.threads.barrier.clone();
        let epoch = barrier.raise();
        let drained = barrier.wait(epoch, Some(crate::capture::DRAIN_TIMEOUT));
        let joined = self.threads.join_pollers();
        let _ = self.threads.stops.resume_everything();
        let Some(Joined {
            events,
            stacks,
            mappings,
            attach: attacher,
        }) = joined
        else {
            return Err(CaptureError::PollerPanicked);
        };
        let seen = HighWater {
            events: events.high_water,
            stacks: stacks.high_water,
            mappings: mappings.high_water,
            attach: attacher.high_water,
        };
        if let EventsRing::PerCpu(merged) = &events.ring {
            tracing::debug!(
                most_held = merged.most_held(),
                "events rings merged (records held at most at once)"
            );
        }
        // Unmapped on the detaching thread, while the outputs are written.
        let rings = (events.ring, [stacks.ring, mappings.ring, attacher.ring]);
        let (events, stacks, mappings, mut attacher) =
            (events.sink, stacks.sink, mappings.sink, attacher.sink);
        let images_seen = attacher
            .tables
            .take()
            .map(|t| t.images_seen)
            .unwrap_or_default();
        let mut sites = std::mem::take(&mut self.sites);
        sites.append(&mut attacher.sites);
        for (path, stamp, has_sites) in attacher.examined.drain(..) {
            self.image_cache.record(&path, stamp, has_sites);
        }
        self.image_cache.save();
        phases.done("drained, pollers joined");
        // The images examined during the run were probed by the attach
        // worker: their links go now, on a thread as the others or, for a
        // tree still tracked, at once.
        let mut links = std::mem::take(&mut attacher.links);
        let unlinking = attacher.per_process.take().map(|shared| {
            let per_process = std::mem::take(&mut *attach::per_process::lock(&shared));
            tracing::debug!(links = per_process.made, "per-process probes made");
            let (mut rest, unlinking) = per_process.into_links();
            links.append(&mut rest);
            unlinking
        });
        let detaching = if untracked {
            Some(detach_on_thread((links, unlinking, rings), detaching))
        } else {
            drop((links, unlinking, rings));
            None
        };
        if let Some(failure) = attacher.failures.into_iter().next() {
            return Err(CaptureError::AttachImage {
                image: failure.image,
                pid: failure.pid,
                source: failure.error,
            });
        }
        if !drained {
            return Err(CaptureError::DrainTimeout(crate::capture::DRAIN_TIMEOUT));
        }
        let end_ns = sys::monotonic_ns();
        let lost = crate::capture::read_lost(&self.loaded.skel);
        if lost.any() {
            let advice = if self.opts_pressure.enabled() {
                let bss = self
                    .loaded
                    .skel
                    .maps
                    .bss_data
                    .as_deref()
                    .expect("the BPF object has a .bss");
                crate::capture::loss_advice(
                    &lost,
                    &self.rooms,
                    self.opts_watermark,
                    bss.tree_threads_peak.max(1),
                )
            } else {
                lost.advice()
            };
            return Err(CaptureError::Lost(lost, advice));
        }
        let EventSink {
            mut agg,
            stream,
            stream_error,
            markers,
            ..
        } = events;
        let malformed = agg.malformed + stacks.malformed + mappings.malformed + attacher.malformed;
        if malformed > 0 {
            return Err(CaptureError::Malformed(malformed));
        }
        agg.finish(end_ns);
        let mut root_exit = self.root.as_ref().and_then(|r| r.exit.flatten());
        if let Some(root) = &self.root {
            agg.set_parent(root.pid, std::process::id());
        }
        // A running process is not memtrail's child: its exit, if it
        // exited while tracked, is the one the exit record gave.
        if let Target::Pid(pid) = self.target {
            root_exit = agg.exit_status(pid).map(|status| match status & 0x7f {
                0 => ChildExit::Exited((status >> 8) & 0xff),
                sig => ChildExit::Signaled(sig),
            });
        }
        let exit = match root_exit {
            Some(ChildExit::Exited(code)) => ExitInfo {
                code: Some(code),
                signal: None,
            },
            Some(ChildExit::Signaled(sig)) => ExitInfo {
                code: None,
                signal: Some(sig),
            },
            None => ExitInfo {
                code: None,
                signal: None,
            },
        };
        let command = std::mem::take(&mut self.command);
        let mut profile =
            Profile::build(&agg, command, exit, (self.start_ns, end_ns), lost, &sites);
        // The probes are detached: the counts are final.
        let hits = attach::read_site_hits(&self.loaded.skel, &sites);
        for (probe, hits) in profile.probes.iter_mut().zip(hits) {
            probe.hits = hits;
        }
        profile.attached = matches!(self.target, Target::Pid(_));
        phases.done("drained, detached, profile built");
        let slow_probes = crate::report::slow_probes(&profile.probes);
        profile.stacks = crate::capture::symbolize_stacks(
            &agg,
            &stacks.stacks,
            mappings.mappings,
            &self.symbols,
        );
        phases.done("stacks symbolized");
        profile.unwind = crate::unwind::report(self.unwind, images_seen, &profile.stacks);
        profile.event_rings = self.event_ring_maps.len() as u32;
        profile.probe_scope = if self.per_process {
            attach::per_process::Scope::PerProcess
        } else {
            attach::per_process::Scope::SystemWide
        };
        pressure_stats.high_water = crate::capture::read_high_water(&self.loaded.skel).max(seen);
        profile.pressure = pressure_stats;
        profile.regions = markers.finish();
        profile.skipped_images = std::mem::take(&mut self.skipped_images);
        profile.skipped_images.append(&mut attacher.skipped);
        Ok(Finish {
            profile,
            slow_probes,
            exit: TreeExit { root: root_exit },
            stream,
            stream_error,
            detaching,
        })
    }
}

/// Records image `id` known to BPF for every process, unless its probes are
/// made per process (each process's then, as it maps it).
fn known_everywhere(
    registry: &Option<attach::per_process::PerProcess>,
    known: std::os::fd::BorrowedFd<'_>,
    id: (u64, u64),
) -> Result<(), CaptureError> {
    if !registry.as_ref().is_some_and(|r| r.has_image(id)) {
        sys::bpf_map_update(known, &attach::known_key(id, 0), &[1])?;
    }
    Ok(())
}

/// Closes `links` on a thread (at once if it cannot start); the thread
/// then waits for `before`, an earlier such thread, so that joining the
/// last joins all.
fn detach_on_thread(links: impl Send + 'static, before: Option<Background<()>>) -> Background<()> {
    Background::spawn("memtrail-detach", move || {
        let started = std::time::Instant::now();
        drop(links);
        if let Some(before) = before {
            drop(before);
            tracing::debug!(
                ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1e3),
                "finish: probes detached (on threads, while the outputs were written)"
            );
        }
    })
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

/// Makes the array of `count` events rings BPF reserves from (see
/// `event_rings` in the BPF), empty.
fn make_ring_array(count: usize) -> Result<libbpf_rs::MapHandle, CaptureError> {
    let page = rustix::param::page_size();
    let template = make_rings(&[page])?;
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
        inner_map_fd: template[0].as_fd().as_raw_fd() as u32,
        ..Default::default()
    };
    libbpf_rs::MapHandle::create(
        libbpf_rs::MapType::ArrayOfMaps,
        Some("event_rings"),
        4,
        4,
        count as u32,
        &opts,
    )
    .map_err(CaptureError::Load)
}

/// Makes the events rings, of `sizes` bytes (one shared, or one per CPU:
/// see [`crate::ring::merge`]), and puts ring `i` at index `i` of `array`.
/// Every single insertion into an array of maps waits for an RCU grace
/// period (~8 ms here); the batch took under 1 ms.
fn make_event_rings(
    sizes: &[usize],
    array: &libbpf_rs::MapHandle,
) -> Result<Vec<libbpf_rs::MapHandle>, CaptureError> {
    let rings = make_rings(sizes)?;
    let keys: Vec<u8> = (0..rings.len() as u32).flat_map(u32::to_ne_bytes).collect();
    let fds: Vec<u8> = rings
        .iter()
        .flat_map(|r| (r.as_fd().as_raw_fd() as u32).to_ne_bytes())
        .collect();
    let batch = array.update_batch(
        &keys,
        &fds,
        rings.len() as u32,
        libbpf_rs::MapFlags::ANY,
        libbpf_rs::MapFlags::ANY,
    );
    if let Err(err) = batch {
        tracing::debug!(%err, "events rings: no batch insertion; one at a time");
        for (key, fd) in keys.chunks(4).zip(fds.chunks(4)) {
            array
                .update(key, fd, libbpf_rs::MapFlags::ANY)
                .map_err(CaptureError::Load)?;
        }
    }
    Ok(rings)
}

/// Makes ring buffers of `sizes` bytes.
fn make_rings(sizes: &[usize]) -> Result<Vec<libbpf_rs::MapHandle>, CaptureError> {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
        ..Default::default()
    };
    sizes
        .iter()
        .map(|&size| {
            libbpf_rs::MapHandle::create(
                libbpf_rs::MapType::RingBuf,
                Some("mt_events"),
                0,
                0,
                size as u32,
                &opts,
            )
            .map_err(CaptureError::Load)
        })
        .collect()
}
