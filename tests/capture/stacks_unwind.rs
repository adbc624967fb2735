//! Stacks of code built without frame pointers, unwound in BPF from each
//! image's unwind tables (issue 12), and frames that must be code (issue 16).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::support::{self, fixture, fixture_source, fixture_with_flags, line_of, num};
use serde_json::Value;

/// The allocation sites.
fn stacks(profile: &Value) -> Vec<&Value> {
    support::allocation_sites(profile)
}

fn frames(stack: &Value) -> &[Value] {
    stack["frames"].as_array().expect("frames array")
}

fn function(frame: &Value) -> &str {
    frame["function"].as_str().unwrap_or("")
}

fn module(frame: &Value) -> &str {
    frame["module"].as_str().unwrap_or("")
}

/// Function names of a stack's frames, innermost first.
fn functions(stack: &Value) -> Vec<&str> {
    frames(stack).iter().map(function).collect()
}

fn assert_at(frame: &Value, function_name: &str, file: &str, line: u64) {
    assert_eq!(function(frame), function_name, "frame {frame}");
    let path = frame["file"].as_str().unwrap_or_default();
    assert!(path.ends_with(file), "frame {frame} not in {file}");
    assert_eq!(frame["line"].as_u64(), Some(line), "frame {frame}");
}

/// The stack of the allocation of `bytes` bytes (one allocation).
fn stack_of(profile: &Value, bytes: u64) -> &Value {
    let found: Vec<&Value> = stacks(profile)
        .into_iter()
        .filter(|s| num(s, "bytes") == bytes)
        .collect();
    assert_eq!(found.len(), 1, "{bytes}-byte stacks: {found:#?}");
    found[0]
}

/// `memtrail run -q -o PROFILE ARGS -- CMD`; the profile.
fn run_profile(cmd: &[OsString], args: &[&str]) -> Value {
    run_profile_env(cmd, args, &[])
}

/// [`run_profile`] with `env` set for memtrail (a `MEMTRAIL_FAULT`).
fn run_profile_env(cmd: &[OsString], args: &[&str], env: &[(&str, &str)]) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("profile.json");
    let mut argv: Vec<OsString> = vec!["run".into(), "-q".into(), "-o".into()];
    argv.push(out.clone().into());
    argv.extend(args.iter().map(Into::into));
    argv.push("--".into());
    argv.extend(cmd.iter().cloned());
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", env);
    assert!(status.success(), "{stderr}");
    let profile = support::read_profile(&out).expect("profile written");
    assert_no_allocator_callers(&profile);
    profile
}

/// Functions of the allocator itself: never the caller of an allocation
/// (a frame-pointer step through code that keeps no frame pointer took a
/// stale frame of one for a caller, issue 23).
const ALLOCATOR_FUNCTIONS: &[&str] = &[
    "malloc",
    "free",
    "calloc",
    "realloc",
    "cfree",
    "__libc_malloc",
    "__libc_free",
    "__libc_calloc",
    "__libc_realloc",
    "__GI___libc_free",
    "__GI___libc_malloc",
    "_int_malloc",
    "_int_free",
    "_int_realloc",
    "malloc_consolidate",
    "sysmalloc",
    "tcache_init",
];

/// Checks that no frame of any stack of `profile` is a function of the
/// allocator. Inlined frames are the code at their real frame's address
/// (ld.so's `malloc` inlined from rtld-malloc.h into its dlopen path), so
/// no walk made them up.
fn assert_no_allocator_callers(profile: &Value) {
    for stack in stacks(profile) {
        let real = frames(stack).iter().filter(|f| f["inlined"] != true);
        for f in real.map(function) {
            assert!(
                !ALLOCATOR_FUNCTIONS.contains(&f),
                "{f} as a caller of an allocation: {stack:#}"
            );
        }
    }
}

/// Whether the walk reached the outermost frame (`end` absent).
fn complete(stack: &Value) -> bool {
    stack.get("end").is_none()
}

/// The frames of a complete stack from its end: glibc's start-up, then
/// main (whose index is returned).
fn assert_reaches_start(stack: &Value) -> usize {
    assert!(complete(stack), "{stack:#}");
    let f = functions(stack);
    let n = f.len();
    assert!(n >= 4, "{f:?}");
    assert_eq!(
        &f[n - 3..],
        ["__libc_start_call_main", "__libc_start_main_impl", "_start"],
        "{f:?}"
    );
    assert_eq!(f[n - 4], "main", "{f:?}");
    n - 4
}

