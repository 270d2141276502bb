//! The namespace of one MDT in redb.
//!
//! Tables:
//! - `inodes`: FID → attributes (and a directory's parent, for rename's loop check);
//! - `dirents`: (directory, name hash, name) → (child, type). Entries sort by the FNV-1a
//!   hash of their name, which is also their readdir cookie, so a listing resumes after
//!   any entry however the directory changed meanwhile (Lustre's hash-ordered
//!   directories); the hash will also pick a striped directory's shard;
//! - `symlinks`, `xattrs`; `orphans` (unlinked files still open); `replies` (the answer of
//!   each change that carried a reply key, pruned as the client acknowledges them);
//! - `meta`: the MDT index and the FID allocator.
//!
//! **Group commit.** Changes queue; the first caller to find no commit running takes the
//! whole queue (up to `batch_max`), runs each change in one write transaction and commits
//! once; everyone's answer is handed back after that commit. A change checks everything
//! before it writes anything, so one that fails leaves nothing behind in the shared
//! transaction; a storage error fails the whole batch and nothing of it is kept.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use nacre_osd::SyncMode;
use nacre_osd::backend::VolumeBackend;
use nacre_proto::fid::{Fid, name_hash};
use nacre_proto::mdt::{Attr, DirEntry, NAME_MAX, SYMLINK_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX, errno, mode};
use nacre_raid::Volume;
use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, Table, TableDefinition, WriteTransaction,
};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const INODES: TableDefinition<u128, &[u8]> = TableDefinition::new("inodes");
const DIRENTS: TableDefinition<(u128, u64, &str), (u128, u32)> = TableDefinition::new("dirents");
const SYMLINKS: TableDefinition<u128, &[u8]> = TableDefinition::new("symlinks");
const XATTRS: TableDefinition<(u128, &str), &[u8]> = TableDefinition::new("xattrs");
const ORPHANS: TableDefinition<u128, u8> = TableDefinition::new("orphans");
const REPLIES: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("replies");

const FORMAT: u64 = 1;
/// Cookies 0 (start), 1 and 2 (`.` and `..` in a FUSE listing) are never an entry's.
const COOKIE_MIN: u64 = 3;
/// Hard links one inode may have (ext4's limit).
pub const LINK_MAX: u32 = 65_000;
/// Replies kept per client beyond what it has acknowledged.
pub const REPLIES_PER_CLIENT_MAX: usize = 1024;

/// Who asks: the caller's identity for permission checks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn root() -> Cred {
        Cred::default()
    }

    pub fn user(uid: u32, gid: u32) -> Cred {
        Cred { uid, gid, groups: Vec::new() }
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// A failed metadata operation: the errno and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdError {
    pub errno: i32,
    pub message: String,
}

impl MdError {
    pub fn new(errno: i32, message: impl Into<String>) -> MdError {
        MdError { errno, message: message.into() }
    }

    /// The status a reply carries (negated, as Lustre's).
    pub fn status(&self) -> i32 {
        -self.errno
    }
}

impl std::fmt::Display for MdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for MdError {}

fn storage<E: std::fmt::Display>(e: E) -> MdError {
    MdError::new(errno::EIO, format!("metadata storage: {e}"))
}

macro_rules! impl_storage {
    ($($t:ty),*) => {$(impl From<$t> for MdError { fn from(e: $t) -> Self { storage(e) } })*};
}
impl_storage!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    std::io::Error,
    nacre_proto::wire::ProtoError
);

pub type Result<T> = std::result::Result<T, MdError>;

/// Identifies a change for replay: the client's id and the request's xid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReplyKey {
    pub client: u64,
    pub xid: u64,
    /// Every xid of this client below this one has its reply: those records can go.
    pub acked_below: u64,
}

/// Attributes to change; `None` leaves one as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// Permission bits (the file type never changes).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    /// A time given explicitly, or `Some(None)` for "now" (`UTIME_NOW`).
    pub atime_ns: Option<Option<i64>>,
    pub mtime_ns: Option<Option<i64>>,
}

/// How a namespace runs.
#[derive(Debug, Clone, Copy)]
pub struct NamespaceOptions {
    pub sync: SyncMode,
    /// redb's page cache.
    pub cache_bytes: usize,
    /// Changes committed in one transaction at most.
    pub batch_max: usize,
}

impl Default for NamespaceOptions {
    fn default() -> Self {
        NamespaceOptions { sync: SyncMode::Ordered, cache_bytes: 64 << 20, batch_max: 256 }
    }
}

/// How a rename treats an existing target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace it (POSIX `rename`).
    Replace,
    /// Fail with EEXIST (`RENAME_NOREPLACE`).
    NoReplace,
}

/// What a change answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Attr(Attr),
    /// An open file: the handle and the attributes.
    Opened(u64, Attr),
    Done,
}

impl Answer {
    fn encode(&self) -> Vec<u8> {
        use nacre_proto::wire::Enc;
        match self {
            Answer::Attr(a) => a.put(Enc::new(1).u8(1)).done(),
            Answer::Opened(h, a) => a.put(Enc::new(1).u8(2).u64(*h)).done(),
            Answer::Done => Enc::new(1).u8(3).done(),
        }
    }

    fn decode(b: &[u8]) -> Result<Answer> {
        let mut d = nacre_proto::wire::Dec::new(b, "stored reply", 1)?;
        let a = match d.u8("kind")? {
            1 => Answer::Attr(Attr::get(&mut d)?),
            2 => {
                let h = d.u64("handle")?;
                Answer::Opened(h, Attr::get(&mut d)?)
            }
            3 => Answer::Done,
            k => return Err(storage(format!("stored reply of unknown kind {k}"))),
        };
        d.end()?;
        Ok(a)
    }
}

