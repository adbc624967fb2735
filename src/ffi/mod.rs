//! The C ABI: `memtrail_*` functions over a [`Session`], described by the
//! generated header `include/memtrail.h` (cbindgen; `tests/ffi_header.rs`
//! generates it, and fails when the committed one is stale).
//!
//! The conventions a C user relies on (errors, size-first structs,
//! handles, ownership, threading, fork) are written once, in the header's
//! preamble (`tests/ffi_header.rs`); each function's comment adds its own.
//! Inside:
//! - `errors`: the codes, the thread's last error message, panics caught.
//! - `handles`: handles are numbers given out once, looked up in a
//!   registry; a session belongs to the process that made it.
//! - `sized`: size-first structs (`unsafe trait SizeFirst`), read and
//!   written only in the part both sides know, a newer caller's set tail
//!   refused.
//! - The session's state: a `RwLock` that snapshots, regions and the
//!   blocking part of `memtrail_wait` share; finishing it takes it alone.

#![expect(
    non_camel_case_types,
    reason = "C names: the header is the API, in C's conventions"
)]

mod errors;
mod handles;
mod sized;

use std::ffi::{CStr, OsStr, c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::sync::RwLock;

use crate::pressure::PressureTimeout;
use crate::profile::regions::RegionCounts;
use crate::session::CaptureError;
use crate::session::{Session, SessionOptions, Target, Totals};
use errors::{fail, from_error, from_report_error, guard};
use sized::{read_sized, size_first, write_sized};

/// Error codes. 0 is success.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum memtrail_error {
    MEMTRAIL_OK = 0,
    /// A required pointer was NULL.
    MEMTRAIL_E_NULL = 1,
    /// An argument or option is invalid (a struct size too small, a value
    /// out of range, a name that is not UTF-8).
    MEMTRAIL_E_INVALID = 2,
    /// The handle is not a live session of the calling process: freed
    /// already, never one, or made by another process (a child of `fork()`
    /// gets this for every call on its parent's sessions,
    /// `memtrail_session_free` included; the parent's session is
    /// unaffected).
    MEMTRAIL_E_HANDLE = 3,
    /// The call does not fit the session's state (no region open on this
    /// thread, nothing to wait for, the command's process reaped already by
    /// the caller, the session already finished).
    MEMTRAIL_E_STATE = 4,
    MEMTRAIL_E_NOT_FOUND = 5,
    MEMTRAIL_E_NOT_EXECUTABLE = 6,
    /// An output cannot be written.
    MEMTRAIL_E_OUTPUT = 7,
    /// Missing privileges or kernel feature.
    MEMTRAIL_E_UNSUPPORTED = 8,
    /// Another tracer holds a conflicting uprobe.
    MEMTRAIL_E_CONFLICT = 9,
    /// An image the tree loaded could not be probed.
    MEMTRAIL_E_ATTACH = 10,
    /// Events were lost: the numbers would be wrong.
    MEMTRAIL_E_LOST = 11,
    /// A pressure pause did not recover in time.
    MEMTRAIL_E_PRESSURE = 12,
    /// Anything else (memtrail itself failed, or panicked).
    MEMTRAIL_E_INTERNAL = 13,
    /// The caller's struct is larger than this library's (built against a
    /// newer header) and sets a field past this library's end: something
    /// this library does not have was asked for. Set the field to 0 to do
    /// without it, or run with a newer library.
    MEMTRAIL_E_UNKNOWN_FIELD = 14,
}

use memtrail_error::*;

