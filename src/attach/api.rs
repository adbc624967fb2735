//! The allocator APIs memtrail knows: which symbols are entry points, what
//! each reports and where its arguments are.
//!
//! Several symbols can name one address (glibc's `free`/`cfree`,
//! `memalign`/`aligned_alloc`; jemalloc's `malloc`/`je_malloc` in some
//! builds): a site is attached once per address, under the first name in
//! the table's order.

use crate::bpf::record::Kind;
use crate::bpf::skel::memtrail::types as t;

/// How a probe treats its entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Returns new memory: an entry probe, and its return sites (or a
    /// kernel return probe), one record.
    Alloc,
    /// Releases a block given as the first argument: entry probe only.
    Free,
    /// C++ `operator new`: entry probe only, for the stack of the malloc it
    /// calls (a uretprobe would break exceptions thrown out of it).
    New,
    /// A libc wrapper of a memory syscall (`mmap`, `sbrk`): entry probe
    /// only, capturing the caller's stack for the syscall the wrapper makes
    /// (kind `Mmap` or `Brk`), so that anonymous memory a program maps
    /// outside allocator calls has a site (see docs/profile.md).
    Syscall,
    /// A USDT region marker (`include/memtrail_usdt.h`, see
    /// [`super::usdt`]): kind `RegionBegin` or `RegionEnd`.
    Marker,
    /// Where an allocating function (the site's symbol) returns: an entry
    /// probe that reads the result in place of a kernel return probe (see
    /// [`super::returns`]). An allocating site of an image without return
    /// sites of its name takes a kernel return probe.
    Return(super::returns::ReturnSite),
}

/// Where an allocating call's arguments are at its probe: argument
/// registers 0-2 (rdi, rsi, rdx) at the entry, and where code the probe was
/// moved past put them, also 3 and 4 (rcx, rax; see `ARG_REGS` in
/// `attach/mod.rs` and `enum mt_cookie_layout` in bpf/memtrail.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Abi {
    pub size: u8,
    pub count: Option<u8>,
    /// The block resized (realloc-like), or with `out_ptr` where the
    /// result is written.
    pub ptr: Option<u8>,
    pub out_ptr: bool,
    pub result_is_size: bool,
    /// `size` holds count × size, multiplied by code the probe was moved
    /// past, which set the overflow flag if the product overflowed (the
    /// call then fails as for an overflowing count).
    pub size_overflow_of: bool,
    /// Bytes the code the probe was moved past took off the stack pointer
    /// (entry-only probes: operator new, the syscall wrappers), so the
    /// return address is that far above it.
    pub sp_adjust: u8,
    /// A free's site split past its NULL test (see [`super::free_sites`]):
    /// one of the pair whose sites each call records at one of at most.
    pub free_split: bool,
    /// A split free's fast-path site on a conditional jump: its condition
    /// code, and whether the free completes on the taken branch (it
    /// records only then; the other way leads to the slow path's site).
    pub free_cond: Option<(u8, bool)>,
}

const fn abi(size: u8, count: Option<u8>, ptr: Option<u8>) -> Abi {
    Abi {
        size,
        count,
        ptr,
        out_ptr: false,
        result_is_size: false,
        size_overflow_of: false,
        sp_adjust: 0,
        free_split: false,
        free_cond: None,
    }
}

/// `f(size)`.
pub const SIZE0: Abi = abi(0, None, None);
/// `f(align, size)`.
pub const SIZE1: Abi = abi(1, None, None);
/// `f(n, size)`.
pub const COUNT_SIZE: Abi = abi(1, Some(0), None);
/// `f(ptr, size)`.
pub const REALLOC: Abi = abi(1, None, Some(0));
/// `f(ptr, n, size)`.
pub const REALLOC_N: Abi = abi(2, Some(1), Some(0));
/// `int f(void **out, align, size)`.
pub const OUT_PTR: Abi = Abi {
    out_ptr: true,
    ..abi(2, None, Some(0))
};
/// `size_t f(ptr, size, ...)`: resized in place, returns the new size.
pub const IN_PLACE: Abi = Abi {
    result_is_size: true,
    ..abi(1, None, Some(0))
};

