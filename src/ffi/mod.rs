//! The C ABI: `memtrail_*` functions over a [`Session`], described by the
//! generated header `include/memtrail.h` (cbindgen; `tests/ffi_header.rs`
//! fails when it is stale).
//!
//! Conventions:
//! - Every function returns a [`memtrail_error`]; `MEMTRAIL_OK` is 0. On
//!   failure, [`memtrail_last_error`] gives a message for the calling thread.
//! - Structs passed in and out start with `size`, set by the caller to
//!   `sizeof` the struct it was built with: a library that knows a larger
//!   struct reads and writes only the caller's part, so structs can grow.
//! - NULL where a pointer is required, a `size` below the first version's,
//!   a session handle that was freed (or never returned by this library)
//!   are errors with their codes, never a crash. Panics are caught.
//! - A handle belongs to the process that made it: in a child of `fork()`
//!   every call on a handle its parent made, `memtrail_session_free`
//!   included, returns `MEMTRAIL_E_HANDLE` and does nothing (the session's
//!   threads are the parent's; the child has none of them). The parent's
//!   session goes on unaffected.
//! - Ownership: a handle from `memtrail_track_self`, `memtrail_spawn` or
//!   `memtrail_track_pid` is the caller's until `memtrail_session_free`.
//! - Threading: any thread may call any function on a handle. Snapshots and
//!   regions may run concurrently (regions are per calling thread);
//!   `memtrail_wait` and `memtrail_write_profile` take the handle for
//!   themselves and block the other calls until they return.
//! - The success path of `memtrail_region_begin`, `memtrail_region_end` and
//!   `memtrail_snapshot` allocates nothing on the calling thread, so a
//!   region measures only the code between them.

#![expect(
    non_camel_case_types,
    reason = "C names: the header is the API, in C's conventions"
)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr, c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, RwLock};

use crate::capture::{CaptureError, ErrorKind};
use crate::pressure::PressureTimeout;
use crate::session::{RegionCounts, Session, SessionOptions, Target, Totals};

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
}

use memtrail_error::*;

/// Options of a session. Fill with `memtrail_options_init(&opts,
/// sizeof opts)` first (or `memtrail_options_default`), then change what
/// differs.
///
/// The struct grows at its end, never changes what is there: a caller built
/// against an older header passes its smaller `size` and gets the defaults
/// for the fields it does not know; one built against a newer header, run
/// with an older library, has its newer fields ignored.
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

/// A session handle (opaque).
pub struct memtrail_session {
    /// The process that made it, the only one that may use it.
    pid: u32,
    state: RwLock<State>,
}

/// Where a session is in its life.
enum State {
    Running(Box<Session>),
    /// Finished by `memtrail_write_profile`: its profile, kept so that a
    /// failed write can be retried (and the profile written elsewhere).
    Finished(Box<crate::report::Profile>),
    /// Finishing failed: nothing is left but to free it.
    Failed,
}

impl State {
    /// The running session, or `MEMTRAIL_E_STATE`.
    fn running(&self) -> Result<&Session, memtrail_error> {
        match self {
            State::Running(session) => Ok(session),
            _ => Err(fail(MEMTRAIL_E_STATE, "the session has finished")),
        }
    }
}

/// Live handles: a call on any other pointer is `MEMTRAIL_E_HANDLE`.
static HANDLES: Mutex<Option<HashMap<usize, Arc<memtrail_session>>>> = Mutex::new(None);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

fn fail(code: memtrail_error, msg: &str) -> memtrail_error {
    set_error(msg);
    code
}

