//! The MDT's redo log: what makes a change durable before its reply, at the cost of one
//! small sequential write instead of a redb commit.
//!
//! Each batch of changes is applied to redb in a transaction that is committed without
//! durability (it lives in redb's cache and the backend's pending writes), and its
//! physical mutations — puts and deletes of keys — are appended here first, as one record.
//! Now and then a checkpoint makes redb durable (an empty commit with durability) and the
//! log starts over under a new generation. After a crash, redb comes back at its last
//! checkpoint and the records of the current generation are applied again in order.
//! Replaying a put or a delete that is already in place changes nothing, so a checkpoint
//! cut short by a crash is harmless.
//!
//! Layout of the region: two 4 KiB header slots (the current generation, with a sequence
//! and a CRC-32C; a torn write leaves the other slot), then records from the start of the
//! data area, each a 32-byte header (magic, generation, sequence, payload length, CRC-32C
//! of all of it) and the payload, padded to 4 KiB. Replay stops at the first record that
//! does not check or is not the next of the current generation.

use std::sync::Arc;

use nacre_raid::Volume;

const SLOT: u64 = 4096;
const ALIGN: u64 = 4096;
const RECORD_HEADER: usize = 32;
const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"NMLH");
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"NMLR");

fn crc32c(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b) as u32
}

/// The log on `[base, base + size)` of a volume.
pub struct MdLog {
    vol: Arc<Volume>,
    base: u64,
    size: u64,
    /// Flush the drives after each append (power-loss durability).
    flush: bool,
    generation: u64,
    slot_seq: u64,
    /// Next record: its offset in the data area and its sequence.
    head: u64,
    seq: u64,
}