impl Abi {
    /// The attach cookie (`enum mt_cookie_layout` in bpf/memtrail.h).
    pub fn cookie(self, kind: Kind) -> u64 {
        const NONE: u64 = t::mt_cookie_layout::MT_CK_ARG_NONE.0 as u64;
        let idx = |i: Option<u8>| i.map_or(NONE, u64::from);
        let mut flags = 0;
        if self.out_ptr {
            flags |= u64::from(t::mt_cookie_flags::MT_CK_OUT_PTR.0);
        }
        if self.result_is_size {
            flags |= u64::from(t::mt_cookie_flags::MT_CK_RESULT_IS_SIZE.0);
        }
        use t::mt_cookie_layout as l;
        let overflow = u64::from(self.size_overflow_of) << l::MT_CK_SIZE_OF_BIT.0;
        let words = u64::from(self.sp_adjust / 8);
        let sp = (words & 0xf) << l::MT_CK_SP_SHIFT.0 | (words >> 4) << l::MT_CK_FREE_SP_HI_SHIFT.0;
        let mut split = 0;
        if self.free_split {
            split |= 1 << l::MT_CK_FREE_SPLIT_BIT.0;
        }
        if let Some((cc, taken)) = self.free_cond {
            split |= 1 << l::MT_CK_FREE_COND_BIT.0
                | u64::from(cc & 0xf) << l::MT_CK_FREE_CC_SHIFT.0
                | u64::from(taken) << l::MT_CK_FREE_TAKEN_BIT.0;
        }
        // A free's bits 16-23 are its split's (it has no size).
        let sizes = if kind == Kind::Free {
            0
        } else {
            u64::from(self.size) << l::MT_CK_SIZE_SHIFT.0
                | idx(self.count) << l::MT_CK_COUNT_SHIFT.0
        };
        overflow
            | sp
            | split
            | sizes
            | kind as u64
            | idx(self.ptr) << l::MT_CK_PTR_SHIFT.0
            | flags << l::MT_CK_FLAGS_SHIFT.0
    }
}

/// One entry point of an allocator API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub role: Role,
    pub kind: Kind,
    pub abi: Abi,
}

fn alloc(name: &str, kind: Kind, abi: Abi) -> Entry {
    Entry {
        name: name.to_owned(),
        role: Role::Alloc,
        kind,
        abi,
    }
}

fn free(name: &str) -> Entry {
    Entry {
        name: name.to_owned(),
        role: Role::Free,
        kind: Kind::Free,
        abi: SIZE0,
    }
}

/// The C allocation API with `prefix` (`""` for libc or an allocator that
/// replaces it; `je_`, `_rjem_`, `tc_`, `mi_` for prefixed builds).
pub fn c_api(prefix: &str) -> Vec<Entry> {
    let n = |s: &str| format!("{prefix}{s}");
    vec![
        alloc(&n("malloc"), Kind::Malloc, SIZE0),
        alloc(&n("calloc"), Kind::Calloc, COUNT_SIZE),
        alloc(&n("realloc"), Kind::Realloc, REALLOC),
        alloc(&n("reallocarray"), Kind::Reallocarray, REALLOC_N),
        free(&n("free")),
        free(&n("cfree")),
        alloc(&n("memalign"), Kind::Memalign, SIZE1),
        alloc(&n("aligned_alloc"), Kind::AlignedAlloc, SIZE1),
        alloc(&n("posix_memalign"), Kind::PosixMemalign, OUT_PTR),
        alloc(&n("valloc"), Kind::Valloc, SIZE0),
        alloc(&n("pvalloc"), Kind::Pvalloc, SIZE0),
    ]
}

/// The libc API.
pub fn libc() -> Vec<Entry> {
    c_api("")
}

/// jemalloc's non-standard API, with `prefix` (`""`, `je_`, `_rjem_`).
pub fn jemalloc_extra(prefix: &str) -> Vec<Entry> {
    let n = |s: &str| format!("{prefix}{s}");
    vec![
        alloc(&n("mallocx"), Kind::Malloc, SIZE0),
        alloc(&n("rallocx"), Kind::Realloc, REALLOC),
        alloc(&n("xallocx"), Kind::Realloc, IN_PLACE),
        free(&n("dallocx")),
        free(&n("sdallocx")),
    ]
}

