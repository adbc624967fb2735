//! Descriptor plumbing: pipes, reads and writes, eventfds, epoll and poll,
//! all through rustix. EINTR retries (or counts as a wakeup where a caller
//! waits in a loop anyway).

use std::os::fd::OwnedFd;

use super::{SysError, SysResult};

/// A pipe whose ends are closed on exec.
pub fn pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(SysError::rustix("pipe2"))
}

/// Reads into `buf`, retrying on EINTR. Returns the bytes read (0 at EOF).
pub fn read(fd: &OwnedFd, buf: &mut [u8]) -> SysResult<usize> {
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Err(rustix::io::Errno::INTR) => {}
            done => return done.map_err(SysError::rustix("read")),
        }
    }
}

/// Writes all of `buf`.
pub fn write_all(fd: &OwnedFd, mut buf: &[u8]) -> SysResult<()> {
    while !buf.is_empty() {
        match rustix::io::write(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(SysError::rustix("write")(errno)),
        }
    }
    Ok(())
}

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> SysResult<OwnedFd> {
    use rustix::event::EventfdFlags;
    rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
        .map_err(SysError::rustix("eventfd"))
}

/// Adds 1 to an eventfd's counter, waking its waiters.
pub fn eventfd_signal(fd: std::os::fd::BorrowedFd<'_>) {
    // A full counter (EAGAIN) already means "signalled".
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// An epoll instance waiting for input on `fds`; `edge[i]` makes fd i
/// edge-triggered (for an eventfd shared by several waiters, never read).
pub fn epoll_for(fds: &[(std::os::fd::BorrowedFd<'_>, bool)]) -> SysResult<OwnedFd> {
    use rustix::event::epoll;
    let ep =
        epoll::create(epoll::CreateFlags::CLOEXEC).map_err(SysError::rustix("epoll_create1"))?;
    for (i, (fd, edge)) in fds.iter().enumerate() {
        let mut flags = epoll::EventFlags::IN;
        if *edge {
            flags |= epoll::EventFlags::ET;
        }
        epoll::add(&ep, fd, epoll::EventData::new_u64(i as u64), flags)
            .map_err(SysError::rustix("epoll_ctl"))?;
    }
    Ok(ep)
}

/// Waits on an epoll instance for at most `timeout`, to the nanosecond:
/// with rustix's `linux_5_11` feature, its `epoll::wait` is always
/// epoll_pwait2 (without it, timeouts are rounded up to milliseconds).
/// EINTR is a wakeup. Where the kernel lacks epoll_pwait2 (before 5.11),
/// sleeps `timeout` instead.
pub fn epoll_wait_for(ep: std::os::fd::BorrowedFd<'_>, timeout: std::time::Duration) {
    let ts = rustix::event::Timespec {
        tv_sec: timeout.as_secs() as rustix::event::Secs,
        tv_nsec: timeout.subsec_nanos().into(),
    };
    let mut events = [std::mem::MaybeUninit::uninit(); 4];
    if let Err(rustix::io::Errno::NOSYS) = rustix::event::epoll::wait(ep, &mut events, Some(&ts)) {
        std::thread::sleep(timeout);
    }
}

/// Waits on an epoll instance for at most `timeout_ms` (forever when
/// negative); EINTR is a wakeup.
pub fn epoll_wait(ep: std::os::fd::BorrowedFd<'_>, timeout_ms: i32) {
    match u64::try_from(timeout_ms) {
        Ok(ms) => epoll_wait_for(ep, std::time::Duration::from_millis(ms)),
        Err(_) => {
            let mut events = [std::mem::MaybeUninit::uninit(); 4];
            let _ = rustix::event::epoll::wait(ep, &mut events, None);
        }
    }
}

/// Waits until one of `fds` is readable, or `timeout` has passed: the
/// index of the first readable one, or None at the timeout. EINTR waits
/// again for what is left of the timeout.
pub fn poll_readable(
    fds: &[std::os::fd::BorrowedFd<'_>],
    timeout: Option<std::time::Duration>,
) -> SysResult<Option<usize>> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    loop {
        let left = deadline.map(|d| {
            let left = d.saturating_duration_since(std::time::Instant::now());
            Timespec {
                tv_sec: left.as_secs() as rustix::event::Secs,
                tv_nsec: left.subsec_nanos().into(),
            }
        });
        match rustix::event::poll(&mut pfds, left.as_ref()) {
            Ok(0) => {
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    return Ok(None);
                }
            }
            Ok(_) => return Ok(pfds.iter().position(|p| !p.revents().is_empty())),
            Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(SysError::rustix("poll")(errno)),
        }
    }
}

/// The largest image read into memory (see [`map_file`]): a file that
/// another user can write is read, not mapped, and one past this size is
/// refused (`FileTooLarge`) rather than held whole.
pub const MAX_READ_IMAGE: u64 = 1 << 30;

/// `statfs`'s `f_type` of a FUSE filesystem.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// A file's contents: mapped read-only where only root can change the
/// file, else read into memory.
pub enum FileData {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl std::ops::Deref for FileData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            FileData::Mapped(map) => map,
            FileData::Read(bytes) => bytes,
        }
    }
}

