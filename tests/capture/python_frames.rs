//! Python functions in allocation stacks (issue 25): on each CPython this
//! machine has of 3.11 (the distribution's, stripped, no frame pointers),
//! 3.12 and 3.13 (pyenv's), a method that calls two functions allocating
//! known sizes gets each size attributed to its function, file and line,
//! the method above; in the main thread, another thread and a child
//! process. `--native-only` gives the interpreter's own frames.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::support::{self, num};
use serde_json::Value;

/// The script: `SCRIPT MODE SMALL BIG`; its line numbers are asserted.
const SCRIPT: &str = "\
import subprocess, sys, threading

def small():
    return bytearray(SMALL)

def big():
    return bytearray(BIG)

class Worker:
    def run(self):
        keep = [small()]
        keep.append(big())
        return keep

mode, SMALL, BIG = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == 'main':
    Worker().run()
elif mode == 'thread':
    t = threading.Thread(target=Worker().run)
    t.start()
    t.join()
else:
    subprocess.run([sys.executable, __file__, 'main', sys.argv[2], sys.argv[3]], check=True)
";
const SMALL_LINE: u64 = 4;
const BIG_LINE: u64 = 7;
const RUN_SMALL_LINE: u64 = 11;
const RUN_BIG_LINE: u64 = 12;

/// The interpreters present, by version: the distribution's 3.11, pyenv's
/// 3.12 and 3.13 (any patch release).
fn interpreters() -> Vec<(&'static str, PathBuf)> {
    let pyenv = |minor: &str| -> Option<PathBuf> {
        let dir = std::fs::read_dir("/root/.pyenv/versions").ok()?;
        let mut found: Vec<PathBuf> = dir
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{minor}."))
            })
            .map(|e| e.path().join("bin").join(format!("python{minor}")))
            .filter(|p| p.exists())
            .collect();
        found.sort();
        found.pop()
    };
    let mut all = Vec::new();
    let distro = PathBuf::from("/usr/bin/python3.11");
    for (version, path) in [
        ("3.11", distro.exists().then_some(distro)),
        ("3.12", pyenv("3.12")),
        ("3.13", pyenv("3.13")),
    ] {
        match path {
            Some(p) => all.push((version, p)),
            None => skip(version),
        }
    }
    all
}

/// Says on the test's stderr (shown on failure, or with --nocapture)
/// which interpreter it could not test.
fn skip(version: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "python_frames: no Python {version} here (/usr/bin/python3.11, /root/.pyenv/versions/{version}.*): skipped"
    );
}

/// `memtrail run -q -o PROFILE ARGS -- PYTHON SCRIPT MODE SMALL BIG`.
fn run(python: &Path, script: &Path, mode: &str, sizes: (u64, u64), args: &[&str]) -> Value {
    let script_args = [mode.to_owned(), sizes.0.to_string(), sizes.1.to_string()];
    run_script(python, script, &script_args, args)
}

/// `memtrail run -q -o PROFILE ARGS -- PYTHON SCRIPT SCRIPT_ARGS`.
fn run_script(python: &Path, script: &Path, script_args: &[String], args: &[&str]) -> Value {
    run_script_env(python, script, script_args, args, &[]).0
}

/// [`run_script`] with `env` set, and memtrail's stderr (the script's).
fn run_script_env(
    python: &Path,
    script: &Path,
    script_args: &[String],
    args: &[&str],
    env: &[(&str, &str)],
) -> (Value, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("profile.json");
    let mut argv: Vec<OsString> = vec!["run".into(), "-q".into(), "-o".into(), out.clone().into()];
    argv.extend(args.iter().map(Into::into));
    argv.push("--".into());
    argv.push(python.into());
    argv.push(script.into());
    argv.extend(script_args.iter().map(Into::into));
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", env);
    assert!(status.success(), "{stderr}");
    (
        support::read_profile(&out).expect("profile written"),
        stderr,
    )
}

/// The one site of `bytes` bytes: one allocation (bytearray(n) takes n + 1).
fn site(profile: &Value, bytes: u64) -> &Value {
    let found: Vec<&Value> = support::allocation_sites(profile)
        .into_iter()
        .filter(|s| num(s, "bytes") == bytes)
        .collect();
    assert_eq!(found.len(), 1, "{bytes}-byte sites: {found:#?}");
    assert_eq!(num(found[0], "allocations"), 1, "{:#}", found[0]);
    found[0]
}