fn code_of(err: &CaptureError) -> memtrail_error {
    match err.kind() {
        ErrorKind::InvalidArgument => MEMTRAIL_E_INVALID,
        ErrorKind::State => MEMTRAIL_E_STATE,
        ErrorKind::NotFound => MEMTRAIL_E_NOT_FOUND,
        ErrorKind::NotExecutable => MEMTRAIL_E_NOT_EXECUTABLE,
        ErrorKind::Output => MEMTRAIL_E_OUTPUT,
        ErrorKind::Unsupported => MEMTRAIL_E_UNSUPPORTED,
        ErrorKind::Conflict => MEMTRAIL_E_CONFLICT,
        ErrorKind::Attach => MEMTRAIL_E_ATTACH,
        ErrorKind::Lost => MEMTRAIL_E_LOST,
        ErrorKind::Pressure => MEMTRAIL_E_PRESSURE,
        _ => MEMTRAIL_E_INTERNAL,
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
        source = cause.source();
    }
    msg
}

fn from_error(err: &CaptureError) -> memtrail_error {
    fail(code_of(err), &error_chain(err))
}

/// Runs `f`, turning a panic into `MEMTRAIL_E_INTERNAL`.
fn guard(f: impl FnOnce() -> memtrail_error) -> memtrail_error {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| fail(MEMTRAIL_E_INTERNAL, "memtrail panicked"))
}

/// The live handle behind `ptr`, made by this process.
fn handle(ptr: *const memtrail_session) -> Result<Arc<memtrail_session>, memtrail_error> {
    if ptr.is_null() {
        return Err(fail(MEMTRAIL_E_NULL, "session is NULL"));
    }
    let handles = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    let handle = handles
        .as_ref()
        .and_then(|h| h.get(&(ptr as usize)).cloned())
        .ok_or_else(|| {
            fail(
                MEMTRAIL_E_HANDLE,
                "not a live memtrail session (freed already?)",
            )
        })?;
    drop(handles);
    own(&handle)?;
    Ok(handle)
}

/// `MEMTRAIL_E_HANDLE` unless `handle` was made by the calling process: a
/// child of fork has a copy of its parent's session but none of its
/// threads, and a call waiting for them would wait forever.
fn own(handle: &memtrail_session) -> Result<(), memtrail_error> {
    let me = std::process::id();
    if handle.pid == me {
        return Ok(());
    }
    Err(fail(
        MEMTRAIL_E_HANDLE,
        &format!(
            "this session belongs to process {}, not to process {me} (a child of fork): \
             only the process that made it can use or free it",
            handle.pid
        ),
    ))
}

/// Reads the caller's part of a size-first struct.
///
/// # Safety
/// `ptr` must be NULL or point to a struct whose first field is its size
/// and which is at least that large.
unsafe fn read_sized<T: Copy + SizeFirst>(
    ptr: *const T,
    first_version: usize,
) -> Result<T, memtrail_error> {
    if ptr.is_null() {
        return Err(fail(MEMTRAIL_E_NULL, "struct pointer is NULL"));
    }
    // SAFETY: the caller's struct starts with its size (`# Safety`).
    let size = unsafe { ptr.cast::<usize>().read_unaligned() };
    if size < first_version {
        return Err(fail(MEMTRAIL_E_INVALID, "struct size is too small"));
    }
    let mut value = T::empty();
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: `n` bytes are the caller's (it said `size`) and ours.
    unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&raw mut value).cast::<u8>(), n) };
    Ok(value)
}

/// Writes `value` into the caller's part of a size-first struct.
///
/// # Safety
/// As [`read_sized`], writable.
unsafe fn write_sized<T: Copy + SizeFirst>(
    ptr: *mut T,
    value: T,
    first_version: usize,
) -> Result<(), memtrail_error> {
    if ptr.is_null() {
        return Err(fail(MEMTRAIL_E_NULL, "output struct pointer is NULL"));
    }
    // SAFETY: the caller's struct starts with its size.
    let size = unsafe { ptr.cast::<usize>().read_unaligned() };
    if size < first_version {
        return Err(fail(MEMTRAIL_E_INVALID, "struct size is too small"));
    }
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: `n` bytes are the caller's and ours; the caller's size
    // field is left as it was (`n` covers it with the same value below).
    unsafe {
        let mut value = value;
        (&raw mut value).cast::<usize>().write(size);
        std::ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), ptr.cast::<u8>(), n);
    }
    Ok(())
}