/// A queued change: runs against the shared transaction.
type Change = Box<dyn FnOnce(&mut Tx<'_>) -> Result<Answer> + Send>;

struct Queued {
    ticket: u64,
    key: Option<ReplyKey>,
    change: Change,
}

#[derive(Default)]
struct Commits {
    queue: Vec<Queued>,
    running: bool,
    next_ticket: u64,
    done: HashMap<u64, Result<Answer>>,
}

/// FID allocation: the current sequence of this MDT and its next object id.
#[derive(Debug, Clone, Copy)]
struct FidAlloc {
    seq_k: u32,
    next_oid: u32,
}

/// Open handles, in memory: they do not survive a restart (clients reopen, and files
/// unlinked while open are then removed).
#[derive(Default)]
struct Opens {
    next: u64,
    handles: HashMap<u64, u128>,
    counts: HashMap<u128, u32>,
}

/// Space and inodes of an MDT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MdtStatFs {
    pub inodes: u64,
    pub bytes_used: u64,
    pub bytes_total: u64,
}

pub struct Namespace {
    index: u32,
    db: Database,
    /// The database's length on the volume, and the room it has.
    db_len: Arc<std::sync::atomic::AtomicU64>,
    capacity: u64,
    opts: NamespaceOptions,
    alloc: Mutex<FidAlloc>,
    commits: Mutex<Commits>,
    committed: Condvar,
    opens: Mutex<Opens>,
    /// Transactions committed, and the changes in them.
    pub stats: NamespaceStats,
}

#[derive(Debug, Default)]
pub struct NamespaceStats {
    pub commits: std::sync::atomic::AtomicU64,
    pub changes: std::sync::atomic::AtomicU64,
    pub replayed: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Stored inode: the attributes and, for a directory, its parent.
fn encode_inode(a: &Attr, parent: Fid) -> Vec<u8> {
    parent.put(a.put(nacre_proto::wire::Enc::new(1))).done()
}

fn decode_inode(b: &[u8]) -> Result<(Attr, Fid)> {
    let mut d = nacre_proto::wire::Dec::new(b, "inode", 1)?;
    let a = Attr::get(&mut d)?;
    let p = Fid::get(&mut d, "parent")?;
    d.end()?;
    Ok((a, p))
}

/// The cookie (and sort position) of a name.
fn cookie_of(name: &str) -> u64 {
    name_hash(name.as_bytes()).clamp(COOKIE_MIN, u64::MAX - 1)
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(MdError::new(errno::EINVAL, format!("{name:?} cannot name a new entry")));
    }
    if name.len() > NAME_MAX {
        return Err(MdError::new(
            errno::ENAMETOOLONG,
            format!("name of {} bytes is longer than {NAME_MAX}", name.len()),
        ));
    }
    if name.contains('/') || name.contains('\0') {
        return Err(MdError::new(errno::EINVAL, format!("name {name:?} holds '/' or NUL")));
    }
    Ok(())
}

const R: u32 = 4;
const W: u32 = 2;
const X: u32 = 1;

/// POSIX access check of `want` (R|W|X) on `a` for `cred`.
fn may(cred: &Cred, a: &Attr, want: u32) -> bool {
    if cred.uid == 0 {
        // Root may do anything but execute a file that nobody may execute.
        return want & X == 0 || mode::is_dir(a.mode) || a.mode & 0o111 != 0;
    }
    let bits = if cred.uid == a.uid {
        (a.mode >> 6) & 7
    } else if cred.in_group(a.gid) {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    bits & want == want
}

fn denied(cred: &Cred, what: &str, a: &Attr) -> MdError {
    MdError::new(errno::EACCES, format!("uid {} may not {what} {} (mode {:o})", cred.uid, a.fid, a.mode & 0o7777))
}

/// One write transaction shared by a batch of changes.
pub struct Tx<'a> {
    txn: &'a WriteTransaction,
    ns: &'a Namespace,
    alloc: FidAlloc,
    now: i64,
    /// Inodes whose last link went while open: they become orphans.
    opens: &'a HashMap<u128, u32>,
}