/// The site's Python frames, innermost first: (function, file, line).
fn python_frames(site: &Value) -> Vec<(String, String, u64)> {
    let frames = site["frames"].as_array().expect("frames");
    for f in frames {
        assert!(
            !f["function"]
                .as_str()
                .is_some_and(|name| name.starts_with("_PyEval_EvalFrameDefault")),
            "an interpreter-loop frame left: {site:#}"
        );
    }
    frames
        .iter()
        .filter(|f| f["module"] == "[python]")
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap_or_default().to_owned();
            (s("function"), s("file"), f["line"].as_u64().unwrap_or(0))
        })
        .collect()
}

/// The site of `bytes` bytes: `function` at its line, called by the method
/// at its line, in the script.
fn assert_site(profile: &Value, bytes: u64, script: &Path, expect: [(&str, u64); 2], what: &str) {
    let frames = python_frames(site(profile, bytes));
    let file = script.to_str().expect("utf-8 path").to_owned();
    let got: Vec<(String, String, u64)> = frames.into_iter().take(2).collect();
    let want: Vec<(String, String, u64)> = expect
        .iter()
        .map(|&(f, line)| (f.to_owned(), file.clone(), line))
        .collect();
    assert_eq!(got, want, "{what}");
}

fn script(dir: &Path) -> PathBuf {
    let path = dir.join("alloc_sites.py");
    std::fs::write(&path, SCRIPT).expect("script written");
    path
}

/// Check the script's two sites: `small` and `big` (the sizes asked, one
/// byte more allocated) each under its function and `Worker.run`.
fn assert_worker_sites(profile: &Value, script: &Path, (small, big): (u64, u64), what: &str) {
    let small_at = [("small", SMALL_LINE), ("Worker.run", RUN_SMALL_LINE)];
    assert_site(profile, small + 1, script, small_at, what);
    let big_at = [("big", BIG_LINE), ("Worker.run", RUN_BIG_LINE)];
    assert_site(profile, big + 1, script, big_at, what);
}

/// Check that each function's bytes go to it, with file and line, under the
/// method, in the main thread, another thread and a child process, on each
/// interpreter present.
#[test]
fn python_frames_name_functions_and_lines() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = script(dir.path());
    for (i, (version, python)) in interpreters().into_iter().enumerate() {
        for (j, mode) in ["main", "thread", "subprocess"].into_iter().enumerate() {
            // Sizes no other allocation of the interpreter has.
            let small = 300_000 + 1_000 * (3 * i + j) as u64 + 17;
            let big = 700_000 + 1_000 * (3 * i + j) as u64 + 23;
            let profile = run(&python, &script, mode, (small, big), &[]);
            let what = format!("python {version}, {mode}");
            assert_worker_sites(&profile, &script, (small, big), &what);
        }
    }
}

/// Check that `--native-only` keeps the interpreter's frames and names no
/// Python function: both sizes then come from one site, the interpreter's.
#[test]
fn python_frames_native_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = script(dir.path());
    for (version, python) in interpreters() {
        let (small, big) = (311_017, 711_023);
        let profile = run(&python, &script, "main", (small, big), &["--native-only"]);
        let bytes = small + 1 + big + 1;
        let found: Vec<&Value> = support::allocation_sites(&profile)
            .into_iter()
            .filter(|s| num(s, "bytes") == bytes)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "python {version}: {bytes}-byte sites: {found:#?}"
        );
        let site = found[0];
        assert_eq!(num(site, "allocations"), 2, "python {version}: {site:#}");
        let frames = site["frames"].as_array().expect("frames");
        assert!(
            frames.iter().all(|f| f["module"] != "[python]"),
            "python {version}: {site:#}"
        );
        assert!(
            frames
                .iter()
                .any(|f| f["function"] == "_PyEval_EvalFrameDefault"),
            "python {version}: {site:#}"
        );
    }
}

