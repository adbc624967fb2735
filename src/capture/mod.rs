//! One capture: load the probes, start the command held, follow its tree,
//! drain the rings, check for loss and build the profile.
//!
//! This is the library entry point the CLI (and later the C ABI) calls.
//! Ownership: the capture owns the BPF skeleton and the probe links (all
//! detached when it returns, whatever the path), the poller thread (joined
//! before it returns) and the output files (committed only on success).

mod sinks;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use libbpf_rs::MapCore;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};

use crate::attach::cache::ImageCache;
use crate::attach::worker::AttachWorker;
use crate::attach::{self, AttachError, Links};
use crate::engine::idle::{DeepSleep, SleepFlag};
use crate::engine::{self, Barrier, Fault, Pipeline};
use crate::pressure::{
    self, BssWord, Coordinator, HighWater, Latch, Pause, PressureError, PressureTimeout, RingRoom,
    RoomError,
};
use crate::proctree::cgroup::TreeCgroup;
use crate::proctree::stops::Stops;
use crate::proctree::{self, CommandSpec, SpawnError};
use crate::report::{
    Aggregator, EventWriter, ExitInfo, LostEvents, OutputError, OutputFile, Profile,
    SameOutputError, StackEntry, StackMetrics,
};
use crate::ring::{RingConsumer, RingError};
use crate::skel::memtrail::{MemtrailSkel, MemtrailSkelBuilder};
use crate::symbolize::{AddressSpaces, StackSymbolizer};
use crate::sys::{self, ChildExit, SysError};

use sinks::{EventSink, MappingSink, Stack, StackSink};

/// Default size of the events ring: 64 MiB absorbs long bursts.
pub const DEFAULT_RING_SIZE: usize = 64 << 20;

/// Default frames per allocation stack.
pub const DEFAULT_STACK_DEPTH: u32 = 127;

/// Frames a stack record holds (`MT_MAX_STACK` in bpf/memtrail.h).
pub const MAX_STACK_DEPTH: u32 = 128;

/// How long the final drain may take before the capture is declared broken.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What to capture and where to write it.
#[derive(Debug, Clone)]
pub struct Options {
    pub command: Vec<OsString>,
    pub output: Option<PathBuf>,
    pub events: Option<PathBuf>,
    /// Whether `output` and `events` may replace existing regular files
    /// (otherwise the capture fails before the command starts).
    pub replace_outputs: bool,
    /// Size in bytes of the events ring (a power of two, at least a page).
    pub ring_size: usize,
    /// Frames captured per allocation stack (0: no stacks), at most
    /// [`MAX_STACK_DEPTH`].
    pub stack_depth: u32,
    /// Size in bytes of the stack ring (a power of two, at least a page).
    pub stack_ring_size: usize,
    /// Backpressure: off (`0`, loss detection only), bounded, or unbounded.
    pub pressure_timeout: PressureTimeout,
    /// Fill of a ring, in percent, past which producers pause the tree.
    pub watermark_percent: u8,
    /// Fault injection for tests.
    pub faults: Faults,
}

/// Test-only fault injection (`MEMTRAIL_FAULT=stall-events,slow-events,
/// wedge-events,stall-stacks,one-thread-slot,no-cgroup` in the CLI; see
/// [`engine::Fault`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub events: Fault,
    pub stacks: Fault,
    /// One thread slot for the whole tree (`thread_slots` in
    /// bpf/memtrail.bpf.c): the other threads keep their state in task
    /// storage, the path a thread takes when its slot is held.
    pub one_thread_slot: bool,
    /// No cgroup for the tree: pressure pauses stop processes with SIGSTOP,
    /// the path taken where there is no usable cgroup v2 freezer.
    pub no_cgroup: bool,
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
            if name == "no-cgroup" {
                faults.no_cgroup = true;
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
         mappings ring, {} attach requests, {} untracked calls or processes): the \
         capture is incomplete and no report was written; {}",
        .0.events, .0.stacks, .0.mappings, .0.attach, .0.tracking, .1
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
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A finished capture.
#[derive(Debug)]
pub struct Outcome {
    pub profile: Profile,
    /// Probe sites the kernel single-steps that the command went through.
    pub slow_probes: Vec<crate::report::SlowProbe>,
    /// The exit code memtrail passes on: the command's, or 128 + signal.
    pub exit_code: i32,
}

