//! Data checksums at rest: a CRC-32C for every 4 KiB block of the data volume that holds
//! object bytes, checked on every read. A drive that returns wrong bytes without an error
//! (a flipped bit, a lost or misdirected write) is caught at the grain of the read, so a
//! small read still reads only the blocks it needs.
//!
//! **Where.** `sums` maps a physical chunk to a bitmap of its blocks that have a checksum,
//! then one CRC-32C per block. It is keyed by where the bytes lie, not by object, so chunks
//! and slabs (the fragments of many objects) are covered alike, and a chunk's checksums go
//! when it is freed. A block with none (a target made before format 3, slab blocks no
//! fragment was written to) reads unverified.
//!
//! **Crash consistency.** A write to blocks nothing maps yet (a new chunk, a new fragment)
//! commits their checksums in the transaction that maps them. A write in place cannot: the
//! drive and the index are two writes. So before it, the chunk's region (of
//! [`MARK_CHUNKS`] chunks) is marked in `sums_dirty`, committed first; on start-up the
//! checksums of the chunks of marked regions are computed again from what the drives
//! hold: the bytes an interrupted write left, which a parity resync trusts too
//! (dm-integrity's bitmap mode). Marks are cleared lazily, at most once a second and after
//! a flush of the data volume, once their region has had no write in place for
//! [`MARK_IDLE`] (and all of them by a sync): a stream of writes in place costs one commit
//! per region for its mark, not one per write.
//!
//! **Concurrent reads.** A read compares bytes and checksums it did not read at one
//! instant, and a write in place between may make them disagree. Writes in place hold
//! their chunk's shard shared from before their bytes go out until their checksums commit;
//! a read that finds a mismatch takes the shard exclusive (trying, so that it never
//! queues ahead of a writer) and reads the block again, so only a mismatch then is real.
//!
//! **Mending.** A block that is really wrong is decoded from the rest of its stripe (the
//! drive that holds it left out); if that copy matches the checksum, it is what the read
//! returns and it is written back onto the drive, as a scrub would. Otherwise the block is
//! lost: reads of it fail with EIO, the rest of its chunk reads as usual, and writes that
//! cut it keep it lost (a checksum that cannot match) until it is written whole.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};
use std::time::{Duration, Instant};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::{BLOCK_BYTES, Target, lock};
use crate::crc32c;
use crate::error::{OsdError, Result};

/// Physical chunk → a bitmap of the blocks that have a checksum, then a CRC-32C per block.
pub(super) const SUMS: TableDefinition<u64, &[u8]> = TableDefinition::new("sums");
/// Regions (chunk / [`MARK_CHUNKS`]) written in place, whose checksums may not match their
/// bytes after a crash.
pub(super) const SUMS_DIRTY: TableDefinition<u64, ()> = TableDefinition::new("sums_dirty");
/// Chunks one mark covers.
const MARK_CHUNKS: u64 = 64;

/// A region's mark is cleared once it has had no write in place for this long.
const MARK_IDLE: Duration = Duration::from_secs(1);
/// Locks of writes in place, by `chunk % SHARDS`.
const SHARDS: usize = 256;
/// How long a read that found a mismatch waits for the writes in place of its chunk's
/// shard to let it read again.
const RECHECK_WAIT: Duration = Duration::from_secs(5);

/// Chunks a scrub reads at once when they are neighbours.
const SCRUB_RUN_CHUNKS: u64 = 16;
/// Lost blocks a scrub lists by offset (it counts them all).
const SCRUB_LOST_LISTED: usize = 100;

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Chunks read, and their blocks.
    pub chunks: u64,
    pub blocks: u64,
    /// Blocks a drive returned wrong, decoded from parity and written back.
    pub mended: u64,
    /// Blocks whose bytes are lost (reads of them fail), and the data volume offsets of
    /// the first hundred.
    pub lost_blocks: u64,
    pub lost: Vec<u64>,
    /// Every chunk was read (the scrub was not stopped).
    pub complete: bool,
}

/// What reading a block again found.
enum Verdict {
    Good,
    Mended,
    Lost,
}

