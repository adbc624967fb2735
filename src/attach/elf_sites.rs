//! ELF site search: the allocator sites of an image (its entry points
//! for the probed APIs, placed past their harmless prologues), the return
//! sites of its allocating functions ([`returns`]) and its USDT region
//! markers ([`usdt`]), as [`Site`]s.

use std::io;
use std::path::Path;

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};

use super::elf::Elf;
use super::emulated::is_emulated;
use super::prologue::{ENDBR64, HARMLESS_WINDOW, harmless_prefix};
use super::{AttachError, Entry, Role, Site, api, free_sites, returns, static_image, usdt};
use crate::sys::panic_text;

/// The allocator sites of `image` for the given API, and its USDT region
/// markers (see [`usdt`]).
///
/// Total on any file a tracked process can map: an image that is not an
/// x86-64 ELF image, or whose headers, symbols or code make no sense, is
/// an error that [`AttachError::skip_reason`] names (the image is then
/// skipped, not the capture failed); sizes, counts and loops are bounded
/// by the file, and a panic in a parser is caught and reported the same
/// way.
pub fn find_sites(image: &Path, api: &[Entry]) -> Result<Vec<Site>, AttachError> {
    let data = crate::sys::map_file(image).map_err(|source| read_error(image, source))?;
    sites_in(image, &data, api)
}

/// The allocator sites of `image` a capture probes: [`find_sites`] over
/// every API, less the `operator new` sites of an image without an
/// allocator of its own (libstdc++, libc++) unless `probe_new`. That
/// operator new only calls malloc, which is probed anyway: one trap less
/// per C++ allocation (issue 22). Its probe is wanted only when stacks are
/// walked by frame pointers (`--unwind fp`, or tables that failed to
/// load): it captures the stack at new's entry for the malloc to take.
/// Stacks from unwind tables start at new's caller without it (its rows
/// are flagged `MT_ROW_ALLOC_WRAPPER`, `unwind/table.rs`), and without
/// stacks (`--stack-depth 0`) it only counted its own hits.
pub fn capture_sites(image: &Path, probe_new: bool) -> Result<Vec<Site>, AttachError> {
    let mut sites = find_sites(image, &api::all())?;
    if !probe_new && !sites.iter().any(|s| s.role == Role::Alloc) {
        sites.retain(|s| s.role != Role::New);
    }
    Ok(sites)
}

/// An image that could not be read: one that is not a regular file, or
/// too large to read, is skipped like a malformed one.
fn read_error(image: &Path, source: io::Error) -> AttachError {
    match source.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::FileTooLarge => AttachError::Unexaminable {
            path: image.to_owned(),
            reason: source.to_string(),
        },
        _ => AttachError::Read {
            path: image.to_owned(),
            source,
        },
    }
}

/// [`find_sites`] over the image's bytes, `data`.
pub fn sites_in(image: &Path, data: &[u8], api: &[Entry]) -> Result<Vec<Site>, AttachError> {
    let parse_err = |reason: String| AttachError::Parse {
        path: image.to_owned(),
        reason,
    };
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let elf = Elf::parse(image, data)?;
        search(&elf, image, api)
    }));
    caught.unwrap_or_else(|panic| {
        Err(parse_err(format!(
            "parser panicked: {}",
            panic_text(&*panic)
        )))
    })
}

