//! The small-write journal: a circular log on the mirrored volume that takes the pieces of
//! writes too small to fill a chunk, so that they cost one mirrored write instead of a
//! RAID6 read-modify-write each, and reach their chunks later in full stripes (destage).
//!
//! **Records.** A record is a 64-byte header — magic, kind, sequence number, virtual
//! position, object, offset, length, CRC-32C of the data and of the header — then the data,
//! padded to 4 KiB. Positions are virtual (they only grow); the physical place is the
//! position modulo the region's size, and a record that would cross the region's end is
//! preceded by a pad record that sends readers to the next lap.
//!
//! **Group commit.** Writers queue their pieces; one of them (a leader) takes the whole
//! queue, lays it out as consecutive records and writes it with one volume write (two if
//! it wraps). Up to [`BATCHES_IN_FLIGHT`] batches are written at once (a mirrored write's
//! latency would otherwise cap the journal), and a record is acknowledged only when every
//! record before it is on the drives too: recovery reads from the tail and stops at the
//! first record whose header, sequence, position or data does not check, and so loses
//! nothing acknowledged.
//!
//! **Index.** Pending pieces are kept in memory per (object, chunk), in sequence order, with
//! where their data lies in the journal; reads lay them over the chunk's bytes. The index
//! is bounded by the journal's size (at least 4 KiB per record).
//!
//! **Tail.** When a chunk's pieces are destaged, the records left without a live piece
//! at the start of the log are dead, and the tail moves past them; the target commits the
//! new tail in the same transaction that maps the destaged data.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use nacre_raid::volume::Volume;

use crate::crc32c;
use crate::error::{OsdError, Result};

const MAGIC: u32 = u32::from_le_bytes(*b"NCJR");
const HEADER: u64 = 64;
const ALIGN: u64 = 4096;
const KIND_DATA: u16 = 1;
const KIND_PAD: u16 = 2;

/// A pending piece of one chunk: `len` bytes at `chunk_off` in the chunk, found at
/// `data_at` on the journal's volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub seq: u64,
    pub chunk_off: u64,
    pub len: u64,
    pub data_at: u64,
    /// Where the piece starts in its record's data.
    pub rec_off: u64,
}

/// Bytes of recently journaled data kept in memory, so that destaging a chunk its
/// pieces just filled reads nothing back.
pub const CACHE_BYTES: usize = 64 << 20;

#[derive(Default)]
struct Cache {
    data: BTreeMap<u64, Arc<Vec<u8>>>,
    bytes: usize,
}

#[derive(Debug, Clone, Copy)]
struct Record {
    vpos: u64,
    bytes: u64,
    /// Pieces of this record not yet destaged.
    live: u32,
}

struct State {
    head: u64,
    next_seq: u64,
    tail: u64,
    tail_seq: u64,
    /// Batches laid out but not yet written and indexed: start position → first sequence.
    /// The tail never passes one, and nothing after one is acknowledged.
    in_flight: BTreeMap<u64, u64>,
    records: BTreeMap<u64, Record>,
    pieces: HashMap<(u64, u64), Vec<Piece>>,
    /// Per object: the end of its furthest pending piece, and how many pieces it has.
    sizes: HashMap<u64, (u64, usize)>,
}

/// One queued write.
struct Entry {
    ticket: u64,
    oid: u64,
    offset: u64,
    data: Vec<u8>,
}

/// Batches written at once by default.
pub const BATCHES_IN_FLIGHT: usize = 2;

#[derive(Default)]
struct Batch {
    queue: Vec<Entry>,
    leaders: usize,
    next_ticket: u64,
    /// Where each written ticket's record ends; it is acknowledged once everything
    /// before that position is written.
    ends: HashMap<u64, u64>,
    /// Failures, until their writer reads them.
    failed: HashMap<u64, String>,
}

pub struct Journal {
    jid: u64,
    epoch: u32,
    /// Flush the volume before acknowledging a batch (power-loss durability).
    flush: bool,
    in_flight_max: usize,
    vol: Arc<Volume>,
    base: u64,
    size: u64,
    chunk_bytes: u64,
    state: Mutex<State>,
    batch: Mutex<Batch>,
    batch_done: Condvar,
    broken: AtomicBool,
    cache: Mutex<Cache>,
    /// Batches written, and records in them.
    pub batches: std::sync::atomic::AtomicU64,
    pub batched_records: std::sync::atomic::AtomicU64,
}

