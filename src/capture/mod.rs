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

use crate::attach::worker::AttachWorker;
use crate::attach::{self, AttachError, Links};
use crate::engine::idle::{DeepSleep, SleepFlag};
use crate::engine::{self, Barrier, Fault, Pipeline};
use crate::pressure::{Coordinator, HighWater, Latch, PressureTimeout};
use crate::proctree::stops::Stops;
use crate::proctree::{self, CommandSpec, SpawnError};
use crate::report::{
    Aggregator, AtomicOutput, EventWriter, ExitInfo, LostEvents, OutputError, Profile, StackEntry,
    StackMetrics,
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
    /// Size in bytes of the events ring (a power of two, at least a page).
    pub ring_size: usize,
    /// Frames captured per allocation stack (0: no stacks), at most
    /// [`MAX_STACK_DEPTH`].
    pub stack_depth: u32,
    /// Size in bytes of the stack ring (a power of two, at least a page).
    pub stack_ring_size: usize,
    /// How stacks are walked: unwind tables, frame pointers, or both.
    pub unwind: crate::unwind::Mode,
    /// Backpressure: off (`0`, loss detection only), bounded, or unbounded.
    pub pressure_timeout: PressureTimeout,
    /// Fill of a ring, in percent, past which producers pause the tree.
    pub watermark_percent: u8,
    /// Fault injection for tests.
    pub faults: Faults,
}

/// Test-only fault injection (`MEMTRAIL_FAULT=stall-events,slow-events,
/// wedge-events,stall-stacks,one-thread-slot` in the CLI; see
/// [`engine::Fault`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub events: Fault,
    pub stacks: Fault,
    /// One thread slot for the whole tree (`thread_slots` in
    /// bpf/memtrail.bpf.c): the other threads keep their state in task
    /// storage, the path a thread takes when its slot is held.
    pub one_thread_slot: bool,
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
    #[error("memtrail needs {0}: run it as root (or with CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN)")]
    Privileges(&'static str),
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
        .0.events, .0.stacks, .0.mappings, .0.attach, .0.tracking, .0.advice()
    )]
    Lost(LostEvents),
    #[error("--stack-depth {0} is more than the {MAX_STACK_DEPTH} frames a stack record holds")]
    StackDepth(u32),
    #[error(transparent)]
    Pressure(#[from] crate::pressure::PressureError),
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
    /// The exit code memtrail passes on: the command's, or 128 + signal.
    pub exit_code: i32,
}