/// Opens `path` for reading if it is a regular file, looking at it through
/// an `O_PATH` descriptor first (opening a FIFO waits for a writer, opening
/// a device can do anything); `InvalidInput` otherwise. The flag says
/// whether only root can change the file: owned by root, writable by
/// neither its group nor others, and not on FUSE (whose server says what
/// it likes about owners, and can cut a file short at any time).
pub fn open_regular(path: &std::path::Path) -> std::io::Result<(std::fs::File, bool)> {
    use rustix::fs::{Mode, OFlags};
    let at = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
    let stat = rustix::fs::fstat(&at)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let reopen = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&at));
    let file = std::fs::File::open(reopen)?;
    let writable_by_others = stat.st_mode & 0o022 != 0;
    let fuse = rustix::fs::fstatfs(&at).is_ok_and(|fs| fs.f_type == FUSE_SUPER_MAGIC);
    Ok((file, stat.st_uid == 0 && !writable_by_others && !fuse))
}

/// A file's contents, to parse as an ELF image: an image is searched in a
/// few places (its symbol tables, notes, the code at a few entry points,
/// its CFI), and reading it whole first zeroed and copied tens of
/// megabytes for a large executable (cc1: 33 MB) at every capture's start.
///
/// A mapped file must not be truncated while mapped (a read past its new
/// end faults, SIGBUS): a regular file owned by root that neither its group
/// nor others can write (installed executables and libraries, which
/// package managers replace, a new inode, rather than rewrite) is mapped;
/// any other (a tracked user's own file, a memfd a JIT maps) is read, up
/// to [`MAX_READ_IMAGE`] bytes. Anything but a regular file is refused
/// (`InvalidInput`) without being opened for reading: it is looked at
/// through an `O_PATH` descriptor first.
pub fn map_file(path: &std::path::Path) -> std::io::Result<FileData> {
    let (file, trusted) = open_regular(path)?;
    contents(&file, trusted)
}

/// The contents of `file`, opened by [`open_regular`] (`trusted` is its
/// flag): mapped or read as [`map_file`] says.
pub fn contents(file: &std::fs::File, trusted: bool) -> std::io::Result<FileData> {
    use std::io::Read;
    if trusted {
        // SAFETY: read-only, private mapping of a file only root can write,
        // and root replaces such files rather than truncating them (see
        // above); the bytes are only read.
        return unsafe { memmap2::Mmap::map(file) }.map(FileData::Mapped);
    }
    let stat = rustix::fs::fstat(file)?;
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > MAX_READ_IMAGE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "{size} bytes, more than the {MAX_READ_IMAGE} read from a file another user \
                 can write"
            ),
        ));
    }
    // Bounded whatever the file does meanwhile (it may grow).
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(MAX_READ_IMAGE).read_to_end(&mut bytes)?;
    Ok(FileData::Read(bytes))
}
