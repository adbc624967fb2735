//! Error codes and the calling thread's last error message.
//!
//! Every exported function runs in [`guard`]: a panic becomes
//! `MEMTRAIL_E_INTERNAL`, never an unwind into C. The message lives in a
//! thread-local buffer with no destructor, so that [`set_error`] and
//! `memtrail_last_error` work at any time in a thread's life, its TLS
//! destructors included (issue 27: a `RefCell<CString>` is destroyed with
//! the thread's Rust TLS, after which every access panicked, and a panic
//! there, outside `catch_unwind`, aborted the process).

use std::cell::RefCell;
use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::memtrail_error::{self, *};
use crate::report::ReportError;
use crate::session::{CaptureError, ErrorKind};
use crate::sys::error_chain;

/// Room for the last error message, its NUL included: longer messages are
/// cut (at a character boundary) to `ERROR_MAX - 1` bytes.
const ERROR_MAX: usize = 1024;

thread_local! {
    /// The calling thread's last error message, NUL-terminated. Plain
    /// bytes, const-initialized: no destructor, so the slot is valid as
    /// long as the thread (std gives such a key no destroyed state).
    static LAST_ERROR: RefCell<[u8; ERROR_MAX]> = const { RefCell::new([0; ERROR_MAX]) };
}

/// Makes `msg` the calling thread's last error (NULs become spaces).
pub(super) fn set_error(msg: &str) {
    let mut n = msg.len().min(ERROR_MAX - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    // `try_with`: never a panic, whatever std does with the key (it
    // cannot fail for a const key without a destructor).
    let _ = LAST_ERROR.try_with(|slot| {
        // A message is never set while one is being read: no borrow is
        // held across a call (`last_error` hands out a raw pointer).
        if let Ok(mut buf) = slot.try_borrow_mut() {
            for (dst, &src) in buf.iter_mut().zip(&msg.as_bytes()[..n]) {
                *dst = if src == 0 { b' ' } else { src };
            }
            buf[n] = 0;
        }
    });
}

/// The calling thread's last error message, NUL-terminated ("" if none).
pub(super) fn last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.as_ptr().cast::<c_char>().cast_const())
        .unwrap_or(c"".as_ptr())
}

/// Sets the last error and returns `code`.
pub(super) fn fail(code: memtrail_error, msg: &str) -> memtrail_error {
    set_error(msg);
    code
}

/// The C code of a session error. Exhaustive: a new kind chooses its code.
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
        // A terminating signal before the command started: only with the
        // CLI's process effects, which a C session never has.
        ErrorKind::Interrupted | ErrorKind::Internal => MEMTRAIL_E_INTERNAL,
    }
}

/// The C code of a failed report (`memtrail_write_report`). Exhaustive: a
/// new variant chooses its code.
fn report_code_of(err: &ReportError) -> memtrail_error {
    match err {
        ReportError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            MEMTRAIL_E_NOT_FOUND
        }
        // Not a regular file, too large, unreadable, not a profile or not
        // one this memtrail reads.
        ReportError::Read { .. }
        | ReportError::Invalid { .. }
        | ReportError::Format { .. }
        | ReportError::Version { .. } => MEMTRAIL_E_INVALID,
        // Filters, debuginfo directories, views and suppressions: the C
        // ABI passes none.
        ReportError::NoSuchProcess { .. }
        | ReportError::DebuginfoDir { .. }
        | ReportError::Suppressions(_)
        | ReportError::ViewFormat { .. }
        | ReportError::CallsWithoutFocus => MEMTRAIL_E_INVALID,
        ReportError::Output(_) | ReportError::Stdout(_) => MEMTRAIL_E_OUTPUT,
    }
}

/// Sets the last error from a session error; its code.
pub(super) fn from_error(err: &CaptureError) -> memtrail_error {
    fail(code_of(err), &error_chain(err))
}

/// Sets the last error from a report error; its code.
pub(super) fn from_report_error(err: &ReportError) -> memtrail_error {
    fail(report_code_of(err), &error_chain(err))
}

/// Runs `f`: its error's code, `MEMTRAIL_OK`, or `MEMTRAIL_E_INTERNAL` if
/// it panicked.
pub(super) fn guard(f: impl FnOnce() -> Result<(), memtrail_error>) -> memtrail_error {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => MEMTRAIL_OK,
        Ok(Err(code)) => code,
        Err(_) => fail(MEMTRAIL_E_INTERNAL, "memtrail panicked"),
    }
}
