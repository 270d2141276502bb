//! The MDT's write-ahead log: every change's redo record, numbered by its transaction
//! number (transno), written in groups to a ring on the metadata volume; and the
//! checkpoints that copy what it holds into the image and free its room.
//!
//! **Path of a change.** A change applied in memory is *staged* here with the next
//! transno (under the namespace's lock, so transno order is the order changes were
//! applied). The log writer thread takes everything staged at once and writes it as one
//! group: records back to back, padded to 4 KiB, one write and (under
//! [`SyncMode::Drives`]) one flush. Then every transno of the group is *committed*:
//! `last_committed` (the highest durable transno) moves, and whoever waits for it wakes.
//! A change reserves its log room before it runs ([`Wal::reserve`]), so a change applied
//! in memory always has room to be logged.
//!
//! **Checkpoints.** The checkpoint thread takes the committed records not yet in the
//! image, applies the last op of each key they write to redb in one transaction (a
//! directory's inode rewritten by every create in it is written once), and commits it
//! durably together with the log position replay must start from (generation, transno,
//! offset). Only then does the log's tail move past them and their room come free. DoM
//! blocks' bytes go to the DoM area beside the image, which keeps where they are (see
//! [`super::area`]). It runs every
//! `checkpoint_interval` ([`CHECKPOINT_INTERVAL`] by default), and sooner when the
//! records waiting fill a quarter of the log.
//!
//! **The ring.** Positions are logical byte offsets that only grow; the region holds
//! offset `p` at `p % room`. A group never wraps: one that would not fit before the end
//! starts the next lap instead. Each record is a 32-byte header (magic, generation,
//! transno, length, CRC-32C of header and payload) and its payload, 8-byte aligned. Replay
//! starts where the image says and follows the writer's rules: the next record comes
//! right after the last, or at the next 4 KiB boundary (a new group), or at the next lap;
//! it stops at the first place where none of the three holds the expected transno of the
//! current generation, intact. A torn group is cut there: its changes were never
//! acknowledged. Every start-up picks a new generation, so records a crash left beyond
//! the cut can never be read as the new ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nacre_osd::SyncMode;
use nacre_proto::mdt::errno;
use nacre_raid::Volume;
use redb::Database;

use super::area::{self, Area, Extent, Run};
use super::mem::{Mem, Op, Stored, decode_record};
use super::{MdError, NamespaceOptions, NamespaceStats, Result, image, lock, storage, write};

const MAGIC: u32 = u32::from_le_bytes(*b"NMLR");
const HEADER: usize = 32;
const BLOCK: u64 = 4096;
/// Staged records that make a group worth writing at once.
const GROUP_BYTES: u64 = 1 << 20;
/// Staged records wait at most this long for others to join them, by default.
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(5);
/// Checkpoints come at least this often while there are changes, by default.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);

/// The CRC-32C of a record: its header (with the CRC field zero) and its payload.
fn record_crc(header: &[u8; HEADER], payload: &[u8]) -> u32 {
    let mut h = *header;
    h[28..32].fill(0);
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    d.update(&h);
    d.update(payload);
    d.finalize() as u32
}

/// Bytes a record of `len` payload bytes takes in a group.
pub fn framed(len: usize) -> u64 {
    ((HEADER + len) as u64).next_multiple_of(8)
}

/// Where replay starts: the generation of the log, the first transno not in the image,
/// and its logical offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub generation: u64,
    pub transno: u64,
    pub at: u64,
}

impl Position {
    pub fn store(&self, txn: &redb::WriteTransaction) -> Result<()> {
        let mut m = txn.open_table(image::META)?;
        m.insert("log_generation", self.generation)?;
        m.insert("log_transno", self.transno)?;
        m.insert("log_at", self.at)?;
        Ok(())
    }

    pub fn load(db: &Database) -> Result<Position> {
        let get = |k: &str| -> Result<u64> {
            image::meta(db, k)?
                .ok_or_else(|| MdError::new(errno::EINVAL, format!("metadata image lacks {k} (not a Nacre MDT?)")))
        };
        Ok(Position { generation: get("log_generation")?, transno: get("log_transno")?, at: get("log_at")? })
    }
}

/// A generation unlike any before on this volume, most likely.
pub fn fresh_generation() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    (nanos ^ ((std::process::id() as u64) << 40)).rotate_left(13) | 1
}

