//! Finishing a session, phase by phase: stop tracking (letting a running
//! process go), start detaching the probes, drain the rings and join the
//! pollers, check that nothing was lost, symbolize the stacks, and assemble
//! the profile ([`assemble`], the one place it is made).

use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::MapCore;

use super::sinks::{EventSink, MappingSink, StackSink};
use super::threads::Joined;
use super::{
    Background, CaptureError, Finish, SETTLE_TIMEOUT, Session, Target, TreeExit, phases, thread_ids,
};
use crate::aggregate::Aggregator;
use crate::attach::worker::AttachWorker;
use crate::attach::{self, Site};
use crate::profile::UnwindReport;
use crate::profile::{
    ExitInfo, HeapCounters, HighWater, LostEvents, PROFILE_FORMAT, PROFILE_VERSION, PressureStats,
    ProbeEntry, ProcessEntry, Profile, Scope, SkippedImage, StackEntry, wait_status_code,
};
use crate::ring::merge::EventsRing;
use crate::sys::{self, ChildExit};

/// What the pollers handed back, drained.
struct Drained {
    events: EventSink,
    stacks: StackSink,
    mappings: MappingSink,
    attacher: AttachWorker,
    /// The rings' high-water marks the pollers saw.
    seen: HighWater,
    /// The images' unwind tables, and the tables' memory.
    images_seen: (
        Vec<crate::profile::unwind::ImageTable>,
        crate::profile::unwind::TableMemory,
    ),
    /// Every site probed, up front and by the worker.
    sites: Vec<Site>,
    /// Whether every ring drained in time.
    drained: bool,
    detaching: Option<Background<()>>,
}

/// Everything the profile is made of (see [`assemble`]).
struct Parts<'a> {
    agg: &'a Aggregator,
    command: Vec<String>,
    exit: ExitInfo,
    /// When the command started and the capture ended.
    span: (u64, u64),
    lost: LostEvents,
    probes: Vec<ProbeEntry>,
    attached: bool,
    probe_scope: Scope,
    event_rings: u32,
    skipped_images: Vec<SkippedImage>,
    /// The processes that loaded the preload shim.
    preloaded: std::collections::BTreeSet<u32>,
    stacks: Vec<StackEntry>,
    pressure: PressureStats,
    unwind: UnwindReport,
    regions: Vec<crate::profile::regions::RegionEntry>,
    /// Allocations naming stacks never recorded.
    unrecorded_stacks: crate::profile::UnrecordedStacks,
}

/// Builds the profile document: the one place it is assembled. Times become
/// relative to the start of the command.
fn assemble(parts: Parts<'_>) -> Profile {
    let agg = parts.agg;
    let (start_ns, end_ns) = parts.span;
    let rel = |ts: u64| ts.saturating_sub(start_ns);
    let mut totals = agg.totals();
    totals.peak_live_at_ns = rel(totals.peak_live_at_ns);
    Profile {
        format: PROFILE_FORMAT.to_owned(),
        version: PROFILE_VERSION,
        command: parts.command,
        exit: parts.exit,
        attached: parts.attached,
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
                resident: p.resident,
                preloaded: parts.preloaded.contains(&p.pid),
                incomplete: agg.corrupt_rings().iter().any(|c| c.pid == p.pid),
            })
            .collect(),
        lost_events: parts.lost,
        probe_scope: parts.probe_scope,
        event_rings: parts.event_rings,
        probes: parts.probes,
        skipped_images: parts.skipped_images,
        stacks: parts.stacks,
        pressure: parts.pressure,
        unwind: parts.unwind,
        timeline: agg.timeline(start_ns).unwrap_or_default(),
        regions: parts.regions,
        resident: agg.resident(),
        anomalies: crate::profile::Anomalies {
            corrupt_rings: agg.corrupt_rings().to_vec(),
            unrecorded_stacks: parts.unrecorded_stacks,
        },
    }
}