/// Check that stacks walked by frame pointers (`--unwind fp`) get their
/// Python frames too: the interpreters here are built without frame
/// pointers, so the native walk stops early in the interpreter, and the
/// Python frames follow the native frames it found.
#[test]
fn python_frames_with_frame_pointer_walks() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = script(dir.path());
    for (i, (version, python)) in interpreters().into_iter().enumerate() {
        let small = 320_000 + 1_000 * i as u64 + 17;
        let big = 720_000 + 1_000 * i as u64 + 23;
        let profile = run(&python, &script, "main", (small, big), &["--unwind", "fp"]);
        let what = format!("python {version}, --unwind fp");
        assert_worker_sites(&profile, &script, (small, big), &what);
    }
}

/// A mapping pattern calls the subject's `get` from the interpreter loop's
/// cold part (`match_keys`, split off into `_PyEval_EvalFrameDefault.cold`
/// by GCC): the Python function it calls allocates `SIZE` bytes.
const COLD_SCRIPT: &str = "\
import sys

class Lookup(dict):
    def get(self, key, default=None):
        return bytearray(int(sys.argv[1]))

def matched(m):
    match m:
        case {'k': v}:
            return v

keep = matched(Lookup(k=1))
";
const COLD_GET_LINE: u64 = 5;
const COLD_CASE_LINE: u64 = 9;
const COLD_MODULE_LINE: u64 = 12;

/// Check that a stack through the interpreter loop's cold part gets the
/// Python frames of that run of the loop in its place (on the
/// distribution's stripped python3.11 no symbol names the cold part: it is
/// found by the loop's jumps into it), not after the native frames.
#[test]
fn python_frames_through_the_loops_cold_part() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("cold_part.py");
    std::fs::write(&script, COLD_SCRIPT).expect("script written");
    let file = script.to_str().expect("utf-8 path").to_owned();
    for (i, (version, python)) in interpreters().into_iter().enumerate() {
        let size = 330_000 + 1_000 * i as u64 + 29;
        let profile = run_script(&python, &script, &[size.to_string()], &[]);
        let site = site(&profile, size + 1);
        let got: Vec<(String, String, u64)> = python_frames(site).into_iter().take(3).collect();
        let want: Vec<(String, String, u64)> = [
            ("Lookup.get", COLD_GET_LINE),
            ("matched", COLD_CASE_LINE),
            ("<module>", COLD_MODULE_LINE),
        ]
        .iter()
        .map(|&(f, line)| (f.to_owned(), file.clone(), line))
        .collect();
        assert_eq!(got, want, "python {version}: {site:#}");
        // In place of the loop frame that ran them: before the
        // interpreter's main, not after it.
        let frames = site["frames"].as_array().expect("frames");
        let at = |name: &str| frames.iter().position(|f| f["function"] == name);
        let module = at("<module>").expect("<module>");
        let main = at("Py_BytesMain").expect("Py_BytesMain in the stack");
        assert!(module < main, "python {version}: {site:#}");
    }
}

/// Coroutines run as asyncio tasks: each allocates from a function it
/// calls, or from a coroutine it awaits.
const ASYNC_SCRIPT: &str = "\
import asyncio, sys

keep = []

def fill(n):
    return bytearray(n)

async def first(n):
    await asyncio.sleep(0)
    keep.append(fill(n))

async def inner(n):
    await asyncio.sleep(0)
    return bytearray(n)

async def second(n):
    keep.append(await inner(n))

async def main(a, b):
    await asyncio.gather(asyncio.create_task(first(a)), asyncio.create_task(second(b)))

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
";

