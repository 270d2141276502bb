//! A target (an OST): objects whose data lives on a parity volume and whose index lives in
//! redb on a mirrored volume.
//!
//! **Chunks.** The data volume is cut into chunks of one full stripe (8 × 128 KiB = 1 MiB
//! on RAID6 8+2); an object maps chunk indexes to physical chunks. A write that fills a new
//! chunk is one full-stripe write (no parity read); a run of new chunks is allocated as one
//! contiguous extent when free space allows, so a 16 MiB write is one 16 MiB volume write.
//! A partial write into a new chunk writes the whole chunk, zero-filled; a write into a
//! chunk already mapped goes in place (the volume does the read-modify-write).
//!
//! **Crash consistency.** New chunks are written before the transaction that maps them
//! commits, and free space is only taken from the free table in that same transaction: a
//! crash before the commit leaves the chunk free and nothing pointing at it; a crash after
//! leaves it mapped and written. Chunks are given back (truncate, punch, destroy) in the
//! transaction that unmaps them, under an exclusive object lock that waits for running
//! reads. Bytes past an object's size are zero on the drives, always, so growing the size
//! (a write past a gap, a truncate up) exposes zeros with no IO: new chunks are written
//! zero-filled around their data; a write that goes in place past the size first commits
//! the larger size (a crash then shows zeros there, never stale bytes) and concurrent
//! extending writers cannot zero each other's data; a truncate down zeroes the tail of its
//! last chunk before it commits. A write is acknowledged after its data and its index commit are on the drives:
//! that survives `kill -9` of the server; with [`SyncMode::Drives`] also power loss,
//! otherwise power loss keeps what the last `sync` flushed.
//!
//! **Checksums.** Every 4 KiB block of object data has a CRC-32C in the index, checked on
//! every read, decoded from parity and mended when a drive returned it wrong (see `sums`).
//!
//! **Memory.** Nothing per object is kept in memory: the index is on the volume and only
//! running operations hold locks or reservations.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use nacre_raid::volume::Volume;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::backend::{SyncMode, VolumeBackend};
use crate::error::{OsdError, Result};
use crate::journal::{AppendError, Journal, JournalOptions, lock};
use crate::locks::Locks;
use crate::object::{ObjectAttr, SetAttr};

mod small;
mod sums;
pub use small::BLOCK_BYTES;
use small::{FRAGS, SLABS};
pub use sums::ScrubReport;
use sums::{PendingSums, SUMS, SUMS_DIRTY};

const OBJECTS: TableDefinition<u64, &[u8]> = TableDefinition::new("objects");
/// (object, chunk index) → physical chunk.
const MAP: TableDefinition<(u64, u64), u64> = TableDefinition::new("map");
/// First physical chunk of a free extent → its length in chunks.
const FREE: TableDefinition<u64, u64> = TableDefinition::new("free");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// (object, chunk) → the highest journal sequence destaged into it: replay skips older
/// pieces, which may have been overwritten since. Only entries at or after the journal's
/// tail are kept (older records are never replayed), so the table is bounded by the journal.
const DESTAGED: TableDefinition<(u64, u64), u64> = TableDefinition::new("destaged");
/// The same entries by sequence, for pruning behind the tail.
const DESTAGED_BY_SEQ: TableDefinition<(u64, u64, u64), ()> = TableDefinition::new("destaged_by_seq");

/// The index format: 2 has small objects' fragments (`frags`, `slabs`), which a build of
/// format 1 would read as holes; 3 has data checksums (`sums`, `sums_dirty`), which a build
/// of format 2 would leave stale as it writes. Older targets are upgraded when opened
/// (their blocks have no checksums until written again).
const FORMAT: u64 = 3;
const FIRST_OID: u64 = 1;
/// Object ids are `group << GROUP_SHIFT | n`: each MDT precreates in a group of its own
/// (its index), so that one MDT's orphan cleanup never reaches another's objects
/// (Lustre's per-MDT object sequences on an OST).
pub const GROUP_SHIFT: u32 = 48;
/// Groups a target keeps apart.
pub const GROUPS_MAX: u32 = 1 << 16;

/// The META key of a group's next object id (group 0 keeps the original key).
fn next_key(group: u32) -> String {
    if group == 0 { "next_oid".to_string() } else { format!("next_oid.{group}") }
}

/// The group of an object id.
pub fn group_of(oid: u64) -> u32 {
    (oid >> GROUP_SHIFT) as u32
}
/// How long (in 1 ms waits) a write waits for a full journal to drain.
const JOURNAL_FULL_WAITS: u32 = 5000;

/// Largest batch of objects one create makes (Lustre precreates up to 20,000 at a time).
pub const CREATE_BATCH_MAX: u32 = 65_536;

/// Settings of a target.
#[derive(Debug, Clone, Copy)]
pub struct TargetOptions {
    pub sync: SyncMode,
    /// No object grows past this (Lustre's ldiskfs OSTs stop at 16 TiB).
    pub max_object_bytes: u64,
    /// redb's page cache.
    pub cache_bytes: usize,
    /// Small-write journal batches written at once (measured on file drives: 1 and 2
    /// give the same; more helps only drives that gain from queue depth).
    pub journal_batches_in_flight: usize,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            sync: SyncMode::Ordered,
            max_object_bytes: 16 << 40,
            cache_bytes: 64 << 20,
            journal_batches_in_flight: crate::journal::BATCHES_IN_FLIGHT,
        }
    }
}

/// Space and object counts, exact (`statfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub chunk_bytes: u64,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub objects: u64,
    /// Bytes the index occupies and may grow to.
    pub index_bytes: u64,
    pub index_capacity: u64,
}

/// What `check` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub objects: u64,
    pub mapped_chunks: u64,
    pub free_chunks: u64,
    /// Data blocks read and compared with their checksums.
    pub checked_blocks: u64,
    /// Every inconsistency, named; empty means clean.
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    write_bytes: AtomicU64,
    reads: AtomicU64,
    read_bytes: AtomicU64,
    chunks_allocated: AtomicU64,
    in_place_writes: AtomicU64,
    fragment_writes: AtomicU64,
    promoted: AtomicU64,
    journaled: AtomicU64,
    destaged: AtomicU64,
    destage_us: AtomicU64,
    append_us: AtomicU64,
    small_write_us: AtomicU64,
}

/// Counters of a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TargetStats {
    pub writes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub read_bytes: u64,
    /// New chunks written whole (full-stripe writes).
    pub chunks_allocated: u64,
    /// Pieces written into chunks already mapped (in place).
    pub in_place_writes: u64,
    /// Writes that went to small objects' fragments, and fragments moved into chunks of
    /// their own as their objects grew.
    pub fragment_writes: u64,
    pub fragments_promoted: u64,
    /// Small pieces that went through the journal.
    pub journaled: u64,
    /// Chunks the journal's pieces were moved into, and the time it took.
    pub destaged: u64,
    pub destage_us: u64,
    /// Time journaled writes spent in the journal's append, and in all.
    pub append_us: u64,
    pub small_write_us: u64,
    /// Journal batches written, and the records they held (group commit at work).
    pub journal_batches: u64,
    pub journal_records: u64,
    /// Journal bytes in use and its size.
    pub journal_used: u64,
    pub journal_bytes: u64,
    /// Blocks that did not match their checksum and could not be decoded from parity
    /// (each failed read counts its block), blocks decoded from parity and mended on
    /// their drive, and regions (of 64 chunks) whose checksums were computed again on
    /// open (writes in place may have been cut short there).
    pub checksum_errors: u64,
    pub checksum_repairs: u64,
    pub checksum_regions_recomputed: u64,
}

/// Chunks taken from the free table by running writes, not yet committed; and chunks
/// promised to journaled pieces of unmapped chunks, which their destage will allocate (a
/// write the journal acknowledged must never meet ENOSPC later).
#[derive(Default)]
struct Reserved {
    extents: BTreeMap<u64, u64>,
    cursor: u64,
    promised: HashSet<(u64, u64)>,
}

