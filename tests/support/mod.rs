//! The integration tests' one support module, included by each test binary
//! that uses it: `#[path = "../support/mod.rs"] mod support;` in the area
//! binaries (`tests/<area>/main.rs`, one module per former test file), `mod
//! support;` in the binaries of their own (`tests/<name>.rs`).
//!
//! - Fixtures: the C and C++ programs in `tests/fixtures/` are compiled on
//!   first use, once per test binary, into `CARGO_TARGET_TMPDIR`. A binary's
//!   name carries a hash of its sources and flags, and is renamed into place,
//!   so test binaries running at the same time never see a half-written one.
//! - Runs: [`capture`] runs `memtrail run --output … --events … -- CMD` in a
//!   fresh temporary directory and parses both outputs.
//! - Reading: small accessors over `serde_json::Value` that panic with the
//!   field name and the value, so a failed assertion says what was missing.
//! - [`report`]: the hand-written profile of the `report_*` tests, and
//!   [`ringtest`]: the deterministic ring producer of `ring_consumer` (and
//!   of `perf/ring_bench.rs` and `perf/ring_contention.rs`).
//!
//! Fixtures make no stdio calls (stdio's buffers are malloc'd), so every
//! allocator call a fixture makes is one its test expects; on glibc 2.36 a
//! stdio-free C program makes no allocator call of its own (see
//! `track_baseline_makes_no_allocator_call`).
#![allow(
    dead_code,
    reason = "each test binary uses a different subset of these helpers"
)]

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;

use serde_json::Value;
use tempfile::TempDir;

pub mod report;
pub mod ringtest;

/// The memtrail binary under test.
pub const MEMTRAIL: &str = env!("CARGO_BIN_EXE_memtrail");

/// Whether the captures run with the preload shim (`MEMTRAIL_PRELOAD` set
/// and not false, as `memtrail run` reads it: scripts/test.sh's preload
/// stage). A process with the shim differs from one under the probes in
/// what glibc does inside itself, where the shim sees no call: frees glibc
/// makes internally (a thread's tcache at its exit) are not seen, and the
/// shim's thread-local flag is one more TLS module (a thread's DTV one
/// entry longer).
pub fn preload() -> bool {
    std::env::var("MEMTRAIL_PRELOAD").is_ok_and(|v| {
        !matches!(
            v.to_ascii_lowercase().as_str(),
            "" | "0" | "n" | "no" | "f" | "false" | "off"
        )
    })
}

/// TLS modules the preload shim adds to a process that walks its stacks
/// (each a thread's DTV entry longer): none under the probes, the shim's
/// own, and libunwind's where it takes the ring path (libunwind installed,
/// the ring path not turned off by `MEMTRAIL_FAULT=shim-hook-only`).
pub fn shim_tls_modules() -> u64 {
    if !preload() {
        return 0;
    }
    shim_tls_modules_preloaded()
}

/// [`shim_tls_modules`] of a capture run with `--preload`, whatever
/// `MEMTRAIL_PRELOAD` says.
pub fn shim_tls_modules_preloaded() -> u64 {
    let hook_only = std::env::var("MEMTRAIL_FAULT").is_ok_and(|f| f.contains("shim-hook-only"));
    1 + u64::from(libunwind_installed() && !hook_only)
}

/// Whether the preload shim can take its ring path here: libunwind, which
/// it loads, is installed (scripts/test.sh installs it).
pub fn libunwind_installed() -> bool {
    [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/lib64",
    ]
    .iter()
    .any(|d| std::path::Path::new(d).join("libunwind.so.8").exists())
}

/// The memtrail binary the helpers run: `$MEMTRAIL_BIN` when set (to run a
/// test against another build, e.g. the commit before a fix, and see it
/// fail), else [`MEMTRAIL`].
pub fn memtrail_bin() -> OsString {
    std::env::var_os("MEMTRAIL_BIN").unwrap_or_else(|| MEMTRAIL.into())
}

/// Allocator event kinds of the event stream (everything but syscalls and
/// process events).
pub const ALLOC_KINDS: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "aligned_alloc",
    "memalign",
    "posix_memalign",
    "valloc",
    "pvalloc",
    "free",
];

const C_FLAGS: &[&str] = &[
    "-O0",
    "-g",
    "-fno-builtin",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pthread",
];