/// Check that an allocation in a shared library's constructor, which the
/// dynamic loader runs from its entry code (`_dl_start_user`, which has no
/// unwind table), has a complete stack that ends there, and that the
/// program's own allocation reaches main and _start.
#[test]
fn stacks_unwind_library_constructor_complete_at_loader_entry() {
    let lib = fixture_with_flags("ctor_lib", &["-shared", "-fPIC"]);
    let dir = lib
        .parent()
        .and_then(Path::to_str)
        .expect("utf-8 fixture dir");
    let name = lib
        .file_name()
        .and_then(|n| n.to_str())
        .expect("utf-8 name");
    let exe = fixture_with_flags(
        "ctor_lib_main",
        &[
            "-Wl,--no-as-needed",
            "-L",
            dir,
            &format!("-l:{name}"),
            &format!("-Wl,-rpath,{dir}"),
        ],
    );
    let p = run_profile(&[exe.into()], &[]);
    let s = stack_of(&p, 4321);
    let f = functions(s);
    assert!(complete(s), "{s:#}");
    assert_eq!(f.first(), Some(&"lib_early"), "{f:?}");
    assert_eq!(f.last(), Some(&"_dl_start_user"), "{f:?}");
    assert!(module(&frames(s)[f.len() - 1]).contains("ld-"), "{s:#}");
    assert_reaches_start(stack_of(&p, 4322));
}

/// Check that stacks of a C program built -O2 -fomit-frame-pointer are
/// exact frame by frame from the allocating function to main and on to
/// _start: a plain call chain, a path through glibc's qsort with an
/// allocating comparator, and an allocation in a signal handler, through
/// the signal trampoline into the interrupted code.
#[test]
fn stacks_unwind_without_frame_pointers_exact() {
    let exe = fixture_with_flags("stack_unwind", support::NO_FP);
    let p = run_profile(&[exe.into()], &[]);
    let src = "stack_unwind.c";
    assert_eq!(p["unwind"]["mode"], "auto");
    assert_eq!(stacks(&p).len(), 4, "{:#?}", stacks(&p));

    let chain = stack_of(&p, 11111);
    let main = assert_reaches_start(chain);
    assert_eq!(main, 3, "{:?}", functions(chain));
    let f = frames(chain);
    assert_at(&f[0], "leaf", src, line_of(src, "LEAF_SITE"));
    assert_at(&f[1], "middle", src, line_of(src, "MIDDLE_CALL"));
    assert_at(&f[2], "outer", src, line_of(src, "OUTER_CALL"));
    assert_at(&f[3], "main", src, line_of(src, "MAIN_OUTER"));

    let sort = stack_of(&p, 22222);
    let main = assert_reaches_start(sort);
    let f = frames(sort);
    assert_at(&f[0], "cmp", src, line_of(src, "CMP_SITE"));
    assert_at(&f[main - 1], "sort_path", src, line_of(src, "SORT_CALL"));
    assert_at(&f[main], "main", src, line_of(src, "MAIN_SORT"));
    let inside = &f[1..main - 1];
    assert!(
        !inside.is_empty() && inside.iter().all(|fr| module(fr).ends_with("/libc.so.6")),
        "{:?}",
        functions(sort)
    );
    assert!(
        inside.iter().any(|fr| function(fr).contains("qsort")),
        "{:?}",
        functions(sort)
    );

    let handler = stack_of(&p, 33333);
    let main = assert_reaches_start(handler);
    let f = frames(handler);
    assert_at(&f[0], "on_signal", src, line_of(src, "HANDLER_SITE"));
    assert_eq!(function(&f[1]), "__restore_rt", "{:?}", functions(handler));
    assert_at(&f[main - 1], "signal_path", src, line_of(src, "RAISE_CALL"));
    assert_at(&f[main], "main", src, line_of(src, "MAIN_SIGNAL"));
    let inside = &f[2..main - 1];
    assert!(
        inside.iter().all(|fr| module(fr).ends_with("/libc.so.6"))
            && inside.iter().any(|fr| function(fr).contains("raise")),
        "{:?}",
        functions(handler)
    );

    let direct = stack_of(&p, 44444);
    assert_eq!(assert_reaches_start(direct), 0);
    assert_at(&frames(direct)[0], "main", src, line_of(src, "MAIN_SITE"));
    assert_eq!(p["unwind"]["ended_early"], serde_json::json!([]));
}

