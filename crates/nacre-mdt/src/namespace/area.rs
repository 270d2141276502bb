//! The DoM area: where a checkpoint writes the bytes of DoM blocks, in 4 KiB units at
//! the top of the image's region of the MDT volume, just below the log. The image (redb)
//! grows up from the bottom of that region, the area down from its top, so neither takes
//! room from the other until the volume is full (a heap and a stack): an MDT without
//! small files gives all of it to inodes, one full of them all but the growth inodes
//! need to its data.
//!
//! The image keeps, per block, where its bytes are (an [`Extent`]: its runs of units,
//! length and CRC32C), a few dozen bytes instead of the bytes themselves. A B-tree that
//! held 3,901-byte values split a leaf and wrote a page for each, which cost a DoM
//! create more CPU than the rest of its change; the area takes each checkpoint's blocks
//! in a few large writes. Start-up reads only the index.
//!
//! Copy-on-write, as the image: a checkpoint writes new bytes only to free units, makes
//! them durable with the image's commit that points at them, and frees the units of the
//! blocks it replaced or removed only once that commit is done. A crash in between
//! leaves the previous image pointing at untouched units; the units written for the lost
//! commit are free again at start-up, when the area is rebuilt from the index.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use nacre_proto::mdt::errno;

use super::{DOM_BLOCK, MdError, Result, next_growth};

/// The area's unit of allocation.
pub const UNIT: u64 = 4096;

/// Units `[at, at + units * UNIT)` of the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub at: u64,
    pub units: u32,
}

impl Run {
    fn end(&self) -> u64 {
        self.at.saturating_add(self.units as u64 * UNIT)
    }
}

/// Where a DoM block's bytes are in the area: its runs (one, unless the area was
/// fragmented), in order, and what checks them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    pub len: u32,
    pub crc: u32,
    pub runs: Box<[Run]>,
}

/// A DoM block's entry in the image's index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value<'a> {
    /// Its bytes, in the index itself: what an MDT formatted before the area kept, what
    /// start-up's replay writes, and where a checkpoint puts a block the area had no
    /// room for.
    Inline(&'a [u8]),
    Area(Extent),
}

const INLINE: u8 = 0;
const IN_AREA: u8 = 1;
/// At most this many runs per block: a 64 KiB block of single units.
const RUNS_MAX: usize = 16;

impl Value<'_> {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Value::Inline(data) => {
                let mut v = Vec::with_capacity(1 + data.len());
                v.push(INLINE);
                v.extend_from_slice(data);
                v
            }
            Value::Area(e) => {
                let mut v = Vec::with_capacity(10 + 12 * e.runs.len());
                v.push(IN_AREA);
                v.extend_from_slice(&e.len.to_le_bytes());
                v.extend_from_slice(&e.crc.to_le_bytes());
                v.push(e.runs.len() as u8);
                for r in &e.runs {
                    v.extend_from_slice(&r.at.to_le_bytes());
                    v.extend_from_slice(&r.units.to_le_bytes());
                }
                v
            }
        }
    }

    /// Decode an index entry; a damaged one is named (the caller adds which block).
    pub fn decode(v: &[u8]) -> Result<Value<'_>> {
        let bad = |why: &str| MdError::new(errno::EIO, format!("DoM index entry of {} bytes: {why}", v.len()));
        match v.split_first() {
            Some((&INLINE, data)) => Ok(Value::Inline(data)),
            Some((&IN_AREA, rest)) => {
                if rest.len() < 9 {
                    return Err(bad("cut short"));
                }
                let u32_at = |i: usize| u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
                let (len, crc, n) = (u32_at(0), u32_at(4), rest[8] as usize);
                if n == 0 || n > RUNS_MAX || rest.len() != 9 + 12 * n {
                    return Err(bad(&format!("{n} runs")));
                }
                let runs: Box<[Run]> = rest[9..]
                    .chunks_exact(12)
                    .map(|c| Run {
                        at: u64::from_le_bytes(c[..8].try_into().unwrap_or_default()),
                        units: u32::from_le_bytes(c[8..].try_into().unwrap_or_default()),
                    })
                    .collect();
                let units: u64 = runs.iter().map(|r| r.units as u64).sum();
                let wraps = |r: &Run| r.at.checked_add(r.units as u64 * UNIT).is_none();
                if len as u64 > DOM_BLOCK
                    || runs.iter().any(|r| r.units == 0 || r.at % UNIT != 0 || wraps(r))
                    || units != (len as u64).div_ceil(UNIT)
                {
                    return Err(bad(&format!("runs of {units} units for {len} bytes")));
                }
                Ok(Value::Area(Extent { len, crc, runs }))
            }
            Some((tag, _)) => Err(bad(&format!("unknown kind {tag}"))),
            None => Err(bad("empty")),
        }
    }
}