/// Options of a session. Fill with `memtrail_options_init(&opts,
/// sizeof opts)` first (or `memtrail_options_default`), then change what
/// differs.
///
/// The struct grows at its end, never changes what is there, and a field
/// added later means "as before" when 0: a caller built against an older
/// header passes its smaller `size` and gets the defaults for the fields it
/// does not know; one built against a newer header, run with an older
/// library, is refused (`MEMTRAIL_E_UNKNOWN_FIELD`) if it sets a field this
/// library does not know.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct memtrail_options {
    /// `sizeof(struct memtrail_options)` as the caller knows it.
    pub size: usize,
    /// Events ring, in bytes: a power of two, at least a page.
    pub ring_size: u64,
    /// Stack ring, in bytes: a power of two, at least a page.
    pub stack_ring_size: u64,
    /// Frames per allocation stack, 0 (none) to 128.
    pub stack_depth: u32,
    /// Ring fill, in percent (1 to 99), past which the tree is paused.
    pub watermark_percent: u32,
    /// 0: no pausing (loss fails the session); UINT64_MAX: pause as long
    /// as it takes; otherwise the longest pause in nanoseconds (1 ms to a
    /// day). Must be 0 to track the calling process.
    pub pressure_timeout_ns: u64,
    /// Where the allocator probes go: a `memtrail_probes` (`memtrail run
    /// --probes`). Added after the first version, whose options end before
    /// it: a caller that knows only those gets the defaults.
    pub probes: u32,
    /// The events rings: a `memtrail_event_rings` (`--event-rings`).
    pub event_rings: u32,
}

/// The first version of `memtrail_options`: the smallest `size` taken.
const OPTIONS_V1: usize = std::mem::offset_of!(memtrail_options, probes);

/// Where a session's allocator probes go (`memtrail_options.probes`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum memtrail_probes {
    /// Per process for a running process (the calling one, or a pid) where
    /// the kernel allows (Linux 6.13), system-wide for a spawned command.
    MEMTRAIL_PROBES_AUTO = 0,
    /// Only in the tracked processes; `MEMTRAIL_E_UNSUPPORTED` on a kernel
    /// without it.
    MEMTRAIL_PROBES_PER_PROCESS = 1,
    /// In every process that maps a probed file.
    MEMTRAIL_PROBES_SYSTEM_WIDE = 2,
}

/// How many events rings (`memtrail_options.event_rings`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum memtrail_event_rings {
    /// Per CPU on machines with 4 CPUs or more, else one.
    MEMTRAIL_EVENT_RINGS_AUTO = 0,
    /// One ring every CPU reserves from.
    MEMTRAIL_EVENT_RINGS_SHARED = 1,
    /// One ring per CPU (`ring_size` is split between them).
    MEMTRAIL_EVENT_RINGS_PER_CPU = 2,
}

/// Heap totals (see `memtrail_snapshot`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct memtrail_totals {
    /// `sizeof(struct memtrail_totals)` as the caller knows it.
    pub size: usize,
    pub allocations: u64,
    pub frees: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    pub live_allocations: u64,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
}

/// Counts of a region (see `memtrail_region_end`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct memtrail_region_counts {
    /// `sizeof(struct memtrail_region_counts)` as the caller knows it.
    pub size: usize,
    pub allocations: u64,
    pub frees: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    /// Most bytes of blocks allocated in the region live at once.
    pub peak_live_bytes: u64,
    /// Blocks allocated in the region and still live at its end.
    pub live_allocations: u64,
    pub live_bytes: u64,
}

size_first!(
    memtrail_options {
        size: usize,
        ring_size: u64,
        stack_ring_size: u64,
        stack_depth: u32,
        watermark_percent: u32,
        pressure_timeout_ns: u64,
        probes: u32,
        event_rings: u32,
    },
    first_version: OPTIONS_V1,
    empty: defaults()
);
size_first!(
    memtrail_totals {
        size: usize,
        allocations: u64,
        frees: u64,
        allocated_bytes: u64,
        freed_bytes: u64,
        live_allocations: u64,
        live_bytes: u64,
        peak_live_bytes: u64,
    },
    first_version: std::mem::size_of::<memtrail_totals>(),
    empty: memtrail_totals::default()
);
size_first!(
    memtrail_region_counts {
        size: usize,
        allocations: u64,
        frees: u64,
        allocated_bytes: u64,
        freed_bytes: u64,
        peak_live_bytes: u64,
        live_allocations: u64,
        live_bytes: u64,
    },
    first_version: std::mem::size_of::<memtrail_region_counts>(),
    empty: memtrail_region_counts::default()
);

/// A session handle (opaque: never dereferenced, by C nor by this library;
/// see the `handles` module).
pub struct memtrail_session {
    /// The process that made it, the only one that may use it.
    pid: u32,
    /// Read-locked by the calls that share the session (snapshots,
    /// regions, `memtrail_wait` while the process runs), write-locked by
    /// those that change its state (`memtrail_wait` reaping,
    /// `memtrail_write_profile`).
    state: RwLock<State>,
}

