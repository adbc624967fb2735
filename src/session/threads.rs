//! Every thread of a session: the four pinned pollers, started by one
//! helper ([`Threads::spawn_poller`]), and the pressure coordinator.
//! Dropping [`Threads`] stops and joins them all, and resumes whatever the
//! session still holds stopped.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::attach::worker::AttachWorker;
use crate::bpf::bss::Bss;
use crate::engine::idle::DeepSleep;
use crate::engine::{self, Barrier, Finished, Pipeline, Sink, ThreadIds};
use crate::pressure::{Coordinator, PressureError};
use crate::proctree::stops::Stops;
use crate::profile::PressureStats;
use crate::ring::Consume;
use crate::ring::merge::EventsRing;
use crate::sys;

use super::CaptureError;
use super::sinks::{EventSink, MappingSink, StackSink};

/// The pollers, by their index in the barrier (and their ring's
/// `sleeping` flag in .bss).
pub(super) const POLLERS: usize = 4;

pub(super) struct Threads {
    pub barrier: Arc<Barrier>,
    pub done: Arc<AtomicBool>,
    pub done_fd: OwnedFd,
    /// Signalled when the pressure coordinator gave up (a late episode).
    pub failed_fd: Arc<OwnedFd>,
    pub stops: Arc<Stops>,
    pub tids: Arc<ThreadIds>,
    /// Threads started so far (the pollers first, in barrier order).
    pub started: usize,
    /// The core each poller is pinned to, if any.
    cores: Vec<Option<core_affinity::CoreId>>,
    pub events: Option<JoinHandle<Finished<EventSink, EventsRing>>>,
    pub stacks: Option<JoinHandle<Finished<StackSink>>>,
    pub mappings: Option<JoinHandle<Finished<MappingSink>>>,
    pub attach: Option<JoinHandle<Finished<AttachWorker>>>,
    pub pressure: Option<JoinHandle<Result<PressureStats, PressureError>>>,
}

/// What the pollers handed back.
pub(super) struct Joined {
    pub events: Finished<EventSink, EventsRing>,
    pub stacks: Finished<StackSink>,
    pub mappings: Finished<MappingSink>,
    pub attach: Finished<AttachWorker>,
}

impl Threads {
    /// No thread yet; `stops` is the session's stop ownership.
    pub fn new(stops: Arc<Stops>) -> Result<Self, CaptureError> {
        let barrier = Barrier::new(POLLERS).map_err(|source| CaptureError::Io {
            what: "creating the pipeline barrier",
            source,
        })?;
        Ok(Self {
            barrier,
            done: Arc::new(AtomicBool::new(false)),
            done_fd: sys::eventfd()?,
            failed_fd: Arc::new(sys::eventfd()?),
            stops,
            tids: Arc::new(ThreadIds::default()),
            started: 0,
            cores: engine::poller_cores(POLLERS),
            events: None,
            stacks: None,
            mappings: None,
            attach: None,
            pressure: None,
        })
    }

    /// Starts the poller of `pipeline`, the next of the barrier's
    /// pipelines: pinned to its core, named, in the session's thread ids,
    /// sleeping deeply on `wake` (its rings' descriptors) with its ring's
    /// `sleeping` flag in `bss`.
    pub fn spawn_poller<S: Sink, R: Consume>(
        &mut self,
        mut pipeline: Pipeline<S, R>,
        wake: &[BorrowedFd<'_>],
        bss: &Bss,
    ) -> Result<JoinHandle<Finished<S, R>>, CaptureError> {
        let index = self.started;
        let deep = DeepSleep::new(bss.sleeping(index), wake, self.barrier.kick_fd()).map_err(
            |source| CaptureError::Io {
                what: "setting up a poller's deep sleep",
                source,
            },
        )?;
        pipeline.deep_sleep = Some(deep);
        let handle = engine::spawn(
            pipeline,
            self.barrier.clone(),
            index,
            self.cores[index],
            self.tids.clone(),
        )
        .map_err(|source| CaptureError::Io {
            what: "starting a poller thread",
            source,
        })?;
        self.started += 1;
        Ok(handle)
    }

    /// Starts the pressure coordinator, after the pollers.
    pub fn spawn_coordinator(&mut self, coordinator: Coordinator) -> Result<(), CaptureError> {
        let tids = self.tids.clone();
        let failed_fd = self.failed_fd.clone();
        let handle = std::thread::Builder::new()
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
            })?;
        self.pressure = Some(handle);
        self.started += 1;
        Ok(())
    }

    /// Stops the coordinator; its result (None if it was not started).
    pub fn stop_pressure(
        &mut self,
    ) -> Option<std::thread::Result<Result<PressureStats, PressureError>>> {
        self.done.store(true, Ordering::Release);
        sys::eventfd_signal(self.done_fd.as_fd());
        self.pressure.take().map(JoinHandle::join)
    }

    /// Stops and joins the pollers; None if one panicked or was not started.
    pub fn join_pollers(&mut self) -> Option<Joined> {
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
