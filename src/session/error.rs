//! The capture error type and its [`ErrorKind`].

use std::time::Duration;

use crate::attach::AttachError;
use crate::output::{CommitError, OutputError, SameOutputError};
use crate::pressure::RoomError;
use crate::proctree::SpawnError;
use crate::profile::LostEvents;
use crate::ring::RingError;
use crate::sys::{self, SysError};

use super::MAX_STACK_DEPTH;

impl From<crate::attach::per_process::Unsupported> for CaptureError {
    fn from(u: crate::attach::per_process::Unsupported) -> Self {
        CaptureError::KernelFeature {
            feature: u.feature,
            hint: u.hint,
        }
    }
}

/// Why a capture failed. Each variant maps to a documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The outputs of a capture that succeeded could not all be written:
    /// none was put in place.
    #[error(transparent)]
    Outputs(#[from] CommitError),
    #[error(transparent)]
    SameOutput(#[from] SameOutputError),
    #[error(
        "{} received before the command started: nothing was run and no output written",
        sys::signals::name(*.0)
    )]
    Interrupted(i32),
    #[error(
        "memtrail lacks {}: run it as root, or give it the capabilities it needs \
         (setcap {CAPABILITIES}+ep memtrail)",
        .0.join(", ")
    )]
    Privileges(Vec<&'static str>),
    #[error("this kernel lacks {feature}: {hint}")]
    KernelFeature {
        feature: &'static str,
        hint: &'static str,
    },
    #[error("loading the BPF programs failed (the kernel rejected them; see the log above)")]
    Load(#[source] libbpf_rs::Error),
    #[error("attaching the {what} failed")]
    AttachTracepoint {
        what: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error("probing {image} (mapped by process {pid}) failed")]
    AttachImage {
        image: String,
        pid: u32,
        #[source]
        source: AttachError,
    },
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(
        "events were lost ({} on the events ring, {} on the stack ring, {} on the \
         mappings ring, {} attach requests, {} untracked calls or processes, {} \
         processes resumed before their probes existed): the capture is incomplete \
         and no report was written; {}",
        .0.events, .0.stacks, .0.mappings, .0.attach, .0.tracking, .0.resumed, .1
    )]
    Lost(LostEvents, String),
    #[error("--stack-depth {0} is more than the {MAX_STACK_DEPTH} frames a stack record holds")]
    StackDepth(u32),
    #[error(transparent)]
    Pressure(#[from] crate::pressure::PressureError),
    #[error(transparent)]
    Room(#[from] RoomError),
    #[error("{0} records could not be decoded: memtrail's BPF and userspace disagree")]
    Malformed(u64),
    #[error("writing the event stream failed")]
    EventStream(#[source] std::io::Error),
    #[error("the events pipeline did not drain within {0:?}")]
    DrainTimeout(Duration),
    #[error("a poller thread panicked")]
    PollerPanicked,
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error("invalid options: {0}")]
    InvalidOptions(&'static str),
    #[error("--debuginfo-dir {}: not a directory", .0.display())]
    DebuginfoDir(std::path::PathBuf),
    #[error("no process has pid {0}")]
    NoProcess(u32),
    #[error("cannot attach to process {pid}: {why}")]
    NotAttachable { pid: u32, why: &'static str },
    #[error("{tid} is a thread of process {pid}, not a process: attach to {pid}")]
    ThreadOf { tid: u32, pid: u32 },
    #[error("{0}")]
    State(&'static str),
    #[error("injected failure (MEMTRAIL_FAULT=fail-after-start)")]
    Injected,
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// What kind of failure a [`CaptureError`] is: the CLI maps it to an exit
/// code, the C ABI to an error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad options or arguments (usage).
    InvalidArgument,
    /// A call that does not fit the session's state (no region open, no
    /// tree to wait for).
    State,
    /// The command was not found.
    NotFound,
    /// The command is not executable.
    NotExecutable,
    /// An output cannot be written.
    Output,
    /// Missing privileges or kernel feature, or the BPF programs did not load.
    Unsupported,
    /// Another tracer holds a conflicting uprobe.
    Conflict,
    /// An image the tree loaded could not be examined or probed.
    Attach,
    /// Events were lost.
    Lost,
    /// A pressure pause did not recover in time.
    Pressure,
    /// A terminating signal came before the command started.
    Interrupted,
    /// Anything else: memtrail itself failed.
    Internal,
}

impl CaptureError {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        use crate::sys::ExecFailure;
        match self {
            Self::Spawn(SpawnError::NotFound(_)) => ErrorKind::NotFound,
            Self::Spawn(SpawnError::NotExecutable(_) | SpawnError::PermissionDenied { .. }) => {
                ErrorKind::NotExecutable
            }
            Self::Spawn(SpawnError::Nul(_)) => ErrorKind::InvalidArgument,
            Self::Spawn(SpawnError::Sys(_)) => ErrorKind::Internal,
            Self::Spawn(SpawnError::Exec { source, .. }) => match source {
                ExecFailure::Exec(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    ErrorKind::NotFound
                }
                ExecFailure::Exec(_) => ErrorKind::NotExecutable,
                ExecFailure::Credentials(_) | ExecFailure::Sys(_) => ErrorKind::Internal,
            },
            Self::Output(_) | Self::Outputs(_) | Self::EventStream(_) => ErrorKind::Output,
            Self::SameOutput(_)
            | Self::Room(_)
            | Self::InvalidOptions(_)
            | Self::DebuginfoDir(_)
            | Self::StackDepth(_)
            | Self::Ring(RingError::BadSize(_)) => ErrorKind::InvalidArgument,
            Self::State(_) => ErrorKind::State,
            Self::NoProcess(_) => ErrorKind::NotFound,
            Self::NotAttachable { .. } | Self::ThreadOf { .. } => ErrorKind::InvalidArgument,
            Self::Interrupted(_) => ErrorKind::Interrupted,
            Self::Privileges(_) | Self::KernelFeature { .. } | Self::Load(_) => {
                ErrorKind::Unsupported
            }
            Self::Attach(AttachError::Conflict { .. })
            | Self::AttachImage {
                source: AttachError::Conflict { .. },
                ..
            } => ErrorKind::Conflict,
            Self::Attach(_) | Self::AttachTracepoint { .. } => ErrorKind::Unsupported,
            Self::AttachImage { .. } => ErrorKind::Attach,
            Self::Lost(..) => ErrorKind::Lost,
            Self::Pressure(_) => ErrorKind::Pressure,
            Self::Ring(RingError::Map { .. })
            | Self::Malformed(..)
            | Self::DrainTimeout(..)
            | Self::PollerPanicked
            | Self::Sys(_)
            | Self::Injected
            | Self::Io { .. } => ErrorKind::Internal,
        }
    }
}

/// The capabilities memtrail needs without root, as `setcap` spells them.
/// CAP_SYS_ADMIN can stand for all three. (Every program attaches by BTF
/// name or through `uprobe_multi` links: nothing is looked up in tracefs,
/// which only root may search.)
pub const CAPABILITIES: &str = "cap_bpf,cap_perfmon,cap_checkpoint_restore";

/// Checks, before anything is loaded, that memtrail may do what a capture
/// does; names every capability that is missing.
pub(crate) fn check_environment() -> Result<(), CaptureError> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    const CAP_CHECKPOINT_RESTORE: u32 = 40;
    let has = sys::has_capability;
    let admin = has(CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !admin && !has(CAP_BPF) {
        missing.push("CAP_BPF (to load BPF programs)");
    }
    if !admin && !has(CAP_PERFMON) {
        missing.push("CAP_PERFMON (to attach uprobes and tracepoints)");
    }
    if !admin && !has(CAP_CHECKPOINT_RESTORE) {
        missing.push(
            "CAP_CHECKPOINT_RESTORE (to open the files processes map, through /proc/PID/map_files)",
        );
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(CaptureError::KernelFeature {
            feature: "BTF (/sys/kernel/btf/vmlinux)",
            hint: "memtrail needs a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        });
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CaptureError::Privileges(missing))
    }
}
