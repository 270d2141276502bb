//! Small objects: space in 4 KiB blocks instead of whole chunks.
//!
//! A chunk is one full stripe (1 MiB on RAID6 8+2); giving each object at least one made a
//! 3,901-byte file cost 1 MiB of OST. So while an object's chunk 0 is neither mapped nor
//! journaled, and its bytes there end within half a chunk ([`Target::fragment_max`]),
//! they live in a *fragment*: a run of blocks inside a *slab*, a chunk shared by the
//! fragments of many objects. An object costs its data rounded up to 4 KiB; a fragment
//! grows by doubling (so a stream of small appends copies each byte a bounded number of
//! times) up to half a chunk; a write past that, or a write the journal takes, first moves
//! the fragment into a chunk of its own (*promotion*), and from then on the object is
//! chunks only. Half a chunk bounds the waste of the larger objects too: one of them holds
//! at most twice its bytes.
//!
//! **Crash consistency**, as for chunks: a fragment's new blocks are written (zero-filled
//! around the data) before the transaction that maps them commits; blocks go back to their
//! slab in the transaction that unmaps them; a write in place past the size first commits
//! the larger size. A slab emptied of fragments goes back to the free chunks.
//!
//! **Concurrency.** A fragment is read and written under its object's chunk-0 lock, so a
//! reader never follows it into blocks a concurrent write has given back. Blocks chosen by
//! a running write are held in memory until its commit; one mutex ([`SmallState`]) covers
//! choosing blocks and every transaction that changes a slab, so a slab is never given back
//! while a write holds blocks in it.
//!
//! Index tables: `frags` (object → slab chunk, first block, blocks) and `slabs` (chunk →
//! a bitmap of its used blocks); `meta.free_blocks` counts the free blocks of all slabs.

use std::collections::BTreeMap;
use std::sync::MutexGuard;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::{META, OBJECTS, PendingSums, Reservation, Target, lock, now_ns, take_free};
use crate::error::{OsdError, Result};
use crate::object::ObjectAttr;

/// Object → (slab chunk, first block, blocks) of its fragment.
pub(super) const FRAGS: TableDefinition<u64, (u64, u32, u32)> = TableDefinition::new("frags");
/// Slab chunk → bitmap of its used blocks (bit `b % 8` of byte `b / 8`).
pub(super) const SLABS: TableDefinition<u64, &[u8]> = TableDefinition::new("slabs");

/// The allocation grain of small objects.
pub const BLOCK_BYTES: u64 = 4096;

/// Where an object's fragment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Frag {
    pub chunk: u64,
    pub first: u32,
    pub blocks: u32,
}

impl Frag {
    pub fn bytes(&self) -> u64 {
        self.blocks as u64 * BLOCK_BYTES
    }
}

/// Blocks chosen by running writes, not yet committed: slab chunk → (first block, blocks).
#[derive(Default)]
pub(super) struct SmallState {
    held: BTreeMap<u64, Vec<(u32, u32)>>,
    /// Chunks of `held` that are new slabs: their blocks were never counted free.
    fresh: std::collections::HashSet<u64>,
    /// The slab the last allocation came from: the next one looks there first.
    cursor: u64,
}

/// Blocks held for one write: in a slab already made, or at the start of a new chunk
/// (`new_slab`) that the commit turns into a slab.
pub(super) struct BlockHold<'a> {
    target: &'a Target,
    pub frag: Frag,
    new_slab: Option<Reservation<'a>>,
}

impl Drop for BlockHold<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.target.small);
        if self.new_slab.is_some() {
            s.fresh.remove(&self.frag.chunk);
        }
        if let Some(runs) = s.held.get_mut(&self.frag.chunk) {
            runs.retain(|&r| r != (self.frag.first, self.frag.blocks));
            if runs.is_empty() {
                s.held.remove(&self.frag.chunk);
            }
        }
    }
}

fn bit(map: &[u8], b: u32) -> bool {
    map[(b / 8) as usize] & (1 << (b % 8)) != 0
}