fn check_environment() -> Result<(), CaptureError> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let admin = sys::has_capability(CAP_SYS_ADMIN);
    if !admin && !sys::has_capability(CAP_BPF) {
        return Err(CaptureError::Privileges("CAP_BPF to load BPF programs"));
    }
    if !admin && !sys::has_capability(CAP_PERFMON) {
        return Err(CaptureError::Privileges(
            "CAP_PERFMON to attach uprobes and tracepoints",
        ));
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(CaptureError::KernelFeature {
            feature: "BTF (/sys/kernel/btf/vmlinux)",
            hint: "memtrail needs a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        });
    }
    sys::ensure_tracefs().map_err(|_| CaptureError::KernelFeature {
        feature: "tracefs at /sys/kernel/tracing",
        hint: "mount it (mount -t tracefs nodev /sys/kernel/tracing) or enable CONFIG_TRACING",
    })?;
    Ok(())
}

/// Runs one capture.
pub fn run(opts: &Options) -> Result<Outcome, CaptureError> {
    // Everything that can fail on bad input fails before the command runs.
    let spec = CommandSpec::new(opts.command.clone())?;
    let output = opts
        .output
        .as_deref()
        .map(AtomicOutput::create)
        .transpose()?;
    let events = opts
        .events
        .as_deref()
        .map(AtomicOutput::create)
        .transpose()?;
    for size in [opts.ring_size, opts.stack_ring_size] {
        if !size.is_power_of_two() || size < rustix::param::page_size() {
            return Err(RingError::BadSize(size).into());
        }
    }
    if opts.stack_depth > MAX_STACK_DEPTH {
        return Err(CaptureError::StackDepth(opts.stack_depth));
    }
    check_environment()?;

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
        let mark = |size: u64| size * u64::from(opts.watermark_percent.clamp(1, 99)) / 100;
        ro.pressure_enabled = opts.pressure_timeout.enabled();
        ro.unwind_mode = opts.unwind.raw();
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
    // memtrail dies, however it dies.
    let _guardian = sys::spawn_guardian(skel.maps.tracked.as_fd())?;
    let latch_word: *mut u64 = &raw mut skel
        .maps
        .bss_data
        .as_deref_mut()
        .expect("the BPF object has a .bss")
        .pressure_latch;

    // libc and the C++ runtimes are probed up front (every command loads
    // them); other images as the attach worker meets them.
    let progs = attach::AllocPrograms::memtrail(&skel).map_err(|source| CaptureError::Io {
        what: "duplicating BPF program descriptors",
        source,
    })?;
    let mut images = vec![attach::libc_path()?];
    images.extend(attach::cxx_runtimes());
    let mut tables = unwind_tables(&skel, opts);
    let mut links = Links::default();
    attach_tracepoints(&skel, &mut links)?;
    let mut sites = Vec::new();
    let mut known = HashSet::new();
    for image in &images {
        let found = attach::find_sites(image, &attach::api::all())?;
        attach::attach_sites(&progs, &found, &mut links)?;
        sites.extend(found);
        if let Ok(id) = sys::kernel_file_id(image) {
            if let Some(tables) = &mut tables {
                tables.load(image, image, id);
            }
            sys::bpf_map_update(skel.maps.known_images.as_fd(), &attach::image_key(id), &[1])?;
            known.insert(id);
        }
    }
    // The dynamic loader: the kernel maps it at exec, with no mmap to ask
    // for its table by, and dlopen's allocations run through it.
    if let (Some(tables), Some(ld_so)) = (&mut tables, crate::attach::ld_so_path()) {
        if let Ok(id) = sys::kernel_file_id(&ld_so) {
            tables.load(&ld_so, &ld_so, id);
        }
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
            sink: AttachWorker::new(progs, known_fd, known, stops.clone(), tables),
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
    let coordinator = Coordinator {
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
        done: done.clone(),
    };
    let pressure = std::thread::Builder::new()
        .name("memtrail-pressure".into())
        .spawn(move || coordinator.run())
        .map_err(|source| CaptureError::Io {
            what: "starting the pressure coordinator",
            source,
        })?;

    let tree = track_tree(&skel, &spec);
    done.store(true, Ordering::Release);
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
        return Err(CaptureError::Lost(lost));
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
    profile.stacks = symbolize_stacks(&agg, &stacks.stacks, mappings.mappings);
    profile.unwind = crate::unwind::report(
        opts.unwind,
        attacher.tables.map(|t| t.images_seen).unwrap_or_default(),
        &profile.stacks,
    );
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
    type Site<'a> = (u64, StackMetrics, &'a Stack);
    let mut by_pid: HashMap<u32, Vec<Site<'_>>> = HashMap::new();
    for (id, metrics) in agg.stack_metrics() {
        if metrics.allocations == 0 {
            continue;
        }
        match stacks.get(&id) {
            Some(stack) => by_pid
                .entry(stack.pid)
                .or_default()
                .push((id, metrics, stack)),
            None => tracing::warn!(id, "an allocation names a stack that was never recorded"),
        }
    }
    let symbolizer = StackSymbolizer::new();
    let mut entries = Vec::new();
    for (pid, list) in by_pid {
        let ips: Vec<&[u64]> = list.iter().map(|(_, _, stack)| &stack.ips[..]).collect();
        let frames = symbolizer.symbolize(&spaces, pid, &ips);
        entries.extend(
            list.into_iter()
                .zip(frames)
                .map(|((id, metrics, stack), frames)| StackEntry {
                    id,
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
fn unwind_tables(skel: &MemtrailSkel<'_>, opts: &Options) -> Option<crate::unwind::Tables> {
    if !opts.unwind.uses_tables() || opts.stack_depth == 0 {
        return None;
    }
    let maps = &skel.maps;
    crate::unwind::Tables::new(
        (maps.unwind_rows.as_fd(), maps.unwind_rows.max_entries()),
        (maps.unwind_pages.as_fd(), maps.unwind_pages.max_entries()),
        maps.unwind_images.as_fd(),
    )
    .inspect_err(|err| tracing::warn!(%err, "no unwind tables: stacks take frame-pointer steps"))
    .ok()
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
) -> Result<(u32, Option<ChildExit>, u64), CaptureError> {
    // memtrail stays alive for Ctrl-C and Ctrl-\: the command decides.
    sys::ignore_signal(libc::SIGINT)?;
    sys::ignore_signal(libc::SIGQUIT)?;
    let held = proctree::spawn_held(spec)?;
    let pid = held.pid();
    sys::forward_termination_to(pid as i32)?;
    let tracked = skel.maps.tracked.update(
        &pid.to_ne_bytes(),
        &0u32.to_ne_bytes(),
        libbpf_rs::MapFlags::ANY,
    );
    if let Err(err) = tracked {
        // Dropping `held` closes the go pipe: the child exits unexec'd.
        drop(held);
        let _ = proctree::wait_tree(pid);
        return Err(CaptureError::Load(err));
    }
    let start_ns = sys::monotonic_ns();
    let released = held.release();
    let root_exit = proctree::wait_tree(pid)?;
    released?;
    Ok((pid, root_exit, start_ns))
}

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