/// The capabilities memtrail needs without root, as `setcap` spells them.
/// CAP_SYS_ADMIN can stand for CAP_BPF, CAP_PERFMON and
/// CAP_CHECKPOINT_RESTORE; CAP_DAC_OVERRIDE for CAP_DAC_READ_SEARCH.
pub const CAPABILITIES: &str = "cap_bpf,cap_perfmon,cap_dac_read_search,cap_checkpoint_restore";

/// Checks, before anything is loaded, that memtrail may do what a capture
/// does; names every capability that is missing.
fn check_environment() -> Result<(), CaptureError> {
    const CAP_DAC_OVERRIDE: u32 = 1;
    const CAP_DAC_READ_SEARCH: u32 = 2;
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
    match sys::ensure_tracefs() {
        Ok(()) => {}
        // tracefs is root's alone (mode 0700): its tracepoint ids need
        // CAP_DAC_READ_SEARCH to be read.
        Err(err) if err.errno() == Some(libc::EACCES) => {
            if !has(CAP_DAC_READ_SEARCH) && !has(CAP_DAC_OVERRIDE) {
                missing.push(
                    "CAP_DAC_READ_SEARCH (to read tracepoint ids in tracefs, which only root may search)",
                );
            }
        }
        Err(err) if err.errno() == Some(libc::EPERM) && !admin => missing.push(
            "CAP_SYS_ADMIN to mount tracefs at /sys/kernel/tracing (or mount it as root first)",
        ),
        Err(_) => {
            return Err(CaptureError::KernelFeature {
                feature: "tracefs at /sys/kernel/tracing",
                hint: "mount it (mount -t tracefs nodev /sys/kernel/tracing) or enable \
                       CONFIG_TRACING",
            });
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CaptureError::Privileges(missing))
    }
}

