//! Allocation stacks: captured in BPF, deduplicated, symbolized (issue 5).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{self, capture, cmd, fixture_source, id, line_of, num};
use serde_json::Value;

/// The allocation sites.
fn stacks(profile: &Value) -> Vec<&Value> {
    support::allocation_sites(profile)
}

fn function(frame: &Value) -> &str {
    frame["function"].as_str().unwrap_or("")
}

fn frames(stack: &Value) -> &[Value] {
    stack["frames"].as_array().expect("frames array")
}

/// Stacks whose frame `depth` is in `function`.
fn with_frame<'a>(profile: &'a Value, depth: usize, function_name: &str) -> Vec<&'a Value> {
    stacks(profile)
        .into_iter()
        .filter(|s| {
            frames(s)
                .get(depth)
                .is_some_and(|f| function(f) == function_name)
        })
        .collect()
}

fn assert_at(frame: &Value, function_name: &str, file: &str, line: u64) {
    assert_eq!(function(frame), function_name, "frame {frame}");
    let path = frame["file"].as_str().unwrap_or_default();
    assert!(path.ends_with(file), "frame {frame} not in {file}");
    assert_eq!(frame["line"].as_u64(), Some(line), "frame {frame}");
}

/// Check that each allocation site of a frame-pointer C program has its
/// own stack with exact counts, bytes, live bytes at the peak and at exit,
/// and symbolizes to the allocating function, file and line.
#[test]
fn stacks_sites_exact_and_symbolized() {
    let run = capture(&cmd("stacks", &[]));
    run.expect_code(0);
    let p = run.profile();
    let src = "stacks.c";

    let small = with_frame(p, 0, "site_small");
    assert_eq!(small.len(), 1, "{small:?}");
    assert_at(
        &frames(small[0])[0],
        "site_small",
        src,
        line_of(src, "SITE_SMALL"),
    );
    assert_eq!(function(&frames(small[0])[1]), "main");
    assert_eq!(num(small[0], "allocations"), 3);
    assert_eq!(num(small[0], "bytes"), 33333);
    assert_eq!(num(small[0], "live_bytes_at_peak"), 33333);
    assert_eq!(num(small[0], "live_bytes_at_exit"), 0);

    let shared = with_frame(p, 0, "site_shared");
    assert_eq!(shared.len(), 2, "one stack per call path: {shared:?}");
    let one = shared
        .iter()
        .find(|s| function(&frames(s)[1]) == "path_one")
        .expect("path_one stack");
    let two = shared
        .iter()
        .find(|s| function(&frames(s)[1]) == "path_two")
        .expect("path_two stack");
    assert_at(
        &frames(one)[0],
        "site_shared",
        src,
        line_of(src, "SITE_SHARED"),
    );
    assert_at(&frames(one)[1], "path_one", src, line_of(src, "PATH_ONE"));
    assert_at(&frames(two)[1], "path_two", src, line_of(src, "PATH_TWO"));
    assert_eq!(function(&frames(one)[2]), "main");
    assert_eq!((num(one, "allocations"), num(one, "bytes")), (2, 44444));
    assert_eq!(
        (
            num(one, "live_bytes_at_exit"),
            num(one, "live_allocations_at_exit")
        ),
        (44444, 2)
    );
    assert_eq!(num(one, "live_bytes_at_peak"), 44444);
    assert_eq!(
        (
            num(two, "allocations"),
            num(two, "bytes"),
            num(two, "live_bytes_at_exit")
        ),
        (1, 22222, 0)
    );
    assert_eq!(num(two, "live_bytes_at_peak"), 22222);

    let big = with_frame(p, 0, "site_big");
    assert_eq!(big.len(), 1);
    assert_at(
        &frames(big[0])[0],
        "site_big",
        src,
        line_of(src, "SITE_BIG"),
    );
    assert_eq!(
        (num(big[0], "allocations"), num(big[0], "bytes")),
        (1, 100000)
    );
    assert_eq!(num(big[0], "live_bytes_at_peak"), 100000);

    // The fixture makes no other allocation: the sites are all of it, and
    // their live bytes at the peak add up to the peak.
    assert_eq!(stacks(p).len(), 4, "{:#?}", stacks(p));
    let peak: u64 = stacks(p)
        .into_iter()
        .map(|s| num(s, "live_bytes_at_peak"))
        .sum();
    assert_eq!(peak, num(&p["totals"], "peak_live_bytes"));
    assert_eq!(peak, 199999);

    // Every allocation event names one of these stacks.
    let ids: Vec<u64> = stacks(p).into_iter().map(|s| id(s, "id")).collect();
    for e in run.events() {
        if ["malloc", "calloc"].contains(&e["kind"].as_str().unwrap()) {
            assert!(ids.contains(&id(e, "stack_id")), "{e}");
        }
    }
}

