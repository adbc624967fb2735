//! USDT region markers: the SystemTap SDT notes of provider `memtrail`
//! (`include/memtrail_usdt.h`) in an image.
//!
//! Each note of `.note.stapsdt` (type 3, owner `stapsdt`) describes one
//! probe: its link-time address, the link-time address of the image's
//! `.stapsdt.base` section, a semaphore address, then provider, name and
//! argument description. An image moved after linking (prelink) has its
//! `.stapsdt.base` elsewhere: the probe moved by the same amount. The
//! address then becomes a file offset through the loadable segments, which
//! is what a uprobe takes.
//!
//! Only `memtrail:region_begin` (one argument, the name's address, in a
//! register: `8@%reg`) and `memtrail:region_end` are probed; notes of other
//! providers (libc's, libstdc++'s) are ignored, and a memtrail note whose
//! argument is not in a register is skipped with a warning, as is one
//! whose address is not an instruction in an executable segment. The notes
//! come from the image, which any tracked program can craft: the walk is
//! bounded by the section, and an image gets at most [`MAX_MARKERS`].

use object::{Object, ObjectSection};

use super::elf::Elf;
use super::emulated::is_emulated;
use super::{Abi, Role, Site, api::SIZE0};
use crate::bpf::record::Kind;

/// The provider the markers use.
pub const PROVIDER: &str = "memtrail";

/// The most markers probed in one image (each is a breakpoint and a site
/// in the profile); the notes past them are skipped with a warning.
pub const MAX_MARKERS: usize = 4096;

/// Note type of an SDT probe.
const NT_STAPSDT: u32 = 3;

/// Registers by name, numbered as `enum mt_usdt_reg` (bpf/memtrail.h).
const REGS: [&str; 16] = [
    "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13",
    "r14", "r15",
];

/// One probe note.
#[derive(Debug, PartialEq, Eq)]
struct Note<'a> {
    pc: u64,
    base: u64,
    provider: &'a str,
    name: &'a str,
    args: &'a str,
}

/// The marker sites of an image (none when it has no memtrail notes).
pub(super) fn find_markers(elf: &Elf<'_>, image: &std::path::Path) -> Vec<Site> {
    let Some(section) = elf.file.section_by_name(".note.stapsdt") else {
        return Vec::new();
    };
    let Ok(data) = section.data() else {
        return Vec::new();
    };
    let base_addr = elf
        .file
        .section_by_name(".stapsdt.base")
        .map(|s| s.address());
    let mut sites = Vec::new();
    for note in notes(data).filter(|n| n.provider == PROVIDER) {
        let kind = match note.name {
            "region_begin" => Kind::RegionBegin,
            "region_end" => Kind::RegionEnd,
            _ => continue,
        };
        let reg = if kind == Kind::RegionBegin {
            match arg_register(note.args) {
                Some(reg) => reg,
                None => {
                    tracing::warn!(
                        target: crate::profile::NOTE,
                        image = %image.display(),
                        args = note.args,
                        "memtrail:region_begin with its name not in a register: skipped"
                    );
                    continue;
                }
            }
        } else {
            0
        };
        let pc = match base_addr {
            // Prelinked: the probe moved as far as the base section did.
            Some(actual) if note.base != 0 && actual != note.base => {
                note.pc.wrapping_add(actual.wrapping_sub(note.base))
            }
            _ => note.pc,
        };
        let Some(offset) = elf.code_offset(pc).filter(|&at| elf.is_instruction(at)) else {
            tracing::warn!(
                target: crate::profile::NOTE,
                image = %image.display(),
                pc,
                "marker not on an instruction of an executable segment: skipped"
            );
            continue;
        };
        if sites.len() == MAX_MARKERS {
            tracing::warn!(
                image = %image.display(),
                max = MAX_MARKERS,
                "more region markers than memtrail probes in one image: the rest are skipped"
            );
            break;
        }
        let emulated = elf.code_at(offset, 16).is_some_and(is_emulated)
            || elf.bytes_at(offset, 1) == Some(&[0x90][..]);
        sites.push(Site {
            image: image.to_owned(),
            symbol: format!("{PROVIDER}:{}", note.name),
            role: Role::Marker,
            kind,
            abi: marker_abi(reg),
            offset,
            skipped: 0,
            emulated,
            hit_slot: None,
        });
    }
    sites
}

/// A marker's [`Abi`]: `size` is the register holding the begin probe's
/// name (`enum mt_usdt_reg`); the rest is unused.
fn marker_abi(reg: u8) -> Abi {
    Abi { size: reg, ..SIZE0 }
}