impl Session {
    /// Ends the capture: stops tracking, drains every ring, joins the
    /// threads and builds the profile. Call [`wait`](Self::wait) first to
    /// capture a command to its end; otherwise the profile holds what the
    /// tree did so far.
    pub fn finish(mut self) -> Result<Finish, CaptureError> {
        let mut phases = phases::Phases::new("finish");
        let mut pressure = self.stop_tracking()?;
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
        let mut drained = self.drain(untracked, detaching)?;
        phases.done("drained, pollers joined");
        let (lost, end_ns) = self.check(&mut drained)?;
        let Drained {
            events,
            mut stacks,
            mappings,
            mut attacher,
            seen,
            images_seen,
            sites,
            detaching,
            ..
        } = drained;
        let EventSink {
            mut agg,
            stream,
            stream_error,
            markers,
            shim_stacks,
            shim,
            ..
        } = events;
        stacks.stacks.extend(shim_stacks.stacks);
        stacks.malformed += shim_stacks.malformed;
        self.end_aggregation(&mut agg, shim.as_ref(), end_ns);
        let root_exit = self.root_exit(&agg);
        let mapped = crate::unwind::mapped_only(images_seen.0, &mappings.mappings);
        let images: Vec<std::path::PathBuf> = mapped.iter().map(|t| t.image.clone()).collect();
        let (stacks, mut unrecorded_stacks) = super::stages::symbolize_stacks(
            &agg,
            stacks.stacks,
            mappings.mappings,
            &images,
            &self.symbols,
            &crate::symbolize::debug_dirs(&self.debuginfo_dirs),
        );
        unrecorded_stacks.add(&agg.ring_unrecorded_total());
        phases.done("stacks symbolized");
        pressure.high_water = crate::bpf::counters::read_high_water(&self.loaded.skel).max(seen);
        let mut skipped_images = std::mem::take(&mut self.skipped_images);
        skipped_images.append(&mut attacher.skipped);
        let profile = assemble(Parts {
            agg: &agg,
            command: std::mem::take(&mut self.command),
            exit: exit_info(root_exit),
            span: (self.start_ns, end_ns),
            lost,
            probes: self.probes(&sites),
            attached: matches!(self.target, Target::Pid(_)),
            probe_scope: if self.per_process {
                Scope::PerProcess
            } else {
                Scope::SystemWide
            },
            event_rings: self.event_ring_maps.len() as u32,
            skipped_images,
            preloaded: std::mem::take(&mut attacher.preloaded),
            unwind: crate::unwind::report(self.unwind, mapped, images_seen.1, &stacks),
            stacks,
            pressure,
            regions: markers.finish(),
            unrecorded_stacks,
        });
        phases.done("profile assembled");
        Ok(Finish {
            slow_probes: crate::profile::slow_probes(&profile.probes),
            profile,
            exit: TreeExit { root: root_exit },
            stream,
            stream_error,
            detaching,
        })
    }

    /// Stops tracking: a running process memtrail attached to keeps
    /// running, and BPF lets go of it first (no event, no stop, no attach
    /// hold from here on). Stops the pressure coordinator; its numbers.
    fn stop_tracking(&mut self) -> Result<PressureStats, CaptureError> {
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
        match pressure {
            Some(Ok(Ok(stats))) => Ok(stats),
            Some(Ok(Err(err))) => Err(CaptureError::Pressure(err)),
            Some(Err(_)) => Err(CaptureError::PollerPanicked),
            None => Ok(PressureStats::default()),
        }
    }

