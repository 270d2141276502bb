//! An object's attributes as the index stores them: a fixed little-endian record with a
//! version, so that a later version can grow it.

use crate::error::{OsdError, Result};

const RECORD_VERSION: u32 = 1;
const RECORD_BYTES: usize = 80;

/// What `getattr` returns: the size and space of an object (for glimpses and `stat`), its
/// times, its owner for quotas, and the file it belongs to (set by the MDS, kept for `check`
/// and for rebuilding the namespace's view of an OST, as Lustre's `filter_fid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ObjectAttr {
    pub size: u64,
    /// Bytes of space the object holds (whole chunks).
    pub space: u64,
    pub mtime_ns: i64,
    pub atime_ns: i64,
    pub ctime_ns: i64,
    pub uid: u32,
    pub gid: u32,
    pub projid: u32,
    /// The file this object is a stripe of: sequence, object id and stripe index; zero
    /// until the MDS sets it.
    pub parent: [u64; 2],
}

/// Attributes to change; `None` leaves one as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mtime_ns: Option<i64>,
    pub atime_ns: Option<i64>,
    pub ctime_ns: Option<i64>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub projid: Option<u32>,
    pub parent: Option<[u64; 2]>,
}

impl ObjectAttr {
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[0..4].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.space.to_le_bytes());
        b[24..32].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b[32..40].copy_from_slice(&self.atime_ns.to_le_bytes());
        b[40..48].copy_from_slice(&self.ctime_ns.to_le_bytes());
        b[48..52].copy_from_slice(&self.uid.to_le_bytes());
        b[52..56].copy_from_slice(&self.gid.to_le_bytes());
        b[56..60].copy_from_slice(&self.projid.to_le_bytes());
        b[64..72].copy_from_slice(&self.parent[0].to_le_bytes());
        b[72..80].copy_from_slice(&self.parent[1].to_le_bytes());
        b
    }

    pub fn decode(oid: u64, b: &[u8]) -> Result<ObjectAttr> {
        if b.len() != RECORD_BYTES {
            return Err(OsdError::Corrupt(format!("object {oid:#x}: record of {} bytes", b.len())));
        }
        let w = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let l = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            a
        };
        if w(0) != RECORD_VERSION {
            return Err(OsdError::Corrupt(format!("object {oid:#x}: record version {}", w(0))));
        }
        Ok(ObjectAttr {
            size: u64::from_le_bytes(l(8)),
            space: u64::from_le_bytes(l(16)),
            mtime_ns: i64::from_le_bytes(l(24)),
            atime_ns: i64::from_le_bytes(l(32)),
            ctime_ns: i64::from_le_bytes(l(40)),
            uid: w(48),
            gid: w(52),
            projid: w(56),
            parent: [u64::from_le_bytes(l(64)), u64::from_le_bytes(l(72))],
        })
    }

    pub fn apply(&mut self, s: &SetAttr) {
        if let Some(v) = s.mtime_ns {
            self.mtime_ns = v;
        }
        if let Some(v) = s.atime_ns {
            self.atime_ns = v;
        }
        if let Some(v) = s.ctime_ns {
            self.ctime_ns = v;
        }
        if let Some(v) = s.uid {
            self.uid = v;
        }
        if let Some(v) = s.gid {
            self.gid = v;
        }
        if let Some(v) = s.projid {
            self.projid = v;
        }
        if let Some(v) = s.parent {
            self.parent = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_named() {
        let a = ObjectAttr { size: 5, space: 1 << 20, mtime_ns: -3, uid: 7, parent: [1, 2], ..ObjectAttr::default() };
        assert_eq!(ObjectAttr::decode(9, &a.encode()).unwrap(), a);
        assert!(ObjectAttr::decode(9, &[0; 3]).unwrap_err().to_string().contains("0x9"));
        let mut b = a.encode();
        b[0] = 9;
        assert!(ObjectAttr::decode(9, &b).unwrap_err().to_string().contains("version 9"));
    }
}