/// Records as the log holds them: (transno, payload).
pub type Records = Vec<(u64, Vec<u8>)>;

/// The log's place on the volume.
#[derive(Clone)]
pub struct Region {
    pub vol: Arc<Volume>,
    pub base: u64,
    pub room: u64,
}

fn io(e: nacre_raid::RaidError) -> MdError {
    storage(format!("metadata log: {e}"))
}

impl Region {
    /// Read back the records from `from` on: (transno, payload) in order, and the
    /// logical offset after the last.
    pub fn replay(&self, from: Position) -> Result<(Records, u64)> {
        let room = self.room;
        let mut ring = vec![0u8; room as usize];
        const CHUNK: usize = 8 << 20;
        for (i, c) in ring.chunks_mut(CHUNK).enumerate() {
            self.vol.read(self.base + (i * CHUNK) as u64, c).map_err(io)?;
        }
        let (mut at, mut transno) = (from.at, from.transno);
        let mut out = Vec::new();
        let record_at = |p: u64, want: u64| -> Option<Vec<u8>> {
            let off = (p % room) as usize;
            let h = ring.get(off..off + HEADER)?;
            let w = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or([0; 8]));
            let len = u32::from_le_bytes([h[24], h[25], h[26], h[27]]) as usize;
            if u32::from_le_bytes([h[0], h[1], h[2], h[3]]) != MAGIC || w(8) != from.generation || w(16) != want {
                return None;
            }
            let body = ring.get(off + HEADER..off + HEADER + len)?;
            let hdr: &[u8; HEADER] = h.try_into().ok()?;
            let want_crc = u32::from_le_bytes([hdr[28], hdr[29], hdr[30], hdr[31]]);
            (record_crc(hdr, body) == want_crc).then(|| body.to_vec())
        };
        loop {
            // Right after the last record, at the next group, or at the next lap.
            let candidates = [at, at.next_multiple_of(BLOCK), (at / room + 1) * room];
            let found = candidates.iter().find_map(|&p| record_at(p, transno).map(|r| (p, r)));
            let Some((p, rec)) = found else { break };
            at = p + framed(rec.len());
            out.push((transno, rec));
            transno += 1;
        }
        Ok((out, at))
    }
}

/// Records one after the other in one buffer: (transno, payload length) in order, and
/// the payloads concatenated. Changes copy their records in rather than hand over a
/// buffer each: a record allocated on a runtime thread and freed on the checkpoint
/// thread made the allocator take (and the kernel zero) fresh pages over and over, 8–18%
/// of the CPU of a run of DoM creates.
#[derive(Default)]
struct Packed {
    list: Vec<(u64, u32)>,
    bytes: Vec<u8>,
}

impl Packed {
    fn push(&mut self, transno: u64, payload: &[u8]) {
        self.list.push((transno, payload.len() as u32));
        self.bytes.extend_from_slice(payload);
    }

    /// Each record: transno and payload.
    fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let mut at = 0;
        self.list.iter().map(move |&(t, len)| {
            let p = &self.bytes[at..at + len as usize];
            at += len as usize;
            (t, p)
        })
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn clear(&mut self) {
        self.list.clear();
        self.bytes.clear();
    }

    /// Take the first `n` records (and their bytes) out; the rest stay. Taking all of
    /// them hands over these buffers and keeps `spare`'s.
    fn take_first(&mut self, n: usize, spare: Packed) -> Packed {
        if n == self.list.len() {
            return std::mem::replace(self, spare);
        }
        let len: usize = self.list[..n].iter().map(|r| r.1 as usize).sum();
        let rest = Packed { list: self.list.split_off(n), bytes: self.bytes.split_off(len) };
        std::mem::replace(self, rest)
    }
}

/// Frame records into one group in `buf`, padded to whole blocks; the end of each record
/// in it.
fn frame(generation: u64, records: &Packed, buf: &mut Vec<u8>) -> Vec<u64> {
    let total: u64 = records.list.iter().map(|r| framed(r.1 as usize)).sum();
    buf.clear();
    buf.resize(total.next_multiple_of(BLOCK) as usize, 0);
    let mut ends = Vec::with_capacity(records.list.len());
    let mut at = 0usize;
    for (transno, payload) in records.iter() {
        let mut h = [0u8; HEADER];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[8..16].copy_from_slice(&generation.to_le_bytes());
        h[16..24].copy_from_slice(&transno.to_le_bytes());
        h[24..28].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let crc = record_crc(&h, payload);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        buf[at..at + HEADER].copy_from_slice(&h);
        buf[at + HEADER..at + HEADER + payload.len()].copy_from_slice(payload);
        at += framed(payload.len()) as usize;
        ends.push(at as u64);
    }
    ends
}