pub struct Target {
    data: Arc<Volume>,
    meta: Arc<Volume>,
    db: Database,
    chunk_bytes: u64,
    chunks: u64,
    opts: TargetOptions,
    locks: Locks,
    reserved: Mutex<Reserved>,
    /// Blocks of small objects' fragments held by running writes (see `small`).
    small: Mutex<small::SmallState>,
    /// Marks and counts of writes in place, for the data checksums (see `sums`).
    sums: sums::SumState,
    counters: Counters,
    journal: Journal,
    /// The index database's length (a view of its backend's header) and its room.
    index_len: Arc<AtomicU64>,
    index_capacity: u64,
    /// Held from computing the journal's new tail through its commit and the removal of
    /// the destaged pieces, so the journal never reuses space the committed tail still
    /// needs (destages otherwise run side by side).
    tail_commit: Mutex<()>,
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// The redb region on the mirrored volume: all of it but the small-write journal's.
fn index_region(meta: &Volume) -> u64 {
    meta.capacity() - (meta.capacity() / 4).min(4 << 30)
}

/// The index database on the mirrored volume, with a view of its length.
struct Index {
    db: Database,
    len: Arc<AtomicU64>,
    capacity: u64,
}

impl Index {
    fn open(meta: &Arc<Volume>, opts: &TargetOptions) -> Result<Index> {
        let backend = VolumeBackend::open(meta.clone(), 0, index_region(meta), opts.sync)?;
        let (len, capacity) = (backend.len_handle(), backend.capacity());
        let db = Database::builder().set_cache_size(opts.cache_bytes).create_with_backend(backend)?;
        Ok(Index { db, len, capacity })
    }
}

/// Where the journal starts reading on open: its id, the committed tail (position and
/// sequence), and each chunk's destaged floor.
struct JournalStart {
    jid: u64,
    epoch: u32,
    tail: (u64, u64),
    floors: std::collections::HashMap<(u64, u64), u64>,
}

/// The small-write journal's region: the rest of the mirrored volume.
fn journal_region(meta: &Volume) -> (u64, u64) {
    let base = index_region(meta).div_ceil(4096) * 4096;
    (base, meta.capacity().saturating_sub(base))
}

impl Target {
    /// Make a new target on two volumes: `data` (parity, the objects' bytes) and `meta`
    /// (mirrored, the index). Whatever the index region held is forgotten.
    pub fn format(data: Arc<Volume>, meta: Arc<Volume>, opts: TargetOptions) -> Result<Target> {
        let chunk_bytes = data.geometry().stripe_data_bytes();
        let chunks = data.capacity() / chunk_bytes;
        if chunks == 0 {
            return Err(OsdError::NotATarget(format!(
                "data volume of {} bytes holds no whole stripe",
                data.capacity()
            )));
        }
        // Zero the index region's header slots: a new database starts from nothing.
        meta.write(0, &[0u8; 8192])?;
        let jid = (std::time::SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
            ^ ((std::process::id() as u64) << 48))
            | 1;
        let index = Index::open(&meta, &opts)?;
        let target = Target::open_db(
            data,
            meta,
            opts,
            index,
            (chunk_bytes, chunks),
            JournalStart { jid, epoch: 1, tail: (0, 0), floors: Default::default() },
        )?;
        let txn = target.db.begin_write()?;
        {
            let mut m = txn.open_table(META)?;
            if m.get("format")?.is_some() {
                return Err(OsdError::NotATarget("the index region already holds a target".into()));
            }
            m.insert("format", FORMAT)?;
            m.insert("chunk_bytes", chunk_bytes)?;
            m.insert("chunks", chunks)?;
            m.insert("next_oid", FIRST_OID)?;
            m.insert("free_chunks", chunks)?;
            m.insert("free_blocks", 0)?;
            m.insert("objects", 0)?;
            m.insert("journal_id", jid)?;
            m.insert("journal_tail", 0)?;
            m.insert("journal_tail_seq", 0)?;
            m.insert("journal_epoch", 1)?;
            let mut f = txn.open_table(FREE)?;
            f.insert(0, chunks)?;
            txn.open_table(OBJECTS)?;
            txn.open_table(MAP)?;
            txn.open_table(DESTAGED)?;
            txn.open_table(DESTAGED_BY_SEQ)?;
            txn.open_table(FRAGS)?;
            txn.open_table(SLABS)?;
            txn.open_table(SUMS)?;
            txn.open_table(SUMS_DIRTY)?;
        }
        txn.commit()?;
        Ok(target)
    }

    /// Open an existing target; refuses volumes that hold none or one of another shape.
    pub fn open(data: Arc<Volume>, meta: Arc<Volume>, opts: TargetOptions) -> Result<Target> {
        let chunk_bytes = data.geometry().stripe_data_bytes();
        let chunks = data.capacity() / chunk_bytes;
        // The index first (it says where the journal's tail is), then the journal.
        let index = Index::open(&meta, &opts)?;
        let db = &index.db;
        let (format, cb, n, jid, tail, tail_seq, floors, epoch) = {
            let txn = db.begin_read()?;
            let mut floors = std::collections::HashMap::new();
            if let Ok(d) = txn.open_table(DESTAGED) {
                for e in d.iter()? {
                    let (k, v) = e?;
                    floors.insert(k.value(), v.value());
                }
            }
            let m = txn.open_table(META).map_err(|e| OsdError::NotATarget(format!("no target index ({e})")))?;
            let get = |k: &str| -> Result<u64> { Ok(m.get(k)?.map(|v| v.value()).unwrap_or(0)) };
            (
                get("format")?,
                get("chunk_bytes")?,
                get("chunks")?,
                get("journal_id")?,
                get("journal_tail")?,
                get("journal_tail_seq")?,
                floors,
                get("journal_epoch")? + 1,
            )
        };
        // Each open writes with a new epoch (see the journal).
        {
            let txn = db.begin_write()?;
            txn.open_table(META)?.insert("journal_epoch", epoch)?;
            // Targets made before small objects had fragments, or data checksums, get
            // their (empty) tables.
            txn.open_table(FRAGS)?;
            txn.open_table(SLABS)?;
            txn.open_table(SUMS)?;
            txn.open_table(SUMS_DIRTY)?;
            txn.commit()?;
        }
        if !(1..=FORMAT).contains(&format) {
            return Err(OsdError::NotATarget(format!("index format {format}, this build reads 1 to {FORMAT}")));
        }
        if cb != chunk_bytes || n != chunks {
            return Err(OsdError::NotATarget(format!(
                "index made for {n} chunks of {cb} bytes; the data volume has {chunks} of {chunk_bytes}"
            )));
        }
        if format < FORMAT {
            let txn = db.begin_write()?;
            txn.open_table(META)?.insert("format", FORMAT)?;
            txn.commit()?;
        }
        let target = Target::open_db(
            data,
            meta,
            opts,
            index,
            (chunk_bytes, chunks),
            JournalStart { jid, epoch: epoch.min(u32::MAX as u64) as u32, tail: (tail, tail_seq), floors },
        )?;
        // Chunks a write in place may have left half-written get checksums of what they hold.
        target.recompute_marked()?;
        // Pieces replayed into unmapped chunks hold their promise again.
        for (oid, c) in target.journal.all_chunks() {
            if target.mapping(oid, c, c)?.first().copied().flatten().is_none() {
                target.lock_reserved().promised.insert((oid, c));
            }
        }
        Ok(target)
    }

