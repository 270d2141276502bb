//! Framing: the fixed header in front of every message, and a decoder that turns a byte
//! stream into frames without ever trusting a length it has not checked.
//!
//! A frame is an 80-byte header, then `body_len` bytes of control message, then `bulk_len`
//! bytes of bulk data (file data moved by an RPC, up to `bulk_max`). The header is
//! little-endian and protected by its own CRC-32C, so that a garbage or hostile peer is
//! caught at its header, before anything is allocated for it. The byte layout is in
//! `docs/formats/net-frame.md`; a change bumps [`FRAME_VERSION`].
//!
//! Faults this module must survive: any byte sequence from the network. Every malformed
//! input is a [`FrameError`] naming the problem (the connection is then closed by the
//! caller); nothing panics and nothing is allocated beyond the configured maxima.

use std::fmt;

/// "NCRF" in ASCII, read as a little-endian u32.
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"NCRF");
pub const FRAME_VERSION: u16 = 3;
pub const HEADER_BYTES: usize = 80;
const CRC_AT: usize = HEADER_BYTES - 4;

/// Largest bulk payload the format allows at all (16 MiB, Lustre's largest `brw_size`
/// on Helma); a connection may configure less.
pub const BULK_BYTES_LIMIT: u32 = 16 << 20;
/// Largest control message the format allows at all.
pub const BODY_BYTES_LIMIT: u32 = 1 << 20;

/// Bits of [`FrameHeader::flags`].
pub mod flags {
    /// A reply (clear: a request).
    pub const REPLY: u16 = 1 << 0;
    /// An early reply: the server is still working and extends the deadline.
    pub const EARLY: u16 = 1 << 1;
    /// A resend of a request already sent with this xid.
    pub const RESEND: u16 = 1 << 2;
    /// The bulk payload carries a CRC-32C in the body (checksums on).
    pub const BULK_CHECKSUM: u16 = 1 << 3;
    /// A request replayed to a server that restarted before committing it: `transno`
    /// holds the one its first reply gave, and the body is a replay envelope (the
    /// request's body, then its first reply's; see `rpc::Replay`).
    pub const REPLAY: u16 = 1 << 4;
    /// A reply that opened state on the server (an open file) which the client replays
    /// after a restart for as long as it holds it, whether or not it is committed.
    /// In a replay: the request replayed is such state; it runs after the change whose
    /// transno it carries.
    pub const OPEN_STATE: u16 = 1 << 5;
    /// In a reply with `OPEN_STATE` to a request that changed nothing (an open):
    /// `transno` is not the request's own but the last one the server had given, which
    /// the state may depend on (a file another client made); it is replayed after it.
    pub const AFTER: u16 = 1 << 6;
    /// A reply that grants the client a lease on what it answered: the client may cache
    /// it until the server calls it back (the service says what the lease covers).
    pub const LEASED: u16 = 1 << 7;
    /// Every flag this version knows.
    pub const KNOWN: u16 = REPLY | EARLY | RESEND | BULK_CHECKSUM | REPLAY | OPEN_STATE | AFTER | LEASED;
}

/// The fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameHeader {
    pub opcode: u16,
    pub flags: u16,
    /// Reply status (0 = success, else a negative errno); 0 in requests.
    pub status: i32,
    /// Request id, chosen by the sender of a request and echoed by its replies.
    pub xid: u64,
    pub body_len: u32,
    pub bulk_len: u32,
    /// Identity of the job that issued the request (for jobstats and TBF rules), 0 if none.
    pub job_id: u64,
    /// Requests: milliseconds the sender will wait. Early replies: the extension the
    /// server asks for. Replies: the server's service-time estimate.
    pub timeout_ms: u32,
    /// Requests: every xid below this one has had its reply, so the server may forget
    /// the replies it keeps for resends. 0 in replies.
    pub acked_xid: u64,
    /// Replies: microseconds the server held the request, arrival to reply (lets the
    /// client tell network time from service time). 0 in requests.
    pub service_us: u32,
    /// Replies: the transaction number the request's change got (0: it changed nothing
    /// that must be replayed). Replays: the one the first reply gave.
    pub transno: u64,
    /// Replies: the highest transno the server has on its drives (Lustre's
    /// `last_committed`); a client may forget every change at or below it. 0 in requests.
    pub last_committed: u64,
}

