//! The OST service's messages: object create (in precreated batches), destroy (one object,
//! or a batch in one transaction), read, write
//! (data in the frame's bulk, as one or more extents of one object, each with an optional
//! CRC-32C), punch, truncate, getattr, setattr, sync and statfs. Every request names the
//! target on the server.

use crate::wire::{Dec, Enc, ProtoError};

/// Version 2: a write carries a list of extents (niobufs), not one.
const VERSION: u8 = 2;

/// Extents one write may carry at most: a full RPC of 4 KiB pieces at the default
/// `max_pages_per_rpc` (Lustre's `PTLRPC_MAX_BRW_PAGES` bounds its niobufs the same way).
pub const NIOBUFS_MAX: usize = 1024;

pub const OST_CREATE: u16 = 100;
pub const OST_DESTROY: u16 = 101;
pub const OST_READ: u16 = 102;
pub const OST_WRITE: u16 = 103;
pub const OST_PUNCH: u16 = 104;
pub const OST_TRUNCATE: u16 = 105;
pub const OST_GETATTR: u16 = 106;
pub const OST_SETATTR: u16 = 107;
pub const OST_SYNC: u16 = 108;
pub const OST_STATFS: u16 = 109;
pub const OST_LAST_ID: u16 = 110;
pub const OST_DESTROY_MANY: u16 = 111;

/// Objects one batched destroy may name at most (the MDS sends what its destroy log holds
/// for one OST, up to this).
pub const DESTROY_MANY_MAX: usize = 1024;

/// Bits of [`SetAttr::mask`]: which fields to change.
pub mod set {
    pub const MTIME: u32 = 1;
    pub const ATIME: u32 = 2;
    pub const CTIME: u32 = 4;
    pub const UID: u32 = 8;
    pub const GID: u32 = 16;
    pub const PROJID: u32 = 32;
    pub const PARENT: u32 = 64;
    pub const ALL: u32 = 127;
}

/// An object's attributes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attr {
    pub size: u64,
    pub space: u64,
    pub mtime_ns: i64,
    pub atime_ns: i64,
    pub ctime_ns: i64,
    pub uid: u32,
    pub gid: u32,
    pub projid: u32,
    pub parent: [u64; 2],
}

/// One extent of a write (Lustre's `niobuf_remote`): `len` bytes of the bulk, taken in
/// order, go to `offset` of the object; `crc` is their CRC-32C when checksums are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Niobuf {
    pub offset: u64,
    pub len: u32,
    pub crc: Option<u32>,
}

/// Attributes to set: the fields whose bit is in `mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    pub mask: u32,
    pub attr: Attr,
}

/// Space and objects of a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatFs {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub objects: u64,
    pub chunk_bytes: u64,
}

/// A request to an OST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `count` new objects in `group` (the precreating MDT's index).
    Create {
        target: u32,
        count: u32,
        group: u32,
    },
    Destroy {
        target: u32,
        oid: u64,
    },
    /// Destroy 1 to [`DESTROY_MANY_MAX`] distinct objects in one transaction; the reply
    /// says which existed ([`encode_destroyed`]). An object already gone is no error: a
    /// batch resent after a crash finds some of its objects destroyed.
    DestroyMany {
        target: u32,
        oids: Vec<u64>,
    },
    /// Read `len` bytes; with `checksum` the reply carries the data's CRC-32C.
    Read {
        target: u32,
        oid: u64,
        offset: u64,
        len: u32,
        checksum: bool,
    },
    /// The data is the frame's bulk, the extents' bytes one after the other. The extents
    /// are in offset order and do not overlap (the decoder refuses any other list).
    Write {
        target: u32,
        oid: u64,
        niobufs: Vec<Niobuf>,
    },
    Punch {
        target: u32,
        oid: u64,
        start: u64,
        end: u64,
    },
    Truncate {
        target: u32,
        oid: u64,
        size: u64,
    },
    Getattr {
        target: u32,
        oid: u64,
    },
    Setattr {
        target: u32,
        oid: u64,
        set: SetAttr,
    },
    Sync {
        target: u32,
    },
    Statfs {
        target: u32,
    },
    /// The id the target's next object will get (for the MDS's orphan cleanup).
    LastId {
        target: u32,
        group: u32,
    },
}

