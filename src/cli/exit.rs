//! Exit codes: what memtrail exits with when it fails itself, what each
//! subcommand's `--help` says of them, and the one function per subcommand
//! that maps its error to its code. Otherwise memtrail exits with the
//! command's code (128 + N when a signal N killed it).
//!
//! A code changes here and only here: the constants, the help texts that
//! document them and the mappers sit side by side.

use crate::bench::BenchError;
use crate::compare::CompareError;
use crate::events::EventsError;
use crate::report::ReportError;
use crate::session::{CaptureError, ErrorKind};

/// Bad command-line usage.
pub const USAGE: i32 = 2;
/// `memtrail report`: the profile is not a valid memtrail profile.
pub const PROFILE_INVALID: i32 = 65;
/// `memtrail report`: the profile cannot be read.
pub const PROFILE_UNREADABLE: i32 = 66;
/// memtrail itself failed.
pub const INTERNAL: i32 = 70;
/// Events were lost: the capture is incomplete and no report was written.
pub const LOST: i32 = 71;
/// Missing privileges or kernel feature.
pub const UNSUPPORTED: i32 = 72;
/// An output path cannot be written.
pub const OUTPUT: i32 = 73;
/// Another tracer's uprobe conflicts with ours.
pub const CONFLICT: i32 = 74;
/// An image the command loaded could not be examined or probed.
pub const ATTACH: i32 = 75;
/// A pressure pause did not recover within --pressure-timeout.
pub const PRESSURE: i32 = 76;
/// `memtrail attach`: a pressure pause did not recover within
/// --pressure-timeout; memtrail detached, leaving the process running.
pub const DETACHED: i32 = 77;
/// `memtrail attach`: no process memtrail can attach to has that PID.
pub const NO_PROCESS: i32 = 78;
/// `memtrail run --preload`: a tracked process corrupted its preload ring
/// file; the profile was written, names the process and marks its counts
/// incomplete.
pub const RING_FAULT: i32 = 79;
/// The command is not executable.
pub const NOT_EXECUTABLE: i32 = 126;
/// The command was not found.
pub const NOT_FOUND: i32 = 127;

/// Exit codes of `memtrail bench` and `memtrail compare`.
pub mod bench {
    /// Nothing regressed (compare), every benchmark ran and exited 0
    /// (bench).
    pub const OK: i32 = 0;
    /// Something regressed (compare, bench --baseline), or a benchmark's
    /// command exited nonzero (bench).
    pub const REGRESSED: i32 = 1;
    /// Bad usage or bad input (a suite, results or profile that cannot be
    /// read or is invalid, a missing baseline).
    pub const BAD_INPUT: i32 = 2;
    /// An output cannot be written.
    pub const OUTPUT: i32 = super::OUTPUT;
    /// memtrail itself failed.
    pub const INTERNAL: i32 = super::INTERNAL;
}