/// Runs one capture.
pub fn run(opts: &Options) -> Result<Outcome, CaptureError> {
    // Everything that can fail on bad input fails before the command runs.
    sys::signals::catch()?;
    let spec = CommandSpec::new(opts.command.clone())?;
    let outputs: Vec<_> = [("--output", &opts.output), ("--events", &opts.events)]
        .into_iter()
        .filter_map(|(flag, path)| Some((flag, path.as_deref()?)))
        .collect();
    crate::report::check_distinct(&outputs)?;
    // Under sudo, the files are the invoking user's, as the command is.
    let owner = spec.creds.as_ref().map(|c| (c.uid, c.gid));
    let create = |path| {
        let out = OutputFile::create_with(path, opts.replace_outputs)?;
        owner.map_or(Ok(()), |owner| out.give_to(owner))?;
        Ok::<_, OutputError>(out)
    };
    let output = opts.output.as_deref().map(create).transpose()?;
    let events = opts.events.as_deref().map(create).transpose()?;
    for size in [opts.ring_size, opts.stack_ring_size] {
        if !size.is_power_of_two() || size < rustix::param::page_size() {
            return Err(RingError::BadSize(size).into());
        }
    }
    if opts.stack_depth > MAX_STACK_DEPTH {
        return Err(CaptureError::StackDepth(opts.stack_depth));
    }
    let rooms = ring_rooms(opts);
    let cpus = libbpf_rs::num_possible_cpus().map_or(1, |n| n as u64);
    if opts.pressure_timeout.enabled() {
        pressure::check_room(&rooms, opts.watermark_percent, cpus)?;
    }
    check_environment()?;
    // The tree's cgroup pauses it unseen; without one, SIGSTOP does.
    let cgroup = if opts.pressure_timeout.enabled() && !opts.faults.no_cgroup {
        match TreeCgroup::create() {
            Ok(cgroup) => Some(Arc::new(cgroup)),
            Err(err) => {
                tracing::info!(
                    error = &err as &(dyn std::error::Error + 'static),
                    "no cgroup freezer: pressure pauses will stop processes with SIGSTOP"
                );
                None
            }
        }
    } else {
        None
    };

    let mut storage = MaybeUninit::uninit();
    let mut open = MemtrailSkelBuilder::default()
        .open(&mut storage)
        .map_err(CaptureError::Load)?;
    open.maps
        .events
        .set_max_entries(opts.ring_size as u32)
        .map_err(CaptureError::Load)?;
    open.maps
        .stacks
        .set_max_entries(opts.stack_ring_size as u32)
        .map_err(CaptureError::Load)?;
    open.maps
        .rodata_data
        .as_deref_mut()
        .expect("the BPF object has .rodata tunables")
        .stack_depth = opts.stack_depth;
    {
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .expect("the BPF object has .rodata tunables");
        let mark = |size: u64| pressure::watermark_bytes(size, opts.watermark_percent);
        ro.pressure_enabled = opts.pressure_timeout.enabled();
        // In a PID namespace of its own (a container), BPF reports ids as
        // memtrail sees them.
        if let Some(ino) = sys::pid_namespace().filter(|&ino| ino != sys::INIT_PID_NS_INO) {
            ro.pidns_translate = true;
            ro.pidns_ino = ino;
        }
        ro.pressure_freeze = cgroup.is_some();
        for (i, room) in rooms.iter().enumerate() {
            ro.ring_capacity[i] = room.capacity;
            ro.ring_record[i] = room.record;
        }
        if opts.faults.one_thread_slot {
            ro.thread_slot_mask = 0;
        }
        ro.watermark_events = mark(opts.ring_size as u64);
        ro.watermark_stacks = mark(opts.stack_ring_size as u64);
        ro.watermark_mappings = mark(u64::from(open.maps.mappings.max_entries()));
        ro.watermark_attach = mark(u64::from(open.maps.attach_requests.max_entries()));
    }
    let mut skel = open.load().map_err(CaptureError::Load)?;
    // Before any process can be stopped: the guardian resumes the tree if
    // memtrail dies, however it dies (none when memtrail is PID 1 of its
    // PID namespace, whose death kills the whole tree).
    let _guardian = sys::spawn_guardian(
        skel.maps.tracked.as_fd(),
        cgroup.as_deref().map(TreeCgroup::for_guardian),
    )?;
    let bss = skel
        .maps
        .bss_data
        .as_deref_mut()
        .expect("the BPF object has a .bss");
    let latch_word: *mut u64 = &raw mut bss.pressure_latch;
    let unrecorded_word: *mut u64 = &raw mut bss.hard_stops_unrecorded;
    // The root, before it execs: forks add, exits subtract.
    bss.tree_threads = 1;

    // libc and the C++ runtimes are probed up front (every command loads
    // them); other images as the attach worker meets them.
    let progs = attach::AllocPrograms::memtrail(&skel).map_err(|source| CaptureError::Io {
        what: "duplicating BPF program descriptors",
        source,
    })?;
    let mut images = vec![attach::libc_path()?];
    images.extend(attach::cxx_runtimes());
    let mut links = Links::default();
    attach_tracepoints(&skel, &mut links)?;
    let mut sites = Vec::new();
    let mut known = HashSet::new();
    for image in &images {
        let found = attach::find_sites(image, &attach::api::all())?;
        attach::attach_sites(&progs, &found, &mut links)?;
        sites.extend(found);
        if let Ok(id) = sys::kernel_file_id(image) {
            sys::bpf_map_update(skel.maps.known_images.as_fd(), &attach::image_key(id), &[1])?;
            known.insert(id);
        }
    }
    // Images earlier captures examined, unchanged since: known without a
    // hold (see attach::cache).
    let mut image_cache = ImageCache::load();
    for entry in image_cache.valid() {
        let id = entry.stamp.id();
        if known.contains(&id) {
            continue;
        }
        if entry.has_sites {
            let found = attach::find_sites(&entry.path, &attach::api::all())
                .and_then(|found| attach::attach_sites(&progs, &found, &mut links).map(|()| found));
            match found {
                Ok(found) => sites.extend(found),
                Err(err) => {
                    tracing::debug!(image = %entry.path.display(), %err, "cached image not probed up front");
                    continue;
                }
            }
        }
        sys::bpf_map_update(skel.maps.known_images.as_fd(), &attach::image_key(id), &[1])?;
        known.insert(id);
    }
    for site in sites.iter().filter(|s| !s.emulated) {
        tracing::info!(%site, "probe site single-steps its first instruction (~14 µs a hit)");
    }
    let stops = Arc::new(Stops::new());

    let stream = events
        .map(EventWriter::new)
        .transpose()
        .map_err(CaptureError::EventStream)?;
    let bss = skel
        .maps
        .bss_data
        .as_deref_mut()
        .expect("the BPF object has a .bss");
    let sleeping: Vec<*mut u64> = bss.sleeping.iter_mut().map(std::ptr::from_mut).collect();
    let maps = &skel.maps;
    let barrier = Barrier::new(4).map_err(|source| CaptureError::Io {
        what: "creating the pipeline barrier",
        source,
    })?;
    let deep = |ring: usize, map: std::os::fd::BorrowedFd<'_>| {
        // SAFETY: the .bss mapping lives with the skeleton, which outlives
        // the pollers (joined below).
        let flag = unsafe { SleepFlag::new(sleeping[ring]) };
        DeepSleep::new(flag, map, barrier.kick_fd()).map_err(|source| CaptureError::Io {
            what: "setting up a poller's deep sleep",
            source,
        })
    };
    let cores = engine::poller_cores(4);
    let spawn_err = |source| CaptureError::Io {
        what: "starting a poller thread",
        source,
    };
    let event_poller = engine::spawn(
        Pipeline {
            name: "events",
            ring: RingConsumer::new(maps.events.as_fd(), opts.ring_size)?,
            sink: EventSink::new(Aggregator::new(), stream),
            fault: opts.faults.events,
            deep_sleep: Some(deep(0, maps.events.as_fd())?),
            paced: true,
        },
        barrier.clone(),
        0,
        cores[0],
    )
    .map_err(spawn_err)?;
    let stack_poller = engine::spawn(
        Pipeline {
            name: "stacks",
            ring: RingConsumer::new(maps.stacks.as_fd(), maps.stacks.max_entries() as usize)?,
            sink: StackSink::default(),
            fault: opts.faults.stacks,
            deep_sleep: Some(deep(1, maps.stacks.as_fd())?),
            paced: true,
        },
        barrier.clone(),
        1,
        cores[1],
    )
    .map_err(spawn_err)?;
    let mapping_poller = engine::spawn(
        Pipeline {
            name: "mappings",
            ring: RingConsumer::new(maps.mappings.as_fd(), maps.mappings.max_entries() as usize)?,
            sink: MappingSink::default(),
            fault: Fault::None,
            deep_sleep: Some(deep(2, maps.mappings.as_fd())?),
            paced: false,
        },
        barrier.clone(),
        2,
        cores[2],
    )
    .map_err(spawn_err)?;

    let known_fd = skel
        .maps
        .known_images
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| CaptureError::Io {
            what: "duplicating a BPF map descriptor",
            source,
        })?;
    let attach_poller = engine::spawn(
        Pipeline {
            name: "attach",
            ring: RingConsumer::new(
                maps.attach_requests.as_fd(),
                maps.attach_requests.max_entries() as usize,
            )?,
            sink: AttachWorker::new(progs, known_fd, known, stops.clone()),
            fault: Fault::None,
            deep_sleep: Some(deep(3, maps.attach_requests.as_fd())?),
            paced: false,
        },
        barrier.clone(),
        3,
        cores[3],
    )
    .map_err(spawn_err)?;

    let done = Arc::new(AtomicBool::new(false));
    let done_fd = sys::eventfd()?;
    let wake_epoll = sys::epoll_for(&[
        (skel.maps.pressure_wake.as_fd(), false),
        (done_fd.as_fd(), false),
    ])?;
    let coordinator = Coordinator {
        wake: RingConsumer::new(
            skel.maps.pressure_wake.as_fd(),
            skel.maps.pressure_wake.max_entries() as usize,
        )?,
        wake_epoll,
        // SAFETY: the skeleton (and so its .bss mapping) outlives the
        // coordinator thread, which is joined below.
        latch: unsafe { Latch::new(latch_word) },
        tracked_map: skel
            .maps
            .tracked
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| CaptureError::Io {
                what: "duplicating a BPF map descriptor",
                source,
            })?,
        stops: stops.clone(),
        barrier: barrier.clone(),
        pipelines: PIPELINES.to_vec(),
        timeout: opts.pressure_timeout,
        pause: match &cgroup {
            Some(cgroup) => Pause::Freeze {
                cgroup: cgroup.clone(),
                hard_stops: skel.maps.hard_stops.as_fd().try_clone_to_owned().map_err(
                    |source| CaptureError::Io {
                        what: "duplicating a BPF map descriptor",
                        source,
                    },
                )?,
                // SAFETY: as for the latch.
                unrecorded: unsafe { BssWord::new(unrecorded_word) },
            },
            None => Pause::Signal,
        },
        done: done.clone(),
    };
    let pressure = std::thread::Builder::new()
        .name("memtrail-pressure".into())
        .spawn(move || coordinator.run())
        .map_err(|source| CaptureError::Io {
            what: "starting the pressure coordinator",
            source,
        })?;

    let tree = track_tree(&skel, &spec, cgroup.as_deref());
    done.store(true, Ordering::Release);
    sys::eventfd_signal(done_fd.as_fd());
    let pressure = pressure.join().map_err(|_| CaptureError::PollerPanicked)?;
    if let Err(err) = pressure {
        barrier.stop();
        let _ = (
            event_poller.join(),
            stack_poller.join(),
            mapping_poller.join(),
            attach_poller.join(),
        );
        let _ = stops.resume_everything();
        return Err(CaptureError::Pressure(err));
    }
    let mut pressure_stats = pressure.unwrap_or_default();
    // Whatever happened to the tree, drain and join the pollers.
    let epoch = barrier.raise();
    let drained = barrier.wait(epoch, Some(DRAIN_TIMEOUT));
    barrier.stop();
    let joined = (
        event_poller.join(),
        stack_poller.join(),
        mapping_poller.join(),
        attach_poller.join(),
    );
    // Nothing of the tree may stay stopped, whatever happened.
    let _ = stops.resume_everything();
    let (Ok(events), Ok(stacks), Ok(mappings), Ok(attacher)) = joined else {
        return Err(CaptureError::PollerPanicked);
    };
    let seen = HighWater {
        events: events.high_water,
        stacks: stacks.high_water,
        mappings: mappings.high_water,
        attach: attacher.high_water,
    };
    let (events, stacks, mappings, mut attacher) =
        (events.sink, stacks.sink, mappings.sink, attacher.sink);
    links.append(&mut attacher.links);
    sites.append(&mut attacher.sites);
    for (path, stamp, has_sites) in attacher.examined.drain(..) {
        image_cache.record(&path, stamp, has_sites);
    }
    image_cache.save();
    // Detach now: memtrail's own allocations (symbolization below) would
    // otherwise hit the probes too.
    drop(links);
    if let Some(failure) = attacher.failures.into_iter().next() {
        return Err(CaptureError::AttachImage {
            image: failure.image,
            pid: failure.pid,
            source: failure.error,
        });
    }
    let (root, root_exit, start_ns) = tree?;
    if !drained {
        return Err(CaptureError::DrainTimeout(DRAIN_TIMEOUT));
    }
    let end_ns = sys::monotonic_ns();

    let lost = read_lost(&skel);
    if lost.any() {
        let advice = if opts.pressure_timeout.enabled() {
            let bss = skel
                .maps
                .bss_data
                .as_deref()
                .expect("the BPF object has a .bss");
            loss_advice(
                &lost,
                &rooms,
                opts.watermark_percent,
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
        ..
    } = events;
    let malformed = agg.malformed + stacks.malformed + mappings.malformed + attacher.malformed;
    if malformed > 0 {
        return Err(CaptureError::Malformed(malformed));
    }
    if let Some(err) = stream_error {
        return Err(CaptureError::EventStream(err));
    }
    agg.finish(end_ns);
    agg.set_parent(root, std::process::id());
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
    let command = opts
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut profile = Profile::build(&agg, command, exit, (start_ns, end_ns), lost, &sites);
    let slow_probes = crate::report::slow_probes(&sites, &agg, &mappings.mappings);
    profile.stacks = symbolize_stacks(&agg, &stacks.stacks, mappings.mappings);
    pressure_stats.high_water = read_high_water(&skel).max(seen);
    profile.pressure = pressure_stats;
    if let Some(stream) = stream {
        stream.commit()?;
    }
    if let Some(output) = output {
        crate::report::write_profile(&profile, output)?;
    }
    Ok(Outcome {
        profile,
        slow_probes,
        exit_code: root_exit.map_or(0, ChildExit::code),
    })
}

/// Builds the allocation sites: every stack that allocated, symbolized,
/// largest allocated bytes first.
fn symbolize_stacks(
    agg: &Aggregator,
    stacks: &HashMap<u64, Stack>,
    mut mappings: HashMap<u32, Vec<crate::symbolize::Mapping>>,
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
    type Site<'a> = (u64, StackMetrics, &'a [u64]);
    let mut by_pid: HashMap<u32, Vec<Site<'_>>> = HashMap::new();
    for (id, metrics) in agg.stack_metrics() {
        if metrics.allocations == 0 {
            continue;
        }
        match stacks.get(&id) {
            Some(stack) => by_pid
                .entry(stack.pid)
                .or_default()
                .push((id, metrics, &stack.ips)),
            None => tracing::warn!(id, "an allocation names a stack that was never recorded"),
        }
    }
    let symbolizer = StackSymbolizer::new();
    let mut entries = Vec::new();
    for (pid, list) in by_pid {
        let ips: Vec<&[u64]> = list.iter().map(|(_, _, ips)| *ips).collect();
        let frames = symbolizer.symbolize(&spaces, pid, &ips);
        entries.extend(
            list.into_iter()
                .zip(frames)
                .map(|((id, metrics, _), frames)| StackEntry {
                    id,
                    frames,
                    metrics,
                }),
        );
    }
    entries.sort_by(|a, b| b.metrics.bytes.cmp(&a.metrics.bytes).then(a.id.cmp(&b.id)));
    entries
}

