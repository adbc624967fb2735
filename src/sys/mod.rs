//! The only place that issues system calls, split by concern:
//!
//! - `process`: the [`Pid`] type, pidfds, `kill`, thread states, the PID
//!   namespace, the child-subreaper flag, real-time priority;
//! - `wait`: waiting for children, [`ChildExit`];
//! - `spawn`: the command's fork, held before exec, and its identity;
//! - `guardian`: the process that thaws and resumes the tree after memtrail;
//! - `keeper`: the process that holds the preload shim for a command run as
//!   another user;
//! - `fd`: pipes, reads and writes, eventfd, epoll, poll;
//! - `sigmask`: memtrail's signal dispositions and masks, signalfd;
//! - [`signals`]: the signals memtrail passes on to the command;
//! - `bpf`: BPF maps and uprobe_multi links by descriptor;
//! - `host`: capabilities, the kernel log, clocks, file ids.
//!
//! Calls go through rustix wherever it has them. Raw libc stays where it
//! has nothing (NSS lookups, klogctl, signalfd, sigaction and sigprocmask,
//! fork) and wherever only async-signal-safe calls belong (the forked child
//! before exec, the guardian's fork and the guardian, the shim's keeper,
//! the signal handler); each such place says so. Every item is re-exported here, so
//! callers name `crate::sys::…`.
//!
//! Each wrapper names its call in the error and keeps the `io::Error` as the
//! source. Callers above this module see safe functions only.

use std::io;

mod bpf;
mod cpus;
mod fd;
mod guardian;
mod host;
mod keeper;
mod process;
mod sigmask;
pub mod signals;
mod spawn;
mod wait;

pub use bpf::{
    UprobeKind, bpf_map_contains, bpf_map_delete, bpf_map_u32_keys, bpf_map_update, uprobe_multi,
};
pub use cpus::{StartupCpus, StartupPin};
pub use fd::{
    DoubleMap, FileData, MAX_READ_IMAGE, contents, epoll_for, epoll_wait, epoll_wait_for, eventfd,
    eventfd_signal, map_file, open_regular, pipe, poll_readable, read, sealed_memfd, sized_memfd,
    take_memfd, write_all,
};
pub use guardian::{GUARDIAN_NAME, Guardian, GuardianCgroup, GuardianMaps};
pub use host::{
    FileId, dumpable, has_capability, kernel_dev, kernel_file_id, kernel_log_tail, kernel_release,
    monotonic_ns, rcu_grace_period,
};
pub use keeper::ShimKeeper;
pub use process::{
    INIT_PID_NS_INO, Pid, ThreadStates, gettid, kill, pid_namespace, pidfd_check_alive, pidfd_open,
    pidfd_open_thread, pidfd_send_signal, read_maps, set_child_subreaper, set_thread_nice,
    set_thread_realtime, stop_self, thread_states, wait_pidfd,
};
pub use rustix::process::Signal;
pub use sigmask::{block_signals, ignore_signal, read_signal, signalfd};
pub use spawn::{Credentials, ExecFailure, ExecPlan, HeldChild, PasswdEntry, fork_held};
pub use wait::{ChildExit, wait_any, wait_exited, wait_pid};

/// A failed system call: its name and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed")]
pub struct SysError {
    pub call: &'static str,
    #[source]
    pub source: io::Error,
}

impl SysError {
    fn last(call: &'static str) -> Self {
        Self {
            call,
            source: io::Error::last_os_error(),
        }
    }

    /// Wraps the error rustix returned for `call`.
    fn rustix(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> Self {
        move |errno| Self {
            call,
            source: errno.into(),
        }
    }

    /// The OS error number.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

pub type SysResult<T> = Result<T, SysError>;

fn check(call: &'static str, ret: libc::c_int) -> SysResult<libc::c_int> {
    if ret < 0 {
        Err(SysError::last(call))
    } else {
        Ok(ret)
    }
}

/// `err` and its sources, `: `-separated (as anyhow's `{:#}`): a one-line
/// reason.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
        source = cause.source();
    }
    msg
}

/// The key of an image in the BPF `unwind_images` map (`struct image_id`):
/// its device (kernel encoding) and inode.
pub fn image_key(FileId { dev, ino }: FileId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&dev.to_ne_bytes());
    key[8..].copy_from_slice(&ino.to_ne_bytes());
    key
}

/// The message of a caught panic.
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}