fn fixtures_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Compiled fixtures of this test binary, by name.
static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// Builds `tests/fixtures/<name>.c` (or `.cc`) once and returns the absolute,
/// canonical path of the executable.
pub fn fixture(name: &str) -> PathBuf {
    fixture_with_flags(name, C_FLAGS)
}

/// Like [`fixture`], compiled with `flags` instead of the usual ones (e.g.
/// optimised, without frame pointers).
pub fn fixture_with_flags(name: &str, flags: &[&str]) -> PathBuf {
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    let key = format!("{name} {}", flags.join(" "));
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let path = compile(name, flags);
    built.insert(key, path.clone());
    path
}

fn compile(name: &str, flags: &[&str]) -> PathBuf {
    let src_dir = fixtures_src();
    let (src, compiler) = if src_dir.join(format!("{name}.c")).exists() {
        (src_dir.join(format!("{name}.c")), "cc")
    } else {
        (src_dir.join(format!("{name}.cc")), "c++")
    };
    let source = fs::read(&src).unwrap_or_else(|e| panic!("read {}: {e}", src.display()));
    let header = fs::read(src_dir.join("fixture.h")).expect("read tests/fixtures/fixture.h");
    let mut hasher = DefaultHasher::new();
    (compiler, flags, &source, &header).hash(&mut hasher);

    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("memtrail-fixtures");
    fs::create_dir_all(&out_dir).expect("create fixture directory");
    let out_dir = out_dir
        .canonicalize()
        .expect("canonicalize fixture directory");
    let exe = out_dir.join(format!("{name}-{:016x}", hasher.finish()));
    if exe.exists() {
        return exe;
    }
    let tmp = out_dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let output = Command::new(compiler)
        .args(flags)
        .arg("-I")
        .arg(&src_dir)
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        output.status.success(),
        "{compiler} {} failed: {}",
        src.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    fs::rename(&tmp, &exe).expect("rename fixture into place");
    exe
}

/// Builds a command line: a fixture and its arguments.
pub fn cmd(name: &str, args: &[&OsStr]) -> Vec<OsString> {
    let mut v = vec![fixture(name).into_os_string()];
    v.extend(args.iter().map(|a| a.to_os_string()));
    v
}

/// What one `memtrail run` did.
pub struct Capture {
    /// memtrail's own process id.
    pub memtrail_pid: u32,
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
    /// The `--output` profile, if memtrail wrote one.
    pub profile: Option<Value>,
    /// The `--events` stream, if memtrail wrote one, one object a line.
    pub events: Option<Vec<Value>>,
    /// Where the outputs were written; removed on drop.
    pub dir: TempDir,
}

impl Capture {
    /// memtrail's exit code; panics if it was killed by a signal.
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("memtrail killed: {:?}\n{}", self.status, self.stderr))
    }

    /// Asserts memtrail exited with `code` and returns `self`.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.status.code(),
            Some(code),
            "memtrail exit status; stderr:\n{}",
            self.stderr
        );
        self
    }

    pub fn profile(&self) -> &Value {
        self.profile
            .as_ref()
            .unwrap_or_else(|| panic!("no profile written; stderr:\n{}", self.stderr))
    }

    pub fn events(&self) -> &[Value] {
        self.events
            .as_deref()
            .unwrap_or_else(|| panic!("no event stream written; stderr:\n{}", self.stderr))
    }

    /// Names of the files left in the output directory.
    pub fn files(&self) -> Vec<String> {
        dir_entries(self.dir.path())
    }
}