    /// Whatever happened to the tree, drains and joins the pollers; records
    /// what the worker examined in the image cache; closes the worker's
    /// links (on a thread, after `detaching`, when nothing is tracked).
    fn drain(
        &mut self,
        untracked: bool,
        detaching: Option<Background<()>>,
    ) -> Result<Drained, CaptureError> {
        let barrier = self.threads.barrier.clone();
        let epoch = barrier.raise();
        let drained = barrier.wait(epoch, Some(super::DRAIN_TIMEOUT));
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
        let mut attacher = attacher.sink;
        let images_seen = attacher
            .tables
            .take()
            .map(|t| {
                let memory = t.memory_report();
                tracing::debug!(
                    slots = memory.extent_slots,
                    peak = memory.peak_slots,
                    released = memory.released,
                    mib = memory.locked_bytes >> 20,
                    "unwind tables: slots made, most in use at once, tables released, \
                     locked memory of their shards"
                );
                (t.images_seen, memory)
            })
            .unwrap_or_default();
        let mut sites = std::mem::take(&mut self.sites);
        sites.append(&mut attacher.sites);
        for (path, stamp, has_sites) in attacher.examined.drain(..) {
            self.image_cache.record(&path, stamp, has_sites);
        }
        self.image_cache.save();
        // The images examined during the run were probed by the attach
        // worker: their links go now, on a thread as the others or, for a
        // tree still tracked, at once.
        let mut links = std::mem::take(&mut attacher.links);
        let unlinking = attacher.per_process.take().map(|shared| {
            let mut per_process = std::mem::take(&mut *attach::per_process::lock(&shared));
            attacher.preloaded = std::mem::take(&mut per_process.preloaded);
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
        Ok(Drained {
            events: events.sink,
            stacks: stacks.sink,
            mappings: mappings.sink,
            attacher,
            seen,
            images_seen,
            sites,
            drained,
            detaching,
        })
    }

    /// Fails the capture if an image could not be probed, a ring did not
    /// drain, records were lost or malformed; the loss counters (all zero)
    /// and when the capture ended.
    fn check(&self, d: &mut Drained) -> Result<(LostEvents, u64), CaptureError> {
        if let Some(failure) = std::mem::take(&mut d.attacher.failures).into_iter().next() {
            return Err(CaptureError::AttachImage {
                image: failure.image,
                pid: failure.pid,
                source: failure.error,
            });
        }
        if !d.drained {
            return Err(CaptureError::DrainTimeout(super::DRAIN_TIMEOUT));
        }
        let end_ns = sys::monotonic_ns();
        let elsewhere = crate::bpf::counters::read_returns_elsewhere(&self.loaded.skel);
        if elsewhere > 0 {
            tracing::warn!(
                "the kernel's return probes handed {elsewhere} allocator calls back at a stack \
                 other than their caller's: the tracked program may have been corrupted \
                 (issue 40); its counts are not to be trusted"
            );
        }
        let lost = crate::bpf::counters::read_lost(&self.loaded.skel);
        if lost.any() {
            let advice = if self.opts_pressure.enabled() {
                let bss = self
                    .loaded
                    .skel
                    .maps
                    .bss_data
                    .as_deref()
                    .expect("the BPF object has a .bss");
                super::stages::loss_advice(
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
        let malformed = d.events.agg.malformed
            + d.stacks.malformed
            + d.mappings.malformed
            + d.attacher.malformed;
        if malformed > 0 {
            return Err(CaptureError::Malformed(malformed));
        }
        Ok((lost, end_ns))
    }

    /// Ends the aggregation: the ring files the merge found corrupt (issue
    /// 40) are each their process's, as the records the sink could not
    /// read; every process still running ends now; the root's parent is
    /// memtrail.
    fn end_aggregation(
        &self,
        agg: &mut Aggregator,
        shim: Option<&crate::ring::shim::Offer>,
        end_ns: u64,
    ) {
        for fault in shim
            .map(crate::ring::shim::Offer::faults)
            .unwrap_or_default()
        {
            let what = format!("{} (byte {} of the ring)", fault.what, fault.offset);
            agg.refuse_record(fault.pid, Some(fault.ring), &what);
        }
        for (pid, counts) in shim
            .map(crate::ring::shim::Offer::unrecorded)
            .unwrap_or_default()
        {
            agg.ring_unrecorded(pid, counts);
        }
        agg.finish(end_ns);
        if let Some(root) = &self.root {
            agg.set_parent(root.pid, std::process::id());
        }
    }

    /// How the root process ended: as waited for, or, for a running process
    /// (not memtrail's child), as its exit record gave it if it exited while
    /// tracked.
    fn root_exit(&self, agg: &Aggregator) -> Option<ChildExit> {
        match self.target {
            Target::Pid(pid) => agg.exit_status(pid).map(|status| match status & 0x7f {
                0 => ChildExit::Exited((status >> 8) & 0xff),
                sig => ChildExit::Signaled(sig),
            }),
            _ => self.root.as_ref().and_then(|r| r.exit.flatten()),
        }
    }

    /// The probe sites with their hit counts (the probes are detached:
    /// the counts are final).
    fn probes(&self, sites: &[Site]) -> Vec<ProbeEntry> {
        let hits = attach::read_site_hits(&self.loaded.skel, sites);
        sites
            .iter()
            .zip(hits)
            .map(|(site, hits)| ProbeEntry {
                hits,
                ..ProbeEntry::from(site)
            })
            .collect()
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
    /// bpf/pressure.c), and one that saw the process tracked just
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
    /// task_call in bpf/task.c), so their calls are not seen any
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
}

/// The profile's form of how the root process ended.
fn exit_info(exit: Option<ChildExit>) -> ExitInfo {
    match exit {
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
    }
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