/// `memtrail --help` and `memtrail run --help`: the exit codes.
pub const RUN_HELP: &str = "\
Exit status:
  memtrail exits with the command's exit status (128+N if signal N killed it),
  unless memtrail itself fails (or SIGTERM or SIGHUP, N, ended it before the
  command started: 128+N). SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are passed
  on to the command once it runs.
    2    bad usage (also: two outputs naming the same file)
    65   memtrail report: the profile is not a valid memtrail profile
    66   memtrail report: the profile cannot be read
    70   internal failure
    71   events were lost: the capture is incomplete, no report was written
    72   missing privileges or kernel feature
    73   an output cannot be written, or names an existing file and --force
         was not given (checked before the command starts; a stream output -
         a FIFO or a device - can also fail while written; for memtrail
         report, also standard output, or an output that is the profile it
         reads). The outputs of a capture are put in place together: when
         one cannot be written none appears, and the summary is printed
    74   another tracer holds a conflicting uprobe (ref_ctr_offset mismatch)
    75   an executable image the command loaded could not be examined or probed
         (a file that is no ELF image, or a malformed one, is skipped and
         named in the profile's skipped_images instead)
    76   a pressure pause did not recover within --pressure-timeout (tree killed)
    79   --preload: a tracked process corrupted its preload ring file: the
         profile was written, names the process and marks its counts
         incomplete (the summary says where reading stopped)
    126  the command is not executable, or cannot be reached (a directory on
         its path denies search permission: the message names it)
    127  the command was not found";

/// `memtrail report --help`: the exit codes.
pub const REPORT_HELP: &str = "\
Exit status:
    0    the report was written (or standard output was closed early)
    2    bad usage (also: --pid or --exe naming no process of the profile,
         --debuginfo-dir not a directory)
    65   the profile is not a valid memtrail profile (not JSON, another format
         or version, a missing or mistyped field; every field must be there,
         null where the schema allows it)
    66   the profile cannot be read (missing, no permission, not a regular
         file - a FIFO or a device is refused, not read - or larger than
         the 1 GiB a profile may have)
    73   the report cannot be written (--output or standard output), or
         would be written over the profile itself (the same file, through a
         symlink or a hard link too), or --output names an existing file and
         --force was not given";

/// `memtrail attach --help`: the exit codes.
pub const ATTACH_HELP: &str = "\
Exit status:
    0    memtrail detached (at --duration, on SIGINT/SIGTERM/SIGHUP, or when
         the process exited) and wrote its outputs
    2    bad usage
    70   internal failure
    71   events were lost: the capture is incomplete, no report was written
    72   missing privileges or kernel feature
    73   an output cannot be written, or names an existing file and --force
         was not given (when one cannot be written, none appears; the
         summary is printed)
    74   another tracer holds a conflicting uprobe
    75   an executable image the process loaded could not be probed
    77   a pressure pause did not recover within --pressure-timeout: memtrail
         resumed the process and detached (never killed it), no report
    78   no process memtrail can attach to has that PID (none, 0 included, a
         zombie, a kernel thread, a thread of another process, or memtrail
         itself)";

/// `memtrail events --help`: the exit codes.
pub const EVENTS_HELP: &str = "\
Exit status:
    0    the events were written (or standard output was closed early)
    2    bad usage
    65   the file is not a memtrail binary event stream, or is corrupt: a
         checksum that does not match, a malformed record, a file cut short
         (the message names the record and its offset; lines before it may
         have been written to a stream output)
    66   the file cannot be read (also: not a regular file - a FIFO or a
         device is refused, not read)
    73   the output cannot be written, is the event stream itself, or
         names an existing file and --force was not given";

/// `memtrail bench --help`: the exit codes.
pub const BENCH_HELP: &str = "\
Exit status:
    0    every benchmark ran and its command exited 0 (and, with --baseline,
         nothing regressed)
    1    a benchmark's command exited nonzero or was killed, or with
         --baseline a metric regressed beyond its --threshold
    2    bad usage or input: an invalid suite (also: a benchmark that
         cannot be started - a working directory missing or not a
         directory, a NUL byte in its command or environment), a missing
         baseline, results (--from, --baseline) that are not valid, name a
         benchmark twice, or are not a regular file of at most 1 GiB
    73   the results cannot be written (--output, the results directory),
         --output is a file the bench reads (the suite, --from, the
         baseline's results), or --output names an existing file (or a
         JSON document's existing STEM.profiles/) and --force was not
         given
  A capture that failed (no profile) ends the bench with the exit status of
  its `memtrail run` (e.g. 71 lost events, 72 missing privileges, 127 the
  command was not found); its message is above it on stderr.";

/// `memtrail compare --help`: the exit codes.
pub const COMPARE_HELP: &str = "\
Exit status:
    0    nothing regressed
    1    a metric of a benchmark regressed beyond its --threshold (or its
         command no longer exits 0)
    2    bad usage or input (a file that is not memtrail bench results or a
         profile, or not a regular file of at most 1 GiB; results naming a
         benchmark twice; an empty --threshold, or a metric's limit given
         twice; an unknown benchmark for --format flamegraph)
    73   the report cannot be written, --output is BASE or NEW, or
         --output names an existing file and --force was not given";

/// The exit code for a failed capture (`memtrail run`).
pub fn capture_code(err: &CaptureError) -> i32 {
    match err.kind() {
        ErrorKind::NotFound => NOT_FOUND,
        ErrorKind::NotExecutable => NOT_EXECUTABLE,
        ErrorKind::Output => OUTPUT,
        ErrorKind::InvalidArgument => USAGE,
        // As if the signal had ended memtrail, which it would have.
        ErrorKind::Interrupted => match err {
            CaptureError::Interrupted(sig) => 128 + sig,
            _ => INTERNAL,
        },
        ErrorKind::Unsupported => UNSUPPORTED,
        ErrorKind::Conflict => CONFLICT,
        ErrorKind::Attach => ATTACH,
        ErrorKind::Lost => LOST,
        ErrorKind::Pressure => PRESSURE,
        ErrorKind::State | ErrorKind::Internal => INTERNAL,
    }
}

/// The exit code for a failed `memtrail attach`.
pub fn attach_code(err: &CaptureError) -> i32 {
    match err {
        CaptureError::NoProcess(_)
        | CaptureError::NotAttachable { .. }
        | CaptureError::ThreadOf { .. } => NO_PROCESS,
        CaptureError::Pressure(p) if p.detached() => DETACHED,
        _ => capture_code(err),
    }
}

/// The exit code for a failed report.
pub fn report_code(err: &ReportError) -> i32 {
    match err {
        ReportError::Read { .. } => PROFILE_UNREADABLE,
        ReportError::Invalid { .. } | ReportError::Format { .. } | ReportError::Version { .. } => {
            PROFILE_INVALID
        }
        ReportError::NoSuchProcess { .. }
        | ReportError::DebuginfoDir { .. }
        | ReportError::Suppressions(_)
        | ReportError::ViewFormat { .. }
        | ReportError::CallsWithoutFocus => USAGE,
        ReportError::Output(_) | ReportError::Stdout(_) => OUTPUT,
    }
}

/// The exit code for a failed `memtrail events`.
pub fn events_code(err: &EventsError) -> i32 {
    match err {
        EventsError::Open { .. } | EventsError::Read(_) => PROFILE_UNREADABLE,
        EventsError::Write(_) | EventsError::Output(_) => OUTPUT,
        EventsError::NotBinary
        | EventsError::Version(_)
        | EventsError::Malformed { .. }
        | EventsError::Corrupt { .. }
        | EventsError::Truncated { .. } => PROFILE_INVALID,
    }
}

/// The exit code for a failed bench.
pub fn bench_code(err: &BenchError) -> i32 {
    match err {
        BenchError::SuiteRead { .. }
        | BenchError::SuiteInvalid { .. }
        | BenchError::Usage(_)
        | BenchError::ResultsRead { .. }
        | BenchError::ResultsInvalid { .. } => bench::BAD_INPUT,
        BenchError::Capture { code, .. } => *code,
        BenchError::Io { .. } => bench::OUTPUT,
        BenchError::Spawn { .. } | BenchError::Profile { .. } => bench::INTERNAL,
    }
}

/// The exit code for a failed compare.
pub fn compare_code(err: &CompareError) -> i32 {
    match err {
        CompareError::Output(_) | CompareError::Stdout(_) => bench::OUTPUT,
        _ => bench::BAD_INPUT,
    }
}

/// The exit code of writing `what` (a completion script, a man page) to
/// standard output: 0 also when the reader closed it early (`| head`),
/// [`OUTPUT`] when it could not be written, said on `stderr`.
pub fn written_code(
    result: std::io::Result<()>,
    what: &str,
    stderr: &mut impl std::io::Write,
) -> i32 {
    match result {
        Ok(()) => 0,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(err) => {
            let _ = writeln!(stderr, "memtrail: error: writing {what}: {err}");
            OUTPUT
        }
    }
}
