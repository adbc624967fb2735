//! Probe links: the programs allocator sites take ([`AllocPrograms`]),
//! the uprobe_multi links that attach them to an image's sites, system-wide
//! or in one process ([`link_sites`]), which detach when dropped
//! ([`Links`]), and the sites' hit counters.
//!
//! Every site gets a hit counter in BPF ([`HitSlots`], carried in its
//! cookie), read after the capture into the profile's `probes`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use libbpf_rs::Link;

use super::{AttachError, Role, Site, shim};
use crate::bpf::skel::memtrail::MemtrailSkel;
use crate::bpf::skel::memtrail::types as t;
use crate::sys::UprobeKind;

/// Sites that get a hit counter in a capture (`MT_MAX_SITES`); the ones
/// attached after them are probed all the same, without a count.
pub const MAX_COUNTED_SITES: u32 = t::mt_site_hits::MT_MAX_SITES.0;

/// Hands out the hit counters of BPF's `site_hits` to sites in the order
/// they are attached, up front and then by the attach worker: a site keeps
/// its counter for the whole capture, and none is handed out twice.
#[derive(Debug, Default)]
pub struct HitSlots {
    next: u32,
}

impl HitSlots {
    /// Gives each of `sites` the next free counter, while there is one.
    pub fn assign(&mut self, sites: &mut [Site]) {
        for site in sites {
            site.hit_slot = (self.next < MAX_COUNTED_SITES).then_some(self.next);
            if self.next == MAX_COUNTED_SITES {
                tracing::warn!(
                    target: crate::profile::NOTE,
                    %site,
                    max = MAX_COUNTED_SITES,
                    "probe sites past this one have no hit count"
                );
            }
            self.next = self.next.saturating_add(1);
        }
    }
}

/// Each site's hits in tracked threads, summed over BPF's per-CPU rows of
/// `site_hits`; None for a site without a counter. Read once the probes are
/// detached, when the counts no longer move.
pub fn read_site_hits(skel: &MemtrailSkel<'_>, sites: &[Site]) -> Vec<Option<u64>> {
    let bss = skel
        .maps
        .bss_data
        .as_deref()
        .expect("the BPF object has a .bss");
    sites
        .iter()
        .map(|site| {
            let slot = usize::try_from(site.hit_slot?).ok()?;
            Some(bss.site_hits.iter().map(|row| row[slot]).sum())
        })
        .collect()
}

/// Probe links; dropping them detaches the probes.
///
/// Each detach waits for an RCU grace period in the kernel (~0.1 s here), so
/// the links are dropped in parallel rather than one after the other.
#[derive(Default)]
pub struct Links {
    libbpf: Vec<Link>,
    fds: Vec<OwnedFd>,
}

impl Links {
    pub fn push(&mut self, link: Link) {
        self.libbpf.push(link);
    }

    pub fn push_fd(&mut self, link: OwnedFd) {
        self.fds.push(link);
    }

