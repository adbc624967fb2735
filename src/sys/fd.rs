//! Descriptor plumbing: pipes, reads and writes, eventfds, epoll and poll,
//! all through rustix. EINTR retries (or counts as a wakeup where a caller
//! waits in a loop anyway).

use std::os::fd::{AsRawFd, OwnedFd};

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

/// The most bytes of an image another user can write that memtrail reads
/// into memory (see [`map_file`]), its DWARF sections left out: a larger
/// one is refused (`FileTooLarge`) rather than held whole.
pub const MAX_READ_IMAGE: u64 = 1 << 30;

/// The largest such image examined at all: past [`MAX_READ_IMAGE`] its
/// DWARF sections (which the image parsers never read) stay unread, zero
/// pages of an anonymous mapping that take address space only.
pub const MAX_IMAGE_SIZE: u64 = 16 << 30;

/// A file's contents: mapped read-only where only root can change the
/// file, else read into memory.
pub enum FileData {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
    /// Read into an anonymous mapping, its DWARF sections left as zeros.
    Sparse(memmap2::MmapMut),
}

impl std::ops::Deref for FileData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            FileData::Mapped(map) => map,
            FileData::Read(bytes) => bytes,
            FileData::Sparse(map) => map,
        }
    }
}

/// `statfs`'s `f_type` of a FUSE filesystem.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

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
/// to [`MAX_READ_IMAGE`] bytes besides its DWARF (see `MAX_IMAGE_SIZE`).
/// Anything but a regular file is refused
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
    if size <= MAX_READ_IMAGE {
        // Bounded whatever the file does meanwhile (it may grow).
        let mut bytes = Vec::with_capacity(size as usize);
        file.take(MAX_READ_IMAGE).read_to_end(&mut bytes)?;
        return Ok(FileData::Read(bytes));
    }
    let too_large = |what: &str| {
        std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "{size} bytes, {what} (a file another user can write is read, at most \
                 {MAX_READ_IMAGE} bytes of it besides its DWARF)"
            ),
        )
    };
    if size > MAX_IMAGE_SIZE {
        return Err(too_large("too large to examine"));
    }
    let skip = dwarf_ranges(file, size);
    let read: u64 = gaps(&skip, size).map(|r| r.end - r.start).sum();
    if read > MAX_READ_IMAGE {
        return Err(too_large("too large to read"));
    }
    let mut map = memmap2::MmapOptions::new()
        .len(size as usize)
        .map_anon()
        .map_err(|_| too_large("no room to read it"))?;
    for range in gaps(&skip, size) {
        read_range(
            file,
            &mut map[range.start as usize..range.end as usize],
            range.start,
        )?;
    }
    Ok(FileData::Sparse(map))
}

