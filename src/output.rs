//! Output paths: written whole or not at all where they name a file,
//! written as a stream where they do not.
//!
//! [`OutputFile::create`] decides how a path is written, and opens it, before
//! the command starts, so an output that cannot be written fails first:
//! - `-`: standard output, as a stream.
//! - a FIFO or a character device (symlinks followed): opened for writing
//!   and written as a stream. Whole-or-nothing cannot hold for a stream (the
//!   event stream is written while the capture runs). A FIFO that no process
//!   has open for reading is refused rather than waited for.
//! - a regular file, or a path that names nothing yet: written whole or not
//!   at all. A symlink is followed to the file it names (a dangling one to
//!   the file it would name) and that file is replaced; the link stays. The
//!   data goes into an unnamed file (`O_TMPFILE`) in that file's directory,
//!   which [`OutputFile::commit`] links into place (`linkat`; over an
//!   existing file, linked under a temporary name `.NAME.XXXX.tmp` and
//!   renamed over it). Until the commit the data has no name, so however
//!   memtrail ends, SIGKILL included, no temporary file is left behind; only
//!   the replacement of an existing file names it, for the few system calls
//!   between the link and the rename (the other outputs of the command are
//!   linked in between, see below). Where the directory's filesystem has
//!   no `O_TMPFILE` (vfat, exFAT, NFS, some FUSE filesystems), a named
//!   temporary file `.NAME.XXXX.tmp` is created instead: it is removed on
//!   every way memtrail ends except SIGKILL.
//! - anything else (a directory, a block device, a socket) is refused.
//!
//! [`check_distinct`] refuses two outputs naming the same file: the same
//! inode, or the same directory entry yet to be created, whatever the paths;
//! [`check_not_input`] an output that is one of the command's inputs (by
//! device and inode: through a symlink, a hard link, or `-` when standard
//! output is that file), which it would destroy (issue 28).
//!
//! A command with several outputs writes them one after the other and puts
//! them in place together ([`Outputs`], [`commit_all`]): every file is
//! written and flushed to disk, then each is linked under its name (a free
//! name) or under a temporary one (to replace a file); a failure there
//! unlinks what was linked, so no output appears. Only then are the
//! temporary names renamed over the files they replace, which cannot fail
//! for want of room or of a free name. A stream (`-`, a FIFO, a device) is
//! written when its turn comes and cannot be taken back.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::profile::Profile;
use crate::sys::FileId;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use std::io::Write as _;
use tempfile::NamedTempFile;

/// Symlinks followed when resolving a dangling one, as the kernel's limit.
const MAX_SYMLINKS: usize = 40;

/// How a path is shown in messages: `-` is standard output.
fn shown(path: &Path) -> String {
    if is_stdout(path) {
        "standard output".to_owned()
    } else {
        path.display().to_string()
    }
}

fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Errors creating or committing an output file.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}", shown(path))]
pub struct OutputError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Outputs that failed together: the first error, and the outputs that were
/// therefore not written (none appears when one fails).
#[derive(Debug)]
pub struct CommitError {
    pub error: OutputError,
    /// Files that would have been written but for `error`.
    pub unwritten: Vec<PathBuf>,
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.error, self.error.source)?;
        if !self.unwritten.is_empty() {
            let names: Vec<String> = self.unwritten.iter().map(|p| shown(p)).collect();
            write!(
                f,
                "; so {} {} not written either (outputs are written together or not at all)",
                names.join(", "),
                if names.len() == 1 { "was" } else { "were" }
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for CommitError {}

/// Two outputs name the same file.
#[derive(Debug, thiserror::Error)]
#[error(
    "{first} and {second} name the same file ({}): give each output its own",
    shown(path)
)]
pub struct SameOutputError {
    pub first: &'static str,
    pub second: &'static str,
    pub path: PathBuf,
}

/// What an output path names, decided before anything is opened.
enum Target {
    /// `-`.
    Stdout,
    /// A FIFO or a character device, opened through the path as given.
    Stream,
    /// A regular file to replace, or one to create: its directory and name
    /// once symlinks are followed, and its (device, inode) if it exists.
    File {
        dir: PathBuf,
        name: OsString,
        existing: Option<FileId>,
    },
}

