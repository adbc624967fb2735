//! What `memtrail run` and `memtrail attach` share: their flags made into
//! a capture's [`Options`] with every output checked before anything runs,
//! a finished capture's [`Outcome`], and its end as the user sees it
//! ([`Tail`]: every output in place or none, the summary, a text report).
//!
//! Ownership: the session owns the BPF skeleton, the probe links and every
//! thread (see [`crate::session`]); a capture owns the output files until
//! it ended, writes them only when it succeeded, and hands them over
//! ([`Outcome::outputs`]) to be put in place together with the caller's.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use super::flags::{CaptureArgs, events_format};
use super::summary::write_summary_and_where;
use crate::events::writer::EventWriter;
use crate::output::{OutputError, OutputFile, Outputs, check_distinct};
use crate::profile::Profile;
use crate::report::{self, ReportOptions};
use crate::session::{self, CaptureError, SessionOptions};

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

/// What `run` and `attach` make of their shared flags before the capture
/// starts: its options, and what to do once it ended.
pub(super) struct Prepared {
    pub(super) opts: Options,
    pub(super) tail: Tail,
}

/// A capture's end as the user sees it: every output in place (or none),
/// the summary, a text report.
pub(super) struct Tail {
    /// Where the profile goes (`--output` or a name of its own).
    output: Option<PathBuf>,
    /// `--report` (with `--report-by`).
    report: Option<ReportOptions>,
    /// `--report-output`, opened.
    report_output: Option<OutputFile>,
    quiet: bool,
}

impl Tail {
    /// Puts every output in place, or none; then (unless quiet) `intro`
    /// and the summary, whether the outputs were written or not (issue
    /// 28); then a text report without `--report-output`.
    pub(super) fn conclude<W: Write>(
        self,
        stderr: &mut W,
        outputs: crate::output::Outputs,
        (profile, slow): (&crate::profile::Profile, &[crate::profile::SlowProbe]),
        intro: impl FnOnce(&mut W),
    ) -> Result<(), CaptureError> {
        // Only text gets here without --report-output (clap requires it
        // otherwise).
        let to_stderr = self.report.clone().filter(|_| self.report_output.is_none());
        let written = commit_outputs(
            outputs,
            profile,
            self.report.as_ref().zip(self.report_output),
        );
        if !self.quiet {
            intro(stderr);
            write_summary_and_where(
                stderr,
                profile,
                slow,
                self.output.as_deref(),
                written.is_ok(),
            );
        }
        if let Some(report) = to_stderr {
            if !self.quiet {
                let _ = writeln!(stderr);
            }
            let _ = report::write_report(profile, &report, stderr);
        }
        written
    }
}

impl CaptureArgs {
    /// Where the profile goes: `--output`, else a name of its own from
    /// `command` (said in the summary), or nowhere with `--quiet` (nothing
    /// would say it).
    fn output(&self, command: impl FnOnce() -> Vec<OsString>) -> Option<PathBuf> {
        match &self.output {
            Some(path) => Some(path.clone()),
            None if self.quiet => None,
            None => Some(default_profile_path(&command(), std::process::id())),
        }
    }

    /// The capture's options, with `--report-output` opened: every output
    /// is checked before anything runs.
    /// `named_after` is the argv whose program names the profile without
    /// `--output`.
    pub(super) fn prepare(
        self,
        command: Vec<OsString>,
        named_after: impl FnOnce() -> Vec<OsString>,
    ) -> Result<Prepared, CaptureError> {
        let output = self.output(named_after);
        let outputs: Vec<_> = [
            ("--output", &output),
            ("--events", &self.events),
            ("--report-output", &self.report_output),
        ]
        .into_iter()
        .filter_map(|(flag, path)| Some((flag, path.as_deref()?)))
        .collect();
        check_distinct(&outputs)?;
        let report_output = self
            .report_output
            .as_deref()
            .map(|path| {
                let out = OutputFile::create_with(path, self.force)?;
                // Under sudo, the invoking user's, as the command is.
                crate::proctree::invoking_user().map_or(Ok(()), |owner| out.give_to(owner))?;
                Ok::<_, crate::output::OutputError>(out)
            })
            .transpose()?;
        let opts = Options {
            command,
            output,
            events_format: events_format(self.events.as_deref(), self.events_format),
            events: self.events,
            replace_outputs: self.force,
            session: SessionOptions {
                ring_size: self.ring_size,
                stack_ring_size: self.stack_ring_size,
                stack_depth: self.stack_depth,
                python_frames: !self.native_only,
                unwind: self.unwind,
                probes: self.probes,
                event_rings: self.event_rings,
                pressure_timeout: self.pressure_timeout,
                watermark_percent: self.watermark,
                process_effects: false,
                faults: session::Faults::parse(
                    &std::env::var("MEMTRAIL_FAULT").unwrap_or_default(),
                ),
                live: None,
                timeline: !self.no_timeline,
                debuginfo_dirs: self.debuginfo_dirs,
                preload: false,
            },
        };
        let report = self.report.map(|format| ReportOptions {
            format,
            by: self.report_by.unwrap_or_default(),
            top: None,
            shaping: Default::default(),
        });
        Ok(Prepared {
            tail: Tail {
                output: opts.output.clone(),
                report,
                report_output,
                quiet: self.quiet,
            },
            opts,
        })
    }
}

/// Writes the --report file into `outputs` and puts them all in place, or
/// none of them.
fn commit_outputs(
    mut outputs: crate::output::Outputs,
    profile: &crate::profile::Profile,
    report: Option<(&ReportOptions, OutputFile)>,
) -> Result<(), CaptureError> {
    if let Some((opts, out)) = report {
        outputs.write(out, |out| report::stage_report(profile, opts, out));
    }
    Ok(outputs.commit()?)
}

/// Where the profile goes without --output: `memtrail.CMD.PID.json` in the
/// working directory, CMD the command's file name (characters other than
/// letters, digits, `-`, `_` and `.` as `_`), PID memtrail's own process id,
/// as heaptrack and memray name theirs.
pub fn default_profile_path(command: &[OsString], pid: u32) -> PathBuf {
    let name = command
        .first()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = name.trim_start_matches('.');
    let name = if name.is_empty() { "command" } else { name };
    PathBuf::from(format!("memtrail.{name}.{pid}.json"))
}
