//! Several MDTs (Lustre's DNE): striped directories, the defaults new subdirectories
//! inherit, and the updates one MDT asks of another to carry out an operation that
//! touches both.
//!
//! A **striped directory** is a master inode with a [`DirStripe`]: its entries live in
//! shards, one directory inode per stripe, each on its own MDT; the FNV-1a hash of a name
//! picks its shard ([`DirStripe::shard_of`]), so a client sends a create straight to the
//! MDT that holds the name and creates in one directory spread over several MDTs.
//!
//! A **default** ([`DirDefault`], `setdirstripe -D`) says where the subdirectories of a
//! directory go and how they are striped; it passes down `max_inherit` levels, and
//! round-robin placement over MDTs (`-i -1`) `max_inherit_rr` levels (Lustre's DNE3
//! "`--max-inherit-rr`"), below which a subdirectory stays on its parent's MDT.

use crate::fid::{Fid, name_hash};
use crate::mdt::{Attr, Creds, NAME_MAX};
use crate::wire::{Dec, Enc, ProtoError};

/// Shards a striped directory has at most.
pub const DIR_STRIPES_MAX: usize = 256;
/// The only hash of names to shards: FNV-1a, 64 bits (Lustre's `fnv_1a_64`).
pub const HASH_FNV_1A_64: u32 = 2;

/// A striped directory's layout (Lustre's LMV): its shards in stripe order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirStripe {
    pub hash: u32,
    pub shards: Vec<Fid>,
}

impl DirStripe {
    /// The stripe that holds `name`.
    pub fn shard_of(&self, name: &str) -> usize {
        (name_hash(name.as_bytes()) % self.shards.len().max(1) as u64) as usize
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::new(1).u32(self.hash).u32(self.shards.len() as u32);
        for f in &self.shards {
            e = f.put(e);
        }
        e.done()
    }

    pub fn decode(b: &[u8]) -> Result<DirStripe, ProtoError> {
        let mut d = Dec::new(b, "directory stripe", 1)?;
        let hash = d.u32("hash type")?;
        if hash != HASH_FNV_1A_64 {
            return Err(ProtoError::Invalid(format!("directory hash type {hash} is not known")));
        }
        let n = d.u32("stripe count")? as usize;
        if n == 0 || n > DIR_STRIPES_MAX {
            return Err(ProtoError::Invalid(format!("{n} directory stripes (1 to {DIR_STRIPES_MAX})")));
        }
        let mut shards = Vec::with_capacity(n);
        for _ in 0..n {
            shards.push(Fid::get(&mut d, "shard")?);
        }
        d.end()?;
        Ok(DirStripe { hash, shards })
    }
}

/// What new subdirectories of a directory get (`setdirstripe -D`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirDefault {
    /// Stripes of a new subdirectory: 0 or 1 a plain directory, -1 every MDT.
    pub count: i32,
    /// Its MDT (or its first stripe's), or -1: round-robin while `max_inherit_rr` lasts,
    /// else the parent's MDT.
    pub offset: i32,
    /// Levels this default passes down: -1 without end, 0 not at all.
    pub max_inherit: i32,
    /// Levels round-robin placement lasts (counted down as `max_inherit`).
    pub max_inherit_rr: i32,
}

impl Default for DirDefault {
    /// Lustre's defaults for `setdirstripe -D` without options: plain subdirectories,
    /// placed round-robin, the default passed down 3 levels (`max_inherit`), round-robin
    /// for none (`max_inherit_rr` 0).
    fn default() -> Self {
        DirDefault { count: 1, offset: -1, max_inherit: 3, max_inherit_rr: 0 }
    }
}

impl DirDefault {
    /// What a subdirectory made under this default inherits, if anything.
    pub fn inherited(&self) -> Option<DirDefault> {
        let down = |v: i32| if v < 0 { v } else { v - 1 };
        match self.max_inherit {
            0 | 1 => None,
            _ => Some(DirDefault {
                max_inherit: down(self.max_inherit),
                max_inherit_rr: if self.max_inherit_rr < 0 { -1 } else { (self.max_inherit_rr - 1).max(0) },
                ..*self
            }),
        }
    }

    /// Does placement go round-robin over the MDTs?
    pub fn round_robin(&self) -> bool {
        self.offset < 0 && self.max_inherit_rr != 0
    }