/// Check that a recursion deeper than --stack-depth, built without frame
/// pointers, keeps exactly --stack-depth frames (127 by default, 5 asked),
/// each at its call, says the depth ended it, and that a shallow stack
/// starts at main.
#[test]
fn stacks_unwind_depth_exact() {
    let exe = fixture_with_flags("stack_deep", support::NO_FP);
    let src = "stack_deep.c";
    let (site, call) = (line_of(src, "DEEP_SITE"), line_of(src, "DEEP_CALL"));
    for (depth, args) in [(127, &[][..]), (5, &["--stack-depth", "5"][..])] {
        let p = run_profile(&[exe.clone().into()], args);
        let deep = stack_of(&p, 33333);
        assert_eq!(deep["end"], "depth_limit");
        let f = frames(deep);
        assert_eq!(f.len(), depth, "{f:#?}");
        assert_at(&f[0], "deep", src, site);
        for frame in &f[1..] {
            assert_at(frame, "deep", src, call);
        }
        let shallow = stack_of(&p, 44444);
        assert_eq!(assert_reaches_start(shallow), 0);
        assert_at(&frames(shallow)[0], "main", src, line_of(src, "MAIN_SITE"));
        let early = &p["unwind"]["ended_early"];
        assert_eq!(
            early,
            &serde_json::json!([{"reason": "depth_limit", "stacks": 1, "bytes": 33333}])
        );
    }
}