/// Sorted names of the entries of `dir`.
pub fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read output directory")
        .map(|e| {
            e.expect("read entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// How long a test lets one memtrail run go before it kills it: far above
/// any run of the suite (the longest take seconds), so it only turns a hang
/// into a failing test instead of a CI job that runs out of time.
const HANG_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Kills a memtrail that hangs (SIGKILL after [`HANG_LIMIT`]) unless
/// disarmed first.
pub struct Watchdog(std::sync::mpsc::Sender<()>);

impl Watchdog {
    pub fn new(pid: u32) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if rx.recv_timeout(HANG_LIMIT) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                // SAFETY: kill(2) on the child we have not reaped yet.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        });
        Self(tx)
    }

    pub fn disarm(self) {
        let _ = self.0.send(());
    }
}

/// Runs `memtrail ARGS` with `stdin` as its standard input and collects
/// everything it printed. Returns memtrail's pid, exit status, stdout and
/// stderr.
pub fn memtrail(args: &[OsString], stdin: &[u8]) -> (u32, ExitStatus, Vec<u8>, String) {
    memtrail_env(args, stdin, &[])
}

/// [`memtrail`] with `env` added to its environment.
pub fn memtrail_env(
    args: &[OsString],
    stdin: &[u8],
    env: &[(&str, &str)],
) -> (u32, ExitStatus, Vec<u8>, String) {
    // A working directory of its own: a run without --output keeps its
    // profile there (memtrail.CMD.PID.json), not in the checkout.
    let cwd = tempfile::tempdir().expect("create a working directory");
    let mut child = Command::new(memtrail_bin())
        .current_dir(cwd.path())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memtrail");
    let pid = child.id();
    let mut input = child.stdin.take().expect("memtrail stdin");
    // The command may exit without reading its input: a broken pipe is fine.
    let _ = input.write_all(stdin);
    drop(input);
    let watchdog = Watchdog::new(pid);
    let output = child.wait_with_output().expect("wait for memtrail");
    watchdog.disarm();
    (
        pid,
        output.status,
        output.stdout,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `memtrail run --output DIR/profile.json --events DIR/events.jsonl
/// -- CMD` with empty stdin.
pub fn capture(cmd: &[OsString]) -> Capture {
    capture_with(cmd, b"")
}

/// [`capture`] with `stdin` fed to memtrail (and so to the command).
pub fn capture_with(cmd: &[OsString], stdin: &[u8]) -> Capture {
    capture_env(cmd, stdin, &[])
}

/// [`capture_with`] with `env` added to memtrail's environment.
pub fn capture_env(cmd: &[OsString], stdin: &[u8], env: &[(&str, &str)]) -> Capture {
    capture_flags(&[], cmd, stdin, env)
}

/// [`capture_env`] with `flags` added to `memtrail run`'s options.
pub fn capture_flags(
    flags: &[&str],
    cmd: &[OsString],
    stdin: &[u8],
    env: &[(&str, &str)],
) -> Capture {
    let dir = tempfile::tempdir().expect("create output directory");
    let profile_path = dir.path().join("profile.json");
    let events_path = dir.path().join("events.jsonl");
    let mut args: Vec<OsString> = vec![
        "run".into(),
        "--output".into(),
        profile_path.clone().into(),
        "--events".into(),
        events_path.clone().into(),
    ];
    args.extend(flags.iter().map(OsString::from));
    args.push("--".into());
    args.extend(cmd.iter().cloned());
    let (memtrail_pid, status, stdout, stderr) = memtrail_env(&args, stdin, env);
    let profile = read_profile(&profile_path);
    let events = read_events(&events_path);
    Capture {
        memtrail_pid,
        status,
        stdout,
        stderr,
        profile,
        events,
        dir,
    }
}

/// The profile at `path`, if one was written, its `stacks` in version 2's
/// form ([`expand_stacks`]).
pub fn read_profile(path: &Path) -> Option<Value> {
    let text = fs::read_to_string(path).ok()?;
    let mut doc: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("profile is not JSON ({e}):\n{text}"));
    expand_stacks(&mut doc);
    Some(doc)
}

/// The metrics of a stack, which version 3 writes only when not 0.
const STACK_METRICS: [&str; 14] = [
    "allocations",
    "bytes",
    "live_bytes_at_peak",
    "live_allocations_at_peak",
    "live_bytes_at_exit",
    "live_allocations_at_exit",
    "temporary_allocations",
    "mmaps",
    "mapped_bytes",
    "mapped_bytes_at_peak",
    "mapped_bytes_at_exit",
    "reserved_bytes",
    "reserved_bytes_at_exit",
    "brk_bytes",
];

/// Writes a version 3 profile's compact `stacks` (docs/profile.md,
/// "Allocation stacks") out as version 2's list, which tests read: each
/// stack with its frames whole, its `exe` a string and every metric there
/// (those [`STACK_METRICS`] and any other a stack of the profile has, 0
/// where absent). A version 2 document is left as it is. Panics on an id
/// outside its table.
pub fn expand_stacks(doc: &mut Value) {
    let Some(tables) = doc.get("stacks").filter(|s| s.is_object()).cloned() else {
        return;
    };
    let row = |table: &str, id: &Value| -> Value {
        match id.as_u64() {
            None => Value::Null,
            Some(i) => tables[table]
                .get(i as usize)
                .cloned()
                .unwrap_or_else(|| panic!("{table} {i} is not in the table")),
        }
    };
    let frames: Vec<Value> = tables["frames"]
        .as_array()
        .expect("frames table")
        .iter()
        .map(|f| {
            let (module, function) = (
                row("modules", &f["module"]),
                row("functions", &f["function"]),
            );
            let mut frame = serde_json::json!({
                "addr": f["addr"], "module": row("strings", &module["path"]),
                "function": row("strings", &function["name"]),
                "file": row("strings", &function["file"]), "line": f["line"],
                "inlined": f["inlined"], "build_id": row("strings", &module["build_id"]),
                "offset": f["offset"],
            });
            // Written only when true (issue 41).
            if f["fp_step"] == true {
                frame["fp_step"] = Value::Bool(true);
            }
            frame
        })
        .collect();
    let entries = tables["entries"].as_array().expect("entries").clone();
    let mut metrics: Vec<String> = STACK_METRICS.iter().map(|m| m.to_string()).collect();
    for e in &entries {
        for (k, v) in e.as_object().expect("an entry") {
            if v.is_u64() && !metrics.contains(k) && !["pid", "exe"].contains(&k.as_str()) {
                metrics.push(k.clone());
            }
        }
    }
    let stacks = entries
        .into_iter()
        .map(|mut e| {
            e["exe"] = row("strings", &e["exe"]);
            let ids = e["frames"].as_array().expect("frame ids").clone();
            e["frames"] = ids.iter().map(|id| row_of(&frames, id)).collect();
            let o = e.as_object_mut().expect("an entry");
            for m in &metrics {
                o.entry(m.clone()).or_insert(Value::from(0));
            }
            e
        })
        .collect();
    doc["stacks"] = Value::Array(stacks);
}

fn row_of(frames: &[Value], id: &Value) -> Value {
    let i = id.as_u64().expect("a frame id") as usize;
    frames
        .get(i)
        .cloned()
        .unwrap_or_else(|| panic!("frame {i} is not in the table"))
}

/// The events at `path`, one JSON object a line, if the file was written.
pub fn read_events(path: &Path) -> Option<Vec<Value>> {
    let text = fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .enumerate()
            .map(|(i, line)| {
                let event: Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("event line {} is not JSON ({e}): {line}", i + 1));
                for key in ["ts_ns", "pid", "tid"] {
                    num(&event, key);
                }
                kind(&event);
                event
            })
            .collect(),
    )
}

/// `v[key]` as an unsigned integer.
pub fn num(v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no unsigned integer `{key}` in {v}"))
}

/// `v[key]` as a 64-bit id, which profiles and events write as a decimal
/// string (issue 16).
pub fn id(v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no decimal string id `{key}` in {v}"))
}

/// `v[key]` as a signed integer.
pub fn int(v: &Value, key: &str) -> i64 {
    v.get(key)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("no integer `{key}` in {v}"))
}

