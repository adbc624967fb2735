//! Starting a session, phase by phase: plan (check the options and the
//! environment), load the BPF object while the events rings are made and
//! the up-front images prepared on threads, attach the tracepoints and
//! start the guardian, place the up-front images, start the pollers and
//! the pressure coordinator, then start the command or track the running
//! process.
//!
//! Every thread started is in a [`Threads`], declared after the loaded
//! object: any return (or panic) joins them before the object goes.

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use libbpf_rs::MapCore;

use super::threads::Threads;
use super::upfront::{self, Install, Installed};
use super::{
    Background, CaptureError, FirstProbes, Root, Session, SessionOptions, Target, error,
    no_freezer, open_running, phases, running_identity, thread_ids,
};
use crate::aggregate::Aggregator;
use crate::attach::worker::AttachWorker;
use crate::attach::{self, Links};
use crate::bpf::bss::Bss;
use crate::bpf::object::{self, Config, Loaded, RingConfig};
use crate::bpf::skel::memtrail::MemtrailSkel;
use crate::engine::{Fault, Pipeline, Sink};
use crate::events::writer::EventWriter;
use crate::pressure::{self, Coordinator, Pause, PressureError, RingRoom};
use crate::proctree::cgroup::{CgroupPlace, TreeCgroup};
use crate::proctree::stops::Stops;
use crate::proctree::{self, CommandSpec};
use crate::ring::merge::{self, EventsRing, Merged};
use crate::ring::{RingConsumer, RingError};
use crate::sys;

use super::regions::{Control, Regions};
use super::sinks::{EventSink, MappingSink, StackSink};

/// What start-up settles before loading anything.
struct Plan {
    per_process: bool,
    /// The preload shim is given to the command (`--preload`).
    preload: bool,
    /// ... with its rings (the ring path, with the default `--unwind`):
    /// the offer the events sink takes files with, and the files taken,
    /// for the events pipeline when it starts.
    rings_file: Option<crate::ring::shim::Offer>,
    rings_taken: Option<crate::ring::shim::Taken>,
    spec: Option<CommandSpec>,
    is_self: bool,
    /// The running process tracked (the session's own, or a pid).
    running: Option<u32>,
    cpus: u64,
    rings: merge::Layout,
    rooms: [RingRoom; 4],
    /// Where the tree's cgroup goes, for pauses by freezing it.
    place: Option<CgroupPlace>,
    pidfd: Option<OwnedFd>,
    /// Whether unwind tables are loaded.
    with_tables: bool,
    /// Whether operator new in the C++ runtimes is probed (stacks by frame
    /// pointers only: `attach::capture_sites`).
    probe_new: bool,
}

impl Plan {
    /// Checks the options, the rings' room and the environment; looks at
    /// a process that exists already before the object loads (its pid
    /// must still name it).
    fn new(opts: &SessionOptions, target: &Target) -> Result<Self, CaptureError> {
        opts.validate(target)?;
        let per_process = if opts.preload {
            crate::attach::per_process::Probes::PerProcess
                .per_process(false)
                .map_err(|u| crate::attach::per_process::Unsupported {
                    hint: "run without --preload on this kernel",
                    ..u
                })?
        } else {
            opts.probes
                .per_process(!matches!(target, Target::Command(_)))?
        };
        let mut spec = match target {
            Target::Command(argv) => Some(CommandSpec::new(argv.clone())?),
            _ => None,
        };
        let (rings_file, rings_taken) = shim_rings(opts).unzip();
        if let (Some(spec), Some(_)) = (spec.as_mut(), &rings_file) {
            spec.rings_offer = Some(std::process::id());
        }
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
        let rooms = pressure::room::ring_rooms(rings.each, rings.per_cpu, opts.stack_ring_size);
        if opts.pressure_timeout.enabled() {
            pressure::check_room(&rooms, opts.watermark_percent, cpus, false)?;
        }
        error::check_environment()?;
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
        let pidfd = match target {
            Target::Pid(pid) => Some(open_running(*pid)?),
            _ => None,
        };
        Ok(Self {
            per_process,
            preload: opts.preload,
            rings_file,
            rings_taken,
            is_self: *target == Target::SelfProcess,
            running: match target {
                Target::SelfProcess => Some(std::process::id()),
                Target::Pid(pid) => Some(*pid),
                Target::Command(_) => None,
            },
            spec,
            cpus,
            rings,
            rooms,
            place,
            pidfd,
            with_tables: opts.unwind.uses_tables() && opts.stack_depth > 0,
            probe_new: !opts.unwind.uses_tables() && opts.stack_depth > 0,
        })
    }