/// The functions of each stack up to main (all of a stack cut by the
/// depth), by allocated bytes.
fn to_main(p: &Value) -> Vec<(u64, Vec<String>)> {
    let mut out: Vec<(u64, Vec<String>)> = stacks(p)
        .into_iter()
        .map(|s| {
            let f = functions(s);
            let end = f
                .iter()
                .position(|f| *f == "main")
                .map_or(f.len(), |m| m + 1);
            (
                num(s, "bytes"),
                f[..end].iter().map(|s| s.to_string()).collect(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Check that on programs built with frame pointers, --unwind dwarf and
/// --unwind fp give the same stacks up to main (beyond it, glibc's start-up
/// has no frame pointers: only the tables reach _start).
#[test]
fn stacks_unwind_dwarf_matches_frame_pointers() {
    for name in ["stacks", "stack_deep"] {
        let exe = fixture(name);
        let fp = run_profile(&[exe.clone().into()], &["--unwind", "fp"]);
        let dwarf = run_profile(&[exe.into()], &["--unwind", "dwarf"]);
        assert_eq!(fp["unwind"]["mode"], "fp");
        assert_eq!(dwarf["unwind"]["mode"], "dwarf");
        assert!(!stacks(&fp).is_empty());
        assert_eq!(to_main(&fp), to_main(&dwarf), "{name}");
        for s in stacks(&dwarf) {
            if s["end"] != "depth_limit" {
                assert_reaches_start(s);
            }
        }
    }
}

/// Check that C++ stacks built without frame pointers go through
/// libstdc++ and std::sort exactly: an allocating comparator's `new` shows
/// the comparator, std::sort's frames and the caller down to main; a thrown
/// exception's object is allocated in libstdc++ from the thrower, and the
/// exception is still caught (the fixture exits 0 only then).
#[test]
fn stacks_unwind_cxx_through_libstdcxx() {
    let exe = fixture_with_flags("stack_unwind_cxx", support::NO_FP);
    let p = run_profile(&[exe.into()], &[]);
    let src = "stack_unwind_cxx.cc";
    let sort = stack_of(&p, 55555);
    let main = assert_reaches_start(sort);
    let f = frames(sort);
    assert_at(&f[0], "by_value(int, int)", src, line_of(src, "CMP_NEW"));
    assert_at(&f[main - 1], "sort_path()", src, line_of(src, "SORT_CALL"));
    assert_at(&f[main], "main", src, line_of(src, "MAIN_SORT"));
    assert!(
        f[1..main - 1]
            .iter()
            .any(|fr| function(fr).contains("std::__introsort_loop")),
        "{:?}",
        functions(sort)
    );

    let thrown: Vec<&Value> = stacks(&p)
        .into_iter()
        .filter(|s| function(&frames(s)[0]) == "__cxa_allocate_exception")
        .collect();
    assert_eq!(thrown.len(), 1, "{:#?}", stacks(&p));
    assert_eq!(assert_reaches_start(thrown[0]), 2);
    let f = frames(thrown[0]);
    assert!(module(&f[0]).contains("libstdc++"), "{}", f[0]);
    assert_at(&f[1], "throw_path(int)", src, line_of(src, "THROW"));
    assert_at(&f[2], "main", src, line_of(src, "MAIN_THROW"));
}

/// Check that a Rust program built with optimisations and without forced
/// frame pointers (Rust's default, as its std is built) has stacks from
/// the allocating function through std's start-up to C's main and _start.
#[test]
fn stacks_unwind_rust_release() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("stack_rust");
    let status =
        std::process::Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
            .args(["-g", "-C", "opt-level=2", "-o"])
            .arg(&exe)
            .arg(fixture_source("stack_rust.rs"))
            .status()
            .expect("rustc runs");
    assert!(status.success());
    let p = run_profile(&[exe.into()], &[]);
    let sites: Vec<&Value> = stacks(&p)
        .into_iter()
        .filter(|s| functions(s).contains(&"stack_rust::make_buffer"))
        .collect();
    let bytes: u64 = sites.iter().map(|s| num(s, "bytes")).sum();
    assert_eq!(bytes, 3 * 55555, "{:#?}", stacks(&p));
    for site in sites {
        let f = functions(site);
        let at = f
            .iter()
            .position(|f| *f == "stack_rust::make_buffer")
            .unwrap();
        assert_eq!(f[at + 1], "stack_rust::main", "{f:?}");
        assert_eq!(
            frames(site)[at]["line"].as_u64(),
            Some(line_of("stack_rust.rs", "MAKE_BUFFER"))
        );
        assert!(f.contains(&"std::rt::lang_start_internal"), "{f:?}");
        assert_reaches_start(site);
    }
}

/// Check that on Debian's python3.11 (glibc and python built without frame
/// pointers) every allocated byte has a complete stack: each reaches the
/// interpreter's entry (Py_BytesMain, which main tail-calls) and glibc's
/// start-up down to _start.
#[test]
fn stacks_unwind_python_reaches_main() {
    let python = Path::new("/usr/bin/python3.11");
    assert!(python.exists(), "scripts/test.sh installs python3.11");
    let p = run_profile(
        &[
            python.into(),
            "-c".into(),
            "x=[str(i)*3 for i in range(200000)]".into(),
        ],
        &[],
    );
    let all = stacks(&p);
    assert!(all.len() > 100, "{} stacks", all.len());
    let total: u64 = all.iter().map(|s| num(s, "bytes")).sum();
    assert_eq!(total, num(&p["totals"], "allocated_bytes"));
    for s in all {
        let f = functions(s);
        assert!(complete(s), "{f:?}");
        assert!(f.contains(&"Py_BytesMain"), "{f:?}");
        assert!(
            f.ends_with(&["__libc_start_call_main", "__libc_start_main_impl", "_start"]),
            "{f:?}"
        );
    }
    assert_eq!(p["unwind"]["ended_early"], serde_json::json!([]));
}

/// Check that a frame-pointer step landing on data (rbp pointing at a
/// vector on the stack, whose end, a heap address, sits where a return
/// address would) ends the walk instead of taking the heap address as a
/// frame: the ten allocations of one site stay one stack (issue 16).
#[test]
fn stacks_frames_outside_code_end_the_walk() {
    let exe = fixture_with_flags("stack_heap_rbp", support::NO_FP);
    let src = "stack_heap_rbp.c";
    for mode in ["fp", "auto"] {
        let p = run_profile(&[exe.clone().into()], &["--unwind", mode]);
        let all = stacks(&p);
        assert_eq!(all.len(), 1, "--unwind {mode}: {all:#?}");
        assert_eq!(
            (num(all[0], "allocations"), num(all[0], "bytes")),
            (10, 55000)
        );
        assert_at(&frames(all[0])[0], "grow", src, line_of(src, "GROW_SITE"));
        if mode == "auto" {
            assert_eq!(assert_reaches_start(all[0]), 1);
        }
    }
}

/// Check that an image without any CFI (built without unwind tables,
/// .eh_frame removed) is a warning naming it and shorter stacks, never a
/// failed capture: the profile and the summary say which image and why
/// stacks ended.
#[test]
fn stacks_unwind_image_without_cfi_warns() {
    let built = fixture_with_flags(
        "stack_unwind",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-fno-builtin",
        ],
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("no_cfi");
    support::strip_unwind_tables(&built, &exe);
    let out = dir.path().join("profile.json");
    let argv: Vec<OsString> = vec![
        "run".into(),
        "-o".into(),
        out.clone().into(),
        "--".into(),
        exe.clone().into(),
    ];
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", &[]);
    assert!(status.success(), "{stderr}");
    let exe_name = exe.to_str().unwrap();
    assert!(
        stderr.contains("no unwind information") && stderr.contains(exe_name),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("no unwind table for {exe_name} (no CFI)")),
        "{stderr}"
    );
    let p = support::read_profile(&out).expect("profile");
    let image = p["unwind"]["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"] == exe_name)
        .expect("the image's entry");
    assert_eq!(image["status"], "no_cfi");
    assert_eq!(stacks(&p).len(), 4);
    for (bytes, first) in [
        (11111, "leaf"),
        (22222, "cmp"),
        (33333, "on_signal"),
        (44444, "main"),
    ] {
        let s = stack_of(&p, bytes);
        assert_eq!(function(&frames(s)[0]), first);
        assert!(!complete(s), "{s:#}");
    }
}

/// Check that stacks whose shape changes from one allocation to the next
/// over the same code, built without frame pointers, are each exactly what
/// a full walk gives, however many of their frames' rows the walk found
/// cached (issue 22: a PC → row cache): at the same leaf, rec() nested 1
/// to 12 deep under two callers, three rounds; each depth is one stack of
/// 3 allocations with exactly its frames.
#[test]
fn stacks_unwind_changing_stacks_exact() {
    let exe = fixture_with_flags("stack_change", support::NO_FP);
    check_changing_stacks(&run_profile(&[exe.into()], &[]));
}

/// Check the same with one row cache slot per image (`MEMTRAIL_FAULT=
/// one-row-cache-slot`): the entry a frame finds is mostly another
/// frame's, which must never be taken for its own (without the entry's tag
/// check, this fails).
#[test]
fn stacks_unwind_changing_stacks_exact_one_cache_slot() {
    let exe = fixture_with_flags("stack_change", support::NO_FP);
    let env = [("MEMTRAIL_FAULT", "one-row-cache-slot")];
    check_changing_stacks(&run_profile_env(&[exe.into()], &[], &env));
}

/// Check that four processes whose stacks sit at the same addresses
/// (forks), changing them at the same time, each get exactly their own
/// stacks when all walks contend for one stack window (`MEMTRAIL_FAULT=
/// one-stack-window`): a walk that finds the window claimed by another
/// reads its words itself (without the claim, a walk takes the other
/// process's words at its own addresses, and this fails).
#[test]
fn stacks_unwind_twins_one_stack_window_exact() {
    let exe = fixture_with_flags("stack_twins", support::NO_FP);
    let env = [("MEMTRAIL_FAULT", "one-stack-window")];
    // 960k records: on a loaded machine the events ring can fill before
    // the poller gets a CPU. Pauses instead of a failed capture: this test
    // is about whose words a walk reads.
    let p = run_profile_env(&[exe.into()], &["--pressure-timeout", "inf"], &env);
    let src = "stack_twins.c";
    for k in 0..4u64 {
        let (via, mark) = if k % 2 == 1 {
            ("via_b", "VIA_B")
        } else {
            ("via_a", "VIA_A")
        };
        let base = 1000 * (k + 1);
        for d in 1..=12u64 {
            let sites: Vec<&Value> = stacks(&p)
                .into_iter()
                .filter(|s| s["bytes"].as_u64() == Some(10_000 * (base + d)))
                .collect();
            assert_eq!(sites.len(), 1, "process {k}, depth {d}: {sites:#?}");
            let s = sites[0];
            assert_eq!(num(s, "allocations"), 10_000, "process {k}, depth {d}");
            let main = assert_reaches_start(s);
            let f = frames(s);
            assert_eq!(
                main,
                d as usize + 2,
                "process {k}, depth {d}: {:?}",
                functions(s)
            );
            assert_at(&f[0], "leaf", src, line_of(src, "LEAF"));
            for frame in &f[1..=d as usize] {
                assert_at(frame, "rec", src, line_of(src, "REC"));
            }
            assert_at(&f[d as usize + 1], via, src, line_of(src, mark));
            assert_at(&f[main], "main", src, line_of(src, "MAIN"));
        }
    }
    let sized = stacks(&p)
        .into_iter()
        .filter(|s| (1000..5000).contains(&(s["bytes"].as_u64().unwrap_or(0) / 10_000)))
        .count();
    assert_eq!(sized, 48, "one stack per process and depth, no other");
}

/// The stacks of `stack_change.c`: for each depth one stack of 3
/// allocations with exactly its frames.
fn check_changing_stacks(p: &Value) {
    let src = "stack_change.c";
    for d in 1..=12u64 {
        let sites: Vec<&Value> = stacks(p)
            .into_iter()
            .filter(|s| s["bytes"].as_u64() == Some(3 * (1000 + d)))
            .collect();
        assert_eq!(sites.len(), 1, "depth {d}: {sites:#?}");
        let s = sites[0];
        assert_eq!(num(s, "allocations"), 3, "depth {d}");
        let main = assert_reaches_start(s);
        let f = frames(s);
        assert_eq!(main, d as usize + 2, "depth {d}: {:?}", functions(s));
        assert_at(&f[0], "leaf", src, line_of(src, "LEAF"));
        for frame in &f[1..=d as usize] {
            assert_at(frame, "rec", src, line_of(src, "REC"));
        }
        let (via, mark) = if d % 2 == 1 {
            ("via_a", "VIA_A")
        } else {
            ("via_b", "VIA_B")
        };
        assert_at(&f[d as usize + 1], via, src, line_of(src, mark));
        assert_at(&f[main], "main", src, line_of(src, "MAIN"));
    }
}

/// A C file of `n` functions, each calling the one before it, for
/// `clang-19 -O2 -c` to chew on.
fn generated_c(dir: &Path, n: usize) -> PathBuf {
    let mut src = String::from(
        "int f0(int *a, int n) { int s = 0; for (int j = 0; j < n; j++) s += a[j]; return s; }\n",
    );
    for i in 1..n {
        src.push_str(&format!(
            "int f{i}(int *a, int n) {{ int s = 0; for (int j = 0; j < n; j++) s += a[j] * {i} + (s >> 3); \
             if (s % 7 == {}) s ^= f{}(a, n / 2); return s; }}\n",
            i % 7,
            i - 1
        ));
    }
    src.push_str("int main(void) { int a[64] = {0}; int s = 0;");
    for i in (0..n).step_by(3) {
        src.push_str(&format!(" s += f{i}(a, 64);"));
    }
    src.push_str(" return s & 1; }\n");
    let path = dir.join("generated.c");
    std::fs::write(&path, src).expect("write the C file");
    path
}

/// The images clang-19 unwinds through: libLLVM, libclang-cpp and libz3
/// have 1.2 M, 1.3 M and 0.4 M rows, 2.9 M between them.
const CLANG_IMAGES: [&str; 3] = ["libLLVM.so", "libclang-cpp.so", "libz3.so"];

/// Check that clang-19, whose libraries' tables are 2.9 M rows, unwinds
/// to main: at least 99 % of the bytes it allocates have stacks that reach
/// main and _start (they stopped at the room left, ~1 M rows, issue 23),
/// every one of those libraries' tables loaded, no allocator function
/// taken for a caller; and that the image cache
/// spills into no later capture: a capture of `true` made after it (the
/// same cache) says nothing about clang's libraries, whose tables it never
/// needs (nor about libicudata, which has none).
#[test]
fn stacks_unwind_clang_reaches_main_and_its_cache_spills_nowhere() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = generated_c(dir.path(), 40);
    let obj = dir.path().join("generated.o");
    let out = dir.path().join("clang.json");
    let argv: Vec<OsString> = vec![
        "run".into(),
        "-o".into(),
        out.clone().into(),
        "--".into(),
        "clang-19".into(),
        "-O2".into(),
        "-c".into(),
        src.into(),
        "-o".into(),
        obj.into(),
    ];
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", &[]);
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("does not fit"), "{stderr}");
    let p = support::read_profile(&out).expect("profile");
    let images = p["unwind"]["images"].as_array().expect("unwind images");
    for name in CLANG_IMAGES {
        let image = images
            .iter()
            .find(|i| i["image"].as_str().unwrap_or_default().contains(name))
            .unwrap_or_else(|| panic!("no table entry for {name}: {images:#?}"));
        assert_eq!(image["status"], "loaded", "{image}");
    }
    let all = stacks(&p);
    let total: u64 = all.iter().map(|s| num(s, "bytes")).sum();
    let to_main: u64 = all
        .iter()
        .filter(|s| complete(s) && functions(s).contains(&"main"))
        .map(|s| num(s, "bytes"))
        .sum();
    assert!(total > 10 << 20, "clang allocated {total} bytes");
    assert_no_allocator_callers(&p);
    assert!(
        to_main * 100 >= total * 99,
        "{to_main} of {total} bytes have stacks reaching main"
    );
    // The next capture, with the cache this one filled.
    let argv: Vec<OsString> = vec![
        "run".into(),
        "-o".into(),
        dir.path().join("true.json").into(),
        "--".into(),
        "true".into(),
    ];
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", &[]);
    assert!(status.success(), "{stderr}");
    // Nor its image without CFI (libicudata), nor any table at all.
    for name in CLANG_IMAGES.iter().chain(&["libicudata", "unwind"]) {
        assert!(!stderr.contains(name), "{name} named: {stderr}");
    }
}