struct State {
    /// The next transno to give.
    next: u64,
    /// Records staged and not yet being written.
    staged: Packed,
    staged_bytes: u64,
    /// Log bytes reserved by changes under way.
    reserved: u64,
    /// Where the next group goes, and where the oldest record not in the image is.
    head: u64,
    tail: u64,
    /// Every transno below this is on the drives.
    committed: u64,
    /// Committed records not in the image yet, and the logical offset after the last.
    unimaged: Packed,
    unimaged_end: u64,
    unimaged_bytes: u64,
    /// Emptied buffers of records, to use again (see [`recycle`]): one for the staged
    /// records and the group being written, which trade places; one for the unimaged
    /// records and the checkpoint's batch, likewise.
    spare: [Option<Packed>; 2],
    /// Every transno below this is in the image, and (`settled`) its DoM bytes out of
    /// memory.
    imaged: u64,
    settled: u64,
    /// Someone waits for a checkpoint.
    checkpoint_asked: bool,
    /// The writer has a group in flight, and the log bytes it may take (twice its size:
    /// it may skip the end of a lap).
    writing: bool,
    inflight: u64,
    /// Someone waits for a commit: the writer writes what is staged without waiting for
    /// more.
    urgent: bool,
    broken: Option<String>,
    stop: bool,
}

struct Shared {
    region: Region,
    flush: bool,
    interval: Duration,
    /// Microseconds staged records may wait for company when nobody waits for them
    /// (`mdt.*.commit_interval_ms`, settable while running).
    commit_interval_us: AtomicU64,
    generation: u64,
    db: Arc<Database>,
    st: Mutex<State>,
    /// The writer waits for staged records.
    work: Condvar,
    /// Changes wait for their commit, for room, or for a checkpoint.
    done: Condvar,
    /// The checkpoint thread waits for work.
    ckpt: Condvar,
    /// `committed`, and whether the log broke, for async waiters.
    committed: tokio::sync::watch::Sender<(u64, bool)>,
    stats: Arc<NamespaceStats>,
    /// The namespace's tables: DoM bytes a checkpoint wrote leave memory.
    mem: Arc<std::sync::RwLock<Mem>>,
    /// Where checkpoints write DoM blocks' bytes.
    area: Arc<Mutex<Area>>,
}

/// The log of one MDT, with its writer and checkpoint threads.
pub struct Wal {
    shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Drop for Wal {
    /// Everything staged is written and checkpointed, then the threads stop.
    fn drop(&mut self) {
        self.close();
    }
}

/// Mark the log broken: nothing more is written or checkpointed, and everyone waiting
/// hears of it.
fn break_log(s: &Shared, st: &mut State, why: String) {
    if st.broken.is_none() {
        eprintln!("mdt: the metadata log failed: {why}");
        st.broken = Some(why);
    }
    s.committed.send_modify(|c| c.1 = true);
    s.done.notify_all();
}

fn broken_error(why: &str) -> MdError {
    MdError::new(errno::EIO, format!("the metadata log failed ({why}): restart the MDT"))
}

impl Wal {
    /// Start the log at `at` (nothing staged, everything before in the image) with the
    /// next transno `next`.
    pub fn start(
        region: Region,
        opts: &NamespaceOptions,
        db: Arc<Database>,
        pos: Position,
        stats: Arc<NamespaceStats>,
        mem: Arc<std::sync::RwLock<Mem>>,
        area: Arc<Mutex<Area>>,
    ) -> Wal {
        let st = State {
            next: pos.transno,
            staged: Packed::default(),
            staged_bytes: 0,
            reserved: 0,
            head: pos.at,
            tail: pos.at,
            committed: pos.transno,
            unimaged: Packed::default(),
            unimaged_end: pos.at,
            unimaged_bytes: 0,
            spare: [None, None],
            imaged: pos.transno,
            settled: pos.transno,
            checkpoint_asked: false,
            writing: false,
            inflight: 0,
            urgent: false,
            broken: None,
            stop: false,
        };
        let shared = Arc::new(Shared {
            region,
            flush: opts.sync == SyncMode::Drives,
            interval: opts.checkpoint_interval,
            commit_interval_us: AtomicU64::new(opts.commit_interval.as_micros() as u64),
            generation: pos.generation,
            db,
            st: Mutex::new(st),
            work: Condvar::new(),
            done: Condvar::new(),
            ckpt: Condvar::new(),
            committed: tokio::sync::watch::channel((pos.transno, false)).0,
            stats,
            mem,
            area,
        });
        let mut threads = Vec::new();
        for (name, body) in [("mdt-log", write_loop as fn(&Shared)), ("mdt-checkpoint", checkpoint_loop)] {
            let s = shared.clone();
            match std::thread::Builder::new().name(name.into()).spawn(move || body(&s)) {
                Ok(t) => threads.push(t),
                Err(e) => break_log(&shared, &mut lock(&shared.st), format!("its {name} thread did not start: {e}")),
            }
        }
        Wal { shared, threads: Mutex::new(threads) }
    }

