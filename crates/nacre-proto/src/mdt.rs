//! The metadata service's messages: inode attributes, directory entries, and every
//! request and reply of the MDS. Each request carries the caller's credentials (as
//! Lustre's do, trusting the client node for them).

use crate::fid::Fid;
use crate::wire::{Dec, Enc, ProtoError};

pub mod lease;

/// 2: attributes carry `rdev`, creates a device number.
const VERSION: u8 = 2;

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
    /// A lock wait ended by its owner's close.
    pub const EINTR: i32 = 4;
    pub const EIO: i32 = 5;
    pub const E2BIG: i32 = 7;
    pub const EBADF: i32 = 9;
    pub const EACCES: i32 = 13;
    pub const EEXIST: i32 = 17;
    pub const EXDEV: i32 = 18;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const EMFILE: i32 = 24;
    /// A lock another owner holds (no wait asked).
    pub const EAGAIN: i32 = 11;
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const EMLINK: i32 = 31;
    pub const ERANGE: i32 = 34;
    /// Waiting for a lock would deadlock.
    pub const EDEADLK: i32 = 35;
    pub const ENAMETOOLONG: i32 = 36;
    /// No room for another lock or lock wait.
    pub const ENOLCK: i32 = 37;
    pub const ENOTEMPTY: i32 = 39;
    pub const ELOOP: i32 = 40;
    pub const ENODATA: i32 = 61;
    /// The object lives on another MDT: the message says which to ask.
    pub const EREMOTE: i32 = 66;
    /// A replay whose change depended on one lost in recovery (version-based recovery,
    /// as Lustre answers it).
    pub const EOVERFLOW: i32 = 75;
    pub const EOPNOTSUPP: i32 = 95;
    /// A lock still waited for when its request's time was up: ask again.
    pub const ETIMEDOUT: i32 = 110;
    /// Busy: send the request again a little later.
    pub const EINPROGRESS: i32 = 115;
    pub const ESTALE: i32 = 116;
}

/// File types, the `S_IFMT` bits of a mode.
pub mod mode {
    pub const S_IFMT: u32 = 0o170000;
    pub const S_IFDIR: u32 = 0o040000;
    pub const S_IFREG: u32 = 0o100000;
    pub const S_IFLNK: u32 = 0o120000;
    pub const S_IFIFO: u32 = 0o010000;
    pub const S_IFCHR: u32 = 0o020000;
    pub const S_IFBLK: u32 = 0o060000;
    pub const S_IFSOCK: u32 = 0o140000;
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
    /// A character or block device node: the only inodes with a device number.
    pub fn is_device(m: u32) -> bool {
        matches!(m & S_IFMT, S_IFCHR | S_IFBLK)
    }
    /// A FIFO, socket or device node: an inode with no data of its own, made by `mknod`.
    pub fn is_special(m: u32) -> bool {
        matches!(m & S_IFMT, S_IFIFO | S_IFCHR | S_IFBLK | S_IFSOCK)
    }
}

/// The time now as [`Attr`] keeps times: nanoseconds since the epoch.
pub fn now_ns() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
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
    /// A device node's device number, as the kernel encodes it (`new_encode_dev`: major
    /// and minor in 32 bits); 0 for every other inode.
    pub rdev: u32,
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
            .u32(self.rdev)
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
            rdev: d.u32("rdev")?,
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

pub const MDS_GETATTR: u16 = 300;
pub const MDS_LOOKUP: u16 = 301;
pub const MDS_READDIR: u16 = 302;
pub const MDS_CREATE: u16 = 303;
pub const MDS_LINK: u16 = 304;
pub const MDS_UNLINK: u16 = 305;
pub const MDS_RENAME: u16 = 306;
pub const MDS_SETATTR: u16 = 307;
pub const MDS_OPEN: u16 = 308;
pub const MDS_CLOSE: u16 = 309;
pub const MDS_READLINK: u16 = 310;
pub const MDS_GETXATTR: u16 = 311;
pub const MDS_SETXATTR: u16 = 312;
pub const MDS_LISTXATTR: u16 = 313;
pub const MDS_REMOVEXATTR: u16 = 314;
pub const MDS_STATFS: u16 = 315;
pub const MDS_GETLAYOUT: u16 = 316;
pub const MDS_SETDIRLAYOUT: u16 = 317;
pub const MDS_DOM_READ: u16 = 318;
pub const MDS_DOM_WRITE: u16 = 319;
pub const MDS_MKDIR: u16 = 320;
pub const MDS_GETDIRSTRIPE: u16 = 321;
pub const MDS_SETDIRDEFAULT: u16 = 322;
/// From one MDT to another: updates of an operation the first coordinates.
pub const MDS_UPDATE: u16 = 323;
pub const MDS_CREATE_OPEN: u16 = 324;
pub const MDS_OPEN_AT: u16 = 325;
/// Several names of one directory looked up in one request (the client's statahead).
pub const MDS_LOOKUP_MANY: u16 = 326;
/// A byte-range lock (`fcntl`, `flock`) taken, tested or dropped.
pub const MDS_LOCK: u16 = 327;
/// Every lock and lock wait of one owner on one file let go (a close).
pub const MDS_UNLOCK: u16 = 328;
/// A client's callback channel (a long poll): it acknowledges the lease revocations it
/// has carried out and waits for the next ones (see [`lease`]).
pub const MDS_LEASES: u16 = 329;
/// A writer's intent to write a file up to an offset: the MDT gives the components of the
/// file's layout that begin before it their OST objects, if they have none yet (Lustre's
/// layout intent for PFL files), and answers with the layout.
pub const MDS_LAYOUT_INTENT: u16 = 330;

/// Byte-range locks: the kinds of [`Request::Lock`] (`fcntl`'s `F_RDLCK`, `F_WRLCK`,
/// `F_UNLCK`) and its flags.
pub mod lock {
    pub const READ: u8 = 0;
    pub const WRITE: u8 = 1;
    pub const UNLOCK: u8 = 2;
    /// Wait while a conflicting lock is held (`F_SETLKW`) instead of failing with EAGAIN.
    pub const WAIT: u8 = 1;
    /// Only tell what would conflict (`F_GETLK`): nothing changes.
    pub const TEST: u8 = 2;
    /// The mount's own serialization of O_APPEND writes: locks apart from the users'.
    pub const APPEND: u8 = 4;
    /// With [`APPEND`]: keep the lock until the MDS calls it back (a lease on
    /// [`super::lease::Key::Append`]), if the client's handle is the file's only one open
    /// for writing, so its next appends need no request to the MDS. On a user's read or
    /// write lock: ask for the lease on [`super::lease::Key::Locks`], granted when nobody
    /// waits for a lock of the file. Its holder may leave its owners' locks at the MDS
    /// after they let them go, and take them again with no request, until the MDS calls
    /// the lease back (a conflicting lock or test from another client), when it lets go
    /// of what its owners no longer hold, as Lustre's clients keep unused LDLM locks.
    pub const CACHE: u8 = 8;
    pub const FLAGS: u8 = WAIT | TEST | APPEND | CACHE;
    /// The last byte of a lock "to the end of the file, however long it grows".
    pub const EOF: u64 = u64::MAX;