/// Structs that begin with their size.
trait SizeFirst {
    fn empty() -> Self;
}

impl SizeFirst for memtrail_options {
    fn empty() -> Self {
        defaults()
    }
}
impl SizeFirst for memtrail_totals {
    fn empty() -> Self {
        Self::default()
    }
}
impl SizeFirst for memtrail_region_counts {
    fn empty() -> Self {
        Self::default()
    }
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
) -> memtrail_error {
    if out.is_null() {
        return fail(MEMTRAIL_E_NULL, "out is NULL");
    }
    let opts = if opts.is_null() {
        defaults()
    } else {
        // SAFETY: forwarded from the caller.
        match unsafe { read_sized(opts, OPTIONS_V1) } {
            Ok(o) => o,
            Err(code) => return code,
        }
    };
    let opts = match session_options(&opts) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let session = match Session::start(&opts, target) {
        Ok(s) => s,
        Err(err) => return from_error(&err),
    };
    let handle = Arc::new(memtrail_session {
        pid: std::process::id(),
        state: RwLock::new(State::Running(Box::new(session))),
    });
    let ptr = Arc::as_ptr(&handle).cast_mut();
    HANDLES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(ptr as usize, handle);
    // SAFETY: `out` is non-NULL and writable (`# Safety`).
    unsafe { out.write(ptr) };
    MEMTRAIL_OK
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
    if opts.is_null() {
        return fail(MEMTRAIL_E_NULL, "opts is NULL");
    }
    // SAFETY: non-NULL and writable (`# Safety`).
    unsafe { opts.write(defaults()) };
    MEMTRAIL_OK
}

/// Fills the first `size` bytes of `*opts` (`sizeof` of the caller's
/// struct) with the defaults, and its `size` with what this library will
/// read: `size`, or this library's `sizeof(struct memtrail_options)` when
/// the caller's is larger (its newer fields are then ignored). Never
/// writes past `size` bytes. `MEMTRAIL_E_INVALID` when `size` is below the
/// first version's.
///
/// # Safety
/// `opts` is NULL or points to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_options_init(
    opts: *mut memtrail_options,
    size: usize,
) -> memtrail_error {
    if opts.is_null() {
        return fail(MEMTRAIL_E_NULL, "opts is NULL");
    }
    if size < OPTIONS_V1 {
        return fail(
            MEMTRAIL_E_INVALID,
            "size is below the first memtrail_options",
        );
    }
    let n = size.min(std::mem::size_of::<memtrail_options>());
    let mut value = defaults();
    value.size = n;
    // SAFETY: `n` bytes are the caller's (`size` of them, `# Safety`) and
    // ours.
    unsafe { std::ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), opts.cast::<u8>(), n) };
    MEMTRAIL_OK
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
    let Ok(pid) = u32::try_from(pid) else {
        return fail(MEMTRAIL_E_INVALID, "pid must be positive");
    };
    // SAFETY: forwarded.
    guard(|| unsafe { start(opts, Target::Pid(pid), out) })
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
            return fail(MEMTRAIL_E_NULL, "argv is NULL");
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
            return fail(MEMTRAIL_E_INVALID, "argv is empty");
        }
        // SAFETY: forwarded.
        unsafe { start(opts, Target::Command(args), out) }
    })
}

