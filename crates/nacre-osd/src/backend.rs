//! A redb database kept on a byte range of a RAID volume, so that every byte a target owns
//! is on its drives (a partner server that opens the drives can serve it, and the RAID
//! protects the index like the data).
//!
//! redb asks its backend for a length that grows and shrinks; a volume has a fixed size. The
//! region therefore starts with two 4 KiB header slots holding the database's length (with
//! a sequence number and a CRC-32C); a length change writes the slot after the newest,
//! so a torn header write leaves the other slot intact. The database bytes follow.
//!
//! **Writes are gathered until `sync_data`.** redb writes a commit's pages one by one and
//! then asks for a sync; each page sent to the volume on its own would pay a volume write
//! (and its hops to the drive threads) apiece. The backend keeps written pages in memory
//! (reads see them) and at `sync_data` writes them out, neighbours joined into one IO, in
//! offset order. Nothing is lost by waiting: redb's commit is durable only once
//! `sync_data` returns, and by then every page is on the drives. At most
//! [`PENDING_BYTES_MAX`] wait; beyond that they go out at once.
//!
//! `sync_data` also flushes the volume's drives when [`SyncMode::Drives`] is chosen. With
//! [`SyncMode::Ordered`] it only orders: every write has reached the drives (O_DIRECT) when
//! it returns, which is what survives `kill -9` of the server; power loss needs a flush,
//! which the target does on `sync` and on its commit interval.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use nacre_raid::volume::Volume;

use crate::crc32c;
use crate::journal::lock;

const SLOT_BYTES: u64 = 4096;
const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"NCDB");
const HEADER_VERSION: u32 = 1;
/// Bytes zeroed per write when the database grows.
const ZERO_STEP: usize = 1 << 20;
/// Largest IO that joined neighbouring pending writes make.
const JOINED_BYTES_MAX: usize = 4 << 20;
/// Written bytes held in memory until the next sync at most.
pub const PENDING_BYTES_MAX: usize = 32 << 20;

/// Writes not yet sent to the volume: non-overlapping extents by database offset.
#[derive(Default)]
struct Pending {
    extents: std::collections::BTreeMap<u64, Vec<u8>>,
    bytes: usize,
}

impl Pending {
    /// Add a write. The parts of older extents it covers go; nothing is merged here (redb
    /// writes page by page, and merging would copy a growing extent each time):
    /// neighbours are joined when they are written out.
    fn add(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        let overlapping: Vec<u64> = self
            .extents
            .range(..end)
            .rev()
            .take_while(|(at, v)| **at + v.len() as u64 > offset)
            .map(|(at, _)| *at)
            .collect();
        for at in overlapping {
            let Some(v) = self.extents.remove(&at) else { continue };
            self.bytes -= v.len();
            let v_end = at + v.len() as u64;
            if at < offset {
                let head = v[..(offset - at) as usize].to_vec();
                self.bytes += head.len();
                self.extents.insert(at, head);
            }
            if v_end > end {
                let tail = v[(end - at) as usize..].to_vec();
                self.bytes += tail.len();
                self.extents.insert(end, tail);
            }
        }
        self.bytes += data.len();
        self.extents.insert(offset, data.to_vec());
    }

    /// Copy what is pending over `out`, which was read from `offset`.
    fn overlay(&self, offset: u64, out: &mut [u8]) {
        let end = offset + out.len() as u64;
        for (at, v) in self.extents.range(..end).rev() {
            let v_end = *at + v.len() as u64;
            if v_end <= offset {
                break;
            }
            let (from, to) = ((*at).max(offset), v_end.min(end));
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&v[(from - at) as usize..(to - at) as usize]);
        }
    }

    /// Forget what lies at or past `len` (the database shrank).
    fn truncate(&mut self, len: u64) {
        let cut: Vec<u64> =
            self.extents.range(..).filter(|(at, v)| **at + v.len() as u64 > len).map(|(a, _)| *a).collect();
        for at in cut {
            if let Some(mut v) = self.extents.remove(&at) {
                self.bytes -= v.len();
                if at < len {
                    v.truncate((len - at) as usize);
                    self.bytes += v.len();
                    self.extents.insert(at, v);
                }
            }
        }
    }
}

/// How `sync_data` makes a commit durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Flush the drives at every commit: durable against power loss.
    Drives,
    /// Writes are on the drives when they return; flushes happen on `sync` and on an
    /// interval. Durable against a crash of the server process at every commit.
    Ordered,
}

#[derive(Debug)]
struct Header {
    seq: u64,
    len: u64,
}