/// Check that 8 threads running the same two call paths produce exactly
/// two distinct stacks with all 800 allocations between them: stacks are
/// deduplicated across threads and CPUs, none is missing.
#[test]
fn stacks_deduplicated_across_threads() {
    let run = capture(&cmd("stack_threads", &[]));
    run.expect_code(0);
    let p = run.profile();
    let leaf = with_frame(p, 0, "leaf");
    assert_eq!(leaf.len(), 2, "{leaf:#?}");
    for via in ["via_a", "via_b"] {
        let s = leaf
            .iter()
            .find(|s| function(&frames(s)[1]) == via)
            .unwrap_or_else(|| panic!("no {via} stack"));
        assert_eq!(num(s, "allocations"), 400);
        assert_eq!(num(s, "bytes"), 400 * 33333);
        assert_eq!(function(&frames(s)[2]), "worker");
    }
    let mut ids: Vec<u64> = stacks(p).into_iter().map(|s| id(s, "id")).collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "a stack id is defined twice");
}

/// Check that `new` (libstdc++'s operator new, built without frame
/// pointers, nested over malloc) shows the user's function as the
/// allocation site, with its line, and no unknown (trampoline) frame up to
/// main; the nested malloc is not counted again; and so does
/// `new (std::nothrow)`.
#[test]
fn stacks_cxx_new_shows_user_function() {
    let run = capture(&cmd("stack_cxx", &[]));
    run.expect_code(0);
    cxx_sites_are_user_functions(run.profile());
}

/// The same with `--unwind fp`, where operator new keeps its probe and
/// captures the stack for its malloc (issue 22: the plain operator new that
/// the nothrow one calls captured it again, from inside libstdc++'s nothrow
/// new, which keeps no frame pointer: the site was libstdc++'s, and
/// make_spare was skipped).
#[test]
fn stacks_cxx_new_shows_user_function_fp() {
    let run = support::capture_flags(&["--unwind", "fp"], &cmd("stack_cxx", &[]), b"", &[]);
    run.expect_code(0);
    cxx_sites_are_user_functions(run.profile());
}

fn cxx_sites_are_user_functions(p: &Value) {
    let site = with_frame(p, 0, "make_widget");
    assert_eq!(site.len(), 1, "{:#?}", stacks(p));
    let f = frames(site[0]);
    assert_at(
        &f[0],
        "make_widget",
        "stack_cxx.cc",
        line_of("stack_cxx.cc", "MAKE_WIDGET"),
    );
    assert_eq!(function(&f[1]), "main");
    assert!(
        f[..2].iter().all(|fr| fr["function"].is_string()),
        "unknown frame before main: {f:#?}"
    );
    assert_eq!(
        (num(site[0], "allocations"), num(site[0], "bytes")),
        (2, 88888)
    );
    // The nothrow operator new calls operator new, which calls malloc: the
    // site is still the user's function (issue 22: its probe sat past a
    // `sub $8,%rsp`; without probes on new, the walk from malloc starts
    // past both).
    let spare = with_frame(p, 0, "make_spare");
    assert_eq!(spare.len(), 1, "{:#?}", stacks(p));
    let f = frames(spare[0]);
    assert_at(
        &f[0],
        "make_spare",
        "stack_cxx.cc",
        line_of("stack_cxx.cc", "MAKE_SPARE"),
    );
    assert_eq!(function(&f[1]), "main");
    assert_eq!(
        (num(spare[0], "allocations"), num(spare[0], "bytes")),
        (3, 3 * 33333)
    );
}