/// Reads `buf.len()` bytes of `file` at `offset`, or up to its end if it
/// was cut meanwhile (the rest stays zeros).
fn read_range(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// The parts of `0..size` outside the sorted, disjoint `skip` ranges.
fn gaps(skip: &[std::ops::Range<u64>], size: u64) -> impl Iterator<Item = std::ops::Range<u64>> {
    let mut at = 0;
    skip.iter()
        .cloned()
        .chain(std::iter::once(size..size))
        .filter_map(move |r| {
            let gap = at..r.start.max(at);
            at = at.max(r.end);
            (!gap.is_empty()).then_some(gap)
        })
}

/// The file ranges of a 64-bit little-endian ELF image's DWARF sections
/// (`.debug_*` and `.zdebug_*` but `.debug_frame`, not loaded) but their
/// first 64 bytes, sorted and merged; none if its headers cannot be read. What the file says is only
/// trusted so far as which bytes are left unread: they read as zeros.
fn dwarf_ranges(file: &std::fs::File, size: u64) -> Vec<std::ops::Range<u64>> {
    let mut ranges = dwarf_sections(file, size).unwrap_or_default();
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<std::ops::Range<u64>> = Vec::new();
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    merged
}

fn dwarf_sections(file: &std::fs::File, size: u64) -> Option<Vec<std::ops::Range<u64>>> {
    const SHF_ALLOC: u64 = 2;
    const SHT_NOBITS: u32 = 8;
    let read = |offset: u64, len: u64| -> Option<Vec<u8>> {
        let end = offset.checked_add(len).filter(|&end| end <= size)?;
        let mut buf = vec![0u8; usize::try_from(end - offset).ok()?];
        read_range(file, &mut buf, offset).ok()?;
        Some(buf)
    };
    let u16_at =
        |b: &[u8], at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
    let u32_at =
        |b: &[u8], at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let u64_at =
        |b: &[u8], at: usize| Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?));
    let ehdr = read(0, 64)?;
    // ELF, 64-bit, little-endian, 64-byte section headers.
    if ehdr.get(..6)? != b"\x7fELF\x02\x01" || u16_at(&ehdr, 0x3a)? != 64 {
        return None;
    }
    let (shoff, shnum) = (u64_at(&ehdr, 0x28)?, u64::from(u16_at(&ehdr, 0x3c)?));
    let shdrs = read(shoff, shnum * 64)?;
    let shdr =
        |i: u64| shdrs.get(usize::try_from(i * 64).ok()?..usize::try_from(i * 64 + 64).ok()?);
    let strtab = shdr(u64::from(u16_at(&ehdr, 0x3e)?))?;
    // Section names: at most 1 MiB of them.
    let names = read(u64_at(strtab, 0x18)?, u64_at(strtab, 0x20)?.min(1 << 20))?;
    let mut ranges = Vec::new();
    for i in 0..shnum {
        let h = shdr(i)?;
        let name = names
            .get(usize::try_from(u32_at(h, 0)?).ok()?..)
            .unwrap_or_default();
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        let dwarf = (name.starts_with(b".debug_") || name.starts_with(b".zdebug_"))
            && name != b".debug_frame";
        let (flags, ty) = (u64_at(h, 8)?, u32_at(h, 4)?);
        if !dwarf || flags & SHF_ALLOC != 0 || ty == SHT_NOBITS {
            continue;
        }
        // Its first bytes are read: a compressed section's header says
        // what it claims to hold (see symbolize's guard).
        let (offset, len) = (u64_at(h, 0x18)?, u64_at(h, 0x20)?);
        let (start, end) = (
            offset.saturating_add(64),
            offset.saturating_add(len).min(size),
        );
        if start < end {
            ranges.push(start..end);
        }
    }
    Some(ranges)
}

/// A close-on-exec memfd named `name` holding `bytes`, sealed against any
/// change (write, grow, shrink, new seals): what other processes map of it
/// through `/proc/PID/fd/N` is exactly `bytes`, and nothing is on disk.
pub fn sealed_memfd(name: &str, bytes: &[u8]) -> SysResult<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(SysError::rustix("memfd_create"))?;
    write_all(&fd, bytes)?;
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )
    .map_err(SysError::rustix("fcntl(F_ADD_SEALS)"))?;
    Ok(fd)
}

/// A close-on-exec memfd named `name` of `len` zeroed bytes, sealed against
/// growing and shrinking (the processes that map it through
/// `/proc/PID/fd/N` keep every page they mapped).
pub fn sized_memfd(name: &str, len: u64) -> SysResult<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(SysError::rustix("memfd_create"))?;
    rustix::fs::ftruncate(&fd, len).map_err(SysError::rustix("ftruncate"))?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(SysError::rustix("fcntl(F_ADD_SEALS)"))?;
    Ok(fd)
}