    /// The object's settings.
    fn config<'a>(
        &self,
        opts: &SessionOptions,
        event_ring_array: BorrowedFd<'a>,
        sessions: bool,
    ) -> Config<'a> {
        let rings = self.rooms.map(|room| RingConfig {
            capacity: room.capacity,
            record: room.record,
            freeze_room: pressure::freeze_room(if room.per_cpu.is_some() { 1 } else { self.cpus }),
            watermark: pressure::watermark_bytes(room.capacity, opts.watermark_percent),
        });
        Config {
            event_ring_array,
            stack_ring_size: opts.stack_ring_size as u32,
            sessions,
            preload: self.preload,
            // Stops and resumes by others (and, with per-process probes,
            // resumes of processes held at fork); a process tracking
            // itself is never stopped.
            signal_generate: !self.is_self,
            stack_depth: opts.stack_depth,
            python_frames: opts.python_frames,
            unwind_mode: crate::bpf::record::unwind_mode(opts.unwind),
            pressure: opts.pressure_timeout.enabled(),
            // In a PID namespace of its own (a container), BPF reports ids
            // as memtrail sees them.
            pidns: sys::pid_namespace().filter(|&ino| ino != sys::INIT_PID_NS_INO),
            attach_hold: !self.is_self,
            per_process: self.per_process,
            memtrail_tgid: std::process::id(),
            threads_excluded: self.is_self,
            rings,
            cpu_rings: self.rings.per_cpu.is_some(),
            stamp_reserved: self.rings_file.is_some(),
            event_ring_count: self.rings.sizes.len() as u32,
            one_thread_slot: opts.faults.one_thread_slot,
            one_row_cache_slot: opts.faults.one_row_cache_slot,
            one_stack_window: opts.faults.one_stack_window,
            find_vma_busy: opts.faults.find_vma_busy,
            returns_elsewhere: opts.faults.returns_elsewhere,
        }
    }
}

/// The symbolizer, loading ahead the files every capture symbolizes: libc
/// and the command (not in a process tracking itself, where a thread of its
/// own would be tracked).
fn start_symbols(
    opts: &SessionOptions,
    target: &Target,
    spec: Option<&CommandSpec>,
    cpus: Option<sys::StartupCpus>,
) -> crate::symbolize::Background {
    if *target == Target::SelfProcess {
        return crate::symbolize::Background::in_place();
    }
    crate::symbolize::Background::start(
        (opts.stack_depth > 0)
            .then(|| {
                let command = spec.and_then(|s| std::fs::canonicalize(&s.path).ok());
                attach::libc_path().ok().into_iter().chain(command)
            })
            .into_iter()
            .flatten()
            .collect(),
        cpus,
    )
}

/// The events rings, made and inserted on a thread while the kernel
/// verifies the programs (each insertion waits for an RCU grace period),
/// into the array of rings the object reuses.
struct MakingRings {
    array: libbpf_rs::MapHandle,
    sizes: Vec<usize>,
    thread: Background<Result<Vec<libbpf_rs::MapHandle>, CaptureError>>,
}

impl MakingRings {
    fn start(sizes: &[usize]) -> Result<Self, CaptureError> {
        let array = object::make_ring_array(sizes.len()).map_err(CaptureError::Load)?;
        let thread = Background::spawn("memtrail-mkring", {
            let sizes = sizes.to_vec();
            let array = libbpf_rs::MapHandle::try_from(&array);
            move || {
                object::make_event_rings(&sizes, &array.map_err(CaptureError::Load)?)
                    .map_err(CaptureError::Load)
            }
        });
        Ok(Self {
            array,
            sizes: sizes.to_vec(),
            thread,
        })
    }