/// `v[key]` as a string.
pub fn string<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string `{key}` in {v}"))
}

/// `v[key]`, which must exist.
pub fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key)
        .unwrap_or_else(|| panic!("no field `{key}` in {v}"))
}

/// An event's `kind`.
pub fn kind(e: &Value) -> &str {
    string(e, "kind")
}

/// An event's `pid`.
pub fn pid(e: &Value) -> u32 {
    u32::try_from(num(e, "pid")).expect("pid fits u32")
}

/// An event's `tid`.
pub fn tid(e: &Value) -> u32 {
    u32::try_from(num(e, "tid")).expect("tid fits u32")
}

/// The events of process `p`, in stream order.
pub fn of_pid(events: &[Value], p: u32) -> Vec<&Value> {
    events.iter().filter(|e| pid(e) == p).collect()
}

/// The allocator events (malloc & co and free) of process `p`, in stream
/// order.
pub fn allocator_events(events: &[Value], p: u32) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| pid(e) == p && ALLOC_KINDS.contains(&kind(e)))
        .collect()
}

/// The events of `kind` `k` with `size` `size`, any process.
pub fn sized<'a>(events: &'a [Value], k: &str, size: u64) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| kind(e) == k && e.get("size").and_then(Value::as_u64) == Some(size))
        .collect()
}