/// redb storage on `[base, base + size)` of a volume.
pub struct VolumeBackend {
    volume: Arc<Volume>,
    base: u64,
    size: u64,
    header: Mutex<Header>,
    /// The database's length as the header has it, for readers outside redb (statfs).
    len_seen: Arc<AtomicU64>,
    /// The most the database may grow to: the region's room, or less if its owner keeps
    /// the region's top for something else (see [`VolumeBackend::max_len_handle`]).
    max_len: Arc<AtomicU64>,
    flush_drives: AtomicBool,
    /// Written pages not yet on the volume. A read holds it shared across its volume read
    /// and the overlay, so a flush cannot move a page out from under it in between.
    pending: RwLock<Pending>,
}

impl std::fmt::Debug for VolumeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VolumeBackend({} at {}+{})", self.volume.name(), self.base, self.size)
    }
}

fn other<E: std::fmt::Display>(e: E) -> io::Error {
    io::Error::other(e.to_string())
}

impl VolumeBackend {
    /// Open the database region `[base, base + size)`. A region that has never held one
    /// (no valid header slot) is a database of length 0.
    pub fn open(volume: Arc<Volume>, base: u64, size: u64, mode: SyncMode) -> io::Result<VolumeBackend> {
        if size <= 2 * SLOT_BYTES || base.checked_add(size).is_none_or(|end| end > volume.capacity()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("database region {base}+{size} does not fit volume of {} bytes", volume.capacity()),
            ));
        }
        let mut best: Option<Header> = None;
        for slot in 0..2 {
            let mut b = vec![0u8; SLOT_BYTES as usize];
            volume.read(base + slot * SLOT_BYTES, &mut b).map_err(other)?;
            if let Some(h) = decode_header(&b)
                && best.as_ref().is_none_or(|x| h.seq > x.seq)
            {
                best = Some(h);
            }
        }
        let header = best.unwrap_or(Header { seq: 0, len: 0 });
        if header.len > size - 2 * SLOT_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("database header claims {} bytes in a region of {}", header.len, size - 2 * SLOT_BYTES),
            ));
        }
        Ok(VolumeBackend {
            volume,
            base,
            size,
            len_seen: Arc::new(AtomicU64::new(header.len)),
            max_len: Arc::new(AtomicU64::new(size - 2 * SLOT_BYTES)),
            header: Mutex::new(header),
            flush_drives: AtomicBool::new(mode == SyncMode::Drives),
            pending: RwLock::new(Pending::default()),
        })
    }

    /// Bytes the database may grow to.
    pub fn capacity(&self) -> u64 {
        (self.size - 2 * SLOT_BYTES).min(self.max_len.load(Ordering::Acquire))
    }

    /// The most the database may grow to, live and settable: an owner that keeps the top
    /// of the region for something else lowers it, and a growth past it fails cleanly
    /// (before anything is written) instead of writing over that.
    pub fn max_len_handle(&self) -> Arc<AtomicU64> {
        self.max_len.clone()
    }

    /// Where the database's bytes start on the volume (past the header slots).
    pub fn data_offset(&self) -> u64 {
        self.data_at()
    }

    /// A live view of the database's length, which stays valid after redb takes the
    /// backend.
    pub fn len_handle(&self) -> Arc<AtomicU64> {
        self.len_seen.clone()
    }

    pub fn set_mode(&self, mode: SyncMode) {
        self.flush_drives.store(mode == SyncMode::Drives, Ordering::Release);
    }

    fn pending_mut(&self) -> std::sync::RwLockWriteGuard<'_, Pending> {
        self.pending.write().unwrap_or_else(|e| e.into_inner())
    }

    fn data_at(&self) -> u64 {
        self.base + 2 * SLOT_BYTES
    }

    /// Send every pending write to the volume in offset order, neighbours joined into
    /// one IO of up to [`JOINED_BYTES_MAX`]. On an error what was not written stays
    /// pending.
    fn write_pending(&self) -> io::Result<()> {
        let mut p = self.pending_mut();
        let mut run: Vec<u8> = Vec::new();
        let mut run_at = 0;
        let mut parts: Vec<(u64, usize)> = Vec::new();
        loop {
            let next = p.extents.first_key_value().map(|(at, v)| (*at, v.len()));
            let joins = next.is_some_and(|(at, len)| {
                !run.is_empty() && at == run_at + run.len() as u64 && run.len() + len <= JOINED_BYTES_MAX
            });
            if !joins && !run.is_empty() {
                if let Err(e) = self.volume.write(self.data_at() + run_at, &run) {
                    // Put the run back as it was taken.
                    let mut off = 0;
                    for (at, len) in parts.drain(..) {
                        p.extents.insert(at, run[off..off + len].to_vec());
                        off += len;
                    }
                    return Err(other(e));
                }
                p.bytes -= run.len();
                run.clear();
                parts.clear();
            }
            let Some((at, v)) = p.extents.pop_first() else { return Ok(()) };
            if run.is_empty() {
                run_at = at;
            }
            parts.push((at, v.len()));
            run.extend_from_slice(&v);
        }
    }

    fn write_header(&self, h: &mut Header, len: u64) -> io::Result<()> {
        let seq = h.seq + 1;
        let mut b = vec![0u8; SLOT_BYTES as usize];
        b[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&HEADER_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&seq.to_le_bytes());
        b[16..24].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c(&b[..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        self.volume.write(self.base + (seq % 2) * SLOT_BYTES, &b).map_err(other)?;
        *h = Header { seq, len };
        self.len_seen.store(len, Ordering::Release);
        Ok(())
    }
}

fn decode_header(b: &[u8]) -> Option<Header> {
    let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let long = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    if b.len() < 28 || word(0) != HEADER_MAGIC || word(4) != HEADER_VERSION || word(24) != crc32c(&b[..24]) {
        return None;
    }
    Some(Header { seq: long(8), len: long(16) })
}

impl redb::StorageBackend for VolumeBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(lock(&self.header).len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let len = self.len()?;
        if offset.checked_add(out.len() as u64).is_none_or(|end| end > len) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read of {} bytes at {offset} past the database's {len}", out.len()),
            ));
        }
        let p = self.pending.read().unwrap_or_else(|e| e.into_inner());
        self.volume.read(self.data_at() + offset, out).map_err(other)?;
        p.overlay(offset, out);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if len > self.capacity() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("the index needs {len} bytes; its region holds {}", self.capacity()),
            ));
        }
        let mut h = lock(&self.header);
        if len < h.len {
            self.pending_mut().truncate(len);
        }
        // New bytes must read as zero: the region may hold anything from before.
        let zeros = vec![0u8; ZERO_STEP];
        let mut at = h.len;
        while at < len {
            let n = ((len - at) as usize).min(ZERO_STEP);
            self.volume.write(self.data_at() + at, &zeros[..n]).map_err(other)?;
            at += n as u64;
        }
        self.write_header(&mut h, len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.write_pending()?;
        if self.flush_drives.load(Ordering::Acquire) {
            self.volume.flush().map_err(other)?;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let len = self.len()?;
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("write of {} bytes at {offset} past the database's {len}", data.len()),
            ));
        }
        let full = {
            let mut p = self.pending_mut();
            p.add(offset, data);
            p.bytes > PENDING_BYTES_MAX
        };
        if full { self.write_pending() } else { Ok(()) }
    }

    fn close(&self) -> io::Result<()> {
        self.write_pending()
    }
}