/// The search of [`find_sites`] in a parsed image.
fn search(elf: &Elf<'_>, image: &Path, api: &[Entry]) -> Result<Vec<Site>, AttachError> {
    let parse_err = |reason: String| AttachError::Parse {
        path: image.to_owned(),
        reason,
    };
    let mut functions = elf.functions(api.iter().map(|e| e.name.as_str()));
    static_image::complete(&elf.file, elf.data, image, api, &mut functions)?;
    let mut sites: Vec<Site> = Vec::new();
    let mut allocs: Vec<(&Entry, u64)> = Vec::new();
    let got_tails = elf.got_tails();
    let frees: Vec<u64> = api
        .iter()
        .filter(|e| e.role == Role::Free)
        .filter_map(|e| functions.get(e.name.as_bytes()).copied())
        .collect();
    // The image's FDE ranges, read once if split frees or return sites
    // need them.
    let fdes = std::cell::OnceCell::new();
    let splits = split_frees(elf, &frees, &fdes);
    for entry in api {
        let (name, kind) = (entry.name.as_str(), entry.kind);
        let Some(&vaddr) = functions.get(name.as_bytes()) else {
            continue;
        };
        let Some(role) = own_role(entry, &sites) else {
            continue;
        };
        if let Some(split) = splits.get(&vaddr).filter(|_| role == Role::Free) {
            add_split(elf, image, entry, vaddr, split, &mut sites);
            continue;
        }
        if role == Role::Free
            && tail_target(elf, &got_tails, vaddr)
                .is_some_and(|to| to != vaddr && frees.contains(&to))
        {
            // A tail call of another free (mimalloc's mi_free_size jumps
            // to mi_free, jemalloc's aligned delete to free): its probe
            // sees the call, one record.
            continue;
        }
        let Some(entry_off) = elf.code_offset(vaddr) else {
            return Err(parse_err(format!(
                "{name} at {vaddr:#x} is in no executable segment"
            )));
        };
        if sites
            .iter()
            .any(|s| s.offset.wrapping_sub(s.skipped) == entry_off)
        {
            continue; // an alias of a site we have
        }
        // endbr64 only marks an indirect-branch target: the probe can go
        // after it, where the return address is still on top of the stack.
        let mut skipped = 0;
        if elf.bytes_at(entry_off, 4) == Some(&ENDBR64[..]) {
            skipped = 4;
        }
        if role == Role::Free {
            skipped += vaddr
                .checked_add(skipped)
                .and_then(|at| elf.null_test_len(at))
                .unwrap_or(0);
        }
        let mut abi = entry.abi;
        let prefix = elf
            .code_at(entry_off + skipped, HARMLESS_WINDOW)
            .and_then(harmless_prefix);
        if let Some(prefix) = prefix {
            if let Some(moved) = prefix.relocate(role, abi) {
                abi = moved;
                skipped += prefix.len as u64;
            }
        }
        let offset = entry_off + skipped;
        if !elf.is_instruction(offset) {
            return Err(parse_err(format!(
                "{name} at {vaddr:#x}: no instruction at file offset {offset:#x}"
            )));
        }
        let emulated = elf.code_at(offset, 16).is_some_and(is_emulated);
        sites.push(Site {
            image: image.to_owned(),
            symbol: name.to_owned(),
            role,
            kind,
            abi,
            offset,
            skipped,
            emulated,
            hit_slot: None,
        });
        if role == Role::Alloc {
            allocs.push((entry, vaddr));
        }
    }
    add_return_sites(elf, image, &got_tails, &fdes, &allocs, &mut sites);
    sites.extend(usdt::find_markers(elf, image));
    Ok(sites)
}

/// The frees at `frees` split past their NULL test (see [`free_sites`]).
fn split_frees(
    elf: &Elf<'_>,
    frees: &[u64],
    fdes: &std::cell::OnceCell<Vec<(u64, u64)>>,
) -> std::collections::HashMap<u64, free_sites::Split> {
    let candidates: Vec<u64> = frees
        .iter()
        .copied()
        .filter(|&at| {
            let skip = if elf.code_offset(at).and_then(|o| elf.bytes_at(o, 4)) == Some(&ENDBR64[..])
            {
                4
            } else {
                0
            };
            elf.null_test_len(at + skip).is_none()
        })
        .collect();
    if candidates.is_empty() {
        return std::collections::HashMap::new();
    }
    let code = |at: u64| elf.code_offset(at).and_then(|o| elf.code_at(o, 16));
    let emulated = |at: u64| code(at).is_some_and(is_emulated);
    let fdes = fdes.get_or_init(|| elf.fde_ranges());
    let fde_start = |at: u64| fdes.binary_search_by_key(&at, |&(start, _)| start).is_ok();
    let referrers = |targets: &[u64]| elf.referrers(targets);
    free_sites::split(&code, &emulated, &fde_start, &referrers, &candidates)
}

/// Adds the sites of the free `entry` at `vaddr`, split in two (its slow
/// path's with the first free of those sharing it), unless it is an alias
/// of a free split already.
fn add_split(
    elf: &Elf<'_>,
    image: &Path,
    entry: &Entry,
    vaddr: u64,
    split: &free_sites::Split,
    sites: &mut Vec<Site>,
) {
    let aliased = elf.code_offset(vaddr).is_some_and(|off| {
        sites
            .iter()
            .any(|s| s.offset.wrapping_sub(s.skipped) == off)
    });
    if aliased {
        return;
    }
    let site = |at: &free_sites::FreeSite| {
        let offset = elf.code_offset(at.vaddr)?;
        Some(Site {
            image: image.to_owned(),
            symbol: entry.name.clone(),
            role: Role::Free,
            kind: entry.kind,
            abi: api::Abi {
                ptr: (at.ptr != 0).then_some(at.ptr),
                sp_adjust: at.sp_adjust,
                free_split: true,
                free_cond: at.cond,
                ..entry.abi
            },
            offset,
            skipped: at.vaddr.wrapping_sub(vaddr),
            emulated: elf.code_at(offset, 16).is_some_and(is_emulated),
            hit_slot: None,
        })
    };
    sites.extend(
        std::iter::once(&split.fast)
            .chain(split.slow.as_ref())
            .filter_map(site),
    );
}