/// CRC32C of a block's bytes.
pub fn crc(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// Read a block's bytes from the area and check them; what is wrong is said.
pub fn read(vol: &nacre_raid::Volume, e: &Extent) -> std::result::Result<Vec<u8>, String> {
    let units: u64 = e.runs.iter().map(|r| r.units as u64).sum();
    let mut buf = vec![0u8; (units * UNIT) as usize];
    let mut at = 0;
    for r in e.runs.iter() {
        let n = r.units as usize * UNIT as usize;
        vol.read(r.at, &mut buf[at..at + n]).map_err(|err| format!("reading {n} bytes at {}: {err}", r.at))?;
        at += n;
    }
    buf.truncate(e.len as usize);
    let found = crc(&buf);
    if found != e.crc {
        return Err(format!(
            "its {} bytes in the DoM area fail their checksum ({found:#010x}, the index says {:#010x})",
            e.len, e.crc
        ));
    }
    Ok(buf)
}

/// The area's free space: which units are free, and where it ends below.
pub struct Area {
    /// Where the area ends above (the log's start).
    top: u64,
    /// The lowest unit in use (the area is `[floor, top)`; `top` when empty).
    floor: u64,
    /// Free runs inside the area, by start: bytes; and the same by size, (bytes, start),
    /// to find one that fits without walking them all.
    free: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    free_bytes: u64,
    /// Room the image keeps beyond the area's floor whatever its growth: twice the log,
    /// so that a checkpoint of a full log (or its replay at start-up) always finds room
    /// to grow the image.
    reserve: u64,
    /// Where the image's bytes start on the volume, its live length, and the length it
    /// may grow to (kept below the floor: see [`Area::set_floor`]).
    image_at: u64,
    image_len: Arc<AtomicU64>,
    image_max: Arc<AtomicU64>,
}

impl Area {
    /// The area of a region whose image starts at `image_at` and ends at `top`: its
    /// length `image_len` (live) and the most it may grow to `image_max`, which the
    /// area lowers as it grows down, always leaving the image `reserve` bytes to grow by.
    pub fn new(top: u64, image_at: u64, image_len: Arc<AtomicU64>, image_max: Arc<AtomicU64>, reserve: u64) -> Area {
        let mut a = Area {
            top,
            floor: top,
            free: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free_bytes: 0,
            reserve,
            image_at,
            image_len,
            image_max,
        };
        a.set_floor(top);
        a
    }

    fn add_free(&mut self, at: u64, n: u64) {
        self.free.insert(at, n);
        self.by_size.insert((n, at));
    }

    fn remove_free(&mut self, at: u64) -> Option<u64> {
        let n = self.free.remove(&at)?;
        self.by_size.remove(&(n, at));
        Some(n)
    }

    /// Mark the runs of every block the index has (start-up); overlapping runs or runs
    /// outside the area mean a damaged index, and are named.
    pub fn rebuild<'e>(&mut self, extents: impl Iterator<Item = &'e Extent>) -> Result<()> {
        let mut runs: Vec<Run> = extents.flat_map(|e| e.runs.iter().copied()).collect();
        runs.sort_unstable_by_key(|r| r.at);
        let image_end = self.image_at + self.image_len.load(Ordering::Acquire);
        let mut floor = self.top;
        let mut at = self.top;
        let mut free = Vec::new();
        for r in runs.iter().rev() {
            if r.at < image_end || r.end() > at {
                return Err(MdError::new(
                    errno::EIO,
                    format!(
                        "the DoM index puts {} units at {} over {} (the image ends at {image_end}, the log starts at \
                         {})",
                        r.units,
                        r.at,
                        if r.end() > self.top {
                            "the log"
                        } else if r.at < image_end {
                            "the image"
                        } else {
                            "another block"
                        },
                        self.top
                    ),
                ));
            }
            if r.end() < at {
                free.push((r.end(), at - r.end()));
            }
            at = r.at;
            floor = r.at;
        }
        (self.free, self.by_size, self.free_bytes) = (BTreeMap::new(), BTreeSet::new(), 0);
        for (at, n) in free {
            self.add_free(at, n);
            self.free_bytes += n;
        }
        self.set_floor(floor);
        Ok(())
    }

    fn set_floor(&mut self, floor: u64) {
        self.floor = floor;
        self.image_max.store(floor.saturating_sub(self.image_at), Ordering::Release);
    }

    /// The lowest the floor may go while leaving the image room for `growths` more
    /// growths, and its reserve at least.
    fn limit(&self, growths: u32) -> u64 {
        let now = self.image_len.load(Ordering::Acquire);
        let mut len = now;
        for _ in 0..growths {
            len = next_growth(len);
        }
        self.image_at.saturating_add(len.max(now.saturating_add(self.reserve)))
    }

    /// Bytes the area can still take while leaving the image `growths` more growths.
    pub fn room(&self, growths: u32) -> u64 {
        self.free_bytes + self.floor.saturating_sub(self.limit(growths)) / UNIT * UNIT
    }

    /// Bytes in use.
    pub fn used(&self) -> u64 {
        self.top - self.floor - self.free_bytes
    }

    /// Units for `len` bytes, leaving the image `growths` more growths: one run if a free
    /// run or the floor has them, else pieces of free runs; `None` if the area has no
    /// room.
    pub fn alloc(&mut self, len: u64, growths: u32) -> Option<Box<[Run]>> {
        let want = len.div_ceil(UNIT).max(1) * UNIT;
        if want > self.room(growths) {
            return None;
        }
        // The smallest free run that holds it.
        if let Some(&(n, at)) = self.by_size.range((want, 0)..).next() {
            self.take_free(at, n, want);
            return Some(Box::new([Run { at: at + n - want, units: (want / UNIT) as u32 }]));
        }
        // Below the floor (no free run starts at the floor: `free_runs` gives any back to
        // the image, and `rebuild` puts the floor at the lowest run in use).
        let limit = self.limit(growths);
        if self.floor.saturating_sub(limit) >= want {
            let at = self.floor - want;
            self.set_floor(at);
            return Some(Box::new([Run { at, units: (want / UNIT) as u32 }]));
        }
        // Pieces: the largest free runs first, then the floor.
        let mut runs = Vec::new();
        let mut left = want;
        while left > 0 && runs.len() < RUNS_MAX - 1 {
            let Some(&(n, at)) = self.by_size.iter().next_back() else { break };
            let take = n.min(left);
            self.take_free(at, n, take);
            runs.push(Run { at: at + n - take, units: (take / UNIT) as u32 });
            left -= take;
        }
        if left > 0 && self.floor.saturating_sub(limit) >= left {
            let at = self.floor - left;
            self.set_floor(at);
            runs.push(Run { at, units: (left / UNIT) as u32 });
            left = 0;
        }
        if left > 0 {
            self.free_runs(&runs);
            return None;
        }
        Some(runs.into())
    }

    /// Take the top `take` bytes of free run `[at, at + n)`.
    fn take_free(&mut self, at: u64, n: u64, take: u64) {
        self.remove_free(at);
        if n > take {
            self.add_free(at, n - take);
        }
        self.free_bytes -= take;
    }

    /// Give runs back (their blocks are gone from the committed image). A run that is
    /// not wholly in use (outside the area, or over a free run: a damaged index entry)
    /// is left out and said, never freed twice: its units stay taken until a restart
    /// rebuilds the area.
    pub fn free_runs(&mut self, runs: &[Run]) {
        for r in runs {
            let (mut at, mut n) = (r.at, r.units as u64 * UNIT);
            let before = self.free.range(..at.saturating_add(n)).next_back().map(|(b, bn)| b + bn);
            if at < self.floor || r.end() > self.top || before.is_some_and(|end| end > at) {
                eprintln!(
                    "mdt: DoM area: {} units at {at} were to be freed but are not in use; left as they are",
                    r.units
                );
                continue;
            }
            self.free_bytes += n;
            if let Some((&b, &bn)) = self.free.range(..at).next_back()
                && b + bn == at
            {
                self.remove_free(b);
                (at, n) = (b, n + bn);
            }
            if let Some(an) = self.remove_free(at + n) {
                n += an;
            }
            self.add_free(at, n);
        }
        // A free run at the floor gives its room back to the image.
        if let Some(n) = self.remove_free(self.floor) {
            self.free_bytes -= n;
            let floor = self.floor + n;
            self.set_floor(floor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(top_units: u64) -> Area {
        Area::new(top_units * UNIT, 0, Arc::new(AtomicU64::new(UNIT)), Arc::new(AtomicU64::new(0)), 0)
    }

    #[test]
    fn values_round_trip_and_damage_is_named() {
        let e = Extent {
            len: 5000,
            crc: 7,
            runs: Box::new([Run { at: 8 * UNIT, units: 1 }, Run { at: UNIT * 20, units: 1 }]),
        };
        let v = Value::Area(e.clone()).encode();
        assert_eq!(Value::decode(&v).ok(), Some(Value::Area(e)));
        assert_eq!(Value::decode(&Value::Inline(b"abc").encode()).ok(), Some(Value::Inline(b"abc")));
        let wrong_units = Value::Area(Extent { len: 9000, crc: 0, runs: Box::new([Run { at: 0, units: 1 }]) }).encode();
        for bad in [&[][..], &[2, 0][..], &v[..v.len() - 1], &wrong_units[..]] {
            let e = Value::decode(bad).err().map(|e| e.message).unwrap_or_default();
            assert!(e.contains("DoM index entry"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_area_grows_down_reuses_what_is_freed_and_gives_the_image_its_room_back() {
        let mut a = area(100);
        let max = a.image_max.clone();
        let first = a.alloc(3901, 1).expect("room");
        assert_eq!(&*first, &[Run { at: 99 * UNIT, units: 1 }]);
        let second = a.alloc(2 * UNIT + 1, 1).expect("room");
        assert_eq!(&*second, &[Run { at: 96 * UNIT, units: 3 }]);
        assert_eq!((a.used(), max.load(Ordering::Acquire)), (4 * UNIT, 96 * UNIT));
        // A hole is used before the floor moves.
        a.free_runs(&first);
        assert_eq!(a.used(), 3 * UNIT);
        assert_eq!(&*a.alloc(10, 1).expect("room"), &[Run { at: 99 * UNIT, units: 1 }]);
        // Freed at the floor: the image may grow there again.
        a.free_runs(&second);
        assert_eq!(max.load(Ordering::Acquire), 99 * UNIT);
        assert_eq!(a.used(), UNIT);
        // Units not in use (freed already, or outside the area) are not freed again.
        a.free_runs(&second);
        a.free_runs(&[Run { at: 100 * UNIT, units: 1 }]);
        assert_eq!((a.used(), a.room(1)), (UNIT, 97 * UNIT));
    }

    #[test]
    fn the_image_keeps_its_reserve_below_the_area() {
        // An image of one unit, a reserve of ten: the area may come down to unit 11.
        let mut a = Area::new(20 * UNIT, 0, Arc::new(AtomicU64::new(UNIT)), Arc::new(AtomicU64::new(0)), 10 * UNIT);
        assert_eq!(a.room(1), 9 * UNIT);
        assert!(a.alloc(10 * UNIT, 1).is_none());
        assert!(a.alloc(9 * UNIT, 1).is_some());
        assert_eq!(a.image_max.load(Ordering::Acquire), 11 * UNIT);
    }

    #[test]
    fn a_fragmented_area_gives_pieces_and_a_full_one_gives_none() {
        // The image of one unit may grow to two (one growth) or four (two).
        let mut a = area(12);
        let blocks: Vec<_> = (0..8).map(|_| a.alloc(UNIT, 1).expect("room")).collect();
        assert_eq!(a.room(1), 2 * UNIT);
        assert_eq!(a.room(2), 0);
        for b in blocks.iter().step_by(2) {
            a.free_runs(b);
        }
        // Four single free units, none at the floor.
        let three = a.alloc(3 * UNIT, 2).expect("room in pieces");
        assert_eq!(three.len(), 3);
        assert!(three.iter().all(|r| r.units == 1));
        assert!(a.alloc(UNIT, 2).is_some(), "the last free unit");
        assert!(a.alloc(UNIT, 2).is_none(), "nothing left above two growths of the image");
        let before = (a.used(), a.room(1));
        assert!(a.alloc(10 * UNIT, 1).is_none());
        assert_eq!((a.used(), a.room(1)), before, "a refused allocation takes nothing");
    }

    #[test]
    fn rebuilding_from_the_index_finds_the_holes_and_refuses_overlaps() {
        let mut a = area(100);
        let e = |at: u64, units: u32| Extent {
            len: units * UNIT as u32,
            crc: 0,
            runs: Box::new([Run { at: at * UNIT, units }]),
        };
        let held = [e(98, 2), e(90, 4)];
        a.rebuild(held.iter()).expect("a sound index");
        assert_eq!((a.used(), a.floor, a.free_bytes), (6 * UNIT, 90 * UNIT, 4 * UNIT));
        assert_eq!(&*a.alloc(UNIT, 1).expect("the hole"), &[Run { at: 97 * UNIT, units: 1 }]);
        let mut b = area(100);
        let e = b.rebuild([e(90, 4), e(92, 1)].iter()).err().map(|e| e.message).unwrap_or_default();
        assert!(e.contains("over another block"), "{e}");
    }
}