impl Tx<'_> {
    fn inodes(&self) -> Result<Table<'_, u128, &'static [u8]>> {
        Ok(self.txn.open_table(INODES)?)
    }

    fn get(&self, fid: Fid) -> Result<(Attr, Fid)> {
        let t = self.inodes()?;
        let v = t.get(fid.key())?.ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {fid}")))?;
        decode_inode(v.value())
    }

    fn put(&self, a: &Attr, parent: Fid) -> Result<()> {
        self.inodes()?.insert(a.fid.key(), encode_inode(a, parent).as_slice())?;
        Ok(())
    }

    /// A directory the caller may change entries of (W and X).
    fn dir_for_change(&self, cred: &Cred, dir: Fid) -> Result<(Attr, Fid)> {
        let (d, p) = self.get(dir)?;
        if !mode::is_dir(d.mode) {
            return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
        }
        if d.nlink == 0 {
            return Err(MdError::new(errno::ENOENT, format!("directory {dir} was removed")));
        }
        if !may(cred, &d, W | X) {
            return Err(denied(cred, "change entries of", &d));
        }
        Ok((d, p))
    }

    fn lookup(&self, dir: Fid, name: &str) -> Result<Option<(Fid, u32)>> {
        let t = self.txn.open_table(DIRENTS)?;
        Ok(t.get((dir.key(), cookie_of(name), name))?.map(|v| {
            let (f, k) = v.value();
            (Fid::from_key(f), k)
        }))
    }

    fn new_fid(&mut self) -> Fid {
        let fid = Fid::new(Fid::seq_of(self.ns.index, self.alloc.seq_k), self.alloc.next_oid);
        if self.alloc.next_oid == u32::MAX {
            self.alloc.seq_k += 1;
            self.alloc.next_oid = 1;
        } else {
            self.alloc.next_oid += 1;
        }
        fid
    }

    /// Sticky directories: only the owner of the entry or of the directory (or root) may
    /// remove or rename it.
    fn sticky_ok(cred: &Cred, dir: &Attr, victim: &Attr) -> bool {
        dir.mode & mode::S_ISVTX == 0 || cred.uid == 0 || cred.uid == dir.uid || cred.uid == victim.uid
    }

    fn add_entry(&self, dir: Fid, name: &str, child: Fid, kind: u32) -> Result<()> {
        self.txn.open_table(DIRENTS)?.insert((dir.key(), cookie_of(name), name), (child.key(), kind))?;
        Ok(())
    }

    fn remove_entry(&self, dir: Fid, name: &str) -> Result<()> {
        self.txn.open_table(DIRENTS)?.remove((dir.key(), cookie_of(name), name))?;
        Ok(())
    }

    fn dir_is_empty(&self, dir: Fid) -> Result<bool> {
        let t = self.txn.open_table(DIRENTS)?;
        let k = dir.key();
        let mut r = t.range((k, 0, "")..(k + 1, 0, ""))?;
        Ok(r.next().is_none())
    }

    /// Touch a directory after its entries changed: mtime and ctime now, `nlink` by
    /// `dlink`.
    fn touch_dir(&self, mut d: Attr, parent: Fid, dlink: i64) -> Result<Attr> {
        d.mtime_ns = self.now;
        d.ctime_ns = self.now;
        d.nlink = (d.nlink as i64 + dlink).max(0) as u32;
        self.put(&d, parent)?;
        Ok(d)
    }

    /// Drop one link of `a`; the inode goes with its last link unless it is open.
    fn drop_link(&self, mut a: Attr, parent: Fid) -> Result<()> {
        a.nlink = a.nlink.saturating_sub(if mode::is_dir(a.mode) { a.nlink } else { 1 });
        a.ctime_ns = self.now;
        if a.nlink > 0 {
            return self.put(&a, parent);
        }
        if self.opens.get(&a.fid.key()).is_some_and(|&n| n > 0) {
            self.put(&a, parent)?;
            self.txn.open_table(ORPHANS)?.insert(a.fid.key(), 1)?;
            return Ok(());
        }
        self.destroy(a.fid)
    }

    /// Remove an inode and everything hanging off it.
    fn destroy(&self, fid: Fid) -> Result<()> {
        let k = fid.key();
        self.inodes()?.remove(k)?;
        self.txn.open_table(SYMLINKS)?.remove(k)?;
        self.txn.open_table(ORPHANS)?.remove(k)?;
        let mut x = self.txn.open_table(XATTRS)?;
        let names: Vec<String> = x
            .range((k, "")..(k + 1, ""))?
            .map(|e| e.map(|(key, _)| key.value().1.to_string()))
            .collect::<std::result::Result<_, _>>()?;
        for n in names {
            x.remove((k, n.as_str()))?;
        }
        Ok(())
    }

    /// Make a new inode named `name` in `dir`.
    fn make(&mut self, cred: &Cred, dir: Fid, name: &str, mode_bits: u32, kind: u32) -> Result<(Attr, Attr, Fid)> {
        check_name(name)?;
        let (d, dp) = self.dir_for_change(cred, dir)?;
        if let Some((f, _)) = self.lookup(dir, name)? {
            return Err(MdError::new(errno::EEXIST, format!("{name:?} exists in {dir} (as {f})")));
        }
        if kind == mode::S_IFDIR && d.nlink >= LINK_MAX {
            return Err(MdError::new(errno::EMLINK, format!("{dir} has {LINK_MAX} links")));
        }
        // A setgid directory passes its group (and, to subdirectories, the bit) down.
        let gid = if d.mode & mode::S_ISGID != 0 { d.gid } else { cred.gid };
        let mut perms = mode_bits & mode::PERMS;
        if kind == mode::S_IFDIR && d.mode & mode::S_ISGID != 0 {
            perms |= mode::S_ISGID;
        }
        let fid = self.new_fid();
        let a = Attr {
            fid,
            mode: kind | perms,
            nlink: if kind == mode::S_IFDIR { 2 } else { 1 },
            uid: cred.uid,
            gid,
            size: 0,
            blocks: 0,
            atime_ns: self.now,
            mtime_ns: self.now,
            ctime_ns: self.now,
        };
        self.put(&a, if kind == mode::S_IFDIR { dir } else { Fid::default() })?;
        self.add_entry(dir, name, fid, kind)?;
        let d = self.touch_dir(d, dp, if kind == mode::S_IFDIR { 1 } else { 0 })?;
        Ok((a, d, dp))
    }
}

impl Namespace {
    /// Make a new, empty namespace (a root directory owned by root, mode 0755) as MDT
    /// `index` on `[0, region)` of `volume`.
    pub fn format(volume: Arc<Volume>, index: u32, opts: NamespaceOptions) -> Result<Namespace> {
        volume.write(0, &[0u8; 8192]).map_err(storage)?;
        let ns = Namespace::open_db(volume, index, opts)?;
        let txn = ns.db.begin_write()?;
        {
            let mut m = txn.open_table(META)?;
            m.insert("format", FORMAT)?;
            m.insert("mdt_index", index as u64)?;
            m.insert("seq_k", 0)?;
            m.insert("next_oid", 1)?;
            let now = now_ns();
            let root = Attr {
                fid: Fid::ROOT,
                mode: mode::S_IFDIR | 0o755,
                nlink: 2,
                atime_ns: now,
                mtime_ns: now,
                ctime_ns: now,
                ..Attr::default()
            };
            if index == 0 {
                txn.open_table(INODES)?.insert(Fid::ROOT.key(), encode_inode(&root, Fid::ROOT).as_slice())?;
            }
            txn.open_table(DIRENTS)?;
            txn.open_table(SYMLINKS)?;
            txn.open_table(XATTRS)?;
            txn.open_table(ORPHANS)?;
            txn.open_table(REPLIES)?;
        }
        txn.commit()?;
        *lock(&ns.alloc) = FidAlloc { seq_k: 0, next_oid: 1 };
        Ok(ns)
    }