/// The pid of the command: the one process of the stream no fork event
/// created.
pub fn stream_root(events: &[Value]) -> u32 {
    let children: Vec<u32> = events
        .iter()
        .filter(|e| kind(e) == "fork")
        .map(|e| u32::try_from(num(e, "child_pid")).expect("pid fits u32"))
        .collect();
    let mut roots: Vec<u32> = events
        .iter()
        .map(pid)
        .filter(|p| !children.contains(p))
        .collect();
    roots.sort_unstable();
    roots.dedup();
    assert_eq!(roots.len(), 1, "processes no fork created: {roots:?}");
    roots[0]
}

/// The profile's `processes` entries.
pub fn processes(profile: &Value) -> &[Value] {
    field(profile, "processes")
        .as_array()
        .unwrap_or_else(|| panic!("`processes` is not an array: {profile}"))
}

/// The profile's entry for process `p`.
pub fn process(profile: &Value, p: u32) -> &Value {
    let found: Vec<&Value> = processes(profile)
        .iter()
        .filter(|e| num(e, "pid") == u64::from(p))
        .collect();
    assert_eq!(found.len(), 1, "entries for pid {p} in {profile}");
    found[0]
}

/// The profile's entry for the command: the one process whose parent is not
/// in the profile.
pub fn root_process(profile: &Value) -> &Value {
    let procs = processes(profile);
    let pids: Vec<u64> = procs.iter().map(|e| num(e, "pid")).collect();
    let roots: Vec<&Value> = procs
        .iter()
        .filter(|e| !pids.contains(&num(e, "ppid")))
        .collect();
    assert_eq!(
        roots.len(),
        1,
        "processes whose parent is not tracked: {procs:?}"
    );
    roots[0]
}

/// Expected allocator counters of a `totals` object or a process entry.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub allocations: u64,
    pub frees: u64,
    pub reallocs: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    pub peak_live_bytes: u64,
    pub live_bytes_at_exit: u64,
    pub live_allocations_at_exit: u64,
    pub unmatched_frees: u64,
}

impl Counters {
    /// Reads the counters of a `totals` object or a process entry.
    pub fn of(v: &Value) -> Self {
        Self {
            allocations: num(v, "allocations"),
            frees: num(v, "frees"),
            reallocs: num(v, "reallocs"),
            allocated_bytes: num(v, "allocated_bytes"),
            freed_bytes: num(v, "freed_bytes"),
            peak_live_bytes: num(v, "peak_live_bytes"),
            live_bytes_at_exit: num(v, "live_bytes_at_exit"),
            live_allocations_at_exit: num(v, "live_allocations_at_exit"),
            unmatched_frees: num(v, "unmatched_frees"),
        }
    }

    /// The counters of one block of `bytes` allocated and left live at
    /// exit, nothing else.
    pub fn one_leak(bytes: u64) -> Self {
        Self {
            allocations: 1,
            allocated_bytes: bytes,
            peak_live_bytes: bytes,
            live_bytes_at_exit: bytes,
            live_allocations_at_exit: 1,
            ..Self::default()
        }
    }
}

/// Expected counters of a `mappings` object.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Mappings {
    pub mmaps: u64,
    pub munmaps: u64,
    pub mapped_bytes: u64,
    pub unmapped_bytes: u64,
    pub peak_mapped_bytes: u64,
    pub mapped_bytes_at_exit: u64,
    pub brk_peak_bytes: u64,
    pub brk_bytes_at_exit: u64,
}

impl Mappings {
    /// Reads a `mappings` object.
    pub fn of(v: &Value) -> Self {
        Self {
            mmaps: num(v, "mmaps"),
            munmaps: num(v, "munmaps"),
            mapped_bytes: num(v, "mapped_bytes"),
            unmapped_bytes: num(v, "unmapped_bytes"),
            peak_mapped_bytes: num(v, "peak_mapped_bytes"),
            mapped_bytes_at_exit: num(v, "mapped_bytes_at_exit"),
            brk_peak_bytes: num(v, "brk_peak_bytes"),
            brk_bytes_at_exit: num(v, "brk_bytes_at_exit"),
        }
    }
}

/// A path as the JSON string memtrail writes for it.
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("fixture paths are UTF-8")
}

