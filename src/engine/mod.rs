//! Poller threads and the epoch barrier that synchronizes them.
//!
//! Each pipeline is one ring consumed by one pinned thread that polls it
//! (paced while records flow, with backoff, naps and deep sleep when it is
//! empty: [`idle::IdleWait`]) and hands every record to its [`Sink`]. No
//! lock is taken on this path.
//!
//! Barrier: a coordinator raises the epoch ([`Barrier::raise`]); each
//! pipeline, on seeing a new epoch, reads its ring's producer position,
//! drains up to it, then acknowledges the epoch. A coordinator that has first
//! made sure no producer of interest is still running (the tree exited, or
//! is stopped) thus knows, once every pipeline acknowledged, that every
//! record those producers made has been handed to a sink.

pub mod idle;
pub mod live;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::ring::{Consume, RingConsumer};

/// Receives the records of one pipeline, on its poller thread.
pub trait Sink: Send + 'static {
    fn record(&mut self, bytes: &[u8]);

    /// Called on the poller thread once the pipeline has drained for
    /// `epoch`, before it acknowledges it: the sink has then seen every
    /// record made before the epoch was raised (see the module docs).
    fn drained(&mut self, _epoch: u64) {}
}

/// Epoch counters shared by a coordinator and its pipelines.
#[derive(Debug)]
pub struct Barrier {
    /// The epoch every pipeline must reach.
    epoch: CachePadded<AtomicU64>,
    /// The epoch each pipeline has drained to.
    acks: Box<[CachePadded<AtomicU64>]>,
    stop: AtomicBool,
    /// Signalled on every raise and stop, to wake pollers in deep sleep.
    kick: OwnedFd,
}