fn put_attr(e: Enc, a: &Attr) -> Enc {
    e.u64(a.size)
        .u64(a.space)
        .i64(a.mtime_ns)
        .i64(a.atime_ns)
        .i64(a.ctime_ns)
        .u32(a.uid)
        .u32(a.gid)
        .u32(a.projid)
        .u64(a.parent[0])
        .u64(a.parent[1])
}

fn get_attr(d: &mut Dec<'_>) -> Result<Attr, ProtoError> {
    Ok(Attr {
        size: d.u64("size")?,
        space: d.u64("space")?,
        mtime_ns: d.i64("mtime")?,
        atime_ns: d.i64("atime")?,
        ctime_ns: d.i64("ctime")?,
        uid: d.u32("uid")?,
        gid: d.u32("gid")?,
        projid: d.u32("projid")?,
        parent: [d.u64("parent sequence")?, d.u64("parent object")?],
    })
}

impl Request {
    /// The opcode and body of this request.
    pub fn encode(&self) -> (u16, Vec<u8>) {
        let e = Enc::new(VERSION);
        match self {
            Request::Create { target, count, group } => (OST_CREATE, e.u32(*target).u32(*count).u32(*group).done()),
            Request::Destroy { target, oid } => (OST_DESTROY, e.u32(*target).u64(*oid).done()),
            Request::DestroyMany { target, oids } => {
                (OST_DESTROY_MANY, oids.iter().fold(e.u32(*target).u32(oids.len() as u32), |e, o| e.u64(*o)).done())
            }
            Request::Read { target, oid, offset, len, checksum } => {
                (OST_READ, e.u32(*target).u64(*oid).u64(*offset).u32(*len).u8(*checksum as u8).done())
            }
            Request::Write { target, oid, niobufs } => {
                let e = niobufs.iter().fold(e.u32(*target).u64(*oid).u32(niobufs.len() as u32), |e, n| {
                    e.u64(n.offset).u32(n.len).u8(n.crc.is_some() as u8).u32(n.crc.unwrap_or(0))
                });
                (OST_WRITE, e.done())
            }
            Request::Punch { target, oid, start, end } => {
                (OST_PUNCH, e.u32(*target).u64(*oid).u64(*start).u64(*end).done())
            }
            Request::Truncate { target, oid, size } => (OST_TRUNCATE, e.u32(*target).u64(*oid).u64(*size).done()),
            Request::Getattr { target, oid } => (OST_GETATTR, e.u32(*target).u64(*oid).done()),
            Request::Setattr { target, oid, set } => {
                (OST_SETATTR, put_attr(e.u32(*target).u64(*oid).u32(set.mask), &set.attr).done())
            }
            Request::Sync { target } => (OST_SYNC, e.u32(*target).done()),
            Request::Statfs { target } => (OST_STATFS, e.u32(*target).done()),
            Request::LastId { target, group } => (OST_LAST_ID, e.u32(*target).u32(*group).done()),
        }
    }