/// The profile's entries for image `path`'s tables, in load order.
fn table_entries<'a>(p: &'a Value, path: &Path) -> Vec<&'a Value> {
    let path = path.to_str().expect("utf-8 path");
    p["unwind"]["images"]
        .as_array()
        .expect("unwind images")
        .iter()
        .filter(|i| i["image"] == path)
        .collect()
}

/// Check that an image's unwind table lives while a process maps it
/// (issue 23), with tables looked for at every load
/// (`MEMTRAIL_FAULT=sweep-unwind-tables`; otherwise only before the slots
/// grow by a shard): a library a forked child mapped too and that exited
/// keeps its table for its parent; two libraries dlclose()d are released
/// and the next library loaded takes their slots; a released library
/// dlopen()ed again gets its table again; every stack through each of
/// them, all built without frame pointers, is exact to `_start`.
#[test]
fn stacks_unwind_tables_released_and_reused() {
    let lib = fixture_with_flags(
        "unwind_release_lib",
        &[support::NO_FP, &["-shared", "-fPIC"]].concat(),
    );
    let exe = fixture_with_flags("unwind_release", support::NO_FP);
    let dir = tempfile::tempdir().expect("temp dir");
    let libs: Vec<PathBuf> = ["liba.so", "libb.so", "libc_copy.so"]
        .iter()
        .map(|name| {
            let to = dir.path().join(name);
            std::fs::copy(&lib, &to).expect("copy the library");
            to.canonicalize().expect("canonical path")
        })
        .collect();
    let cache = dir.path().join("cache");
    let out = dir.path().join("profile.json");
    let mut argv: Vec<OsString> = vec!["run".into(), "-q".into(), "-o".into(), out.clone().into()];
    argv.push("--".into());
    argv.push(exe.into());
    argv.extend(libs.iter().map(Into::into));
    let env = [
        ("MEMTRAIL_CACHE_DIR", cache.to_str().expect("utf-8")),
        ("MEMTRAIL_FAULT", "sweep-unwind-tables"),
    ];
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", &env);
    assert!(status.success(), "{stderr}");
    let p = support::read_profile(&out).expect("profile written");
    assert_no_allocator_callers(&p);

    let src = "unwind_release.c";
    let lib_src = "unwind_release_lib.c";
    for bytes in [1111u64, 2222, 3333, 4444, 5555] {
        let s = stack_of(&p, bytes);
        assert_eq!(assert_reaches_start(s), 2, "{bytes}: {:?}", functions(s));
        let f = frames(s);
        assert_at(&f[0], "lib_inner", lib_src, line_of(lib_src, "= malloc(n)"));
        assert_at(
            &f[1],
            "lib_alloc",
            lib_src,
            line_of(lib_src, "= lib_inner(n)"),
        );
        assert_at(
            &f[2],
            "main",
            src,
            line_of(src, &format!("/* at {bytes} */")),
        );
    }

    // A: loaded, kept while the parent maps it after its child exited,
    // released once dlclose()d with B, loaded again into B's slots. C
    // took the slots A and B left (the same table as each).
    let [a, b, c] = [&libs[0], &libs[1], &libs[2]].map(|l| table_entries(&p, l));
    assert_eq!((a.len(), b.len(), c.len()), (2, 1, 1), "{:#}", p["unwind"]);
    let loaded = |e: &Value| {
        assert_eq!(e["status"], "loaded", "{e}");
        e["slot"].as_u64().expect("a slot")
    };
    let released = |e: &Value| e["released"] == true;
    assert!(released(a[0]) && released(b[0]), "{:#}", p["unwind"]);
    assert!(!released(a[1]) && !released(c[0]), "{:#}", p["unwind"]);
    assert_eq!(loaded(c[0]), loaded(a[0]), "{:#}", p["unwind"]);
    assert_eq!(loaded(a[1]), loaded(b[0]), "{:#}", p["unwind"]);
    let tables = &p["unwind"]["tables"];
    assert_eq!(tables["released"], 2, "{tables}");
    // Two of the library's tables at most at once: the slots never held
    // three.
    let one = loaded(b[0]) - loaded(a[0]);
    assert!(one > 0);
    assert_eq!(num(tables, "extent_slots"), loaded(b[0]) + one, "{tables}");
}