/// Check that coroutines running as asyncio tasks carry their bytes: the
/// running task's coroutine chain (the coroutine awaited innermost), with
/// files and lines, then the event loop's frames that resumed it.
#[test]
fn python_frames_in_asyncio_tasks() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("tasks.py");
    std::fs::write(&script, ASYNC_SCRIPT).expect("script written");
    let file = script.to_str().expect("utf-8 path").to_owned();
    for (i, (version, python)) in interpreters().into_iter().enumerate() {
        let a = 340_000 + 1_000 * i as u64 + 31;
        let b = 740_000 + 1_000 * i as u64 + 37;
        let profile = run_script(&python, &script, &[a.to_string(), b.to_string()], &[]);
        for (bytes, expect) in [
            (a + 1, [("fill", 6), ("first", 10)]),
            (b + 1, [("inner", 14), ("second", 17)]),
        ] {
            let site = site(&profile, bytes);
            let frames = python_frames(site);
            let got: Vec<(String, String, u64)> = frames.iter().take(2).cloned().collect();
            let want: Vec<(String, String, u64)> = expect
                .iter()
                .map(|&(f, line)| (f.to_owned(), file.clone(), line))
                .collect();
            assert_eq!(got, want, "python {version}: {site:#}");
            // Then the event loop: the handle that stepped the task, and
            // asyncio.run at the bottom, under the script's <module>.
            assert_eq!(frames[2].0, "Handle._run", "python {version}: {site:#}");
            assert!(
                frames[2].1.ends_with("asyncio/events.py"),
                "python {version}: {site:#}"
            );
            let last = frames.last().expect("frames");
            assert_eq!(
                (&last.0[..], last.2),
                ("<module>", 22),
                "python {version}: {site:#}"
            );
            assert!(
                frames
                    .iter()
                    .any(|f| f.0 == "run" && f.1.ends_with("asyncio/runners.py")),
                "python {version}: {site:#}"
            );
        }
    }
}

/// Check that with `--preload` the shim walks the Python frames itself (the
/// ring path: libunwind in the process, no kernel entry per allocation),
/// with the layouts memtrail gives it (3.11's and 3.12's by version,
/// 3.13's read from its image), and that they are the frames BPF walks on
/// the hook path (`MEMTRAIL_FAULT=shim-hook-only`): each site's Python
/// frames, with files and lines, in the main thread, another thread and a
/// child process, on each interpreter present.
#[test]
fn python_frames_preload_ring_path_same_as_hook_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The script, then whether libunwind is in the process (the ring path
    // loads it; nothing else in these interpreters does).
    let script = dir.path().join("alloc_sites_unwinder.py");
    let text = format!(
        "{SCRIPT}sys.stderr.write('unwinder: %s\\n' % ('libunwind' in open('/proc/self/maps').read()))\n"
    );
    std::fs::write(&script, text).expect("script written");
    let run = |python: &Path, mode: &str, sizes: (u64, u64), env: &[(&str, &str)]| {
        let script_args = [mode.to_owned(), sizes.0.to_string(), sizes.1.to_string()];
        run_script_env(python, &script, &script_args, &["--preload"], env)
    };
    for (i, (version, python)) in interpreters().into_iter().enumerate() {
        for (j, mode) in ["main", "thread", "subprocess"].into_iter().enumerate() {
            let small = 400_000 + 1_000 * (3 * i + j) as u64 + 19;
            let big = 800_000 + 1_000 * (3 * i + j) as u64 + 29;
            let what = format!("python {version}, {mode}");
            let (shim, shim_err) = run(&python, mode, (small, big), &[]);
            let hook_only = [("MEMTRAIL_FAULT", "shim-hook-only")];
            let (hook, hook_err) = run(&python, mode, (small, big), &hook_only);
            assert_worker_sites(&shim, &script, (small, big), &what);
            for bytes in [small + 1, big + 1] {
                let frames = python_frames(site(&shim, bytes));
                assert_eq!(frames, python_frames(site(&hook, bytes)), "{what}");
            }
            let processes = if mode == "subprocess" { 2 } else { 1 };
            let says = |v: bool| format!("unwinder: {}", if v { "True" } else { "False" });
            assert_eq!(
                shim_err.matches(&says(true)).count(),
                processes,
                "{what}: {shim_err}"
            );
            assert_eq!(
                hook_err.matches(&says(false)).count(),
                processes,
                "{what}: {hook_err}"
            );
        }
    }
}

/// A function that corrupts its own frame chain while it allocates
/// (CPython 3.11: `PyFrameObject.f_frame` at 24, `_PyInterpreterFrame.previous`
/// at 48): the frame before it is an unmapped address for `COUNT`
/// allocations of `SIZE` bytes, then restored.
const CORRUPT_SCRIPT: &str = "\
import ctypes, sys

def corrupted(n, count):
    frame = ctypes.c_void_p.from_address(id(sys._getframe()) + 24).value
    previous = ctypes.c_uint64.from_address(frame + 48)
    saved, keep = previous.value, [None] * count
    previous.value = 0xdead0000
    for i in range(count):
        keep[i] = bytearray(n)
    previous.value = saved
    return keep

