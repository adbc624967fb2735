//! Starting the command and following its process tree.
//!
//! The command is forked held: the child waits on a pipe until memtrail has
//! put its pid into the BPF tracked map, then execs, so the tracked tree
//! includes it from its first instruction (ld.so, constructors). The
//! tracked map then follows forks in BPF.
//!
//! memtrail is the tree's subreaper: orphaned descendants are re-parented to
//! it, so waiting until no child is left means the whole tree has exited.

pub mod cgroup;
pub mod stops;

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::sys::{self, ChildExit, Credentials, ExecFailure, ExecPlan, HeldChild, SysError};

/// Errors starting the command.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("command not found: {0}")]
    NotFound(String),
    #[error("command is not an executable file: {}", .0.display())]
    NotExecutable(PathBuf),
    /// The command exists, perhaps, but a directory on its path denies
    /// memtrail search permission (`execve` would fail with EACCES).
    #[error(
        "permission denied: cannot reach {}: no search permission on the directory {}",
        path.display(),
        dir.display()
    )]
    PermissionDenied { path: PathBuf, dir: PathBuf },
    #[error("argument contains a NUL byte: {0:?}")]
    Nul(OsString),
    #[error("could not start {}", path.display())]
    Exec {
        path: PathBuf,
        #[source]
        source: ExecFailure,
    },
    #[error(transparent)]
    Sys(#[from] SysError),
}

/// The command to run, resolved and checked before anything starts.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub path: PathBuf,
    pub argv: Vec<OsString>,
    /// Set when memtrail runs under sudo: the command runs as the invoking
    /// user.
    pub creds: Option<Credentials>,
    /// An object put first in the command's `LD_PRELOAD` (memtrail's
    /// preload shim, `--preload`).
    pub preload: Option<PathBuf>,
    /// memtrail's pid, offering the preload shim's ring path
    /// (`MEMTRAIL_SHM`, `src/ring/shim.rs`).
    pub rings_offer: Option<u32>,
}

impl CommandSpec {
    /// Resolves `argv[0]` like execvp does and checks it is executable.
    pub fn new(argv: Vec<OsString>) -> Result<Self, SpawnError> {
        let first = argv
            .first()
            .ok_or_else(|| SpawnError::NotFound(String::new()))?;
        let path = resolve(first)?;
        Ok(Self {
            path,
            argv,
            creds: sudo_credentials(),
            preload: None,
            rings_offer: None,
        })
    }

    fn plan(&self) -> Result<ExecPlan, SpawnError> {
        let cstr = |s: &OsStr| CString::new(s.as_bytes()).map_err(|_| SpawnError::Nul(s.into()));
        Ok(ExecPlan {
            path: cstr(self.path.as_os_str())?,
            argv: self
                .argv
                .iter()
                .map(|a| cstr(a))
                .collect::<Result<_, _>>()?,
            creds: self.creds.clone(),
            env: self.env(),
        })
    }

    /// The command's environment when it is not memtrail's own: the
    /// invoking user's under sudo, with the preload object first in
    /// `LD_PRELOAD`.
    fn env(&self) -> Option<Vec<CString>> {
        let env = self.creds.as_ref().and_then(user_env);
        let Some(preload) = &self.preload else {
            return env;
        };
        let env = env.unwrap_or_else(|| {
            std::env::vars_os()
                .filter_map(|(name, value)| env_entry(&name, &value))
                .collect()
        });
        let mut env = with_preload(env, preload);
        env.retain(|e| !e.as_bytes().starts_with(b"MEMTRAIL_SHM="));
        if let Some(pid) = self.rings_offer {
            env.extend(env_entry(
                OsStr::new("MEMTRAIL_SHM"),
                OsStr::new(&pid.to_string()),
            ));
        }
        Some(env)
    }
}

/// `env` with `preload` first in its `LD_PRELOAD` (the objects it named
/// after it, in their order).
fn with_preload(mut env: Vec<CString>, preload: &Path) -> Vec<CString> {
    const NAME: &[u8] = b"LD_PRELOAD=";
    let mut value = preload.as_os_str().as_bytes().to_vec();
    if let Some(at) = env.iter().position(|e| e.as_bytes().starts_with(NAME)) {
        let old = env.remove(at);
        let rest = &old.as_bytes()[NAME.len()..];
        if !rest.is_empty() {
            value.push(b':');
            value.extend_from_slice(rest);
        }
    }
    env.extend(env_entry(
        OsStr::new("LD_PRELOAD"),
        OsStr::from_bytes(&value),
    ));
    env
}

