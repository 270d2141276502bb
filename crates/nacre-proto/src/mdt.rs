//! The metadata service's values: inode attributes and directory entries, as the MDS
//! stores them and sends them. The requests join them with the MDS service.

use crate::fid::Fid;
use crate::wire::{Dec, Enc, ProtoError};

const VERSION: u8 = 1;

/// Longest name of a directory entry, in bytes (Linux's `NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Longest symlink target, in bytes (Linux's `PATH_MAX`, with its NUL).
pub const SYMLINK_MAX: usize = 4095;
/// Longest xattr name and value (Linux's `XATTR_NAME_MAX`, `XATTR_SIZE_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
pub const XATTR_SIZE_MAX: usize = 65_536;

/// Linux errno values the metadata service answers with (positive here; a reply's status
/// is the negated value).
pub mod errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const EBADF: i32 = 9;
    pub const EACCES: i32 = 13;
    pub const EEXIST: i32 = 17;
    pub const EXDEV: i32 = 18;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const EMLINK: i32 = 31;
    pub const ERANGE: i32 = 34;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOTEMPTY: i32 = 39;
    pub const ELOOP: i32 = 40;
    pub const ENODATA: i32 = 61;
    pub const EOPNOTSUPP: i32 = 95;
    pub const ESTALE: i32 = 116;
}

/// File types, the `S_IFMT` bits of a mode.
pub mod mode {
    pub const S_IFMT: u32 = 0o170000;
    pub const S_IFDIR: u32 = 0o040000;
    pub const S_IFREG: u32 = 0o100000;
    pub const S_IFLNK: u32 = 0o120000;
    pub const S_ISUID: u32 = 0o4000;
    pub const S_ISGID: u32 = 0o2000;
    pub const S_ISVTX: u32 = 0o1000;
    /// The bits a chmod may set.
    pub const PERMS: u32 = 0o7777;

    pub fn is_dir(m: u32) -> bool {
        m & S_IFMT == S_IFDIR
    }
    pub fn is_reg(m: u32) -> bool {
        m & S_IFMT == S_IFREG
    }
    pub fn is_lnk(m: u32) -> bool {
        m & S_IFMT == S_IFLNK
    }
}

/// An inode's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attr {
    pub fid: Fid,
    /// File type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Attr {
    pub fn put(&self, e: Enc) -> Enc {
        self.fid
            .put(e)
            .u32(self.mode)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u64(self.size)
            .u64(self.blocks)
            .i64(self.atime_ns)
            .i64(self.mtime_ns)
            .i64(self.ctime_ns)
    }

    pub fn get(d: &mut Dec<'_>) -> Result<Attr, ProtoError> {
        Ok(Attr {
            fid: Fid::get(d, "fid")?,
            mode: d.u32("mode")?,
            nlink: d.u32("nlink")?,
            uid: d.u32("uid")?,
            gid: d.u32("gid")?,
            size: d.u64("size")?,
            blocks: d.u64("blocks")?,
            atime_ns: d.i64("atime")?,
            mtime_ns: d.i64("mtime")?,
            ctime_ns: d.i64("ctime")?,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        self.put(Enc::new(VERSION)).done()
    }

    pub fn decode(b: &[u8]) -> Result<Attr, ProtoError> {
        let mut d = Dec::new(b, "attributes", VERSION)?;
        let a = Attr::get(&mut d)?;
        d.end()?;
        Ok(a)
    }
}

/// One entry of a directory listing. `cookie` resumes the listing after this entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub fid: Fid,
    /// The entry's file type (`S_IFMT` bits).
    pub kind: u32,
    pub cookie: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_and_cuts_fail() {
        let a = Attr {
            fid: Fid::new(0x2_0000_0400, 9),
            mode: mode::S_IFREG | 0o644,
            nlink: 1,
            uid: 1000,
            gid: 100,
            size: 1 << 40,
            blocks: 8,
            atime_ns: -1,
            mtime_ns: 2,
            ctime_ns: 3,
        };
        let b = a.encode();
        assert_eq!(Attr::decode(&b), Ok(a));
        for cut in 0..b.len() {
            assert!(Attr::decode(&b[..cut]).is_err());
        }
        assert!(mode::is_reg(a.mode) && !mode::is_dir(a.mode) && !mode::is_lnk(a.mode));
    }
}