#[cfg(test)]
mod tests {
    use super::Pending;

    /// Pending writes against a plain byte array: random overlapping writes, reads
    /// overlaid, truncation; after each step the two agree.
    #[test]
    fn pending_writes_read_back_like_memory() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let size = 64 << 10;
        let base: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut model = base.clone();
        let mut p = Pending::default();
        for step in 0..2000 {
            match next() % 10 {
                0 => {
                    let len = (next() % size as u64) as usize;
                    p.truncate(len as u64);
                    // Past the cut the region holds what the volume holds.
                    model[len..].copy_from_slice(&base[len..]);
                }
                _ => {
                    let at = (next() % size as u64) as usize;
                    let len = ((next() % 9000) as usize + 1).min(size - at);
                    let v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                    p.add(at as u64, &v);
                    model[at..at + len].copy_from_slice(&v);
                }
            }
            let at = (next() % size as u64) as usize;
            let len = ((next() % 20_000) as usize).min(size - at);
            let mut out = base[at..at + len].to_vec();
            p.overlay(at as u64, &mut out);
            assert_eq!(out, model[at..at + len], "step {step}: read of {len} at {at}");
            // Extents never overlap, and the byte count is theirs.
            let mut end = 0;
            for (i, (a, v)) in p.extents.iter().enumerate() {
                assert!(i == 0 || *a >= end, "step {step}: extents overlap at {a}");
                end = a + v.len() as u64;
            }
            assert_eq!(p.bytes, p.extents.values().map(Vec::len).sum::<usize>());
        }
    }
}