/// Check that two builds of a library (different code, different tables)
/// taking turns in the same slots, each released while the other loads,
/// never serve each other's rows (issue 23: the PC -> row cache's entries
/// for released slots are cleared before the slots are written again):
/// every stack through them is exact, and every load but the first
/// released the other build's table.
#[test]
fn stacks_unwind_released_slots_never_serve_stale_rows() {
    let flags = [support::NO_FP, &["-shared", "-fPIC"]].concat();
    let plain = fixture_with_flags("unwind_release_lib", &flags);
    let padded = fixture_with_flags("unwind_release_lib", &[&flags[..], &["-DPAD"]].concat());
    assert_ne!(
        std::fs::read(&plain).unwrap(),
        std::fs::read(&padded).unwrap()
    );
    let exe = fixture_with_flags("unwind_release_churn", support::NO_FP);
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("cache");
    let out = dir.path().join("profile.json");
    const ROUNDS: u64 = 8;
    let argv: Vec<OsString> = vec![
        "run".into(),
        "-q".into(),
        "-o".into(),
        out.clone().into(),
        "--".into(),
        exe.into(),
        plain.clone().into(),
        padded.clone().into(),
        ROUNDS.to_string().into(),
    ];
    let env = [
        ("MEMTRAIL_CACHE_DIR", cache.to_str().expect("utf-8")),
        ("MEMTRAIL_FAULT", "sweep-unwind-tables"),
    ];
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", &env);
    assert!(status.success(), "{stderr}");
    let p = support::read_profile(&out).expect("profile written");
    assert_no_allocator_callers(&p);
    // Both builds are mapped at the same address in turn, so the
    // symbolizer names every frame after one of them: the frames are
    // checked by file offset against each build's own symbols instead
    // (even rounds allocate through the plain build, odd through the
    // padded one).
    let src = "unwind_release_churn.c";
    let in_symbol = |lib: &Path, name: &str, frame: &Value| {
        let nm = std::process::Command::new("nm")
            .args(["-S", "--defined-only"])
            .arg(lib)
            .output()
            .expect("nm runs");
        let text = String::from_utf8_lossy(&nm.stdout).into_owned();
        let (at, size) = text
            .lines()
            .find_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
                [at, size, _, n] if n == name => Some((
                    u64::from_str_radix(at, 16).unwrap(),
                    u64::from_str_radix(size, 16).unwrap(),
                )),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{name} in {}", lib.display()));
        let offset = num(frame, "offset");
        assert!(
            (at..at + size).contains(&(offset - 1)),
            "{name} of {}: [{at:#x}, +{size:#x}), frame at {offset:#x}",
            lib.display()
        );
    };
    let even: u64 = (0..ROUNDS).step_by(2).map(|r| 1000 + r).sum();
    let odd: u64 = (1..ROUNDS).step_by(2).map(|r| 1000 + r).sum();
    for (bytes, lib) in [(even, &plain), (odd, &padded)] {
        let s = stack_of(&p, bytes);
        assert_eq!(num(s, "allocations"), ROUNDS / 2);
        assert_eq!(assert_reaches_start(s), 2, "{:?}", functions(s));
        let f = frames(s);
        in_symbol(lib, "lib_inner", &f[0]);
        in_symbol(lib, "lib_alloc", &f[1]);
        assert_at(&f[2], "main", src, line_of(src, "/* at churn */"));
    }
    assert_eq!(
        p["unwind"]["tables"]["released"],
        ROUNDS - 1,
        "{:#}",
        p["unwind"]
    );
}
