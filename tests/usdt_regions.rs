//! USDT region markers (`include/memtrail_usdt.h`) in programs run under
//! `memtrail run`: exact per-region counts in the profile, the summary and
//! the event stream (issue 13, "Markers for programs that are tracked from
//! outside").

mod common;

use common::{capture, num, string, usdt_fixture};
use serde_json::Value;

/// The profile's region named `name`.
fn region<'a>(profile: &'a Value, name: &str) -> &'a Value {
    profile["regions"]
        .as_array()
        .expect("regions is an array")
        .iter()
        .find(|r| string(r, "name") == name)
        .unwrap_or_else(|| panic!("no region {name} in {}", profile["regions"]))
}

/// (entries, exits, allocations, frees, allocated, freed, peak, live
/// blocks, live bytes) of a region.
fn metrics(r: &Value) -> [u64; 9] {
    [
        "entries",
        "exits",
        "allocations",
        "frees",
        "allocated_bytes",
        "freed_bytes",
        "peak_live_bytes",
        "live_allocations",
        "live_bytes",
    ]
    .map(|k| num(r, k))
}

/// Check that each marked region counts exactly its own thread's heap
/// events between its markers: nested regions, a region on a second thread
/// while the main thread's is open, a region entered three times, and one
/// in a dlopen'ed library; allocations outside the regions are excluded.
#[test]
fn usdt_regions_count_exactly() {
    let exe = usdt_fixture("usdt_regions", &[]);
    let lib = usdt_fixture("usdt_lib", &["-shared", "-fPIC"]);
    let run = capture(&[exe.into_os_string(), lib.into_os_string()]);
    run.expect_code(0);
    let p = run.profile();
    let names: Vec<&str> = p["regions"]
        .as_array()
        .expect("regions")
        .iter()
        .map(|r| string(r, "name"))
        .collect();
    assert_eq!(names, ["inner", "lib", "loop", "outer", "worker"]);
    assert_eq!(
        metrics(region(p, "outer")),
        [1, 1, 5, 3, 320, 210, 300, 2, 110]
    );
    assert_eq!(metrics(region(p, "inner")), [1, 1, 2, 1, 20, 10, 20, 1, 10]);
    assert_eq!(
        metrics(region(p, "worker")),
        [1, 1, 4, 4, 200, 200, 200, 0, 0]
    );
    assert_eq!(metrics(region(p, "loop")), [3, 3, 3, 3, 24, 24, 8, 0, 0]);
    assert_eq!(metrics(region(p, "lib")), [1, 1, 2, 1, 154, 77, 154, 1, 77]);
    // The allocations outside every region happened and were not counted:
    // the program's malloc(1000) is in the totals, in no region.
    assert_eq!(common::sized(run.events(), "malloc", 1000).len(), 1);

    // The summary has a line per region.
    let line = run
        .stderr
        .lines()
        .find(|l| l.split_whitespace().next() == Some("outer"))
        .unwrap_or_else(|| panic!("no outer line in the summary:\n{}", run.stderr));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "outer", "1", "5", "3", "320", "B", "300", "B", "2", "110", "B"
        ]
    );

    // The event stream has the markers, named, in each thread's order.
    let begins: Vec<&str> = run
        .events()
        .iter()
        .filter(|e| common::kind(e) == "region_begin")
        .map(|e| string(e, "name"))
        .collect();
    assert_eq!(begins.len(), 7, "{begins:?}");
    let ends = run
        .events()
        .iter()
        .filter(|e| common::kind(e) == "region_end")
        .count();
    assert_eq!(ends, 7);
}

/// Check that every marker probe (8 in the executable, 2 in the library)
/// sits on an instruction the kernel emulates (the `nop`), so a hit costs
/// no single-step.
#[test]
fn usdt_regions_probes_are_emulated() {
    let exe = usdt_fixture("usdt_regions", &[]);
    let lib = usdt_fixture("usdt_lib", &["-shared", "-fPIC"]);
    let run = capture(&[exe.clone().into_os_string(), lib.clone().into_os_string()]);
    run.expect_code(0);
    let markers: Vec<&Value> = run.profile()["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .filter(|p| string(p, "symbol").starts_with("memtrail:"))
        .collect();
    let in_image = |path: &std::path::Path| {
        markers
            .iter()
            .filter(|p| string(p, "image") == path.to_str().unwrap())
            .count()
    };
    assert_eq!((in_image(&exe), in_image(&lib)), (8, 2));
    for probe in &markers {
        assert_eq!(probe["emulated"], Value::Bool(true), "{probe}");
        let bytes = std::fs::read(string(probe, "image")).unwrap();
        assert_eq!(bytes[num(probe, "offset") as usize], 0x90, "{probe}");
    }
}

/// Check that a program without markers has an empty `regions` section.
#[test]
fn usdt_regions_none_without_markers() {
    let run = capture(&common::cmd("malloc_once", &[]));
    run.expect_code(0);
    assert_eq!(run.profile()["regions"], Value::Array(Vec::new()));
    assert!(!run.stderr.contains("region "), "{}", run.stderr);
}