    /// The rings (made here if the thread could not start).
    fn finish(self) -> Result<Vec<libbpf_rs::MapHandle>, CaptureError> {
        match self.thread.join() {
            Some(made) => made,
            None => object::make_event_rings(&self.sizes, &self.array).map_err(CaptureError::Load),
        }
    }
}

/// Attaches the tracepoints, then, before any process can be stopped and
/// before the cgroup exists, starts the guardian: it resumes the tree and
/// removes the cgroup if memtrail dies, however it dies. A process tracking
/// itself is never stopped, and has none.
fn guard(
    loaded: &Loaded,
    links: &mut Links,
    plan: &mut Plan,
    opts: &SessionOptions,
    phases: &mut phases::Phases,
) -> Result<(Option<sys::Guardian>, Option<Arc<TreeCgroup>>), CaptureError> {
    // The tracepoints first: the guardian holds sched_exit's link.
    let exit_link =
        super::stages::attach_tracepoints(&loaded.skel, links, !plan.is_self, opts.preload)?;
    phases.done("tracepoints attached");
    let place = plan.place.take();
    let guardian = if plan.is_self {
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
    Ok((guardian, cgroup))
}

/// The large rings, mapped on a thread while the up-front images are
/// probed (after the guardian's fork, which would wait for the mapping's
/// hold on the address space): the kernel inserts every page of a ring at
/// mmap (~10 ms for the 16 MiB events ring and the 4 MiB stack ring). The
/// stack ring first, then the events rings.
struct MappingRings {
    rings: Vec<(OwnedFd, usize)>,
    thread: Background<Option<Result<Vec<RingConsumer>, RingError>>>,
}

impl MappingRings {
    fn start(
        skel: &MemtrailSkel<'_>,
        event_rings: &[libbpf_rs::MapHandle],
        sizes: &[usize],
    ) -> Result<Self, CaptureError> {
        let ring_fd = |fd: BorrowedFd<'_>, size: usize| {
            fd.try_clone_to_owned()
                .map(|fd| (fd, size))
                .map_err(|source| CaptureError::Io {
                    what: "duplicating a BPF map descriptor",
                    source,
                })
        };
        let stacks = &skel.maps.stacks;
        let mut rings = vec![ring_fd(stacks.as_fd(), stacks.max_entries() as usize)?];
        for (ring, &size) in event_rings.iter().zip(sizes) {
            rings.push(ring_fd(ring.as_fd(), size)?);
        }
        let thread = Background::spawn("memtrail-rings", {
            let fds: Option<Vec<_>> = rings
                .iter()
                .map(|(fd, size)| fd.try_clone().ok().map(|fd| (fd, *size)))
                .collect();
            move || fds.map(|fds| Self::map(&fds))
        });
        Ok(Self { rings, thread })
    }

    fn map(rings: &[(OwnedFd, usize)]) -> Result<Vec<RingConsumer>, RingError> {
        rings
            .iter()
            .map(|(fd, size)| RingConsumer::new(fd.as_fd(), *size))
            .collect()
    }

    /// The stack ring and the events rings (mapped here if the thread
    /// could not start).
    fn finish(
        self,
        per_cpu: bool,
        shim: Option<crate::ring::shim::Taken>,
    ) -> Result<(RingConsumer, EventsRing), CaptureError> {
        let mut mapped = match self.thread.join().flatten() {
            Some(mapped) => mapped?,
            None => Self::map(&self.rings)?,
        }
        .into_iter();
        let Some(stacks) = mapped.next() else {
            unreachable!("the stack ring is mapped");
        };
        let events = if let Some(shim) = shim {
            EventsRing::PerCpu(Merged::new(mapped.collect()).with_shim(shim))
        } else if per_cpu {
            EventsRing::PerCpu(Merged::new(mapped.collect()))
        } else {
            let Some(ring) = mapped.next() else {
                unreachable!("the events ring is mapped");
            };
            EventsRing::One(ring)
        };
        Ok((stacks, events))
    }
}

