//! The C ABI from C (issue 13): tests/ffi/client.c, built against
//! include/memtrail.h with -Wall -Wextra -Werror and linked to the cdylib.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Builds the client once per test binary; returns its path.
fn client() -> &'static Path {
    static CLIENT: OnceLock<PathBuf> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        // target/<profile>/deps/ffi_c-HASH -> target/<profile>, where cargo
        // puts libmemtrail.so.
        let exe = std::env::current_exe().expect("test executable");
        let lib_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .to_owned();
        assert!(
            lib_dir.join("libmemtrail.so").exists(),
            "no libmemtrail.so in {}: run `cargo build --lib` first (scripts/test.sh does)",
            lib_dir.display()
        );
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ffi-client");
        let status = Command::new("cc")
            .args([
                "-std=c11",
                "-D_DEFAULT_SOURCE",
                "-O0",
                "-fno-builtin",
                "-g",
                "-pthread",
            ])
            .args(["-Wall", "-Wextra", "-Werror"])
            .arg("-I")
            .arg(root.join("include"))
            .arg(root.join("tests/ffi/client.c"))
            .arg("-o")
            .arg(&out)
            .arg("-L")
            .arg(&lib_dir)
            .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
            .arg("-lmemtrail")
            .status()
            .expect("run cc");
        assert!(status.success(), "compiling tests/ffi/client.c failed");
        out
    })
}

fn run(args: &[&str]) {
    let out = Command::new(client())
        .args(args)
        .output()
        .expect("run the client");
    assert!(
        out.status.success(),
        "client {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Check that a C program tracking itself gets exactly 3 allocations and 1
/// free from a region with 3 mallocs and 1 free, and exact snapshots.
#[test]
fn ffi_c_self_region_exact() {
    run(&["self"]);
}

/// Check that a C program spawning a child through the C ABI waits for it,
/// gets its exit code and writes its profile, twice (issue 28: the
/// profile is kept once written).
#[test]
fn ffi_c_spawn_writes_profile() {
    let dir = tempfile::tempdir().expect("temp dir");
    let profile = dir.path().join("profile.json");
    run(&["spawn", profile.to_str().expect("UTF-8 path")]);
    let text = std::fs::read_to_string(&profile).expect("profile written");
    let json: serde_json::Value = serde_json::from_str(&text).expect("profile is JSON");
    assert!(json.get("totals").is_some(), "{text}");
    // Written again, after it was finished: the same profile.
    let again = std::fs::read_to_string(dir.path().join("profile.json.again")).expect("again");
    assert_eq!(again, text);
    // The options it set: per-process probes, per-CPU events rings.
    assert_eq!(json["probe_scope"], "per-process");
    if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        assert!(
            json["event_rings"].as_u64() > Some(1),
            "{}",
            json["event_rings"]
        );
    }
}

/// Check that a C program renders a profile's reports through the C ABI
/// (text ranked by count with its top 3 sites, a gzipped pprof), and that
/// each error of `memtrail_write_report` returns its code; writing the
/// report over the profile itself is `MEMTRAIL_E_OUTPUT`, and the profile
/// stays as it was (issue 28).
#[test]
fn ffi_c_write_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name).to_str().expect("UTF-8").to_owned();
    let (profile, text, pprof) = (path("profile.json"), path("report.txt"), path("p.pb.gz"));
    run(&["spawn", &profile]);
    let before = std::fs::read(&profile).expect("profile written");
    run(&["report", &profile, &text, &pprof]);
    assert_eq!(
        std::fs::read(&profile).expect("the profile"),
        before,
        "the profile was written over"
    );
    let report = std::fs::read_to_string(&text).expect("text report written");
    let expected = std::process::Command::new(env!("CARGO_BIN_EXE_memtrail"))
        .args(["report", "--by", "count", "--top", "3", &profile])
        .output()
        .expect("memtrail report");
    assert!(expected.status.success());
    assert_eq!(report, String::from_utf8_lossy(&expected.stdout));
    let pb = std::fs::read(&pprof).expect("pprof written");
    assert_eq!(pb[..2], [0x1f, 0x8b], "not gzip");
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "p.pb.gz",
            "profile.json",
            "profile.json.again",
            "report.txt"
        ]
    );
}

/// Check that every error path of the C ABI returns its code: NULL
/// pointers, bad options, sizes too small, a freed (double-freed) or bogus
/// session handle, a missing command, no region open.
#[test]
fn ffi_c_error_paths_return_codes() {
    run(&["errors"]);
}

/// Check that a child of fork calling into its parent's session (a process
/// tracking itself) gets `MEMTRAIL_E_HANDLE` from every call, naming the
/// cause, and neither hangs nor aborts, nor writes a profile; and that the
/// parent's session then counts a region exactly (issue 28: snapshot and
/// regions hung, write_profile aborted the child, free gave E_INTERNAL).
#[test]
fn ffi_c_fork_child_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let profile = dir.path().join("child.json");
    run(&["fork", profile.to_str().expect("UTF-8 path")]);
    assert!(!profile.exists());
}

/// Check that a profile whose write failed (onto /dev/full, then into a
/// missing directory) is written on the next call (issue 28: the session
/// was finished by the failed write, and the profile lost).
#[test]
fn ffi_c_profile_write_retried() {
    let dir = tempfile::tempdir().expect("temp dir");
    let profile = dir.path().join("profile.json");
    run(&["retry", profile.to_str().expect("UTF-8 path")]);
    let text = std::fs::read_to_string(&profile).expect("profile written");
    let json: serde_json::Value = serde_json::from_str(&text).expect("profile is JSON");
    assert_eq!(json["exit"]["code"], 3, "{text}");
}

/// Check that `memtrail_wait` after the caller reaped the command itself
/// says so with `MEMTRAIL_E_STATE` (issue 28: `MEMTRAIL_E_INTERNAL`), and
/// that the profile is still written, with no exit code.
#[test]
fn ffi_c_wait_after_caller_reaped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let profile = dir.path().join("profile.json");
    run(&["reaped", profile.to_str().expect("UTF-8 path")]);
    let text = std::fs::read_to_string(&profile).expect("profile written");
    let json: serde_json::Value = serde_json::from_str(&text).expect("profile is JSON");
    assert!(json["exit"]["code"].is_null(), "{text}");
}

/// Check that every C call on a freed handle returns `MEMTRAIL_E_HANDLE`
/// once a new session started, three times over, and that the new session
/// counts a region exactly (issue 27).
#[test]
fn ffi_c_stale_handle_refused() {
    run(&["stale"]);
}

/// Check that a thread's snapshots and regions go on while another thread
/// is in `memtrail_wait` for a command that runs until told to exit (issue
/// 27: `memtrail_wait` held the session, and the snapshot waited for the
/// command's end).
#[test]
fn ffi_c_wait_does_not_block_snapshots() {
    run(&["wait-snapshot"]);
}

/// Check that the C ABI's calls and `memtrail_last_error` work in a
/// thread's pthread-key destructor, after its thread-locals were torn down
/// (issue 27: the process aborted).
#[test]
fn ffi_c_calls_during_thread_teardown() {
    run(&["teardown"]);
}

/// Check that a larger options struct (a newer header's) is taken while
/// the bytes past this library's are 0 and refused with
/// `MEMTRAIL_E_UNKNOWN_FIELD` once one is set, and that
/// `memtrail_options_init` zeroes them (issue 27: they were ignored).
#[test]
fn ffi_c_newer_struct_unknown_field_refused() {
    run(&["newer"]);
}