fn build_rust_fixture() -> PathBuf {
    let src = fixture_source("stack_rust.rs");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("memtrail-fixtures");
    std::fs::create_dir_all(&out).unwrap();
    let exe = out.join(format!("stack_rust-{}", std::process::id()));
    let status = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .args([
            "-C",
            "force-frame-pointers=yes",
            "-g",
            "-C",
            "opt-level=1",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("rustc runs");
    assert!(status.success());
    exe
}

/// Check that a Rust program built with frame pointers shows its demangled
/// function at the allocation site, with its line.
#[test]
fn stacks_rust_demangled() {
    let exe = build_rust_fixture();
    let run = capture(&[exe.clone().into_os_string()]);
    run.expect_code(0);
    let _ = std::fs::remove_file(&exe);
    let p = run.profile();
    let sites: Vec<&Value> = stacks(p)
        .into_iter()
        .filter(|s| {
            frames(s)
                .iter()
                .any(|f| function(f) == "stack_rust::make_buffer")
        })
        .collect();
    assert!(!sites.is_empty(), "no make_buffer frame: {:#?}", stacks(p));
    for site in &sites {
        let frame = frames(site)
            .iter()
            .find(|f| function(f) == "stack_rust::make_buffer")
            .unwrap();
        assert_eq!(
            frame["line"].as_u64(),
            Some(line_of("stack_rust.rs", "MAKE_BUFFER"))
        );
    }
    // The loop may be unrolled into several call sites in main: the three
    // allocations are in make_buffer's stacks, whichever.
    let allocations: u64 = sites.iter().map(|s| num(s, "allocations")).sum();
    let bytes: u64 = sites.iter().map(|s| num(s, "bytes")).sum();
    assert_eq!((allocations, bytes), (3, 3 * 55555));
}

/// The stack of the allocation of `bytes` bytes (one allocation).
fn stack_of(profile: &Value, bytes: u64) -> &Value {
    let found: Vec<&Value> = stacks(profile)
        .into_iter()
        .filter(|s| num(s, "bytes") == bytes)
        .collect();
    assert_eq!(found.len(), 1, "{bytes}-byte stacks: {found:?}");
    found[0]
}

/// `memtrail run -q -o PROFILE ARGS -- FIXTURE` with `env`; the profile.
fn run_profile(fixture: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("profile.json");
    let mut argv: Vec<std::ffi::OsString> = vec!["run".into(), "-q".into(), "-o".into()];
    argv.push(out.clone().into());
    argv.extend(args.iter().map(Into::into));
    argv.push("--".into());
    argv.extend(cmd(fixture, &[]));
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", env);
    assert!(status.success(), "{stderr}");
    support::read_profile(&out).expect("profile written")
}

/// Check that the stack walk keeps exactly `--stack-depth` frames
/// of a stack deeper than that (127 by default, 5 asked), each at its
/// call, and that a shallow stack starts at main.
#[test]
fn stacks_truncated_at_depth_exactly() {
    let src = "stack_deep.c";
    let (site, call) = (line_of(src, "DEEP_SITE"), line_of(src, "DEEP_CALL"));
    for (depth, args) in [(127, &[][..]), (5, &["--stack-depth", "5"][..])] {
        let p = run_profile("stack_deep", args, &[]);
        let deep = frames(stack_of(&p, 33333));
        assert_eq!(deep.len(), depth, "{deep:#?}");
        assert_at(&deep[0], "deep", src, site);
        for frame in &deep[1..] {
            assert_at(frame, "deep", src, call);
        }
        let shallow = frames(stack_of(&p, 44444));
        assert_at(&shallow[0], "main", src, line_of(src, "MAIN_SITE"));
    }
}

/// Check that only new stacks take room on the stack ring: 1000
/// allocations from one stack fit a 16 KiB ring (15 records of 1 KiB) that
/// nothing reads until the capture ends.
#[test]
fn stacks_known_ones_take_no_ring_space() {
    let p = run_profile(
        "stack_repeat",
        &["--stack-ring-size", "16K"],
        // BPF's stack ring: the preload shim's hook path (its ring path
        // writes stacks to its own rings).
        &[("MEMTRAIL_FAULT", "stall-stacks,shim-hook-only")],
    );
    let site = stack_of(&p, 1000 * 12345);
    assert_eq!(num(site, "allocations"), 1000);
    assert_eq!(function(&frames(site)[0]), "site");
    // A record in the ring: its 8-byte header, then id, pid, nr and pad
    // (16 bytes) and 128 frames.
    const RECORD: u64 = 8 + 16 + 128 * 8;
    let high = num(&p["pressure"]["high_water"], "stacks");
    let distinct = stacks(&p).len() as u64;
    assert!(
        (RECORD..=distinct * RECORD).contains(&high),
        "stack ring high water {high} B for {distinct} stacks"
    );
}

/// The C functions of `short_names.c` and the bytes each allocates.
const SHORT_NAMES: [(&str, u64); 10] = [
    ("w", 1001),
    ("x", 1002),
    ("i", 1003),
    ("d", 1004),
    ("v", 1005),
    ("f", 1006),
    ("a", 1007),
    ("St", 1008),
    ("Ss", 1009),
    ("Sa", 1010),
];

/// Check that C functions whose names are also Itanium type codes (`w`,
/// `x`, `i`, `d`, `v`, `St`, `Ss`, ...) keep their names, with and without
/// debug information, in the profile, the text report and folded stacks:
/// only mangled names are demangled (issue 26: they were `wchar_t`,
/// `long long`, `int`, `double`, `void`, `std::string`).
#[test]
fn stacks_c_names_are_not_demangled_as_types() {
    let without_g: Vec<&str> = ["-O0", "-fno-builtin", "-Wall", "-Wextra", "-Werror"].to_vec();
    for (what, exe) in [
        ("-g", support::fixture("short_names")),
        (
            "no -g",
            support::fixture_with_flags("short_names", &without_g),
        ),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("profile.json");
        let argv: Vec<std::ffi::OsString> = vec![
            "run".into(),
            "-q".into(),
            "-o".into(),
            out.clone().into(),
            "--".into(),
            exe.into(),
        ];
        let (_, status, _, stderr) = support::memtrail(&argv, b"");
        assert!(status.success(), "{what}: {stderr}");
        let p = support::read_profile(&out).expect("profile written");
        for (name, bytes) in SHORT_NAMES {
            let f = frames(stack_of(&p, bytes));
            assert_eq!(function(&f[0]), name, "{what}: {f:#?}");
            assert_eq!(function(&f[1]), "main", "{what}: {f:#?}");
        }

        let report = |args: &[&str]| {
            let mut argv: Vec<std::ffi::OsString> = vec!["report".into(), out.clone().into()];
            argv.extend(args.iter().map(Into::into));
            let (_, status, stdout, stderr) = support::memtrail(&argv, b"");
            assert!(status.success(), "{what} report {args:?}: {stderr}");
            String::from_utf8(stdout).expect("UTF-8 report")
        };
        let folded = report(&["-f", "folded"]);
        let text = report(&["-n", "0"]);
        for (name, bytes) in SHORT_NAMES {
            assert!(
                folded
                    .lines()
                    .any(|l| l.ends_with(&format!(";main;{name} {bytes}"))),
                "{what}: no {name} in\n{folded}"
            );
            assert!(
                text.lines().any(|l| l.starts_with(&format!("    {name} "))),
                "{what}: no {name} in\n{text}"
            );
        }
        for ty in ["wchar_t", "long long", "int", "double", "void", "std::"] {
            assert!(!folded.contains(ty), "{what}: {ty} in\n{folded}");
        }
    }
}