    /// A lock held: bytes `start..=end` of one owner (whatever names owners on the side
    /// that keeps it), read or write, with the pid its owner gave.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Held<O> {
        pub owner: O,
        pub write: bool,
        pub start: u64,
        pub end: u64,
        pub pid: u32,
    }

    impl<O: PartialEq + Copy> Held<O> {
        pub fn overlaps(&self, start: u64, end: u64) -> bool {
            self.start <= end && start <= self.end
        }

        /// Locks of different owners conflict where they overlap and one is a write lock.
        pub fn conflicts(&self, o: &Held<O>) -> bool {
            self.owner != o.owner && self.overlaps(o.start, o.end) && (self.write || o.write)
        }
    }

    /// Put `new` among `held` for its owner (or, with `unlock`, take its range away from
    /// the owner's locks), as POSIX says: the owner's locks it overlaps lose that part
    /// (split if need be), and those of the same kind it overlaps or touches merge with
    /// it. Other owners' locks are left alone. Returns the change in the number of the
    /// owner's records. The MDS keeps its locks this way, and a client what it holds.
    pub fn apply<O: PartialEq + Copy>(held: &mut Vec<Held<O>>, new: Held<O>, unlock: bool) -> isize {
        let before = held.len();
        let mut kept = Vec::with_capacity(held.len() + 2);
        let (mut start, mut end) = (new.start, new.end);
        for h in held.drain(..) {
            if h.owner != new.owner {
                kept.push(h);
                continue;
            }
            // Same-kind locks are kept apart by at least one byte, so one pass merges all.
            let touches = h.start <= end.saturating_add(1) && start <= h.end.saturating_add(1);
            if !unlock && h.write == new.write && touches {
                (start, end) = (start.min(h.start), end.max(h.end));
                continue;
            }
            if !h.overlaps(new.start, new.end) {
                kept.push(h);
                continue;
            }
            if h.start < new.start {
                kept.push(Held { end: new.start - 1, ..h });
            }
            if h.end > new.end {
                kept.push(Held { start: new.end + 1, ..h });
            }
        }
        if !unlock {
            kept.push(Held { start, end, ..new });
        }
        *held = kept;
        held.len() as isize - before as isize
    }
}

/// Supplementary groups a request may carry.
pub const GROUPS_MAX: usize = 64;
/// Entries one readdir reply holds at most.
pub const READDIR_MAX: u32 = 1024;
/// Names one lookup-many request holds at most.
pub const LOOKUP_MANY_MAX: usize = 256;

/// Who asks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The caller's umask, which a create applies unless its directory has a default
    /// ACL (then the ACL decides, as on Linux).
    pub umask: u32,
}

impl Creds {
    pub fn put(&self, e: Enc) -> Enc {
        let mut e = e.u32(self.uid).u32(self.gid).u32(self.umask).u32(self.groups.len() as u32);
        for g in &self.groups {
            e = e.u32(*g);
        }
        e
    }

    /// Credentials, with at most [`GROUPS_MAX`] supplementary groups.
    pub fn get(d: &mut Dec<'_>) -> Result<Creds, ProtoError> {
        let (uid, gid, umask, n) = (d.u32("uid")?, d.u32("gid")?, d.u32("umask")?, d.u32("group count")? as usize);
        if umask & !0o777 != 0 {
            return Err(ProtoError::Invalid(format!("umask {umask:o}")));
        }
        if n > GROUPS_MAX {
            return Err(ProtoError::Invalid(format!("{n} supplementary groups; at most {GROUPS_MAX}")));
        }
        let mut groups = Vec::with_capacity(n);
        for _ in 0..n {
            groups.push(d.u32("group")?);
        }
        Ok(Creds { uid, gid, groups, umask })
    }
}

/// Bits of [`SetAttr::mask`].
pub mod set {
    pub const MODE: u32 = 1;
    pub const UID: u32 = 2;
    pub const GID: u32 = 4;
    pub const SIZE: u32 = 8;
    pub const ATIME: u32 = 16;
    pub const MTIME: u32 = 32;
    /// The time is "now" (`UTIME_NOW`): the value is ignored.
    pub const ATIME_NOW: u32 = 64;
    pub const MTIME_NOW: u32 = 128;
    /// The 512-byte blocks the file's OST objects hold, as a client glimpsed them when it
    /// last wrote (Lustre's lazy size on MDT, for `st_blocks`).
    pub const OST_BLOCKS: u32 = 256;
    /// Through the handle `handle`, open for writing by this client: a truncate needs no
    /// write permission now (it was checked at open, as for ftruncate(2)).
    pub const BY_HANDLE: u32 = 512;
    /// `size` is what the file's objects hold at least (a writer publishing its size):
    /// the size becomes the larger of it and the MDT's, never smaller (no truncate).
    pub const SIZE_AT_LEAST: u32 = 1024;
    pub const ALL: u32 = 2047;
}

/// Attributes to change: the fields whose bit is in `mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    pub mask: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ost_blocks: u64,
    pub handle: u64,
}

/// Flags of a setxattr.
pub mod xattr {
    /// Fail if it exists (`XATTR_CREATE`).
    pub const CREATE: u32 = 1;
    /// Fail if it does not (`XATTR_REPLACE`).
    pub const REPLACE: u32 = 2;
}