/// Stops the session (if not finished), joins its threads, detaches its
/// probes and frees the handle. A command not waited for is killed. A
/// handle already freed gives `MEMTRAIL_E_HANDLE`, and so does one made by
/// another process (a child of fork calling it on its parent's handle),
/// which is left as it is.
///
/// # Safety
/// `session` is NULL or a pointer this library returned; no other call
/// on it may run concurrently with this one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_session_free(session: *mut memtrail_session) -> memtrail_error {
    guard(|| {
        if session.is_null() {
            return fail(MEMTRAIL_E_NULL, "session is NULL");
        }
        let mut handles = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
        let handles = handles.as_mut();
        // Another process's stays: dropping it would join threads this
        // process does not have.
        if let Some(h) = handles.as_ref().and_then(|h| h.get(&(session as usize)))
            && let Err(code) = own(h)
        {
            return code;
        }
        let removed = handles.and_then(|h| h.remove(&(session as usize)));
        match removed {
            Some(handle) => {
                drop(handle);
                MEMTRAIL_OK
            }
            None => fail(
                MEMTRAIL_E_HANDLE,
                "not a live memtrail session (freed already?)",
            ),
        }
    })
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
        let h = match handle(session) {
            Ok(h) => h,
            Err(code) => return code,
        };
        if out.is_null() {
            return fail(MEMTRAIL_E_NULL, "out is NULL");
        }
        let guard = h.state.read().unwrap_or_else(|e| e.into_inner());
        let s = match guard.running() {
            Ok(s) => s,
            Err(code) => return code,
        };
        let t: Totals = match s.totals() {
            Ok(t) => t,
            Err(err) => return from_error(&err),
        };
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
        match unsafe { write_sized(out, value, std::mem::size_of::<memtrail_totals>()) } {
            Ok(()) => MEMTRAIL_OK,
            Err(code) => code,
        }
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
        let h = match handle(session) {
            Ok(h) => h,
            Err(code) => return code,
        };
        if name.is_null() {
            return fail(MEMTRAIL_E_NULL, "name is NULL");
        }
        // SAFETY: NUL-terminated (`# Safety`).
        let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else {
            return fail(MEMTRAIL_E_INVALID, "name is not UTF-8");
        };
        let guard = h.state.read().unwrap_or_else(|e| e.into_inner());
        let s = match guard.running() {
            Ok(s) => s,
            Err(code) => return code,
        };
        match s.region_begin(name) {
            Ok(()) => MEMTRAIL_OK,
            Err(err) => from_error(&err),
        }
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
        let h = match handle(session) {
            Ok(h) => h,
            Err(code) => return code,
        };
        if out.is_null() {
            return fail(MEMTRAIL_E_NULL, "out is NULL");
        }
        let guard = h.state.read().unwrap_or_else(|e| e.into_inner());
        let s = match guard.running() {
            Ok(s) => s,
            Err(code) => return code,
        };
        let c: RegionCounts = match s.region_end() {
            Ok(c) => c,
            Err(err) => return from_error(&err),
        };
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
        match unsafe { write_sized(out, value, std::mem::size_of::<memtrail_region_counts>()) } {
            Ok(()) => MEMTRAIL_OK,
            Err(code) => code,
        }
    })
}

/// Waits for the tracked command's root process (or the tracked process)
/// to exit. `*exit_code` (if not NULL) gets the command's exit code, 128+N
/// if signal N killed it, -1 when unknown (a process that is not our
/// child). `MEMTRAIL_E_STATE` for a session tracking its own process, and
/// when the caller reaped the command's process itself (its own `wait`,
/// or SIGCHLD ignored): its exit status is lost, `*exit_code` is left as
/// it was, and the profile can still be written.
///
/// # Safety
/// `exit_code` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_wait(
    session: *const memtrail_session,
    exit_code: *mut c_int,
) -> memtrail_error {
    guard(|| {
        let h = match handle(session) {
            Ok(h) => h,
            Err(code) => return code,
        };
        let mut guard = h.state.write().unwrap_or_else(|e| e.into_inner());
        let State::Running(s) = &mut *guard else {
            return fail(MEMTRAIL_E_STATE, "the session has finished");
        };
        match s.wait() {
            Ok(exit) => {
                if !exit_code.is_null() {
                    let code = exit.root.map_or(-1, crate::sys::ChildExit::code);
                    // SAFETY: non-NULL and writable (`# Safety`).
                    unsafe { exit_code.write(code) };
                }
                MEMTRAIL_OK
            }
            Err(err) => from_error(&err),
        }
    })
}