/// Where a session is in its life.
enum State {
    Running(Box<Session>),
    /// Finished by `memtrail_write_profile`: its profile, kept so that a
    /// failed write can be retried (and the profile written elsewhere).
    Finished(Box<crate::profile::Profile>),
    /// Finishing failed: nothing is left but to free it.
    Failed,
}

impl State {
    /// The running session, or `MEMTRAIL_E_STATE`.
    fn running(&self) -> Result<&Session, memtrail_error> {
        match self {
            State::Running(session) => Ok(session),
            State::Finished(_) | State::Failed => {
                Err(fail(MEMTRAIL_E_STATE, "the session has finished"))
            }
        }
    }
}

/// Runs `f` on the running session behind `session`, shared with the
/// other threads' shared calls.
fn with_running<T>(
    session: *const memtrail_session,
    f: impl FnOnce(&Session) -> Result<T, memtrail_error>,
) -> Result<T, memtrail_error> {
    let h = handles::get(session)?;
    let state = h.state.read().unwrap_or_else(|e| e.into_inner());
    f(state.running()?)
}

fn defaults() -> memtrail_options {
    let d = SessionOptions::default();
    memtrail_options {
        size: std::mem::size_of::<memtrail_options>(),
        ring_size: d.ring_size as u64,
        stack_ring_size: d.stack_ring_size as u64,
        stack_depth: d.stack_depth,
        watermark_percent: u32::from(d.watermark_percent),
        pressure_timeout_ns: 0,
        probes: memtrail_probes::MEMTRAIL_PROBES_AUTO as u32,
        event_rings: memtrail_event_rings::MEMTRAIL_EVENT_RINGS_AUTO as u32,
    }
}

fn session_options(o: &memtrail_options) -> Result<SessionOptions, memtrail_error> {
    let invalid = |msg| Err(fail(MEMTRAIL_E_INVALID, msg));
    let Ok(ring_size) = usize::try_from(o.ring_size) else {
        return invalid("ring_size is too large");
    };
    let Ok(stack_ring_size) = usize::try_from(o.stack_ring_size) else {
        return invalid("stack_ring_size is too large");
    };
    let Ok(watermark_percent) = u8::try_from(o.watermark_percent) else {
        return invalid("watermark_percent must be 1 to 99");
    };
    let pressure_timeout = match o.pressure_timeout_ns {
        0 => PressureTimeout::Off,
        u64::MAX => PressureTimeout::Infinite,
        ns => {
            let d = std::time::Duration::from_nanos(ns);
            if !(crate::pressure::MIN_TIMEOUT..=crate::pressure::MAX_TIMEOUT).contains(&d) {
                return invalid("pressure_timeout_ns must be 0, UINT64_MAX or 1 ms to a day");
            }
            PressureTimeout::After(d)
        }
    };
    use crate::attach::per_process::Probes;
    let probes = match o.probes {
        0 => Probes::Auto,
        1 => Probes::PerProcess,
        2 => Probes::SystemWide,
        _ => return invalid("probes must be a memtrail_probes"),
    };
    let event_rings = match o.event_rings {
        0 => crate::ring::merge::EventRings::Auto,
        1 => crate::ring::merge::EventRings::Shared,
        2 => crate::ring::merge::EventRings::PerCpu,
        _ => return invalid("event_rings must be a memtrail_event_rings"),
    };
    Ok(SessionOptions {
        ring_size,
        stack_ring_size,
        stack_depth: o.stack_depth,
        pressure_timeout,
        watermark_percent,
        probes,
        event_rings,
        ..SessionOptions::default()
    })
}

/// Starts a session on `target` and returns its handle in `*out`.
///
/// # Safety
/// `opts` (or NULL for the defaults) as `read_sized`; `out` NULL or
/// writable.
unsafe fn start(
    opts: *const memtrail_options,
    target: Target,
    out: *mut *mut memtrail_session,
) -> Result<(), memtrail_error> {
    if out.is_null() {
        return Err(fail(MEMTRAIL_E_NULL, "out is NULL"));
    }
    let opts = if opts.is_null() {
        defaults()
    } else {
        // SAFETY: forwarded from the caller.
        unsafe { read_sized(opts) }?
    };
    let opts = session_options(&opts)?;
    let session = Session::start(&opts, target).map_err(|err| from_error(&err))?;
    let handle = handles::insert(memtrail_session {
        pid: std::process::id(),
        state: RwLock::new(State::Running(Box::new(session))),
    });
    // SAFETY: `out` is non-NULL and writable (`# Safety`).
    unsafe { out.write(handle) };
    Ok(())
}