/// mimalloc's API (`mi_*`); its standard names come with [`c_api`].
pub fn mimalloc() -> Vec<Entry> {
    vec![
        alloc("mi_malloc", Kind::Malloc, SIZE0),
        alloc("mi_zalloc", Kind::Calloc, SIZE0),
        alloc("mi_calloc", Kind::Calloc, COUNT_SIZE),
        alloc("mi_mallocn", Kind::Malloc, COUNT_SIZE),
        alloc("mi_realloc", Kind::Realloc, REALLOC),
        alloc("mi_reallocn", Kind::Realloc, REALLOC_N),
        alloc("mi_reallocf", Kind::Realloc, REALLOC),
        alloc("mi_rezalloc", Kind::Realloc, REALLOC),
        alloc("mi_malloc_small", Kind::Malloc, SIZE0),
        alloc("mi_zalloc_small", Kind::Calloc, SIZE0),
        alloc("mi_malloc_aligned", Kind::AlignedAlloc, SIZE0),
        alloc("mi_malloc_aligned_at", Kind::AlignedAlloc, SIZE0),
        alloc("mi_zalloc_aligned", Kind::AlignedAlloc, SIZE0),
        alloc("mi_zalloc_aligned_at", Kind::AlignedAlloc, SIZE0),
        alloc("mi_calloc_aligned", Kind::AlignedAlloc, COUNT_SIZE),
        alloc("mi_calloc_aligned_at", Kind::AlignedAlloc, COUNT_SIZE),
        alloc("mi_realloc_aligned", Kind::Realloc, REALLOC),
        alloc("mi_realloc_aligned_at", Kind::Realloc, REALLOC),
        alloc("mi_rezalloc_aligned", Kind::Realloc, REALLOC),
        alloc("mi_posix_memalign", Kind::PosixMemalign, OUT_PTR),
        alloc("mi_memalign", Kind::Memalign, SIZE1),
        alloc("mi_aligned_alloc", Kind::AlignedAlloc, SIZE1),
        alloc("mi_valloc", Kind::Valloc, SIZE0),
        alloc("mi_pvalloc", Kind::Pvalloc, SIZE0),
        alloc("mi_new", Kind::Malloc, SIZE0),
        alloc("mi_new_n", Kind::Malloc, COUNT_SIZE),
        alloc("mi_new_aligned", Kind::AlignedAlloc, SIZE0),
        alloc("mi_new_nothrow", Kind::Malloc, SIZE0),
        alloc("mi_new_realloc", Kind::Realloc, REALLOC),
        alloc("mi_new_reallocn", Kind::Realloc, REALLOC_N),
        free("mi_free"),
        free("mi_free_size"),
        free("mi_free_aligned"),
        free("mi_free_size_aligned"),
        free("mi_cfree"),
    ]
}

/// C++ `operator new` variants (libstdc++ and libc++ share the Itanium
/// names), probed at entry only; see [`Role::New`].
pub fn cxx_new() -> Vec<Entry> {
    crate::unwind::table::OPERATOR_NEW
        .iter()
        .map(|name| Entry {
            name: (*name).to_owned(),
            role: Role::New,
            kind: Kind::Malloc,
            abi: SIZE0,
        })
        .collect()
}

/// C++ `operator delete` variants (Itanium names: sized, array, aligned,
/// nothrow), probed as frees in an image with an allocator of its own only
/// (see `own_role` in `attach/elf_sites.rs`).
pub const OPERATOR_DELETE: [&str; 12] = [
    "_ZdlPv",
    "_ZdaPv",
    "_ZdlPvm",
    "_ZdaPvm",
    "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdaPvSt11align_val_tRKSt9nothrow_t",
];

/// Whether `name` is one of [`OPERATOR_DELETE`].
pub fn is_delete(name: &str) -> bool {
    OPERATOR_DELETE.contains(&name)
}

/// The `operator delete` variants as frees.
pub fn cxx_delete() -> Vec<Entry> {
    OPERATOR_DELETE.iter().map(|name| free(name)).collect()
}

/// The libc wrappers of the memory syscalls whose callers are sites
/// (glibc and musl export these names; `mmap64` is glibc's alias of
/// `mmap`), probed at entry only; see [`Role::Syscall`]. `brk` is left
/// out: glibc's `sbrk` calls it, and a program moving the break by hand
/// calls `sbrk`.
pub fn syscall_wrappers() -> Vec<Entry> {
    [
        ("mmap", Kind::Mmap),
        ("mmap64", Kind::Mmap),
        ("sbrk", Kind::Brk),
    ]
    .iter()
    .map(|&(name, kind)| Entry {
        name: name.to_owned(),
        role: Role::Syscall,
        kind,
        abi: SIZE0,
    })
    .collect()
}

/// Every entry point memtrail looks for in an image, in naming order.
pub fn all() -> Vec<Entry> {
    let mut all = c_api("");
    for prefix in ["", "je_", "_rjem_"] {
        if !prefix.is_empty() {
            all.extend(c_api(prefix));
        }
        all.extend(jemalloc_extra(prefix));
    }
    all.extend(c_api("tc_"));
    all.extend(mimalloc());
    all.extend(cxx_new());
    all.extend(cxx_delete());
    all.extend(syscall_wrappers());
    all
}