/// Finishes the session (stops tracking, drains, builds the profile) and
/// writes the profile (JSON, docs/profile.md) to `path`, whole or not at
/// all. The profile is kept until `memtrail_session_free`: called again,
/// this writes it again (a write that failed, `MEMTRAIL_E_OUTPUT`, is
/// retried that way, to the same path or another); the session's other
/// calls return `MEMTRAIL_E_STATE` from the first call on.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memtrail_write_profile(
    session: *const memtrail_session,
    path: *const c_char,
) -> memtrail_error {
    guard(|| {
        let h = match handle(session) {
            Ok(h) => h,
            Err(code) => return code,
        };
        if path.is_null() {
            return fail(MEMTRAIL_E_NULL, "path is NULL");
        }
        // SAFETY: NUL-terminated (`# Safety`).
        let path = std::path::Path::new(OsStr::from_bytes(
            unsafe { CStr::from_ptr(path) }.to_bytes(),
        ));
        let output = match crate::report::OutputFile::create(path) {
            Ok(o) => o,
            Err(err) => return from_error(&err.into()),
        };
        let mut guard = h.state.write().unwrap_or_else(|e| e.into_inner());
        let written = match std::mem::replace(&mut *guard, State::Failed) {
            State::Running(s) => {
                let finish = match (*s).finish() {
                    Ok(f) => f,
                    Err(err) => return from_error(&err),
                };
                // Written while the probes detach (joined as `finish` goes).
                let written = crate::report::write_profile(&finish.profile, output);
                *guard = State::Finished(Box::new(finish.profile));
                written
            }
            State::Finished(profile) => {
                let written = crate::report::write_profile(&profile, output);
                *guard = State::Finished(profile);
                written
            }
            State::Failed => return fail(MEMTRAIL_E_STATE, "the session failed to finish"),
        };
        match written {
            Ok(()) => MEMTRAIL_OK,
            Err(err) => from_error(&err.into()),
        }
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
    use crate::render::{Format, Metric, ReportError};
    guard(|| {
        if profile_path.is_null() || out_path.is_null() {
            return fail(MEMTRAIL_E_NULL, "a path is NULL");
        }
        let format = match format {
            0 => Format::Text,
            1 => Format::Json,
            2 => Format::Flamegraph,
            3 => Format::Pprof,
            4 => Format::Folded,
            n => return fail(MEMTRAIL_E_INVALID, &format!("no report format {n}")),
        };
        let by = match by {
            0 => Metric::Bytes,
            1 => Metric::Count,
            2 => Metric::Peak,
            3 => Metric::Leaked,
            n => return fail(MEMTRAIL_E_INVALID, &format!("no metric {n}")),
        };
        // SAFETY: NUL-terminated (`# Safety`).
        let (profile_path, out_path) = unsafe {
            (
                std::path::Path::new(OsStr::from_bytes(CStr::from_ptr(profile_path).to_bytes())),
                std::path::Path::new(OsStr::from_bytes(CStr::from_ptr(out_path).to_bytes())),
            )
        };
        let (profile, id) = match crate::render::load_profile_with_id(profile_path) {
            Ok(p) => p,
            Err(err) => {
                let code = match &err {
                    ReportError::Read { source, .. }
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        MEMTRAIL_E_NOT_FOUND
                    }
                    ReportError::Output(_) | ReportError::Stdout(_) => MEMTRAIL_E_OUTPUT,
                    _ => MEMTRAIL_E_INVALID,
                };
                return fail(code, &error_chain(&err));
            }
        };
        let opts = crate::render::ReportOptions {
            format,
            by,
            top: Some(top as usize),
        };
        // Never over the profile itself (issue 28).
        let result = crate::report::check_not_input(out_path, &[("the profile", profile_path, id)])
            .and_then(|()| crate::report::OutputFile::create(out_path))
            .and_then(|out| crate::render::write_report_file(&profile, &opts, out));
        match result {
            Ok(()) => MEMTRAIL_OK,
            Err(err) => fail(MEMTRAIL_E_OUTPUT, &error_chain(&err)),
        }
    })
}

/// The message of the calling thread's last error ("" if none). Valid
/// until the thread's next failing call.
#[unsafe(no_mangle)]
pub extern "C" fn memtrail_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