/// Fills `*opts` with the defaults (those of `memtrail run`), and its
/// `size` with this library's `sizeof(struct memtrail_options)`: the whole
/// struct of this version. Code that may run with a newer library (whose
/// struct is larger) uses `memtrail_options_init` instead.
///
/// # Safety
/// `opts` is NULL or points to a writable `struct memtrail_options` of this
/// library's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_options_default(opts: *mut memtrail_options) -> memtrail_error {
    guard(|| {
        if opts.is_null() {
            return Err(fail(MEMTRAIL_E_NULL, "opts is NULL"));
        }
        // SAFETY: non-NULL and writable (`# Safety`).
        unsafe { opts.write(defaults()) };
        Ok(())
    })
}

/// Fills `*opts`, `size` bytes (`sizeof` the caller's struct), with the
/// defaults: this library's fields get theirs, and the bytes of a larger
/// caller's struct past them 0 (a newer header's fields, "as before" at
/// 0); `size` keeps the caller's. Setting one of those newer fields then
/// makes a session refuse the options (`MEMTRAIL_E_UNKNOWN_FIELD`) rather
/// than ignore what it asks. Never writes past `size` bytes.
/// `MEMTRAIL_E_INVALID` when `size` is below the first version's.
///
/// # Safety
/// `opts` is NULL or points to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_options_init(
    opts: *mut memtrail_options,
    size: usize,
) -> memtrail_error {
    guard(|| {
        if opts.is_null() {
            return Err(fail(MEMTRAIL_E_NULL, "opts is NULL"));
        }
        if size < OPTIONS_V1 || isize::try_from(size).is_err() {
            return Err(fail(
                MEMTRAIL_E_INVALID,
                "size is below the first memtrail_options",
            ));
        }
        let ours = std::mem::size_of::<memtrail_options>();
        let n = size.min(ours);
        let mut value = defaults();
        value.size = size;
        // SAFETY: `size` bytes are the caller's (`# Safety`), `n` of them
        // ours; past ours, `size - ours` bytes (when the caller's is
        // larger).
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), opts.cast::<u8>(), n);
            if size > ours {
                opts.cast::<u8>().add(ours).write_bytes(0, size - ours);
            }
        }
        Ok(())
    })
}

/// Starts tracking the calling process: every thread but the session's
/// own, from now on. `opts` may be NULL (defaults); its pressure timeout
/// must be 0. On success `*out` is a handle to free with
/// `memtrail_session_free`.
///
/// # Safety
/// `opts` NULL or a valid `struct memtrail_options` (size first); `out`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_track_self(
    opts: *const memtrail_options,
    out: *mut *mut memtrail_session,
) -> memtrail_error {
    // SAFETY: forwarded.
    guard(|| unsafe { start(opts, Target::SelfProcess, out) })
}

/// Starts tracking running process `pid` (and what it forks from now on).
///
/// # Safety
/// As `memtrail_track_self`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_track_pid(
    opts: *const memtrail_options,
    pid: c_int,
    out: *mut *mut memtrail_session,
) -> memtrail_error {
    guard(|| {
        let Ok(pid) = u32::try_from(pid) else {
            return Err(fail(MEMTRAIL_E_INVALID, "pid must be positive"));
        };
        // SAFETY: forwarded.
        unsafe { start(opts, Target::Pid(pid), out) }
    })
}