    pub fn validate(&self, mdts: u32) -> Result<(), String> {
        if self.count < -1 || self.count as i64 > DIR_STRIPES_MAX as i64 {
            return Err(format!("directory stripe count {} (-1 to {DIR_STRIPES_MAX})", self.count));
        }
        if self.count > 0 && self.count as u32 > mdts {
            return Err(format!("directory stripe count {} but the file system has {mdts} MDTs", self.count));
        }
        if self.offset < -1 || (self.offset >= 0 && self.offset as u32 >= mdts) {
            return Err(format!("MDT index {} (the file system has MDTs 0 to {})", self.offset, mdts - 1));
        }
        if self.max_inherit < -1 || self.max_inherit_rr < -1 {
            return Err("max-inherit and max-inherit-rr are -1 (no end) or a number of levels".to_string());
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        let i = |v: i32| v as u32;
        Enc::new(1).u32(i(self.count)).u32(i(self.offset)).u32(i(self.max_inherit)).u32(i(self.max_inherit_rr)).done()
    }

    pub fn decode(b: &[u8]) -> Result<DirDefault, ProtoError> {
        let mut d = Dec::new(b, "directory default", 1)?;
        let r = DirDefault {
            count: d.u32("stripe count")? as i32,
            offset: d.u32("MDT index")? as i32,
            max_inherit: d.u32("max inherit")? as i32,
            max_inherit_rr: d.u32("max inherit rr")? as i32,
        };
        d.end()?;
        Ok(r)
    }
}

/// One change an MDT makes for an operation that another MDT coordinates (one per
/// request: each checks everything before it writes, so it is done whole or not at all,
/// and fails with the errno its check names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// A new inode `attr` (a directory: with its parent, and its stripes or default if
    /// any, encoded; empty for none). EEXIST if the FID is in use.
    MakeInode { attr: Attr, parent: Fid, stripe: Vec<u8>, default: Vec<u8> },
    /// The entry `name` → `fid` in `dir`, which `creds` must be allowed to change;
    /// `dir`'s link count moves by `dlink`. EEXIST if the name is taken, unless `replace`
    /// and the entry there may be replaced by this one (a rename's target: its inode must
    /// live on this MDT, or the answer is EXDEV).
    AddEntry { creds: Creds, dir: Fid, name: String, fid: Fid, kind: u32, dlink: i32, replace: bool },
    /// Remove the entry `name` of `dir`, which must name `fid` (ENOENT if it does not);
    /// `owner` is the inode's owner, for sticky directories; `rmdir` says the caller
    /// removes a directory (ENOTDIR or EISDIR if `kind` disagrees).
    DelEntry { creds: Creds, dir: Fid, name: String, fid: Fid, kind: u32, owner: u32, dlink: i32 },
    /// Add `delta` (+1 or -1) to the links of a non-directory; at none it goes (or
    /// becomes an orphan while open). +1 checks it is not a directory, not unlinked, and
    /// under the link limit. Answers the new attributes.
    Link { fid: Fid, delta: i32 },
    /// Remove an empty directory inode (ENOTEMPTY if it has entries).
    Rmdir { fid: Fid },
    /// The first step of removing a directory: if it is empty (ENOTEMPTY if not), its
    /// link count drops to none, so that nothing can be made in it any more, while its
    /// name is still there.
    Kill { fid: Fid },
    /// Undo a [`Update::Kill`]: an empty directory's two links again.
    Revive { fid: Fid },
    /// A shard takes its master's default for new subdirectories (encoded; empty: none).
    CopyDefault { fid: Fid, default: Vec<u8> },
    /// A directory's parent (`..`) after a rename.
    SetParent { fid: Fid, parent: Fid },
    /// A shard takes its master's permissions and owner (answers its attributes).
    CopyAttr { fid: Fid, mode: u32, uid: u32, gid: u32 },
}

impl Update {
    pub fn put(&self, e: Enc) -> Enc {
        let name = |e: Enc, n: &str| e.bytes(n.as_bytes());
        match self {
            Update::MakeInode { attr, parent, stripe, default } => {
                parent.put(attr.put(e.u8(1))).bytes(stripe).bytes(default)
            }
            Update::AddEntry { creds, dir, name: n, fid, kind, dlink, replace } => {
                fid.put(name(dir.put(creds.put(e.u8(2))), n)).u32(*kind).u32(*dlink as u32).u8(*replace as u8)
            }
            Update::DelEntry { creds, dir, name: n, fid, kind, owner, dlink } => {
                fid.put(name(dir.put(creds.put(e.u8(3))), n)).u32(*kind).u32(*owner).u32(*dlink as u32)
            }
            Update::Link { fid, delta } => fid.put(e.u8(4)).u32(*delta as u32),
            Update::Rmdir { fid } => fid.put(e.u8(5)),
            Update::SetParent { fid, parent } => parent.put(fid.put(e.u8(6))),
            Update::CopyAttr { fid, mode, uid, gid } => fid.put(e.u8(7)).u32(*mode).u32(*uid).u32(*gid),
            Update::Kill { fid } => fid.put(e.u8(8)),
            Update::Revive { fid } => fid.put(e.u8(9)),
            Update::CopyDefault { fid, default } => fid.put(e.u8(10)).bytes(default),
        }
    }

