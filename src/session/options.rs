//! A session's tunables and their defaults, and fault injection for tests.

use crate::engine::Fault;
use std::time::Duration;

/// Default size of the events ring: 64 MiB absorbs long bursts.
pub const DEFAULT_RING_SIZE: usize = 64 << 20;

/// Default frames per allocation stack.
pub const DEFAULT_STACK_DEPTH: u32 = 127;

/// Frames a stack record holds (`MT_MAX_STACK` in bpf/memtrail.h).
pub const MAX_STACK_DEPTH: u32 = 128;

/// How long the final drain may take before the capture is declared broken.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Test-only fault injection (`MEMTRAIL_FAULT=stall-events,slow-events,
/// wedge-events,stall-stacks,one-thread-slot,one-row-cache-slot,one-stack-window,no-cgroup,fail-after-start,
/// find-vma-busy,returns-elsewhere,
/// late-pause,late-release,stop-after-cgroup,sweep-unwind-tables,shim-hook-only,
/// shim-no-stack-cache` in
/// the CLI; see
/// [`crate::engine::Fault`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub events: Fault,
    pub stacks: Fault,
    /// One thread slot for the whole tree (`thread_slots` in
    /// bpf/maps.bpf.h): the other threads keep their state in task
    /// storage, the path a thread takes when its slot is held.
    pub one_thread_slot: bool,
    /// One slot per image in BPF's cache of unwind rules (`row_cache`):
    /// every frame of an image contends for it, so an entry is mostly
    /// another frame's (the path whose tag check makes a cached rule the
    /// searched one).
    pub one_row_cache_slot: bool,
    /// One stack window in BPF (`stack_windows`): concurrent walks contend
    /// for it, so a walk often finds it claimed and reads words directly
    /// (the path whose claim keeps a walk from another's window).
    pub one_stack_window: bool,
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
    /// BPF takes every allocating call's return as handed back at a stack
    /// other than its caller's (`returns-elsewhere`): the capture's warning
    /// about the kernel's return probes (issue 40).
    pub returns_elsewhere: bool,
    /// The pressure coordinator pauses late (`late-pause`) or resumes
    /// late (`late-release`).
    pub pressure: crate::pressure::PressureFault,
    /// memtrail stops itself (SIGSTOP) right after making the tree's
    /// cgroup (`stop-after-cgroup`): a test can kill it at that point.
    pub stop_after_cgroup: bool,
    /// Unwind tables of images no process maps are released at every
    /// table load (`sweep-unwind-tables`), not only when the tables would
    /// grow by a shard: a test sees slots reused without loading gigabytes.
    pub sweep_unwind_tables: bool,
    /// The preload shim gets no rings (`shim-hook-only`): every process
    /// takes its hook path, as one does without libunwind, without memtrail's
    /// ring file or with every ring taken (issue 22).
    pub shim_hook_only: bool,
    /// The preload shim walks every stack (`shim-no-stack-cache`): the
    /// reference its stack cache is compared with.
    pub shim_no_stack_cache: bool,
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
            if name == "one-stack-window" {
                faults.one_stack_window = true;
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
            if name == "returns-elsewhere" {
                faults.returns_elsewhere = true;
                continue;
            }
            if name == "find-vma-busy" {
                faults.find_vma_busy = true;
                continue;
            }
            if name == "sweep-unwind-tables" {
                faults.sweep_unwind_tables = true;
                continue;
            }
            if name == "shim-hook-only" {
                faults.shim_hook_only = true;
                continue;
            }
            if name == "shim-no-stack-cache" {
                faults.shim_no_stack_cache = true;
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

/// Pipeline names by barrier index.
pub(crate) const PIPELINES: [&str; 4] = ["events", "stacks", "mappings", "attach"];
