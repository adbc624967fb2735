//! `memtrail run`'s capture: a [`Session`] on the command, with the CLI's
//! process effects, and its outputs.
//!
//! Ownership: the session owns the BPF skeleton, the probe links and every
//! thread (see [`crate::session`]); [`run`] owns the output files until the
//! capture ended, writes them only when it succeeded, and hands them over
//! ([`Outcome::outputs`]) to be put in place together with the caller's.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::events::writer::EventWriter;
use crate::output::{OutputError, OutputFile, Outputs};
use crate::proctree::CommandSpec;
use crate::profile::Profile;
use crate::session::{Finish, Session, SessionOptions, Target};
use crate::sys::ChildExit;

use crate::session::CaptureError;

/// What to capture and where to write it.
#[derive(Debug, Clone)]
pub struct Options {
    pub command: Vec<OsString>,
    pub output: Option<PathBuf>,
    pub events: Option<PathBuf>,
    /// How `events` is written.
    pub events_format: crate::events::writer::EventsFormat,
    /// Whether `output` and `events` may replace existing regular files
    /// (otherwise the capture fails before the command starts).
    pub replace_outputs: bool,
    /// The session's settings (`process_effects` is set by `run` and
    /// `attach`).
    pub session: SessionOptions,
}

/// A finished capture.
#[derive(Debug)]
pub struct Outcome {
    pub profile: Profile,
    /// Probe sites the kernel single-steps that the command went through.
    pub slow_probes: Vec<crate::profile::SlowProbe>,
    /// The exit code memtrail passes on: the command's, or 128 + signal.
    pub exit_code: i32,
    /// `--output` and `--events`, written but not yet in place: the caller
    /// adds its own (a report) and commits them together.
    pub outputs: Outputs,
}

impl Options {
    /// Fails when --output and --events name the same file.
    pub(crate) fn check_outputs(&self) -> Result<(), CaptureError> {
        let outputs: Vec<_> = [("--output", &self.output), ("--events", &self.events)]
            .into_iter()
            .filter_map(|(flag, path)| Some((flag, path.as_deref()?)))
            .collect();
        crate::output::check_distinct(&outputs)?;
        Ok(())
    }

    /// The session's settings; `process_effects` for a command memtrail
    /// starts (see [`SessionOptions::process_effects`]).
    pub(crate) fn session_options(&self, process_effects: bool) -> SessionOptions {
        SessionOptions {
            process_effects,
            ..self.session.clone()
        }
    }

    /// Opens --output and --events, given to `owner` (uid, gid) when set.
    pub(crate) fn open_outputs(
        &self,
        owner: Option<(u32, u32)>,
    ) -> Result<(Option<OutputFile>, Option<OutputFile>), OutputError> {
        let create = |path| {
            let out = OutputFile::create_with(path, self.replace_outputs)?;
            owner.map_or(Ok(()), |owner| out.give_to(owner))?;
            Ok::<_, OutputError>(out)
        };
        Ok((
            self.output.as_deref().map(create).transpose()?,
            self.events.as_deref().map(create).transpose()?,
        ))
    }

    /// The event stream writing into `events`, in --events' format.
    pub(crate) fn event_stream(
        &self,
        events: Option<OutputFile>,
    ) -> Result<Option<EventWriter>, CaptureError> {
        events
            .map(|out| EventWriter::new(out, self.events_format))
            .transpose()
            .map_err(CaptureError::EventStream)
    }
}

/// Runs one capture: `memtrail run`. Starts a [`Session`] on the command
/// (with the CLI's process effects), waits for its tree, and writes the
/// outputs if the capture succeeded (the caller commits them:
/// [`Outcome::outputs`]).
pub fn run(opts: &Options) -> Result<Outcome, CaptureError> {
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

/// Writes a finished capture's event stream and profile, not yet in place:
/// the caller commits them together with its own outputs, so that a file
/// appears only if every output could be written (issue 28). A stream whose
/// writing failed while the capture ran is that failure.
pub(crate) fn write_outputs(
    profile: &Profile,
    stream: Option<EventWriter>,
    stream_error: Option<std::io::Error>,
    output: Option<OutputFile>,
) -> Outputs {
    let mut outputs = Outputs::default();
    if let Some(stream) = stream {
        outputs.add(match stream_error {
            Some(source) => Err(OutputError {
                path: stream.path().to_owned(),
                source,
            }),
            None => stream.finish(),
        });
    }
    if let Some(output) = output {
        let mut phases = crate::session::phases::Phases::new("finish");
        outputs.write(output, |out| crate::output::stage_profile(profile, out));
        phases.done("profile written");
    }
    outputs
}