/// One chunk's checksums, as stored.
struct ChunkSums {
    blocks: usize,
    raw: Vec<u8>,
}

impl ChunkSums {
    fn empty(blocks: usize) -> ChunkSums {
        ChunkSums { blocks, raw: vec![0; blocks.div_ceil(8) + 4 * blocks] }
    }

    fn decode(p: u64, blocks: usize, raw: &[u8]) -> Result<ChunkSums> {
        if raw.len() != blocks.div_ceil(8) + 4 * blocks {
            return Err(OsdError::Corrupt(format!(
                "checksums of chunk {p} take {} bytes, not the {} of {blocks} blocks",
                raw.len(),
                blocks.div_ceil(8) + 4 * blocks
            )));
        }
        Ok(ChunkSums { blocks, raw: raw.to_vec() })
    }

    fn get(&self, b: usize) -> Option<u32> {
        if self.raw[b / 8] & (1 << (b % 8)) == 0 {
            return None;
        }
        let at = self.blocks.div_ceil(8) + 4 * b;
        Some(u32::from_le_bytes([self.raw[at], self.raw[at + 1], self.raw[at + 2], self.raw[at + 3]]))
    }

    fn clear(&mut self, b: usize) {
        self.raw[b / 8] &= !(1 << (b % 8));
    }