/// A request to an MDT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Getattr {
        fid: Fid,
    },
    Lookup {
        dir: Fid,
        name: String,
    },
    /// Each of `names` in `dir` (at most [`LOOKUP_MANY_MAX`]), answered one by one
    /// ([`Reply::Looked`]): a name that is missing does not fail the others.
    LookupMany {
        dir: Fid,
        names: Vec<String>,
    },
    /// Entries after `cookie` (0 starts), at most `max`, each with its attributes.
    Readdir {
        dir: Fid,
        cookie: u64,
        max: u32,
    },
    /// A regular file, directory, symlink, FIFO, socket or device node, by the type bits
    /// of `mode`; a symlink's target is `target`; a device node's number is `rdev` (0 for
    /// every other type); a file's layout is `layout` ([`crate::layout::Layout::encode`];
    /// empty: inherited). A regular file's first bytes may come as the request's bulk:
    /// its inherited layout must keep them on the MDT (DoM), and the file is made and
    /// written in one change.
    Create {
        dir: Fid,
        name: String,
        mode: u32,
        target: Vec<u8>,
        layout: Vec<u8>,
        rdev: u32,
    },
    /// A regular file made and opened in one request (Lustre's open-create intent), with
    /// the given layout or (empty) the inherited one. The creator opens it whatever its
    /// mode, as open(2) with O_CREAT does; the answer is [`Reply::Opened`].
    CreateOpen {
        dir: Fid,
        name: String,
        perms: u32,
        layout: Vec<u8>,
        read: bool,
        write: bool,
    },
    Link {
        fid: Fid,
        dir: Fid,
        name: String,
    },
    Unlink {
        dir: Fid,
        name: String,
        rmdir: bool,
    },
    Rename {
        src_dir: Fid,
        src_name: String,
        dst_dir: Fid,
        dst_name: String,
        noreplace: bool,
    },
    Setattr {
        fid: Fid,
        set: SetAttr,
    },
    /// Open a file. Opened for reading, a file of at most `dom_read` bytes that are all on
    /// the MDT comes whole as the reply's bulk (Lustre's DoM read-on-open): a small file is
    /// opened and read in one request.
    Open {
        fid: Fid,
        read: bool,
        write: bool,
        dom_read: u32,
    },
    /// Open `name` in `dir` (Lustre's open intent: the lookup and the open in one request),
    /// with `dom_read` as [`Request::Open`]'s. The answer is [`Reply::Opened`], or
    /// [`Reply::Attr`] with the FID of a file whose inode is on another MDT, to be opened
    /// there.
    OpenAt {
        dir: Fid,
        name: String,
        read: bool,
        write: bool,
        dom_read: u32,
    },
    Close {
        handle: u64,
    },
    /// A lock of `kind` ([`lock`]) over bytes `start..=end` of `fid`, for `owner` (the
    /// kernel's lock owner: a process's for `fcntl`, an open file's for `flock`), through
    /// the client's open `handle`; `pid` is shown to whoever it conflicts with. A lock of
    /// one owner replaces, splits or merges with its own locks, as POSIX says. Answered
    /// `Done`, or with [`lock::TEST`] [`Reply::Lock`]: what conflicts.
    Lock {
        fid: Fid,
        handle: u64,
        owner: u64,
        pid: u32,
        kind: u8,
        flags: u8,
        start: u64,
        end: u64,
    },
    /// Let go of every lock of `owner` on `fid`, and end its waits (a close).
    Unlock {
        fid: Fid,
        owner: u64,
    },
    /// The callback channel: every revocation up to `acked` is carried out; answered,
    /// once there are any (or after a while, with none), with the next ones
    /// ([`Reply::Revoked`]). The first one makes the client one that is granted leases.
    Leases {
        acked: u64,
    },
    Readlink {
        fid: Fid,
    },
    Getxattr {
        fid: Fid,
        name: String,
    },
    Setxattr {
        fid: Fid,
        name: String,
        value: Vec<u8>,
        flags: u32,
    },
    Listxattr {
        fid: Fid,
    },
    Removexattr {
        fid: Fid,
        name: String,
    },
    Statfs,
    /// A file's layout or a directory's default (empty bytes: none).
    Getlayout {
        fid: Fid,
    },
    /// Set a directory's default layout (empty: remove it).
    Setdirlayout {
        dir: Fid,
        layout: Vec<u8>,
    },
    /// Read `len` bytes of a file's DoM component; the data comes back as the bulk.
    DomRead {
        fid: Fid,
        offset: u64,
        len: u32,
    },
    /// Write the request's bulk at `offset` of a file's DoM component, through `handle`
    /// (0: none) when the client has the file open for writing: the write permission was
    /// checked at open, as write(2)'s.
    DomWrite {
        fid: Fid,
        offset: u64,
        handle: u64,
    },
    /// Give every component of the file's layout that begins before byte `end` its OST
    /// objects, if it has none yet, for a write through `handle` (open for writing by the
    /// caller). Answered with [`Reply::Layout`]: the layout as it is after.
    LayoutIntent {
        fid: Fid,
        handle: u64,
        end: u64,
    },
    /// A directory placed and striped as asked (`lfs mkdir -i MDT -c COUNT`): `mdt` -1
    /// and `count` 0 follow the parent's default; `count` -1 stripes over every MDT.
    Mkdir {
        dir: Fid,
        name: String,
        mode: u32,
        mdt: i32,
        count: i32,
    },
    /// A directory's stripes and default for subdirectories (empty bytes: none).
    Getdirstripe {
        dir: Fid,
    },
    /// Set (empty: remove) the default of a directory's new subdirectories
    /// ([`crate::dne::DirDefault::encode`]).
    Setdirdefault {
        dir: Fid,
        default: Vec<u8>,
    },
    /// An update MDT `coordinator` asks of this one, as step `xid` of its operations;
    /// every step of its below `acked_below` is finished.
    Update {
        coordinator: u32,
        xid: u64,
        acked_below: u64,
        update: crate::dne::Update,
    },
}

/// Bytes an encoded layout may have on the wire.
pub const LAYOUT_BYTES_MAX: usize = 64 << 10;

impl Request {
    /// A create of `name` in `dir` with `mode` (type and permission bits) and the layout
    /// it inherits: [`Request::Create`] with no target, layout or device number.
    pub fn create(dir: Fid, name: &str, mode: u32) -> Request {
        Request::Create { dir, name: name.into(), mode, target: vec![], layout: vec![], rdev: 0 }
    }

    /// Does this request change the namespace (and so get a reply record)?
    pub fn is_change(&self) -> bool {
        !matches!(
            self,
            Request::Getattr { .. }
                | Request::Lookup { .. }
                | Request::LookupMany { .. }
                | Request::Readdir { .. }
                | Request::Readlink { .. }
                | Request::Getxattr { .. }
                | Request::Listxattr { .. }
                | Request::Statfs
                | Request::Getlayout { .. }
                | Request::DomRead { .. }
                | Request::Open { .. }
                | Request::OpenAt { .. }
                | Request::Getdirstripe { .. }
                | Request::Lock { .. }
                | Request::Unlock { .. }
                | Request::Leases { .. }
        )
    }