    pub fn len(&self) -> usize {
        self.libbpf.len() + self.fds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves `other`'s links into `self`.
    pub fn append(&mut self, other: &mut Links) {
        self.libbpf.append(&mut other.libbpf);
        self.fds.append(&mut other.fds);
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        fn spawn_drop<'s, T: Send + 's>(scope: &'s std::thread::Scope<'s, '_>, item: T) {
            // A thread that cannot start drops its link right here.
            if let Err(err) = std::thread::Builder::new().spawn_scoped(scope, move || drop(item)) {
                tracing::debug!(%err, "detaching serially");
            }
        }
        std::thread::scope(|scope| {
            for link in self.libbpf.drain(..) {
                spawn_drop(scope, link);
            }
        });
        // A few hundred at a time: a storm of exits with per-process
        // probes hands over thousands.
        let mut fds = std::mem::take(&mut self.fds);
        while !fds.is_empty() {
            let rest = fds.split_off(fds.len().min(256));
            std::thread::scope(|scope| {
                for fd in fds.drain(..) {
                    spawn_drop(scope, fd);
                }
            });
            fds = rest;
        }
    }
}

/// The programs allocator sites take, as program fds (sendable to the
/// attach worker), and the USDT region markers'.
pub struct AllocPrograms {
    pub sites: SitePrograms,
    pub marker: OwnedFd,
    /// The program of the preload shim's hook ([`shim`]), with
    /// `--preload` only.
    pub shim: Option<ShimProgram>,
}

/// The program the preload shim's hook takes, how, and with which cookie.
pub struct ShimProgram {
    pub prog: OwnedFd,
    /// A session (`alloc_session`, cookie [`shim::HOOK_COOKIE`]: its entry
    /// asks for no return), or an entry (`shim_hook`, without sessions).
    pub kind: UprobeKind,
    pub cookie: u64,
}

/// The programs of allocator sites: one set of `bpf/alloc.c`'s two
/// (see [`uprobe_sessions`]).
pub enum SitePrograms {
    /// `alloc_session`: entries and returns, one link per image.
    Session(OwnedFd),
    /// `alloc_enter` (allocating calls, C++ operator new and the libc
    /// syscall wrappers, told apart by the cookie), `alloc_return` and
    /// `free_enter`: a link each per image.
    Split {
        enter: OwnedFd,
        ret: OwnedFd,
        free: OwnedFd,
    },
}

/// The first Linux release with uprobe sessions (`uprobe.session`).
const UPROBE_SESSION: (u32, u32) = (6, 13);

/// Whether allocator sites are probed through one uprobe session program
/// (Linux 6.13 and later, unless `MEMTRAIL_UPROBE_SESSION=0`): one link per
/// image instead of three. The kernel detaches links one after another,
/// each after RCU grace periods of its own: with three links for libc and
/// one for libstdc++, `memtrail run -- true` waited 49-71 ms for its
/// probes to go, with two 39-64 ms (perf/RESULTS.md).
pub fn uprobe_sessions() -> bool {
    std::env::var_os("MEMTRAIL_UPROBE_SESSION").is_none_or(|v| v != "0")
        && crate::sys::kernel_release() >= UPROBE_SESSION
}

impl AllocPrograms {
    /// memtrail's own allocator programs: the session program if
    /// `session`, else the three split ones (whichever set was loaded),
    /// and the preload shim's if `preload` (loaded then only).
    pub fn memtrail(skel: &MemtrailSkel<'_>, session: bool, preload: bool) -> io::Result<Self> {
        let p = &skel.progs;
        let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned();
        let sites = if session {
            SitePrograms::Session(dup(p.alloc_session.as_fd())?)
        } else {
            SitePrograms::Split {
                enter: dup(p.alloc_enter.as_fd())?,
                ret: dup(p.alloc_return.as_fd())?,
                free: dup(p.free_enter.as_fd())?,
            }
        };
        Ok(Self {
            sites,
            marker: dup(p.region_marker.as_fd())?,
            shim: match (preload, session) {
                (false, _) => None,
                (true, true) => Some(ShimProgram {
                    prog: dup(p.alloc_session.as_fd())?,
                    kind: UprobeKind::Session,
                    cookie: shim::HOOK_COOKIE,
                }),
                (true, false) => Some(ShimProgram {
                    prog: dup(p.shim_hook.as_fd())?,
                    kind: UprobeKind::Entry,
                    cookie: 0,
                }),
            },
        })
    }
}

/// Attaches `progs` to every site of one image, with one uprobe_multi link
/// per program; each site's attach cookie is its kind and argument layout,
/// and its hit counter, handed out here by `slots`. The links detach when
/// dropped. Probes are system-wide: see [`link_sites`].
pub fn attach_sites(
    progs: &AllocPrograms,
    sites: &mut [Site],
    slots: &mut HitSlots,
    links: &mut Links,
) -> Result<(), AttachError> {
    slots.assign(sites);
    let Some(image) = sites.first().map(|s| s.image.clone()) else {
        return Ok(());
    };
    link_sites(progs, sites, &image, 0, links)
}

/// Attaches `progs` to `sites` (of one image, their hit counters handed
/// out), reaching the file through `path`: in every process with `pid` 0,
/// else only in process `pid`.
pub fn link_sites(
    progs: &AllocPrograms,
    sites: &[Site],
    path: &Path,
    pid: u32,
    links: &mut Links,
) -> Result<(), AttachError> {
    link_sites_with(progs, sites, path, pid, links, 0)
}

/// [`link_sites`], with `bits` or'ed into every site's cookie (the
/// preload shim's, [`shim::SHIM_COOKIE`]).
pub fn link_sites_with(
    progs: &AllocPrograms,
    sites: &[Site],
    path: &Path,
    pid: u32,
    links: &mut Links,
    bits: u64,
) -> Result<(), AttachError> {
    let of_role = |role: Role| {
        sites
            .iter()
            .filter(move |s| s.role == role)
            .collect::<Vec<_>>()
    };
    let (allocs, frees, markers) = (
        of_role(Role::Alloc),
        of_role(Role::Free),
        of_role(Role::Marker),
    );
    // Return sites, once per instruction (a function's tail code shared
    // with another's is read the same way by both).
    let mut at = std::collections::HashSet::new();
    let returns: Vec<&Site> = sites
        .iter()
        .filter(|s| matches!(s.role, Role::Return(_)) && at.insert(s.offset))
        .collect();
    let kret = kernel_returns(sites);
    // Every entry of alloc_enter in one link: allocating calls, their
    // return sites, operator new and the syscall wrappers (entry only;
    // their cookies tell them apart). With sessions, the frees too.
    let mut entries = allocs.clone();
    entries.extend(returns);
    entries.extend(of_role(Role::New));
    entries.extend(of_role(Role::Syscall));
    let groups: Vec<(BorrowedFd<'_>, UprobeKind, Vec<&Site>)> = match &progs.sites {
        SitePrograms::Session(prog) => {
            entries.extend(frees);
            vec![(prog.as_fd(), UprobeKind::Session, entries)]
        }
        SitePrograms::Split { enter, ret, free } => vec![
            (enter.as_fd(), UprobeKind::Entry, entries),
            (ret.as_fd(), UprobeKind::Return, kret.clone()),
            (free.as_fd(), UprobeKind::Entry, frees),
        ],
    };
    let markers = (progs.marker.as_fd(), UprobeKind::Entry, markers);
    let kret_bit = 1u64 << t::mt_cookie_layout::MT_CK_KRET_BIT.0;
    for (prog, kind, group) in groups.into_iter().chain([markers]) {
        if group.is_empty() {
            continue;
        }
        let offsets: Vec<u64> = group.iter().map(|s| s.offset).collect();
        let cookies: Vec<u64> = group
            .iter()
            .map(|s| {
                let kret = kret.iter().any(|k| std::ptr::eq(*k, *s));
                s.cookie() | bits | if kret { kret_bit } else { 0 }
            })
            .collect();
        let link = crate::sys::uprobe_multi(prog, path, &offsets, &cookies, kind, pid)
            .map_err(|err| uprobe_error(&group, err))?;
        links.push_fd(link);
    }
    Ok(())
}

/// The allocating sites of `sites` whose results come through a kernel
/// return probe: those without return sites of their name (see
/// [`returns`]: their code could not be followed to every return).
pub fn kernel_returns(sites: &[Site]) -> Vec<&Site> {
    sites
        .iter()
        .filter(|s| {
            s.role == Role::Alloc
                && !sites.iter().any(|r| {
                    matches!(r.role, Role::Return(_)) && r.symbol == s.symbol && r.image == s.image
                })
        })
        .collect()
}

fn uprobe_error(group: &[&Site], source: crate::sys::SysError) -> AttachError {
    let names = group
        .iter()
        .map(|s| s.symbol.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let image = group.first().map(|s| s.image.clone()).unwrap_or_default();
    if source.errno() == Some(libc::EINVAL)
        && crate::sys::kernel_log_tail(64 * 1024).contains("ref_ctr_offset mismatch")
    {
        return AttachError::Conflict {
            path: image,
            symbol: names,
        };
    }
    AttachError::Uprobe {
        path: image,
        symbol: names,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::{HitSlots, MAX_COUNTED_SITES};
    use crate::attach::api::SIZE0;
    use crate::attach::{Role, Site};
    use crate::bpf::record::Kind;

    /// Check that hit counters are handed out once each, in order, across
    /// calls (images attached one after another), up to the last one; a
    /// site past it is not counted, and its cookie says so (0 in bits
    /// 48-63) while keeping its kind and layout.
    #[test]
    fn attach_hit_slots_bounded() {
        let site = Site {
            image: "/lib/libc.so.6".into(),
            symbol: "malloc".into(),
            role: Role::Alloc,
            kind: Kind::Malloc,
            abi: SIZE0,
            offset: 0x1000,
            skipped: 0,
            emulated: true,
            hit_slot: None,
        };
        let layout = site.cookie();
        assert_eq!(layout >> 48, 0);
        let mut slots = HitSlots::default();
        let mut first = vec![site.clone(); 3];
        slots.assign(&mut first);
        let got: Vec<_> = first.iter().map(|s| s.hit_slot).collect();
        assert_eq!(got, [Some(0), Some(1), Some(2)]);
        assert_eq!(first[2].cookie(), layout | 3 << 48);
        let mut rest = vec![site.clone(); MAX_COUNTED_SITES as usize];
        slots.assign(&mut rest);
        assert_eq!(
            rest[MAX_COUNTED_SITES as usize - 4].hit_slot,
            Some(MAX_COUNTED_SITES - 1)
        );
        assert_eq!(
            rest[MAX_COUNTED_SITES as usize - 4].cookie(),
            layout | u64::from(MAX_COUNTED_SITES) << 48
        );
        assert!(
            rest[MAX_COUNTED_SITES as usize - 3..]
                .iter()
                .all(|s| s.hit_slot.is_none())
        );
        assert_eq!(rest[MAX_COUNTED_SITES as usize - 1].cookie(), layout);
    }
}