/// Sets the .bss words BPF reads from the start: whether pauses freeze the
/// cgroup, and the safety net's protectors (memtrail, and its guardian if
/// any).
fn set_protectors(loaded: &mut Loaded, freeze: bool, guardian: Option<&sys::Guardian>) {
    let bss = loaded
        .skel
        .maps
        .bss_data
        .as_deref_mut()
        .expect("the BPF object has a .bss");
    bss.pressure_freeze = freeze;
    bss.guardian_tgid = guardian.map_or(0, |g| g.pid().get());
    bss.protectors = 1 + u64::from(guardian.is_some());
}

/// Sets `key` to `value` in a map of `u32`s.
fn put_u32(map: &libbpf_rs::MapMut<'_>, key: u32, value: u32) -> Result<(), CaptureError> {
    map.update(
        &key.to_ne_bytes(),
        &value.to_ne_bytes(),
        libbpf_rs::MapFlags::ANY,
    )
    .map_err(CaptureError::Load)
}

/// Duplicates a BPF map's descriptor for a thread.
fn dup(fd: BorrowedFd<'_>) -> Result<OwnedFd, CaptureError> {
    fd.try_clone_to_owned().map_err(|source| CaptureError::Io {
        what: "duplicating a BPF map descriptor",
        source,
    })
}

/// The preload shim's rings (its ring path), with `--preload` and the
/// default `--unwind` (the shim's unwinder walks as `auto` does).
fn shim_rings(
    opts: &SessionOptions,
) -> Option<(crate::ring::shim::Offer, crate::ring::shim::Taken)> {
    if !opts.preload
        || opts.unwind != crate::profile::unwind::Mode::Auto
        || opts.faults.shim_hook_only
    {
        return None;
    }
    Some(crate::ring::shim::Offer::new(
        crate::ring::shim::Settings {
            stack_depth: opts.stack_depth,
            // The shim walks the Python frames of the versions it has a
            // layout of; BPF the others' (the hook path).
            python: opts.python_frames && opts.stack_depth > 0,
            stack_cache: !opts.faults.shim_no_stack_cache,
            ..Default::default()
        },
        &crate::python::shim_layouts(),
    ))
}

/// Writes the preload shim into its memfd: named in the command's
/// `LD_PRELOAD` (through a keeper of the command's user under sudo), its
/// hook probed in the processes that map it.
fn preload_shim(plan: &mut Plan, installed: &mut Installed) -> Result<(), CaptureError> {
    let shim_error = |err| CaptureError::Io {
        what: "preparing the preload shim",
        source: std::io::Error::other(err),
    };
    let mut shim = attach::shim::Shim::new().map_err(shim_error)?;
    if let Some(spec) = plan.spec.as_ref() {
        shim.serve(spec.creds.as_ref()).map_err(shim_error)?;
    }
    tracing::debug!(path = %shim.preload_path().display(), "preload shim ready");
    if let Some(spec) = plan.spec.as_mut() {
        spec.preload = Some(shim.preload_path());
    }
    if let Some(registry) = installed.registry.as_mut() {
        registry.set_shim(shim);
    }
    Ok(())
}

/// The programs the allocator probes use, duplicated.
fn alloc_programs(loaded: &Loaded) -> Result<attach::AllocPrograms, CaptureError> {
    attach::AllocPrograms::memtrail(&loaded.skel, loaded.sessions, loaded.preload).map_err(
        |source| CaptureError::Io {
            what: "duplicating BPF program descriptors",
            source,
        },
    )
}

/// The events poller's sink: the aggregator (told of a running process,
/// which no exec or fork record will name), the stream, the regions and
/// the live counters.
fn event_sink(
    opts: &SessionOptions,
    running: Option<u32>,
    control: &Arc<Control>,
    stream: Option<EventWriter>,
    shim: Option<crate::ring::shim::Offer>,
) -> EventSink {
    let mut agg = if opts.timeline {
        Aggregator::new()
    } else {
        Aggregator::without_timeline()
    };
    agg.set_direct_syscall_sites(opts.stack_depth != 0);
    if let Some(pid) = running {
        let (ppid, exe) = running_identity(pid);
        agg.add_running(pid, ppid, &exe, sys::monotonic_ns());
    }
    let mut sink = EventSink::new(agg, stream);
    sink.regions = Some(Regions::new(control.clone()));
    sink.live = opts.live.clone().map(|live| (live, 0));
    sink.shim = shim;
    sink
}