    /// The opcode and body of this request from `creds`.
    pub fn encode(&self, creds: &Creds) -> (u16, Vec<u8>) {
        let e = creds.put(Enc::new(VERSION));
        let s = |e: Enc, v: &str| e.bytes(v.as_bytes());
        match self {
            Request::Getattr { fid } => (MDS_GETATTR, fid.put(e).done()),
            Request::Lookup { dir, name } => (MDS_LOOKUP, s(dir.put(e), name).done()),
            Request::LookupMany { dir, names } => {
                let mut e = dir.put(e).u32(names.len() as u32);
                for n in names {
                    e = s(e, n);
                }
                (MDS_LOOKUP_MANY, e.done())
            }
            Request::Readdir { dir, cookie, max } => (MDS_READDIR, dir.put(e).u64(*cookie).u32(*max).done()),
            Request::Create { dir, name, mode, target, layout, rdev } => {
                (MDS_CREATE, s(dir.put(e), name).u32(*mode).bytes(target).bytes(layout).u32(*rdev).done())
            }
            Request::Link { fid, dir, name } => (MDS_LINK, s(dir.put(fid.put(e)), name).done()),
            Request::Unlink { dir, name, rmdir } => (MDS_UNLINK, s(dir.put(e), name).u8(*rmdir as u8).done()),
            Request::Rename { src_dir, src_name, dst_dir, dst_name, noreplace } => {
                (MDS_RENAME, s(dst_dir.put(s(src_dir.put(e), src_name)), dst_name).u8(*noreplace as u8).done())
            }
            Request::Setattr { fid, set } => (
                MDS_SETATTR,
                fid.put(e)
                    .u32(set.mask)
                    .u32(set.mode)
                    .u32(set.uid)
                    .u32(set.gid)
                    .u64(set.size)
                    .i64(set.atime_ns)
                    .i64(set.mtime_ns)
                    .u64(set.ost_blocks)
                    .u64(set.handle)
                    .done(),
            ),
            Request::Open { fid, read, write, dom_read } => {
                (MDS_OPEN, fid.put(e).u8(*read as u8).u8(*write as u8).u32(*dom_read).done())
            }
            Request::OpenAt { dir, name, read, write, dom_read } => {
                (MDS_OPEN_AT, s(dir.put(e), name).u8(*read as u8).u8(*write as u8).u32(*dom_read).done())
            }
            Request::Close { handle } => (MDS_CLOSE, e.u64(*handle).done()),
            Request::Lock { fid, handle, owner, pid, kind, flags, start, end } => (
                MDS_LOCK,
                fid.put(e).u64(*handle).u64(*owner).u32(*pid).u8(*kind).u8(*flags).u64(*start).u64(*end).done(),
            ),
            Request::Unlock { fid, owner } => (MDS_UNLOCK, fid.put(e).u64(*owner).done()),
            Request::Leases { acked } => (MDS_LEASES, e.u64(*acked).done()),
            Request::Readlink { fid } => (MDS_READLINK, fid.put(e).done()),
            Request::Getxattr { fid, name } => (MDS_GETXATTR, s(fid.put(e), name).done()),
            Request::Setxattr { fid, name, value, flags } => {
                (MDS_SETXATTR, s(fid.put(e), name).bytes(value).u32(*flags).done())
            }
            Request::Listxattr { fid } => (MDS_LISTXATTR, fid.put(e).done()),
            Request::Removexattr { fid, name } => (MDS_REMOVEXATTR, s(fid.put(e), name).done()),
            Request::Statfs => (MDS_STATFS, e.done()),
            Request::Getlayout { fid } => (MDS_GETLAYOUT, fid.put(e).done()),
            Request::Setdirlayout { dir, layout } => (MDS_SETDIRLAYOUT, dir.put(e).bytes(layout).done()),
            Request::DomRead { fid, offset, len } => (MDS_DOM_READ, fid.put(e).u64(*offset).u32(*len).done()),
            Request::DomWrite { fid, offset, handle } => (MDS_DOM_WRITE, fid.put(e).u64(*offset).u64(*handle).done()),
            Request::LayoutIntent { fid, handle, end } => (MDS_LAYOUT_INTENT, fid.put(e).u64(*handle).u64(*end).done()),
            Request::Mkdir { dir, name, mode, mdt, count } => {
                (MDS_MKDIR, s(dir.put(e), name).u32(*mode).u32(*mdt as u32).u32(*count as u32).done())
            }
            Request::Getdirstripe { dir } => (MDS_GETDIRSTRIPE, dir.put(e).done()),
            Request::CreateOpen { dir, name, perms, layout, read, write } => {
                (MDS_CREATE_OPEN, s(dir.put(e), name).u32(*perms).bytes(layout).u8(*read as u8).u8(*write as u8).done())
            }
            Request::Setdirdefault { dir, default } => (MDS_SETDIRDEFAULT, dir.put(e).bytes(default).done()),
            Request::Update { coordinator, xid, acked_below, update } => {
                (MDS_UPDATE, update.put(e.u32(*coordinator).u64(*xid).u64(*acked_below)).done())
            }
        }
    }