/// Attaches the syscall and sched tracepoint programs.
fn attach_tracepoints(skel: &MemtrailSkel<'_>, links: &mut Links) -> Result<(), CaptureError> {
    let p = &skel.progs;
    for prog in [
        &p.sched_fork,
        &p.sched_exec,
        &p.sched_exit,
        &p.sys_enter_mmap,
        &p.sys_exit_mmap,
        &p.sys_enter_munmap,
        &p.sys_enter_mremap,
        &p.sys_exit_mremap,
        &p.sys_enter_brk,
        &p.sys_exit_brk,
    ] {
        let link = prog
            .attach()
            .map_err(|source| CaptureError::AttachTracepoint {
                what: "syscall and sched tracepoints",
                source,
            })?;
        links.push(link);
    }
    Ok(())
}

/// Starts the command tracked and waits for its whole tree. Returns the
/// root pid, how it ended, and when it was released.
fn track_tree(
    skel: &MemtrailSkel<'_>,
    spec: &CommandSpec,
    cgroup: Option<&TreeCgroup>,
) -> Result<(u32, Option<ChildExit>, u64), CaptureError> {
    // memtrail stays alive for Ctrl-C and Ctrl-\: the command decides.
    sys::ignore_signal(libc::SIGINT)?;
    sys::ignore_signal(libc::SIGQUIT)?;
    // SIGTERM or SIGHUP during the set-up: give up before anything runs.
    // One that comes from here on is passed on to the command.
    if let Some(sig) = sys::signals::termination() {
        return Err(CaptureError::Interrupted(sig));
    }
    let held = proctree::spawn_held(spec)?;
    let pid = held.pid();
    // Until the whole tree is waited for: SIGTERM, SIGHUP, SIGUSR1 and
    // SIGUSR2 reach the command.
    let _forward = match sys::signals::Forward::new(pid as i32) {
        Ok(forward) => forward,
        Err(err) => {
            // Dropping `held` closes the go pipe: the child exits unexec'd.
            drop(held);
            let _ = proctree::wait_tree(pid);
            return Err(err.into());
        }
    };
    let tracked = skel
        .maps
        .tracked
        .update(
            &pid.to_ne_bytes(),
            &0u32.to_ne_bytes(),
            libbpf_rs::MapFlags::ANY,
        )
        .map_err(CaptureError::Load)
        .and_then(|()| {
            cgroup.map_or(Ok(()), |cg| {
                cg.add(pid)
                    .map_err(|e| CaptureError::Pressure(PressureError::Cgroup(e)))
            })
        });
    if let Err(err) = tracked {
        // Dropping `held` closes the go pipe: the child exits unexec'd.
        drop(held);
        let _ = proctree::wait_tree(pid);
        return Err(err);
    }
    let start_ns = sys::monotonic_ns();
    let released = held.release();
    let root_exit = proctree::wait_tree(pid)?;
    released?;
    Ok((pid, root_exit, start_ns))
}

