//! File identifiers, as Lustre's FIDs: a sequence, an object id within it and a version.
//!
//! Every file and directory has one for life. The sequence names the MDT that owns the
//! inode: MDT `n` hands out sequences `FID_SEQ_NORMAL + (n << 32) + k`, so any node finds
//! the owner of a FID without asking anyone (Lustre keeps the same map in its FLDB). The
//! root directory has a well-known FID on MDT 0.

use std::fmt;
use std::str::FromStr;

use crate::wire::{Dec, Enc, ProtoError};

/// The first sequence of ordinary files (Lustre's `FID_SEQ_NORMAL`).
pub const FID_SEQ_NORMAL: u64 = 0x2_0000_0400;
/// The root directory's sequence (Lustre's `FID_SEQ_ROOT`).
pub const FID_SEQ_ROOT: u64 = 0x2_0000_0007;
/// MDTs a file system can have: sequences carry the index in 16 bits.
pub const MDT_COUNT_MAX: u32 = 1 << 16;

/// A file identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fid {
    pub seq: u64,
    pub oid: u32,
    pub ver: u32,
}

impl Fid {
    /// The root directory of the file system.
    pub const ROOT: Fid = Fid { seq: FID_SEQ_ROOT, oid: 1, ver: 0 };

    pub const fn new(seq: u64, oid: u32) -> Fid {
        Fid { seq, oid, ver: 0 }
    }

    /// The `k`-th sequence of MDT `mdt`.
    pub fn seq_of(mdt: u32, k: u32) -> u64 {
        FID_SEQ_NORMAL + ((mdt as u64) << 32) + k as u64
    }

    /// The MDT that owns this FID; `None` for a sequence outside every MDT's range.
    pub fn mdt(&self) -> Option<u32> {
        if *self == Fid::ROOT {
            return Some(0);
        }
        let rel = self.seq.checked_sub(FID_SEQ_NORMAL)?;
        let mdt = rel >> 32;
        (mdt < MDT_COUNT_MAX as u64).then_some(mdt as u32)
    }

    /// The FID as one sortable key (sequence, then object, then version).
    pub fn key(&self) -> u128 {
        ((self.seq as u128) << 64) | ((self.oid as u128) << 32) | self.ver as u128
    }

    pub fn from_key(k: u128) -> Fid {
        Fid { seq: (k >> 64) as u64, oid: (k >> 32) as u32, ver: k as u32 }
    }

    pub fn put(&self, e: Enc) -> Enc {
        e.u64(self.seq).u32(self.oid).u32(self.ver)
    }

    pub fn get(d: &mut Dec<'_>, what: &'static str) -> Result<Fid, ProtoError> {
        Ok(Fid { seq: d.u64(what)?, oid: d.u32(what)?, ver: d.u32(what)? })
    }
}

/// `[0x200000400:0x1:0x0]`, as `lfs path2fid` prints it.
impl fmt::Display for Fid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}:{:#x}:{:#x}]", self.seq, self.oid, self.ver)
    }
}

impl FromStr for Fid {
    type Err = ProtoError;

    /// Reads what `Display` writes, brackets optional.
    fn from_str(s: &str) -> Result<Fid, ProtoError> {
        let bad = || ProtoError::Invalid(format!("{s:?} is not a FID (expected [0xSEQ:0xOID:0xVER])"));
        let inner = s.trim().trim_start_matches('[').trim_end_matches(']');
        let parts: Vec<&str> = inner.split(':').collect();
        if parts.len() != 3 {
            return Err(bad());
        }
        let num = |p: &str| -> Result<u64, ProtoError> {
            let p = p.trim();
            let hex = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")).ok_or_else(bad)?;
            u64::from_str_radix(hex, 16).map_err(|_| bad())
        };
        let (seq, oid, ver) = (num(parts[0])?, num(parts[1])?, num(parts[2])?);
        let (oid, ver) = (u32::try_from(oid).map_err(|_| bad())?, u32::try_from(ver).map_err(|_| bad())?);
        Ok(Fid { seq, oid, ver })
    }
}

/// FNV-1a, 64 bits: the name hash of directory entries. It orders readdir (its value is
/// the entry's cookie) and picks the shard of a striped directory, so it is part of the
/// protocol and never changes (Lustre's `fnv_1a_64` hash type).
pub fn name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fids_print_parse_and_name_their_mdt() {
        let f = Fid { seq: Fid::seq_of(3, 7), oid: 0x1234, ver: 0 };
        assert_eq!(f.to_string(), "[0x500000407:0x1234:0x0]");
        assert_eq!(f.to_string().parse::<Fid>(), Ok(f));
        assert_eq!("0x500000407:0x1234:0x0".parse::<Fid>(), Ok(f));
        assert_eq!(f.mdt(), Some(3));
        assert_eq!(Fid::ROOT.mdt(), Some(0));
        assert_eq!(Fid::new(5, 1).mdt(), None);
        assert_eq!(Fid::from_key(f.key()), f);
        assert!(Fid::new(1, 2).key() < Fid::new(1, 3).key() && Fid::new(1, u32::MAX).key() < Fid::new(2, 0).key());
        for bad in ["", "[1:2:3]", "[0x1:0x2]", "[0x1:0x100000000:0x0]", "[0xg:0x1:0x0]"] {
            let e = bad.parse::<Fid>().unwrap_err().to_string();
            assert!(e.contains("is not a FID"), "{bad}: {e}");
        }
        let (body, mut d);
        body = f.put(Enc::new(1)).done();
        d = Dec::new(&body, "fid", 1).unwrap();
        assert_eq!(Fid::get(&mut d, "fid"), Ok(f));
        assert!(d.end().is_ok());
    }

    #[test]
    fn name_hash_is_fnv1a() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(name_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(name_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(name_hash(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
