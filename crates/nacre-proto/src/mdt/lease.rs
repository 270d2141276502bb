//! Leases: what a client may cache of an MDT's namespace until the MDT calls it back.
//!
//! A client that listens for callbacks ([`super::Request::Leases`], a long poll) is
//! granted a lease with each read it is answered: the reply is flagged (the transport's
//! `LEASED` flag) and the keys it grants are [`granted`] of the request and its answer,
//! computed the same way by both sides, so nothing more travels. Before a change
//! answers, the MDT revokes the leases of other clients on every key the change wrote,
//! and waits for them to acknowledge, as Lustre's lock callbacks (blocking ASTs) do.

use super::{Looked, NAME_MAX, Reply, Request, errno};
use crate::fid::Fid;
use crate::wire::{Dec, Enc, ProtoError};

/// Revocations one callback reply carries at most.
pub const REVOKED_MAX: usize = 512;

/// What a lease covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// An inode's attributes, extended attributes (ACLs), symlink target and layout.
    Attr(Fid),
    /// What one name of a directory leads to, or that it leads nowhere.
    Name(Fid, String),
    /// A file's append lock, kept by the one client writing the file, which appends at
    /// the end it knows (see [`super::lock::CACHE`]).
    Append(Fid),
    /// A file's byte-range locks: its holder's owners may let theirs go, and take them
    /// again, with no request, while the MDS still counts them held (see
    /// [`super::lock::CACHE`]).
    Locks(Fid),
}

impl Key {
    pub fn put(&self, e: Enc) -> Enc {
        match self {
            Key::Attr(f) => f.put(e.u8(1)),
            Key::Name(d, n) => d.put(e.u8(2)).bytes(n.as_bytes()),
            Key::Append(f) => f.put(e.u8(3)),
            Key::Locks(f) => f.put(e.u8(4)),
        }
    }

    pub fn get(d: &mut Dec) -> Result<Key, ProtoError> {
        match d.u8("lease kind")? {
            1 => Ok(Key::Attr(Fid::get(d, "lease fid")?)),
            2 => {
                let dir = Fid::get(d, "lease directory")?;
                Ok(Key::Name(dir, d.str("lease name", NAME_MAX)?.to_string()))
            }
            3 => Ok(Key::Append(Fid::get(d, "lease fid")?)),
            4 => Ok(Key::Locks(Fid::get(d, "lease fid")?)),
            k => Err(ProtoError::Invalid(format!("lease of unknown kind {k}"))),
        }
    }

    /// The inode the key is about (a name's directory).
    pub fn fid(&self) -> Fid {
        match self {
            Key::Attr(f) | Key::Name(f, _) | Key::Append(f) | Key::Locks(f) => *f,
        }
    }
}

/// The keys a leased reply to `req` grants: `answer` is the reply, or the positive errno
/// it failed with. Reads lease what they read; a change leases to its own client what it
/// made (a create's name and inode, a setattr's inode, an unlink's name, now missing).
/// A file some client has open for writing has no attribute lease (its size is on the
/// OSTs), nor has an entry on another MDT (its inode is there); a missing name has a name
/// lease (a negative entry).
pub fn granted(req: &Request, answer: Result<&Reply, i32>) -> Vec<Key> {
    let name = |dir: &Fid, n: &str| Key::Name(*dir, n.to_string());
    let mut keys = Vec::new();
    match (req, answer) {
        (Request::Getattr { fid }, Ok(Reply::Attr(a))) if a.fid == *fid => keys.push(Key::Attr(*fid)),
        (Request::Lookup { dir, name: n }, Ok(r)) => {
            keys.push(name(dir, n));
            if let Reply::Attr(a) = r
                && a.nlink > 0
            {
                keys.push(Key::Attr(a.fid));
            }
        }
        (Request::Lookup { dir, name: n }, Err(errno::ENOENT)) => keys.push(name(dir, n)),
        (Request::LookupMany { dir, names }, Ok(Reply::Looked(v))) => {
            for (n, l) in names.iter().zip(v) {
                match l {
                    Looked::Attr(a) if a.nlink > 0 => keys.extend([name(dir, n), Key::Attr(a.fid)]),
                    Looked::Attr(_) | Looked::Writing(_) | Looked::Error(errno::ENOENT) => keys.push(name(dir, n)),
                    Looked::Error(_) => {}
                }
            }
        }
        // A change's own client: what it made, or what it found the name now leads to.
        (
            Request::Create { dir, name: n, .. }
            | Request::CreateOpen { dir, name: n, .. }
            | Request::Mkdir { dir, name: n, .. }
            | Request::Link { dir, name: n, .. },
            Ok(Reply::Attr(a) | Reply::Opened { attr: a, .. }),
        ) if a.nlink > 0 => keys.extend([name(dir, n), Key::Attr(a.fid)]),
        (Request::Setattr { fid, .. }, Ok(Reply::Attr(a))) if a.fid == *fid => keys.push(Key::Attr(*fid)),
        (Request::Unlink { dir, name: n, .. }, Ok(_)) => keys.push(name(dir, n)),
        (Request::Lock { fid, kind, flags, .. }, Ok(Reply::Done)) if flags & super::lock::CACHE != 0 => {
            keys.push(if flags & super::lock::APPEND != 0 { Key::Append(*fid) } else { Key::Locks(*fid) })
        }
        (Request::Readdir { dir, .. }, Ok(Reply::Entries { entries, .. })) => {
            for (e, a) in entries {
                keys.push(name(dir, &e.name));
                if a.nlink > 0 {
                    keys.push(Key::Attr(e.fid));
                }
            }
        }
        _ => {}
    }
    keys
}