    fn set(&mut self, b: usize, crc: u32) {
        self.raw[b / 8] |= 1 << (b % 8);
        let at = self.blocks.div_ceil(8) + 4 * b;
        self.raw[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A region written in place: writes running there, and when the last ended.
struct Mark {
    in_flight: u32,
    /// The mark is in the index (a concurrent writer may still be committing it).
    durable: bool,
    last: Instant,
}

/// The in-memory side of checksums: marks, the shards writes in place hold, counters.
pub(super) struct SumState {
    marks: Mutex<HashMap<u64, Mark>>,
    shards: Vec<RwLock<()>>,
    /// When marks were last cleared.
    last_sweep: Mutex<Instant>,
    /// Blocks found lost, and blocks mended from parity.
    pub errors: AtomicU64,
    pub repaired: AtomicU64,
    pub recomputed: AtomicU64,
}

impl Default for SumState {
    fn default() -> Self {
        SumState {
            marks: Mutex::new(HashMap::new()),
            shards: (0..SHARDS).map(|_| RwLock::new(())).collect(),
            last_sweep: Mutex::new(Instant::now()),
            errors: AtomicU64::new(0),
            repaired: AtomicU64::new(0),
            recomputed: AtomicU64::new(0),
        }
    }
}

fn shard_of(p: u64) -> usize {
    (p % SHARDS as u64) as usize
}

/// The checksums of blocks one operation wrote, for its commit. It holds the shards of its
/// writes in place (and their regions' marks in flight) until it is dropped, after the
/// commit. Dropped without a commit (the operation failed after writing in place), it
/// leaves its marks in flight for good: bytes may be on the drives without their
/// checksums, and the next start computes them again.
pub(super) struct PendingSums<'a> {
    target: &'a Target,
    crcs: BTreeMap<u64, Vec<(usize, u32)>>,
    shards: Vec<(usize, RwLockReadGuard<'a, ()>)>,
    marked: Vec<u64>,
    committed: bool,
}

impl<'a> PendingSums<'a> {
    pub(super) fn new(target: &'a Target) -> PendingSums<'a> {
        PendingSums { target, crcs: BTreeMap::new(), shards: Vec::new(), marked: Vec::new(), committed: false }
    }

    /// The checksums of `image`, whole blocks written at volume offset `at`; the blocks
    /// at `lost` (offsets into `image`) get one that does not match.
    fn add(&mut self, at: u64, image: &[u8], lost: &[u64]) {
        let cb = self.target.chunk_bytes;
        for (i, block) in image.chunks(BLOCK_BYTES as usize).enumerate() {
            let rel = i as u64 * BLOCK_BYTES;
            let off = at + rel;
            let b = ((off % cb) / BLOCK_BYTES) as usize;
            let crc = crc32c(block);
            let crc = if lost.contains(&rel) { !crc } else { crc };
            self.crcs.entry(off / cb).or_default().push((b, crc));
        }
    }
}

impl Drop for PendingSums<'_> {
    fn drop(&mut self) {
        let s = &self.target.sums;
        if !self.marked.is_empty() && self.committed {
            let mut marks = lock(&s.marks);
            let now = Instant::now();
            for p in &self.marked {
                if let Some(m) = marks.get_mut(p) {
                    m.in_flight = m.in_flight.saturating_sub(1);
                    m.last = now;
                }
            }
        }
    }
}

impl Target {
    /// Read `buf.len()` bytes at volume offset `at` and check them against their blocks'
    /// checksums (reading the whole blocks when the range cuts one); a block that does not
    /// match fails the read.
    pub(super) fn read_data(&self, at: u64, buf: &mut [u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let end = at + buf.len() as u64;
        let (lo, hi) = (at / BLOCK_BYTES * BLOCK_BYTES, end.div_ceil(BLOCK_BYTES) * BLOCK_BYTES);
        let lost = if lo == at && hi == end {
            self.read_blocks(lo, buf, false)?
        } else {
            let mut image = nacre_raid::align::AlignedBuf::zeroed((hi - lo) as usize);
            let lost = self.read_blocks(lo, &mut image, false)?;
            buf.copy_from_slice(&image[(at - lo) as usize..(end - lo) as usize]);
            lost
        };
        match lost.first() {
            None => Ok(()),
            Some(bad) => Err(OsdError::Checksum(format!(
                "the {BLOCK_BYTES}-byte block at data volume offset {bad} does not match its checksum"
            ))),
        }
    }

    /// Read whole blocks at `at` and check them: returns the volume offsets of the blocks
    /// that are lost. A block that does not match is read again with no write in place
    /// running in its chunk, and decoded from parity if it still does not (see the module
    /// docs); `buf` holds the good bytes of every block not returned. A caller that
    /// `owns` the blocks (holds the locks every writer of them takes) needs no such wait,
    /// and may hold shards itself.
    pub(super) fn read_blocks(&self, at: u64, buf: &mut [u8], owns: bool) -> Result<Vec<u64>> {
        Ok(self.read_blocks_mending(at, buf, owns)?.0)
    }

    /// [`read_blocks`](Self::read_blocks), and how many blocks it mended.
    fn read_blocks_mending(&self, at: u64, buf: &mut [u8], owns: bool) -> Result<(Vec<u64>, u64)> {
        let cb = self.chunk_bytes;
        let chunks: Vec<u64> = (at / cb..=(at + buf.len() as u64 - 1) / cb).collect();
        let sums = self.chunk_sums(&chunks)?;
        self.data.read(at, buf)?;
        let suspect = self.mismatches(at, buf, &sums);
        let (mut lost, mut mended) = (Vec::new(), 0);
        let b = BLOCK_BYTES as usize;
        for off in suspect {
            let i = (off - at) as usize;
            match self.recheck_block(off, &mut buf[i..i + b], owns)? {
                Verdict::Good => {}
                Verdict::Mended => mended += 1,
                Verdict::Lost => lost.push(off),
            }
        }
        Ok((lost, mended))
    }

    /// Read every block that has a checksum (a scrub), beside running reads and writes: a
    /// block a drive returns wrong is decoded from parity and mended, as a read would; one
    /// that cannot be is reported. `progress(chunks done, total)` follows each run of
    /// chunks read; the scrub stops early when it returns false.
    pub fn scrub(&self, mut progress: impl FnMut(u64, u64) -> bool) -> Result<ScrubReport> {
        let chunks: Vec<u64> = {
            let txn = self.db.begin_read()?;
            let t = txn.open_table(SUMS)?;
            t.iter()?.map(|e| e.map(|(k, _)| k.value())).collect::<std::result::Result<_, _>>()?
        };
        let mut rep = ScrubReport::default();
        let cb = self.chunk_bytes;
        let mut image = nacre_raid::align::AlignedBuf::zeroed((SCRUB_RUN_CHUNKS * cb) as usize);
        let total = chunks.len() as u64;
        // Runs of neighbouring chunks, read as one (every drive busy at once).
        let mut i = 0;
        while i < chunks.len() {
            let mut n = 1;
            while i + n < chunks.len() && n < SCRUB_RUN_CHUNKS as usize && chunks[i + n] == chunks[i] + n as u64 {
                n += 1;
            }
            let buf = &mut image[..n * cb as usize];
            let (lost, mended) = self.read_blocks_mending(chunks[i] * cb, buf, false)?;
            rep.chunks += n as u64;
            rep.blocks += (n * self.blocks_per_chunk() as usize) as u64;
            rep.mended += mended;
            rep.lost_blocks += lost.len() as u64;
            rep.lost.extend(lost.into_iter().take(SCRUB_LOST_LISTED.saturating_sub(rep.lost.len())));
            i += n;
            if !progress(i as u64, total) && i < chunks.len() {
                return Ok(rep);
            }
        }
        rep.complete = true;
        Ok(rep)
    }

    /// Chunk `p`'s shard, exclusive: no write in place runs there while it is held. Never
    /// waits on the lock (writers in place must not queue behind a reader), but tries for
    /// at most [`RECHECK_WAIT`].
    fn quiet_shard(&self, p: u64, off: u64) -> Result<RwLockWriteGuard<'_, ()>> {
        let started = Instant::now();
        let shard = &self.sums.shards[shard_of(p)];
        loop {
            match shard.try_write() {
                Ok(g) => return Ok(g),
                Err(TryLockError::Poisoned(e)) => return Ok(e.into_inner()),
                Err(TryLockError::WouldBlock) if started.elapsed() < RECHECK_WAIT => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(OsdError::Checksum(format!(
                        "the block at data volume offset {off} did not match its checksum, and writes in place \
                         kept its chunk busy for {RECHECK_WAIT:?}"
                    )));
                }
            }
        }
    }

    /// A block (at volume offset `off`) that did not match its checksum: read again with
    /// no write in place running in its chunk; if still wrong, decoded from the rest of its
    /// stripe and, if that matches, mended on its drive. Leaves the good bytes in `block`;
    /// what it found.
    fn recheck_block(&self, off: u64, block: &mut [u8], owns: bool) -> Result<Verdict> {
        let cb = self.chunk_bytes;
        let p = off / cb;
        let _quiet = if owns { None } else { Some(self.quiet_shard(p, off)?) };
        let b = ((off % cb) / BLOCK_BYTES) as usize;
        let want = self.chunk_sums(&[p])?.pop().flatten().and_then(|s| s.get(b));
        self.data.read(off, block)?;
        let Some(want) = want else { return Ok(Verdict::Good) };
        if crc32c(block) == want {
            return Ok(Verdict::Good);
        }
        let mut good = nacre_raid::align::AlignedBuf::zeroed(block.len());
        if self.data.reconstruct(off, &mut good).is_ok() && crc32c(&good) == want {
            block.copy_from_slice(&good);
            return Ok(match self.data.repair(off, &good) {
                Ok(true) => {
                    self.sums.repaired.fetch_add(1, Ordering::Relaxed);
                    Verdict::Mended
                }
                Ok(false) => Verdict::Good,
                // The read still has its bytes; the next one decodes them again.
                Err(e) => {
                    eprintln!("osd: block at data volume offset {off} decoded from parity, not mended: {e}");
                    Verdict::Good
                }
            });
        }
        self.sums.errors.fetch_add(1, Ordering::Relaxed);
        Ok(Verdict::Lost)
    }

    /// The stored checksums of `chunks` (absent when a chunk has none).
    fn chunk_sums(&self, chunks: &[u64]) -> Result<Vec<Option<ChunkSums>>> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(SUMS)?;
        let n = self.blocks_per_chunk() as usize;
        chunks.iter().map(|&p| t.get(p)?.map(|v| ChunkSums::decode(p, n, v.value())).transpose()).collect()
    }

    /// The volume offsets of the blocks of `buf` (read at `at`) that have a checksum they
    /// do not match.
    fn mismatches(&self, at: u64, buf: &[u8], sums: &[Option<ChunkSums>]) -> Vec<u64> {
        let cb = self.chunk_bytes;
        let first = at / cb;
        let mut out = Vec::new();
        for (i, block) in buf.chunks(BLOCK_BYTES as usize).enumerate() {
            let off = at + i as u64 * BLOCK_BYTES;
            let s = sums[(off / cb - first) as usize].as_ref();
            if let Some(want) = s.and_then(|s| s.get(((off % cb) / BLOCK_BYTES) as usize))
                && crc32c(block) != want
            {
                out.push(off);
            }
        }
        out
    }

    /// Write `data` at volume offset `at` in place, adding the checksums of the blocks it
    /// covers to `pending` for the caller's commit. A block the write cuts is completed with
    /// the bytes around it; if those are lost (they do not match their checksum), the block
    /// stays lost.
    pub(super) fn write_data<'a>(&'a self, at: u64, data: &[u8], pending: &mut PendingSums<'a>) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = at + data.len() as u64;
        let (lo, hi) = (at / BLOCK_BYTES * BLOCK_BYTES, end.div_ceil(BLOCK_BYTES) * BLOCK_BYTES);
        if lo == at && hi == end {
            return self.write_image(at, data, false, &[], pending);
        }
        let mut image = nacre_raid::align::AlignedBuf::zeroed((hi - lo) as usize);
        let b = BLOCK_BYTES as usize;
        let mut lost = Vec::new();
        if lo < at {
            lost.extend(self.read_blocks(lo, &mut image[..b], true)?);
        }
        if hi > end && (hi - BLOCK_BYTES > lo || lo == at) {
            let n = image.len();
            lost.extend(self.read_blocks(hi - BLOCK_BYTES, &mut image[n - b..], true)?);
        }
        image[(at - lo) as usize..(end - lo) as usize].copy_from_slice(data);
        let lost: Vec<u64> = lost.into_iter().map(|o| o - lo).collect();
        self.write_image(lo, &image, false, &lost, pending)
    }

