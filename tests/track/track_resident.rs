//! Resident memory (issue 24): each tracked process's RSS from the kernel's
//! `rss_stat` tracepoint: its peak, its value at the heap peak, the
//! timeline's series, and the records' rate limit.

use crate::support::{capture, cmd, field, kind, num, of_pid, root_process, stream_root};

const MIB: u64 = 1 << 20;

/// How far the kernel's RSS may read from the pages a process has: the mm
/// counters are per-CPU (Linux 6.2+), and each CPU may hold back up to
/// `percpu_counter_batch` pages (max(32, 2 × CPUs)) of each of the three
/// counters RSS adds up (file, anonymous, shared memory). 768 KiB on 2 CPUs.
fn counter_slack() -> u64 {
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .expect("read /sys/devices/system/cpu/possible");
    let cpus = possible
        .trim()
        .rsplit(['-', ','])
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(1, |last| last + 1);
    3 * cpus * 32u64.max(2 * cpus) * 4096
}

/// Check that a program that allocates 128 MiB and writes 64 MiB of it
/// shows a 128 MiB heap peak and a ~64 MiB RSS peak, an RSS at the heap peak
/// of the pages it had before writing any, an RSS series on the timeline
/// that reaches the peak, and a few hundred RSS records at most (one every
/// 256 KiB, or 1/64 of the RSS, of change; not one per page: 16,384).
///
/// The RSS peak is checked within [64 MiB, 64 MiB + 4 MiB] widened by the
/// counters' slack: RSS also counts the binary's, the loader's and libc's
/// pages and the stack (~0.9 MiB with Debian 12's glibc 2.36).
#[test]
fn track_resident_touched_not_allocated() {
    let run = capture(&cmd("rss_touch", &[]));
    run.expect_code(0);
    let profile = run.profile();
    let slack = counter_slack();
    assert_eq!(num(field(profile, "totals"), "peak_live_bytes"), 128 * MIB);
    let root = root_process(profile);
    let resident = field(root, "resident");
    let peak = num(resident, "peak_rss_bytes");
    assert!(
        (64 * MIB - slack..=68 * MIB + slack).contains(&peak),
        "RSS peak {peak} (slack {slack})"
    );
    // The heap peaks at the malloc, before any of its pages is written.
    let at_heap_peak = num(resident, "rss_at_heap_peak_bytes");
    assert!(
        (1..=4 * MIB + slack).contains(&at_heap_peak),
        "RSS at the heap peak {at_heap_peak}"
    );
    // One process: the tree's are its.
    assert_eq!(field(profile, "resident"), resident);

    let series: Vec<u64> = field(field(field(profile, "timeline"), "tree"), "points")
        .as_array()
        .expect("points")
        .iter()
        .map(|p| num(p, "rss_bytes"))
        .collect();
    let highest = series.iter().copied().max().unwrap_or(0);
    // Recorded values lag the exact peak by less than a step (1/64 of it).
    assert!(
        highest <= peak && highest + peak / 64 + 256 * 1024 >= peak,
        "timeline's RSS maximum {highest}, peak {peak}"
    );

    let events = run.events();
    let pid = stream_root(events);
    let records: Vec<u64> = of_pid(events, pid)
        .iter()
        .filter(|e| kind(e) == "rss")
        .map(|e| num(e, "peak_rss_bytes"))
        .collect();
    assert!(
        (64..=400).contains(&records.len()),
        "{} RSS records",
        records.len()
    );
    // The last record (at exit) carries the exact peak.
    assert_eq!(records.last().copied(), Some(peak));
    assert_eq!(num(resident, "samples"), records.len() as u64);

    // The summary's line, and the chart's RSS line.
    let line = run
        .stderr
        .lines()
        .find(|l| l.trim_start().starts_with("resident (RSS)"))
        .unwrap_or_else(|| panic!("no resident line: {}", run.stderr));
    assert!(line.contains("at the heap's peak"), "{line}");
    let chart = crate::support::report::memtrail(&[
        "report".as_ref(),
        "--format".as_ref(),
        "timeline".as_ref(),
        run.dir.path().join("profile.json").as_os_str(),
    ]);
    chart.expect_code(0);
    assert_eq!(chart.stdout().matches(r#"<polyline id="rss""#).count(), 1);
}