    /// Decode a request; an unknown opcode or a malformed body is an error naming it.
    pub fn decode(opcode: u16, body: &[u8]) -> Result<Request, ProtoError> {
        let name = match opcode {
            OST_CREATE => "create",
            OST_DESTROY => "destroy",
            OST_DESTROY_MANY => "batched destroy",
            OST_READ => "read",
            OST_WRITE => "write",
            OST_PUNCH => "punch",
            OST_TRUNCATE => "truncate",
            OST_GETATTR => "getattr",
            OST_SETATTR => "setattr",
            OST_SYNC => "sync",
            OST_STATFS => "statfs",
            OST_LAST_ID => "last id",
            other => return Err(ProtoError::Invalid(format!("opcode {other} is not an OST operation"))),
        };
        let mut d = Dec::new(body, name, VERSION)?;
        let target = d.u32("target")?;
        let r = match opcode {
            OST_CREATE => Request::Create { target, count: d.u32("count")?, group: d.u32("group")? },
            OST_DESTROY => Request::Destroy { target, oid: d.u64("object")? },
            OST_DESTROY_MANY => Request::DestroyMany { target, oids: get_oids(&mut d)? },
            OST_READ => Request::Read {
                target,
                oid: d.u64("object")?,
                offset: d.u64("offset")?,
                len: d.u32("length")?,
                checksum: d.u8("checksum flag")? != 0,
            },
            OST_WRITE => Request::Write { target, oid: d.u64("object")?, niobufs: get_niobufs(&mut d)? },
            OST_PUNCH => Request::Punch { target, oid: d.u64("object")?, start: d.u64("start")?, end: d.u64("end")? },
            OST_TRUNCATE => Request::Truncate { target, oid: d.u64("object")?, size: d.u64("size")? },
            OST_GETATTR => Request::Getattr { target, oid: d.u64("object")? },
            OST_SETATTR => {
                let oid = d.u64("object")?;
                let mask = d.u32("mask")?;
                if mask & !set::ALL != 0 {
                    return Err(ProtoError::Invalid(format!("setattr mask {mask:#x} has unknown bits")));
                }
                Request::Setattr { target, oid, set: SetAttr { mask, attr: get_attr(&mut d)? } }
            }
            OST_SYNC => Request::Sync { target },
            OST_STATFS => Request::Statfs { target },
            _ => Request::LastId { target, group: d.u32("group")? },
        };
        d.end()?;
        Ok(r)
    }
}

/// A write's extents: 1 to [`NIOBUFS_MAX`] of them, none empty, in offset order, none
/// overlapping the next or running past the largest offset.
fn get_niobufs(d: &mut Dec<'_>) -> Result<Vec<Niobuf>, ProtoError> {
    let count = d.u32("extent count")? as usize;
    if count == 0 || count > NIOBUFS_MAX {
        return Err(ProtoError::Invalid(format!("a write of {count} extents (1 to {NIOBUFS_MAX})")));
    }
    let mut v: Vec<Niobuf> = Vec::with_capacity(count);
    for i in 0..count {
        let (offset, len) = (d.u64("extent offset")?, d.u32("extent length")?);
        let has = d.u8("checksum flag")? != 0;
        let crc = d.u32("checksum")?;
        let end = offset.checked_add(len as u64);
        if len == 0 || end.is_none() {
            return Err(ProtoError::Invalid(format!("extent {i} of a write: {len} bytes at {offset}")));
        }
        if let Some(p) = v.last()
            && p.offset + p.len as u64 > offset
        {
            return Err(ProtoError::Invalid(format!(
                "extent {i} of a write ({len} bytes at {offset}) is before the end of extent {} ({} bytes at {})",
                i - 1,
                p.len,
                p.offset
            )));
        }
        v.push(Niobuf { offset, len, crc: has.then_some(crc) });
    }
    Ok(v)
}

/// A batched destroy's objects: 1 to [`DESTROY_MANY_MAX`], none twice.
fn get_oids(d: &mut Dec<'_>) -> Result<Vec<u64>, ProtoError> {
    let count = d.u32("object count")? as usize;
    if count == 0 || count > DESTROY_MANY_MAX {
        return Err(ProtoError::Invalid(format!("a destroy of {count} objects (1 to {DESTROY_MANY_MAX})")));
    }
    let mut oids = Vec::with_capacity(count);
    for _ in 0..count {
        oids.push(d.u64("object")?);
    }
    let mut sorted = oids.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(ProtoError::Invalid(format!("object {:#x} named twice in one destroy", w[0])));
    }
    Ok(oids)
}

/// The reply to a batched destroy: for each object, in the request's order, whether it
/// existed (and is destroyed now) or was gone already.
pub fn encode_destroyed(existed: &[bool]) -> Vec<u8> {
    existed.iter().fold(Enc::new(VERSION).u32(existed.len() as u32), |e, x| e.u8(*x as u8)).done()
}