/// Starts `argv[0]` (searched in PATH) with `argv`, tracked from its first
/// instruction. `argv` ends with a NULL. The command is a child of the
/// calling process: `memtrail_wait` waits for it (the root process only);
/// freeing the session before kills it.
///
/// # Safety
/// `argv` NULL or a NULL-terminated array of NUL-terminated strings;
/// `opts` and `out` as `memtrail_track_self`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_spawn(
    opts: *const memtrail_options,
    argv: *const *const c_char,
    out: *mut *mut memtrail_session,
) -> memtrail_error {
    guard(|| {
        if argv.is_null() {
            return Err(fail(MEMTRAIL_E_NULL, "argv is NULL"));
        }
        let mut args = Vec::new();
        for i in 0.. {
            // SAFETY: NULL-terminated array (`# Safety`).
            let arg = unsafe { *argv.add(i) };
            if arg.is_null() {
                break;
            }
            // SAFETY: NUL-terminated string (`# Safety`).
            let arg = unsafe { CStr::from_ptr(arg) };
            args.push(OsStr::from_bytes(arg.to_bytes()).to_owned());
        }
        if args.is_empty() {
            return Err(fail(MEMTRAIL_E_INVALID, "argv is empty"));
        }
        // SAFETY: forwarded.
        unsafe { start(opts, Target::Command(args), out) }
    })
}

/// Stops the session (if not finished), joins its threads, detaches its
/// probes and frees the handle. A command not waited for is killed. NULL
/// is a no-op (`MEMTRAIL_OK`). A handle freed already gives
/// `MEMTRAIL_E_HANDLE`, and so does one made by another process (a child
/// of fork calling it on its parent's handle), which is left as it is.
///
/// # Safety
/// No other call on `session` may run concurrently with this one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_session_free(session: *mut memtrail_session) -> memtrail_error {
    guard(|| handles::remove(session))
}

/// Totals of the tracked processes including every event made before the
/// call (the pipeline barrier is raised and drained).
///
/// # Safety
/// `out` is NULL or a writable `struct memtrail_totals` with its `size`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_snapshot(
    session: *const memtrail_session,
    out: *mut memtrail_totals,
) -> memtrail_error {
    guard(|| {
        let t: Totals = with_running(session, |s| {
            if out.is_null() {
                return Err(fail(MEMTRAIL_E_NULL, "out is NULL"));
            }
            s.totals().map_err(|err| from_error(&err))
        })?;
        let value = memtrail_totals {
            size: 0,
            allocations: t.allocations,
            frees: t.frees,
            allocated_bytes: t.allocated_bytes,
            freed_bytes: t.freed_bytes,
            live_allocations: t.live_allocations,
            live_bytes: t.live_bytes,
            peak_live_bytes: t.peak_live_bytes,
        };
        // SAFETY: `out` as documented.
        unsafe { write_sized(out, value) }
    })
}

/// Begins a region on the calling thread: its heap events from now until
/// the matching `memtrail_region_end`. Regions are per thread and nest.
/// `name` (UTF-8) is cut to 63 bytes.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_region_begin(
    session: *const memtrail_session,
    name: *const c_char,
) -> memtrail_error {
    guard(|| {
        with_running(session, |s| {
            if name.is_null() {
                return Err(fail(MEMTRAIL_E_NULL, "name is NULL"));
            }
            // SAFETY: NUL-terminated (`# Safety`).
            let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else {
                return Err(fail(MEMTRAIL_E_INVALID, "name is not UTF-8"));
            };
            s.region_begin(name).map_err(|err| from_error(&err))
        })
    })
}

/// Ends the calling thread's innermost region and writes its counts.
/// `MEMTRAIL_E_STATE` when the thread has no region open.
///
/// # Safety
/// `out` is NULL or a writable `struct memtrail_region_counts` with its
/// `size`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_region_end(
    session: *const memtrail_session,
    out: *mut memtrail_region_counts,
) -> memtrail_error {
    guard(|| {
        let c: RegionCounts = with_running(session, |s| {
            if out.is_null() {
                return Err(fail(MEMTRAIL_E_NULL, "out is NULL"));
            }
            s.region_end().map_err(|err| from_error(&err))
        })?;
        let value = memtrail_region_counts {
            size: 0,
            allocations: c.allocations,
            frees: c.frees,
            allocated_bytes: c.allocated_bytes,
            freed_bytes: c.freed_bytes,
            peak_live_bytes: c.peak_live_bytes,
            live_allocations: c.live_allocations,
            live_bytes: c.live_bytes,
        };
        // SAFETY: `out` as documented.
        unsafe { write_sized(out, value) }
    })
}