    fn open_db(
        data: Arc<Volume>,
        meta: Arc<Volume>,
        opts: TargetOptions,
        index: Index,
        (chunk_bytes, chunks): (u64, u64),
        start: JournalStart,
    ) -> Result<Target> {
        let JournalStart { jid, epoch, tail, floors } = start;
        let Index { db, len: index_len, capacity: index_capacity } = index;
        // Records of another target on this region carry another journal id and end the
        // replay at once.
        let journal = Journal::open(
            meta.clone(),
            journal_region(&meta),
            chunk_bytes,
            (jid, epoch),
            tail,
            &floors,
            JournalOptions { in_flight_max: opts.journal_batches_in_flight, flush: opts.sync == SyncMode::Drives },
        )?;
        Ok(Target {
            index_len,
            index_capacity,
            journal,
            tail_commit: Mutex::new(()),
            data,
            meta,
            db,
            chunk_bytes,
            chunks,
            opts,
            locks: Locks::default(),
            reserved: Mutex::new(Reserved::default()),
            small: Mutex::new(small::SmallState::default()),
            sums: sums::SumState::default(),
            counters: Counters::default(),
        })
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    pub fn max_object_bytes(&self) -> u64 {
        self.opts.max_object_bytes
    }

    /// The id the next object created in group 0 will get.
    pub fn next_oid(&self) -> Result<u64> {
        self.next_oid_in(0)
    }

    /// The id the next object created in `group` will get: every object ever made in it
    /// is below it.
    pub fn next_oid_in(&self, group: u32) -> Result<u64> {
        if group >= GROUPS_MAX {
            return Err(OsdError::Invalid(format!("object group {group} (0 to {})", GROUPS_MAX - 1)));
        }
        let txn = self.db.begin_read()?;
        let m = txn.open_table(META)?;
        Ok(m.get(next_key(group).as_str())?.map(|v| v.value()).unwrap_or(((group as u64) << GROUP_SHIFT) | FIRST_OID))
    }

    /// Make `count` new empty objects in group 0; returns their ids (consecutive).
    pub fn create(&self, count: u32) -> Result<Range<u64>> {
        self.create_in(0, count)
    }

    /// Make `count` new empty objects in `group`; returns their ids (consecutive).
    pub fn create_in(&self, group: u32, count: u32) -> Result<Range<u64>> {
        if count == 0 || count > CREATE_BATCH_MAX {
            return Err(OsdError::Invalid(format!("create of {count} objects (1 to {CREATE_BATCH_MAX})")));
        }
        if group >= GROUPS_MAX {
            return Err(OsdError::Invalid(format!("object group {group} (0 to {})", GROUPS_MAX - 1)));
        }
        let key = next_key(group);
        let now = now_ns();
        let attr = ObjectAttr { mtime_ns: now, atime_ns: now, ctime_ns: now, ..ObjectAttr::default() }.encode();
        let txn = self.db.begin_write()?;
        let first;
        {
            let mut m = txn.open_table(META)?;
            first = m.get(key.as_str())?.map(|v| v.value()).unwrap_or(((group as u64) << GROUP_SHIFT) | FIRST_OID);
            if group_of(first + count as u64) != group {
                return Err(OsdError::Invalid(format!("object group {group} is full")));
            }
            let objects = m.get("objects")?.map(|v| v.value()).unwrap_or(0);
            m.insert(key.as_str(), first + count as u64)?;
            m.insert("objects", objects + count as u64)?;
            let mut o = txn.open_table(OBJECTS)?;
            for oid in first..first + count as u64 {
                o.insert(oid, attr.as_slice())?;
            }
        }
        txn.commit()?;
        Ok(first..first + count as u64)
    }

    /// Attributes, with the size that journaled writes not yet destaged give.
    pub fn getattr(&self, oid: u64) -> Result<ObjectAttr> {
        // Pending first: pieces leave the journal only after the commit that grew the
        // size, so this order never misses both.
        let pending = self.journal.pending_size(oid);
        let mut a = self.committed_attr(oid)?;
        if let Some(end) = pending {
            a.size = a.size.max(end);
        }
        Ok(a)
    }

    /// Attributes as the index holds them.
    fn committed_attr(&self, oid: u64) -> Result<ObjectAttr> {
        let txn = self.db.begin_read()?;
        let o = txn.open_table(OBJECTS)?;
        let v = o.get(oid)?.ok_or(OsdError::NoSuchObject(oid))?;
        ObjectAttr::decode(oid, v.value())
    }

    fn lock_reserved(&self) -> std::sync::MutexGuard<'_, Reserved> {
        lock(&self.reserved)
    }

    pub fn setattr(&self, oid: u64, s: &SetAttr) -> Result<ObjectAttr> {
        let _g = self.locks.shared(oid);
        let txn = self.db.begin_write()?;
        let attr;
        {
            let mut o = txn.open_table(OBJECTS)?;
            let mut a = {
                let v = o.get(oid)?.ok_or(OsdError::NoSuchObject(oid))?;
                ObjectAttr::decode(oid, v.value())?
            };
            a.apply(s);
            if s.ctime_ns.is_none() {
                a.ctime_ns = now_ns();
            }
            o.insert(oid, a.encode().as_slice())?;
            attr = a;
        }
        txn.commit()?;
        let mut attr = attr;
        if let Some(end) = self.journal.pending_size(oid) {
            attr.size = attr.size.max(end);
        }
        Ok(attr)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let max = self.opts.max_object_bytes;
        match offset.checked_add(len) {
            Some(end) if end <= max => Ok(()),
            _ => Err(OsdError::TooLarge { offset, len, max }),
        }
    }

    /// The physical chunks of `oid`'s chunk indexes `first..=last` (None: a hole).
    fn mapping(&self, oid: u64, first: u64, last: u64) -> Result<Vec<Option<u64>>> {
        let txn = self.db.begin_read()?;
        let map = txn.open_table(MAP)?;
        let mut out = vec![None; (last - first + 1) as usize];
        for e in map.range((oid, first)..=(oid, last))? {
            let (k, v) = e?;
            out[(k.value().1 - first) as usize] = Some(v.value());
        }
        Ok(out)
    }