    /// Decode a request and its credentials; an unknown opcode, a malformed body or an
    /// over-long field is an error naming it.
    pub fn decode(opcode: u16, body: &[u8]) -> Result<(Creds, Request), ProtoError> {
        let name = match opcode {
            MDS_GETATTR => "getattr",
            MDS_LOOKUP => "lookup",
            MDS_LOOKUP_MANY => "lookup-many",
            MDS_LOCK => "lock",
            MDS_UNLOCK => "unlock",
            MDS_LEASES => "leases",
            MDS_READDIR => "readdir",
            MDS_CREATE => "create",
            MDS_CREATE_OPEN => "create-open",
            MDS_LINK => "link",
            MDS_UNLINK => "unlink",
            MDS_RENAME => "rename",
            MDS_SETATTR => "setattr",
            MDS_OPEN => "open",
            MDS_OPEN_AT => "open-at",
            MDS_CLOSE => "close",
            MDS_READLINK => "readlink",
            MDS_GETXATTR => "getxattr",
            MDS_SETXATTR => "setxattr",
            MDS_LISTXATTR => "listxattr",
            MDS_REMOVEXATTR => "removexattr",
            MDS_STATFS => "statfs",
            MDS_GETLAYOUT => "getlayout",
            MDS_SETDIRLAYOUT => "setdirlayout",
            MDS_DOM_READ => "dom read",
            MDS_DOM_WRITE => "dom write",
            MDS_LAYOUT_INTENT => "layout intent",
            MDS_MKDIR => "mkdir",
            MDS_GETDIRSTRIPE => "getdirstripe",
            MDS_SETDIRDEFAULT => "setdirdefault",
            MDS_UPDATE => "update",
            other => return Err(ProtoError::Invalid(format!("opcode {other} is not an MDS operation"))),
        };
        let mut d = Dec::new(body, name, VERSION)?;
        let creds = Creds::get(&mut d)?;
        // Names are bounded a little above the limit, so the MDS can answer an over-long
        // one with ENAMETOOLONG instead of a protocol error.
        let name_of = |d: &mut Dec<'_>, what| d.str(what, NAME_MAX * 4).map(str::to_string);
        let r = match opcode {
            MDS_GETATTR => Request::Getattr { fid: Fid::get(&mut d, "fid")? },
            MDS_LOOKUP => Request::Lookup { dir: Fid::get(&mut d, "directory")?, name: name_of(&mut d, "name")? },
            MDS_LOOKUP_MANY => {
                let dir = Fid::get(&mut d, "directory")?;
                let n = d.u32("name count")? as usize;
                if n > LOOKUP_MANY_MAX {
                    return Err(ProtoError::Invalid(format!("{n} names in one lookup; at most {LOOKUP_MANY_MAX}")));
                }
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push(name_of(&mut d, "name")?);
                }
                Request::LookupMany { dir, names }
            }
            MDS_READDIR => {
                Request::Readdir { dir: Fid::get(&mut d, "directory")?, cookie: d.u64("cookie")?, max: d.u32("max")? }
            }
            MDS_CREATE => Request::Create {
                dir: Fid::get(&mut d, "directory")?,
                name: name_of(&mut d, "name")?,
                mode: d.u32("mode")?,
                target: d.bytes("symlink target", SYMLINK_MAX + 1)?.to_vec(),
                layout: d.bytes("layout", LAYOUT_BYTES_MAX)?.to_vec(),
                rdev: d.u32("device number")?,
            },
            MDS_CREATE_OPEN => Request::CreateOpen {
                dir: Fid::get(&mut d, "directory")?,
                name: name_of(&mut d, "name")?,
                perms: d.u32("permissions")?,
                layout: d.bytes("layout", LAYOUT_BYTES_MAX)?.to_vec(),
                read: d.u8("read flag")? != 0,
                write: d.u8("write flag")? != 0,
            },
            MDS_LINK => Request::Link {
                fid: Fid::get(&mut d, "fid")?,
                dir: Fid::get(&mut d, "directory")?,
                name: name_of(&mut d, "name")?,
            },
            MDS_UNLINK => Request::Unlink {
                dir: Fid::get(&mut d, "directory")?,
                name: name_of(&mut d, "name")?,
                rmdir: d.u8("rmdir flag")? != 0,
            },
            MDS_RENAME => Request::Rename {
                src_dir: Fid::get(&mut d, "source directory")?,
                src_name: name_of(&mut d, "source name")?,
                dst_dir: Fid::get(&mut d, "target directory")?,
                dst_name: name_of(&mut d, "target name")?,
                noreplace: d.u8("noreplace flag")? != 0,
            },
            MDS_SETATTR => {
                let fid = Fid::get(&mut d, "fid")?;
                let set = SetAttr {
                    mask: d.u32("mask")?,
                    mode: d.u32("mode")?,
                    uid: d.u32("uid")?,
                    gid: d.u32("gid")?,
                    size: d.u64("size")?,
                    atime_ns: d.i64("atime")?,
                    mtime_ns: d.i64("mtime")?,
                    ost_blocks: d.u64("OST blocks")?,
                    handle: d.u64("handle")?,
                };
                if set.mask & !set::ALL != 0 {
                    return Err(ProtoError::Invalid(format!("setattr mask {:#x} has unknown bits", set.mask)));
                }
                Request::Setattr { fid, set }
            }
            MDS_OPEN => Request::Open {
                fid: Fid::get(&mut d, "fid")?,
                read: d.u8("read flag")? != 0,
                write: d.u8("write flag")? != 0,
                dom_read: d.u32("DoM read length")?,
            },
            MDS_OPEN_AT => Request::OpenAt {
                dir: Fid::get(&mut d, "directory")?,
                name: name_of(&mut d, "name")?,
                read: d.u8("read flag")? != 0,
                write: d.u8("write flag")? != 0,
                dom_read: d.u32("DoM read length")?,
            },
            MDS_CLOSE => Request::Close { handle: d.u64("handle")? },
            MDS_LOCK => {
                let (fid, handle, owner, pid) =
                    (Fid::get(&mut d, "fid")?, d.u64("handle")?, d.u64("lock owner")?, d.u32("pid")?);
                let (kind, flags) = (d.u8("lock kind")?, d.u8("lock flags")?);
                if kind > lock::UNLOCK {
                    return Err(ProtoError::Invalid(format!("lock kind {kind} (0 read, 1 write, 2 unlock)")));
                }
                if flags & !lock::FLAGS != 0 {
                    return Err(ProtoError::Invalid(format!("lock flags {flags:#x} have unknown bits")));
                }
                Request::Lock { fid, handle, owner, pid, kind, flags, start: d.u64("start")?, end: d.u64("end")? }
            }
            MDS_UNLOCK => Request::Unlock { fid: Fid::get(&mut d, "fid")?, owner: d.u64("lock owner")? },
            MDS_LEASES => Request::Leases { acked: d.u64("acknowledged revocation")? },
            MDS_READLINK => Request::Readlink { fid: Fid::get(&mut d, "fid")? },
            MDS_GETXATTR => Request::Getxattr { fid: Fid::get(&mut d, "fid")?, name: name_of(&mut d, "xattr name")? },
            MDS_SETXATTR => Request::Setxattr {
                fid: Fid::get(&mut d, "fid")?,
                name: name_of(&mut d, "xattr name")?,
                value: d.bytes("xattr value", XATTR_SIZE_MAX + 1)?.to_vec(),
                flags: d.u32("flags")?,
            },
            MDS_LISTXATTR => Request::Listxattr { fid: Fid::get(&mut d, "fid")? },
            MDS_REMOVEXATTR => {
                Request::Removexattr { fid: Fid::get(&mut d, "fid")?, name: name_of(&mut d, "xattr name")? }
            }
            MDS_GETLAYOUT => Request::Getlayout { fid: Fid::get(&mut d, "fid")? },
            MDS_SETDIRLAYOUT => Request::Setdirlayout {
                dir: Fid::get(&mut d, "directory")?,
                layout: d.bytes("layout", LAYOUT_BYTES_MAX)?.to_vec(),
            },
            MDS_DOM_READ => {
                Request::DomRead { fid: Fid::get(&mut d, "fid")?, offset: d.u64("offset")?, len: d.u32("length")? }
            }
            MDS_DOM_WRITE => {
                Request::DomWrite { fid: Fid::get(&mut d, "fid")?, offset: d.u64("offset")?, handle: d.u64("handle")? }
            }
            MDS_LAYOUT_INTENT => {
                Request::LayoutIntent { fid: Fid::get(&mut d, "fid")?, handle: d.u64("handle")?, end: d.u64("end")? }
            }
            MDS_MKDIR => Request::Mkdir {
                dir: Fid::get(&mut d, "directory")?,
                name: name_of(&mut d, "name")?,
                mode: d.u32("mode")?,
                mdt: d.u32("MDT index")? as i32,
                count: d.u32("stripe count")? as i32,
            },
            MDS_GETDIRSTRIPE => Request::Getdirstripe { dir: Fid::get(&mut d, "directory")? },
            MDS_SETDIRDEFAULT => Request::Setdirdefault {
                dir: Fid::get(&mut d, "directory")?,
                default: d.bytes("default", 64)?.to_vec(),
            },
            MDS_UPDATE => Request::Update {
                coordinator: d.u32("coordinator")?,
                xid: d.u64("update xid")?,
                acked_below: d.u64("acked xid")?,
                update: crate::dne::Update::get(&mut d)?,
            },
            _ => Request::Statfs,
        };
        d.end()?;
        Ok((creds, r))
    }
}