/// Limits a receiver enforces, below the format's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    pub body_max: u32,
    pub bulk_max: u32,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits { body_max: 64 << 10, bulk_max: BULK_BYTES_LIMIT }
    }
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    BadMagic(u32),
    BadVersion(u16),
    BadHeaderLen(u16),
    BadChecksum {
        stored: u32,
        computed: u32,
    },
    UnknownFlags(u16),
    BodyTooLong {
        len: u32,
        max: u32,
    },
    BulkTooLong {
        len: u32,
        max: u32,
    },
    /// The stream ended inside a frame.
    Truncated {
        have: usize,
        need: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadMagic(m) => write!(f, "bad frame magic {m:#010x} (expected {FRAME_MAGIC:#010x})"),
            FrameError::BadVersion(v) => write!(f, "frame version {v}, this build speaks {FRAME_VERSION}"),
            FrameError::BadHeaderLen(l) => write!(f, "frame header length {l}, expected {HEADER_BYTES}"),
            FrameError::BadChecksum { stored, computed } => {
                write!(f, "frame header checksum {stored:#010x} does not match {computed:#010x}")
            }
            FrameError::UnknownFlags(x) => write!(f, "unknown frame flags {x:#06x}"),
            FrameError::BodyTooLong { len, max } => write!(f, "frame body of {len} bytes exceeds the maximum {max}"),
            FrameError::BulkTooLong { len, max } => write!(f, "bulk payload of {len} bytes exceeds the maximum {max}"),
            FrameError::Truncated { have, need } => write!(f, "stream ended inside a frame ({have} of {need} bytes)"),
        }
    }
}

impl std::error::Error for FrameError {}

fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&FRAME_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
        b[8..10].copy_from_slice(&self.opcode.to_le_bytes());
        b[10..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.status.to_le_bytes());
        b[16..24].copy_from_slice(&self.xid.to_le_bytes());
        b[24..28].copy_from_slice(&self.body_len.to_le_bytes());
        b[28..32].copy_from_slice(&self.bulk_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.job_id.to_le_bytes());
        b[40..44].copy_from_slice(&self.timeout_ms.to_le_bytes());
        b[44..52].copy_from_slice(&self.acked_xid.to_le_bytes());
        b[52..56].copy_from_slice(&self.service_us.to_le_bytes());
        b[56..64].copy_from_slice(&self.transno.to_le_bytes());
        b[64..72].copy_from_slice(&self.last_committed.to_le_bytes());
        // 72..76 reserved, zero.
        let crc = crc32c(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Check and decode a header. The checks run in an order that names the most useful
    /// problem: a peer speaking another protocol gets "bad magic", not "bad checksum".
    pub fn decode(b: &[u8; HEADER_BYTES], limits: &FrameLimits) -> Result<FrameHeader, FrameError> {
        let magic = u32::from_le_bytes(get(b, 0));
        if magic != FRAME_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let version = u16::from_le_bytes(get(b, 4));
        if version != FRAME_VERSION {
            return Err(FrameError::BadVersion(version));
        }
        let header_len = u16::from_le_bytes(get(b, 6));
        if header_len as usize != HEADER_BYTES {
            return Err(FrameError::BadHeaderLen(header_len));
        }
        let stored = u32::from_le_bytes(get(b, CRC_AT));
        let computed = crc32c(&b[..CRC_AT]);
        if stored != computed {
            return Err(FrameError::BadChecksum { stored, computed });
        }
        let h = FrameHeader {
            opcode: u16::from_le_bytes(get(b, 8)),
            flags: u16::from_le_bytes(get(b, 10)),
            status: i32::from_le_bytes(get(b, 12)),
            xid: u64::from_le_bytes(get(b, 16)),
            body_len: u32::from_le_bytes(get(b, 24)),
            bulk_len: u32::from_le_bytes(get(b, 28)),
            job_id: u64::from_le_bytes(get(b, 32)),
            timeout_ms: u32::from_le_bytes(get(b, 40)),
            acked_xid: u64::from_le_bytes(get(b, 44)),
            service_us: u32::from_le_bytes(get(b, 52)),
            transno: u64::from_le_bytes(get(b, 56)),
            last_committed: u64::from_le_bytes(get(b, 64)),
        };
        if h.flags & !flags::KNOWN != 0 {
            return Err(FrameError::UnknownFlags(h.flags & !flags::KNOWN));
        }
        let body_max = limits.body_max.min(BODY_BYTES_LIMIT);
        if h.body_len > body_max {
            return Err(FrameError::BodyTooLong { len: h.body_len, max: body_max });
        }
        let bulk_max = limits.bulk_max.min(BULK_BYTES_LIMIT);
        if h.bulk_len > bulk_max {
            return Err(FrameError::BulkTooLong { len: h.bulk_len, max: bulk_max });
        }
        Ok(h)
    }

    /// The header of a reply to request `(opcode, xid)`: it echoes both and carries the
    /// status and the lengths of what follows.
    pub fn reply(opcode: u16, xid: u64, status: i32, body_len: usize, bulk_len: usize) -> FrameHeader {
        FrameHeader {
            opcode,
            flags: flags::REPLY,
            status,
            xid,
            body_len: body_len as u32,
            bulk_len: bulk_len as u32,
            ..FrameHeader::default()
        }
    }

    /// Bytes of the whole frame, header included.
    pub fn frame_len(&self) -> usize {
        HEADER_BYTES + self.body_len as usize + self.bulk_len as usize
    }
}

