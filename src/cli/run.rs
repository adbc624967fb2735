//! `memtrail run`: a [`Session`] on a command memtrail starts, with the
//! CLI's process effects; its outputs, summary and exit code (the
//! command's).
//!
//! Signals: SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are caught before any
//! output is opened and passed on to the command once it runs
//! ([`crate::sys::signals`]); what became of each is said on stderr.

use std::io::{self, Write};

use super::capture::{Options, Outcome, Prepared, write_outputs};
use super::exit;
use super::flags::RunArgs;
use super::status::with_status;
use crate::proctree::CommandSpec;
use crate::session::{CaptureError, Finish, Session, Target};
use crate::sys::ChildExit;

/// Runs `memtrail run`; returns the process exit code.
pub fn run(args: RunArgs, stderr: &mut impl Write) -> Result<i32, CaptureError> {
    // Before any output is opened: SIGTERM and the like must not end
    // memtrail halfway (see sys::signals).
    crate::sys::signals::catch()?;
    let quiet = args.capture.quiet;
    let named_after = args.command.clone();
    let Prepared { mut opts, tail } = args.capture.prepare(args.command, || named_after)?;
    opts.session.preload = args.preload;
    let outcome = with_status(quiet, |live| {
        opts.session.live = live;
        capture(&opts)
    });
    // Even with --quiet: what memtrail did with a signal is not the summary.
    let _ = write_signal_notes(stderr);
    let mut outcome = outcome?;
    tail.conclude(
        stderr,
        std::mem::take(&mut outcome.outputs),
        (&outcome.profile, &outcome.slow_probes),
        |_| {},
    )?;
    // A process that corrupted its preload ring (issue 40): the profile is
    // written, naming it, but its counts are incomplete.
    let code = if !outcome.profile.anomalies.corrupt_rings.is_empty() {
        exit::RING_FAULT
    } else {
        outcome.exit_code
    };
    // memtrail exits next, and its memory goes with it: freeing a large
    // capture's stacks one by one took ~7 ms of python3.11's imports.
    std::mem::forget(outcome);
    Ok(code)
}

/// The capture of `memtrail run`: starts a [`Session`] on the command
/// (with the CLI's process effects), waits for its tree, and writes the
/// outputs if the capture succeeded (the caller commits them:
/// [`Outcome::outputs`]).
fn capture(opts: &Options) -> Result<Outcome, CaptureError> {
    // Everything that can fail on bad input fails before the command runs.
    opts.check_outputs()?;
    let session_opts = opts.session_options(true);
    let target = Target::Command(opts.command.clone());
    let spec = CommandSpec::new(opts.command.clone())?;
    // Under sudo, the files are the invoking user's, as the command is.
    let (output, events) = opts.open_outputs(spec.creds.as_ref().map(|c| (c.uid, c.gid)))?;
    if opts.session.faults.stop_after_outputs {
        crate::sys::stop_self();
    }
    let stream = opts.event_stream(events)?;
    let mut session = Session::start_with(&session_opts, target, stream)?;
    let waited = session.wait();
    let Finish {
        profile,
        slow_probes,
        exit,
        stream,
        stream_error,
        detaching,
    } = session.finish()?;
    waited?;
    let outputs = write_outputs(&profile, stream, stream_error, output);
    drop(detaching);
    Ok(Outcome {
        profile,
        slow_probes,
        exit_code: exit.root.map_or(0, ChildExit::code),
        outputs,
    })
}

/// Says what became of SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to
/// memtrail (SIGTERM or SIGHUP before the command started is the capture's
/// error instead).
fn write_signal_notes(w: &mut impl Write) -> io::Result<()> {
    use crate::sys::signals::{self, Fate};
    for (sig, fate) in signals::notes() {
        let name = signals::name(sig);
        match fate {
            Fate::Sent => writeln!(w, "memtrail: received {name}: passed it on to the command")?,
            Fate::Late => writeln!(
                w,
                "memtrail: received {name} after the command exited: nothing to pass it on to"
            )?,
            // The capture's error says it.
            Fate::Early if matches!(sig, libc::SIGTERM | libc::SIGHUP) => {}
            Fate::Early => writeln!(
                w,
                "memtrail: received {name} before the command started: ignored it"
            )?,
        }
    }
    Ok(())
}