keep = corrupted(int(sys.argv[1]), int(sys.argv[2]))
";
const CORRUPT_LINE: u64 = 9;

/// A function that sets its caller's code object (`_PyInterpreterFrame.f_code`,
/// at 32 in 3.11) to an unmapped address while it allocates, then restores
/// it.
const CORRUPT_CODE_SCRIPT: &str = "\
import ctypes, sys

def inner(n, count, keep):
    caller = ctypes.c_void_p.from_address(id(sys._getframe(1)) + 24).value
    code = ctypes.c_uint64.from_address(caller + 32)
    saved = code.value
    code.value = 0xdead0000
    for i in range(count):
        keep[i] = bytearray(n)
    code.value = saved

def outer(n, count):
    keep = [None] * count
    inner(n, count, keep)
    return keep

keep = outer(int(sys.argv[1]), int(sys.argv[2]))
";
const CORRUPT_CODE_LINE: u64 = 9;

/// Check that a python3.11 whose caller's code object is an unmapped
/// address while it allocates (set through ctypes) lives under the preload
/// shim's walk as under BPF's, and memtrail exits normally: every
/// allocation counted, under the function that allocated, the bad frame
/// unnamed and the walk going on past it (issue 40: the code records' reads
/// survive any pointer).
#[test]
fn python_frames_corrupted_code_program_lives() {
    let python = Path::new("/usr/bin/python3.11");
    if !python.exists() {
        return skip("3.11");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("corrupted_code.py");
    std::fs::write(&script, CORRUPT_CODE_SCRIPT).expect("script written");
    let file = script.to_str().expect("utf-8 path").to_owned();
    for (i, args) in [&["--preload"][..], &[]].into_iter().enumerate() {
        let (size, count) = (370_000 + 1_000 * i as u64 + 41, 50);
        let script_args = [size.to_string(), count.to_string()];
        let (profile, _) = run_script_env(python, &script, &script_args, args, &[]);
        let what = format!("python3.11 {args:?}");
        let site = site_of_many(&profile, size + 1, count, &what);
        let frames = python_frames(site);
        let names: Vec<&str> = frames.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            frames[0],
            ("inner".to_owned(), file.clone(), CORRUPT_CODE_LINE),
            "{what}: {site:#}"
        );
        // BPF copies what it could read of the bad object (nothing), the
        // shim writes no record of it: unnamed either way.
        assert!(
            names.len() == 3 && ["", "<code 0xdead0000>"].contains(&names[1]),
            "{what}: {names:?}"
        );
        assert_eq!(names[2], "<module>", "{what}: {site:#}");
    }
}

/// The one site of `count` allocations of `bytes` bytes each.
fn site_of_many<'a>(profile: &'a Value, bytes: u64, count: u64, what: &str) -> &'a Value {
    let found: Vec<&Value> = support::allocation_sites(profile)
        .into_iter()
        .filter(|s| num(s, "bytes") == bytes * count)
        .collect();
    assert_eq!(found.len(), 1, "{what}: {found:#?}");
    assert_eq!(
        num(found[0], "allocations"),
        count,
        "{what}: {:#}",
        found[0]
    );
    found[0]
}