/// Waits, sharing the session, until what `s` tracks has exited, leaving
/// it to [`Session::wait`] to reap (at once then). A failure here is left
/// for that call to report.
fn exited(s: &Session) {
    match s.target() {
        Target::Pid(_) => {
            if let Some(fd) = s.target_pidfd() {
                let _ = crate::sys::wait_pidfd(fd);
            }
        }
        // The root process, reaped already by the caller (ECHILD) or by
        // an earlier `memtrail_wait`, returns at once.
        Target::Command(_) => {
            if s.pid() != 0 {
                let _ = crate::sys::wait_exited(s.pid().into());
            }
        }
        Target::SelfProcess => {}
    }
}

/// Waits for the tracked command's root process (or the tracked process)
/// to exit. `*exit_code` (if not NULL) gets the command's exit code, 128+N
/// if signal N killed it, -1 when unknown (a process that is not our
/// child). `MEMTRAIL_E_STATE` for a session tracking its own process, and
/// when the caller reaped the command's process itself (its own `wait`,
/// or SIGCHLD ignored): its exit status is lost, `*exit_code` is left as
/// it was, and the profile can still be written. Other threads' snapshots
/// and regions go on while it waits.
///
/// # Safety
/// `exit_code` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_wait(
    session: *const memtrail_session,
    exit_code: *mut c_int,
) -> memtrail_error {
    guard(|| {
        // The blocking part shares the session (issue 27: it held the
        // session alone, and other threads' snapshots waited for the
        // command's end); reaping takes it alone, briefly.
        with_running(session, |s| {
            exited(s);
            Ok(())
        })?;
        let h = handles::get(session)?;
        let mut state = h.state.write().unwrap_or_else(|e| e.into_inner());
        let State::Running(s) = &mut *state else {
            return Err(fail(MEMTRAIL_E_STATE, "the session has finished"));
        };
        let exit = s.wait().map_err(|err| from_error(&err))?;
        if !exit_code.is_null() {
            let code = exit.root.map_or(-1, crate::sys::ChildExit::code);
            // SAFETY: non-NULL and writable (`# Safety`).
            unsafe { exit_code.write(code) };
        }
        Ok(())
    })
}

/// Finishes the session (stops tracking, drains, builds the profile) and
/// writes the profile (JSON, docs/profile.md) to `path`, whole or not at
/// all. The profile is kept until `memtrail_session_free`: called again,
/// this writes it again (a write that failed, `MEMTRAIL_E_OUTPUT`, is
/// retried that way, to the same path or another); the session's other
/// calls return `MEMTRAIL_E_STATE` from the first call on. Waits for the
/// session's calls in progress on other threads (a `memtrail_wait` too).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_write_profile(
    session: *const memtrail_session,
    path: *const c_char,
) -> memtrail_error {
    guard(|| {
        let h = handles::get(session)?;
        if path.is_null() {
            return Err(fail(MEMTRAIL_E_NULL, "path is NULL"));
        }
        // SAFETY: NUL-terminated (`# Safety`).
        let path = std::path::Path::new(OsStr::from_bytes(
            unsafe { CStr::from_ptr(path) }.to_bytes(),
        ));
        let output =
            crate::output::OutputFile::create(path).map_err(|err| from_error(&err.into()))?;
        let mut state = h.state.write().unwrap_or_else(|e| e.into_inner());
        let written = match std::mem::replace(&mut *state, State::Failed) {
            State::Running(s) => {
                let finish = (*s).finish().map_err(|err| from_error(&err))?;
                // Written while the probes detach (joined as `finish` goes).
                let written = crate::output::write_profile(&finish.profile, output);
                *state = State::Finished(Box::new(finish.profile));
                written
            }
            State::Finished(profile) => {
                let written = crate::output::write_profile(&profile, output);
                *state = State::Finished(profile);
                written
            }
            State::Failed => return Err(fail(MEMTRAIL_E_STATE, "the session failed to finish")),
        };
        written.map_err(|err| from_error(&CaptureError::from(err)))
    })
}