    pub fn get(d: &mut Dec<'_>) -> Result<Update, ProtoError> {
        let name = |d: &mut Dec<'_>| d.str("name", NAME_MAX).map(str::to_string);
        Ok(match d.u8("update kind")? {
            1 => Update::MakeInode {
                attr: Attr::get(d)?,
                parent: Fid::get(d, "parent")?,
                stripe: d.bytes("directory stripe", 8 + 16 * DIR_STRIPES_MAX + 8)?.to_vec(),
                default: d.bytes("directory default", 64)?.to_vec(),
            },
            2 => Update::AddEntry {
                creds: Creds::get(d)?,
                dir: Fid::get(d, "directory")?,
                name: name(d)?,
                fid: Fid::get(d, "fid")?,
                kind: d.u32("type")?,
                dlink: d.u32("link change")? as i32,
                replace: d.u8("replace flag")? != 0,
            },
            3 => Update::DelEntry {
                creds: Creds::get(d)?,
                dir: Fid::get(d, "directory")?,
                name: name(d)?,
                fid: Fid::get(d, "fid")?,
                kind: d.u32("type")?,
                owner: d.u32("owner")?,
                dlink: d.u32("link change")? as i32,
            },
            4 => Update::Link { fid: Fid::get(d, "fid")?, delta: d.u32("link change")? as i32 },
            5 => Update::Rmdir { fid: Fid::get(d, "fid")? },
            6 => Update::SetParent { fid: Fid::get(d, "fid")?, parent: Fid::get(d, "parent")? },
            7 => Update::CopyAttr {
                fid: Fid::get(d, "fid")?,
                mode: d.u32("mode")?,
                uid: d.u32("uid")?,
                gid: d.u32("gid")?,
            },
            8 => Update::Kill { fid: Fid::get(d, "fid")? },
            9 => Update::Revive { fid: Fid::get(d, "fid")? },
            10 => Update::CopyDefault { fid: Fid::get(d, "fid")?, default: d.bytes("directory default", 64)?.to_vec() },
            k => return Err(ProtoError::Invalid(format!("update of unknown kind {k}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_follows_the_name_hash() {
        let s = DirStripe { hash: HASH_FNV_1A_64, shards: vec![Fid::new(1, 1), Fid::new(2, 1), Fid::new(3, 1)] };
        for n in ["a", "file.0001", "x".repeat(255).as_str()] {
            assert_eq!(s.shard_of(n), (name_hash(n.as_bytes()) % 3) as usize);
        }
        assert_eq!(DirStripe::decode(&s.encode()).unwrap(), s);
        let bad = DirStripe { hash: 7, shards: vec![Fid::new(1, 1)] };
        assert!(DirStripe::decode(&bad.encode()).unwrap_err().to_string().contains("hash type 7"));
        let empty = DirStripe { hash: HASH_FNV_1A_64, shards: vec![] };
        assert!(DirStripe::decode(&empty.encode()).unwrap_err().to_string().contains("0 directory stripes"));
    }

    #[test]
    fn defaults_count_down_their_levels() {
        let d = DirDefault { count: 1, offset: -1, max_inherit: 3, max_inherit_rr: 2 };
        assert!(d.round_robin());
        let c = d.inherited().unwrap();
        assert_eq!((c.max_inherit, c.max_inherit_rr), (2, 1));
        let g = c.inherited().unwrap();
        assert_eq!((g.max_inherit, g.max_inherit_rr), (1, 0));
        assert!(!g.round_robin());
        assert_eq!(g.inherited(), None);
        let forever = DirDefault { count: -1, offset: -1, max_inherit: -1, max_inherit_rr: -1 };
        assert_eq!(forever.inherited(), Some(forever));
        assert_eq!(DirDefault::decode(&d.encode()).unwrap(), d);
        assert!(DirDefault { offset: 4, ..d }.validate(2).unwrap_err().contains("MDT index 4"));
        assert!(DirDefault { count: 3, ..d }.validate(2).unwrap_err().contains("has 2 MDTs"));
    }

    #[test]
    fn updates_round_trip() {
        let c = Creds { uid: 5, gid: 6, groups: vec![7], umask: 0o027 };
        let us = vec![
            Update::MakeInode { attr: Attr::default(), parent: Fid::ROOT, stripe: vec![1, 2], default: vec![] },
            Update::AddEntry {
                creds: c.clone(),
                dir: Fid::ROOT,
                name: "n".into(),
                fid: Fid::new(9, 9),
                kind: 0o40000,
                dlink: -1,
                replace: true,
            },
            Update::DelEntry {
                creds: c,
                dir: Fid::ROOT,
                name: "m".into(),
                fid: Fid::new(9, 8),
                kind: 0o100000,
                owner: 3,
                dlink: 1,
            },
            Update::Link { fid: Fid::new(1, 2), delta: -1 },
            Update::Rmdir { fid: Fid::new(1, 3) },
            Update::SetParent { fid: Fid::new(1, 4), parent: Fid::ROOT },
            Update::CopyAttr { fid: Fid::new(1, 5), mode: 0o40755, uid: 1, gid: 2 },
            Update::Kill { fid: Fid::new(1, 6) },
            Update::Revive { fid: Fid::new(1, 7) },
            Update::CopyDefault { fid: Fid::new(1, 8), default: vec![1, 2] },
        ];
        for u in us {
            let b = u.put(Enc::new(1)).done();
            let mut d = Dec::new(&b, "update", 1).unwrap();
            assert_eq!(Update::get(&mut d).unwrap(), u);
            d.end().unwrap();
        }
        let mut d = Dec::new(&[1, 99], "update", 1).unwrap();
        assert!(Update::get(&mut d).unwrap_err().to_string().contains("unknown kind 99"));
    }
}