/// Waits for `child` up to `limit`; past it the child is killed and `None`
/// returned. A hang detector for tests of deadlocks (the limit is far above
/// any normal run), not a timing assertion.
pub fn wait_or_kill(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> Option<ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return Some(status);
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The cgroup v2 mount point, from /proc/mounts.
pub fn cgroup2_mount() -> PathBuf {
    let mounts = fs::read_to_string("/proc/mounts").expect("read /proc/mounts");
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .expect("a cgroup2 mount")
}

/// Whether the cgroup v2 of process `pid` reports itself frozen (how a
/// pressure pause holds the tree; a process there is not in state T).
pub fn cgroup_frozen(pid: u32) -> bool {
    let own = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return false;
    };
    let events = cgroup2_mount()
        .join(path.trim_start_matches('/'))
        .join("cgroup.events");
    fs::read_to_string(events).is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
}

/// A child process killed and reaped when dropped, so a test that fails
/// half-way leaves no memtrail running (a wedged capture with `inf` would
/// run forever).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU hogs beside a stress test (`while :; do :; done` shells, each in a
/// process of its own), killed when dropped: the loaded machine a test
/// must also pass on.
pub struct CpuHogs(Vec<KillOnDrop>);

impl CpuHogs {
    pub fn start(n: usize) -> Self {
        Self(
            (0..n)
                .map(|_| {
                    KillOnDrop(
                        Command::new("/bin/sh")
                            .args(["-c", "while :; do :; done"])
                            .stdin(Stdio::null())
                            .spawn()
                            .expect("start a CPU hog"),
                    )
                })
                .collect(),
        )
    }
}

/// Builds a fixture that includes `include/memtrail_usdt.h` (its contents
/// are part of the build's key), with `extra` flags (e.g. `-shared -fPIC`
/// for a library to dlopen).
pub fn usdt_fixture(name: &str, extra: &[&str]) -> PathBuf {
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let header = fs::read(include.join("memtrail_usdt.h")).expect("read memtrail_usdt.h");
    let mut hasher = DefaultHasher::new();
    header.hash(&mut hasher);
    let include_flag = format!("-I{}", include.display());
    let key_flag = format!("-DMT_USDT_HEADER_KEY={:x}", hasher.finish());
    let mut flags: Vec<&str> = C_FLAGS.to_vec();
    flags.extend([include_flag.as_str(), key_flag.as_str()]);
    flags.extend(extra);
    fixture_with_flags(name, &flags)
}

/// How fixtures without frame pointers are built: optimised, as distros
/// build most programs.
pub const NO_FP: &[&str] = &[
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-fno-builtin",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pthread",
];

/// The allocation sites of a profile: the stacks that allocated (the sites
/// of mappings made outside allocators, the direct-syscall one included,
/// allocate nothing; tests/track/track_mapping_sites.rs checks those).
pub fn allocation_sites(profile: &Value) -> Vec<&Value> {
    profile["stacks"]
        .as_array()
        .expect("stacks array")
        .iter()
        .filter(|s| s["allocations"].as_u64() != Some(0))
        .collect()
}

/// How many bytes of libc's executable mapping in process `pid` differ
/// from the file (each probe site is one int3 where a probe is).
pub fn patched_libc_bytes(pid: u32) -> usize {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let mut mem = fs::File::open(format!("/proc/{pid}/mem")).expect("mem");
    let mut patched = 0;
    let mut seen = false;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || fields[1] != "r-xp" || !fields[5].ends_with("/libc.so.6") {
            continue;
        }
        seen = true;
        let (start, end) = fields[0].split_once('-').expect("range");
        let start = u64::from_str_radix(start, 16).expect("start");
        let end = u64::from_str_radix(end, 16).expect("end");
        let offset = u64::from_str_radix(fields[2], 16).expect("offset");
        let mut in_memory = vec![0u8; (end - start) as usize];
        std::io::Seek::seek(&mut mem, std::io::SeekFrom::Start(start)).expect("seek mem");
        std::io::Read::read_exact(&mut mem, &mut in_memory).expect("read mem");
        let mut file = fs::File::open(fields[5]).expect("libc");
        let mut on_disk = vec![0u8; in_memory.len()];
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset)).expect("seek libc");
        let n = std::io::Read::read(&mut file, &mut on_disk).expect("read libc");
        patched += in_memory[..n]
            .iter()
            .zip(&on_disk[..n])
            .filter(|(a, b)| a != b)
            .count();
    }
    assert!(seen, "process {pid} maps no libc code");
    patched
}