fn io(e: nacre_raid::RaidError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl MdLog {
    /// The data area's bytes.
    pub fn room(&self) -> u64 {
        self.size - 2 * SLOT
    }

    /// Open the log and read back the records of its current generation, in order. A
    /// region that never held a log opens empty.
    pub fn open(vol: Arc<Volume>, base: u64, size: u64, flush: bool) -> std::io::Result<(MdLog, Vec<Vec<u8>>)> {
        let size = size / ALIGN * ALIGN;
        if size < 2 * SLOT + 16 * ALIGN {
            return Err(std::io::Error::other(format!("metadata log region of {size} bytes is too small")));
        }
        let mut best: Option<(u64, u64)> = None;
        let mut b = vec![0u8; SLOT as usize];
        for slot in 0..2 {
            vol.read(base + slot * SLOT, &mut b).map_err(io)?;
            let w = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
            let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let crc = u32::from_le_bytes([b[24], b[25], b[26], b[27]]);
            if magic == HEADER_MAGIC && crc == crc32c(&b[..24]) && best.is_none_or(|x| w(8) > x.0) {
                best = Some((w(8), w(16)));
            }
        }
        let (slot_seq, generation) = best.unwrap_or((0, 0));
        let mut log = MdLog { vol, base, size, flush, generation, slot_seq, head: 0, seq: 0 };
        let mut records = Vec::new();
        if best.is_some() {
            let mut hdr = vec![0u8; ALIGN as usize];
            while log.head + ALIGN <= log.room() {
                log.vol.read(log.data_at(log.head), &mut hdr).map_err(io)?;
                let Some(len) = log.check_header(&hdr) else { break };
                let total = Self::padded(len);
                if log.head + total > log.room() {
                    break;
                }
                let mut rec = vec![0u8; total as usize];
                log.vol.read(log.data_at(log.head), &mut rec).map_err(io)?;
                let want = u32::from_le_bytes([rec[28], rec[29], rec[30], rec[31]]);
                let mut covered = rec[..RECORD_HEADER + len].to_vec();
                covered[28..32].fill(0);
                if crc32c(&covered) != want {
                    break;
                }
                records.push(rec[RECORD_HEADER..RECORD_HEADER + len].to_vec());
                log.head += total;
                log.seq += 1;
            }
        }
        Ok((log, records))
    }

    fn data_at(&self, off: u64) -> u64 {
        self.base + 2 * SLOT + off
    }

    pub fn padded(len: usize) -> u64 {
        ((RECORD_HEADER + len) as u64).div_ceil(ALIGN) * ALIGN
    }

    /// The payload length of a record header that belongs here next.
    fn check_header(&self, h: &[u8]) -> Option<usize> {
        let w = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or([0; 8]));
        let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let len = u32::from_le_bytes([h[24], h[25], h[26], h[27]]) as usize;
        (magic == RECORD_MAGIC && w(8) == self.generation && w(16) == self.seq && (len as u64) < self.room())
            .then_some(len)
    }

    /// Can a record of `len` payload bytes still go in?
    pub fn fits(&self, len: usize) -> bool {
        self.head + Self::padded(len) <= self.room()
    }

    /// Bytes used, and the room.
    pub fn usage(&self) -> (u64, u64) {
        (self.head, self.room())
    }

    /// Append one record; returns once it is on the drives.
    pub fn append(&mut self, payload: &[u8]) -> std::io::Result<()> {
        self.append_all(&[payload])
    }

    /// Append records, in order, with one write and one flush; returns once all are on
    /// the drives. Should the write be torn by a crash, replay stops at the first record
    /// that did not land, and none of them was acknowledged.
    pub fn append_all(&mut self, payloads: &[&[u8]]) -> std::io::Result<()> {
        let total: u64 = payloads.iter().map(|p| Self::padded(p.len())).sum();
        if self.head + total > self.room() {
            return Err(std::io::Error::other("metadata log is full: checkpoint first"));
        }
        let mut buf = vec![0u8; total as usize];
        let (mut at, mut seq) = (0usize, self.seq);
        for payload in payloads {
            let len = Self::padded(payload.len()) as usize;
            let rec = &mut buf[at..at + len];
            rec[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
            rec[8..16].copy_from_slice(&self.generation.to_le_bytes());
            rec[16..24].copy_from_slice(&seq.to_le_bytes());
            rec[24..28].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            rec[RECORD_HEADER..RECORD_HEADER + payload.len()].copy_from_slice(payload);
            let crc = crc32c(&rec[..RECORD_HEADER + payload.len()]);
            rec[28..32].copy_from_slice(&crc.to_le_bytes());
            at += len;
            seq += 1;
        }
        self.vol.write(self.data_at(self.head), &buf).map_err(io)?;
        if self.flush {
            self.vol.flush().map_err(io)?;
        }
        self.head += total;
        self.seq = seq;
        Ok(())
    }

    /// Make a new, empty log: its first generation is drawn from the clock, so records an
    /// earlier log left in the region never pass for this one's.
    pub fn format(vol: Arc<Volume>, base: u64, size: u64, flush: bool) -> std::io::Result<MdLog> {
        vol.write(base, &vec![0u8; 2 * SLOT as usize]).map_err(io)?;
        let (mut log, _) = MdLog::open(vol, base, size, flush)?;
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        log.generation = nanos ^ ((std::process::id() as u64) << 40);
        log.reset()?;
        Ok(log)
    }

    /// Start over under a generation drawn afresh (at open: records of a reset lost to a
    /// power cut can never pass for the new generation's).
    pub fn renew(&mut self) -> std::io::Result<()> {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        self.generation ^= nanos.rotate_left(17) | 1;
        self.reset()
    }

    /// Start over under a new generation: everything logged so far is durable elsewhere.
    pub fn reset(&mut self) -> std::io::Result<()> {
        let (slot_seq, generation) = (self.slot_seq + 1, self.generation.wrapping_add(1));
        let mut b = vec![0u8; SLOT as usize];
        b[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&slot_seq.to_le_bytes());
        b[16..24].copy_from_slice(&generation.to_le_bytes());
        let crc = crc32c(&b[..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        self.vol.write(self.base + (slot_seq % 2) * SLOT, &b).map_err(io)?;
        if self.flush {
            self.vol.flush().map_err(io)?;
        }
        (self.slot_seq, self.generation, self.head, self.seq) = (slot_seq, generation, 0, 0);
        Ok(())
    }
}
