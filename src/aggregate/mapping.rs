//! A process's anonymous regions, each *reserved* (mapped without access
//! rights: `PROT_NONE`, address space only) or *committed* (mapped with
//! access rights, or given them by mprotect), cut into pieces by munmap,
//! mremap and mprotect of part of them.

use std::collections::BTreeMap;

/// An anonymous region: its end, the stack (or pseudo-site) that mapped
/// it, 0 if none, and whether it has no access rights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Region {
    pub end: u64,
    pub stack: u64,
    pub reserved: bool,
}

/// A piece of a region cut out: its start, end and region.
pub(super) type Piece = (u64, u64, Region);

/// Regions by start.
pub(super) type Regions = BTreeMap<u64, Region>;

/// Removes [start, end) from `regions`; returns the pieces removed, the
/// lowest last.
pub(super) fn cut(regions: &mut Regions, start: u64, end: u64) -> Vec<Piece> {
    let overlapping: Vec<(u64, Region)> = regions
        .range(..end)
        .rev()
        .take_while(|&(_, r)| r.end > start)
        .map(|(&s, &r)| (s, r))
        .collect();
    let mut pieces = Vec::with_capacity(overlapping.len());
    for (s, r) in overlapping {
        regions.remove(&s);
        if s < start {
            regions.insert(s, Region { end: start, ..r });
        }
        if r.end > end {
            regions.insert(end, r);
        }
        pieces.push((s.max(start), r.end.min(end), r));
    }
    pieces
}

/// The committed and reserved bytes of `pieces`.
pub(super) fn bytes(pieces: &[Piece]) -> (u64, u64) {
    pieces.iter().fold((0, 0), |(c, r), &(s, e, region)| {
        if region.reserved {
            (c, r + (e - s))
        } else {
            (c + (e - s), r)
        }
    })
}

/// Gives [start, end) of `regions` access rights (`reserved` false) or
/// takes them (true); returns the pieces whose state changed, as they were
/// before. Parts of the range outside every region are not ours (a file
/// mapping, the allocator's) and stay untouched.
pub(super) fn protect(regions: &mut Regions, start: u64, end: u64, reserved: bool) -> Vec<Piece> {
    let pieces = cut(regions, start, end);
    let mut changed = Vec::new();
    for (s, e, r) in pieces {
        regions.insert(
            s,
            Region {
                end: e,
                reserved,
                ..r
            },
        );
        if r.reserved != reserved {
            changed.push((s, e, r));
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(end: u64, reserved: bool) -> Region {
        Region {
            end,
            stack: 7,
            reserved,
        }
    }

    /// Check that committing the middle of a reservation splits it in
    /// three, and that the byte counts follow.
    #[test]
    fn mapping_protect_splits() {
        let mut regions = Regions::new();
        regions.insert(0x10000, region(0x20000, true));
        let changed = protect(&mut regions, 0x14000, 0x18000, false);
        assert_eq!(changed, vec![(0x14000, 0x18000, region(0x20000, true))]);
        assert_eq!(bytes(&changed), (0, 0x4000));
        let all: Vec<(u64, Region)> = regions.iter().map(|(&s, &r)| (s, r)).collect();
        assert_eq!(
            all,
            vec![
                (0x10000, region(0x14000, true)),
                (0x14000, region(0x18000, false)),
                (0x18000, region(0x20000, true)),
            ]
        );
        // Committing it again changes nothing; unmapping all removes the
        // three pieces.
        assert!(protect(&mut regions, 0x14000, 0x18000, false).is_empty());
        let gone = cut(&mut regions, 0, 0x30000);
        assert_eq!(bytes(&gone), (0x4000, 0xc000));
        assert!(regions.is_empty());
    }
}