/// Check that a python3.11 whose frame chain points at unmapped memory
/// while it allocates (set through ctypes) lives under the preload shim's
/// walk as under BPF's, and memtrail exits normally: every allocation
/// counted, under the function that allocated, the walk stopped at the
/// bad pointer (issue 40: the shim's reads of the interpreter's memory
/// survive any pointer).
#[test]
fn python_frames_corrupted_chain_program_lives() {
    let python = Path::new("/usr/bin/python3.11");
    if !python.exists() {
        return skip("3.11");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("corrupted.py");
    std::fs::write(&script, CORRUPT_SCRIPT).expect("script written");
    let file = script.to_str().expect("utf-8 path").to_owned();
    for (i, args) in [&["--preload"][..], &[]].into_iter().enumerate() {
        let (size, count) = (360_000 + 1_000 * i as u64 + 41, 50);
        let script_args = [size.to_string(), count.to_string()];
        // run_script_env: memtrail and the program exited 0.
        let (profile, _) = run_script_env(python, &script, &script_args, args, &[]);
        let what = format!("python3.11 {args:?}");
        let sites: Vec<&Value> = support::allocation_sites(&profile)
            .into_iter()
            .filter(|s| num(s, "bytes") % (size + 1) == 0 && num(s, "bytes") > 0)
            .collect();
        let total: u64 = sites.iter().map(|s| num(s, "allocations")).sum();
        assert_eq!(total, count, "{what}: {sites:#?}");
        for site in sites {
            let frames = python_frames(site);
            assert_eq!(
                frames.first(),
                Some(&("corrupted".to_owned(), file.clone(), CORRUPT_LINE)),
                "{what}: {site:#}"
            );
            assert!(
                frames.iter().all(|f| f.0 != "<module>"),
                "{what}: the walk went past the bad pointer: {site:#}"
            );
        }
    }
}

/// The fake interpreter (tests/fixtures/fake_python.c), built with
/// `defines` (none: a good layout over hostile memory).
fn fake_python(defines: &[&str]) -> PathBuf {
    let mut flags = vec!["-O0", "-g", "-fno-builtin", "-Wall", "-Werror", "-pthread"];
    flags.push("-rdynamic");
    flags.extend(defines);
    support::fixture_with_flags("fake_python", &flags)
}

/// `memtrail run -o PROFILE ARGS -- FAKE N SIZE`: the profile and
/// memtrail's stderr, checked to have exited 0. With a cache of its own: a
/// capture looks at the images of its cache, and the suite's other captures
/// would note a fake interpreter each.
fn run_fake(fake: &Path, n: u64, size: u64, args: &[&str]) -> (Value, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("profile.json");
    let mut argv: Vec<OsString> = vec!["run".into(), "-o".into(), out.clone().into()];
    argv.extend(args.iter().map(Into::into));
    argv.extend([
        "--".into(),
        fake.into(),
        n.to_string().into(),
        size.to_string().into(),
    ]);
    let cache = dir.path().join("cache");
    let cache_env = [("MEMTRAIL_CACHE_DIR", cache.to_str().expect("utf-8 path"))];
    let (_, status, _, stderr) = support::memtrail_env(&argv, b"", &cache_env);
    assert!(status.success(), "{args:?}: {status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    (
        support::read_profile(&out).expect("profile written"),
        stderr,
    )
}

/// The allocations of `size` bytes in `profile`, over every site.
fn allocations_of(profile: &Value, size: u64) -> u64 {
    support::allocation_sites(profile)
        .into_iter()
        .filter(|s| num(s, "bytes") % size == 0 && num(s, "bytes") > 0)
        .map(|s| num(s, "allocations"))
        .sum()
}

/// Check that a fake CPython 3.13 whose memory is hostile (a code object
/// naming unmapped strings and a 2^40-byte table, an unmapped frame before
/// its current one, a datastack chunk past its mapping), or whose
/// `PyGILState_GetThisThreadState` is data, lives under the preload shim and
/// under the probes, and memtrail exits normally with every allocation
/// counted (issue 40).
#[test]
fn python_frames_fake_interpreter_program_lives() {
    for (j, defines) in [&[][..], &["-DSTATE_IS_DATA"]].into_iter().enumerate() {
        let fake = fake_python(defines);
        for (i, args) in [&["--preload"][..], &[]].into_iter().enumerate() {
            let (n, size) = (200, 50_000 + 1_000 * (2 * j + i) as u64 + 43);
            let (profile, stderr) = run_fake(&fake, n, size, args);
            let what = format!("{defines:?} {args:?}");
            assert_eq!(allocations_of(&profile, size), n, "{what}: {stderr}");
        }
    }
}

/// Check that a fake CPython 3.13 whose `_Py_DebugOffsets` puts the code
/// object's first line at offset 4000 is refused at once, with a note
/// naming the image and the field, and its allocations are all counted,
/// without Python frames (issue 40: it made memtrail panic after 30 s).
#[test]
fn python_frames_fake_interpreter_bad_layout_refused() {
    let fake = fake_python(&["-DBAD_OFFSETS"]);
    let name = fake.file_name().and_then(|n| n.to_str()).expect("name");
    for (i, args) in [&["--preload"][..], &[]].into_iter().enumerate() {
        let (n, size) = (200, 60_000 + 1_000 * i as u64 + 47);
        let started = std::time::Instant::now();
        let (profile, stderr) = run_fake(&fake, n, size, args);
        assert!(started.elapsed().as_secs() < 20, "{args:?}: {stderr}");
        assert_eq!(allocations_of(&profile, size), n, "{args:?}: {stderr}");
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("code_firstlineno at offset 4000") && l.contains(name)),
            "{args:?}: no note naming {name}: {stderr}"
        );
        for site in support::allocation_sites(&profile) {
            let frames = site["frames"].as_array().expect("frames");
            assert!(
                frames.iter().all(|f| f["module"] != "[python]"),
                "{args:?}: {site:#}"
            );
        }
    }
}