/// How a journal writes.
#[derive(Debug, Clone, Copy)]
pub struct JournalOptions {
    /// Batches written at once.
    pub in_flight_max: usize,
    /// Flush the volume before acknowledging a batch (power-loss durability).
    pub flush: bool,
}

/// Why an append did not go in.
pub enum AppendError {
    /// Not enough free journal space for the batch: destage, then try again.
    Full,
    Failed(OsdError),
}

fn record_bytes(len: u64) -> u64 {
    (HEADER + len).div_ceil(ALIGN) * ALIGN
}

struct Header {
    /// The target's journal id: records of an earlier target on the same region never
    /// replay into this one.
    jid: u64,
    /// The open of the target that wrote the record: it never decreases along the log, so
    /// replay cannot run on from records written after a reopen into older ones that a
    /// torn batch had left behind them.
    epoch: u32,
    kind: u16,
    seq: u64,
    vpos: u64,
    oid: u64,
    offset: u64,
    len: u32,
    data_crc: u32,
}

impl Header {
    fn encode(&self) -> [u8; HEADER as usize] {
        let mut b = [0u8; HEADER as usize];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.kind.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.vpos.to_le_bytes());
        b[24..32].copy_from_slice(&self.oid.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..44].copy_from_slice(&self.len.to_le_bytes());
        b[44..48].copy_from_slice(&self.data_crc.to_le_bytes());
        b[48..56].copy_from_slice(&self.jid.to_le_bytes());
        b[56..60].copy_from_slice(&self.epoch.to_le_bytes());
        let crc = crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Header> {
        let w = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let l = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        if b.len() < HEADER as usize || w(0) != MAGIC || w(60) != crc32c(&b[..60]) {
            return None;
        }
        Some(Header {
            jid: l(48),
            epoch: w(56),
            kind: u16::from_le_bytes([b[4], b[5]]),
            seq: l(8),
            vpos: l(16),
            oid: l(24),
            offset: l(32),
            len: w(40),
            data_crc: w(44),
        })
    }
}

