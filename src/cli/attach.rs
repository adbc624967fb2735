//! `memtrail attach`: a [`Session`] on a running process, held until a
//! deadline, a signal to memtrail, the process's exit or a failed pressure
//! episode; then a detach that leaves the process running.
//!
//! Signals: SIGINT, SIGTERM and SIGHUP are blocked in every thread from
//! the start (the session's threads inherit the mask) and read from a
//! signalfd, so Ctrl-C ends the capture, never memtrail halfway. None of
//! them is passed on to the process: it is not memtrail's.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use super::capture::{Options, Prepared, write_outputs};
use super::flags::AttachArgs;
use super::status::with_status;
use crate::session::{CaptureError, Finish, Session, Target};
use crate::sys;

/// Runs `memtrail attach`; returns the exit code.
pub fn attach(args: AttachArgs, stderr: &mut impl Write) -> Result<i32, CaptureError> {
    let pid = args.pid;
    let quiet = args.capture.quiet;
    let Prepared { mut opts, tail } = args.capture.prepare(Vec::new(), || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(PathBuf::into_os_string)
            .unwrap_or_default();
        vec![exe]
    })?;
    let mut outcome = with_status(quiet, |live| {
        opts.session.live = live;
        capture(&opts, pid, args.duration, || {
            if !quiet {
                let until = match args.duration {
                    Some(d) => format!("for {d:?} (or until Ctrl-C)"),
                    None => "until Ctrl-C (SIGINT), SIGTERM or its exit".to_owned(),
                };
                let _ = writeln!(stderr, "memtrail: attached to process {pid}, {until}");
            }
        })
    })?;
    let why = match outcome.detach {
        Detach::Duration => "after --duration".to_owned(),
        Detach::Signal(sig) => format!("on {}", signal_name(sig)),
        Detach::Exited => "when it exited".to_owned(),
        Detach::PressureFailed => "after a failed pressure pause".to_owned(),
    };
    let seconds = outcome.profile.duration_ns as f64 / 1e9;
    tail.conclude(
        stderr,
        std::mem::take(&mut outcome.outputs),
        (&outcome.profile, &outcome.slow_probes),
        |stderr| {
            let _ = writeln!(
                stderr,
                "memtrail: attached to process {pid} for {seconds:.3} s; detached {why}"
            );
        },
    )?;
    Ok(0)
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        sig => crate::sys::signals::name(sig),
    }
}

/// The signals that end an attached capture.
const DETACH_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Why memtrail detached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detach {
    /// `--duration` passed.
    Duration,
    /// Memtrail received this signal.
    Signal(i32),
    /// The process exited.
    Exited,
    /// The pressure coordinator gave up ([`capture`] then fails).
    PressureFailed,
}

/// A finished attached capture.
#[derive(Debug)]
pub struct AttachOutcome {
    pub profile: crate::profile::Profile,
    pub slow_probes: Vec<crate::profile::SlowProbe>,
    pub detach: Detach,
    /// `--output` and `--events`, written but not yet in place (see
    /// [`Outcome::outputs`](super::capture::Outcome::outputs)).
    pub outputs: crate::output::Outputs,
}

/// The capture of `memtrail attach PID`. `opts.command` is unused. `attached` is called once the process is tracked (its events
/// from then on are in the capture). Outputs are written only if the
/// capture succeeded, and put in place by the caller.
fn capture(
    opts: &Options,
    pid: u32,
    duration: Option<Duration>,
    attached: impl FnOnce(),
) -> Result<AttachOutcome, CaptureError> {
    // Before any thread starts: they inherit the mask.
    sys::block_signals(&DETACH_SIGNALS)?;
    let signals = sys::signalfd(&DETACH_SIGNALS)?;
    opts.check_outputs()?;
    let session_opts = opts.session_options(false);
    let target = Target::Pid(pid);
    let (output, events) = opts.open_outputs(crate::proctree::invoking_user())?;
    let stream = opts.event_stream(events)?;
    let session = Session::start_with(&session_opts, target, stream)?;
    attached();
    let detach = wait_detach(&session, signals.as_fd(), duration)?;
    tracing::info!(pid, ?detach, "detaching");
    let Finish {
        profile,
        slow_probes,
        stream,
        stream_error,
        detaching,
        ..
    } = session.finish()?;
    let outputs = write_outputs(&profile, stream, stream_error, output);
    drop(detaching);
    Ok(AttachOutcome {
        profile,
        slow_probes,
        detach,
        outputs,
    })
}

/// Waits for the reason to detach. A failed pressure episode is no reason
/// of its own: [`Session::finish`] returns its error.
fn wait_detach(
    session: &Session,
    signals: std::os::fd::BorrowedFd<'_>,
    duration: Option<Duration>,
) -> Result<Detach, CaptureError> {
    let pidfd = session
        .target_pidfd()
        .ok_or(CaptureError::State("an attached session has a pidfd"))?;
    let fds = [signals, pidfd, session.pressure_failed_fd()];
    let deadline = duration.map(|d| std::time::Instant::now() + d);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        match sys::poll_readable(&fds, left)? {
            None => return Ok(Detach::Duration),
            Some(0) => {
                if let Some(sig) = sys::read_signal(signals)? {
                    return Ok(Detach::Signal(sig));
                }
            }
            Some(1) => return Ok(Detach::Exited),
            Some(_) => return Ok(Detach::PressureFailed),
        }
    }
}