/// `NAME=value`, if neither has a NUL.
fn env_entry(name: &OsStr, value: &OsStr) -> Option<CString> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(b'=');
    bytes.extend_from_slice(value.as_bytes());
    CString::new(bytes).ok()
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Finds `cmd` in PATH unless it names a path. As `execvp`: a command
/// behind a directory memtrail may not search is denied (126), not missing
/// (127), and in PATH only when no directory has it.
pub fn resolve(cmd: &OsStr) -> Result<PathBuf, SpawnError> {
    let name = cmd.to_string_lossy().into_owned();
    if cmd.is_empty() {
        return Err(SpawnError::NotFound(name));
    }
    if cmd.as_bytes().contains(&b'/') {
        let path = PathBuf::from(cmd);
        return match path.metadata() {
            Ok(_) if is_executable(&path) => Ok(path),
            Ok(_) => Err(SpawnError::NotExecutable(path)),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(denied(path)),
            Err(_) => Err(SpawnError::NotFound(name)),
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut found_not_exec = None;
    let mut found_denied = None;
    for dir in std::env::split_paths(&search) {
        let candidate = dir.join(cmd);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
        match candidate.metadata() {
            Ok(m) if m.is_file() && found_not_exec.is_none() => found_not_exec = Some(candidate),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                found_denied.get_or_insert(candidate);
            }
            _ => {}
        }
    }
    Err(match (found_not_exec, found_denied) {
        (Some(path), _) => SpawnError::NotExecutable(path),
        (None, Some(path)) => denied(path),
        (None, None) => SpawnError::NotFound(name),
    })
}

/// The error for `path`, which memtrail may not reach: names the first
/// directory on the way that denies search permission (its entries cannot
/// be looked up), else the path's own parent.
fn denied(path: PathBuf) -> SpawnError {
    let absolute = std::env::current_dir()
        .map(|cwd| cwd.join(&path))
        .unwrap_or_else(|_| path.clone());
    let mut dir = PathBuf::new();
    let mut blocked = None;
    for part in absolute.components() {
        let next = dir.join(part);
        if !dir.as_os_str().is_empty()
            && next
                .symlink_metadata()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
        {
            blocked = Some(dir);
            break;
        }
        dir = next;
    }
    let dir = blocked.unwrap_or_else(|| {
        absolute
            .parent()
            .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
    });
    SpawnError::PermissionDenied { path, dir }
}

/// The invoking user's identity when root runs memtrail through sudo.
fn sudo_credentials() -> Option<Credentials> {
    if !rustix::process::geteuid().is_root() {
        return None;
    }
    let uid: u32 = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    let gid: u32 = std::env::var("SUDO_GID").ok()?.parse().ok()?;
    if uid == 0 {
        return None;
    }
    Credentials::for_user(uid, gid).ok()
}

/// memtrail's environment as `sudo -u USER` would pass it on: `HOME`,
/// `USER`, `LOGNAME` and `SHELL` from the user's passwd entry instead of
/// root's (a `SHELL` left empty in passwd is `/bin/sh`, as login does),
/// everything else as it is. `None` without a passwd entry: the
/// environment stays memtrail's.
fn user_env(creds: &Credentials) -> Option<Vec<CString>> {
    let user = creds.user.as_ref()?;
    let shell: &OsStr = if user.shell.is_empty() {
        OsStr::new("/bin/sh")
    } else {
        &user.shell
    };
    let set: [(&str, &OsStr); 4] = [
        ("HOME", &user.home),
        ("USER", &user.name),
        ("LOGNAME", &user.name),
        ("SHELL", shell),
    ];
    // A name or value from the environment or passwd has no NUL.
    let entry = env_entry;
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(name, _)| !set.iter().any(|(n, _)| name == n))
        .filter_map(|(name, value)| entry(&name, &value))
        .collect();
    env.extend(set.iter().filter_map(|(n, v)| entry(OsStr::new(n), v)));
    Some(env)
}

/// The invoking user's uid and gid when root runs memtrail through sudo:
/// whom the command runs as, and whom the files memtrail writes belong to.
pub fn invoking_user() -> Option<(u32, u32)> {
    sudo_credentials().map(|c| (c.uid, c.gid))
}

/// A command forked and waiting to exec.
pub struct Held {
    child: HeldChild,
    path: PathBuf,
}

impl Held {
    pub fn pid(&self) -> u32 {
        self.child.pid.get()
    }

    /// Lets the command exec; returns once it did.
    pub fn release(self) -> Result<u32, SpawnError> {
        let path = self.path;
        self.child
            .release()
            .map(sys::Pid::get)
            .map_err(|source| SpawnError::Exec { path, source })
    }
}

/// Forks the command, held before exec; with `subreaper`, memtrail first
/// becomes the subreaper of its tree (a process-wide effect: the CLI's).
pub fn spawn_held(spec: &CommandSpec, subreaper: bool) -> Result<Held, SpawnError> {
    let plan = spec.plan()?;
    if subreaper {
        sys::set_child_subreaper()?;
    }
    let child = sys::fork_held(&plan)?;
    Ok(Held {
        child,
        path: spec.path.clone(),
    })
}

/// Waits until every process of the tree has exited; returns how the root
/// ended.
pub fn wait_tree(root: u32) -> Result<Option<ChildExit>, SysError> {
    let mut root_exit = None;
    while let Some((pid, exit)) = sys::wait_any()? {
        if pid.get() == root {
            root_exit = Some(exit);
        }
    }
    Ok(root_exit)
}

#[cfg(test)]
mod tests {
    use super::with_preload;
    use std::ffi::CString;
    use std::path::Path;

    fn env(entries: &[&str]) -> Vec<CString> {
        entries.iter().map(|e| CString::new(*e).unwrap()).collect()
    }

    /// Check that the preload shim goes first in `LD_PRELOAD`, before the
    /// objects the user preloads, and that the rest of the environment
    /// stays.
    #[test]
    fn preload_goes_first_in_ld_preload() {
        let shim = Path::new("/proc/1/fd/7");
        assert_eq!(
            with_preload(env(&["A=1", "LD_PRELOAD=libjemalloc.so.2 x.so"]), shim),
            env(&["A=1", "LD_PRELOAD=/proc/1/fd/7:libjemalloc.so.2 x.so"])
        );
        assert_eq!(
            with_preload(env(&["A=1"]), shim),
            env(&["A=1", "LD_PRELOAD=/proc/1/fd/7"])
        );
        assert_eq!(
            with_preload(env(&["LD_PRELOAD="]), shim),
            env(&["LD_PRELOAD=/proc/1/fd/7"])
        );
    }
}