    /// The metadata volume (the DoM area's bytes are read from it).
    pub fn volume(&self) -> &Arc<Volume> {
        &self.shared.region.vol
    }

    /// The ring's size.
    pub fn room(&self) -> u64 {
        self.shared.region.room
    }

    /// The most bytes one change may log: a quarter of the ring.
    pub fn change_max(&self) -> u64 {
        self.shared.region.room / 4
    }

    /// Reserve room for a change that logs at most `bytes`, waiting for a checkpoint to
    /// free it if need be (`wait` false: answer false instead of waiting).
    pub fn reserve(&self, bytes: u64, wait: bool) -> Result<bool> {
        if bytes > self.change_max() {
            return Err(MdError::new(
                errno::EFBIG,
                format!("a change of {bytes} bytes is larger than the metadata log takes ({})", self.change_max()),
            ));
        }
        let room = self.shared.region.room;
        let mut st = lock(&self.shared.st);
        loop {
            if let Some(why) = &st.broken {
                return Err(broken_error(why));
            }
            // A group may waste up to its own size at the end of a lap: count it twice.
            let pending = 2 * (st.staged_bytes + st.reserved + bytes).next_multiple_of(BLOCK);
            if st.head - st.tail + st.inflight + pending <= room {
                st.reserved += bytes;
                return Ok(true);
            }
            if !wait {
                return Ok(false);
            }
            // A checkpoint frees room if the log holds records; else the room is other
            // changes' reservations, freed as they are staged and written.
            if !st.unimaged.is_empty() || st.writing || !st.staged.is_empty() {
                st.checkpoint_asked = true;
                self.shared.ckpt.notify_one();
            }
            st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Give back a reservation that logged nothing.
    pub fn unreserve(&self, bytes: u64) {
        let mut st = lock(&self.shared.st);
        st.reserved = st.reserved.saturating_sub(bytes);
    }

    /// Stage a change's record in place of its reservation; returns its transno. Call it
    /// under the namespace's lock, so transnos follow the order changes were applied. It
    /// never waits: a record larger than its reservation (a removal of many xattrs, say)
    /// is staged anyway, and the writer waits for a checkpoint to make the room before it
    /// writes (it holds no namespace lock, so nothing waits on it in turn). An error
    /// (a record past [`Wal::change_max`], a broken log) stages nothing: undo the change.
    pub fn stage(&self, record: &[u8], reserved: u64) -> Result<u64> {
        let need = framed(record.len());
        if need > self.change_max() {
            return Err(MdError::new(
                errno::EFBIG,
                format!("a change of {need} bytes is larger than the metadata log takes ({})", self.change_max()),
            ));
        }
        let mut st = lock(&self.shared.st);
        if let Some(why) = &st.broken {
            return Err(broken_error(why));
        }
        st.reserved = st.reserved.saturating_sub(reserved);
        let transno = st.next;
        st.next += 1;
        st.staged_bytes += framed(record.len());
        st.staged.push(transno, record);
        // The writer wakes for the first record, and again when a group's worth waits
        // or someone waits for a commit; records in between join the group.
        if st.staged.list.len() == 1 || st.urgent || st.staged_bytes >= GROUP_BYTES {
            self.shared.work.notify_one();
        }
        Ok(transno)
    }

    /// The transno the next change staged gets (stable under the namespace's lock).
    pub fn next_transno(&self) -> u64 {
        lock(&self.shared.st).next
    }

    /// The last transno given (0 for none).
    pub fn last_transno(&self) -> u64 {
        lock(&self.shared.st).next - 1
    }

    /// How long records nobody waits for may wait for their write.
    pub fn commit_interval(&self) -> Duration {
        Duration::from_micros(self.shared.commit_interval_us.load(Ordering::Relaxed))
    }

    pub fn set_commit_interval(&self, d: Duration) {
        self.shared.commit_interval_us.store(d.as_micros() as u64, Ordering::Relaxed);
        // A writer waiting out the old interval looks again.
        self.shared.work.notify_all();
    }

    /// The highest transno on the drives (Lustre's `last_committed`).
    pub fn last_committed(&self) -> u64 {
        self.shared.committed.borrow().0 - 1
    }

    /// Wait until transno `t` is on the drives.
    pub fn wait_committed(&self, t: u64) -> Result<()> {
        let mut st = lock(&self.shared.st);
        loop {
            if st.committed > t {
                return Ok(());
            }
            if let Some(why) = &st.broken {
                return Err(broken_error(why));
            }
            self.hurry(&mut st);
            st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Someone waits for a commit: the writer should not wait for more records.
    fn hurry(&self, st: &mut State) {
        if !st.urgent {
            st.urgent = true;
            self.shared.work.notify_one();
        }
    }

    /// As [`Wal::wait_committed`], from async code.
    pub async fn committed(&self, t: u64) -> Result<()> {
        let mut rx = self.shared.committed.subscribe();
        {
            let mut st = lock(&self.shared.st);
            if st.committed > t {
                return Ok(());
            }
            self.hurry(&mut st);
        }
        let committed = rx.wait_for(|&(c, broken)| c > t || broken).await.map(|v| v.0 > t);
        match committed {
            Ok(true) => Ok(()),
            _ => self.wait_committed(t),
        }
    }

    /// Wait until every change staged so far is in the image (the log holds none of it
    /// any more, and its DoM bytes are out of memory).
    pub fn checkpoint(&self) -> Result<()> {
        let mut st = lock(&self.shared.st);
        let want = st.next;
        loop {
            if st.settled >= want {
                return Ok(());
            }
            if let Some(why) = &st.broken {
                return Err(broken_error(why));
            }
            st.checkpoint_asked = true;
            self.shared.ckpt.notify_one();
            st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Log bytes in use (written and not in the image, and staged), and the ring's size.
    pub fn usage(&self) -> (u64, u64) {
        let st = lock(&self.shared.st);
        (st.head - st.tail + st.staged_bytes, self.shared.region.room)
    }

    /// Write and checkpoint everything staged, then end the threads; from then on every
    /// change fails (the log is closed). Again: nothing more happens.
    pub fn close(&self) {
        {
            let mut st = lock(&self.shared.st);
            st.stop = true;
        }
        self.shared.work.notify_all();
        self.shared.ckpt.notify_all();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
        let mut st = lock(&self.shared.st);
        if st.broken.is_none() {
            st.broken = Some("the metadata target was closed".into());
        }
        drop(st);
        self.shared.committed.send_modify(|c| c.1 = true);
        self.shared.done.notify_all();
    }

    /// Stop as a crash would: nothing staged is written, no checkpoint is made, the
    /// threads end (a group being written may land, as in a crash).
    pub fn halt(&self) {
        {
            let mut st = lock(&self.shared.st);
            st.broken = Some("halted".into());
            st.stop = true;
        }
        self.shared.work.notify_all();
        self.shared.ckpt.notify_all();
        self.shared.done.notify_all();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
        // The image is never closed, however the rest is dropped.
        std::mem::forget(self.shared.clone());
    }

    pub fn broken(&self) -> bool {
        lock(&self.shared.st).broken.is_some()
    }
}

/// The log writer: one group per turn, everything staged meanwhile.
fn write_loop(s: &Shared) {
    let mut buf = Vec::new();
    loop {
        let (records, head) = {
            let mut st = lock(&s.st);
            while st.staged.is_empty() && !st.stop {
                st = s.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.staged.is_empty() {
                return;
            }
            // Nobody waits for these yet: let more join them, for a commit interval at
            // most (replies went out already; their clients keep them until committed).
            let since = Instant::now();
            while !st.urgent && !st.stop && st.staged_bytes < GROUP_BYTES && st.broken.is_none() {
                let interval = Duration::from_micros(s.commit_interval_us.load(Ordering::Relaxed));
                let left = interval.saturating_sub(since.elapsed());
                if left.is_zero() {
                    break;
                }
                st = s.work.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
            }
            st.urgent = false;
            if st.broken.is_some() {
                // Nothing more is written; everyone waiting has been told.
                st.staged.clear();
                st.staged_bytes = 0;
                continue;
            }
            // A group of a quarter of the ring at most (one record at least), so that it
            // always fits once the records before it are checkpointed.
            let room = s.region.room;
            let (mut n, mut bytes) = (0, 0);
            let list = &st.staged.list;
            while n < list.len() && (n == 0 || bytes + framed(list[n].1 as usize) <= room / 4) {
                bytes += framed(list[n].1 as usize);
                n += 1;
            }
            let spare = st.spare[GROUP].take().unwrap_or_default();
            let records = st.staged.take_first(n, spare);
            st.staged_bytes -= bytes;
            st.writing = true;
            st.inflight = 2 * bytes.next_multiple_of(BLOCK);
            (records, st.head)
        };
        let ends = frame(s.generation, &records, &mut buf);
        let room = s.region.room;
        let g = buf.len() as u64;
        let place = |head: u64| if head % room + g > room { (head / room + 1) * room } else { head };
        // Never over records not yet in the image: wait for a checkpoint to free them.
        let at = {
            let mut st = lock(&s.st);
            loop {
                let at = place(head);
                if st.broken.is_some() {
                    // Nothing more is written; everyone waiting has been told.
                    (st.writing, st.inflight) = (false, 0);
                    s.done.notify_all();
                    break None;
                }
                if at + g <= st.tail + room {
                    break Some(at);
                }
                st.checkpoint_asked = true;
                s.ckpt.notify_one();
                st = s.done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Some(at) = at else { continue };
        let written = s
            .region
            .vol
            .write(s.region.base + at % room, &buf)
            .and_then(|()| if s.flush { s.region.vol.flush() } else { Ok(()) });
        let mut st = lock(&s.st);
        st.writing = false;
        st.inflight = 0;
        match written {
            Ok(()) => {
                st.head = at + g;
                let last = records.list.last().map_or(st.committed, |r| r.0 + 1);
                st.committed = last;
                for (transno, payload) in records.iter() {
                    st.unimaged_bytes += framed(payload.len());
                    st.unimaged.push(transno, payload);
                }
                st.unimaged_end = at + ends.last().copied().unwrap_or(0);
                if st.unimaged_bytes > room / 4 || st.checkpoint_asked {
                    s.ckpt.notify_one();
                }
                s.stats.commits.fetch_add(1, Ordering::Relaxed);
                s.committed.send_replace((last, false));
            }
            Err(e) => break_log(s, &mut st, format!("a write failed: {e}")),
        }
        drop(st);
        recycle(s, records, GROUP);
        s.done.notify_all();
    }
}

/// The spare buffer of the staged records and the group being written.
const GROUP: usize = 0;
/// The spare buffer of the unimaged records and the checkpoint's batch.
const BATCH: usize = 1;

/// Keep `records`' buffers (emptied) to trade places again in `role` ([`GROUP`] or
/// [`BATCH`]): each role keeps its own, so a buffer grown to a role's size is not handed
/// to another role that then grows it again (a checkpoint's batch handed to the log
/// writer made the unimaged records grow by reallocation, 5% of a run of DoM creates).
/// Unless they grew past half the ring (a quarter waits for a checkpoint at most, but
/// for one group, and growing by doubling may have made room for twice that): memory
/// kept idle stays under the ring's size.
fn recycle(s: &Shared, mut records: Packed, role: usize) {
    if records.bytes.capacity() as u64 > s.region.room / 2 {
        return;
    }
    records.clear();
    lock(&s.st).spare[role].get_or_insert(records);
}

/// The checkpoint thread: committed records into the image, then the tail moves.
fn checkpoint_loop(s: &Shared) {
    let mut since = Instant::now();
    loop {
        let (batch, end) = {
            let mut st = lock(&s.st);
            loop {
                let due = st.checkpoint_asked
                    || st.unimaged_bytes > s.region.room / 4
                    || since.elapsed() >= s.interval
                    || st.stop;
                let idle = st.unimaged.is_empty() && st.staged.is_empty() && !st.writing;
                if st.broken.is_some() || (st.stop && idle) {
                    s.done.notify_all();
                    return;
                }
                if due && !st.unimaged.is_empty() {
                    break;
                }
                if due && st.checkpoint_asked && idle {
                    // Asked with nothing to do: everything is in the image already.
                    st.checkpoint_asked = false;
                    s.done.notify_all();
                }
                // Stopping: the writer's last groups come soon, and nobody else wakes us.
                let wait = if st.stop {
                    Duration::from_millis(1)
                } else {
                    s.interval.saturating_sub(since.elapsed()).max(Duration::from_millis(1))
                };
                st = s.ckpt.wait_timeout(st, wait).unwrap_or_else(|e| e.into_inner()).0;
                if since.elapsed() >= s.interval && st.unimaged.is_empty() {
                    since = Instant::now();
                }
            }
            st.checkpoint_asked = false;
            st.unimaged_bytes = 0;
            let spare = st.spare[BATCH].take().unwrap_or_default();
            (std::mem::replace(&mut st.unimaged, spare), st.unimaged_end)
        };
        let Some(&(last, _)) = batch.list.last() else { continue };
        let r = write_image(s, &batch, Position { generation: s.generation, transno: last + 1, at: end });
        recycle(s, batch, BATCH);
        let imaged_dom = {
            let mut st = lock(&s.st);
            let r = match r {
                Ok(dom) => {
                    st.tail = end;
                    st.imaged = last + 1;
                    s.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                    dom
                }
                Err(e) => {
                    break_log(s, &mut st, format!("a checkpoint failed: {e}"));
                    continue;
                }
            };
            since = Instant::now();
            s.done.notify_all();
            r
        };
        // DoM bytes now written out leave memory, unless written again meanwhile. Only
        // after the log's room came free: a change that holds the namespace's lock may be
        // waiting for that room.
        if !imaged_dom.is_empty() {
            let mut m = write(&s.mem);
            for (k, b, stored) in imaged_dom {
                m.imaged(k, b, last + 1, stored);
            }
        }
        lock(&s.st).settled = last + 1;
        s.done.notify_all();
    }
}

/// Apply records to the image and commit it, durably, with the position after them;
/// returns where it wrote each DoM block.
fn write_image(s: &Shared, batch: &Packed, pos: Position) -> Result<Vec<(u128, u64, Stored)>> {
    let mut txn = s.db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate).map_err(storage)?;
    // The last op of each key is what the image needs, written in key order.
    let mut last = std::collections::BTreeMap::new();
    for (_, payload) in batch.iter() {
        for op in decode_record(payload)? {
            last.insert(op.slot(), op);
        }
    }
    let written = {
        let mut w = image::Writer::open(&txn)?;
        write_ops(&mut w, last.values(), &s.area, &s.region.vol)?
    };
    pos.store(&txn)?;
    txn.commit()?;
    lock(&s.area).free_runs(&written.freed);
    Ok(written.stored)
}

/// What [`write_ops`] did beside the image's tables.
pub(super) struct Written {
    /// Where each DoM block it wrote is now.
    pub stored: Vec<(u128, u64, Stored)>,
    /// Area units of the blocks it replaced or removed: free once its transaction is
    /// committed, not before (the last commit still points at them).
    pub freed: Vec<Run>,
}

/// Write `ops` (the last of each key) into the image through `w`, and the bytes of the
/// DoM blocks they put into the DoM area, in a few large writes; a block the area has no
/// room for goes into its index entry instead. The area writes are made durable by the
/// transaction's commit (its flush of the volume's drives comes after them).
pub(super) fn write_ops<'o>(
    w: &mut image::Writer,
    ops: impl Iterator<Item = &'o Op>,
    area: &Mutex<Area>,
    vol: &Volume,
) -> Result<Written> {
    let mut out = Written { stored: Vec::new(), freed: Vec::new() };
    // (run, block's bytes, offset of the run in them), in the order placed.
    let mut writes: Vec<(Run, &[u8], usize)> = Vec::new();
    for op in ops {
        let Op::Dom(k, b, v) = op else {
            w.apply(op)?;
            continue;
        };
        let (k, b) = (*k, *b);
        let Some(data) = v else {
            out.freed.extend(w.dom(k, b, None)?.into_iter().flatten());
            continue;
        };
        // A block's units are taken leaving the image one growth (new files' blocks
        // were let in while it had two); an empty block takes none.
        let runs = if data.is_empty() { None } else { lock(area).alloc(data.len() as u64, 1) };
        let (value, stored) = match runs {
            Some(runs) => {
                let mut at = 0;
                for r in runs.iter() {
                    writes.push((*r, &data[..], at));
                    at += r.units as usize * area::UNIT as usize;
                }
                let e = Extent { len: data.len() as u32, crc: area::crc(data), runs };
                (area::Value::Area(e.clone()).encode(), Stored::Area(e))
            }
            None => (area::Value::Inline(data).encode(), Stored::Inline(data.len() as u32)),
        };
        out.freed.extend(w.dom(k, b, Some(&value))?.into_iter().flatten());
        out.stored.push((k, b, stored));
    }
    write_runs(vol, writes).map_err(|e| storage(format!("DoM area: {e}")))?;
    Ok(out)
}

/// Largest single write of the DoM area.
const AREA_WRITE_MAX: usize = 4 << 20;

/// Write each run's part of its block (zero-padded to whole units), runs that follow one
/// another on the volume joined into one write.
fn write_runs(vol: &Volume, mut writes: Vec<(Run, &[u8], usize)>) -> std::result::Result<(), nacre_raid::RaidError> {
    writes.sort_unstable_by_key(|(r, _, _)| r.at);
    let total: u64 = writes.iter().map(|(r, _, _)| r.units as u64 * area::UNIT).sum();
    let mut buf: Vec<u8> = Vec::with_capacity((total as usize).min(AREA_WRITE_MAX));
    let mut buf_at = 0;
    for (r, data, from) in writes {
        let len = r.units as usize * area::UNIT as usize;
        if !buf.is_empty() && (buf_at + buf.len() as u64 != r.at || buf.len() + len > AREA_WRITE_MAX) {
            vol.write(buf_at, &buf)?;
            buf.clear();
        }
        if buf.is_empty() {
            buf_at = r.at;
        }
        let part = &data[from.min(data.len())..(from + len).min(data.len())];
        buf.extend_from_slice(part);
        buf.resize(buf.len() + len - part.len(), 0);
    }
    if !buf.is_empty() {
        vol.write(buf_at, &buf)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_their_records() {
        let mut recs = Packed::default();
        for (t, r) in [(5u64, vec![1u8; 10]), (6, vec![2u8; 5000]), (7, Vec::new())] {
            recs.push(t, &r);
        }
        // A buffer used before, full of other bytes: the group comes out the same as
        // in a fresh one, padding zeroed.
        let mut buf = vec![0xeeu8; 3 * BLOCK as usize];
        let ends = frame(9, &recs, &mut buf);
        assert_eq!(buf.len() as u64 % BLOCK, 0);
        assert_eq!(ends, [framed(10), framed(10) + framed(5000), framed(10) + framed(5000) + framed(0)]);
        assert_eq!(u32::from_le_bytes(buf[0..4].try_into().unwrap()), MAGIC);
        let mut fresh = Vec::new();
        frame(9, &recs, &mut fresh);
        assert!(buf == fresh, "a reused buffer framed differently");
        assert!(buf[*ends.last().unwrap() as usize..].iter().all(|&b| b == 0), "padding not zeroed");
    }

    #[test]
    fn packed_records_keep_their_order_and_split_where_asked() {
        let recs: Vec<(u64, Vec<u8>)> = (0..5u64).map(|t| (t + 10, vec![t as u8; t as usize * 3])).collect();
        let mut p = Packed::default();
        for (t, r) in &recs {
            p.push(*t, r);
        }
        let all: Vec<(u64, Vec<u8>)> = p.iter().map(|(t, r)| (t, r.to_vec())).collect();
        assert_eq!(all, recs);
        // The first two out; the other three stay, bytes and all.
        let head = p.take_first(2, Packed::default());
        assert_eq!(head.iter().map(|(t, r)| (t, r.to_vec())).collect::<Vec<_>>(), recs[..2]);
        assert_eq!(p.iter().map(|(t, r)| (t, r.to_vec())).collect::<Vec<_>>(), recs[2..]);
        // All of them: the buffers go, the spare's stay.
        let mut spare = Packed::default();
        spare.bytes.reserve(4096);
        let rest = p.take_first(3, spare);
        assert_eq!(rest.list.len(), 3);
        assert!(p.is_empty() && p.bytes.capacity() >= 4096);
    }
}