/// What makes two outputs the same file.
#[derive(Debug, PartialEq, Eq)]
enum Identity {
    Inode(FileId),
    /// A file yet to be created: its directory's identity and name.
    Entry(FileId, OsString),
}

fn refused(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "it is {what}; memtrail writes regular files, FIFOs, character devices and - (standard output)"
        ),
    )
}

/// Splits a file path into its directory (`.` when it has none) and name.
fn split(path: &Path) -> io::Result<(PathBuf, OsString)> {
    let not_a_name = || io::Error::new(io::ErrorKind::InvalidInput, "not a file name");
    // `Path` drops a trailing slash; the user meant a directory.
    if path.as_os_str().as_bytes().ends_with(b"/") {
        return Err(not_a_name());
    }
    let name = path.file_name().ok_or_else(not_a_name)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name.to_owned()))
}

/// Follows a chain of symlinks that ends at nothing; returns the path the
/// last link names (the file to create).
fn follow_dangling(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_owned();
    for _ in 0..MAX_SYMLINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let link = fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if link.is_relative() => dir.join(link),
                    _ => link,
                };
            }
            Ok(_) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

fn resolve(path: &Path) -> io::Result<Target> {
    if is_stdout(path) {
        return Ok(Target::Stdout);
    }
    match fs::metadata(path) {
        Ok(meta) => {
            let ft = meta.file_type();
            if ft.is_file() {
                let (dir, name) = split(&fs::canonicalize(path)?)?;
                Ok(Target::File {
                    dir,
                    name,
                    existing: Some(FileId::of(&meta)),
                })
            } else if ft.is_fifo() || ft.is_char_device() {
                Ok(Target::Stream)
            } else if ft.is_dir() {
                Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    "is a directory",
                ))
            } else if ft.is_block_device() {
                Err(refused("a block device"))
            } else {
                Err(refused("a socket"))
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let (dir, name) = split(&follow_dangling(path)?)?;
            Ok(Target::File {
                dir,
                name,
                existing: None,
            })
        }
        Err(e) => Err(e),
    }
}

/// The identity of what `path` names, if it can be found (a path that
/// cannot be resolved fails later, when it is created).
fn identity(path: &Path) -> Option<Identity> {
    let inode = |m: fs::Metadata| Identity::Inode(FileId::of(&m));
    match resolve(path).ok()? {
        Target::Stdout => {
            let stat = rustix::fs::fstat(io::stdout()).ok()?;
            Some(Identity::Inode(FileId::of_stat(&stat)))
        }
        Target::Stream => fs::metadata(path).ok().map(inode),
        Target::File {
            existing: Some(id), ..
        } => Some(Identity::Inode(id)),
        Target::File {
            dir,
            name,
            existing: None,
        } => {
            let m = fs::metadata(dir).ok()?;
            Some(Identity::Entry(FileId::of(&m), name))
        }
    }
}

/// Refuses two outputs, named by their flags, that are the same file.
pub fn check_distinct(outputs: &[(&'static str, &Path)]) -> Result<(), SameOutputError> {
    let ids: Vec<_> = outputs
        .iter()
        .map(|&(flag, path)| (flag, path, identity(path)))
        .collect();
    for (i, (first, _, a)) in ids.iter().enumerate() {
        for (second, path, b) in &ids[i + 1..] {
            if a.is_some() && a == b {
                return Err(SameOutputError {
                    first,
                    second,
                    path: path.to_path_buf(),
                });
            }
        }
    }
    Ok(())
}

/// Refuses an output that is one of the command's inputs: `inputs` are
/// each input's description (`the profile`), path and device and inode (as
/// read, as `memtrail report` identifies its input).
pub fn check_not_input(output: &Path, inputs: &[(&str, &Path, FileId)]) -> Result<(), OutputError> {
    let Some(Identity::Inode(output_id)) = identity(output) else {
        // A file yet to be created is no input.
        return Ok(());
    };
    match inputs.iter().find(|(_, _, id)| *id == output_id) {
        Some((what, path, _)) => Err(OutputError {
            path: output.to_owned(),
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "it is {what} being read ({}): memtrail never writes over an input; name \
                     another output",
                    path.display()
                ),
            ),
        }),
        None => Ok(()),
    }
}