/// An MDS reply body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Attr(Attr),
    /// The attributes of a regular file some client has open for writing: its size is
    /// only what the last writer's close left, so the asker takes it from the objects (a
    /// glimpse).
    Writing(Attr),
    Entries {
        entries: Vec<(DirEntry, Attr)>,
        eof: bool,
    },
    Bytes(Vec<u8>),
    Names(Vec<String>),
    /// An open handle and the file's attributes; for a regular file also its layout and
    /// objects (as [`Reply::Layout`]; empty if not sent), so that its first IO needs no
    /// layout fetch, as Lustre's open reply carries the LOV EA. A create-open's also
    /// carries its directory as the create left it (`dir`): the kernel drops a directory's
    /// attributes at each create and asks for them at the next operation's permission
    /// check, which the mount then answers without a round trip.
    Opened {
        handle: u64,
        attr: Attr,
        layout: Vec<u8>,
        objects: Vec<Vec<(u32, u64)>>,
        dir: Option<Attr>,
    },
    StatFs {
        inodes: u64,
        bytes_used: u64,
        bytes_total: u64,
    },
    Done,
    /// A file's layout ([`crate::layout::Layout::encode`], empty if none) and its OST
    /// objects, per component: (OST index, object id) per stripe.
    Layout {
        layout: Vec<u8>,
        objects: Vec<Vec<(u32, u64)>>,
    },
    /// A directory's stripes and default ([`crate::dne`] encodings; empty: none).
    DirStripe {
        stripe: Vec<u8>,
        default: Vec<u8>,
    },
    /// The answers to a lookup-many, one per name, in the request's order.
    Looked(Vec<Looked>),
    /// A lock test's answer: a lock that conflicts (`kind` [`lock::UNLOCK`]: none), with
    /// the pid its owner gave.
    Lock {
        kind: u8,
        start: u64,
        end: u64,
        pid: u32,
    },
    /// Leases the client must give up, each numbered: it acknowledges them by the
    /// highest number in its next [`Request::Leases`].
    Revoked(Vec<(u64, lease::Key)>),
    /// A new regular file with OST objects: its attributes, layout and objects (as
    /// [`Reply::Layout`]). The client sends them back if it replays the create, so the
    /// file keeps the objects it may have written (as Lustre's create reply carries the
    /// LOV EA that its replay returns).
    Created {
        attr: Attr,
        layout: Vec<u8>,
        objects: Vec<Vec<(u32, u64)>>,
    },
}

/// One name's answer in [`Reply::Looked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Looked {
    Attr(Attr),
    /// As [`Reply::Writing`]: some client has the file open for writing.
    Writing(Attr),
    /// The name's error (a positive errno: ENOENT, ENAMETOOLONG, ...).
    Error(i32),
}

/// A file's objects, per component: the count, then per component its stripe count and
/// (OST index, object id) per stripe.
fn put_objects(mut e: Enc, objects: &[Vec<(u32, u64)>]) -> Enc {
    e = e.u32(objects.len() as u32);
    for c in objects {
        e = e.u32(c.len() as u32);
        for (ost, oid) in c {
            e = e.u32(*ost).u64(*oid);
        }
    }
    e
}

/// What [`put_objects`] wrote, with its counts bounded by the layout's limits.
fn get_objects(d: &mut Dec) -> Result<Vec<Vec<(u32, u64)>>, ProtoError> {
    let n = d.u32("component count")? as usize;
    if n > crate::layout::COMPONENTS_MAX {
        return Err(ProtoError::Invalid(format!("objects of {n} components")));
    }
    let mut objects = Vec::with_capacity(n);
    for _ in 0..n {
        let m = d.u32("stripe count")? as usize;
        if m > crate::layout::STRIPE_COUNT_MAX as usize {
            return Err(ProtoError::Invalid(format!("{m} stripes in one component")));
        }
        let mut c = Vec::with_capacity(m);
        for _ in 0..m {
            c.push((d.u32("OST")?, d.u64("object")?));
        }
        objects.push(c);
    }
    Ok(objects)
}