/// The rings the pollers read, mapped, and the events rings' maps (the
/// events poller sleeps on their descriptors).
struct PollerRings<'a> {
    events: EventsRing,
    stacks: RingConsumer,
    event_maps: &'a [libbpf_rs::MapHandle],
}

/// The pollers' sinks.
struct Sinks {
    events: EventSink,
    mappings: MappingSink,
    attach: AttachWorker,
}

impl Sinks {
    /// The sinks of a session on `plan`'s target: the events' (see
    /// [`event_sink`], taking the shim's rings), the mappings' (a running
    /// process's scanned first) and the attach worker.
    fn new(
        opts: &SessionOptions,
        plan: &mut Plan,
        control: &Arc<Control>,
        stream: Option<EventWriter>,
        attach: AttachWorker,
    ) -> Self {
        let mut mappings = MappingSink::default();
        if let Some(pid) = plan.running {
            mappings.scan_proc(pid);
        }
        Self {
            events: event_sink(opts, plan.running, control, stream, plan.rings_file.take()),
            mappings,
            attach,
        }
    }
}

/// Starts the four pollers, in barrier order: events, stacks, mappings,
/// attach requests.
fn spawn_pollers(
    threads: &mut Threads,
    loaded: &Loaded,
    bss: &Bss,
    rings: PollerRings<'_>,
    sinks: Sinks,
    opts: &SessionOptions,
) -> Result<(), CaptureError> {
    let maps = &loaded.skel.maps;
    let event_fds: Vec<BorrowedFd<'_>> = rings.event_maps.iter().map(AsFd::as_fd).collect();
    threads.events = Some(threads.spawn_poller(
        Pipeline {
            name: "events",
            ring: rings.events,
            sink: sinks.events,
            fault: opts.faults.events,
            deep_sleep: None,
            paced: true,
        },
        &event_fds,
        bss,
    )?);
    threads.stacks = Some(threads.spawn_poller(
        Pipeline {
            name: "stacks",
            ring: rings.stacks,
            sink: StackSink::default(),
            fault: opts.faults.stacks,
            deep_sleep: None,
            paced: true,
        },
        &[maps.stacks.as_fd()],
        bss,
    )?);
    let mappings = unpaced("mappings", &maps.mappings, sinks.mappings)?;
    threads.mappings = Some(threads.spawn_poller(mappings, &[maps.mappings.as_fd()], bss)?);
    let attach = unpaced("attach", &maps.attach_requests, sinks.attach)?;
    threads.attach = Some(threads.spawn_poller(attach, &[maps.attach_requests.as_fd()], bss)?);
    Ok(())
}

/// The pipeline of one of the object's own rings whose records hold a
/// process stopped or racing its exit: looked at again at once, not paced.
fn unpaced<S: Sink>(
    name: &'static str,
    map: &libbpf_rs::MapMut<'_>,
    sink: S,
) -> Result<Pipeline<S>, CaptureError> {
    Ok(Pipeline {
        name,
        ring: RingConsumer::new(map.as_fd(), map.max_entries() as usize)?,
        sink,
        fault: Fault::None,
        deep_sleep: None,
        paced: false,
    })
}

/// The pressure coordinator, ready to start.
fn coordinator(
    threads: &Threads,
    loaded: &Loaded,
    bss: &Bss,
    cgroup: Option<&Arc<TreeCgroup>>,
    opts: &SessionOptions,
    target: &Target,
) -> Result<Coordinator, CaptureError> {
    let maps = &loaded.skel.maps;
    let wake_epoll = sys::epoll_for(&[
        (maps.pressure_wake.as_fd(), false),
        (threads.done_fd.as_fd(), false),
    ])?;
    Ok(Coordinator {
        wake: RingConsumer::new(
            maps.pressure_wake.as_fd(),
            maps.pressure_wake.max_entries() as usize,
        )?,
        wake_epoll,
        latch: bss.pressure_latch(),
        tracked_map: dup(maps.tracked.as_fd())?,
        stops: threads.stops.clone(),
        barrier: threads.barrier.clone(),
        pipelines: super::PIPELINES.to_vec(),
        live: opts.live.clone(),
        timeout: opts.pressure_timeout,
        pause: match cgroup {
            Some(cgroup) => Pause::Freeze {
                cgroup: cgroup.clone(),
                hard_stops: dup(maps.hard_stops.as_fd())?,
                unrecorded: bss.hard_stops_unrecorded(),
            },
            None => Pause::Signal,
        },
        done: threads.done.clone(),
        // A process memtrail did not start is never killed.
        kill_on_failure: !matches!(target, Target::Pid(_)),
        fault: opts.faults.pressure,
    })
}