    /// Open an existing namespace. Files that were unlinked while open are removed: their
    /// handles did not survive.
    pub fn open(volume: Arc<Volume>, opts: NamespaceOptions) -> Result<Namespace> {
        let mut ns = Namespace::open_db(volume, 0, opts)?;
        let txn = ns.db.begin_read()?;
        let m = txn.open_table(META).map_err(|e| MdError::new(errno::EINVAL, format!("not a metadata target: {e}")))?;
        let get = |k: &str| -> Result<u64> {
            m.get(k)?
                .map(|v| v.value())
                .ok_or_else(|| MdError::new(errno::EINVAL, format!("metadata target lacks {k}")))
        };
        if get("format")? != FORMAT {
            return Err(MdError::new(errno::EINVAL, "metadata target of another format"));
        }
        ns.index = get("mdt_index")? as u32;
        *lock(&ns.alloc) = FidAlloc { seq_k: get("seq_k")? as u32, next_oid: get("next_oid")? as u32 };
        drop(m);
        drop(txn);
        let orphans: Vec<u128> = {
            let txn = ns.db.begin_read()?;
            let t = txn.open_table(ORPHANS)?;
            t.iter()?.map(|e| e.map(|(k, _)| k.value())).collect::<std::result::Result<_, _>>()?
        };
        if !orphans.is_empty() {
            let txn = ns.db.begin_write()?;
            {
                let opens = HashMap::new();
                let tx = Tx { txn: &txn, ns: &ns, alloc: *lock(&ns.alloc), now: now_ns(), opens: &opens };
                for k in orphans {
                    tx.destroy(Fid::from_key(k))?;
                }
            }
            txn.commit()?;
        }
        Ok(ns)
    }

    fn open_db(volume: Arc<Volume>, index: u32, opts: NamespaceOptions) -> Result<Namespace> {
        let size = volume.capacity();
        let backend = VolumeBackend::open(volume, 0, size, opts.sync)?;
        let db_len = backend.len_handle();
        let db = Database::builder().set_cache_size(opts.cache_bytes).create_with_backend(backend)?;
        Ok(Namespace {
            index,
            db,
            db_len,
            capacity: size,
            opts,
            alloc: Mutex::new(FidAlloc { seq_k: 0, next_oid: 1 }),
            commits: Mutex::new(Commits::default()),
            committed: Condvar::new(),
            opens: Mutex::new(Opens::default()),
            stats: NamespaceStats::default(),
        })
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    // ---- reads ----

    fn read_inode(&self, fid: Fid) -> Result<(Attr, Fid)> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(INODES)?;
        let v = t.get(fid.key())?.ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {fid}")))?;
        decode_inode(v.value())
    }

    pub fn getattr(&self, fid: Fid) -> Result<Attr> {
        Ok(self.read_inode(fid)?.0)
    }