/// Bytes a reply's variable parts may hold (entries, names, values).
pub const REPLY_BYTES_MAX: usize = 1 << 20;

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let e = Enc::new(VERSION);
        match self {
            Reply::Attr(a) => a.put(e.u8(1)).done(),
            Reply::Entries { entries, eof } => {
                let mut e = e.u8(2).u8(*eof as u8).u32(entries.len() as u32);
                for (d, a) in entries {
                    e = a.put(d.fid.put(e.bytes(d.name.as_bytes())).u32(d.kind).u64(d.cookie));
                }
                e.done()
            }
            Reply::Bytes(b) => e.u8(3).bytes(b).done(),
            Reply::Names(n) => {
                let mut e = e.u8(4).u32(n.len() as u32);
                for s in n {
                    e = e.bytes(s.as_bytes());
                }
                e.done()
            }
            // Kind 15 is kind 5 with the directory after it.
            Reply::Opened { handle, attr, layout, objects, dir } => {
                let e = attr.put(e.u8(if dir.is_some() { 15 } else { 5 }).u64(*handle)).bytes(layout);
                let e = put_objects(e, objects);
                match dir {
                    Some(d) => d.put(e).done(),
                    None => e.done(),
                }
            }
            Reply::StatFs { inodes, bytes_used, bytes_total } => {
                e.u8(6).u64(*inodes).u64(*bytes_used).u64(*bytes_total).done()
            }
            Reply::Done => e.u8(7).done(),
            Reply::Layout { layout, objects } => put_objects(e.u8(8).bytes(layout), objects).done(),
            Reply::DirStripe { stripe, default } => e.u8(9).bytes(stripe).bytes(default).done(),
            Reply::Writing(a) => a.put(e.u8(10)).done(),
            Reply::Lock { kind, start, end, pid } => e.u8(12).u8(*kind).u64(*start).u64(*end).u32(*pid).done(),
            Reply::Revoked(v) => lease::encode_revoked(e.u8(13), v).done(),
            Reply::Created { attr, layout, objects } => put_objects(attr.put(e.u8(14)).bytes(layout), objects).done(),
            Reply::Looked(v) => {
                let mut e = e.u8(11).u32(v.len() as u32);
                for l in v {
                    e = match l {
                        Looked::Attr(a) => a.put(e.u8(1)),
                        Looked::Writing(a) => a.put(e.u8(2)),
                        Looked::Error(errno) => e.u8(3).u32(*errno as u32),
                    };
                }
                e.done()
            }
        }
    }

    /// The reply to a change, followed by what the change depended on: the transnos of
    /// the last changes to the inodes it changed that were not yet committed (at most
    /// [`DEPENDS_MAX`]). A replay of the change after a restart fails if one of those was
    /// lost (version-based recovery, as Lustre's).
    pub fn encode_depending(&self, depends: &[u64]) -> Vec<u8> {
        append_depends(self.encode(), depends)
    }

    pub fn decode(b: &[u8]) -> Result<Reply, ProtoError> {
        Ok(Reply::decode_depending(b)?.0)
    }

    /// A reply and what its change depended on (see [`Reply::encode_depending`]).
    pub fn decode_depending(b: &[u8]) -> Result<(Reply, Vec<u64>), ProtoError> {
        let mut d = Dec::new(b, "MDS reply", VERSION)?;
        let r = match d.u8("reply kind")? {
            1 => Reply::Attr(Attr::get(&mut d)?),
            10 => Reply::Writing(Attr::get(&mut d)?),
            12 => {
                Reply::Lock { kind: d.u8("lock kind")?, start: d.u64("start")?, end: d.u64("end")?, pid: d.u32("pid")? }
            }
            13 => Reply::Revoked(lease::decode_revoked(&mut d)?),
            14 => {
                let attr = Attr::get(&mut d)?;
                let layout = d.bytes("layout", LAYOUT_BYTES_MAX)?.to_vec();
                Reply::Created { attr, layout, objects: get_objects(&mut d)? }
            }
            2 => {
                let eof = d.u8("eof flag")? != 0;
                let n = d.u32("entry count")?;
                if n > READDIR_MAX {
                    return Err(ProtoError::Invalid(format!("{n} entries; at most {READDIR_MAX}")));
                }
                let mut entries = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let name = d.str("entry name", NAME_MAX)?.to_string();
                    let fid = Fid::get(&mut d, "entry fid")?;
                    let kind = d.u32("entry type")?;
                    let cookie = d.u64("cookie")?;
                    entries.push((DirEntry { name, fid, kind, cookie }, Attr::get(&mut d)?));
                }
                Reply::Entries { entries, eof }
            }
            3 => Reply::Bytes(d.bytes("value", REPLY_BYTES_MAX)?.to_vec()),
            4 => {
                let n = d.u32("name count")? as usize;
                if n > REPLY_BYTES_MAX / 4 {
                    return Err(ProtoError::Invalid(format!("{n} names in one reply")));
                }
                let mut names = Vec::new();
                for _ in 0..n {
                    names.push(d.str("xattr name", XATTR_NAME_MAX)?.to_string());
                }
                Reply::Names(names)
            }
            k @ (5 | 15) => {
                let handle = d.u64("handle")?;
                let attr = Attr::get(&mut d)?;
                let layout = d.bytes("layout", LAYOUT_BYTES_MAX)?.to_vec();
                let objects = get_objects(&mut d)?;
                let dir = if k == 15 { Some(Attr::get(&mut d)?) } else { None };
                Reply::Opened { handle, attr, layout, objects, dir }
            }
            6 => Reply::StatFs {
                inodes: d.u64("inodes")?,
                bytes_used: d.u64("bytes used")?,
                bytes_total: d.u64("bytes")?,
            },
            7 => Reply::Done,
            8 => {
                let layout = d.bytes("layout", LAYOUT_BYTES_MAX)?.to_vec();
                Reply::Layout { layout, objects: get_objects(&mut d)? }
            }
            9 => Reply::DirStripe {
                stripe: d.bytes("directory stripe", 8 + 16 * crate::dne::DIR_STRIPES_MAX + 8)?.to_vec(),
                default: d.bytes("directory default", 64)?.to_vec(),
            },
            11 => {
                let n = d.u32("answer count")? as usize;
                if n > LOOKUP_MANY_MAX {
                    return Err(ProtoError::Invalid(format!("{n} lookup answers; at most {LOOKUP_MANY_MAX}")));
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(match d.u8("answer kind")? {
                        1 => Looked::Attr(Attr::get(&mut d)?),
                        2 => Looked::Writing(Attr::get(&mut d)?),
                        3 => Looked::Error(d.u32("errno")? as i32),
                        k => return Err(ProtoError::Invalid(format!("lookup answer of unknown kind {k}"))),
                    });
                }
                Reply::Looked(v)
            }
            k => return Err(ProtoError::Invalid(format!("MDS reply of unknown kind {k}"))),
        };
        let mut depends = Vec::new();
        if !d.at_end() {
            let n = d.u8("dependency count")? as usize;
            if n == 0 || n > DEPENDS_MAX {
                return Err(ProtoError::Invalid(format!("{n} dependencies (1 to {DEPENDS_MAX})")));
            }
            for _ in 0..n {
                depends.push(d.u64("dependency")?);
            }
        }
        d.end()?;
        Ok((r, depends))
    }
}

/// Dependencies a change's reply names at most (see [`Reply::encode_depending`]).
pub const DEPENDS_MAX: usize = 8;