/// How the data reaches its destination.
#[derive(Debug)]
enum Kind {
    /// An unnamed file in `dir`, linked in as `name` on commit.
    Unnamed {
        file: File,
        dir: OwnedFd,
        name: OsString,
    },
    /// A named temporary file renamed to `target` on commit (filesystems
    /// without O_TMPFILE).
    Named { tmp: NamedTempFile, target: PathBuf },
    /// Written in place: standard output, a FIFO, a character device.
    Stream(File),
}

/// An output, opened before the command starts (see the module docs).
#[derive(Debug)]
pub struct OutputFile {
    kind: Kind,
    path: PathBuf,
    /// Whether an existing regular file may be replaced.
    replace: bool,
}

/// Why an existing file was not replaced.
fn exists() -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        "it exists, and memtrail replaces a file only with --force",
    )
}

impl OutputFile {
    /// Resolves `path` and opens what will receive the data; an existing
    /// regular file is replaced on commit.
    pub fn create(path: &Path) -> Result<Self, OutputError> {
        Self::create_with(path, true)
    }

    /// Like [`create`](Self::create), but unless `replace`, a regular file
    /// that `path` names (through symlinks) is refused, now and, should one
    /// appear meanwhile, on commit. Streams (`-`, FIFOs, character devices)
    /// are written whatever `replace` says: they are not replaced.
    pub fn create_with(path: &Path, replace: bool) -> Result<Self, OutputError> {
        let err = |source| OutputError {
            path: path.to_owned(),
            source,
        };
        let kind = match resolve(path).map_err(err)? {
            Target::Stdout => {
                let fd =
                    rustix::io::fcntl_dupfd_cloexec(io::stdout(), 0).map_err(|e| err(e.into()))?;
                Kind::Stream(File::from(fd))
            }
            Target::Stream => Kind::Stream(open_stream(path).map_err(err)?),
            Target::File {
                existing: Some(_), ..
            } if !replace => return Err(err(exists())),
            Target::File { dir, name, .. } => open_file(&dir, name).map_err(err)?,
        };
        Ok(Self {
            kind,
            path: path.to_owned(),
            replace,
        })
    }