/// The attach cookie of a marker site (see `struct mt_region_event`).
pub(super) fn marker_cookie(site: &Site) -> u64 {
    let shift = crate::bpf::skel::memtrail::types::mt_usdt_reg::MT_USDT_REG_SHIFT.0;
    site.kind as u64 | u64::from(site.abi.size) << shift
}

/// The register of a one-register argument description (`8@%rdi`,
/// `-8@%rax`).
fn arg_register(args: &str) -> Option<u8> {
    let mut words = args.split_whitespace();
    let first = words.next()?;
    let (size, loc) = first.split_once('@')?;
    if !matches!(size, "8" | "-8") {
        return None;
    }
    let reg = loc.strip_prefix('%')?;
    REGS.iter().position(|r| *r == reg).map(|i| i as u8)
}

/// The SDT notes of a `.note.stapsdt` section; a malformed note ends the
/// walk.
fn notes(data: &[u8]) -> impl Iterator<Item = Note<'_>> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        loop {
            let word = |i: usize| -> Option<u32> {
                Some(u32::from_ne_bytes(
                    data.get(i..i.checked_add(4)?)?.try_into().ok()?,
                ))
            };
            let (namesz, descsz) = (word(at)? as usize, word(at.checked_add(4)?)? as usize);
            let ty = word(at.checked_add(8)?)?;
            let name_at = at.checked_add(12)?;
            let desc_at = name_at.checked_add(namesz.checked_add(3)? & !3)?;
            let next = desc_at.checked_add(descsz.checked_add(3)? & !3)?;
            let owner = data.get(name_at..name_at.checked_add(namesz)?)?;
            let desc = data.get(desc_at..desc_at.checked_add(descsz)?)?;
            // Each note moves the walk on by at least its 12-byte header.
            at = next;
            if ty != NT_STAPSDT || owner != b"stapsdt\0" {
                continue;
            }
            if let Some(note) = parse_desc(desc) {
                return Some(note);
            }
        }
    })
}

fn parse_desc(desc: &[u8]) -> Option<Note<'_>> {
    let addr = |i: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(desc.get(i..i + 8)?.try_into().ok()?))
    };
    let (pc, base) = (addr(0)?, addr(8)?);
    let mut strings = desc.get(24..)?.split(|&b| b == 0);
    let mut text = || std::str::from_utf8(strings.next()?).ok();
    Some(Note {
        pc,
        base,
        provider: text()?,
        name: text()?,
        args: text()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(pc: u64, base: u64, strings: &[&str]) -> Vec<u8> {
        let mut desc = Vec::new();
        desc.extend_from_slice(&pc.to_ne_bytes());
        desc.extend_from_slice(&base.to_ne_bytes());
        desc.extend_from_slice(&0u64.to_ne_bytes());
        for s in strings {
            desc.extend_from_slice(s.as_bytes());
            desc.push(0);
        }
        let mut out = Vec::new();
        out.extend_from_slice(&8u32.to_ne_bytes());
        out.extend_from_slice(&(desc.len() as u32).to_ne_bytes());
        out.extend_from_slice(&NT_STAPSDT.to_ne_bytes());
        out.extend_from_slice(b"stapsdt\0");
        while desc.len() % 4 != 0 {
            desc.push(0);
        }
        out.extend_from_slice(&desc);
        out
    }

    /// Check that notes are read in order with their strings, and that a
    /// cut note ends the walk.
    #[test]
    fn attach_usdt_notes() {
        let mut data = note(0x1055, 0x200a, &["memtrail", "region_begin", "8@%rax"]);
        data.extend(note(0x1060, 0x200a, &["libc", "setjmp", "8@%rdi -4@%esi"]));
        data.extend(note(0x1070, 0x200a, &["memtrail", "region_end", ""]));
        let all: Vec<Note<'_>> = notes(&data).collect();
        assert_eq!(all.len(), 3);
        assert_eq!(
            all[0],
            Note {
                pc: 0x1055,
                base: 0x200a,
                provider: "memtrail",
                name: "region_begin",
                args: "8@%rax"
            }
        );
        assert_eq!((all[2].name, all[2].args), ("region_end", ""));
        assert_eq!(notes(&data[..data.len() - 8]).count(), 2);
    }

    /// Check the argument descriptions a marker's name may have.
    #[test]
    fn attach_usdt_arg_register() {
        assert_eq!(arg_register("8@%rax"), Some(0));
        assert_eq!(arg_register("-8@%rdi"), Some(5));
        assert_eq!(arg_register("8@%r15"), Some(15));
        assert_eq!(arg_register("8@-16(%rbp)"), None);
        assert_eq!(arg_register("4@%eax"), None);
        assert_eq!(arg_register(""), None);
    }
}
