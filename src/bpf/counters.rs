//! Readers of the counters the BPF programs keep in `.bss`.

use super::skel::memtrail::MemtrailSkel;
use crate::profile::{HighWater, LostEvents};

/// The high-water marks the producers kept (only with pressure on: see
/// check_pressure in bpf/pressure.c).
pub(crate) fn read_high_water(skel: &MemtrailSkel<'_>) -> HighWater {
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

pub(crate) fn read_lost(skel: &MemtrailSkel<'_>) -> LostEvents {
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
        resumed: bss.drops_resumed,
    }
}

/// Returns of outermost allocating calls the kernel's return probes handed
/// back at a stack pointer other than their caller's (`returns_elsewhere`,
/// see alloc_exit in bpf/alloc.c; issue 40): 0 unless this kernel's
/// return probes broke a call of a tracked program.
pub(crate) fn read_returns_elsewhere(skel: &MemtrailSkel<'_>) -> u64 {
    skel.maps
        .bss_data
        .as_deref()
        .expect("the BPF object has a .bss")
        .returns_elsewhere
}
