//! Statically linked programs without symbols (issue 41): glibc's
//! allocator found by its code and counted exactly, or, where no allocator
//! is found, a summary that says the heap is not counted; and the profile
//! names only the images the capture saw.

use std::ffi::OsString;
use std::path::Path;

use crate::attach::frees_of;
use crate::support::{capture, fixture_with_flags, num, sized, string};
use serde_json::Value;

/// The Debian package busybox-static's binary: stripped, built from the
/// same glibc 2.36 as the system's libc.a.
const BUSYBOX: &str = "/usr/bin/busybox";

/// The probe sites of `image` in the profile, by symbol.
fn probed<'a>(profile: &'a Value, image: &str) -> Vec<&'a str> {
    profile["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| string(p, "image") == image)
        .map(|p| p["symbol"].as_str().unwrap())
        .collect()
}

/// Check that a stripped static glibc program (the static fixture linked
/// with `-s`) has its allocator found by its code: the calloc in its
/// constructor, its three mallocs and its free are counted exactly, and
/// the sites are named as glibc names them.
#[test]
fn static_stripped_glibc_exact() {
    let exe = fixture_with_flags("static_alloc", &["-static", "-O0", "-fno-builtin", "-s"]);
    let out = std::process::Command::new("readelf")
        .arg("-S")
        .arg(&exe)
        .output()
        .expect("readelf runs");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(".symtab"),
        "the fixture is stripped"
    );
    let run = capture(&[exe.clone().into_os_string()]);
    run.expect_code(0);
    let events = run.events();
    assert_eq!(sized(events, "calloc", 7007).len(), 1);
    let mallocs = sized(events, "malloc", 77777);
    assert_eq!(mallocs.len(), 3, "{mallocs:?}");
    assert_eq!(frees_of(events, &mallocs).len(), 1);
    let profile = run.profile();
    let sites = probed(profile, exe.to_str().unwrap());
    for name in ["malloc", "calloc", "realloc", "free"] {
        assert!(sites.contains(&name), "{name} not probed: {sites:?}");
    }
    assert_eq!(profile["skipped_images"], Value::Array(Vec::new()));
}

/// Runs `busybox sort` on `lines` distinct lines of 12 bytes and returns
/// its capture.
fn busybox_sort(lines: u64) -> crate::support::Capture {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("lines");
    let text: String = (0..lines)
        .map(|i| format!("{:011}\n", (i * 7919) % lines))
        .collect();
    std::fs::write(&input, text).unwrap();
    let run = capture(&[
        OsString::from(BUSYBOX),
        "sort".into(),
        "-o".into(),
        dir.path().join("sorted").into(),
        input.into(),
    ]);
    run.expect_code(0);
    run
}

/// Check `busybox sort` (stripped, static) exactly: its reading loop
/// (busybox 1.35's `xmalloc_fgetline`: `realloc(NULL, 256)`, then a
/// `realloc` trimming the line, for each line; `xrealloc_vector` growing
/// the array of lines every 64) makes 2 reallocs a line and one per 64
/// lines, the only reallocs of the program; twice the lines add exactly
/// that many calls and nothing else. The summary has no note of an
/// uncounted heap.
#[test]
fn static_busybox_sort_exact() {
    assert!(
        Path::new(BUSYBOX).exists(),
        "{BUSYBOX} (busybox-static) is needed"
    );
    let (n, m) = (1000u64, 2000u64);
    let small = busybox_sort(n);
    let large = busybox_sort(m);
    let totals = |run: &crate::support::Capture| run.profile()["totals"].clone();
    let (ts, tl) = (totals(&small), totals(&large));
    assert_eq!(num(&ts, "reallocs"), 2 * n + n.div_ceil(64), "{ts}");
    assert_eq!(num(&tl, "reallocs"), 2 * m + m.div_ceil(64), "{tl}");
    assert_eq!(
        num(&tl, "allocations") - num(&ts, "allocations"),
        2 * (m - n) + m.div_ceil(64) - n.div_ceil(64)
    );
    assert_eq!(num(&tl, "frees"), num(&ts, "frees"));
    assert_eq!(num(&ts, "unmatched_frees"), 0);
    let reallocs = small
        .events()
        .iter()
        .filter(|e| e["kind"] == "realloc")
        .count() as u64;
    assert_eq!(reallocs, 2 * n + n.div_ceil(64));
    let sites = probed(small.profile(), BUSYBOX);
    assert!(sites.contains(&"realloc"), "{sites:?}");
    // Only the image the capture saw has a table in the profile: not libc,
    // libstdc++ and the loader loaded up front, nor the image cache's.
    let images: Vec<&str> = small.profile()["unwind"]["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| string(i, "image"))
        .collect();
    assert_eq!(images, [BUSYBOX]);
    assert!(!small.stderr.contains("not counted"), "{}", small.stderr);
}

/// Check that a stripped static musl program (musl-tools) has musl's
/// allocator found by its code: its five mallocs of 1000-1004 bytes and
/// its one free are counted exactly.
#[test]
fn static_stripped_musl_exact() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("musl_alloc");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/musl_alloc.c");
    let status = std::process::Command::new("musl-gcc")
        .args(["-static", "-O1", "-s", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("musl-gcc runs (musl-tools)");
    assert!(status.success());
    let run = capture(&[exe.clone().into_os_string()]);
    run.expect_code(0);
    let events = run.events();
    let mallocs: Vec<&Value> = (1000..1005)
        .flat_map(|size| sized(events, "malloc", size))
        .collect();
    assert_eq!(mallocs.len(), 5, "{mallocs:?}");
    assert_eq!(frees_of(events, &mallocs).len(), 1);
    let totals = &run.profile()["totals"];
    assert_eq!(num(totals, "unmatched_frees"), 0, "{totals}");
    let sites = probed(run.profile(), exe.to_str().unwrap());
    assert!(
        sites.contains(&"malloc") && sites.contains(&"free"),
        "{sites:?}"
    );
}

/// Check that a stripped static program without any allocator memtrail
/// knows (no libc at all: `_start` moves the break by 1 MiB) is named in
/// the summary, with its heap said not counted and the break it moved,
/// and in the profile's skipped images.
#[test]
fn static_without_allocator_says_so() {
    let exe = fixture_with_flags(
        "static_nolibc",
        &["-static", "-nostdlib", "-fno-stack-protector", "-O1", "-s"],
    );
    let run = capture(&[exe.clone().into_os_string()]);
    run.expect_code(0);
    let line = format!(
        "note: {} is statically linked and memtrail found no allocator it knows in it: its heap \
         is not counted",
        exe.display()
    );
    assert!(run.stderr.contains(&line), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("what it took from the system is: brk peak 1.0 MiB"),
        "{}",
        run.stderr
    );
    let skipped = run.profile()["skipped_images"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(string(&skipped[0], "image"), exe.to_str().unwrap());
    assert!(string(&skipped[0], "reason").contains("its heap is not counted"));
}