/// Adds the return sites of the allocating functions `allocs` found in
/// `image` to `sites` (see [`returns`]); an allocator's operator new whose
/// returns cannot all be found goes back to capturing its stack only (no
/// kernel return probe on it: an exception thrown out of it could not
/// unwind).
fn add_return_sites(
    elf: &Elf<'_>,
    image: &Path,
    tails: &std::collections::HashMap<u64, returns::Tail>,
    fdes: &std::cell::OnceCell<Vec<(u64, u64)>>,
    allocs: &[(&Entry, u64)],
    sites: &mut Vec<Site>,
) {
    if allocs.is_empty() {
        return;
    }
    let ends = elf.function_ends(&allocs.iter().map(|&(_, at)| at).collect::<Vec<_>>());
    let fdes = fdes.get_or_init(|| elf.fde_ranges());
    for &(entry, vaddr) in allocs {
        let end = ends.get(&vaddr).copied();
        let returns = return_sites_of(elf, image, tails, fdes, entry, vaddr, end);
        if returns.is_empty() && entry.role == Role::New {
            for site in sites.iter_mut().filter(|s| s.symbol == entry.name) {
                site.role = Role::New;
            }
        }
        sites.extend(returns);
    }
}

/// Where the function at `vaddr` goes if it starts with a tail jump
/// (after `endbr64`): the jump's target, through a PLT stub's GOT slot
/// where the image defines the function it names.
fn tail_target(
    elf: &Elf<'_>,
    tails: &std::collections::HashMap<u64, returns::Tail>,
    vaddr: u64,
) -> Option<u64> {
    let code = |at: u64| elf.code_at(elf.code_offset(at)?, 16);
    let decode = |at: u64| Some(Decoder::with_ip(64, code(at)?, at, DecoderOptions::NONE).decode());
    let mut insn = decode(vaddr)?;
    if insn.mnemonic() == Mnemonic::Endbr64 {
        insn = decode(insn.next_ip())?;
    }
    if insn.mnemonic() != Mnemonic::Jmp || insn.op0_kind() == OpKind::Memory {
        return None;
    }
    let to = insn.near_branch_target();
    match returns::stub_slot(&code, to) {
        Some(slot) => match tails.get(&slot) {
            Some(returns::Tail::Jump(at)) => Some(*at),
            _ => None,
        },
        None => Some(to),
    }
}

/// The role `entry` takes in an image whose sites so far are `sites`
/// (the allocator's C API comes first in [`api::all`]): C++ `operator new`
/// and `delete` of an image with an allocator of its own (jemalloc,
/// tcmalloc, mimalloc) call no probed malloc or free, so they allocate and
/// free themselves (issue 41); elsewhere (libstdc++, libc++) new only
/// captures its stack for the malloc it calls, and delete, which calls
/// free, is not probed (None).
fn own_role(entry: &Entry, sites: &[Site]) -> Option<Role> {
    let own_allocator = || sites.iter().any(|s| s.role == Role::Alloc);
    match entry.role {
        Role::New if own_allocator() => Some(Role::Alloc),
        Role::Free if api::is_delete(&entry.name) && !own_allocator() => None,
        role => Some(role),
    }
}

/// The return sites of allocating function `entry` at `vaddr` (see
/// [`returns`]), as sites; none where they cannot all be found (the
/// function then takes a kernel return probe).
fn return_sites_of(
    elf: &Elf<'_>,
    image: &Path,
    tails: &std::collections::HashMap<u64, returns::Tail>,
    fdes: &[(u64, u64)],
    entry: &Entry,
    vaddr: u64,
    end: Option<u64>,
) -> Vec<Site> {
    // MEMTRAIL_RETURN_SITES=0: kernel return probes (tests of their
    // check, and a way back should a return site ever read wrong).
    if std::env::var_os("MEMTRAIL_RETURN_SITES").is_some_and(|v| v == "0") {
        return Vec::new();
    }
    let code = |at: u64| elf.code_offset(at).and_then(|o| elf.code_at(o, 16));
    let emulated = |at: u64| code(at).is_some_and(is_emulated);
    let got = |slot: u64| tails.get(&slot).copied();
    // The function holding an address: its FDE's range, else (the entry's
    // own code without one) its symbol's.
    let function = |at: u64| {
        let i = fdes.partition_point(|&(start, _)| start <= at);
        i.checked_sub(1)
            .map(|i| fdes[i])
            .filter(|&(_, end)| at < end)
            .or_else(|| {
                end.map(|end| (vaddr, end))
                    .filter(|r| (r.0..r.1).contains(&at))
            })
    };
    let found = returns::return_sites(&code, &emulated, &got, &function, vaddr, entry.abi.out_ptr);
    let found = match found {
        Ok(found) => found,
        Err(why) => {
            tracing::debug!(image = %image.display(), function = entry.name, %why,
                "no return sites: a kernel return probe");
            return Vec::new();
        }
    };
    tracing::debug!(image = %image.display(), function = entry.name, sites = found.len(),
        on_ret = found.iter().filter(|r| r.on_ret).count(), "return sites");
    tracing::trace!(function = entry.name, ?found, "return sites");
    let sites: Option<Vec<Site>> = found
        .into_iter()
        .map(|r| {
            Some(Site {
                image: image.to_owned(),
                symbol: entry.name.clone(),
                role: Role::Return(r),
                kind: entry.kind,
                abi: entry.abi,
                offset: elf.code_offset(r.vaddr)?,
                skipped: r.vaddr.wrapping_sub(vaddr),
                emulated: !r.on_ret,
                hit_slot: None,
            })
        })
        .collect();
    sites.unwrap_or_default()
}