    /// Gives the file to be committed to `uid`:`gid` (under sudo, the
    /// invoking user), before anything is written or linked: it appears
    /// theirs. A stream is not memtrail's to give.
    pub fn give_to(&self, (uid, gid): (u32, u32)) -> Result<(), OutputError> {
        let file = match &self.kind {
            Kind::Unnamed { file, .. } => file,
            Kind::Named { tmp, .. } => tmp.as_file(),
            Kind::Stream(_) => return Ok(()),
        };
        rustix::fs::fchown(
            file,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(|e| OutputError {
            path: self.path.clone(),
            source: e.into(),
        })
    }

    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file to write into.
    pub fn file(&self) -> &File {
        match &self.kind {
            Kind::Unnamed { file, .. } | Kind::Stream(file) => file,
            Kind::Named { tmp, .. } => tmp.as_file(),
        }
    }

    /// Puts a file in place, flushed to disk; a stream is already written.
    pub fn commit(self) -> Result<(), OutputError> {
        commit_all(vec![self]).map_err(|e| e.error)
    }

    /// Whether the output is a file put in place on commit (not a stream).
    pub fn is_file(&self) -> bool {
        !matches!(self.kind, Kind::Stream(_))
    }

    /// Flushes the file's data to disk.
    fn sync(&self) -> Result<(), OutputError> {
        let file = match &self.kind {
            Kind::Stream(_) => return Ok(()),
            Kind::Unnamed { file, .. } => file,
            Kind::Named { tmp, .. } => tmp.as_file(),
        };
        file.sync_all().map_err(|source| OutputError {
            path: self.path.clone(),
            source,
        })
    }

    /// Links the file under its name, if free, or under a temporary name to
    /// be renamed over the file it replaces (see [`commit_all`]).
    fn place(self) -> Result<Placed, OutputError> {
        let OutputFile {
            kind,
            path,
            replace,
        } = self;
        let err = |source| OutputError {
            path: path.clone(),
            source,
        };
        match kind {
            Kind::Stream(_) => Ok(Placed::Stream),
            Kind::Unnamed { file, dir, name } => {
                let id = file_id(&file).map_err(err)?;
                match link_unnamed(&file, &dir, &name) {
                    Ok(()) => Ok(Placed::New { dir, name, id }),
                    // linkat never replaces: a file that appeared meanwhile
                    // stays, unless replacing was asked for.
                    Err(Errno::EXIST) if !replace => Err(err(exists())),
                    Err(Errno::EXIST) => {
                        let tmp = link_temporary(&file, &dir, &name).map_err(err)?;
                        Ok(Placed::Pending {
                            dir,
                            tmp,
                            name,
                            path,
                        })
                    }
                    Err(e) => Err(err(e.into())),
                }
            }
            Kind::Named { tmp, target } if replace => {
                Ok(Placed::NamedPending { tmp, target, path })
            }
            Kind::Named { tmp, target } => {
                let id = file_id(tmp.as_file()).map_err(err)?;
                tmp.persist_noclobber(&target)
                    .map_err(|e| match e.error.kind() {
                        io::ErrorKind::AlreadyExists => err(exists()),
                        _ => err(e.error),
                    })?;
                Ok(Placed::NewPath { path: target, id })
            }
        }
    }
}

/// The device and inode of an open file.
fn file_id(file: &File) -> io::Result<FileId> {
    let m = file.metadata()?;
    Ok(FileId::of(&m))
}

/// An output linked into its directory, not yet final (see [`commit_all`]).
enum Placed {
    /// A stream: already written, nothing to undo or finish.
    Stream,
    /// Linked under its name, which was free; undone by unlinking it.
    New {
        dir: OwnedFd,
        name: OsString,
        id: FileId,
    },
    /// A named temporary file renamed to its free name `path`.
    NewPath { path: PathBuf, id: FileId },
    /// Linked under `tmp`, to be renamed over `name`.
    Pending {
        dir: OwnedFd,
        tmp: OsString,
        name: OsString,
        path: PathBuf,
    },
    /// A named temporary file, to be renamed over `target`.
    NamedPending {
        tmp: NamedTempFile,
        target: PathBuf,
        path: PathBuf,
    },
}

impl Placed {
    /// Takes the output back out of its directory: an output that another
    /// failed output keeps from appearing.
    fn undo(self) {
        let ours = |m: rustix::fs::Stat, id: FileId| FileId::of_stat(&m) == id;
        match self {
            Placed::Stream | Placed::NamedPending { .. } => {}
            Placed::New { dir, name, id } => {
                // Only if the name still is this output (not a file put
                // there since).
                if rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|m| ours(m, id))
                {
                    let _ = rustix::fs::unlinkat(&dir, &name, AtFlags::empty());
                }
            }
            Placed::NewPath { path, id } => {
                if fs::symlink_metadata(&path).is_ok_and(|m| FileId::of(&m) == id) {
                    let _ = fs::remove_file(&path);
                }
            }
            Placed::Pending { dir, tmp, .. } => {
                let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
            }
        }
    }

    /// Renames a temporary name over the file it replaces.
    fn finish(self) -> Result<(), OutputError> {
        match self {
            Placed::Stream | Placed::New { .. } | Placed::NewPath { .. } => Ok(()),
            Placed::Pending {
                dir,
                tmp,
                name,
                path,
            } => rustix::fs::renameat(&dir, &tmp, &dir, &name).map_err(|e| {
                let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
                OutputError {
                    path,
                    source: e.into(),
                }
            }),
            Placed::NamedPending { tmp, target, path } => {
                tmp.persist(&target).map(drop).map_err(|e| OutputError {
                    path,
                    source: e.error,
                })
            }
        }
    }
}