/// The attach worker, taking over from the up-front installation, and
/// the command's first probes (per process, on libc).
fn attach_worker(
    installed: Installed,
    loaded: &Loaded,
    stops: Arc<Stops>,
    plan: &Plan,
    target: &Target,
) -> Result<(AttachWorker, Option<FirstProbes>), CaptureError> {
    let registry = installed.registry.map(|r| Arc::new(Mutex::new(r)));
    let first_probes = match (&registry, installed.libc_id, target) {
        // With the shim the command's libc probes depend on whether it
        // loads it: made when it maps libc.
        _ if plan.preload => None,
        (Some(registry), Some(libc), Target::Command(_)) => Some(FirstProbes {
            registry: registry.clone(),
            progs: alloc_programs(loaded)?,
            libc,
        }),
        _ => None,
    };
    let maps = &loaded.skel.maps;
    let mut worker = AttachWorker::new(
        installed.progs,
        dup(maps.known_images.as_fd())?,
        installed.known,
        stops,
        installed.tables,
        installed.slots,
        registry,
    );
    worker.held_for_probes = Some(dup(maps.held_for_probes.as_fd())?);
    worker.deferred = installed.deferred;
    worker.probe_new = installed.probe_new;
    worker.python = installed.python;
    worker.hold = !plan.is_self;
    Ok((worker, first_probes))
}

/// BPF's `py_images` for the attach worker when stacks are walked by frame
/// pointers with Python frames (with tables, the tables record
/// interpreters there).
fn python_images(loaded: &Loaded, opts: &SessionOptions) -> Result<Option<OwnedFd>, CaptureError> {
    let wanted = opts.python_frames && opts.stack_depth > 0 && !opts.unwind.uses_tables();
    wanted
        .then(|| dup(loaded.skel.maps.py_images.as_fd()))
        .transpose()
}

/// The up-front images installed (`up_front`: the allocator programs and
/// the images prepared): their entry points probed, their unwind tables
/// loaded (with the shim's layouts); with --preload, the shim written.
fn install(
    plan: &mut Plan,
    loaded: &Loaded,
    (progs, images): (attach::AllocPrograms, Vec<upfront::Image>),
    opts: &SessionOptions,
    links: &mut Links,
    phases: &mut phases::Phases,
) -> Result<Installed, CaptureError> {
    let shim_layouts = match &plan.rings_file {
        Some(offer) if opts.python_frames => Some(offer.image_layouts()),
        _ => None,
    };
    let mut installed = Install::new(
        progs,
        super::stages::unwind_tables(&loaded.skel, opts)
            .map(|tables| tables.with_shim_layouts(shim_layouts)),
        opts.stack_depth > 0,
        plan.per_process,
        // Not in a session on its own process, which is not held
        // while the worker links.
        !plan.per_process && !plan.is_self,
        links,
        loaded.skel.maps.known_images.as_fd(),
    )
    .with_python(python_images(loaded, opts)?)
    .run(images, plan.running, phases)?;
    if plan.preload {
        preload_shim(plan, &mut installed)?;
    }
    Ok(installed)
}

/// The stops the session's threads share. A stop someone else made is
/// theirs to end: releases leave such processes stopped.
fn shared_stops(loaded: &Loaded) -> Result<Arc<Stops>, CaptureError> {
    let stops = Arc::new(Stops::new());
    stops.set_foreign_stops(dup(loaded.skel.maps.foreign_stops.as_fd())?);
    Ok(stops)
}