    /// The entry `name` of `dir` with its attributes; needs search (X) permission on `dir`.
    pub fn lookup(&self, cred: &Cred, dir: Fid, name: &str) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(MdError::new(
                errno::ENAMETOOLONG,
                format!("name of {} bytes is longer than {NAME_MAX}", name.len()),
            ));
        }
        let txn = self.db.begin_read()?;
        let inodes = txn.open_table(INODES)?;
        let get = |f: Fid| -> Result<Attr> {
            let v = inodes.get(f.key())?.ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {f}")))?;
            Ok(decode_inode(v.value())?.0)
        };
        let d = get(dir)?;
        if !mode::is_dir(d.mode) {
            return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
        }
        if !may(cred, &d, X) {
            return Err(denied(cred, "search", &d));
        }
        let (_, parent) =
            decode_inode(inodes.get(dir.key())?.ok_or_else(|| MdError::new(errno::ENOENT, "gone"))?.value())?;
        let child = match name {
            "." => dir,
            ".." => parent,
            _ => {
                let t = txn.open_table(DIRENTS)?;
                let v = t
                    .get((dir.key(), cookie_of(name), name))?
                    .ok_or_else(|| MdError::new(errno::ENOENT, format!("no {name:?} in {dir}")))?;
                Fid::from_key(v.value().0)
            }
        };
        get(child)
    }

    /// Up to `max` entries of `dir` after `cookie` (0 starts), each with its attributes;
    /// `true` once the listing is complete. Needs read permission on `dir`.
    pub fn readdir(&self, cred: &Cred, dir: Fid, cookie: u64, max: usize) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        let txn = self.db.begin_read()?;
        let inodes = txn.open_table(INODES)?;
        let d = decode_inode(
            inodes.get(dir.key())?.ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {dir}")))?.value(),
        )?
        .0;
        if !mode::is_dir(d.mode) {
            return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
        }
        if !may(cred, &d, R) {
            return Err(denied(cred, "list", &d));
        }
        let t = txn.open_table(DIRENTS)?;
        let k = dir.key();
        let mut out = Vec::new();
        let mut last = None;
        for e in t.range((k, cookie.saturating_add(1), "")..(k + 1, 0, ""))? {
            let (key, v) = e?;
            let (_, hash, name) = key.value();
            // Never split a group of equal hashes: the cookie could not resume inside it.
            if out.len() >= max.max(1) && last != Some(hash) {
                return Ok((out, false));
            }
            let (child, kind) = v.value();
            let child = Fid::from_key(child);
            let a = match inodes.get(child.key())? {
                Some(v) => decode_inode(v.value())?.0,
                None => continue,
            };
            out.push((DirEntry { name: name.to_string(), fid: child, kind, cookie: hash }, a));
            last = Some(hash);
        }
        Ok((out, true))
    }

    pub fn readlink(&self, fid: Fid) -> Result<Vec<u8>> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(SYMLINKS)?;
        match t.get(fid.key())? {
            Some(v) => Ok(v.value().to_vec()),
            None => Err(MdError::new(errno::EINVAL, format!("{fid} is not a symlink"))),
        }
    }

    fn xattr_access(&self, cred: &Cred, a: &Attr, name: &str, want: u32) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return Err(MdError::new(errno::ERANGE, format!("xattr name of {} bytes", name.len())));
        }
        if name.starts_with("trusted.") || name.starts_with("security.") {
            if cred.uid != 0 && (want & W != 0 || name.starts_with("trusted.")) {
                return Err(MdError::new(errno::EPERM, format!("uid {} may not touch {name}", cred.uid)));
            }
            return Ok(());
        }
        if !name.starts_with("user.") {
            return Err(MdError::new(errno::EOPNOTSUPP, format!("xattr namespace of {name:?} is not supported")));
        }
        if !may(cred, a, want) {
            return Err(denied(cred, if want & W != 0 { "set xattrs of" } else { "read xattrs of" }, a));
        }
        Ok(())
    }

    pub fn getxattr(&self, cred: &Cred, fid: Fid, name: &str) -> Result<Vec<u8>> {
        let a = self.getattr(fid)?;
        self.xattr_access(cred, &a, name, R)?;
        let txn = self.db.begin_read()?;
        let t = txn.open_table(XATTRS)?;
        match t.get((fid.key(), name))? {
            Some(v) => Ok(v.value().to_vec()),
            None => Err(MdError::new(errno::ENODATA, format!("{fid} has no xattr {name}"))),
        }
    }

    /// Names of the xattrs the caller may see.
    pub fn listxattr(&self, cred: &Cred, fid: Fid) -> Result<Vec<String>> {
        self.getattr(fid)?;
        let txn = self.db.begin_read()?;
        let t = txn.open_table(XATTRS)?;
        let k = fid.key();
        let mut out = Vec::new();
        for e in t.range((k, "")..(k + 1, ""))? {
            let (key, _) = e?;
            let n = key.value().1;
            if !n.starts_with("trusted.") || cred.uid == 0 {
                out.push(n.to_string());
            }
        }
        Ok(out)
    }

    /// Inodes in use, and the bytes the database occupies of its volume.
    pub fn statfs(&self) -> Result<MdtStatFs> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(INODES)?;
        Ok(MdtStatFs {
            inodes: t.len()?,
            bytes_used: self.db_len.load(std::sync::atomic::Ordering::Acquire),
            bytes_total: self.capacity,
        })
    }

    // ---- changes ----

    /// Run one change through group commit; with a reply key, a change already run
    /// returns its stored answer.
    fn change(&self, key: Option<ReplyKey>, f: Change) -> Result<Answer> {
        let mut c = lock(&self.commits);
        let ticket = c.next_ticket;
        c.next_ticket += 1;
        c.queue.push(Queued { ticket, key, change: f });
        loop {
            if let Some(r) = c.done.remove(&ticket) {
                return r;
            }
            if !c.running {
                c.running = true;
                let n = c.queue.len().min(self.opts.batch_max.max(1));
                let batch: Vec<Queued> = c.queue.drain(..n).collect();
                drop(c);
                let results = self.commit(batch);
                c = lock(&self.commits);
                c.running = false;
                c.done.extend(results);
                self.committed.notify_all();
                continue;
            }
            c = self.committed.wait(c).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// One transaction for a batch of changes; their answers once it is committed.
    fn commit(&self, batch: Vec<Queued>) -> Vec<(u64, Result<Answer>)> {
        let tickets: Vec<u64> = batch.iter().map(|q| q.ticket).collect();
        let n = batch.len() as u64;
        match self.commit_inner(batch) {
            Ok(r) => {
                self.stats.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.stats.changes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                r
            }
            Err(e) => tickets.into_iter().map(|t| (t, Err(e.clone()))).collect(),
        }
    }

    fn commit_inner(&self, batch: Vec<Queued>) -> Result<Vec<(u64, Result<Answer>)>> {
        let txn = self.db.begin_write()?;
        let opens = lock(&self.opens).counts.clone();
        let mut tx = Tx { txn: &txn, ns: self, alloc: *lock(&self.alloc), now: now_ns(), opens: &opens };
        let mut out = Vec::with_capacity(batch.len());
        for q in batch {
            if let Some(k) = q.key {
                let stored = txn.open_table(REPLIES)?.get((k.client, k.xid))?.map(|v| v.value().to_vec());
                if let Some(b) = stored {
                    self.stats.replayed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    out.push((q.ticket, Answer::decode(&b)));
                    continue;
                }
            }
            let r = (q.change)(&mut tx);
            if let (Some(k), Ok(a)) = (q.key, &r) {
                let mut t = txn.open_table(REPLIES)?;
                t.insert((k.client, k.xid), a.encode().as_slice())?;
                // Records the client has acknowledged, and any beyond the bound, go.
                let mut old: Vec<u64> = t
                    .range((k.client, 0)..(k.client, k.acked_below))?
                    .map(|e| e.map(|(key, _)| key.value().1))
                    .collect::<std::result::Result<_, _>>()?;
                let kept = t.range((k.client, k.acked_below)..(k.client + 1, 0))?.count();
                if kept > REPLIES_PER_CLIENT_MAX {
                    old.extend(
                        t.range((k.client, k.acked_below)..(k.client + 1, 0))?
                            .take(kept - REPLIES_PER_CLIENT_MAX)
                            .map(|e| e.map(|(key, _)| key.value().1))
                            .collect::<std::result::Result<Vec<_>, _>>()?,
                    );
                }
                for x in old {
                    t.remove((k.client, x))?;
                }
            }
            out.push((q.ticket, r));
        }
        let alloc = tx.alloc;
        {
            let mut m = txn.open_table(META)?;
            m.insert("seq_k", alloc.seq_k as u64)?;
            m.insert("next_oid", alloc.next_oid as u64)?;
        }
        txn.commit()?;
        *lock(&self.alloc) = alloc;
        Ok(out)
    }

    fn attr_of(a: Answer) -> Result<Attr> {
        match a {
            Answer::Attr(a) | Answer::Opened(_, a) => Ok(a),
            Answer::Done => Err(storage("a change that makes an inode answered nothing")),
        }
    }

    /// Make a regular file `name` in `dir` with permission bits `perms`.
    pub fn create(&self, cred: &Cred, dir: Fid, name: &str, perms: u32, key: Option<ReplyKey>) -> Result<Attr> {
        let (cred, name) = (cred.clone(), name.to_string());
        Self::attr_of(
            self.change(
                key,
                Box::new(move |tx| Ok(Answer::Attr(tx.make(&cred, dir, &name, perms, mode::S_IFREG)?.0))),
            )?,
        )
    }

    pub fn mkdir(&self, cred: &Cred, dir: Fid, name: &str, perms: u32, key: Option<ReplyKey>) -> Result<Attr> {
        let (cred, name) = (cred.clone(), name.to_string());
        Self::attr_of(
            self.change(
                key,
                Box::new(move |tx| Ok(Answer::Attr(tx.make(&cred, dir, &name, perms, mode::S_IFDIR)?.0))),
            )?,
        )
    }

    pub fn symlink(&self, cred: &Cred, dir: Fid, name: &str, target: &[u8], key: Option<ReplyKey>) -> Result<Attr> {
        if target.is_empty() || target.len() > SYMLINK_MAX {
            return Err(MdError::new(
                if target.is_empty() { errno::ENOENT } else { errno::ENAMETOOLONG },
                format!("symlink target of {} bytes (1 to {SYMLINK_MAX})", target.len()),
            ));
        }
        let (cred, name, target) = (cred.clone(), name.to_string(), target.to_vec());
        Self::attr_of(self.change(
            key,
            Box::new(move |tx| {
                let (mut a, _, _) = tx.make(&cred, dir, &name, 0o777, mode::S_IFLNK)?;
                a.size = target.len() as u64;
                tx.put(&a, Fid::default())?;
                tx.txn.open_table(SYMLINKS)?.insert(a.fid.key(), target.as_slice())?;
                Ok(Answer::Attr(a))
            }),
        )?)
    }

    /// A new name `name` in `dir` for the existing file `fid`.
    pub fn link(&self, cred: &Cred, fid: Fid, dir: Fid, name: &str, key: Option<ReplyKey>) -> Result<Attr> {
        let (cred, name) = (cred.clone(), name.to_string());
        Self::attr_of(self.change(
            key,
            Box::new(move |tx| {
                check_name(&name)?;
                let (d, dp) = tx.dir_for_change(&cred, dir)?;
                let (mut a, p) = tx.get(fid)?;
                if mode::is_dir(a.mode) {
                    return Err(MdError::new(errno::EPERM, format!("{fid} is a directory: no hard links")));
                }
                if a.nlink == 0 {
                    return Err(MdError::new(errno::ENOENT, format!("{fid} was unlinked")));
                }
                if a.nlink >= LINK_MAX {
                    return Err(MdError::new(errno::EMLINK, format!("{fid} has {LINK_MAX} links")));
                }
                if tx.lookup(dir, &name)?.is_some() {
                    return Err(MdError::new(errno::EEXIST, format!("{name:?} exists in {dir}")));
                }
                a.nlink += 1;
                a.ctime_ns = tx.now;
                tx.put(&a, p)?;
                tx.add_entry(dir, &name, fid, a.mode & mode::S_IFMT)?;
                tx.touch_dir(d, dp, 0)?;
                Ok(Answer::Attr(a))
            }),
        )?)
    }

    /// Remove the entry `name` of `dir`: a non-directory (`rmdir` false) or an empty
    /// directory (`rmdir` true).
    pub fn remove(&self, cred: &Cred, dir: Fid, name: &str, rmdir: bool, key: Option<ReplyKey>) -> Result<()> {
        let (cred, name) = (cred.clone(), name.to_string());
        self.change(
            key,
            Box::new(move |tx| {
                if name == "." || name == ".." {
                    return Err(MdError::new(errno::EINVAL, format!("cannot remove {name:?}")));
                }
                let (d, dp) = tx.dir_for_change(&cred, dir)?;
                let (child, _) = tx
                    .lookup(dir, &name)?
                    .ok_or_else(|| MdError::new(errno::ENOENT, format!("no {name:?} in {dir}")))?;
                let (a, ap) = tx.get(child)?;
                let is_dir = mode::is_dir(a.mode);
                if rmdir && !is_dir {
                    return Err(MdError::new(errno::ENOTDIR, format!("{name:?} is not a directory")));
                }
                if !rmdir && is_dir {
                    return Err(MdError::new(errno::EISDIR, format!("{name:?} is a directory")));
                }
                if !Tx::sticky_ok(&cred, &d, &a) {
                    return Err(MdError::new(errno::EPERM, format!("{name:?} is in a sticky directory and not yours")));
                }
                if is_dir && !tx.dir_is_empty(child)? {
                    return Err(MdError::new(errno::ENOTEMPTY, format!("directory {name:?} is not empty")));
                }
                tx.remove_entry(dir, &name)?;
                tx.touch_dir(d, dp, if is_dir { -1 } else { 0 })?;
                tx.drop_link(a, ap)?;
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// Rename `src_dir/src_name` to `dst_dir/dst_name`.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        cred: &Cred,
        src_dir: Fid,
        src_name: &str,
        dst_dir: Fid,
        dst_name: &str,
        how: RenameMode,
        key: Option<ReplyKey>,
    ) -> Result<()> {
        let (cred, src_name, dst_name) = (cred.clone(), src_name.to_string(), dst_name.to_string());
        self.change(
            key,
            Box::new(move |tx| {
                check_name(&dst_name)?;
                if src_name == "." || src_name == ".." {
                    return Err(MdError::new(errno::EINVAL, format!("cannot rename {src_name:?}")));
                }
                let (sd, sdp) = tx.dir_for_change(&cred, src_dir)?;
                let (dd, ddp) = if dst_dir == src_dir { (sd, sdp) } else { tx.dir_for_change(&cred, dst_dir)? };
                let (child, kind) = tx
                    .lookup(src_dir, &src_name)?
                    .ok_or_else(|| MdError::new(errno::ENOENT, format!("no {src_name:?} in {src_dir}")))?;
                let (mut a, ap) = tx.get(child)?;
                if !Tx::sticky_ok(&cred, &sd, &a) {
                    return Err(MdError::new(
                        errno::EPERM,
                        format!("{src_name:?} is in a sticky directory and not yours"),
                    ));
                }
                let is_dir = mode::is_dir(a.mode);
                let victim = tx.lookup(dst_dir, &dst_name)?;
                if let Some((v, _)) = victim {
                    if v == child {
                        // Two names of one inode: POSIX says do nothing.
                        return Ok(Answer::Done);
                    }
                    if how == RenameMode::NoReplace {
                        return Err(MdError::new(errno::EEXIST, format!("{dst_name:?} exists in {dst_dir}")));
                    }
                }
                if is_dir && dst_dir != src_dir {
                    // No directory may move below itself.
                    let mut at = dst_dir;
                    loop {
                        if at == child {
                            return Err(MdError::new(
                                errno::EINVAL,
                                format!("cannot move directory {child} into its own subtree"),
                            ));
                        }
                        if at == Fid::ROOT {
                            break;
                        }
                        let (_, p) = tx.get(at)?;
                        if p == at || p == Fid::default() {
                            break;
                        }
                        at = p;
                    }
                    // Its `..` changes: that needs write permission on it.
                    if !may(&cred, &a, W) {
                        return Err(denied(&cred, "move", &a));
                    }
                }
                let victim = match victim {
                    Some((v, _)) => {
                        let (va, vp) = tx.get(v)?;
                        let v_dir = mode::is_dir(va.mode);
                        if is_dir && !v_dir {
                            return Err(MdError::new(errno::ENOTDIR, format!("{dst_name:?} is not a directory")));
                        }
                        if !is_dir && v_dir {
                            return Err(MdError::new(errno::EISDIR, format!("{dst_name:?} is a directory")));
                        }
                        if v_dir && !tx.dir_is_empty(v)? {
                            return Err(MdError::new(errno::ENOTEMPTY, format!("directory {dst_name:?} is not empty")));
                        }
                        if !Tx::sticky_ok(&cred, &dd, &va) {
                            return Err(MdError::new(
                                errno::EPERM,
                                format!("{dst_name:?} is in a sticky directory and not yours"),
                            ));
                        }
                        Some((va, vp, v_dir))
                    }
                    None => None,
                };
                if is_dir && victim.is_none() && dst_dir != src_dir && dd.nlink >= LINK_MAX {
                    return Err(MdError::new(errno::EMLINK, format!("{dst_dir} has {LINK_MAX} links")));
                }
                // Every check passed: now change.
                tx.remove_entry(src_dir, &src_name)?;
                if victim.is_some() {
                    tx.remove_entry(dst_dir, &dst_name)?;
                }
                tx.add_entry(dst_dir, &dst_name, child, kind)?;
                a.ctime_ns = tx.now;
                tx.put(&a, if is_dir { dst_dir } else { ap })?;
                let replaced_dir = victim.as_ref().is_some_and(|v| v.2);
                if src_dir == dst_dir {
                    tx.touch_dir(sd, sdp, if replaced_dir { -1 } else { 0 })?;
                } else {
                    tx.touch_dir(sd, sdp, if is_dir { -1 } else { 0 })?;
                    let (dd, ddp) = tx.get(dst_dir)?;
                    tx.touch_dir(
                        dd,
                        ddp,
                        if is_dir && !replaced_dir {
                            1
                        } else if replaced_dir && !is_dir {
                            -1
                        } else {
                            0
                        },
                    )?;
                }
                if let Some((va, vp, _)) = victim {
                    tx.drop_link(va, vp)?;
                }
                let _ = ddp;
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// Change attributes, with POSIX's rules on who may change what.
    pub fn setattr(&self, cred: &Cred, fid: Fid, s: SetAttr, key: Option<ReplyKey>) -> Result<Attr> {
        let cred = cred.clone();
        Self::attr_of(self.change(
            key,
            Box::new(move |tx| {
                let (mut a, p) = tx.get(fid)?;
                let owner = cred.uid == 0 || cred.uid == a.uid;
                if let Some(m) = s.mode {
                    if !owner {
                        return Err(MdError::new(
                            errno::EPERM,
                            format!("uid {} does not own {fid}: no chmod", cred.uid),
                        ));
                    }
                    if m & !mode::PERMS != 0 {
                        return Err(MdError::new(
                            errno::EINVAL,
                            format!("mode {m:o} has bits beyond {:o}", mode::PERMS),
                        ));
                    }
                }
                if let Some(u) = s.uid
                    && u != a.uid
                    && cred.uid != 0
                {
                    return Err(MdError::new(errno::EPERM, format!("only root may give {fid} to uid {u}")));
                }
                if let Some(g) = s.gid
                    && g != a.gid
                    && cred.uid != 0
                    && !(cred.uid == a.uid && cred.in_group(g))
                {
                    return Err(MdError::new(
                        errno::EPERM,
                        format!("uid {} may not give {fid} to group {g}", cred.uid),
                    ));
                }
                if let Some(size) = s.size {
                    if mode::is_dir(a.mode) {
                        return Err(MdError::new(errno::EISDIR, format!("{fid} is a directory: no truncate")));
                    }
                    if !mode::is_reg(a.mode) {
                        return Err(MdError::new(errno::EINVAL, format!("{fid} is not a regular file: no truncate")));
                    }
                    if !may(&cred, &a, W) {
                        return Err(denied(&cred, "truncate", &a));
                    }
                    if size > i64::MAX as u64 {
                        return Err(MdError::new(errno::EFBIG, format!("size {size} is too large")));
                    }
                }
                for t in [s.atime_ns, s.mtime_ns].into_iter().flatten() {
                    // Explicit times need ownership; "now" also suits a writer.
                    let ok = owner || (t.is_none() && may(&cred, &a, W));
                    if !ok {
                        return Err(MdError::new(errno::EPERM, format!("uid {} may not set times of {fid}", cred.uid)));
                    }
                }
                if let Some(m) = s.mode {
                    let mut m = m;
                    // Without the group, a non-root owner's chmod drops setgid.
                    if cred.uid != 0 && !cred.in_group(a.gid) {
                        m &= !mode::S_ISGID;
                    }
                    a.mode = (a.mode & mode::S_IFMT) | m;
                }
                if let Some(u) = s.uid {
                    a.uid = u;
                }
                if let Some(g) = s.gid {
                    a.gid = g;
                }
                if (s.uid.is_some() || s.gid.is_some()) && !mode::is_dir(a.mode) {
                    // A chown clears setuid and setgid of files.
                    a.mode &= !(mode::S_ISUID | mode::S_ISGID);
                }
                if let Some(size) = s.size {
                    a.size = size;
                    a.mtime_ns = tx.now;
                }
                if let Some(t) = s.atime_ns {
                    a.atime_ns = t.unwrap_or(tx.now);
                }
                if let Some(t) = s.mtime_ns {
                    a.mtime_ns = t.unwrap_or(tx.now);
                }
                a.ctime_ns = tx.now;
                tx.put(&a, p)?;
                Ok(Answer::Attr(a))
            }),
        )?)
    }

    /// Set xattr `name`; `create` fails if it exists (EEXIST), `replace` if it does not
    /// (ENODATA).
    #[allow(clippy::too_many_arguments)]
    pub fn setxattr(
        &self,
        cred: &Cred,
        fid: Fid,
        name: &str,
        value: &[u8],
        create: bool,
        replace: bool,
        key: Option<ReplyKey>,
    ) -> Result<()> {
        if value.len() > XATTR_SIZE_MAX {
            return Err(MdError::new(
                errno::ERANGE,
                format!("xattr value of {} bytes (at most {XATTR_SIZE_MAX})", value.len()),
            ));
        }
        let a = self.getattr(fid)?;
        self.xattr_access(cred, &a, name, W)?;
        let (name, value) = (name.to_string(), value.to_vec());
        self.change(
            key,
            Box::new(move |tx| {
                tx.get(fid)?;
                let mut t = tx.txn.open_table(XATTRS)?;
                let exists = t.get((fid.key(), name.as_str()))?.is_some();
                if create && exists {
                    return Err(MdError::new(errno::EEXIST, format!("{fid} has xattr {name} already")));
                }
                if replace && !exists {
                    return Err(MdError::new(errno::ENODATA, format!("{fid} has no xattr {name}")));
                }
                t.insert((fid.key(), name.as_str()), value.as_slice())?;
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    pub fn removexattr(&self, cred: &Cred, fid: Fid, name: &str, key: Option<ReplyKey>) -> Result<()> {
        let a = self.getattr(fid)?;
        self.xattr_access(cred, &a, name, W)?;
        let name = name.to_string();
        self.change(
            key,
            Box::new(move |tx| {
                let mut t = tx.txn.open_table(XATTRS)?;
                if t.remove((fid.key(), name.as_str()))?.is_none() {
                    return Err(MdError::new(errno::ENODATA, format!("{fid} has no xattr {name}")));
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// Open `fid` for reading and/or writing; returns a handle for `close`.
    pub fn open_file(&self, cred: &Cred, fid: Fid, read: bool, write: bool) -> Result<(u64, Attr)> {
        let a = self.getattr(fid)?;
        if a.nlink == 0 {
            return Err(MdError::new(errno::ENOENT, format!("{fid} was unlinked")));
        }
        if write && mode::is_dir(a.mode) {
            return Err(MdError::new(errno::EISDIR, format!("{fid} is a directory: not for writing")));
        }
        let want = if read { R } else { 0 } | if write { W } else { 0 };
        if !may(cred, &a, want) {
            return Err(denied(cred, "open", &a));
        }
        let mut o = lock(&self.opens);
        o.next += 1;
        let h = o.next;
        o.handles.insert(h, fid.key());
        *o.counts.entry(fid.key()).or_default() += 1;
        Ok((h, a))
    }

    /// Close a handle; the last close of a file unlinked meanwhile removes it.
    pub fn close_file(&self, handle: u64) -> Result<()> {
        let key = {
            let mut o = lock(&self.opens);
            let k = o
                .handles
                .remove(&handle)
                .ok_or_else(|| MdError::new(errno::EBADF, format!("no open handle {handle}")))?;
            let n = o.counts.entry(k).or_default();
            *n -= 1;
            if *n > 0 {
                return Ok(());
            }
            o.counts.remove(&k);
            k
        };
        self.change(
            None,
            Box::new(move |tx| {
                let orphan = tx.txn.open_table(ORPHANS)?.get(key)?.is_some();
                if orphan && tx.opens.get(&key).is_none_or(|&n| n == 0) {
                    tx.destroy(Fid::from_key(key))?;
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }
}