    /// Write whole blocks at volume offset `at`, adding their checksums to `pending`.
    /// `fresh` blocks are ones nothing maps yet (written before the commit that maps them);
    /// otherwise the write is in place and its chunks are marked first. The blocks at
    /// `lost` (offsets into `image`) hold bytes that were lost before this write: they get
    /// a checksum that does not match, so they keep failing reads until written whole.
    pub(super) fn write_image<'a>(
        &'a self,
        at: u64,
        image: &[u8],
        fresh: bool,
        lost: &[u64],
        pending: &mut PendingSums<'a>,
    ) -> Result<()> {
        if image.is_empty() {
            return Ok(());
        }
        if !at.is_multiple_of(BLOCK_BYTES) || !(image.len() as u64).is_multiple_of(BLOCK_BYTES) {
            return Err(OsdError::Corrupt(format!("a write of whole blocks at {at}+{} cuts a block", image.len())));
        }
        if !fresh {
            self.begin_in_place(at, at + image.len() as u64, pending)?;
        }
        self.data.write(at, image)?;
        pending.add(at, image, lost);
        Ok(())
    }

    /// Before a write in place of `[lo, hi)`: hold its chunks' shards and mark their
    /// regions in the index (one commit for those not marked already).
    fn begin_in_place<'a>(&'a self, lo: u64, hi: u64, pending: &mut PendingSums<'a>) -> Result<()> {
        let cb = self.chunk_bytes;
        let (first, last) = (lo / cb, (hi - 1) / cb);
        for p in first..=last {
            let shard = shard_of(p);
            if !pending.shards.iter().any(|(s, _)| *s == shard) {
                let g = self.sums.shards[shard].read().unwrap_or_else(|e| e.into_inner());
                pending.shards.push((shard, g));
            }
        }
        let mut unmarked = Vec::new();
        {
            let mut marks = lock(&self.sums.marks);
            for r in first / MARK_CHUNKS..=last / MARK_CHUNKS {
                let m = marks.entry(r).or_insert(Mark { in_flight: 0, durable: false, last: Instant::now() });
                m.in_flight += 1;
                pending.marked.push(r);
                if !m.durable {
                    unmarked.push(r);
                }
            }
        }
        if !unmarked.is_empty() {
            // Outside the marks' lock: a commit clearing marks holds the index's write
            // transaction and then takes that lock.
            let txn = self.db.begin_write()?;
            {
                let mut d = txn.open_table(SUMS_DIRTY)?;
                for &r in &unmarked {
                    d.insert(r, ())?;
                }
            }
            txn.commit()?;
            let mut marks = lock(&self.sums.marks);
            for r in unmarked {
                if let Some(m) = marks.get_mut(&r) {
                    m.durable = true;
                }
            }
        }
        Ok(())
    }

    /// In the caller's transaction: store `pending`'s checksums.
    pub(super) fn commit_sums(&self, txn: &redb::WriteTransaction, pending: &mut PendingSums<'_>) -> Result<()> {
        let n = self.blocks_per_chunk() as usize;
        let mut t = txn.open_table(SUMS)?;
        for (&p, crcs) in &pending.crcs {
            // A chunk written whole needs nothing of what it had.
            let mut covered = vec![false; n];
            crcs.iter().for_each(|&(b, _)| covered[b] = true);
            let mut s = match covered.iter().all(|&c| c) {
                true => ChunkSums::empty(n),
                false => match t.get(p)? {
                    Some(v) => ChunkSums::decode(p, n, v.value())?,
                    None => ChunkSums::empty(n),
                },
            };
            for &(b, crc) in crcs {
                s.set(b, crc);
            }
            t.insert(p, s.raw.as_slice())?;
        }
        pending.committed = true;
        Ok(())
    }

    /// At most once per [`MARK_IDLE`]: clear the marks of regions that have had no write in
    /// place for that long (after a write, off its path). A failure leaves them for later.
    pub(super) fn sweep_marks(&self) {
        {
            let Ok(mut last) = self.sums.last_sweep.try_lock() else { return };
            if last.elapsed() < MARK_IDLE {
                return;
            }
            *last = Instant::now();
        }
        if let Err(e) = self.clear_marks(MARK_IDLE) {
            eprintln!("osd: clearing the marks of regions written in place failed: {e}");
        }
    }

    /// Clear every mark no write in place needs now (before a sync, so that a clean stop
    /// leaves nothing to compute again on open).
    pub(super) fn clear_all_marks(&self) -> Result<()> {
        self.clear_marks(Duration::ZERO)
    }

    /// Clear the marks of regions with no write in place running and none for `idle`.
    /// Their bytes go to the drives first (a mark may go only once they are there); a mark
    /// cleared later than it could be is what saves marking a hot region again.
    fn clear_marks(&self, idle: Duration) -> Result<()> {
        let chosen: Vec<(u64, Instant)> = lock(&self.sums.marks)
            .iter()
            .filter(|(_, m)| m.in_flight == 0 && m.durable && m.last.elapsed() >= idle)
            .map(|(&r, m)| (r, m.last))
            .collect();
        if chosen.is_empty() {
            return Ok(());
        }
        self.data.flush()?;
        let txn = self.db.begin_write()?;
        {
            let mut d = txn.open_table(SUMS_DIRTY)?;
            // Under the marks' lock, inside the transaction: a writer that comes after
            // finds no mark and commits its own after this commit.
            let mut marks = lock(&self.sums.marks);
            for (r, last) in chosen {
                if marks.get(&r).is_some_and(|m| m.in_flight == 0 && m.last == last) {
                    marks.remove(&r);
                    d.remove(r)?;
                }
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Commit `pending` on its own (for a change that has no transaction of its own).
    pub(super) fn commit_pending(&self, mut pending: PendingSums<'_>) -> Result<()> {
        let txn = self.db.begin_write()?;
        self.commit_sums(&txn, &mut pending)?;
        txn.commit()?;
        Ok(())
    }

    /// On open: the chunks of regions marked as written in place get checksums of what
    /// they hold (their writes may have stopped half-way); a block kept lost stays lost.
    /// Returns how many regions.
    pub(super) fn recompute_marked(&self) -> Result<u64> {
        let marked: Vec<u64> = {
            let txn = self.db.begin_read()?;
            let d = txn.open_table(SUMS_DIRTY)?;
            d.iter()?.map(|e| e.map(|(k, _)| k.value())).collect::<std::result::Result<_, _>>()?
        };
        if marked.is_empty() {
            return Ok(0);
        }
        let n = self.blocks_per_chunk() as usize;
        let mut image = nacre_raid::align::AlignedBuf::zeroed(self.chunk_bytes as usize);
        let txn = self.db.begin_write()?;
        {
            let mut t = txn.open_table(SUMS)?;
            let mut d = txn.open_table(SUMS_DIRTY)?;
            for &r in &marked {
                d.remove(r)?;
                let chunks =
                    r.saturating_mul(MARK_CHUNKS)..r.saturating_add(1).saturating_mul(MARK_CHUNKS).min(self.chunks);
                let stored: Vec<(u64, Vec<u8>)> = t
                    .range(chunks)?
                    .map(|e| e.map(|(k, v)| (k.value(), v.value().to_vec())))
                    .collect::<std::result::Result<_, _>>()?;
                for (p, raw) in stored {
                    let mut s = ChunkSums::decode(p, n, &raw)?;
                    self.data.read(p * self.chunk_bytes, &mut image)?;
                    for (b, block) in image.chunks(BLOCK_BYTES as usize).enumerate() {
                        let crc = crc32c(block);
                        if s.get(b).is_some_and(|had| had != !crc) {
                            s.set(b, crc);
                        }
                    }
                    t.insert(p, s.raw.as_slice())?;
                }
            }
        }
        txn.commit()?;
        self.sums.recomputed.fetch_add(marked.len() as u64, Ordering::Relaxed);
        Ok(marked.len() as u64)
    }

    /// In `txn`: forget the checksums of `n` blocks from `first` of slab `chunk`, given
    /// back (so that nothing checks them against bytes a new fragment is writing there).
    pub(super) fn forget_block_sums(&self, txn: &redb::WriteTransaction, chunk: u64, first: u32, n: u32) -> Result<()> {
        let mut t = txn.open_table(SUMS)?;
        let blocks = self.blocks_per_chunk() as usize;
        let Some(mut s) = t.get(chunk)?.map(|v| ChunkSums::decode(chunk, blocks, v.value())).transpose()? else {
            return Ok(());
        };
        for b in first as usize..(first + n) as usize {
            s.clear(b);
        }
        t.insert(chunk, s.raw.as_slice())?;
        Ok(())
    }

    /// In `txn`: forget the checksums of chunks given back (their region's mark, if any,
    /// stays for the rest of it).
    pub(super) fn forget_sums(txn: &redb::WriteTransaction, chunks: &[u64]) -> Result<()> {
        let mut t = txn.open_table(SUMS)?;
        for &p in chunks {
            t.remove(p)?;
        }
        Ok(())
    }

    /// Check every block that has a checksum against its bytes, and that only mapped
    /// chunks and slabs have checksums; calls `problem` for each finding. Reads all the
    /// data (a scrub of the object bytes).
    pub(super) fn check_sums(
        &self,
        txn: &redb::ReadTransaction,
        in_use: impl Fn(u64) -> bool,
        problem: &mut dyn FnMut(String),
    ) -> Result<u64> {
        let n = self.blocks_per_chunk() as usize;
        let t = txn.open_table(SUMS)?;
        let mut image = nacre_raid::align::AlignedBuf::zeroed(self.chunk_bytes as usize);
        let mut checked = 0;
        for e in t.iter()? {
            let (k, v) = e?;
            let p = k.value();
            if p >= self.chunks || !in_use(p) {
                problem(format!("chunk {p} has checksums but is neither mapped nor a slab"));
                continue;
            }
            let s = ChunkSums::decode(p, n, v.value())?;
            self.data.read(p * self.chunk_bytes, &mut image)?;
            for (b, block) in image.chunks(BLOCK_BYTES as usize).enumerate() {
                if let Some(want) = s.get(b) {
                    checked += 1;
                    if crc32c(block) != want {
                        problem(format!("chunk {p} block {b} does not match its checksum"));
                    }
                }
            }
        }
        Ok(checked)
    }
}