/// Puts every output in place, or none (see the module docs): each is
/// flushed to disk, then linked under its name or a temporary one (a
/// failure unlinks those linked before it), then the temporary names are
/// renamed over the files they replace.
pub fn commit_all(outputs: Vec<OutputFile>) -> Result<(), CommitError> {
    let others = |failed: &Path, outputs: &[OutputFile]| -> Vec<PathBuf> {
        outputs
            .iter()
            .filter(|o| o.is_file() && o.path != failed)
            .map(|o| o.path.clone())
            .collect()
    };
    for out in &outputs {
        if let Err(error) = out.sync() {
            let unwritten = others(&error.path, &outputs);
            return Err(CommitError { error, unwritten });
        }
    }
    let files: Vec<PathBuf> = outputs
        .iter()
        .filter(|o| o.is_file())
        .map(|o| o.path.clone())
        .collect();
    let mut placed = Vec::with_capacity(outputs.len());
    for out in outputs {
        match out.place() {
            Ok(p) => placed.push(p),
            Err(error) => {
                for p in placed.into_iter().rev() {
                    p.undo();
                }
                let unwritten = files.into_iter().filter(|p| *p != error.path).collect();
                return Err(CommitError { error, unwritten });
            }
        }
    }
    let mut first = None;
    for p in placed {
        if let Err(error) = p.finish() {
            first.get_or_insert(CommitError {
                error,
                unwritten: Vec::new(),
            });
        }
    }
    first.map_or(Ok(()), Err)
}

/// The outputs of one command: written one after the other, put in place
/// together by [`Outputs::commit`], or none of them.
#[derive(Debug, Default)]
pub struct Outputs {
    written: Vec<OutputFile>,
    failed: Option<OutputError>,
    /// Outputs not written because one before failed.
    skipped: Vec<PathBuf>,
}

impl Outputs {
    /// Writes `out` with `write`, unless an output before it failed (it is
    /// then left unwritten).
    pub fn write(
        &mut self,
        out: OutputFile,
        write: impl FnOnce(&OutputFile) -> Result<(), OutputError>,
    ) {
        if self.failed.is_some() {
            self.skipped.push(out.path.clone());
            return;
        }
        match write(&out) {
            Ok(()) => self.written.push(out),
            Err(e) => self.failed = Some(e),
        }
    }

    /// Adds an output already written, or the error that stopped it.
    pub fn add(&mut self, written: Result<OutputFile, OutputError>) {
        match written {
            Ok(out) if self.failed.is_some() => self.skipped.push(out.path.clone()),
            Ok(out) => self.written.push(out),
            Err(e) if self.failed.is_none() => self.failed = Some(e),
            Err(e) => self.skipped.push(e.path),
        }
    }

    /// Puts every written output in place, or none if one failed.
    pub fn commit(self) -> Result<(), CommitError> {
        match self.failed {
            None => commit_all(self.written),
            Some(error) => {
                let mut unwritten: Vec<PathBuf> = self
                    .written
                    .iter()
                    .filter(|o| o.is_file())
                    .map(|o| o.path.clone())
                    .collect();
                unwritten.extend(self.skipped);
                unwritten.retain(|p| *p != error.path);
                Err(CommitError { error, unwritten })
            }
        }
    }
}

/// Opens a FIFO or a character device for writing, without blocking on a
/// FIFO that has no reader.
fn open_stream(path: &Path) -> io::Result<File> {
    let file = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => io::Error::new(
                e.kind(),
                "no process has the FIFO open for reading (start the reader first)",
            ),
            _ => e,
        })?;
    // The path may have changed since it was resolved.
    let ft = file.metadata()?.file_type();
    if !(ft.is_fifo() || ft.is_char_device()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "changed while it was opened",
        ));
    }
    // Writes block as usual once open.
    let flags = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK)?;
    Ok(file)
}