/// A callback reply: the revocations after the acknowledged one, each with its number.
pub fn encode_revoked(e: Enc, revoked: &[(u64, Key)]) -> Enc {
    let mut e = e.u32(revoked.len() as u32);
    for (seq, k) in revoked {
        e = k.put(e.u64(*seq));
    }
    e
}

pub fn decode_revoked(d: &mut Dec) -> Result<Vec<(u64, Key)>, ProtoError> {
    let n = d.u32("revocation count")? as usize;
    if n > REVOKED_MAX {
        return Err(ProtoError::Invalid(format!("{n} revocations in one reply; at most {REVOKED_MAX}")));
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push((d.u64("revocation")?, Key::get(d)?));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mdt::{Attr, DirEntry, mode};

    fn attr(fid: Fid, nlink: u32) -> Attr {
        Attr { fid, mode: mode::S_IFREG | 0o644, nlink, ..Attr::default() }
    }

    #[test]
    fn keys_follow_the_answer() {
        let (d, f) = (Fid::new(1, 1), Fid::new(1, 2));
        let lookup = Request::Lookup { dir: d, name: "x".into() };
        let n = Key::Name(d, "x".into());
        assert_eq!(granted(&lookup, Ok(&Reply::Attr(attr(f, 1)))), vec![n.clone(), Key::Attr(f)]);
        // Remote, written, missing: the name only.
        assert_eq!(granted(&lookup, Ok(&Reply::Attr(attr(f, 0)))), vec![n.clone()]);
        assert_eq!(granted(&lookup, Ok(&Reply::Writing(attr(f, 1)))), vec![n.clone()]);
        assert_eq!(granted(&lookup, Err(errno::ENOENT)), vec![n.clone()]);
        assert_eq!(granted(&lookup, Err(errno::EACCES)), vec![]);
        let getattr = Request::Getattr { fid: f };
        assert_eq!(granted(&getattr, Ok(&Reply::Attr(attr(f, 1)))), vec![Key::Attr(f)]);
        assert_eq!(granted(&getattr, Ok(&Reply::Writing(attr(f, 1)))), vec![]);
        let many = Request::LookupMany { dir: d, names: vec!["x".into(), "y".into(), "z".into()] };
        let looked = Reply::Looked(vec![Looked::Attr(attr(f, 1)), Looked::Error(errno::ENOENT), Looked::Error(13)]);
        assert_eq!(granted(&many, Ok(&looked)), vec![n.clone(), Key::Attr(f), Key::Name(d, "y".into())]);
        let e = DirEntry { name: "x".into(), fid: f, kind: mode::S_IFREG, cookie: 1 };
        let entries = Reply::Entries { entries: vec![(e, attr(f, 1))], eof: true };
        assert_eq!(granted(&Request::Readdir { dir: d, cookie: 0, max: 10 }, Ok(&entries)), vec![n, Key::Attr(f)]);
    }

    #[test]
    fn revocations_round_trip_and_are_bounded() {
        let v = vec![
            (1, Key::Attr(Fid::new(1, 2))),
            (2, Key::Name(Fid::new(1, 1), "a".into())),
            (3, Key::Append(Fid::new(1, 2))),
            (4, Key::Locks(Fid::new(1, 2))),
        ];
        let b = encode_revoked(Enc::new(1), &v).done();
        let mut d = Dec::new(&b, "test", 1).unwrap();
        assert_eq!(decode_revoked(&mut d).unwrap(), v);
        let b = Enc::new(1).u32(REVOKED_MAX as u32 + 1).done();
        let mut d = Dec::new(&b, "test", 1).unwrap();
        assert!(decode_revoked(&mut d).unwrap_err().to_string().contains("revocations"));
        let b = Enc::new(1).u8(9).done();
        let mut d = Dec::new(&b, "test", 1).unwrap();
        assert!(Key::get(&mut d).unwrap_err().to_string().contains("unknown kind 9"));
    }
}
