//! CPUs at start-up: the kernel verifies the BPF programs on the loading
//! thread while helper threads prepare the up-front images, load symbols
//! ahead and make the events rings. On two CPUs the scheduler often ran a
//! helper next to the loader, and the load took 180-350 ms from run to run
//! (perf/RESULTS.md): the loader gets a CPU of its own and the helpers the
//! others, until the load is done.

use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// The calling thread's CPUs, split for start-up: the first for the
/// loader, the others for its helpers.
#[derive(Clone, Copy)]
pub struct StartupCpus {
    all: CpuSet,
    loader: CpuSet,
    helpers: CpuSet,
}

impl StartupCpus {
    /// None with fewer than two CPUs, or when they cannot be read.
    pub fn split() -> Option<Self> {
        let all = sched_getaffinity(None).ok()?;
        if all.count() < 2 {
            return None;
        }
        let first = (0..CpuSet::MAX_CPU).find(|&cpu| all.is_set(cpu))?;
        let mut loader = CpuSet::new();
        loader.set(first);
        let mut helpers = all;
        helpers.unset(first);
        Some(Self {
            all,
            loader,
            helpers,
        })
    }

    /// The calling thread runs on the helpers' CPUs (the threads it starts
    /// now do too) until [`StartupPin::to_loader`], and on every CPU it had
    /// once the pin is dropped.
    pub fn pin_helpers(self) -> StartupPin {
        set_here(&self.helpers, "helpers");
        StartupPin(self)
    }

    /// The calling thread runs on every CPU it had.
    pub fn restore_here(&self) {
        set_here(&self.all, "all");
    }
}

/// See [`StartupCpus::pin_helpers`].
pub struct StartupPin(StartupCpus);

impl StartupPin {
    /// The calling thread runs on the loader's CPU.
    pub fn to_loader(&self) {
        set_here(&self.0.loader, "loader");
    }
}

impl Drop for StartupPin {
    fn drop(&mut self) {
        self.0.restore_here();
    }
}

fn set_here(cpus: &CpuSet, which: &str) {
    if let Err(err) = sched_setaffinity(None, cpus) {
        tracing::debug!(%err, which, "start-up CPUs not set");
    }
}