/// An encoded reply with what its change depended on after it (the first
/// [`DEPENDS_MAX`]; nothing when there are none).
pub fn append_depends(reply: Vec<u8>, depends: &[u64]) -> Vec<u8> {
    if depends.is_empty() {
        return reply;
    }
    let depends = &depends[..depends.len().min(DEPENDS_MAX)];
    let mut e = Enc(reply).u8(depends.len() as u8);
    for d in depends {
        e = e.u64(*d);
    }
    e.done()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_and_every_cut_is_an_error() {
        let f = Fid::new(0x2_0000_0400, 7);
        let creds = Creds { uid: 1000, gid: 100, groups: vec![4, 27], umask: 0o022 };
        let all = [
            Request::Getattr { fid: f },
            Request::Lookup { dir: f, name: "a".into() },
            Request::LookupMany { dir: f, names: vec!["a".into(), "b7".into()] },
            Request::LookupMany { dir: f, names: vec![] },
            Request::Readdir { dir: f, cookie: 9, max: 100 },
            Request::Create {
                dir: f,
                name: "l".into(),
                mode: mode::S_IFLNK | 0o777,
                target: b"t".to_vec(),
                layout: vec![],
                rdev: 0,
            },
            Request::Create {
                dir: f,
                name: "f".into(),
                mode: mode::S_IFREG,
                target: vec![],
                layout: vec![1, 2],
                rdev: 0,
            },
            Request::Create {
                dir: f,
                name: "c".into(),
                mode: mode::S_IFCHR | 0o600,
                target: vec![],
                layout: vec![],
                rdev: (1 << 8) | 3,
            },
            Request::Link { fid: f, dir: f, name: "b".into() },
            Request::Unlink { dir: f, name: "b".into(), rmdir: true },
            Request::Rename { src_dir: f, src_name: "x".into(), dst_dir: f, dst_name: "y".into(), noreplace: true },
            Request::Setattr {
                fid: f,
                set: SetAttr { mask: set::MODE | set::MTIME_NOW, mode: 0o600, ..Default::default() },
            },
            Request::Open { fid: f, read: true, write: false, dom_read: 0 },
            Request::OpenAt { dir: f, name: "o".into(), read: true, write: false, dom_read: 4096 },
            Request::CreateOpen { dir: f, name: "n".into(), perms: 0o600, layout: vec![], read: false, write: true },
            Request::Close { handle: 3 },
            Request::Lock {
                fid: f,
                handle: 3,
                owner: 0xdead_beef,
                pid: 42,
                kind: lock::WRITE,
                flags: lock::WAIT,
                start: 10,
                end: lock::EOF,
            },
            Request::Unlock { fid: f, owner: 7 },
            Request::Leases { acked: 9 },
            Request::Readlink { fid: f },
            Request::Getxattr { fid: f, name: "user.a".into() },
            Request::Setxattr { fid: f, name: "user.a".into(), value: vec![1, 2], flags: xattr::CREATE },
            Request::Listxattr { fid: f },
            Request::Removexattr { fid: f, name: "user.a".into() },
            Request::Statfs,
            Request::Getlayout { fid: f },
            Request::Setdirlayout { dir: f, layout: vec![3] },
            Request::DomRead { fid: f, offset: 5, len: 3901 },
            Request::DomWrite { fid: f, offset: 1 << 19, handle: 7 },
            Request::LayoutIntent { fid: f, handle: 7, end: 1 << 20 },
            Request::Mkdir { dir: f, name: "d".into(), mode: 0o755, mdt: 1, count: -1 },
            Request::Getdirstripe { dir: f },
            Request::Setdirdefault { dir: f, default: vec![4] },
            Request::Update {
                coordinator: 1,
                xid: 77,
                acked_below: 64,
                update: crate::dne::Update::Link { fid: f, delta: 1 },
            },
        ];
        for r in all {
            let (op, body) = r.encode(&creds);
            assert_eq!(Request::decode(op, &body), Ok((creds.clone(), r.clone())));
            for cut in 0..body.len() {
                assert!(Request::decode(op, &body[..cut]).is_err(), "{r:?} cut at {cut}");
            }
            let mut longer = body.clone();
            longer.push(0);
            assert_eq!(Request::decode(op, &longer), Err(ProtoError::Trailing { extra: 1 }));
        }
        assert!(Request::decode(999, &[1]).unwrap_err().to_string().contains("not an MDS operation"));
        let (op, body) = Request::Statfs.encode(&Creds { umask: 0o1022, ..Creds::default() });
        assert!(Request::decode(op, &body).unwrap_err().to_string().contains("umask 1022"));
        let many = Creds { groups: vec![0; GROUPS_MAX + 1], ..Creds::default() };
        let (op, body) = Request::Statfs.encode(&many);
        assert!(Request::decode(op, &body).unwrap_err().to_string().contains("supplementary groups"));
        let (op, body) = Request::Lookup { dir: f, name: "n".repeat(NAME_MAX * 4 + 1) }.encode(&creds);
        assert!(Request::decode(op, &body).unwrap_err().to_string().contains("longer than"));
        let names = vec!["n".to_string(); LOOKUP_MANY_MAX + 1];
        let (op, body) = Request::LookupMany { dir: f, names }.encode(&creds);
        assert!(Request::decode(op, &body).unwrap_err().to_string().contains("257 names in one lookup"));
        let bad_lock = |kind, flags| {
            let r = Request::Lock { fid: f, handle: 1, owner: 1, pid: 1, kind, flags, start: 0, end: 1 };
            let (op, body) = r.encode(&creds);
            Request::decode(op, &body).unwrap_err().to_string()
        };
        assert!(bad_lock(3, 0).contains("lock kind 3"), "{}", bad_lock(3, 0));
        assert!(bad_lock(lock::READ, 16).contains("lock flags 0x10"), "{}", bad_lock(lock::READ, 16));
        let b = Reply::Looked(vec![Looked::Error(2); LOOKUP_MANY_MAX + 1]).encode();
        assert!(Reply::decode(&b).unwrap_err().to_string().contains("lookup answers"));
        let a = Attr { fid: f, mode: mode::S_IFDIR | 0o755, nlink: 2, ..Attr::default() };
        let replies = [
            Reply::Attr(a),
            Reply::Entries {
                entries: vec![(DirEntry { name: "x".into(), fid: f, kind: mode::S_IFDIR, cookie: 77 }, a)],
                eof: true,
            },
            Reply::Bytes(b"v".to_vec()),
            Reply::Names(vec!["user.a".into(), "user.b".into()]),
            Reply::Opened { handle: 5, attr: a, layout: vec![], objects: vec![], dir: None },
            Reply::Opened { handle: 6, attr: a, layout: vec![4, 5], objects: vec![vec![(1, 7)]], dir: None },
            Reply::Opened { handle: 7, attr: a, layout: vec![4], objects: vec![vec![(2, 9)]], dir: Some(a) },
            Reply::Created { attr: a, layout: vec![4, 5], objects: vec![vec![(1, 7), (2, 9)]] },
            Reply::StatFs { inodes: 1, bytes_used: 2, bytes_total: 3 },
            Reply::Done,
            Reply::Layout { layout: vec![1, 2, 3], objects: vec![vec![], vec![(0, 5), (3, 9)]] },
            Reply::DirStripe { stripe: vec![1, 2], default: vec![] },
            Reply::Writing(a),
            Reply::Looked(vec![Looked::Attr(a), Looked::Error(errno::ENOENT), Looked::Writing(a)]),
            Reply::Looked(vec![]),
            Reply::Lock { kind: lock::READ, start: 0, end: 99, pid: 7 },
            Reply::Revoked(vec![(3, lease::Key::Attr(f)), (4, lease::Key::Name(f, "n".into()))]),
        ];
        for r in replies {
            let b = r.encode();
            assert_eq!(Reply::decode(&b), Ok(r.clone()));
            for cut in 0..b.len() {
                assert!(Reply::decode(&b[..cut]).is_err(), "{r:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn replies_carry_what_their_change_depended_on() {
        let a = Attr { fid: Fid::new(0x2_0000_0400, 7), mode: mode::S_IFREG | 0o644, ..Attr::default() };
        let b = Reply::Attr(a).encode_depending(&[41, 7]);
        assert_eq!(Reply::decode_depending(&b), Ok((Reply::Attr(a), vec![41, 7])));
        assert_eq!(Reply::decode(&b), Ok(Reply::Attr(a)), "a plain decode ignores them");
        assert_eq!(Reply::Done.encode_depending(&[]), Reply::Done.encode());
        let many: Vec<u64> = (1..=20).collect();
        let (_, kept) = Reply::decode_depending(&Reply::Done.encode_depending(&many)).unwrap();
        assert_eq!(kept, (1..=DEPENDS_MAX as u64).collect::<Vec<_>>());
        // A count out of bounds, or cut short, is refused.
        let plain = Reply::Done.encode();
        for bad in [vec![0u8], vec![9u8], vec![2u8, 1, 0, 0, 0, 0, 0, 0, 0]] {
            let mut m = plain.clone();
            m.extend_from_slice(&bad);
            assert!(Reply::decode_depending(&m).is_err(), "{bad:?}");
        }
    }

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
            rdev: 0,
        };
        let dev = Attr { mode: mode::S_IFBLK | 0o660, size: 0, rdev: (8 << 8) | 1, ..a };
        for a in [a, dev] {
            let b = a.encode();
            assert_eq!(Attr::decode(&b), Ok(a));
            for cut in 0..b.len() {
                assert!(Attr::decode(&b[..cut]).is_err());
            }
        }
        assert!(mode::is_reg(a.mode) && !mode::is_dir(a.mode) && !mode::is_lnk(a.mode));
        assert!(!mode::is_special(a.mode) && mode::is_special(dev.mode) && mode::is_device(dev.mode));
        for t in [mode::S_IFIFO, mode::S_IFSOCK] {
            assert!(mode::is_special(t) && !mode::is_device(t));
        }
    }
}