/// A whole frame as the decoder hands it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub body: Vec<u8>,
    pub bulk: crate::bulk::Bulk,
}

/// Incremental decoder over a byte stream: feed it what the socket gave, take frames out.
/// It holds at most one frame's worth of bytes beyond what it was fed: the header is
/// validated before its lengths are used, so a claimed 4 GiB body is an error, not an
/// allocation.
pub struct FrameDecoder {
    limits: FrameLimits,
    buf: Vec<u8>,
    header: Option<FrameHeader>,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    pub fn new(limits: FrameLimits) -> FrameDecoder {
        FrameDecoder { limits, buf: Vec::new(), header: None, failed: None }
    }

    /// Append received bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.failed.is_none() {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the error that
    /// ended the stream (sticky: a broken stream stays broken).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.header.is_none() {
            if self.buf.len() < HEADER_BYTES {
                return Ok(None);
            }
            let raw: [u8; HEADER_BYTES] = get(&self.buf, 0);
            match FrameHeader::decode(&raw, &self.limits) {
                Ok(h) => {
                    self.buf.drain(..HEADER_BYTES);
                    self.header = Some(h);
                }
                Err(e) => {
                    self.buf = Vec::new();
                    self.failed = Some(e.clone());
                    return Err(e);
                }
            }
        }
        let Some(h) = self.header else { return Ok(None) };
        let need = h.body_len as usize + h.bulk_len as usize;
        if self.buf.len() < need {
            return Ok(None);
        }
        let rest = self.buf.split_off(need);
        let mut body = std::mem::replace(&mut self.buf, rest);
        let bulk = body.split_off(h.body_len as usize);
        self.header = None;
        Ok(Some(Frame { header: h, body, bulk: bulk.into() }))
    }

    /// The stream ended: an error if it ended inside a frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.header {
            Some(h) => Err(FrameError::Truncated { have: HEADER_BYTES + self.buf.len(), need: h.frame_len() }),
            None if !self.buf.is_empty() => Err(FrameError::Truncated { have: self.buf.len(), need: HEADER_BYTES }),
            None => Ok(()),
        }
    }

    /// Bytes held, for memory accounting (bounded by one frame plus what was fed).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// Encode a whole frame (header, body, bulk) for tests and simple senders; the transport
/// writes the three parts with one vectored write instead of copying the bulk.
pub fn encode_frame(header: &FrameHeader, body: &[u8], bulk: &[u8]) -> Vec<u8> {
    debug_assert_eq!(header.body_len as usize, body.len(), "header body length");
    debug_assert_eq!(header.bulk_len as usize, bulk.len(), "header bulk length");
    let mut out = Vec::with_capacity(header.frame_len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
    out.extend_from_slice(bulk);
    out
}