/// Creates the unnamed file in `dir`, or a named temporary one where the
/// filesystem has no O_TMPFILE.
fn open_file(dir: &Path, name: OsString) -> io::Result<Kind> {
    let dir_fd = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // Like any file a program writes; the umask still applies.
    let mode = Mode::from_raw_mode(0o644);
    match rustix::fs::openat(
        &dir_fd,
        ".",
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        mode,
    ) {
        Ok(fd) => Ok(Kind::Unnamed {
            file: File::from(fd),
            dir: dir_fd,
            name,
        }),
        // EOPNOTSUPP: the filesystem lacks O_TMPFILE; EISDIR: the kernel
        // does (it then sees only O_DIRECTORY).
        Err(Errno::OPNOTSUPP | Errno::ISDIR) => {
            tracing::debug!(dir = %dir.display(), "no O_TMPFILE here: a named temporary file");
            let tmp = tempfile::Builder::new()
                .prefix(&format!(".{}.", name.to_string_lossy()))
                .suffix(".tmp")
                .permissions(fs::Permissions::from_mode(0o644))
                .tempfile_in(dir)?;
            Ok(Kind::Named {
                tmp,
                target: dir.join(name),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Links the unnamed `file` into `dir` under a fresh temporary name
/// (`.NAME.XXXX.tmp`), to be renamed over `name`; returns that name.
fn link_temporary(file: &File, dir: &OwnedFd, name: &OsStr) -> io::Result<OsString> {
    let stamp = crate::sys::monotonic_ns();
    for attempt in 0..100u32 {
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".{:x}{stamp:x}{attempt:x}.tmp", std::process::id()));
        match link_unnamed(file, dir, &tmp) {
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
            Ok(()) => return Ok(tmp),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EEXIST))
}

/// linkat of an O_TMPFILE file: through /proc/self/fd (any user), or with
/// AT_EMPTY_PATH where /proc is not mounted (needs CAP_DAC_READ_SEARCH).
fn link_unnamed(file: &File, dir: &OwnedFd, name: &OsStr) -> rustix::io::Result<()> {
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    match rustix::fs::linkat(
        rustix::fs::CWD,
        &proc_path,
        dir,
        name,
        AtFlags::SYMLINK_FOLLOW,
    ) {
        Err(Errno::NOENT) if !Path::new("/proc/self/fd").exists() => {
            rustix::fs::linkat(file.as_fd(), "", dir, name, AtFlags::EMPTY_PATH)
        }
        other => other,
    }
}

/// Writes the profile and renames it into place.
pub fn write_profile(profile: &Profile, out: OutputFile) -> Result<(), OutputError> {
    stage_profile(profile, &out)?;
    out.commit()
}

/// Writes `profile` into `out` without putting it in place (see
/// [`Outputs`]).
pub fn stage_profile(profile: &Profile, out: &OutputFile) -> Result<(), OutputError> {
    let err = |source| OutputError {
        path: out.path().to_owned(),
        source,
    };
    // Compact: a python3.11 capture's profile took 4.6 MB and ~40 ms
    // indented, about half as compact (`jq .` indents it for reading).
    let w = std::io::BufWriter::with_capacity(1 << 20, out.file());
    if !is_zstd_name(out.path()) {
        return write_json(profile, w).map(drop).map_err(err);
    }
    let mut z = zstd::stream::write::Encoder::new(w, PROFILE_ZSTD_LEVEL).map_err(err)?;
    z.include_checksum(true).map_err(err)?;
    let w = write_json(profile, z).map_err(err)?;
    w.finish().and_then(|mut w| w.flush()).map_err(err)
}

/// zstd level of a profile written to a `.zst` name. On the gcc run of
/// issue 24 (a 3.0 MB document; `zstd` 1.5, this machine busy) level 9
/// makes 319 KB in 0.2 s with 19 MB of memory; level 3 382 KB in 0.1 s;
/// level 19 263 KB, but in 15 s with 57 MB.
const PROFILE_ZSTD_LEVEL: i32 = 9;

/// Whether a profile written to `path` is zstd-compressed: its name ends
/// in `.zst` (`p.json.zst`).
pub fn is_zstd_name(path: &Path) -> bool {
    path.as_os_str().as_bytes().ends_with(b".zst")
}

/// Writes `profile` as JSON and a newline into `w`; returns `w`, flushed.
fn write_json<W: io::Write>(profile: &Profile, mut w: W) -> io::Result<W> {
    serde_json::to_writer(&mut w, profile).map_err(io::Error::from)?;
    w.write_all(b"\n")?;
    w.flush()?;
    Ok(w)
}