/// Lock a mutex, taking it even if a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Journal {
    /// Open the journal on `[base, base + size)` of `vol` and read back every record from
    /// the committed tail.
    pub fn open(
        vol: Arc<Volume>,
        region: (u64, u64),
        chunk_bytes: u64,
        id: (u64, u32),
        tail: (u64, u64),
        floors: &HashMap<(u64, u64), u64>,
        opts: JournalOptions,
    ) -> Result<Journal> {
        let JournalOptions { in_flight_max, flush } = opts;
        let (jid, epoch) = id;
        let (base, size) = (region.0, region.1 / ALIGN * ALIGN);
        if size < 16 * ALIGN {
            return Err(OsdError::NotATarget(format!("small-write journal of {size} bytes is too small")));
        }
        let j = Journal {
            jid,
            epoch,
            flush,
            in_flight_max: in_flight_max.max(1),
            vol,
            base,
            size,
            chunk_bytes,
            state: Mutex::new(State {
                head: tail.0,
                next_seq: tail.1,
                tail: tail.0,
                tail_seq: tail.1,
                in_flight: BTreeMap::new(),
                records: BTreeMap::new(),
                pieces: HashMap::new(),
                sizes: HashMap::new(),
            }),
            batch: Mutex::new(Batch::default()),
            batch_done: Condvar::new(),
            broken: AtomicBool::new(false),
            cache: Mutex::new(Cache::default()),
            batches: Default::default(),
            batched_records: Default::default(),
        };
        {
            let mut st = lock(&j.state);
            j.replay(&mut st, floors)?;
        }
        Ok(j)
    }

    /// The start of the lap after the one `vpos` is in.
    fn next_lap(&self, vpos: u64) -> u64 {
        (vpos / self.size + 1) * self.size
    }

    fn phys(&self, vpos: u64) -> u64 {
        self.base + vpos % self.size
    }

    /// Read records from the tail while they check; the first that does not ends the log.
    /// Pieces at or below their chunk's floor (the highest sequence already destaged into
    /// it) are skipped: they may have been overwritten since.
    fn replay(&self, st: &mut State, floors: &HashMap<(u64, u64), u64>) -> Result<()> {
        let mut vpos = st.tail;
        let mut seq = st.tail_seq;
        let mut epoch = 0;
        let mut hdr = vec![0u8; ALIGN as usize];
        while vpos - st.tail < self.size {
            self.vol.read(self.phys(vpos), &mut hdr)?;
            let Some(h) = Header::decode(&hdr) else { break };
            if h.jid != self.jid || h.seq != seq || h.vpos != vpos || h.epoch < epoch {
                break;
            }
            epoch = h.epoch;
            if h.kind == KIND_PAD {
                st.records.insert(seq, Record { vpos, bytes: 0, live: 0 });
                vpos = self.next_lap(vpos);
                seq += 1;
                continue;
            }
            let bytes = record_bytes(h.len as u64);
            if h.kind != KIND_DATA || self.phys(vpos) - self.base + bytes > self.size {
                break;
            }
            let mut data = vec![0u8; h.len as usize];
            self.vol.read(self.phys(vpos) + HEADER, &mut data)?;
            if crc32c(&data) != h.data_crc {
                break;
            }
            self.index(st, seq, vpos, bytes, h.oid, h.offset, h.len as u64, floors);
            vpos += bytes;
            seq += 1;
        }
        st.head = vpos;
        st.next_seq = seq;
        Ok(())
    }

    /// Put a written record's pieces into the index.
    #[allow(clippy::too_many_arguments)]
    fn index(
        &self,
        st: &mut State,
        seq: u64,
        vpos: u64,
        bytes: u64,
        oid: u64,
        offset: u64,
        len: u64,
        floors: &HashMap<(u64, u64), u64>,
    ) {
        let cb = self.chunk_bytes;
        let mut live = 0;
        let mut end = 0;
        let mut at = offset;
        while at < offset + len {
            let c = at / cb;
            let stop = (offset + len).min((c + 1) * cb);
            if floors.get(&(oid, c)).is_none_or(|&f| seq > f) {
                let piece = Piece {
                    seq,
                    chunk_off: at - c * cb,
                    len: stop - at,
                    data_at: self.phys(vpos) + HEADER + (at - offset),
                    rec_off: at - offset,
                };
                // Batches finish out of order: keep each chunk's pieces in sequence order.
                let v = st.pieces.entry((oid, c)).or_default();
                let at = v.partition_point(|p| p.seq < seq);
                v.insert(at, piece);
                live += 1;
                end = stop;
            }
            at = stop;
        }
        if live > 0 {
            let e = st.sizes.entry(oid).or_insert((0, 0));
            e.0 = e.0.max(end);
            e.1 += live as usize;
        }
        st.records.insert(seq, Record { vpos, bytes, live });
    }

    /// Append one write; returns when it is on the drives (with its whole batch).
    pub fn append(&self, oid: u64, offset: u64, data: &[u8]) -> std::result::Result<(), AppendError> {
        if self.broken.load(Ordering::Acquire) {
            return Err(AppendError::Failed(OsdError::Index("the small-write journal failed earlier".into())));
        }
        if record_bytes(data.len() as u64) > self.size / 4 {
            return Err(AppendError::Failed(OsdError::Invalid(format!(
                "{} bytes is too large for the journal",
                data.len()
            ))));
        }
        let mut b = lock(&self.batch);
        let ticket = b.next_ticket;
        b.next_ticket += 1;
        b.queue.push(Entry { ticket, oid, offset, data: data.to_vec() });
        loop {
            if let Some(m) = b.failed.remove(&ticket) {
                return Err(if m == "full" { AppendError::Full } else { AppendError::Failed(OsdError::Index(m)) });
            }
            if let Some(&end) = b.ends.get(&ticket)
                && end <= self.written_below()
            {
                b.ends.remove(&ticket);
                return Ok(());
            }
            if self.broken.load(Ordering::Acquire) {
                b.ends.remove(&ticket);
                return Err(AppendError::Failed(OsdError::Index("the small-write journal failed".into())));
            }
            if b.leaders < self.in_flight_max && !b.queue.is_empty() {
                b.leaders += 1;
                let entries = std::mem::take(&mut b.queue);
                drop(b);
                let tickets: Vec<u64> = entries.iter().map(|e| e.ticket).collect();
                let outcome = self.write_batch(entries);
                b = lock(&self.batch);
                b.leaders -= 1;
                match outcome {
                    Ok(ends) => {
                        for (t, end) in tickets.iter().copied().zip(ends) {
                            match end {
                                Some(end) => {
                                    b.ends.insert(t, end);
                                }
                                None => {
                                    b.failed.insert(t, "full".into());
                                }
                            }
                        }
                    }
                    Err(m) => {
                        for t in &tickets {
                            b.failed.insert(*t, m.clone());
                        }
                    }
                }
                self.batch_done.notify_all();
                continue;
            }
            b = self.batch_done.wait(b).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Everything before this position is written (the start of the oldest batch still
    /// in flight, else the head).
    fn written_below(&self) -> u64 {
        let st = lock(&self.state);
        st.in_flight.keys().next().copied().unwrap_or(st.head)
    }

    /// Lay out and write one batch; returns where each entry's record ends, `None` for the
    /// entries that did not fit. `Err("full")` if none fits (nothing written).
    fn write_batch(&self, entries: Vec<Entry>) -> std::result::Result<Vec<Option<u64>>, String> {
        // Positions, under the state lock; the IO without it.
        let (start, layout) = {
            let mut st = lock(&self.state);
            let mut vpos = st.head;
            let mut seq = st.next_seq;
            let mut layout = Vec::with_capacity(entries.len() + 1);
            // Lay out the entries that fit; the rest are told the journal is full.
            for e in &entries {
                let bytes = record_bytes(e.data.len() as u64);
                let (mut v, mut q, mut pad) = (vpos, seq, None);
                if v % self.size + bytes > self.size {
                    pad = Some((v, q));
                    v = self.next_lap(v);
                    q += 1;
                }
                if v + bytes - st.tail > self.size {
                    break;
                }
                if let Some((pv, pq)) = pad {
                    layout.push((pv, pq, None));
                }
                layout.push((v, q, Some(e)));
                vpos = v + bytes;
                seq = q + 1;
            }
            if !layout.iter().any(|(_, _, e)| e.is_some()) {
                return Err("full".into());
            }
            let start = st.head;
            let first_seq = st.next_seq;
            st.head = vpos;
            st.next_seq = seq;
            st.in_flight.insert(start, first_seq);
            (start, layout)
        };
        // One buffer per lap: records back to back.
        let end = layout.last().map_or(start, |&(v, _, e)| v + e.map_or(HEADER, |e| record_bytes(e.data.len() as u64)));
        let mut laps: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut buf: Vec<u8> = Vec::with_capacity((end - start).min(self.size) as usize);
        let mut buf_at = start;
        for &(vpos, seq, e) in &layout {
            // A new buffer where positions jump (after a pad) or a lap begins (a record
            // that ended exactly at the region's end is followed by one at its start).
            if vpos != buf_at + buf.len() as u64 || (vpos % self.size == 0 && !buf.is_empty()) {
                if !buf.is_empty() {
                    laps.push((buf_at, std::mem::take(&mut buf)));
                }
                buf_at = vpos;
            }
            match e {
                None => {
                    let h = Header {
                        jid: self.jid,
                        epoch: self.epoch,
                        kind: KIND_PAD,
                        seq,
                        vpos,
                        oid: 0,
                        offset: 0,
                        len: 0,
                        data_crc: 0,
                    };
                    let mut rec = vec![0u8; ALIGN as usize];
                    rec[..HEADER as usize].copy_from_slice(&h.encode());
                    // A pad fills to the end of the lap; only its first block is written.
                    buf.extend_from_slice(&rec);
                    laps.push((buf_at, std::mem::take(&mut buf)));
                    buf_at = self.next_lap(vpos);
                }
                Some(e) => {
                    let h = Header {
                        jid: self.jid,
                        epoch: self.epoch,
                        kind: KIND_DATA,
                        seq,
                        vpos,
                        oid: e.oid,
                        offset: e.offset,
                        len: e.data.len() as u32,
                        data_crc: crc32c(&e.data),
                    };
                    let bytes = record_bytes(e.data.len() as u64) as usize;
                    let at = buf.len();
                    buf.extend_from_slice(&h.encode());
                    buf.extend_from_slice(&e.data);
                    buf.resize(at + bytes, 0);
                }
            }
        }
        if !buf.is_empty() {
            laps.push((buf_at, buf));
        }
        let mut io = laps.iter().try_for_each(|(vpos, bytes)| self.vol.write(self.phys(*vpos), bytes));
        if io.is_ok() && self.flush {
            io = self.vol.flush();
        }
        if let Err(e) = io {
            // A hole in the log would hide every later record from recovery: nothing
            // after it can be acknowledged.
            self.broken.store(true, Ordering::Release);
            self.batch_done.notify_all();
            return Err(format!("journal write failed: {e}"));
        }
        let written: Vec<(u64, u64)> = layout.iter().filter(|(_, _, e)| e.is_some()).map(|&(v, s, _)| (v, s)).collect();
        let mut ends: Vec<Option<u64>> =
            layout.iter().filter_map(|&(v, _, e)| e.map(|e| v + record_bytes(e.data.len() as u64))).map(Some).collect();
        ends.resize(entries.len(), None);
        {
            let mut st = lock(&self.state);
            st.in_flight.remove(&start);
            for &(vpos, seq, e) in &layout {
                match e {
                    Some(e) => {
                        let bytes = record_bytes(e.data.len() as u64);
                        self.index(&mut st, seq, vpos, bytes, e.oid, e.offset, e.data.len() as u64, &HashMap::new());
                    }
                    None => {
                        st.records.insert(seq, Record { vpos, bytes: 0, live: 0 });
                    }
                }
            }
        }
        drop(layout);
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched_records.fetch_add(written.len() as u64, Ordering::Relaxed);
        let mut cache = lock(&self.cache);
        for ((_, seq), e) in written.into_iter().zip(entries) {
            cache.bytes += e.data.len();
            cache.data.insert(seq, Arc::new(e.data));
        }
        while cache.bytes > CACHE_BYTES {
            let Some((_, d)) = cache.data.pop_first() else { break };
            cache.bytes -= d.len();
        }
        Ok(ends)
    }

    /// The most data one record may carry (a quarter of the journal, less its header).
    pub fn record_data_max(&self) -> u64 {
        (self.size / 4 / ALIGN * ALIGN).saturating_sub(HEADER)
    }

    /// The pending pieces of a chunk, oldest first.
    pub fn pieces(&self, oid: u64, chunk: u64) -> Vec<Piece> {
        lock(&self.state).pieces.get(&(oid, chunk)).cloned().unwrap_or_default()
    }

    /// The pieces of a chunk that may be destaged: those older than every batch still in
    /// flight, so no older piece of the chunk can appear after the destage took them (it
    /// would then be dropped with them, or hidden by their floor on replay).
    pub fn settled_pieces(&self, oid: u64, chunk: u64) -> Vec<Piece> {
        let st = lock(&self.state);
        let settled = st.in_flight.values().next().copied().unwrap_or(st.next_seq);
        st.pieces
            .get(&(oid, chunk))
            .map(|ps| ps.iter().filter(|p| p.seq < settled).copied().collect())
            .unwrap_or_default()
    }

    /// The sequence of the oldest record the journal still holds: a piece below it has
    /// been destaged and its blocks may have been reused.
    pub fn tail_seq(&self) -> u64 {
        lock(&self.state).tail_seq
    }

    pub fn has_pieces(&self, oid: u64, chunk: u64) -> bool {
        lock(&self.state).pieces.contains_key(&(oid, chunk))
    }

    /// Chunks of `oid` with pending pieces.
    pub fn chunks_of(&self, oid: u64) -> Vec<u64> {
        let st = lock(&self.state);
        let mut v: Vec<u64> = st.pieces.keys().filter(|(o, _)| *o == oid).map(|&(_, c)| c).collect();
        v.sort_unstable();
        v
    }

    /// Every (object, chunk) with pending pieces.
    pub fn all_chunks(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = lock(&self.state).pieces.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The end of `oid`'s furthest pending piece.
    pub fn pending_size(&self, oid: u64) -> Option<u64> {
        lock(&self.state).sizes.get(&oid).map(|s| s.0)
    }

    /// Bytes between tail and head, and the region's size.
    pub fn usage(&self) -> (u64, u64) {
        let st = lock(&self.state);
        (st.head - st.tail, self.size)
    }

    /// The chunks of the oldest live records, up to `n` of them, for destaging first.
    pub fn oldest_chunks(&self, n: usize) -> Vec<(u64, u64)> {
        let st = lock(&self.state);
        let mut out = Vec::new();
        let live: std::collections::HashSet<u64> =
            st.records.iter().filter(|(_, r)| r.live > 0).map(|(&s, _)| s).take(n).collect();
        for (&k, ps) in &st.pieces {
            if ps.iter().any(|p| live.contains(&p.seq)) && !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }

    /// Read a piece's data.
    pub fn read_piece(&self, p: &Piece, out: &mut [u8]) -> Result<()> {
        self.read_part(p, 0, &mut out[..p.len as usize])
    }

    /// Read `out.len()` bytes of a piece from `skip` bytes into it: from memory while the
    /// cache holds its record, else from the journal.
    pub fn read_part(&self, p: &Piece, skip: u64, out: &mut [u8]) -> Result<()> {
        let cached = lock(&self.cache).data.get(&p.seq).cloned();
        if let Some(d) = cached {
            let at = (p.rec_off + skip) as usize;
            if let Some(src) = d.get(at..at + out.len()) {
                out.copy_from_slice(src);
                return Ok(());
            }
        }
        Ok(self.vol.read(p.data_at + skip, out)?)
    }

    /// The tail once the pieces of `(oid, chunk)` up to `upto_seq` are gone, without
    /// removing them: the target commits it with the destaged data.
    pub fn tail_after(&self, oid: u64, chunk: u64, upto_seq: u64) -> (u64, u64) {
        let st = lock(&self.state);
        let mut dying: HashMap<u64, u32> = HashMap::new();
        if let Some(ps) = st.pieces.get(&(oid, chunk)) {
            for p in ps.iter().filter(|p| p.seq <= upto_seq) {
                *dying.entry(p.seq).or_default() += 1;
            }
        }
        let mut tail = (st.head, st.next_seq);
        for (&seq, r) in &st.records {
            if r.live > dying.get(&seq).copied().unwrap_or(0) {
                tail = (r.vpos, seq);
                break;
            }
        }
        // Never past a batch still being written.
        match st.in_flight.first_key_value() {
            Some((&v, &s)) if v < tail.0 => (v, s),
            _ => tail,
        }
    }

    /// Forget the pieces of `(oid, chunk)` up to `upto_seq` (destaged) and move the tail.
    pub fn remove(&self, oid: u64, chunk: u64, upto_seq: u64) {
        let mut st = lock(&self.state);
        let Some(ps) = st.pieces.get_mut(&(oid, chunk)) else { return };
        let gone: Vec<Piece> = ps.iter().filter(|p| p.seq <= upto_seq).copied().collect();
        ps.retain(|p| p.seq > upto_seq);
        if ps.is_empty() {
            st.pieces.remove(&(oid, chunk));
        }
        for p in &gone {
            if let Some(r) = st.records.get_mut(&p.seq) {
                r.live = r.live.saturating_sub(1);
            }
        }
        if let Some(s) = st.sizes.get_mut(&oid) {
            s.1 = s.1.saturating_sub(gone.len());
            if s.1 == 0 {
                st.sizes.remove(&oid);
            }
        }
        // Dead records at the start of the log: the tail passes them.
        while let Some((&seq, r)) = st.records.first_key_value() {
            if r.live > 0 {
                break;
            }
            let r = *r;
            st.records.remove(&seq);
            let mut cache = lock(&self.cache);
            if let Some(d) = cache.data.remove(&seq) {
                cache.bytes -= d.len();
            }
            // A pad (no bytes) runs to the end of its lap.
            st.tail = if r.bytes == 0 { self.next_lap(r.vpos) } else { r.vpos + r.bytes };
            st.tail_seq = seq + 1;
        }
        if st.records.is_empty() {
            st.tail = st.head;
            st.tail_seq = st.next_seq;
        }
        // Never past a batch still being written.
        if let Some((&v, &s)) = st.in_flight.first_key_value()
            && v < st.tail
        {
            st.tail = v;
            st.tail_seq = s;
        }
    }

    /// Does the union of `pieces` cover the whole chunk?
    pub fn covers(pieces: &[Piece], chunk_bytes: u64) -> bool {
        Self::covers_range(pieces, 0, chunk_bytes)
    }

    /// Does the union of `pieces` cover `[lo, hi)` of their chunk?
    pub fn covers_range(pieces: &[Piece], lo: u64, hi: u64) -> bool {
        let mut spans: Vec<(u64, u64)> = pieces.iter().map(|p| (p.chunk_off, p.chunk_off + p.len)).collect();
        spans.sort_unstable();
        let mut reach = lo;
        for (a, b) in spans {
            if a > reach {
                break;
            }
            reach = reach.max(b);
        }
        reach >= hi
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, VolumeOptions};

    fn mirror() -> (Arc<Volume>, Vec<Arc<MemDrive>>) {
        let drives: Vec<Arc<MemDrive>> = (0..2).map(|i| MemDrive::new(&format!("j{i}"), 8 << 20)).collect();
        let mut o = CreateOptions::new("j", Level::Raid1);
        o.strip_bytes = 16 << 10;
        o.assume_clean = true;
        let devs: Vec<Arc<dyn BlockDevice>> = drives.iter().map(|d| d.clone() as Arc<dyn BlockDevice>).collect();
        let run = VolumeOptions { threads_per_drive: 1, ..VolumeOptions::default() };
        (Arc::new(Volume::create(devs, &o, &run).unwrap()), drives)
    }

    const REGION: (u64, u64) = (1 << 20, 64 << 10);

    /// The test journal on `REGION`, with journal id and epoch `id`, read from `tail`.
    fn open_at(vol: &Arc<Volume>, id: (u64, u32), tail: (u64, u64)) -> Journal {
        let opts = JournalOptions { in_flight_max: 2, flush: false };
        Journal::open(vol.clone(), REGION, CB, id, tail, &HashMap::new(), opts).unwrap()
    }
    const CB: u64 = 64 << 10;

    fn data(i: u64, len: usize) -> Vec<u8> {
        (0..len as u64).map(|b| (i * 13 + b) as u8).collect()
    }

    /// Append records of awkward sizes through many laps of a 16-block region, dropping
    /// the oldest as it fills; every live piece reads back, in memory and after replay.
    #[test]
    fn records_wrap_exactly_and_with_pads_and_replay_the_same() {
        let (vol, _d) = mirror();
        let j = open_at(&vol, (7, 1), (0, 0));
        // Record sizes 1, 2 and 3 blocks: laps end exactly on some, with a pad on others.
        let lens = [4096 - HEADER as usize, 8192 - HEADER as usize, 100, 12288 - HEADER as usize, 5000];
        let mut live: Vec<(u64, u64, usize)> = Vec::new(); // (oid, offset, len)
        for i in 0..200u64 {
            let len = lens[i as usize % lens.len()];
            let (oid, off) = (1 + i % 3, (i / 3) * CB);
            loop {
                match j.append(oid, off, &data(i, len)) {
                    Ok(()) => break,
                    Err(AppendError::Full) => {
                        // Drop the oldest live record's chunk (as a destage would).
                        let (o, f, _) = live.remove(0);
                        let seq = j.pieces(o, f / CB).iter().map(|p| p.seq).max().unwrap();
                        j.remove(o, f / CB, seq);
                    }
                    Err(AppendError::Failed(e)) => panic!("append {i}: {e}"),
                }
            }
            live.push((oid, off, len));
        }
        let check = |j: &Journal, what: &str| {
            for &(oid, off, len) in &live {
                let ps = j.pieces(oid, off / CB);
                assert_eq!(ps.len(), 1, "{what}: one piece for object {oid} at {off}");
                let mut out = vec![0u8; len];
                j.read_piece(&ps[0], &mut out).unwrap();
                let i = (off / CB) * 3 + oid - 1;
                assert!(out == data(i, len), "{what}: piece {i} reads back different");
            }
        };
        check(&j, "live");
        let (tail, tail_seq) = {
            let st = lock(&j.state);
            (st.tail, st.tail_seq)
        };
        assert!(tail > 4 * REGION.1, "the log went round several times");
        drop(j);
        let j = open_at(&vol, (7, 1), (tail, tail_seq));
        check(&j, "replayed");
        assert_eq!(j.all_chunks().len(), live.len(), "nothing more replays than was live");
    }

    /// One batch whose first record ends exactly at the region's end and whose second
    /// starts the next lap: two writes, the second at the region's start.
    #[test]
    fn a_batch_across_the_end_of_a_lap_is_split_there() {
        let (vol, _d) = mirror();
        let j = open_at(&vol, (7, 1), (0, 0));
        let four_blocks = (4 * 4096 - HEADER) as usize;
        let entry = |i: u64, len: usize| Entry { ticket: i, oid: 1, offset: i * CB, data: data(i, len) };
        j.write_batch((0..3).map(|i| entry(i, four_blocks)).collect()).unwrap();
        for i in 0..2 {
            j.remove(1, i, i);
        }
        // Blocks 12-15 and then block 0 of the next lap.
        j.write_batch(vec![entry(3, four_blocks), entry(4, 100)]).unwrap();
        let (tail, tail_seq) = {
            let st = lock(&j.state);
            (st.tail, st.tail_seq)
        };
        assert_eq!((tail, tail_seq), (8 * 4096, 2));
        drop(j);
        // Nothing was written past the region.
        let mut after = vec![0u8; 4096];
        vol.read(REGION.0 + REGION.1, &mut after).unwrap();
        assert!(after.iter().all(|&b| b == 0), "a write ran past the journal's region");
        let j = open_at(&vol, (7, 1), (tail, tail_seq));
        for (i, len) in [(2u64, four_blocks), (3, four_blocks), (4, 100)] {
            let ps = j.pieces(1, i);
            assert_eq!(ps.len(), 1, "record {i} replayed");
            let mut out = vec![0u8; len];
            j.read_piece(&ps[0], &mut out).unwrap();
            assert!(out == data(i, len), "record {i} reads back different");
        }
    }

    #[test]
    fn replay_stops_at_a_torn_record_and_ignores_another_targets() {
        let (vol, _d) = mirror();
        let j = open_at(&vol, (7, 1), (0, 0));
        for i in 0..4u64 {
            assert!(j.append(1, i * CB, &data(i, 3000)).is_ok());
        }
        drop(j);
        // Another target's id reads nothing.
        let other = open_at(&vol, (8, 1), (0, 0));
        assert!(other.all_chunks().is_empty());
        drop(other);
        // Tear the third record's data: replay keeps the first two only.
        vol.write(REGION.0 + 2 * 4096 + HEADER + 10, &[0xff; 8]).unwrap();
        let j = open_at(&vol, (7, 1), (0, 0));
        assert_eq!(j.all_chunks(), vec![(1, 0), (1, 1)]);
        // Appends go on after the last good record.
        assert!(j.append(1, 9 * CB, &data(9, 10)).is_ok());
        assert_eq!(j.usage().0, 3 * 4096);
    }

    /// After a torn record, a reopen writes new records over it; old records further on
    /// still check (sequence, position, CRC) but carry an older epoch, and must not replay.
    #[test]
    fn replay_never_runs_on_into_records_from_before_a_reopen() {
        let (vol, _d) = mirror();
        let open = |epoch: u32| open_at(&vol, (7, epoch), (0, 0));
        let j = open(1);
        for i in 0..4u64 {
            assert!(j.append(1, i * CB, &data(i, 3000)).is_ok());
        }
        drop(j);
        // Record 1 is torn: the log ends after record 0.
        vol.write(REGION.0 + 4096 + HEADER + 10, &[0xff; 8]).unwrap();
        let j = open(2);
        assert_eq!(j.all_chunks(), vec![(1, 0)]);
        // A new record takes sequence 1 and the torn record's place; then a crash.
        assert!(j.append(2, 0, &data(9, 3000)).is_ok());
        drop(j);
        // Records 2 and 3 of the first open follow with matching sequence and position.
        let j = open(3);
        assert_eq!(j.all_chunks(), vec![(1, 0), (2, 0)], "replay stopped at the older epoch");
    }

    #[test]
    fn coverage_is_judged_on_the_union_of_pieces() {
        let p = |off: u64, len: u64| Piece { seq: 0, chunk_off: off, len, data_at: 0, rec_off: 0 };
        assert!(Journal::covers(&[p(0, 10), p(10, CB - 10)], CB));
        assert!(Journal::covers(&[p(5, CB - 5), p(0, 6)], CB));
        assert!(!Journal::covers(&[p(0, 10), p(11, CB - 11)], CB));
        assert!(!Journal::covers(&[], CB));
        assert!(Journal::covers_range(&[p(0, 10), p(8, 10)], 4, 18));
        assert!(!Journal::covers_range(&[p(0, 10), p(11, 10)], 4, 18));
    }
}