impl Barrier {
    pub fn new(pipelines: usize) -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            epoch: CachePadded::new(AtomicU64::new(0)),
            acks: (0..pipelines)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            stop: AtomicBool::new(false),
            kick: crate::sys::eventfd().map_err(|e| e.source)?,
        }))
    }

    /// The eventfd pollers in deep sleep wait on.
    pub fn kick_fd(&self) -> BorrowedFd<'_> {
        self.kick.as_fd()
    }

    /// Asks every pipeline to drain what its producers have reserved so far.
    /// Returns the epoch to wait for.
    pub fn raise(&self) -> u64 {
        // SeqCst: everything the coordinator observed before raising (e.g.
        // that the tree exited) is ordered before the pipelines' reads of
        // their producer positions, which follow their load of the epoch.
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        crate::sys::eventfd_signal(self.kick.as_fd());
        epoch
    }

    /// The epoch last raised. An epoch above it is raised after this read.
    pub fn current(&self) -> u64 {
        // SeqCst: ordered with `raise` (see `requested`).
        self.epoch.load(Ordering::SeqCst)
    }

    /// Waits until pipeline `index` acknowledged `epoch`; false on timeout.
    pub fn wait_one(&self, index: usize, epoch: u64, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut idle = idle::IdleWait::default();
        loop {
            // Acquire pairs with the Release in `ack`, as in `wait`.
            if self.acks[index].load(Ordering::Acquire) >= epoch {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            idle.idle();
        }
    }

    /// Waits until every pipeline acknowledged `epoch`; false on timeout.
    pub fn wait(&self, epoch: u64, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut idle = idle::IdleWait::default();
        loop {
            // Acquire pairs with the Release in `ack`: the sinks' work for
            // the epoch is visible to the coordinator.
            if self.acks.iter().all(|a| a.load(Ordering::Acquire) >= epoch) {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            idle.idle();
        }
    }

    /// Pipelines that have not acknowledged `epoch`.
    pub fn lagging(&self, epoch: u64) -> Vec<usize> {
        (0..self.acks.len())
            .filter(|&i| self.acks[i].load(Ordering::Acquire) < epoch)
            .collect()
    }

    /// Tells the pollers to exit after their current round.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        crate::sys::eventfd_signal(self.kick.as_fd());
    }

    fn requested(&self) -> u64 {
        // SeqCst pairs with `raise`: a poller seeing the new epoch reads the
        // producer position afterwards.
        self.epoch.load(Ordering::SeqCst)
    }

    fn ack(&self, pipeline: usize, epoch: u64) {
        self.acks[pipeline].store(epoch, Ordering::Release);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// One ring (or several merged: [`crate::ring::merge::Merged`]) and the
/// sink its records go to.
pub struct Pipeline<S: Sink, R: Consume = RingConsumer> {
    pub name: &'static str,
    pub ring: R,
    pub sink: S,
    /// Fault injection for tests.
    pub fault: Fault,
    /// Blocking until producers wake the poller, when idle for long.
    pub deep_sleep: Option<idle::DeepSleep>,
    /// Whether the poller paces its looks while records flow
    /// ([`idle::BUSY_PACE`]): for the high-rate rings. Rings whose records
    /// hold a process stopped or racing its exit (attach requests,
    /// mappings) are looked at again at once.
    pub paced: bool,
}

/// Test-only fault injection into a pipeline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    #[default]
    None,
    /// Consume nothing until the first barrier, so a small ring overflows
    /// deterministically.
    Stall,
    /// Consume slowly (a pause every few records), so producers outrun it.
    Slow,
    /// Consume nothing and acknowledge no barrier until stopped.
    Wedge,
}

/// Picks a core for each of `n` pollers, in pipeline order: distinct cores
/// from the last one down, wrapping around when there are fewer cores than
/// pollers, so that one busy core never holds every poller (issue 11: on two
/// cores all four shared core 1, and a pressure pause waited on all of them
/// whenever it was busy). The events and stacks pollers, the busy ones,
/// come first and so never share a core when there are two. `None` when
/// the process may run on one core only.
pub fn poller_cores(n: usize) -> Vec<Option<core_affinity::CoreId>> {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    if cores.len() < 2 {
        return vec![None; n];
    }
    (0..n)
        .map(|i| Some(cores[cores.len() - 1 - i % cores.len()]))
        .collect()
}

/// What a poller hands back when the barrier stops it.
pub struct Finished<S, R = RingConsumer> {
    pub sink: S,
    /// The highest fill of the ring the poller saw, in bytes
    /// ([`RingConsumer::high_water`]).
    pub high_water: u64,
    /// The ring's mapping, handed back rather than unmapped on the poller
    /// thread: unmapping a large ring takes milliseconds (every page of
    /// both mappings), which the caller can spend elsewhere.
    pub ring: R,
}

/// The thread ids of memtrail's own threads, each added by the thread
/// itself as it starts (a process that tracks itself leaves them out).
#[derive(Debug, Default)]
pub struct ThreadIds {
    tids: std::sync::Mutex<Vec<u32>>,
    added: std::sync::Condvar,
}

impl ThreadIds {
    /// Adds the calling thread.
    pub fn add_current(&self) {
        let tid = crate::sys::gettid().get();
        let mut tids = self.tids.lock().unwrap_or_else(|e| e.into_inner());
        tids.push(tid);
        self.added.notify_all();
    }

    /// Waits until `n` threads have added themselves; returns their ids.
    pub fn wait_for(&self, n: usize) -> Vec<u32> {
        let mut tids = self.tids.lock().unwrap_or_else(|e| e.into_inner());
        while tids.len() < n {
            tids = self.added.wait(tids).unwrap_or_else(|e| e.into_inner());
        }
        tids.clone()
    }
}

/// Starts the poller of `pipeline` as pipeline number `index` of `barrier`.
/// The thread adds itself to `tids`, and returns the sink and the ring's
/// high-water mark when the barrier stops it.
pub fn spawn<S: Sink, R: Consume>(
    mut pipeline: Pipeline<S, R>,
    barrier: Arc<Barrier>,
    index: usize,
    core: Option<core_affinity::CoreId>,
    tids: Arc<ThreadIds>,
) -> std::io::Result<JoinHandle<Finished<S, R>>> {
    std::thread::Builder::new()
        .name(format!("memtrail-{}", pipeline.name))
        .spawn(move || {
            tids.add_current();
            if let Some(core) = core {
                if !core_affinity::set_for_current(core) {
                    tracing::debug!(core = core.id, "could not pin poller; running unpinned");
                }
            }
            poll_loop(&mut pipeline, &barrier, index);
            Finished {
                high_water: pipeline.ring.high_water(),
                sink: pipeline.sink,
                ring: pipeline.ring,
            }
        })
}

fn poll_loop<S: Sink, R: Consume>(p: &mut Pipeline<S, R>, barrier: &Barrier, index: usize) {
    let mut idle = idle::IdleWait::default();
    if let Some(deep) = p.deep_sleep.take() {
        let deep = match p.ring.unwoken_latency() {
            Some(longest) => deep.at_most(longest),
            None => deep,
        };
        idle = idle.with_deep_sleep(deep);
    }
    let mut acked = 0;
    let mut since_pause = 0u32;
    let slow = p.fault == Fault::Slow;
    let mut consumed = 0;
    let mut record = |sink: &mut S, rec: &[u8]| {
        sink.record(rec);
        if slow {
            since_pause += 1;
            if since_pause == 64 {
                since_pause = 0;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    };
    loop {
        let stopping = barrier.stopping();
        if p.fault == Fault::Wedge {
            if stopping {
                return;
            }
            idle.idle();
            continue;
        }
        if p.paced {
            idle.pace(consumed, p.ring.size() as u64, || {
                barrier.requested() > acked
            });
        }
        let wanted = barrier.requested();
        let mut handed = 0;
        let before = p.ring.position();
        if p.fault != Fault::Stall || wanted > 0 {
            handed = p.ring.poll(&mut |rec: &[u8]| record(&mut p.sink, rec));
        }
        if wanted > acked {
            handed += p.ring.drain(&mut |rec: &[u8]| record(&mut p.sink, rec));
            p.sink.drained(wanted);
            acked = wanted;
            barrier.ack(index, wanted);
        }
        if stopping {
            return;
        }
        consumed = p.ring.position() - before;
        if handed > 0 {
            idle.reset();
        } else {
            let ring = &p.ring;
            idle.idle_until(|| {
                ring.pending() == 0 && barrier.requested() == acked && !barrier.stopping()
            });
        }
    }
}