impl Session {
    /// [`start`](Self::start), streaming every event to `stream`.
    pub(crate) fn start_with(
        opts: &SessionOptions,
        target: Target,
        stream: Option<EventWriter>,
    ) -> Result<Self, CaptureError> {
        let mut phases = phases::Phases::new("start-up");
        let mut plan = Plan::new(opts, &target)?;
        // While the kernel verifies the programs: the up-front images'
        // entry points and tables are prepared, the files every capture
        // symbolizes loaded, the events rings made.
        // They run on CPUs other than the loading thread's meanwhile
        // (sys::StartupCpus).
        let cpus = sys::StartupCpus::split();
        let pin = cpus.map(sys::StartupCpus::pin_helpers);
        let preparing = upfront::Preparing::start(plan.with_tables, plan.probe_new);
        let symbols = start_symbols(opts, &target, plan.spec.as_ref(), cpus);
        let making_rings = MakingRings::start(&plan.rings.sizes)?;
        if let Some(pin) = &pin {
            pin.to_loader();
        }
        let config = plan.config(opts, making_rings.array.as_fd(), attach::uprobe_sessions());
        let mut loaded = Loaded::load(&config).map_err(CaptureError::Load)?;
        drop(pin);
        phases.done("BPF programs loaded and verified");
        let mut links = Links::default();
        let (guardian, cgroup) = guard(&loaded, &mut links, &mut plan, opts, &mut phases)?;
        let event_ring_maps = making_rings.finish()?;
        phases.done("events rings made and inserted");
        let mapping_rings = MappingRings::start(&loaded.skel, &event_ring_maps, &plan.rings.sizes)?;
        set_protectors(&mut loaded, cgroup.is_some(), guardian.as_ref());
        let bss = Bss::of(&loaded.skel).map_err(|source| CaptureError::Io {
            what: "mapping the BPF object's .bss",
            source,
        })?;
        let progs = alloc_programs(&loaded)?;
        let prepared = preparing.finish(plan.with_tables, plan.probe_new)?;
        phases.done("up-front images prepared");
        let up_front = (progs, prepared.images);
        let mut installed = install(&mut plan, &loaded, up_front, opts, &mut links, &mut phases)?;

        // From here on every thread started is in `threads`, declared
        // after `loaded`: any return joins them before the object goes.
        let stops = shared_stops(&loaded)?;
        let mut threads = Threads::new(stops.clone())?;
        let control = Arc::new(Control::default());
        let (stacks_ring, events_ring) =
            mapping_rings.finish(plan.rings.per_cpu.is_some(), plan.rings_taken.take())?;
        let sites = std::mem::take(&mut installed.sites);
        let skipped_images = std::mem::take(&mut installed.skipped);
        let (worker, first_probes) = attach_worker(installed, &loaded, stops, &plan, &target)?;
        let sinks = Sinks::new(opts, &mut plan, &control, stream, worker);
        let rings = PollerRings {
            events: events_ring,
            stacks: stacks_ring,
            event_maps: &event_ring_maps,
        };
        spawn_pollers(&mut threads, &loaded, &bss, rings, sinks, opts)?;
        let coordinator = coordinator(&threads, &loaded, &bss, cgroup.as_ref(), opts, &target)?;
        threads.spawn_coordinator(coordinator)?;
        if opts.faults.fail_after_start {
            return Err(CaptureError::Injected);
        }
        let mut session = Session {
            threads,
            links,
            loaded,
            bss,
            control,
            ops: Mutex::new(()),
            target: target.clone(),
            root: None,
            pidfd: plan.pidfd.take(),
            cgroup,
            _guardian: guardian,
            sites,
            skipped_images,
            image_cache: prepared.image_cache,
            symbols,
            start_ns: sys::monotonic_ns(),
            command: Vec::new(),
            rooms: plan.rooms,
            opts_pressure: opts.pressure_timeout,
            opts_watermark: opts.watermark_percent,
            unwind: opts.unwind,
            debuginfo_dirs: opts.debuginfo_dirs.clone(),
            first_probes,
            per_process: plan.per_process,
            event_ring_maps,
        };
        phases.done("pollers and coordinator started");
        session.start_target(target, plan, opts.process_effects, &mut phases)?;
        Ok(session)
    }