/// Decode [`encode_destroyed`]'s reply to a destroy of `asked` objects.
pub fn decode_destroyed(b: &[u8], asked: usize) -> Result<Vec<bool>, ProtoError> {
    let mut d = Dec::new(b, "batched destroy reply", VERSION)?;
    let count = d.u32("object count")? as usize;
    if count != asked {
        return Err(ProtoError::Invalid(format!("a destroy of {asked} objects answered for {count}")));
    }
    let existed = (0..count).map(|_| Ok(d.u8("existed flag")? != 0)).collect::<Result<Vec<_>, ProtoError>>()?;
    d.end()?;
    Ok(existed)
}

/// Bytes the extents of a write carry.
pub fn niobufs_bytes(n: &[Niobuf]) -> u64 {
    n.iter().map(|n| n.len as u64).sum()
}

/// The reply to `create`: the first new object and how many.
pub fn encode_created(first: u64, count: u32) -> Vec<u8> {
    Enc::new(VERSION).u64(first).u32(count).done()
}

pub fn decode_created(b: &[u8]) -> Result<(u64, u32), ProtoError> {
    let mut d = Dec::new(b, "create reply", VERSION)?;
    let r = (d.u64("first object")?, d.u32("count")?);
    d.end()?;
    Ok(r)
}

/// The reply to `read`: the bytes (in the bulk) and their CRC-32C if it was asked for.
pub fn encode_read(len: u32, crc: Option<u32>) -> Vec<u8> {
    Enc::new(VERSION).u32(len).u8(crc.is_some() as u8).u32(crc.unwrap_or(0)).done()
}

pub fn decode_read(b: &[u8]) -> Result<(u32, Option<u32>), ProtoError> {
    let mut d = Dec::new(b, "read reply", VERSION)?;
    let len = d.u32("length")?;
    let has = d.u8("checksum flag")? != 0;
    let crc = d.u32("checksum")?;
    d.end()?;
    Ok((len, has.then_some(crc)))
}

/// The reply to getattr, setattr, write, punch and truncate: the object's attributes.
pub fn encode_attr(a: &Attr) -> Vec<u8> {
    put_attr(Enc::new(VERSION), a).done()
}

pub fn decode_attr(b: &[u8]) -> Result<Attr, ProtoError> {
    let mut d = Dec::new(b, "attributes", VERSION)?;
    let a = get_attr(&mut d)?;
    d.end()?;
    Ok(a)
}

pub fn encode_statfs(s: &StatFs) -> Vec<u8> {
    Enc::new(VERSION).u64(s.total_bytes).u64(s.free_bytes).u64(s.objects).u64(s.chunk_bytes).done()
}