fn set_bits(map: &mut [u8], first: u32, n: u32, on: bool) {
    for b in first..first + n {
        if on {
            map[(b / 8) as usize] |= 1 << (b % 8);
        } else {
            map[(b / 8) as usize] &= !(1 << (b % 8));
        }
    }
}

/// The first run of `n` free blocks in `map` (of `total` blocks) that no held run
/// overlaps.
fn find_run(map: &[u8], total: u32, n: u32, held: &[(u32, u32)]) -> Option<u32> {
    let taken = |b: u32| bit(map, b) || held.iter().any(|&(f, l)| b >= f && b < f + l);
    let mut start = 0;
    while start + n <= total {
        match (start..start + n).find(|&b| taken(b)) {
            Some(b) => start = b + 1,
            None => return Some(start),
        }
    }
    None
}

impl Target {
    /// Blocks in one chunk.
    pub(super) fn blocks_per_chunk(&self) -> u32 {
        (self.chunk_bytes / BLOCK_BYTES) as u32
    }

    /// The largest fragment: half a chunk (an object past it takes chunks).
    pub fn fragment_max(&self) -> u64 {
        self.chunk_bytes / 2
    }

    pub(super) fn lock_small(&self) -> MutexGuard<'_, SmallState> {
        lock(&self.small)
    }

    /// The fragment of `oid`, if it has one.
    pub(super) fn fragment(&self, oid: u64) -> Result<Option<Frag>> {
        let txn = self.db.begin_read()?;
        let f = txn.open_table(FRAGS)?;
        Ok(f.get(oid)?.map(|v| {
            let (chunk, first, blocks) = v.value();
            Frag { chunk, first, blocks }
        }))
    }

    /// Whether a write ending at `end` goes to `oid`'s fragment: chunk 0 neither mapped,
    /// journaled nor promised a chunk, and the write within the fragment's limit. The
    /// caller holds the chunk-0 lock.
    pub(super) fn fragment_takes(&self, oid: u64, end: u64) -> Result<bool> {
        if end > self.fragment_max() || self.journal.has_pieces(oid, 0) {
            return Ok(false);
        }
        if self.lock_reserved().promised.contains(&(oid, 0)) {
            return Ok(false);
        }
        Ok(self.mapping(oid, 0, 0)?[0].is_none())
    }

    /// Hold `n` free blocks for a write: a run in a slab, else the start of a new chunk.
    fn hold_blocks(&self, n: u32) -> Result<BlockHold<'_>> {
        let total = self.blocks_per_chunk();
        if n == 0 || n > total {
            return Err(OsdError::Corrupt(format!("a fragment of {n} blocks")));
        }
        let mut s = self.lock_small();
        let txn = self.db.begin_read()?;
        let slabs = txn.open_table(SLABS)?;
        let cursor = s.cursor;
        let mut found = None;
        'passes: for pass in 0..2 {
            let iter = if pass == 0 { slabs.range(cursor..)? } else { slabs.range(..cursor)? };
            for e in iter {
                let (k, v) = e?;
                let held = s.held.get(&k.value()).map_or(&[][..], Vec::as_slice);
                if let Some(first) = find_run(v.value(), total, n, held) {
                    found = Some((k.value(), first));
                    break 'passes;
                }
            }
        }
        drop(slabs);
        drop(txn);
        let (frag, new_slab) = match found {
            Some((chunk, first)) => (Frag { chunk, first, blocks: n }, None),
            None => {
                // The reservation's own lock comes after ours, as everywhere.
                let r = self.reserve(1)?;
                let chunk = r.chunks().first().copied().ok_or_else(|| OsdError::Corrupt("empty reservation".into()))?;
                (Frag { chunk, first: 0, blocks: n }, Some(r))
            }
        };
        s.held.entry(frag.chunk).or_default().push((frag.first, frag.blocks));
        if new_slab.is_some() {
            s.fresh.insert(frag.chunk);
        }
        s.cursor = frag.chunk;
        Ok(BlockHold { target: self, frag, new_slab })
    }

    /// In `txn`: mark `hold`'s blocks used (making its slab if it is a new chunk).
    fn take_blocks(&self, txn: &redb::WriteTransaction, hold: &BlockHold<'_>) -> Result<()> {
        let total = self.blocks_per_chunk();
        let f = hold.frag;
        let mut slabs = txn.open_table(SLABS)?;
        let mut map = match &hold.new_slab {
            Some(r) => {
                take_free(txn, &r.extents)?;
                add_free_blocks(txn, total as i64)?;
                vec![0u8; total.div_ceil(8) as usize]
            }
            None => slabs
                .get(f.chunk)?
                .map(|v| v.value().to_vec())
                .ok_or_else(|| OsdError::Corrupt(format!("blocks held in chunk {}, which is not a slab", f.chunk)))?,
        };
        if (f.first..f.first + f.blocks).any(|b| bit(&map, b)) {
            return Err(OsdError::Corrupt(format!("blocks {}+{} of slab {} are in use", f.first, f.blocks, f.chunk)));
        }
        set_bits(&mut map, f.first, f.blocks, true);
        slabs.insert(f.chunk, map.as_slice())?;
        add_free_blocks(txn, -(f.blocks as i64))
    }

    /// In `txn`: give `n` blocks from `first` of slab `chunk` back; a slab left empty, with
    /// no blocks held in it, goes back to the free chunks. The caller holds the small lock.
    fn give_blocks(
        &self,
        txn: &redb::WriteTransaction,
        small: &SmallState,
        chunk: u64,
        first: u32,
        n: u32,
    ) -> Result<()> {
        let mut slabs = txn.open_table(SLABS)?;
        let mut map = slabs
            .get(chunk)?
            .map(|v| v.value().to_vec())
            .ok_or_else(|| OsdError::Corrupt(format!("a fragment in chunk {chunk}, which is not a slab")))?;
        set_bits(&mut map, first, n, false);
        self.forget_block_sums(txn, chunk, first, n)?;
        add_free_blocks(txn, n as i64)?;
        if map.iter().all(|&b| b == 0) && !small.held.contains_key(&chunk) {
            slabs.remove(chunk)?;
            drop(slabs);
            add_free_blocks(txn, -(self.blocks_per_chunk() as i64))?;
            super::give_free(txn, vec![chunk])?;
        } else {
            slabs.insert(chunk, map.as_slice())?;
        }
        Ok(())
    }

    /// Read `out.len()` bytes at `at` of a fragment (zeros past its blocks).
    pub(super) fn read_fragment(&self, f: Frag, at: u64, out: &mut [u8]) -> Result<()> {
        let inside = f.bytes().saturating_sub(at).min(out.len() as u64) as usize;
        if inside > 0 {
            let base = f.chunk * self.chunk_bytes + f.first as u64 * BLOCK_BYTES;
            self.read_data(base + at, &mut out[..inside])?;
        }
        out[inside..].fill(0);
        Ok(())
    }

    /// Read a fragment's blocks whole into the start of `image` (bytes past the object's
    /// size are zero there); returns the offsets (into `image`) of blocks whose bytes were
    /// lost.
    fn read_fragment_blocks(&self, f: Frag, image: &mut [u8]) -> Result<Vec<u64>> {
        let base = f.chunk * self.chunk_bytes + f.first as u64 * BLOCK_BYTES;
        let lost = self.read_blocks(base, &mut image[..f.bytes() as usize], true)?;
        Ok(lost.into_iter().map(|o| o - base).collect())
    }

    /// Write `data` at `offset` of `oid`'s fragment (made or grown as needed). The caller
    /// holds the object's shared lock and its chunk-0 lock, and checked
    /// [`fragment_takes`](Self::fragment_takes).
    pub(super) fn write_fragment(&self, oid: u64, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset + data.len() as u64;
        let attr = self.committed_attr(oid)?;
        let old = self.fragment(oid)?;
        if let Some(f) = old.filter(|f| f.bytes() >= end) {
            // In place. Bytes past the size become part of the object first, so a crash
            // between shows zeros there, never stale bytes.
            if end > attr.size {
                self.grow(oid, end)?;
            }
            let base = f.chunk * self.chunk_bytes + f.first as u64 * BLOCK_BYTES;
            let mut sums = PendingSums::new(self);
            self.write_data(base + offset, data, &mut sums)?;
            self.flush_if_drives()?;
            return self.commit_fragment(oid, end, None, sums);
        }
        // A new run, of at least twice the old one (bounded copying under appends), holding
        // the old bytes and the new, zero-filled around them.
        let need = end.div_ceil(BLOCK_BYTES) as u32;
        let grown = old.map_or(need, |f| need.max(f.blocks.saturating_mul(2)));
        let blocks = grown.min((self.fragment_max() / BLOCK_BYTES) as u32).max(need);
        let hold = self.hold_blocks(blocks)?;
        let mut image = nacre_raid::align::AlignedBuf::zeroed((blocks as u64 * BLOCK_BYTES) as usize);
        // The old blocks whole (zeros past the size); lost ones stay lost unless this
        // write covers them.
        let mut lost = match old {
            Some(f) => self.read_fragment_blocks(f, &mut image)?,
            None => Vec::new(),
        };
        lost.retain(|&o| o < offset || o + BLOCK_BYTES > end);
        image[offset as usize..end as usize].copy_from_slice(data);
        let f = hold.frag;
        let mut sums = PendingSums::new(self);
        self.write_image(f.chunk * self.chunk_bytes + f.first as u64 * BLOCK_BYTES, &image, true, &lost, &mut sums)?;
        self.flush_if_drives()?;
        self.commit_fragment(oid, end, Some(&hold), sums)?;
        drop(hold);
        Ok(())
    }

    /// One transaction: the object's size grows to `end`, its fragment becomes `hold`'s
    /// (the old one's blocks go back), its space follows, and the written blocks' checksums
    /// are stored.
    fn commit_fragment(
        &self,
        oid: u64,
        end: u64,
        hold: Option<&BlockHold<'_>>,
        mut sums: PendingSums<'_>,
    ) -> Result<()> {
        let small = self.lock_small();
        let txn = self.db.begin_write()?;
        self.commit_sums(&txn, &mut sums)?;
        {
            let mut frags = txn.open_table(FRAGS)?;
            let old = frags.get(oid)?.map(|v| v.value());
            let mut o = txn.open_table(OBJECTS)?;
            let mut a = {
                let v = o.get(oid)?.ok_or(OsdError::NoSuchObject(oid))?;
                ObjectAttr::decode(oid, v.value())?
            };
            a.size = a.size.max(end);
            a.mtime_ns = now_ns();
            a.ctime_ns = a.mtime_ns;
            if let Some(h) = hold {
                let f = h.frag;
                self.take_blocks(&txn, h)?;
                frags.insert(oid, (f.chunk, f.first, f.blocks))?;
                a.space += f.bytes();
                if let Some((chunk, first, blocks)) = old {
                    self.give_blocks(&txn, &small, chunk, first, blocks)?;
                    a.space = a.space.saturating_sub(blocks as u64 * BLOCK_BYTES);
                }
            }
            o.insert(oid, a.encode().as_slice())?;
        }
        txn.commit()?;
        Ok(())
    }

    /// Move `oid`'s fragment, if any, into a chunk of its own as chunk 0 (before a write
    /// the fragment cannot take). The caller holds the chunk-0 lock.
    pub(super) fn promote(&self, oid: u64) -> Result<()> {
        let Some(f) = self.fragment(oid)? else { return Ok(()) };
        self.committed_attr(oid)?;
        let cb = self.chunk_bytes;
        let reservation = self.reserve(1)?;
        let chunk =
            reservation.chunks().first().copied().ok_or_else(|| OsdError::Corrupt("empty reservation".into()))?;
        let mut image = nacre_raid::align::AlignedBuf::zeroed(cb as usize);
        let lost = self.read_fragment_blocks(f, &mut image)?;
        let mut sums = PendingSums::new(self);
        self.write_image(chunk * cb, &image, true, &lost, &mut sums)?;
        self.flush_if_drives()?;
        let small = self.lock_small();
        let txn = self.db.begin_write()?;
        self.commit_sums(&txn, &mut sums)?;
        {
            let mut o = txn.open_table(OBJECTS)?;
            let mut a = {
                let v = o.get(oid)?.ok_or(OsdError::NoSuchObject(oid))?;
                ObjectAttr::decode(oid, v.value())?
            };
            a.space = a.space.saturating_sub(f.bytes()) + cb;
            o.insert(oid, a.encode().as_slice())?;
            txn.open_table(FRAGS)?.remove(oid)?;
            txn.open_table(super::MAP)?.insert((oid, 0), chunk)?;
            take_free(&txn, &reservation.extents)?;
            self.give_blocks(&txn, &small, f.chunk, f.first, f.blocks)?;
        }
        txn.commit()?;
        drop(small);
        drop(reservation);
        self.counters.promoted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Zero `[lo, hi)` of a fragment in place (a punch, or the tail a truncate cuts); the
    /// checksums go to the caller's commit.
    pub(super) fn zero_fragment<'a>(&'a self, f: Frag, lo: u64, hi: u64, sums: &mut PendingSums<'a>) -> Result<()> {
        let hi = hi.min(f.bytes());
        if lo < hi {
            let base = f.chunk * self.chunk_bytes + f.first as u64 * BLOCK_BYTES;
            self.write_data(base + lo, &vec![0u8; (hi - lo) as usize], sums)?;
            self.flush_if_drives()?;
        }
        Ok(())
    }

    /// In an unmap's transaction: keep the first `keep` bytes of `oid`'s fragment (whole
    /// blocks), giving the rest back; returns the bytes of space given back.
    pub(super) fn cut_fragment_in(
        &self,
        txn: &redb::WriteTransaction,
        small: &SmallState,
        oid: u64,
        keep: u64,
    ) -> Result<u64> {
        let mut frags = txn.open_table(FRAGS)?;
        let Some((chunk, first, blocks)) = frags.get(oid)?.map(|v| v.value()) else { return Ok(0) };
        // `keep` may be u64::MAX ("all of it"): bound it before it narrows.
        let kept = keep.div_ceil(BLOCK_BYTES).min(blocks as u64) as u32;
        if kept == blocks {
            return Ok(0);
        }
        if kept == 0 {
            frags.remove(oid)?;
        } else {
            frags.insert(oid, (chunk, first, kept))?;
        }
        drop(frags);
        self.give_blocks(txn, small, chunk, first + kept, blocks - kept)?;
        Ok((blocks - kept) as u64 * BLOCK_BYTES)
    }

    /// Bytes of the `free` blocks of all slabs (the committed count), less those running
    /// writes hold.
    pub(super) fn free_block_bytes(&self, free: u64) -> u64 {
        let s = self.lock_small();
        let held: u64 = s
            .held
            .iter()
            .filter(|(chunk, _)| !s.fresh.contains(chunk))
            .flat_map(|(_, runs)| runs)
            .map(|&(_, n)| n as u64)
            .sum();
        free.saturating_sub(held) * BLOCK_BYTES
    }

    /// What `check` verifies of fragments and slabs: each fragment inside a slab, on
    /// blocks the slab marks used and no other fragment has; each slab's used blocks
    /// exactly its fragments'; the free-block counter; bytes past an object's size zero.
    /// Marks slab chunks in `used` and returns each object's fragment bytes.
    pub(super) fn check_fragments(
        &self,
        txn: &redb::ReadTransaction,
        mut mark: impl FnMut(u64) -> bool,
        problem: &mut dyn FnMut(String),
    ) -> Result<BTreeMap<u64, u64>> {
        let total = self.blocks_per_chunk();
        let frags = txn.open_table(FRAGS)?;
        let slabs = txn.open_table(SLABS)?;
        let objects = txn.open_table(OBJECTS)?;
        let mut owned: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut free_blocks = 0u64;
        for e in slabs.iter()? {
            let (k, v) = e?;
            let chunk = k.value();
            if chunk >= self.chunks {
                problem(format!("slab {chunk} is past the volume's {} chunks", self.chunks));
                continue;
            }
            if mark(chunk) {
                problem(format!("chunk {chunk} is a slab and also mapped or free"));
            }
            if v.value().len() != total.div_ceil(8) as usize {
                problem(format!("slab {chunk} has a bitmap of {} bytes", v.value().len()));
                continue;
            }
            free_blocks += (0..total).filter(|&b| !bit(v.value(), b)).count() as u64;
            owned.insert(chunk, vec![0u8; total.div_ceil(8) as usize]);
        }
        let mut per_object = BTreeMap::new();
        for e in frags.iter()? {
            let (k, v) = e?;
            let (oid, (chunk, first, blocks)) = (k.value(), v.value());
            let f = Frag { chunk, first, blocks };
            per_object.insert(oid, f.bytes());
            let Some(map) = owned.get_mut(&chunk) else {
                problem(format!("object {oid:#x}'s fragment is in chunk {chunk}, which is not a slab"));
                continue;
            };
            if blocks == 0 || first as u64 + blocks as u64 > total as u64 {
                problem(format!("object {oid:#x}'s fragment {first}+{blocks} is outside its slab"));
                continue;
            }
            if (first..first + blocks).any(|b| bit(map, b)) {
                problem(format!("blocks of slab {chunk} belong to two fragments (again object {oid:#x})"));
            }
            set_bits(map, first, blocks, true);
            match objects.get(oid)? {
                None => problem(format!("a fragment belongs to object {oid:#x}, which does not exist")),
                Some(a) => {
                    let a = ObjectAttr::decode(oid, a.value())?;
                    if a.size < f.bytes() {
                        // Unchecked: a bad checksum is the data check's finding, not this one's.
                        let mut tail = vec![0u8; (f.bytes() - a.size) as usize];
                        let base = f.chunk * self.chunk_bytes + f.first as u64 * BLOCK_BYTES;
                        self.data.read(base + a.size, &mut tail)?;
                        if let Some(i) = tail.iter().position(|&b| b != 0) {
                            problem(format!(
                                "object {oid:#x}: byte {} past its size {} is not zero",
                                a.size + i as u64,
                                a.size
                            ));
                        }
                    }
                }
            }
        }
        for (chunk, map) in &owned {
            let on_disk = slabs.get(*chunk)?.map(|v| v.value().to_vec()).unwrap_or_default();
            if on_disk != *map {
                problem(format!("slab {chunk}'s used blocks are not its fragments' (leaked or lost blocks)"));
            }
        }
        let meta = txn.open_table(META)?;
        let counted = meta.get("free_blocks")?.map(|v| v.value()).unwrap_or(0);
        if counted != free_blocks {
            problem(format!("free block counter {counted} but the slabs hold {free_blocks}"));
        }
        Ok(per_object)
    }
}

/// In `txn`: add `n` (or take, when negative) to the free-block counter.
fn add_free_blocks(txn: &redb::WriteTransaction, n: i64) -> Result<()> {
    let mut m = txn.open_table(META)?;
    let f = m.get("free_blocks")?.map(|v| v.value()).unwrap_or(0);
    m.insert("free_blocks", f.saturating_add_signed(n))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_skip_used_and_held_blocks() {
        let mut map = vec![0u8; 2];
        set_bits(&mut map, 0, 3, true);
        assert_eq!(find_run(&map, 16, 2, &[]), Some(3));
        assert_eq!(find_run(&map, 16, 2, &[(3, 2)]), Some(5));
        set_bits(&mut map, 6, 10, true);
        assert_eq!(find_run(&map, 16, 4, &[]), None);
        assert_eq!(find_run(&map, 16, 3, &[]), Some(3));
        set_bits(&mut map, 0, 3, false);
        assert!(!bit(&map, 2) && bit(&map, 6));
    }
}
