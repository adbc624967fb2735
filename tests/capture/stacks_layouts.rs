//! Stacks through code laid out as real programs lay it out (issue 41):
//! a second executable segment at another bias, frames past 256 KiB (both
//! rustc's), and `cargo build` of a small crate.

use std::ffi::OsString;
use std::path::Path;

use crate::support::{self, fixture_source, fixture_with_flags, num};
use serde_json::Value;

fn frames(stack: &Value) -> &[Value] {
    stack["frames"].as_array().expect("frames array")
}

fn functions(stack: &Value) -> Vec<&str> {
    frames(stack)
        .iter()
        .map(|f| f["function"].as_str().unwrap_or(""))
        .collect()
}

/// `memtrail run -q -o PROFILE -- CMD`; the profile.
fn run_profile(cmd: &[OsString]) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("profile.json");
    let mut argv: Vec<OsString> = vec!["run".into(), "-q".into(), "-o".into(), out.clone().into()];
    argv.push("--".into());
    argv.extend(cmd.iter().cloned());
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", &[]);
    assert!(status.success(), "{stderr}");
    support::read_profile(&out).expect("profile written")
}

/// The one stack that allocated `bytes` bytes.
fn stack_of(profile: &Value, bytes: u64) -> &Value {
    let found: Vec<&Value> = support::allocation_sites(profile)
        .into_iter()
        .filter(|s| num(s, "bytes") == bytes)
        .collect();
    assert_eq!(found.len(), 1, "{bytes}-byte stacks: {found:#?}");
    found[0]
}

/// Check that stacks through code in a second executable segment whose
/// bias is not the first's (rustc's libLLVM and librustc_driver keep their
/// hot code so), and through a frame of 600,000 bytes, are exact from the
/// allocating function to _start: the second segment's frames were looked
/// up 4 KiB off, under another function's rules, and a frame past 256 KiB
/// had no rule BPF evaluated.
#[test]
fn stacks_unwind_far_segment_and_big_frame() {
    let mut flags = support::NO_FP.to_vec();
    flags.push("-Wl,--section-start=.farcode=0x800000");
    let exe = fixture_with_flags("far_code", &flags);
    let p = run_profile(&[exe.into()]);
    let start = [
        "main",
        "__libc_start_call_main",
        "__libc_start_main_impl",
        "_start",
    ];
    for (bytes, inner) in [
        (7001, &["leaf", "far_alloc", "near_alloc"][..]),
        (7002, &["leaf", "big_frame"][..]),
    ] {
        let s = stack_of(&p, bytes);
        assert!(s.get("end").is_none(), "{s:#}");
        let want: Vec<&str> = inner.iter().chain(start.iter()).copied().collect();
        assert_eq!(functions(s), want, "{s:#}");
    }
    assert_eq!(p["unwind"]["ended_early"], serde_json::json!([]));
}

/// Writes the fixture crate (`tests/fixtures/cargo_crate`: an application
/// and two path dependencies) into `dir`; the application's manifest.
fn write_crate(dir: &Path) -> std::path::PathBuf {
    let src = fixture_source("cargo_crate");
    for krate in ["app", "dep_a", "dep_b"] {
        let to = dir.join(krate);
        std::fs::create_dir_all(to.join("src")).expect("crate dir");
        std::fs::copy(src.join(krate).join("Cargo.toml.in"), to.join("Cargo.toml"))
            .expect("manifest");
        let file = if krate == "app" { "main.rs" } else { "lib.rs" };
        std::fs::copy(
            src.join(krate).join("src").join(file),
            to.join("src").join(file),
        )
        .expect("source");
    }
    dir.join("app").join("Cargo.toml")
}

/// Check that `cargo build` of a crate with two path dependencies (the
/// system's cargo and rustc, offline, into a target directory of its own)
/// has whole stacks in rustc's LLVM: at most 1 % of the bytes in stacks
/// that end at a return address outside code (60 % before), no stack of
/// operator new alone (31 %), and nearly all of rustc's bytes in stacks
/// that reached their thread's entry.
#[test]
fn stacks_unwind_cargo_build_reaches_entry() {
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = write_crate(dir.path());
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = dir.path().join("target");
    let p = run_profile(&[
        cargo,
        "build".into(),
        "--offline".into(),
        "--quiet".into(),
        "--manifest-path".into(),
        manifest.into(),
        "--target-dir".into(),
        target.into(),
    ]);
    let sites = support::allocation_sites(&p);
    let total: u64 = sites.iter().map(|s| num(s, "bytes")).sum();
    let ended = |why: &str| -> u64 {
        sites
            .iter()
            .filter(|s| s["end"] == why)
            .map(|s| num(s, "bytes"))
            .sum()
    };
    assert!(total > 0);
    assert!(
        ended("not_code") * 100 <= total,
        "{} of {total} bytes",
        ended("not_code")
    );
    for s in &sites {
        let f = functions(s);
        assert!(
            !(f.len() == 1 && f[0].starts_with("operator new")),
            "a stack of operator new alone: {s:#}"
        );
    }
    let rustc: Vec<&&Value> = sites
        .iter()
        .filter(|s| s["exe"].as_str().is_some_and(|e| e.ends_with("/rustc")))
        .collect();
    let rustc_total: u64 = rustc.iter().map(|s| num(s, "bytes")).sum();
    let rustc_complete: u64 = rustc
        .iter()
        .filter(|s| s.get("end").is_none())
        .map(|s| num(s, "bytes"))
        .sum();
    assert!(rustc_total > 0, "no rustc stacks");
    assert!(
        rustc_complete * 100 >= rustc_total * 99,
        "{rustc_complete} of rustc's {rustc_total} bytes complete"
    );
}