pub fn decode_statfs(b: &[u8]) -> Result<StatFs, ProtoError> {
    let mut d = Dec::new(b, "statfs reply", VERSION)?;
    let s = StatFs {
        total_bytes: d.u64("total")?,
        free_bytes: d.u64("free")?,
        objects: d.u64("objects")?,
        chunk_bytes: d.u64("chunk size")?,
    };
    d.end()?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_every_cut_is_an_error() {
        let a = Attr {
            size: 1,
            space: 2,
            mtime_ns: -3,
            atime_ns: 4,
            ctime_ns: 5,
            uid: 6,
            gid: 7,
            projid: 8,
            parent: [9, 10],
        };
        let all = [
            Request::Create { target: 1, count: 1024, group: 3 },
            Request::Destroy { target: 0, oid: 5 },
            Request::DestroyMany { target: 1, oids: vec![5, 1 << 40, 3] },
            Request::Read { target: 2, oid: 7, offset: 1 << 40, len: 1 << 24, checksum: true },
            Request::Write {
                target: 2,
                oid: 7,
                niobufs: vec![Niobuf { offset: 3, len: 47_008, crc: Some(0xdead_beef) }],
            },
            Request::Write {
                target: 2,
                oid: 7,
                niobufs: vec![
                    Niobuf { offset: 3, len: 1, crc: None },
                    Niobuf { offset: 4, len: 4096, crc: Some(9) },
                    Niobuf { offset: 1 << 30, len: 1, crc: None },
                ],
            },
            Request::Punch { target: 0, oid: 1, start: 2, end: 3 },
            Request::Truncate { target: 0, oid: 1, size: 99 },
            Request::Getattr { target: 0, oid: 1 },
            Request::Setattr { target: 0, oid: 1, set: SetAttr { mask: set::UID | set::PARENT, attr: a } },
            Request::Sync { target: 3 },
            Request::Statfs { target: 3 },
            Request::LastId { target: 1, group: 2 },
        ];
        for r in all {
            let (op, body) = r.encode();
            assert_eq!(Request::decode(op, &body), Ok(r.clone()));
            for cut in 0..body.len() {
                assert!(Request::decode(op, &body[..cut]).is_err(), "{r:?} cut at {cut} decoded");
            }
            let mut longer = body.clone();
            longer.push(0);
            assert_eq!(Request::decode(op, &longer), Err(ProtoError::Trailing { extra: 1 }));
            let mut newer = body.clone();
            newer[0] = 3;
            assert!(matches!(Request::decode(op, &newer), Err(ProtoError::Version { got: 3, .. })));
        }
        assert!(Request::decode(999, &[1]).unwrap_err().to_string().contains("not an OST operation"));
        let (op, mut body) = Request::Setattr { target: 0, oid: 1, set: SetAttr::default() }.encode();
        body[13] = 0xff;
        assert!(Request::decode(op, &body).unwrap_err().to_string().contains("unknown bits"));
        assert_eq!(decode_attr(&encode_attr(&a)), Ok(a));
        assert_eq!(decode_read(&encode_read(5, Some(7))), Ok((5, Some(7))));
        assert_eq!(decode_created(&encode_created(5, 7)), Ok((5, 7)));
        assert_eq!(decode_destroyed(&encode_destroyed(&[true, false]), 2), Ok(vec![true, false]));
        assert!(decode_destroyed(&encode_destroyed(&[true]), 2).unwrap_err().to_string().contains("answered for 1"));
        for (oids, why) in [
            (vec![], "a destroy of 0 objects"),
            (vec![7, 8, 7], "object 0x7 named twice"),
            ((0..=DESTROY_MANY_MAX as u64).collect(), "a destroy of 1025 objects (1 to 1024)"),
        ] {
            let (op, body) = Request::DestroyMany { target: 0, oids }.encode();
            let got = Request::decode(op, &body).unwrap_err().to_string();
            assert!(got.contains(why), "{got}");
        }
        let s = StatFs { total_bytes: 1, free_bytes: 2, objects: 3, chunk_bytes: 4 };
        assert_eq!(decode_statfs(&encode_statfs(&s)), Ok(s));
    }

    #[test]
    fn a_write_with_a_bad_extent_list_is_refused_by_name() {
        let n = |offset, len| Niobuf { offset, len, crc: None };
        let write = |niobufs: Vec<Niobuf>| {
            let (op, body) = Request::Write { target: 0, oid: 1, niobufs }.encode();
            Request::decode(op, &body).map_err(|e| e.to_string())
        };
        let cases = [
            (vec![], "a write of 0 extents"),
            (vec![n(0, 10), n(5, 10)], "extent 1 of a write (10 bytes at 5) is before the end of extent 0"),
            (vec![n(100, 1), n(0, 1)], "extent 1 of a write (1 bytes at 0) is before the end of extent 0"),
            (vec![n(0, 1), n(0, 1)], "before the end of extent 0"),
            (vec![n(0, 0)], "extent 0 of a write: 0 bytes at 0"),
            (vec![n(u64::MAX, 2)], "2 bytes at 18446744073709551615"),
            ((0..=NIOBUFS_MAX as u64).map(|i| n(i * 2, 1)).collect(), "a write of 1025 extents (1 to 1024)"),
        ];
        for (list, why) in cases {
            let got = write(list.clone()).unwrap_err();
            assert!(got.contains(why), "{list:?}: {got}");
        }
        // Touching extents are fine (the writer may not have joined them).
        let ok = vec![n(0, 10), n(10, 10), n(4096, 1)];
        assert_eq!(niobufs_bytes(&ok), 21);
        assert!(write(ok).is_ok());
        assert!(write((0..NIOBUFS_MAX as u64).map(|i| n(i * 2, 1)).collect()).is_ok());
    }
}