/// Process `pid`'s descriptor `fd`, if it is a memfd named `name` that
/// nothing sealed yet, made `len` bytes long and sealed against growing,
/// shrinking and new seals: the preload shim's ring file (issue 40). The
/// process cannot then take pages from under memtrail's mapping.
pub fn take_memfd(pid: u32, fd: u64, name: &str, len: u64) -> SysResult<OwnedFd> {
    use rustix::fs::SealFlags;
    let not_ours = |call| SysError {
        call,
        source: std::io::Error::from(std::io::ErrorKind::InvalidData),
    };
    let target = i32::try_from(fd).map_err(|_| not_ours("pidfd_getfd (descriptor)"))?;
    let pidfd = super::pidfd_open(super::Pid::new(pid))?;
    let file =
        rustix::process::pidfd_getfd(&pidfd, target, rustix::process::PidfdGetfdFlags::empty())
            .map_err(SysError::rustix("pidfd_getfd"))?;
    // Only a memfd (shmem) has seals; none may be set yet.
    let seals =
        rustix::fs::fcntl_get_seals(&file).map_err(SysError::rustix("fcntl(F_GET_SEALS)"))?;
    let link =
        std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(|source| {
            SysError {
                call: "readlink",
                source,
            }
        })?;
    if !seals.is_empty()
        || !link
            .as_os_str()
            .as_encoded_bytes()
            .starts_with(format!("/memfd:{name} ").as_bytes())
    {
        return Err(not_ours("a ring file (not an unsealed memfd of that name)"));
    }
    rustix::fs::ftruncate(&file, len).map_err(SysError::rustix("ftruncate"))?;
    rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(SysError::rustix("fcntl(F_ADD_SEALS)"))?;
    // The process may have changed the size before the seals.
    let st = rustix::fs::fstat(&file).map_err(SysError::rustix("fstat"))?;
    if st.st_size as u64 != len {
        return Err(not_ours("a ring file (its size changed)"));
    }
    Ok(file)
}

/// A read-only mapping of a file's `head` bytes at `offset` and the `size`
/// bytes after them, followed by those `size` bytes mapped a second time:
/// a ring buffer's data area read across its end as one run, as the
/// kernel maps a BPF ring buffer's.
#[derive(Debug)]
pub struct DoubleMap {
    ptr: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone and only read through
// it; moving it to another thread moves the ownership.
unsafe impl Send for DoubleMap {}

impl DoubleMap {
    /// `offset` and `head` must be page multiples, `size` a page multiple.
    pub fn new(
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        head: usize,
        size: usize,
    ) -> SysResult<Self> {
        use rustix::mm::{MapFlags, ProtFlags};
        let len = head + 2 * size;
        // SAFETY: a new anonymous reservation, placed by the kernel: it
        // overlaps nothing of ours.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(SysError::rustix("mmap"))?;
        let map = Self {
            ptr: std::ptr::NonNull::new(base).expect("mmap does not return NULL"),
            len,
        };
        let second = base.wrapping_byte_add(head + size);
        // SAFETY: both replace parts of the reservation made above, which
        // `map` owns (and unmaps whole on drop).
        unsafe {
            rustix::mm::mmap(
                base,
                head + size,
                ProtFlags::READ,
                MapFlags::SHARED | MapFlags::FIXED,
                fd,
                offset,
            )
            .map_err(SysError::rustix("mmap"))?;
            rustix::mm::mmap(
                second,
                size,
                ProtFlags::READ,
                MapFlags::SHARED | MapFlags::FIXED,
                fd,
                offset + head as u64,
            )
            .map_err(SysError::rustix("mmap"))?;
            // Not copied into memtrail's children (see ring::RingConsumer).
            let _ = rustix::mm::madvise(base, len, rustix::mm::Advice::LinuxDontFork);
        }
        Ok(map)
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr().cast()
    }

    /// The whole mapping (the head, the data, the data again).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` readable bytes mapped at `ptr` for as long as
        // `self` lives (others may write them: readers check the ring's
        // headers, as with the kernel's mapping of a ring).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
}

impl Drop for DoubleMap {
    fn drop(&mut self) {
        // SAFETY: the whole reservation, owned by `self`, unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr(), self.len) };
    }
}
