//! Per-CPU events rings (issue 17): each CPU's producers reserve from a
//! ring of their own, and the pollers merge the rings back in time order.
//! A free read before the malloc that returned its block would count as a
//! free of an unknown block and leave the block live.

use std::collections::{HashMap, HashSet};

use crate::support::{Counters, capture_flags, cmd, kind, num, of_pid, stream_root, tid};

const ROUNDS: u64 = 20_000;

/// The handoff fixture's counters (see tests/fixtures/handoff.c): blocks
/// malloc'd on one CPU and freed on the other, both ways, then a thread
/// moving between CPUs between each malloc and its free. glibc adds the
/// DTVs of the two new thread stacks (thread C reuses one) and a tcache
/// free per exiting thread.
fn handoff_counters() -> Counters {
    let pairs = 2 * ROUNDS + ROUNDS / 10;
    let dtv = 17 * 16;
    Counters {
        allocations: pairs + 2,
        frees: pairs,
        reallocs: 0,
        allocated_bytes: ROUNDS * (3001 + 3011) + ROUNDS / 10 * 3019 + 2 * dtv,
        freed_bytes: ROUNDS * (3001 + 3011) + ROUNDS / 10 * 3019,
        peak_live_bytes: 0,
        live_bytes_at_exit: 2 * dtv,
        live_allocations_at_exit: 2,
        unmatched_frees: 3,
    }
}

fn possible_cpus() -> u32 {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible").expect("possible CPUs");
    let last = list.trim().rsplit(['-', ',']).next().expect("a CPU number");
    last.parse::<u32>().expect("a CPU number") + 1
}

fn check_handoff(rings: &str) -> u32 {
    let rounds = ROUNDS.to_string();
    let run = capture_flags(
        &["--event-rings", rings],
        &cmd("handoff", &[rounds.as_ref()]),
        b"",
        &[],
    );
    run.expect_code(0);
    let profile = run.profile();
    let mut got = Counters::of(&profile["totals"]);
    // The peak depends on how the threads interleave.
    got.peak_live_bytes = 0;
    assert_eq!(got, handoff_counters(), "{rings}");
    num(profile, "event_rings") as u32
}

/// Check that with one ring per CPU every block handed to another CPU's
/// thread and freed there is matched to its malloc, and that a thread
/// moving between CPUs has its frees matched too: the exact counters of a
/// single ring.
#[test]
fn event_rings_per_cpu_frees_follow_their_mallocs() {
    assert_eq!(check_handoff("per-cpu"), possible_cpus());
}

/// Check the same counters with the one shared ring.
#[test]
fn event_rings_shared_same_counters() {
    assert_eq!(check_handoff("shared"), 1);
}

/// Check the order of the events stream with per-CPU rings: each thread's
/// records in time order, and every free after the malloc of its block.
#[test]
fn event_rings_per_cpu_stream_in_time_order() {
    let run = capture_flags(
        &["--event-rings", "per-cpu"],
        &cmd("handoff", &["2000".as_ref()]),
        b"",
        &[],
    );
    run.expect_code(0);
    let events = run.events();
    let ours = of_pid(events, stream_root(events));
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut live = HashSet::new();
    let mut unmatched = 0;
    for e in &ours {
        let ts = num(e, "ts_ns");
        let prev = last.insert(tid(e), ts).unwrap_or(0);
        assert!(ts >= prev, "thread {} went back in time: {e}", tid(e));
        match kind(e) {
            "malloc" | "calloc" => {
                live.insert(num(e, "addr"));
            }
            "free" if !live.remove(&num(e, "addr")) => unmatched += 1,
            _ => {}
        }
    }
    // The three tcache frees at thread exit.
    assert_eq!(unmatched, 3);
    assert_eq!(live.len(), 2, "the two DTVs");
}