/// `memtrail report PROFILE ARGS` of `profile` (written to `dir`): stdout.
fn report_of(dir: &Path, profile: &Value, args: &[&str]) -> String {
    let path = dir.join("profile.json");
    std::fs::write(&path, profile.to_string()).expect("profile written");
    let mut argv: Vec<OsString> = vec!["report".into(), path.into()];
    argv.extend(args.iter().map(Into::into));
    let (_, status, stdout, stderr) = support::memtrail(&argv, b"");
    assert!(status.success(), "{args:?}: {stderr}");
    String::from_utf8(stdout).expect("utf-8 report")
}

/// Check that a Python function is its name and its file (issue 41: the
/// `<module>` code of every imported file was one site and one function,
/// `<module> in [python]`): python3.11 running a script that imports three
/// modules of its own, each allocating a bytearray of its size at module
/// level, gives each module's `<module>` its own site (JSON groups with
/// `file`) and its own function (text `<module> in FILE`, JSON `file`),
/// with exactly its bytes (n + 1) in one allocation.
#[test]
fn python_frames_module_code_by_file() {
    let python = Path::new("/usr/bin/python3.11");
    if !python.exists() {
        return skip("3.11");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let modules = [("alpha", 310_001u64), ("beta", 320_002), ("gamma", 330_003)];
    for (name, size) in modules {
        let source = format!("data = bytearray({size})\n");
        std::fs::write(dir.path().join(format!("{name}.py")), source).expect("module written");
    }
    let script = dir.path().join("main.py");
    std::fs::write(&script, "import alpha\nimport beta\nimport gamma\n").expect("script written");
    let profile = run_script(python, &script, &[], &[]);
    let file = |name: &str| format!("{}/{name}.py", dir.path().display());
    let doc: Value = serde_json::from_str(&report_of(dir.path(), &profile, &["--format", "json"]))
        .expect("JSON report");
    let functions_json = report_of(
        dir.path(),
        &profile,
        &["--view", "functions", "--format", "json"],
    );
    let functions: Value = serde_json::from_str(&functions_json).expect("JSON functions");
    let text = report_of(dir.path(), &profile, &["--view", "functions"]);
    for (name, size) in modules {
        let file = file(name);
        let of = |list: &Value| -> Vec<Value> {
            list.as_array()
                .expect("list")
                .iter()
                .filter(|g| g["function"] == "<module>" && g["file"] == file.as_str())
                .cloned()
                .collect()
        };
        let groups = of(&doc["groups"]);
        assert_eq!(groups.len(), 1, "{file}: {:#}", doc["groups"]);
        assert_eq!(num(&groups[0], "bytes"), size + 1, "{:#}", groups[0]);
        assert_eq!(num(&groups[0], "allocations"), 1, "{:#}", groups[0]);
        let found = of(&functions["functions"]);
        assert_eq!(found.len(), 1, "{file}: {functions_json}");
        assert_eq!(found[0]["module"], "[python]");
        for sum in ["self", "inclusive"] {
            assert_eq!(num(&found[0][sum], "bytes"), size + 1, "{:#}", found[0]);
            assert_eq!(num(&found[0][sum], "allocations"), 1, "{:#}", found[0]);
        }
        let row = format!("          1          1  <module> in {file}");
        assert!(text.lines().any(|l| l.ends_with(&row)), "{row}: {text}");
    }
    assert!(!text.contains("<module> in [python]"), "{text}");
}