/// Report formats of `memtrail_write_report` (`memtrail report --format`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum memtrail_format {
    /// The top sites with their metrics and stacks, as text.
    MEMTRAIL_FORMAT_TEXT = 0,
    /// The ranked sites as a JSON document.
    MEMTRAIL_FORMAT_JSON = 1,
    /// An SVG flame graph.
    MEMTRAIL_FORMAT_FLAMEGRAPH = 2,
    /// A gzipped pprof profile.proto.
    MEMTRAIL_FORMAT_PPROF = 3,
    /// Collapsed stacks (`outer;...;inner VALUE` a line).
    MEMTRAIL_FORMAT_FOLDED = 4,
}

/// What `memtrail_write_report` ranks sites by (`memtrail report --by`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum memtrail_metric {
    /// Bytes allocated.
    MEMTRAIL_METRIC_BYTES = 0,
    /// Allocating calls.
    MEMTRAIL_METRIC_COUNT = 1,
    /// Bytes live at the tree's peak.
    MEMTRAIL_METRIC_PEAK = 2,
    /// Bytes still live when their process exited.
    MEMTRAIL_METRIC_LEAKED = 3,
}

/// Renders the report of the profile at `profile_path` (one
/// `memtrail_write_profile` or `memtrail run` wrote) into `out_path`, as
/// `memtrail report` does: whole or not at all; `-` is standard output.
/// `format` is a `memtrail_format`, `by` a `memtrail_metric` (passed as
/// integers: a value outside them is `MEMTRAIL_E_INVALID`, never undefined
/// behaviour); `top` keeps the first `top` sites, 0 all of them. Needs no
/// session and no privilege; any thread may call it.
///
/// Errors: `MEMTRAIL_E_NULL`, `MEMTRAIL_E_INVALID` (format, metric, or a
/// file that is not a profile this memtrail reads: not a regular file, over
/// 1 GiB, not a valid profile), `MEMTRAIL_E_NOT_FOUND` (no profile at
/// `profile_path`), `MEMTRAIL_E_OUTPUT` (also: `out_path` is the profile
/// itself, by any path, which is never written over).
///
/// # Safety
/// `profile_path` and `out_path` are NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_write_report(
    profile_path: *const c_char,
    out_path: *const c_char,
    format: u32,
    by: u32,
    top: u32,
) -> memtrail_error {
    use crate::report::{Format, Metric};
    guard(|| {
        if profile_path.is_null() || out_path.is_null() {
            return Err(fail(MEMTRAIL_E_NULL, "a path is NULL"));
        }
        let format = match format {
            0 => Format::Text,
            1 => Format::Json,
            2 => Format::Flamegraph,
            3 => Format::Pprof,
            4 => Format::Folded,
            n => return Err(fail(MEMTRAIL_E_INVALID, &format!("no report format {n}"))),
        };
        let by = match by {
            0 => Metric::Bytes,
            1 => Metric::Count,
            2 => Metric::Peak,
            3 => Metric::Leaked,
            n => return Err(fail(MEMTRAIL_E_INVALID, &format!("no metric {n}"))),
        };
        // SAFETY: NUL-terminated (`# Safety`).
        let (profile_path, out_path) = unsafe {
            (
                std::path::Path::new(OsStr::from_bytes(CStr::from_ptr(profile_path).to_bytes())),
                std::path::Path::new(OsStr::from_bytes(CStr::from_ptr(out_path).to_bytes())),
            )
        };
        let (profile, id) = crate::report::load_profile_with_id(profile_path)
            .map_err(|err| from_report_error(&err))?;
        let opts = crate::report::ReportOptions {
            format,
            by,
            top: Some(top as usize),
            shaping: Default::default(),
        };
        // Never over the profile itself (issue 28).
        crate::output::check_not_input(out_path, &[("the profile", profile_path, id)])
            .and_then(|()| crate::output::OutputFile::create(out_path))
            .and_then(|out| crate::report::write_report_file(&profile, &opts, out))
            .map_err(|err| fail(MEMTRAIL_E_OUTPUT, &crate::sys::error_chain(&err)))
    })
}

/// The message of the calling thread's last error ("" if none), cut to
/// 1023 bytes. Valid until the thread's next failing call; memtrail's, not
/// to be freed. Safe at any point of the thread's life, in its TLS and
/// pthread-key destructors too.
#[unsafe(no_mangle)]
pub extern "C" fn memtrail_last_error() -> *const c_char {
    errors::last_error()
}