/// The pipelines a failed pressure episode names as late ("…: the events,
/// mappings pipeline did not drain…"), or `None` when it names none. The
/// wedged pipeline must be among them; on a starved machine another one may
/// be late too, and is named with it: what is late is said, never left out.
pub fn late_pipelines(stderr: &str) -> Option<Vec<&str>> {
    stderr
        .split_once(" pipeline did not drain")
        .and_then(|(before, _)| before.rsplit_once(": the "))
        .map(|(_, names)| names.split(", ").collect())
}

/// The source of fixture `name` (`tests/fixtures/NAME`).
pub fn fixture_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The 1-based line of `marker` in the source of fixture `file`.
pub fn line_of(file: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(fixture_source(file)).unwrap();
    let idx = text
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker} not in {file}"));
    idx as u64 + 1
}

/// Copies the executable `built` to `exe` without its unwind tables
/// (`.eh_frame`, `.eh_frame_hdr`), as a stripped-down build would ship.
pub fn strip_unwind_tables(built: &Path, exe: &Path) {
    let status = std::process::Command::new("objcopy")
        .args([
            "--remove-section",
            ".eh_frame",
            "--remove-section",
            ".eh_frame_hdr",
        ])
        .arg(built)
        .arg(exe)
        .status()
        .expect("objcopy runs");
    assert!(status.success(), "objcopy {}", built.display());
}

/// The thread-churn fixture's runs (`tests/fixtures/churn.c`, issue 40):
/// threads in waves of 8 and 32 (600 each run) and 300 at once, as
/// `(wave, threads)`.
pub const CHURN_WAVES: [(u64, u64); 3] = [(8, 600), (32, 600), (300, 300)];
/// The churn fixture's malloc/free pairs per thread, and its block size.
pub const CHURN_PAIRS: u64 = 1000;
pub const CHURN_SIZE: u64 = 4133;

/// What a capture says when the kernel's return probes handed allocator
/// calls back at a stack other than their caller's (issue 40).
pub const RETURNS_ELSEWHERE: &str = "the kernel's return probes handed";

/// Checks a churn capture's `totals` (the fixture's process alone): its
/// `threads * CHURN_PAIRS` pairs exactly, besides glibc's own blocks, which
/// are `dtv` bytes each (pthread_create's DTV calloc for a thread stack it
/// maps, and its free when it unmaps a cached stack: how many depends on
/// glibc's stack cache, so they are counted from the totals, and the bytes
/// must then add up to the last byte) and `tcache_frees` unmatched frees per
/// thread (its tcache at its exit).
pub fn check_churn_totals(totals: &Value, threads: u64, dtv: u64, tcache_frees: u64) {
    let pairs = threads * CHURN_PAIRS;
    let allocations = num(totals, "allocations");
    let frees = num(totals, "frees");
    let what = || format!("{threads} threads: {totals:#}");
    let dtvs = allocations
        .checked_sub(pairs)
        .unwrap_or_else(|| panic!("fewer allocations than pairs, {}", what()));
    let dtvs_freed = frees
        .checked_sub(pairs)
        .unwrap_or_else(|| panic!("fewer frees than pairs, {}", what()));
    assert!(
        (1..=threads).contains(&dtvs) && dtvs_freed <= dtvs,
        "glibc's DTVs: {dtvs} made, {dtvs_freed} freed, {}",
        what()
    );
    assert_eq!(
        num(totals, "allocated_bytes"),
        pairs * CHURN_SIZE + dtvs * dtv,
        "allocated bytes, {}",
        what()
    );
    assert_eq!(
        num(totals, "freed_bytes"),
        pairs * CHURN_SIZE + dtvs_freed * dtv,
        "freed bytes, {}",
        what()
    );
    assert_eq!(num(totals, "reallocs"), 0, "{}", what());
    assert_eq!(
        num(totals, "live_allocations_at_exit"),
        dtvs - dtvs_freed,
        "live at exit, {}",
        what()
    );
    assert_eq!(
        num(totals, "unmatched_frees"),
        threads * tcache_frees,
        "unmatched frees, {}",
        what()
    );
}
