//! BPF maps and links by file descriptor, through libbpf-sys: what runs on
//! threads that hold fds but not the skeleton.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::{SysError, SysResult};

/// What a uprobe_multi link runs its program on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UprobeKind {
    Entry,
    Return,
    /// Entry and return, one program (a `uprobe.session`, Linux 6.13).
    Session,
}

/// Attaches the BPF program `prog` to `offsets` of the file at `path` in
/// every process (`pid` 0) or only in process `pid` (the kernel then puts
/// breakpoints only in that process's memory, and runs the program only for
/// its threads), as one uprobe_multi link of `kind`, each offset with its
/// BPF cookie. Closing the returned fd detaches.
///
/// A raw `BPF_LINK_CREATE` rather than libbpf-rs's
/// `ProgramMut::attach_uprobe_multi_with_opts`: that one needs the
/// skeleton's program object, which is `!Send` and lives on the session's
/// thread, while links are made on the attach worker, which holds only
/// program fds (sendable, dup'ed); and its link owns the program borrow,
/// where memtrail keeps links as plain fds it can close from any thread.
pub fn uprobe_multi(
    prog: std::os::fd::BorrowedFd<'_>,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    kind: UprobeKind,
    pid: u32,
) -> SysResult<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    assert_eq!(offsets.len(), cookies.len(), "one cookie per offset");
    let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError {
        call: "bpf(BPF_LINK_CREATE)",
        source: io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"),
    })?;
    let offsets: Vec<libc::c_ulong> = offsets.iter().map(|&o| o as libc::c_ulong).collect();
    // SAFETY: an all-zero bpf_link_create_opts is its documented default.
    let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
    opts.__bindgen_anon_1.uprobe_multi =
        libbpf_sys::bpf_link_create_opts__bindgen_ty_1__bindgen_ty_3 {
            flags: if kind == UprobeKind::Return {
                libbpf_sys::BPF_F_UPROBE_MULTI_RETURN
            } else {
                0
            },
            cnt: offsets.len() as u32,
            path: path.as_ptr(),
            offsets: offsets.as_ptr(),
            ref_ctr_offsets: std::ptr::null(),
            cookies: cookies.as_ptr(),
            pid,
            __bindgen_padding_0: [0; 4],
        };
    // SAFETY: every pointer in opts points to live data of `cnt` entries
    // (or the NUL-terminated path) for the duration of the call.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(
            prog.as_raw_fd(),
            0,
            if kind == UprobeKind::Session {
                libbpf_sys::BPF_TRACE_UPROBE_SESSION
            } else {
                libbpf_sys::BPF_TRACE_UPROBE_MULTI
            },
            &opts,
        )
    };
    if fd < 0 {
        return Err(SysError {
            call: "bpf(BPF_LINK_CREATE, uprobe_multi)",
            source: io::Error::from_raw_os_error(-fd),
        });
    }
    // SAFETY: bpf_link_create returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Updates `key` to `value` in the BPF map behind `map`.
pub fn bpf_map_update(map: std::os::fd::BorrowedFd<'_>, key: &[u8], value: &[u8]) -> SysResult<()> {
    // SAFETY: key and value are valid for the map's key and value sizes,
    // which the caller matches; the kernel copies them.
    let ret = unsafe {
        libbpf_sys::bpf_map_update_elem(
            map.as_raw_fd(),
            key.as_ptr().cast(),
            value.as_ptr().cast(),
            libbpf_sys::BPF_ANY.into(),
        )
    };
    if ret < 0 {
        return Err(SysError {
            call: "bpf(BPF_MAP_UPDATE_ELEM)",
            source: io::Error::from_raw_os_error(-ret),
        });
    }
    Ok(())
}

/// Deletes `key` from a BPF map (a missing key is not an error).
pub fn bpf_map_delete(map: std::os::fd::BorrowedFd<'_>, key: &[u8]) -> SysResult<()> {
    // SAFETY: key is valid for the map's key size, which the caller
    // matches; the kernel copies it.
    let ret = unsafe { libbpf_sys::bpf_map_delete_elem(map.as_raw_fd(), key.as_ptr().cast()) };
    if ret < 0 && -ret != libc::ENOENT {
        return Err(SysError {
            call: "bpf(BPF_MAP_DELETE_ELEM)",
            source: io::Error::from_raw_os_error(-ret),
        });
    }
    Ok(())
}

/// Whether a BPF hash map holds `key` (an error reads as absent).
pub fn bpf_map_contains(map: std::os::fd::BorrowedFd<'_>, key: &[u8], value_size: usize) -> bool {
    let mut value = [0u8; 64];
    if value_size > value.len() {
        return false;
    }
    // SAFETY: key is valid for the map's key size, which the caller
    // matches; the value buffer holds the map's value size (checked above).
    let ret = unsafe {
        libbpf_sys::bpf_map_lookup_elem(
            map.as_raw_fd(),
            key.as_ptr().cast(),
            value.as_mut_ptr().cast(),
        )
    };
    ret == 0
}

/// Keys of a BPF hash map whose keys are `u32` (the tracked-process map).
pub fn bpf_map_u32_keys(map: std::os::fd::BorrowedFd<'_>) -> SysResult<Vec<u32>> {
    let mut keys = Vec::new();
    let mut prev: Option<u32> = None;
    loop {
        let mut next = 0u32;
        let prev_ptr = prev.as_ref().map_or(std::ptr::null(), |p| {
            std::ptr::from_ref(p).cast::<libc::c_void>()
        });
        // SAFETY: key pointers are valid u32s (or NULL for the first key),
        // the map's key size.
        let ret = unsafe {
            libbpf_sys::bpf_map_get_next_key(map.as_raw_fd(), prev_ptr, (&raw mut next).cast())
        };
        if ret == -libc::ENOENT {
            return Ok(keys);
        }
        if ret < 0 {
            return Err(SysError {
                call: "bpf(BPF_MAP_GET_NEXT_KEY)",
                source: io::Error::from_raw_os_error(-ret),
            });
        }
        keys.push(next);
        prev = Some(next);
    }
}