    /// Write `data` at `offset` of object `oid`. Pieces shorter than half a chunk go to
    /// the journal; the rest go to their chunks (see the module docs).
    pub fn write(&self, oid: u64, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.check_range(offset, data.len() as u64)?;
        let _g = self.locks.shared(oid);
        self.committed_attr(oid)?;
        let cb = self.chunk_bytes;
        let end = offset + data.len() as u64;
        // A small object's bytes go to its fragment (see `small`).
        if offset < cb {
            let _c0 = self.locks.chunks(oid, vec![0]);
            if self.fragment_takes(oid, end)? {
                self.write_fragment(oid, offset, data)?;
                self.counters.fragment_writes.fetch_add(1, Ordering::Relaxed);
                self.counters.writes.fetch_add(1, Ordering::Relaxed);
                self.counters.write_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                return Ok(());
            }
        }
        // Split by chunk: (start, end, journaled?), then merge neighbours of one kind.
        let mut parts: Vec<(u64, u64, bool)> = Vec::new();
        let mut at = offset;
        while at < end {
            let stop = end.min((at / cb + 1) * cb);
            // Journaled when short, and when the journal can take it (a small index volume
            // has a small journal).
            let small = stop - at < cb / 2 && stop - at <= self.journal.record_data_max();
            match parts.last_mut() {
                Some(last) if last.2 == small => last.1 = stop,
                _ => parts.push((at, stop, small)),
            }
            at = stop;
        }
        for (lo, hi, small) in parts {
            let piece = &data[(lo - offset) as usize..(hi - offset) as usize];
            // Neighbouring small parts merge into one record; one too large for the
            // journal goes straight to its chunks instead.
            if small && piece.len() as u64 <= self.journal.record_data_max() {
                self.journal_write(oid, lo, piece)?;
            } else {
                self.write_direct(oid, lo, piece)?;
            }
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.write_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.sweep_marks();
        Ok(())
    }

    /// A small piece through the journal: promise a chunk if it lands in an unmapped one,
    /// append (making room when the journal is full), then destage what it completed.
    fn journal_write(&self, oid: u64, offset: u64, data: &[u8]) -> Result<()> {
        let started = std::time::Instant::now();
        let r = self.journal_write_timed(oid, offset, data);
        self.counters.small_write_us.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        r
    }

    fn journal_write_timed(&self, oid: u64, offset: u64, data: &[u8]) -> Result<()> {
        let cb = self.chunk_bytes;
        let (first, last) = (offset / cb, (offset + data.len() as u64 - 1) / cb);
        // Chunk 0 of a small object: its fragment moves into a chunk, and the promise is
        // made, under the chunk-0 lock, so no fragment is made beside journaled pieces.
        let promised = if first == 0 {
            let _c0 = self.locks.chunks(oid, vec![0]);
            self.promote(oid)?;
            self.promise(oid, first, last)?
        } else {
            self.promise(oid, first, last)?
        };
        let appending = std::time::Instant::now();
        let mut waits = 0;
        let appended = loop {
            match self.journal.append(oid, offset, data) {
                Ok(()) => break Ok(()),
                Err(AppendError::Full) => match self.make_room(self.journal.usage().1 / 2) {
                    Ok(true) => {}
                    // Space is held by batches still being written: wait for them.
                    Ok(false) if waits < JOURNAL_FULL_WAITS => {
                        waits += 1;
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Ok(false) => break Err(OsdError::Index("the small-write journal stayed full".into())),
                    Err(e) => break Err(e),
                },
                Err(AppendError::Failed(e)) => break Err(e),
            }
        };
        if let Err(e) = appended {
            // Promises made for this write alone go back.
            let mut r = self.lock_reserved();
            for k in promised {
                if !self.journal.has_pieces(k.0, k.1) {
                    r.promised.remove(&k);
                }
            }
            return Err(e);
        }
        self.counters.append_us.fetch_add(appending.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.counters.journaled.fetch_add(1, Ordering::Relaxed);
        for c in first..=last {
            if Journal::covers(&self.journal.pieces(oid, c), cb) {
                self.destage(oid, c)?;
            }
        }
        let (used, size) = self.journal.usage();
        if used > size / 2 {
            self.make_room(size / 4)?;
        }
        Ok(())
    }

    /// Hold a free chunk for each unmapped chunk of `first..=last` that has no promise yet.
    fn promise(&self, oid: u64, first: u64, last: u64) -> Result<Vec<(u64, u64)>> {
        let map = self.mapping(oid, first, last)?;
        // The free count is read under the lock, as reservations are taken and committed
        // under it too.
        let mut r = self.lock_reserved();
        let txn = self.db.begin_read()?;
        let free = self.free_chunks_in(&txn)?;
        let new: Vec<(u64, u64)> = (first..=last)
            .filter(|&c| map[(c - first) as usize].is_none() && !r.promised.contains(&(oid, c)))
            .map(|c| (oid, c))
            .collect();
        let held: u64 = r.extents.values().sum::<u64>() + r.promised.len() as u64;
        let available = free.saturating_sub(held);
        if (new.len() as u64) > available {
            return Err(OsdError::NoSpace {
                need: new.len() as u64 * self.chunk_bytes,
                free: available * self.chunk_bytes,
            });
        }
        r.promised.extend(new.iter().copied());
        Ok(new)
    }

    /// Destage the oldest chunks until the journal holds at most `goal` bytes; false if
    /// nothing could be destaged.
    fn make_room(&self, goal: u64) -> Result<bool> {
        let mut any = false;
        loop {
            let (used, _) = self.journal.usage();
            if used <= goal {
                return Ok(true);
            }
            let mut progressed = false;
            for (oid, c) in self.journal.oldest_chunks(8) {
                progressed |= self.destage(oid, c)?;
            }
            if !progressed {
                // What is left is held by batches in flight (or by nothing destageable).
                return Ok(any);
            }
            any = true;
        }
    }

    /// Move a chunk's journaled pieces into the chunk: one full-chunk write (reading the
    /// chunk first only if the pieces do not cover it), one commit of the map, the size and
    /// the journal's new tail; then the pieces leave the index.
    fn destage(&self, oid: u64, c: u64) -> Result<bool> {
        let started = std::time::Instant::now();
        let r = self.destage_chunk(oid, c);
        self.counters.destage_us.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        r
    }

    fn destage_chunk(&self, oid: u64, c: u64) -> Result<bool> {
        let _chunk = self.locks.chunks(oid, vec![c]);
        if c == 0 {
            // Pieces of chunk 0 never lie beside a fragment (the journal's writers move
            // it first, under this lock), but should a dropped promise have let one be
            // made meanwhile, its bytes go into the chunk before the pieces land on it.
            self.promote(oid)?;
        }
        let pieces = self.journal.settled_pieces(oid, c);
        let Some(upto) = pieces.iter().map(|p| p.seq).max() else { return Ok(false) };
        let cb = self.chunk_bytes;
        let phys = self.mapping(oid, c, c)?.first().copied().flatten();
        let mut image = nacre_raid::align::AlignedBuf::zeroed(cb as usize);
        // Blocks whose bytes were lost stay lost, unless the pieces cover them whole.
        let mut lost = Vec::new();
        if let Some(p) = phys
            && !Journal::covers(&pieces, cb)
        {
            lost = self.read_blocks(p * cb, &mut image, true)?;
            lost.iter_mut().for_each(|o| *o -= p * cb);
            lost.retain(|&rel| !Journal::covers_range(&pieces, rel, rel + BLOCK_BYTES));
        }
        for p in &pieces {
            self.journal.read_piece(p, &mut image[p.chunk_off as usize..])?;
        }
        let pieces_end = c * cb + pieces.iter().map(|p| p.chunk_off + p.len).max().unwrap_or(0);
        let reservation = match phys {
            Some(_) => None,
            None => Some(self.reserve_promised(oid, c)?),
        };
        let target = match (&reservation, phys) {
            (Some(r), _) => r.chunks().first().copied().ok_or_else(|| OsdError::Corrupt("empty reservation".into()))?,
            (None, Some(p)) => p,
            (None, None) => return Err(OsdError::Corrupt("destage without a chunk".into())),
        };
        let mut sums = PendingSums::new(self);
        self.write_image(target * cb, &image, reservation.is_some(), &lost, &mut sums)?;
        self.flush_if_drives()?;
        let _tail = lock(&self.tail_commit);
        let (tail, tail_seq) = self.journal.tail_after(oid, c, upto);
        let txn = self.db.begin_write()?;
        self.commit_sums(&txn, &mut sums)?;
        {
            let mut o = txn.open_table(OBJECTS)?;
            let existing = o.get(oid)?.map(|v| ObjectAttr::decode(oid, v.value())).transpose()?;
            if let Some(mut a) = existing {
                a.size = a.size.max(pieces_end);
                if let Some(r) = &reservation {
                    a.space += cb;
                    let mut m = txn.open_table(MAP)?;
                    m.insert((oid, c), target)?;
                    take_free(&txn, &r.extents)?;
                }
                o.insert(oid, a.encode().as_slice())?;
            }
            // Destages run side by side; each computed its tail as if only its own pieces
            // left, so the committed tail only ever moves forward (a floor pruned behind
            // it must never be needed again).
            let mut m = txn.open_table(META)?;
            let committed = m.get("journal_tail_seq")?.map(|v| v.value()).unwrap_or(0);
            let tail_seq = tail_seq.max(committed);
            if tail_seq > committed {
                m.insert("journal_tail", tail)?;
                m.insert("journal_tail_seq", tail_seq)?;
            }
            let mut d = txn.open_table(DESTAGED)?;
            let mut by_seq = txn.open_table(DESTAGED_BY_SEQ)?;
            // The floor only rises.
            let old = d.get((oid, c))?.map(|v| v.value());
            if old.is_none_or(|o| upto > o) {
                d.insert((oid, c), upto)?;
                if let Some(old) = old {
                    by_seq.remove((old, oid, c))?;
                }
                by_seq.insert((upto, oid, c), ())?;
            }
            // Behind the tail nothing replays: forget those entries.
            let behind: Vec<(u64, u64, u64)> = by_seq
                .extract_from_if(..(tail_seq, 0, 0), |_, _| true)?
                .map(|e| e.map(|(k, _)| k.value()))
                .collect::<std::result::Result<_, _>>()?;
            for (seq, o, ch) in behind {
                if d.get((o, ch))?.map(|v| v.value()) == Some(seq) {
                    d.remove((o, ch))?;
                }
            }
        }
        txn.commit()?;
        drop(sums);
        drop(reservation);
        self.journal.remove(oid, c, upto);
        drop(_tail);
        self.lock_reserved().promised.remove(&(oid, c));
        self.counters.destaged.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Destage every journaled chunk of an object (before it is truncated, punched or
    /// destroyed, which work on chunks only).
    fn destage_object(&self, oid: u64) -> Result<()> {
        for c in self.journal.chunks_of(oid) {
            self.destage_fully(oid, c)?;
        }
        Ok(())
    }

    /// Destage a chunk until no piece of it is left, waiting for batches in flight.
    fn destage_fully(&self, oid: u64, c: u64) -> Result<()> {
        let mut waits = 0;
        while self.journal.has_pieces(oid, c) {
            if !self.destage(oid, c)? {
                waits += 1;
                if waits > JOURNAL_FULL_WAITS {
                    return Err(OsdError::Index(format!("pieces of object {oid:#x} chunk {c} never settled")));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(())
    }

    /// Move every journaled piece to its chunk (for a clean shutdown or a check).
    pub fn destage_all(&self) -> Result<()> {
        for (oid, c) in self.journal.all_chunks() {
            self.destage_fully(oid, c)?;
        }
        Ok(())
    }

    /// A large piece straight to its chunks.
    fn write_direct(&self, oid: u64, offset: u64, data: &[u8]) -> Result<()> {
        let cb = self.chunk_bytes;
        let end = offset + data.len() as u64;
        let (first, last) = (offset / cb, (end - 1) / cb);
        // Every chunk written is locked, so no destage builds its image from a chunk while
        // this writes into it; journaled pieces of these chunks are destaged first (they
        // are older and must not lie over this data). A piece journaled after the check
        // is newer and rightly lies over it.
        let _chunk_locks = loop {
            for c in first..=last {
                self.destage_fully(oid, c)?;
            }
            let locks = self.locks.chunks(oid, (first..=last).collect());
            if (first..=last).all(|c| !self.journal.has_pieces(oid, c)) {
                break locks;
            }
        };
        if first == 0 {
            self.promote(oid)?;
        }
        let attr = self.committed_attr(oid)?;
        let mut map = self.mapping(oid, first, last)?;
        let holes: Vec<u64> = (first..=last).filter(|c| map[(c - first) as usize].is_none()).collect();
        let reservation = self.reserve(holes.len() as u64)?;
        // In-place bytes past the committed size: make them part of the object first.
        let in_place_end = (first..=last)
            .filter(|&c| map[(c - first) as usize].is_some())
            .map(|c| end.min((c + 1) * cb))
            .max()
            .unwrap_or(0);
        if in_place_end > attr.size {
            self.grow(oid, in_place_end)?;
        }
        let mut new_phys = reservation.chunks().into_iter();
        let mut fresh: Vec<(u64, u64)> = Vec::with_capacity(holes.len());
        for &c in &holes {
            if let Some(p) = new_phys.next() {
                map[(c - first) as usize] = Some(p);
                fresh.push((c, p));
            }
        }
        let mut sums = PendingSums::new(self);
        self.write_chunks(offset, data, first, &map, &fresh, &mut sums)?;
        self.flush_if_drives()?;
        // Commit: map the new chunks, take them from the free table, grow the size, and
        // the checksums of what was written.
        let txn = self.db.begin_write()?;
        self.commit_sums(&txn, &mut sums)?;
        {
            let mut o = txn.open_table(OBJECTS)?;
            let mut a = {
                let v = o.get(oid)?.ok_or(OsdError::NoSuchObject(oid))?;
                ObjectAttr::decode(oid, v.value())?
            };
            a.size = a.size.max(end);
            a.space += fresh.len() as u64 * cb;
            a.mtime_ns = now_ns();
            a.ctime_ns = a.mtime_ns;
            o.insert(oid, a.encode().as_slice())?;
            if !fresh.is_empty() {
                let mut m = txn.open_table(MAP)?;
                for &(c, p) in &fresh {
                    m.insert((oid, c), p)?;
                }
                take_free(&txn, &reservation.extents)?;
            }
        }
        txn.commit()?;
        drop(sums);
        drop(reservation);
        {
            // Pieces journaled into these chunks while they were unmapped (a neighbouring
            // write's head, sent alongside) hold a promise; now mapped, their destage needs
            // no chunk, and free space should not count one for them.
            let mut r = self.lock_reserved();
            for &(c, _) in &fresh {
                r.promised.remove(&(oid, c));
            }
        }
        self.counters.chunks_allocated.fetch_add(fresh.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The volume writes of one object write: runs of chunks that are physically
    /// contiguous and either all new (written whole, zero-filled around the data) or all
    /// mapped (written in place) go as one volume write each.
    fn write_chunks<'a>(
        &'a self,
        offset: u64,
        data: &[u8],
        first: u64,
        map: &[Option<u64>],
        fresh: &[(u64, u64)],
        sums: &mut PendingSums<'a>,
    ) -> Result<()> {
        let cb = self.chunk_bytes;
        let end = offset + data.len() as u64;
        let is_new = |c: u64| fresh.binary_search_by_key(&c, |&(ci, _)| ci).is_ok();
        let mut c = first;
        let last = (end - 1) / cb;
        while c <= last {
            let phys =
                map[(c - first) as usize].ok_or_else(|| OsdError::Corrupt("unmapped chunk after allocation".into()))?;
            let new = is_new(c);
            // A run: chunks physically contiguous and of one kind. New chunks join a run only
            // when the data covers them whole (then the run is one slice of the caller's
            // data); a partly covered new chunk is written alone, zero-filled.
            let covered = |c: u64| c * cb >= offset && (c + 1) * cb <= end;
            let mut n = 1;
            if !new || covered(c) {
                while c + n <= last
                    && map[(c + n - first) as usize] == Some(phys + n)
                    && is_new(c + n) == new
                    && (!new || covered(c + n))
                {
                    n += 1;
                }
            }
            let run_start = c * cb;
            let run_end = (c + n) * cb;
            let (lo, hi) = (offset.max(run_start), end.min(run_end));
            let piece = &data[(lo - offset) as usize..(hi - offset) as usize];
            if new && (lo != run_start || hi != run_end) {
                // A new chunk not covered whole: zero-fill around the piece.
                let mut image = nacre_raid::align::AlignedBuf::zeroed((run_end - run_start) as usize);
                image[(lo - run_start) as usize..(hi - run_start) as usize].copy_from_slice(piece);
                self.write_image(phys * cb, &image, true, &[], sums)?;
            } else if new {
                self.write_image(phys * cb, piece, true, &[], sums)?;
            } else {
                self.write_data(phys * cb + (lo - run_start), piece, sums)?;
                self.counters.in_place_writes.fetch_add(1, Ordering::Relaxed);
            }
            c += n;
        }
        Ok(())
    }

    /// Flush the data volume when writes must reach the drives before their commit.
    fn flush_if_drives(&self) -> Result<()> {
        if self.opts.sync == SyncMode::Drives {
            self.data.flush()?;
        }
        Ok(())
    }

    /// Chunk 0's bytes from `offset` into `out` when the object's chunk 0 was unmapped: its
    /// fragment's (under the chunk-0 lock, so its blocks are not given back meanwhile), or
    /// the chunk it was just promoted to, or zeros.
    fn read_chunk0_of_small(&self, oid: u64, offset: u64, out: &mut [u8]) -> Result<()> {
        // No look before the lock: a promotion that ended since the caller's mapping
        // would leave it zeros where the chunk now holds the bytes.
        let _c0 = self.locks.chunks(oid, vec![0]);
        if let Some(p) = self.mapping(oid, 0, 0)?[0] {
            self.read_data(p * self.chunk_bytes + offset, out)?;
        } else if let Some(f) = self.fragment(oid)? {
            self.read_fragment(f, offset, out)?;
        }
        Ok(())
    }

    /// Commit `size = max(size, to)` on its own.
    fn grow(&self, oid: u64, to: u64) -> Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut o = txn.open_table(OBJECTS)?;
            let mut a = {
                let v = o.get(oid)?.ok_or(OsdError::NoSuchObject(oid))?;
                ObjectAttr::decode(oid, v.value())?
            };
            if a.size >= to {
                return Ok(());
            }
            a.size = to;
            o.insert(oid, a.encode().as_slice())?;
        }
        txn.commit()?;
        Ok(())
    }

    /// Read up to `buf.len()` bytes at `offset`; returns how many (short at the end of the
    /// object). Holes read as zeros.
    pub fn read(&self, oid: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let _g = self.locks.shared(oid);
        loop {
            match self.read_once(oid, offset, buf) {
                Ok(Some(n)) => return Ok(n),
                Ok(None) => {}
                Err(OsdError::Checksum(m)) => {
                    return Err(OsdError::Checksum(format!(
                        "object {oid:#x}, read of {} bytes at {offset}: {m}",
                        buf.len()
                    )));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt at a read; `None` if a piece it laid over was destaged meanwhile and
    /// its journal blocks may have been reused (the chunk now has its bytes: read again).
    fn read_once(&self, oid: u64, offset: u64, buf: &mut [u8]) -> Result<Option<usize>> {
        let attr = self.getattr(oid)?;
        if offset >= attr.size || buf.is_empty() {
            return Ok(Some(0));
        }
        let n = (buf.len() as u64).min(attr.size - offset) as usize;
        let cb = self.chunk_bytes;
        let end = offset + n as u64;
        let (first, last) = (offset / cb, (end - 1) / cb);
        // Journaled pieces first, then the chunks: a destage between the two has written
        // the chunk before it drops the pieces, so laying them over is right either way.
        let pieces: Vec<(u64, Vec<crate::journal::Piece>)> = if self.journal.pending_size(oid).is_some() {
            (first..=last).map(|c| (c, self.journal.pieces(oid, c))).filter(|(_, p)| !p.is_empty()).collect()
        } else {
            Vec::new()
        };
        let map = self.mapping(oid, first, last)?;
        let mut c = first;
        while c <= last {
            let here = map[(c - first) as usize];
            let mut k = 1;
            while c + k <= last {
                let next = map[(c + k - first) as usize];
                let contiguous = match (here, next) {
                    (Some(p), Some(q)) => q == p + k,
                    (None, None) => true,
                    _ => false,
                };
                if !contiguous {
                    break;
                }
                k += 1;
            }
            let (lo, hi) = (offset.max(c * cb), end.min((c + k) * cb));
            let out = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
            match here {
                Some(p) => self.read_data(p * cb + (lo - c * cb), out)?,
                None => out.fill(0),
            }
            c += k;
        }
        if first == 0 && map[0].is_none() {
            self.read_chunk0_of_small(oid, offset, &mut buf[..(end.min(cb) - offset) as usize])?;
        }
        let mut oldest = u64::MAX;
        for (c, ps) in pieces {
            for p in ps {
                let (lo, hi) = ((c * cb + p.chunk_off).max(offset), (c * cb + p.chunk_off + p.len).min(end));
                if lo < hi {
                    let skip = lo - (c * cb + p.chunk_off);
                    self.journal.read_part(&p, skip, &mut buf[(lo - offset) as usize..(hi - offset) as usize])?;
                    oldest = oldest.min(p.seq);
                }
            }
        }
        if oldest < self.journal.tail_seq() {
            return Ok(None);
        }
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(Some(n))
    }

    /// Set the size of `oid`: chunks wholly past a smaller size are freed; bytes a larger
    /// size exposes read as zero.
    pub fn truncate(&self, oid: u64, size: u64) -> Result<ObjectAttr> {
        self.check_range(size, 0)?;
        let _g = self.locks.exclusive(oid);
        self.destage_object(oid)?;
        let attr = self.getattr(oid)?;
        let cb = self.chunk_bytes;
        let mut sums = PendingSums::new(self);
        // Shrinking: the kept part of the last chunk's tail goes back to zero first.
        if size < attr.size && !size.is_multiple_of(cb) {
            let c = size / cb;
            if let Some(Some(p)) = self.mapping(oid, c, c)?.first().copied() {
                let stop = attr.size.min((c + 1) * cb);
                self.write_data(p * cb + (size - c * cb), &vec![0u8; (stop - size) as usize], &mut sums)?;
                self.flush_if_drives()?;
            }
        }
        if size < attr.size
            && let Some(f) = self.fragment(oid)?
        {
            self.zero_fragment(f, size, attr.size, &mut sums)?;
        }
        let keep = size.div_ceil(cb);
        self.commit_unmap(oid, keep, u64::MAX, size, sums, |a| {
            a.size = size;
        })
    }

    /// Free the space of `[start, end)` of `oid` (it reads as zeros); the size is kept.
    pub fn punch(&self, oid: u64, start: u64, end: u64) -> Result<ObjectAttr> {
        if end < start {
            return Err(OsdError::Invalid(format!("punch from {start} to {end}")));
        }
        self.check_range(start, end - start)?;
        let _g = self.locks.exclusive(oid);
        self.destage_object(oid)?;
        let attr = self.getattr(oid)?;
        let end = end.min(attr.size.max(start));
        if end == start {
            return Ok(attr);
        }
        let cb = self.chunk_bytes;
        let mut sums = PendingSums::new(self);
        let (full_lo, full_hi) = (start.div_ceil(cb), end / cb);
        // Partial chunks at the edges: zeros in place.
        let edges = if full_lo > full_hi {
            vec![(start, end)]
        } else {
            vec![(start, (full_lo * cb).min(end)), ((full_hi * cb).max(start), end)]
        };
        for (lo, hi) in edges {
            if hi <= lo {
                continue;
            }
            let c = lo / cb;
            if let Some(Some(p)) = self.mapping(oid, c, c)?.first().copied() {
                self.write_data(p * cb + (lo - c * cb), &vec![0u8; (hi - lo) as usize], &mut sums)?;
                self.flush_if_drives()?;
            } else if c == 0
                && let Some(f) = self.fragment(oid)?
            {
                self.zero_fragment(f, lo, hi, &mut sums)?;
            }
        }
        // A punch of all a fragment holds (or of all of chunk 0) gives the fragment back.
        let whole_fragment = start == 0 && self.fragment(oid)?.is_some_and(|f| end >= f.bytes().min(attr.size));
        if full_lo < full_hi || whole_fragment {
            let frag_keep = if whole_fragment || full_lo == 0 { 0 } else { u64::MAX };
            let (from, to) = if full_lo < full_hi { (full_lo, full_hi) } else { (0, 0) };
            return self.commit_unmap(oid, from, to, frag_keep, sums, |_| {});
        }
        self.commit_pending(sums)?;
        Ok(attr)
    }

    /// Remove `oid` and give back its space, in one transaction: a crash leaves the
    /// object whole or gone, never emptied.
    pub fn destroy(&self, oid: u64) -> Result<()> {
        match self.destroy_many(&[oid])?[..] {
            [true] => Ok(()),
            _ => Err(OsdError::NoSuchObject(oid)),
        }
    }

    /// Remove every object of `oids` (distinct) that exists, in one transaction, and say
    /// for each whether it existed. The MDS destroys removed files' objects in batches:
    /// one commit for all of them, where a destroy each cost a commit each (most of an
    /// unlink's cost on the OSS). A crash leaves each object whole or gone.
    pub fn destroy_many(&self, oids: &[u64]) -> Result<Vec<bool>> {
        // Taken in order: no two batches, nor a batch and a one-object lock, wait on each
        // other in a cycle.
        let mut order = oids.to_vec();
        order.sort_unstable();
        let _g: Vec<_> = order.iter().map(|&o| self.locks.exclusive(o)).collect();
        let mut existed = Vec::with_capacity(oids.len());
        for &oid in oids {
            existed.push(match self.getattr(oid) {
                Ok(_) => true,
                Err(OsdError::NoSuchObject(_)) => false,
                Err(e) => return Err(e),
            });
        }
        let gone: Vec<u64> = oids.iter().zip(&existed).filter(|x| *x.1).map(|x| *x.0).collect();
        for &oid in &gone {
            self.destage_object(oid)?;
        }
        if gone.is_empty() {
            return Ok(existed);
        }
        let small = self.lock_small();
        let txn = self.db.begin_write()?;
        let mut freed = Vec::new();
        for &oid in &gone {
            freed.extend(self.unmap_within(&txn, &small, oid, 0, u64::MAX, 0, Unmap::Destroy)?.1);
        }
        give_free(&txn, freed)?;
        txn.commit()?;
        Ok(existed)
    }

    /// One transaction: unmap chunk indexes `[from, to)` of `oid`, give them to the free
    /// table, keep the first `frag_keep` bytes of its fragment (if it has one), and update
    /// the attributes with `change`. It also stores `sums`, the checksums of the zeros a
    /// truncate or punch wrote in place before it.
    fn commit_unmap(
        &self,
        oid: u64,
        from: u64,
        to: u64,
        frag_keep: u64,
        mut sums: PendingSums<'_>,
        change: impl FnOnce(&mut ObjectAttr),
    ) -> Result<ObjectAttr> {
        // Slabs change only under the small lock, taken before the transaction as
        // everywhere.
        let small = self.lock_small();
        let txn = self.db.begin_write()?;
        // Before the unmap, which forgets the checksums of the chunks it frees.
        self.commit_sums(&txn, &mut sums)?;
        let what = Unmap::Keep(Box::new(change));
        let (attr, freed) = self.unmap_within(&txn, &small, oid, from, to, frag_keep, what)?;
        give_free(&txn, freed)?;
        txn.commit()?;
        drop(small);
        drop(sums);
        Ok(attr)
    }

    /// In `txn`: unmap chunk indexes `[from, to)` of `oid`, keep the first `frag_keep`
    /// bytes of its fragment, and change or remove its attributes as `what` says; its
    /// attributes after, and the chunks to give to the free table.
    #[allow(clippy::too_many_arguments)]
    fn unmap_within(
        &self,
        txn: &redb::WriteTransaction,
        small: &small::SmallState,
        oid: u64,
        from: u64,
        to: u64,
        frag_keep: u64,
        what: Unmap<'_>,
    ) -> Result<(ObjectAttr, Vec<u64>)> {
        let mut map = txn.open_table(MAP)?;
        let mut freed = Vec::new();
        {
            let gone = map.extract_from_if((oid, from)..(oid, to), |_, _| true)?;
            for e in gone {
                let (_, v) = e?;
                freed.push(v.value());
            }
        }
        let mut o = txn.open_table(OBJECTS)?;
        let mut a = {
            let v = o.get(oid)?.ok_or(OsdError::NoSuchObject(oid))?;
            ObjectAttr::decode(oid, v.value())?
        };
        a.space = a.space.saturating_sub(freed.len() as u64 * self.chunk_bytes);
        a.space = a.space.saturating_sub(self.cut_fragment_in(txn, small, oid, frag_keep)?);
        match what {
            Unmap::Keep(change) => {
                change(&mut a);
                a.mtime_ns = now_ns();
                a.ctime_ns = a.mtime_ns;
                o.insert(oid, a.encode().as_slice())?;
            }
            Unmap::Destroy => {
                o.remove(oid)?;
                let mut m = txn.open_table(META)?;
                let n = m.get("objects")?.map(|v| v.value()).unwrap_or(1);
                m.insert("objects", n.saturating_sub(1))?;
            }
        }
        Ok((a, freed))
    }

    /// Take `n` free chunks for a running write: contiguous when possible, next-fit from
    /// where the last reservation ended (streaming writes land one after another).
    fn reserve(&self, n: u64) -> Result<Reservation<'_>> {
        self.reserve_inner(n, 0)
    }

    /// The chunk promised to `(oid, c)`'s journaled pieces.
    fn reserve_promised(&self, oid: u64, c: u64) -> Result<Reservation<'_>> {
        let kept = self.lock_reserved().promised.contains(&(oid, c)) as u64;
        self.reserve_inner(1, kept)
    }

    /// Take `n` chunks; `own_promises` of the promised chunks are the caller's to use.
    fn reserve_inner(&self, n: u64, own_promises: u64) -> Result<Reservation<'_>> {
        let mut r = lock(&self.reserved);
        if n == 0 {
            return Ok(Reservation { target: self, extents: Vec::new() });
        }
        // Promised chunks are spoken for: only what is left beyond them may be taken.
        {
            let txn = self.db.begin_read()?;
            let free = self.free_chunks_in(&txn)?;
            let held: u64 = r.extents.values().sum::<u64>() + (r.promised.len() as u64).saturating_sub(own_promises);
            let available = free.saturating_sub(held);
            if n > available {
                return Err(OsdError::NoSpace { need: n * self.chunk_bytes, free: available * self.chunk_bytes });
            }
        }
        let txn = self.db.begin_read()?;
        let free = txn.open_table(FREE)?;
        let mut got: Vec<(u64, u64)> = Vec::new();
        let mut need = n;
        let cursor = r.cursor;
        // Two passes: from the cursor to the end, then from the start.
        for pass in 0..2 {
            let iter = if pass == 0 { free.range(cursor..)? } else { free.range(..cursor)? };
            for e in iter {
                let (s, l) = e?;
                let (mut s, end) = (s.value(), s.value() + l.value());
                if pass == 0 && s < cursor {
                    s = cursor;
                }
                // Skip what other running writes hold.
                while s < end && need > 0 {
                    if let Some((&rs, &rl)) = r.extents.range(..=s).next_back()
                        && rs + rl > s
                    {
                        s = rs + rl;
                        continue;
                    }
                    let next_reserved = r.extents.range(s..).next().map_or(end, |(&rs, _)| rs.min(end));
                    let take = (next_reserved - s).min(need);
                    if take == 0 {
                        break;
                    }
                    got.push((s, take));
                    need -= take;
                    s += take;
                }
                if need == 0 {
                    break;
                }
            }
            if need == 0 {
                break;
            }
        }
        if need > 0 {
            let held: u64 = r.extents.values().sum::<u64>() + r.promised.len() as u64;
            let free_chunks = self.free_chunks_in(&txn)?.saturating_sub(held);
            return Err(OsdError::NoSpace { need: n * self.chunk_bytes, free: free_chunks * self.chunk_bytes });
        }
        for &(s, l) in &got {
            r.extents.insert(s, l);
        }
        if let Some(&(s, l)) = got.last() {
            r.cursor = (s + l) % self.chunks.max(1);
        }
        Ok(Reservation { target: self, extents: got })
    }

    fn free_chunks_in(&self, txn: &redb::ReadTransaction) -> Result<u64> {
        let m = txn.open_table(META)?;
        Ok(m.get("free_chunks")?.map(|v| v.value()).unwrap_or(0))
    }

    /// Space and counts, exact: free space is what the free table holds, less what
    /// running writes have reserved.
    pub fn statfs(&self) -> Result<StatFs> {
        let txn = self.db.begin_read()?;
        let m = txn.open_table(META)?;
        let get = |k: &str| -> Result<u64> { Ok(m.get(k)?.map(|v| v.value()).unwrap_or(0)) };
        let held: u64 = {
            let r = self.lock_reserved();
            r.extents.values().sum::<u64>() + r.promised.len() as u64
        };
        Ok(StatFs {
            chunk_bytes: self.chunk_bytes,
            total_bytes: self.chunks * self.chunk_bytes,
            free_bytes: get("free_chunks")?.saturating_sub(held) * self.chunk_bytes
                + self.free_block_bytes(get("free_blocks")?),
            objects: get("objects")?,
            index_bytes: self.index_len.load(Ordering::Acquire),
            index_capacity: self.index_capacity,
        })
    }

    /// Set (or with `None` remove) values the service over this target keeps in its
    /// index, under keys it names (`wb.` for the write-back's), in one durable
    /// transaction.
    pub fn put_service_values(&self, values: &[(&str, Option<u64>)]) -> Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut m = txn.open_table(META)?;
            for (k, v) in values {
                match v {
                    Some(v) => m.insert(*k, *v)?,
                    None => m.remove(*k)?,
                };
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// The service values whose keys start with `prefix`.
    pub fn service_values(&self, prefix: &str) -> Result<Vec<(String, u64)>> {
        let txn = self.db.begin_read()?;
        let m = txn.open_table(META)?;
        let mut out = Vec::new();
        for e in m.range(prefix..)? {
            let (k, v) = e?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push((k.value().to_string(), v.value()));
        }
        Ok(out)
    }

    /// Make everything written so far durable on the drives, data before index: what an
    /// `fsync` waits for (Lustre's OST sync). The marks of regions written in place stay
    /// until those go quiet (see `sums`): clearing them here cost every fsync a third
    /// flush and an index commit, and the next write in place to a region another commit
    /// to mark it again.
    pub fn flush(&self) -> Result<()> {
        self.data.flush()?;
        self.meta.flush()?;
        Ok(())
    }

    /// [`Target::flush`], with every mark cleared first, so that a stop after it leaves
    /// no region to check again at the next open (a scrub's end, a clean stop).
    pub fn sync(&self) -> Result<()> {
        // Clearing marks flushes the data first (a mark may go only once its chunk's bytes
        // are on the drives).
        self.clear_all_marks()?;
        self.data.flush()?;
        self.meta.flush()?;
        Ok(())
    }

    pub fn stats(&self) -> TargetStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TargetStats {
            writes: g(&c.writes),
            write_bytes: g(&c.write_bytes),
            reads: g(&c.reads),
            read_bytes: g(&c.read_bytes),
            chunks_allocated: g(&c.chunks_allocated),
            in_place_writes: g(&c.in_place_writes),
            fragment_writes: g(&c.fragment_writes),
            fragments_promoted: g(&c.promoted),
            journaled: g(&c.journaled),
            destaged: g(&c.destaged),
            destage_us: g(&c.destage_us),
            append_us: g(&c.append_us),
            small_write_us: g(&c.small_write_us),
            journal_batches: self.journal.batches.load(Ordering::Relaxed),
            journal_records: self.journal.batched_records.load(Ordering::Relaxed),
            journal_used: self.journal.usage().0,
            journal_bytes: self.journal.usage().1,
            checksum_errors: g(&self.sums.errors),
            checksum_repairs: g(&self.sums.repaired),
            checksum_regions_recomputed: g(&self.sums.recomputed),
        }
    }

    /// Check the index against itself (an fsck): every mapped chunk inside the volume and
    /// used once, by an object that exists, below its size; free extents inside the volume
    /// and disjoint from mapped chunks; every chunk either mapped or free (no leak); the
    /// counters equal to what they count; each object's space equal to its chunks. And the
    /// data against its checksums: every block that has one is read (a scrub).
    pub fn check(&self) -> Result<CheckReport> {
        let mut rep = CheckReport::default();
        let mut problem = |p: String| {
            if rep.problems.len() < 100 {
                rep.problems.push(p);
            }
        };
        let txn = self.db.begin_read()?;
        let objects = txn.open_table(OBJECTS)?;
        let map = txn.open_table(MAP)?;
        let free = txn.open_table(FREE)?;
        let meta = txn.open_table(META)?;
        let mut used = vec![0u64; self.chunks.div_ceil(64) as usize];
        // Chunks that hold object bytes: mapped ones and slabs (`used` has the free ones too).
        let mut holding = used.clone();
        let mark = |p: u64, used: &mut Vec<u64>| -> bool {
            let (w, b) = ((p / 64) as usize, p % 64);
            let seen = used[w] & (1 << b) != 0;
            used[w] |= 1 << b;
            seen
        };
        let mut per_object: BTreeMap<u64, u64> = BTreeMap::new();
        let mut mapped = 0u64;
        for e in map.iter()? {
            let (k, v) = e?;
            let ((oid, c), p) = (k.value(), v.value());
            mapped += 1;
            if p >= self.chunks {
                problem(format!("object {oid:#x} chunk {c} maps to chunk {p}, past the volume's {}", self.chunks));
                continue;
            }
            mark(p, &mut holding);
            if mark(p, &mut used) {
                problem(format!("chunk {p} is mapped twice (again by object {oid:#x} chunk {c})"));
            }
            *per_object.entry(oid).or_default() += 1;
            match objects.get(oid)? {
                None => problem(format!("chunk {p} belongs to object {oid:#x}, which does not exist")),
                Some(a) => {
                    let a = ObjectAttr::decode(oid, a.value())?;
                    if c * self.chunk_bytes >= a.size {
                        problem(format!("object {oid:#x} of size {} maps chunk {c}, past its end", a.size));
                    }
                }
            }
        }
        let mut free_chunks = 0u64;
        for e in free.iter()? {
            let (s, l) = e?;
            let (s, l) = (s.value(), l.value());
            if l == 0 || s.checked_add(l).is_none_or(|end| end > self.chunks) {
                problem(format!("free extent {s}+{l} is outside the volume's {} chunks", self.chunks));
                continue;
            }
            free_chunks += l;
            for p in s..s + l {
                if mark(p, &mut used) {
                    problem(format!("chunk {p} is both free and mapped (or free twice)"));
                }
            }
        }
        let frag_bytes = self.check_fragments(
            &txn,
            |p| {
                mark(p, &mut holding);
                mark(p, &mut used)
            },
            &mut problem,
        )?;
        for oid in frag_bytes.keys() {
            if map.get((*oid, 0))?.is_some() {
                problem(format!("object {oid:#x} has a fragment and maps chunk 0"));
            }
        }
        rep.checked_blocks =
            self.check_sums(&txn, |p| holding[(p / 64) as usize] & (1 << (p % 64)) != 0, &mut problem)?;
        let leaked = self.chunks - used.iter().map(|w| w.count_ones() as u64).sum::<u64>();
        if leaked > 0 {
            problem(format!("{leaked} chunks are neither mapped nor free (leaked)"));
        }
        let mut count = 0u64;
        let mut max_oid: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for e in objects.iter()? {
            let (k, v) = e?;
            let oid = k.value();
            count += 1;
            let m = max_oid.entry(group_of(oid)).or_default();
            *m = (*m).max(oid);
            let a = ObjectAttr::decode(oid, v.value())?;
            let chunks = per_object.get(&oid).copied().unwrap_or(0);
            // Bytes past the size in the last chunk must be zero.
            if !a.size.is_multiple_of(self.chunk_bytes)
                && let Some(p) = map.get((oid, a.size / self.chunk_bytes))?.map(|v| v.value())
                && p < self.chunks
            {
                let from = a.size % self.chunk_bytes;
                let mut tail = vec![0u8; (self.chunk_bytes - from) as usize];
                self.data.read(p * self.chunk_bytes + from, &mut tail)?;
                if let Some(i) = tail.iter().position(|&b| b != 0) {
                    problem(format!(
                        "object {oid:#x}: byte {} past its size {} is not zero",
                        a.size + i as u64,
                        a.size
                    ));
                }
            }
            let frag = frag_bytes.get(&oid).copied().unwrap_or(0);
            if a.space != chunks * self.chunk_bytes + frag {
                problem(format!(
                    "object {oid:#x} says it holds {} bytes; it maps {chunks} chunks and {frag} bytes of fragment",
                    a.space
                ));
            }
        }
        let get = |k: &str| -> Result<u64> { Ok(meta.get(k)?.map(|v| v.value()).unwrap_or(0)) };
        if get("free_chunks")? != free_chunks {
            problem(format!("free chunk counter {} but the free table holds {free_chunks}", get("free_chunks")?));
        }
        if get("objects")? != count {
            problem(format!("object counter {} but {count} objects exist", get("objects")?));
        }
        for (&group, &max) in &max_oid {
            let next = get(&next_key(group))?;
            if next <= max {
                problem(format!("next object id {next:#x} of group {group} is not past its largest, {max:#x}"));
            }
        }
        rep.objects = count;
        rep.mapped_chunks = mapped;
        rep.free_chunks = free_chunks;
        Ok(rep)
    }

    /// Locks held now (bounded by running operations).
    pub fn locks_held(&self) -> usize {
        self.locks.held()
    }
}

/// What an unmap does with the object: keep it (with changed attributes) or remove it.
enum Unmap<'a> {
    Keep(Box<dyn FnOnce(&mut ObjectAttr) + 'a>),
    Destroy,
}

/// Chunks reserved by one write; given back to the pool of free chunks when dropped
/// (after the commit took them from the free table, or on failure).
struct Reservation<'a> {
    target: &'a Target,
    extents: Vec<(u64, u64)>,
}

impl Reservation<'_> {
    fn chunks(&self) -> Vec<u64> {
        self.extents.iter().flat_map(|&(s, l)| s..s + l).collect()
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut r = lock(&self.target.reserved);
        for (s, _) in &self.extents {
            r.extents.remove(s);
        }
    }
}

/// Remove reserved extents from the free table (each lies inside one free extent).
fn take_free(txn: &redb::WriteTransaction, extents: &[(u64, u64)]) -> Result<()> {
    let mut free = txn.open_table(FREE)?;
    let mut taken = 0;
    for &(s, l) in extents {
        let (fs, fl) = {
            let mut it = free.range(..=s)?;
            let (k, v) = it.next_back().ok_or_else(|| OsdError::Corrupt(format!("chunk {s} is not free")))??;
            (k.value(), v.value())
        };
        if fs + fl < s + l {
            return Err(OsdError::Corrupt(format!("chunks {s}+{l} are not all free")));
        }
        free.remove(fs)?;
        if s > fs {
            free.insert(fs, s - fs)?;
        }
        if fs + fl > s + l {
            free.insert(s + l, fs + fl - (s + l))?;
        }
        taken += l;
    }
    let mut m = txn.open_table(META)?;
    let n = m.get("free_chunks")?.map(|v| v.value()).unwrap_or(0);
    m.insert("free_chunks", n.saturating_sub(taken))?;
    Ok(())
}

/// Give chunks back to the free table, merging with neighbours.
fn give_free(txn: &redb::WriteTransaction, mut chunks: Vec<u64>) -> Result<()> {
    if chunks.is_empty() {
        return Ok(());
    }
    chunks.sort_unstable();
    Target::forget_sums(txn, &chunks)?;
    let mut free = txn.open_table(FREE)?;
    let n = chunks.len() as u64;
    let mut i = 0;
    while i < chunks.len() {
        let mut j = i + 1;
        while j < chunks.len() && chunks[j] == chunks[j - 1] + 1 {
            j += 1;
        }
        let (mut s, mut l) = (chunks[i], (j - i) as u64);
        let before = free.range(..s)?.next_back().transpose()?.map(|(k, v)| (k.value(), v.value()));
        if let Some((ps, pl)) = before
            && ps + pl == s
        {
            free.remove(ps)?;
            s = ps;
            l += pl;
        }
        let after = free.get(s + l)?.map(|v| v.value());
        if let Some(al) = after {
            free.remove(s + l)?;
            l += al;
        }
        free.insert(s, l)?;
        i = j;
    }
    let mut m = txn.open_table(META)?;
    let f = m.get("free_chunks")?.map(|v| v.value()).unwrap_or(0);
    m.insert("free_chunks", f + n)?;
    Ok(())
}