/// Check that node's stacks under the probes reach main through V8's
/// embedded builtins, whose code is in node's image but has no row in its
/// unwind table (they keep frame pointers): the walk takes a frame-pointer
/// step there, as libunwind does, and marks the frame (`fp_step`); 1,143
/// of 6,209 stacks ended at the first builtin before. The three buffers
/// of 777,777 bytes allocated from JavaScript have one stack, complete, to
/// `_start`, through marked builtins only.
#[test]
fn stacks_unwind_node_through_builtins_reaches_main() {
    let script = fixture_source("node_alloc.js");
    let p = run_profile(&["node".into(), script.into()]);
    let sites = support::allocation_sites(&p);
    let buffers: Vec<&&Value> = sites
        .iter()
        .filter(|s| num(s, "bytes") == 3 * 777_777)
        .collect();
    assert_eq!(buffers.len(), 1, "{buffers:#?}");
    let s = buffers[0];
    assert_eq!(num(s, "allocations"), 3, "{s:#}");
    assert!(s.get("end").is_none(), "{s:#}");
    let f = functions(s);
    assert_eq!(f.last(), Some(&"_start"), "{f:?}");
    assert!(
        f.iter().any(|name| name.starts_with("node::Start(")),
        "{f:?}"
    );
    // Every builtin's caller came by frame pointer; the C++ frames' by
    // their rows.
    let marked = |fr: &Value| fr["fp_step"] == true;
    for fr in frames(s) {
        let name = fr["function"].as_str().unwrap_or("");
        if name.starts_with("Builtins_") {
            assert!(marked(fr), "{fr:#}");
        } else if name.contains("::") {
            assert!(!marked(fr), "{fr:#}");
        }
    }
    let total: u64 = sites.iter().map(|s| num(s, "bytes")).sum();
    let complete: u64 = sites
        .iter()
        .filter(|s| s.get("end").is_none())
        .map(|s| num(s, "bytes"))
        .sum();
    assert!(
        complete * 100 >= total * 99,
        "{complete} of {total} bytes complete"
    );
}

/// Check that stacks that began on another stack say so (`stack_switch`)
/// rather than `complete` or a failed step: a coroutine's, made by
/// makecontext, ends at the trampoline it returns to (glibc's
/// `__start_context`, a return address at its first instruction); a stack
/// segment switched to as rustc's `psm` does, above the stack it was
/// called from, ends at the switching function; the coroutine's maker,
/// on the thread's own stack, reaches `_start`.
#[test]
fn stacks_unwind_stack_switch_said() {
    let exe = fixture_with_flags("stack_switch", support::NO_FP);
    let p = run_profile(&[exe.into()]);
    let coroutine = stack_of(&p, 5551);
    assert_eq!(coroutine["end"], "stack_switch", "{coroutine:#}");
    let f = frames(coroutine);
    assert_eq!(
        &functions(coroutine)[..2],
        ["coro_alloc", "coroutine"],
        "{coroutine:#}"
    );
    assert_eq!(f.len(), 3, "{coroutine:#}");
    assert!(
        f[2]["module"]
            .as_str()
            .is_some_and(|m| m.ends_with("/libc.so.6")),
        "{coroutine:#}"
    );
    let maker = stack_of(&p, 5552);
    assert!(maker.get("end").is_none(), "{maker:#}");
    assert_eq!(
        functions(maker),
        [
            "coro_alloc",
            "run_coroutine",
            "main",
            "__libc_start_call_main",
            "__libc_start_main_impl",
            "_start"
        ]
    );
    let segment = stack_of(&p, 5553);
    assert_eq!(segment["end"], "stack_switch", "{segment:#}");
    assert_eq!(
        functions(segment),
        ["coro_alloc", "segment_fn", "mt_on_stack"],
        "{segment:#}"
    );
}