/// Why a paused capture still lost records, and what ring sizes would do:
/// each live thread of the tree may write two records past a ring's mark
/// before it stops, so a tree with more threads than the ring has room for
/// above its watermark can overrun it before the freeze lands.
fn loss_advice(lost: &LostEvents, rooms: &[RingRoom], percent: u8, threads: u64) -> String {
    let counts = [lost.events, lost.stacks, lost.mappings, lost.attach];
    let needs: Vec<String> = rooms
        .iter()
        .zip(counts)
        .filter(|&(room, n)| n != 0 && room.option != "fixed")
        .map(|(room, _)| {
            let needed = (pressure::RECORDS_PER_THREAD * threads + 1) * room.record;
            let mut size = room.capacity;
            while size - pressure::watermark_bytes(size, percent) < needed {
                size *= 2;
            }
            format!("{} {size}", room.option)
        })
        .collect();
    if needs.is_empty() {
        return lost.advice();
    }
    format!(
        "the tree had up to {threads} live threads, and each may write {} records past a \
         ring's watermark before it stops: retry with {} (or a lower --watermark)",
        pressure::RECORDS_PER_THREAD,
        needs.join(" and ")
    )
}

/// Each ring's capacity and largest record (with its ring header), by ring
/// index (`enum mt_ring`).
fn ring_rooms(opts: &Options) -> [RingRoom; 4] {
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
            capacity: opts.ring_size as u64,
            record: with_header(event),
        },
        RingRoom {
            name: "stacks",
            option: "--stack-ring-size",
            capacity: opts.stack_ring_size as u64,
            record: with_header(size_of::<t::mt_stack_record>()),
        },
        RingRoom {
            name: "mappings",
            option: "fixed",
            capacity: MAPPINGS_RING_SIZE,
            record: mapping,
        },
        RingRoom {
            name: "attach",
            option: "fixed",
            capacity: ATTACH_RING_SIZE,
            record: mapping,
        },
    ]
}

/// Sizes of the mappings and attach-request rings (`max_entries` in
/// bpf/memtrail.bpf.c).
const MAPPINGS_RING_SIZE: u64 = 1 << 20;
const ATTACH_RING_SIZE: u64 = 1 << 20;

/// Pipeline names by barrier index.
const PIPELINES: [&str; 4] = ["events", "stacks", "mappings", "attach"];

/// The high-water marks the producers kept (only with pressure on: see
/// check_pressure in bpf/memtrail.bpf.c).
fn read_high_water(skel: &MemtrailSkel<'_>) -> HighWater {
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

fn read_lost(skel: &MemtrailSkel<'_>) -> LostEvents {
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
    }
}