    /// Starts the command, or tracks the running process.
    fn start_target(
        &mut self,
        target: Target,
        plan: Plan,
        effects: bool,
        phases: &mut phases::Phases,
    ) -> Result<(), CaptureError> {
        match target {
            Target::Command(argv) => {
                self.command = argv
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect();
                let spec = plan.spec.expect("resolved above");
                self.start_command(&spec, effects)?;
                phases.done("command started");
            }
            Target::SelfProcess | Target::Pid(_) => {
                let pid = plan.running.expect("a running target");
                self.command = vec![running_identity(pid).1];
                let own = if plan.is_self {
                    self.threads.tids.wait_for(self.threads.started)
                } else {
                    Vec::new()
                };
                self.track_running(pid, &own)?;
                phases.done("running process tracked");
            }
        }
        Ok(())
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
        // Relaxed: BPF reads it only once the command runs (after the
        // `tracked` update below, a syscall).
        self.bss
            .tree_threads()
            .get()
            .store(1, std::sync::atomic::Ordering::Relaxed);
        if effects {
            // Until the whole tree is waited for: SIGTERM, SIGHUP, SIGUSR1
            // and SIGUSR2 reach the command. On failure, dropping `held`
            // closes the go pipe: the child exits unexec'd.
            let forward = sys::signals::Forward::new(pid.into())?;
            if let Some(root) = &mut self.root {
                root.forward = Some(forward);
            }
        }
        put_u32(&self.loaded.skel.maps.tracked, pid, 0)?;
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
        let maps = &self.loaded.skel.maps;
        for &tid in own {
            put_u32(&maps.excluded_threads, tid, 1)?;
        }
        let mut given: HashSet<u32> = own.iter().copied().collect();
        let value = vec![0u8; maps.inflight.value_size() as usize];
        let give = |tid: u32| -> Result<(), CaptureError> {
            let fd = match sys::pidfd_open_thread(tid.into()) {
                Ok(fd) => fd,
                // Exited meanwhile.
                Err(err) if err.errno() == Some(libc::ESRCH) => return Ok(()),
                Err(err) => return Err(err.into()),
            };
            maps.inflight
                .update(
                    &fd.as_raw_fd().to_ne_bytes(),
                    &value,
                    libbpf_rs::MapFlags::NO_EXIST,
                )
                .map_err(CaptureError::Load)
        };
        let mut threads = 0u64;
        let mut give_new = |given: &mut HashSet<u32>| -> Result<(), CaptureError> {
            for tid in thread_ids(pid) {
                if given.insert(tid) {
                    give(tid)?;
                    threads += 1;
                }
            }
            Ok(())
        };
        give_new(&mut given)?;
        put_u32(&maps.tracked, pid, 0)?;
        // Stopped by someone else before memtrail came (`kill -STOP`, a
        // debugger): theirs to resume, not memtrail's (issue 28). Tracked
        // first, so that a SIGCONT from now on clears the mark (BPF's
        // signal_generate); looked at again after marking, for one that
        // came in between.
        let stopped = |pid: u32| {
            sys::thread_states(pid.into()).is_ok_and(|t| t.stopped > 0 || t.stop_pending)
        };
        if stopped(pid) {
            let foreign = maps.foreign_stops.as_fd();
            sys::bpf_map_update(foreign, &pid.to_ne_bytes(), &[1])?;
            if !stopped(pid) {
                sys::bpf_map_delete(foreign, &pid.to_ne_bytes())?;
            }
        }
        // Threads started between the listing and `tracked`: their parent
        // had state, but the process was not tracked yet (see sched_fork).
        give_new(&mut given)?;
        // Relaxed: as in `start_command`; the threads BPF counts from here
        // on add to it atomically.
        self.bss
            .tree_threads()
            .get()
            .store(threads, std::sync::atomic::Ordering::Relaxed);
        self.start_ns = sys::monotonic_ns();
        Ok(())
    }
}
