//! Records a tracked process writes into its own preload-shim ring (issue
//! 40): that ring is the process's word, not memtrail's. `ring_writer.c`
//! writes into the ring its thread claimed, as a hostile program could.

use crate::support::{self, capture_flags, cmd, num, process, root_process};

/// The shim's ring path needs libunwind (scripts/test.sh installs it).
fn ring_path() {
    assert!(
        support::libunwind_installed(),
        "the preload shim's ring path needs libunwind (scripts/test.sh installs it)"
    );
}

/// Check that a stack record claiming 200 frames (at most 128) in a
/// tracked process's own ring is that process's corruption, not
/// memtrail's (issue 40: the capture failed with exit 70, "memtrail's BPF
/// and userspace disagree", naming no process): the capture goes on and
/// exits with the command's status, one warning at the record names the
/// process (pid) and what was wrong and one at the end its executable and
/// the count (never a line per record), the profile lists it in
/// `anomalies.corrupt_rings` and marks the process incomplete, the
/// summary says so, and its allocations after the record are counted.
#[test]
fn capture_shim_stack_too_deep_is_the_process() {
    ring_path();
    let run = capture_flags(
        &["--preload"],
        &cmd("ring_writer", &["frames".as_ref()]),
        b"",
        &[],
    );
    run.expect_code(0);
    let profile = run.profile();
    let root = root_process(profile);
    let pid = num(root, "pid");
    assert!(
        root["exe"]
            .as_str()
            .is_some_and(|e| e.contains("ring_writer")),
        "{root}"
    );
    assert_eq!(root["incomplete"], true, "{root}");
    let corrupt = &profile["anomalies"]["corrupt_rings"];
    assert_eq!(corrupt.as_array().map(Vec::len), Some(1), "{corrupt}");
    assert_eq!(num(&corrupt[0], "pid"), pid);
    assert_eq!(corrupt[0]["exe"], root["exe"]);
    assert_eq!(
        corrupt[0]["first"],
        "a stack record claiming 200 frames (at most 128)"
    );
    assert_eq!(num(&corrupt[0], "records"), 1);
    // Its 1000 pairs after the record (and the one before) are counted.
    let p = process(profile, pid as u32);
    assert!(num(p, "allocations") >= 1001, "{p}");
    // One line at the first record, one with the count at the end.
    let first: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("ring holds a record memtrail cannot read"))
        .collect();
    assert_eq!(first.len(), 1, "{}", run.stderr);
    assert!(first[0].contains(&format!("pid={pid}")), "{}", first[0]);
    assert!(first[0].contains("claiming 200 frames"), "{}", first[0]);
    let end: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("records refused from a tracked process's own ring"))
        .collect();
    assert_eq!(end.len(), 1, "{}", run.stderr);
    for part in [
        &format!("pid={pid}"),
        "ring_writer",
        "records=1",
        "claiming 200 frames",
    ] {
        assert!(end[0].contains(part), "{part}: {}", end[0]);
    }
    assert!(!run.stderr.contains("disagree"), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("incomplete: process {pid} (")),
        "{}",
        run.stderr
    );
}

/// Check that allocations naming stacks never written are counted, not
/// logged one line each (issue 40: a million made 1,000,000 WARN lines,
/// 1 GB of log): 100,000 such records from a tracked process's ring make
/// one warning with their count, `anomalies.unrecorded_stacks` in the
/// profile (100,000 stacks, allocations, 6,400,000 bytes) and a line of
/// the summary; the allocations stay in the totals.
#[test]
fn capture_unrecorded_stacks_counted_once() {
    ring_path();
    let n: u64 = 100_000;
    let run = capture_flags(
        &["--preload"],
        &cmd("ring_writer", &["unknown".as_ref(), n.to_string().as_ref()]),
        b"",
        &[],
    );
    run.expect_code(0);
    let profile = run.profile();
    let u = &profile["anomalies"]["unrecorded_stacks"];
    assert_eq!(
        (num(u, "stacks"), num(u, "allocations"), num(u, "bytes")),
        (n, n, 64 * n),
        "{u}"
    );
    assert!(num(&profile["totals"], "allocations") >= n + 1001);
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("never recorded"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", run.stderr);
    assert!(lines[0].contains(&format!("stacks={n}")), "{}", lines[0]);
    assert!(
        lines[1].contains(&format!(
            "{n} allocations (6.1 MiB) name {n} stacks never recorded"
        )),
        "{}",
        lines[1]
    );
    assert!(
        run.stderr.len() < 64 << 10,
        "{} bytes of stderr",
        run.stderr.len()
    );
}
