//! The namespace of one MDT, in memory, with a write-ahead log and an image on its
//! volume.
//!
//! Tables ([`mem::Mem`]; the same ones in the image):
//! - inodes: FID → attributes (and a directory's parent, for rename's loop check);
//! - directory entries: per directory, (name hash, name) → (child, type). Entries sort by
//!   the FNV-1a hash of their name, which is also their readdir cookie, so a listing
//!   resumes after any entry however the directory changed meanwhile (Lustre's
//!   hash-ordered directories); the hash also picks a striped directory's shard;
//! - symlinks, xattrs, layouts, OST objects, OST blocks, DoM blocks; orphans (unlinked
//!   files still open); replies (the answer of each change that carried a reply key,
//!   pruned as the client acknowledges them); object pools and the destroy log; striped
//!   directories, directory defaults and intents (operations over several MDTs);
//! - meta: the MDT index, the FID allocator and the log position of the image.
//!
//! **A change.** It reserves its room in the log, takes the namespace's lock, checks and
//! applies itself in memory (each write an [`mem::Op`], whose inverse undoes it if the
//! change fails after writing), and stages its redo record with the next transno
//! ([`wal`]). Its caller then waits until the log writer has that transno on the drives:
//! the log is the only IO on the path, and one log write carries every change staged
//! meanwhile. Checkpoints copy the log into the image in the background ([`image`]).
//! A change may carry a reply key (client, xid): its answer is stored with it, so a
//! resent request gets the first answer back instead of running twice.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use nacre_osd::SyncMode;
use nacre_osd::backend::VolumeBackend;
use nacre_proto::fid::{Fid, name_hash};
use nacre_proto::layout::{Kind, Layout, Striping};
use nacre_proto::mdt::{Attr, DirEntry, NAME_MAX, SYMLINK_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX, errno, mode};
use nacre_proto::wire::Enc;

pub mod dne;
mod image;
pub mod mem;
pub mod wal;
use mem::{Inode, Mem, Op};
use nacre_raid::Volume;
use redb::Database;

/// The image's format: 2 since the namespace lives in memory (format 1 was redb with a
/// redo log of its own, read by older builds).
const FORMAT: u64 = 2;
/// Cookies 0 (start), 1 and 2 (`.` and `..` in a FUSE listing) are never an entry's.
const COOKIE_MIN: u64 = 3;
/// Not an errno: a change found it needs other MDTs (a remote inode, a striped
/// directory), and the MDS coordinates it over them instead ([`dne`]). Never stored as a
/// reply.
pub const NEEDS_COORDINATION: i32 = 0x1_0000;

fn coordinate(why: String) -> MdError {
    MdError::new(NEEDS_COORDINATION, why)
}

/// A resent request whose first copy began an operation over several MDTs: the
/// coordinator has its answer.
fn resent_intent() -> MdError {
    coordinate("resent: its operation over several MDTs has the answer".to_string())
}

/// ENAMETOOLONG for a name longer than [`NAME_MAX`].
fn name_fits(name: &str) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(MdError::new(
            errno::ENAMETOOLONG,
            format!("name of {} bytes is longer than {NAME_MAX}", name.len()),
        ));
    }
    Ok(())
}

/// The attributes of an entry whose inode lives on another MDT: its FID and type only.
pub fn remote_attr(fid: Fid, kind: u32) -> Attr {
    Attr { fid, mode: kind & mode::S_IFMT, ..Attr::default() }
}

/// Whether a call may wait for a lock: `No` on the transport's task, which must not
/// block (the call then answers `None` and is tried again where it may wait).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Wait {
    Yes,
    No,
}

/// What an open by name finds.
pub enum OpenAnswer {
    /// Opened here: the handle, the attributes, and the file's bytes if sent with them.
    Here((u64, Attr, Vec<u8>)),
    /// The entry's inode is on another MDT (these are its FID and type), to be opened there.
    Elsewhere(Attr),
}

/// EREMOTE if `dir` is a striped directory: its entries are in its shards.
fn striped_here(m: &Mem, dir: Fid) -> Result<()> {
    match m.dirstripes.get(&dir.key()) {
        Some(v) => {
            let s = nacre_proto::dne::DirStripe::decode(v)?;
            Err(MdError::new(
                errno::EREMOTE,
                format!("{dir} is striped over {} MDTs: its entries are in its shards", s.shards.len()),
            ))
        }
        None => Ok(()),
    }
}
/// Hard links one inode may have (ext4's limit).
pub const LINK_MAX: u32 = 65_000;
/// Replies kept per client beyond what it has acknowledged.
pub const REPLIES_PER_CLIENT_MAX: usize = 1024;
/// The log's share of the volume: an eighth, at most this.
pub const LOG_BYTES_MAX: u64 = 256 << 20;
/// Bytes of xattr names and values one inode may hold (ext4 with large xattrs in inodes
/// allows about this much in one block).
pub const XATTRS_BYTES_MAX: usize = 64 << 10;
/// The virtual xattr that reads a file's layout (Lustre's `lustre.lov`).
pub const LAYOUT_XATTR: &str = "lustre.lov";
/// What one readdir entry costs in a reply besides its name (type, cookie, FID and
/// attributes, with room to spare).
pub const READDIR_ENTRY_BYTES: usize = 128;
/// What a change without data logs at most, about (names, attributes, a reply record).
const CHANGE_BYTES: usize = 4096;
/// Bytes of a DoM block: small files take one.
pub const DOM_BLOCK: u64 = 64 << 10;
/// Bytes one DoM read or write moves at most.
pub const DOM_IO_MAX: usize = 1 << 20;
/// Handles one client may hold open.
pub const OPEN_HANDLES_PER_CLIENT_MAX: usize = 65_536;

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
    /// A digest of the request (opcode and body): a record whose digest differs belongs
    /// to another request that had the same xid (a later incarnation of the client).
    pub digest: u32,
}

/// A stored reply: the request's digest and its answer, success or failure.
struct Stored {
    digest: u32,
    answer: Result<Answer>,
}

impl Stored {
    fn encode(&self) -> Vec<u8> {
        let e = Enc::new(1).u32(self.digest);
        match &self.answer {
            Ok(a) => e.u8(0).bytes(&a.encode()).done(),
            Err(m) => e.u8(1).u32(m.errno as u32).bytes(m.message.as_bytes()).done(),
        }
    }

    fn decode(b: &[u8]) -> Result<Stored> {
        let mut d = nacre_proto::wire::Dec::new(b, "stored reply", 1)?;
        let digest = d.u32("digest")?;
        let answer = match d.u8("outcome")? {
            0 => Ok(Answer::decode(d.bytes("answer", 1 << 16)?)?),
            _ => {
                let errno = d.u32("errno")? as i32;
                Err(MdError::new(errno, d.str("message", 1 << 16)?))
            }
        };
        d.end()?;
        Ok(Stored { digest, answer })
    }
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
    /// The blocks the file's OST objects hold, as its writer glimpsed them: `blocks`
    /// becomes the DoM blocks plus these.
    pub ost_blocks: Option<u64>,
    /// The caller changes the file through a handle it opened for writing (checked by the
    /// MDS): a truncate needs no write permission now, as ftruncate(2).
    pub by_writer: bool,
}

/// How a namespace runs.
#[derive(Debug, Clone, Copy)]
pub struct NamespaceOptions {
    pub sync: SyncMode,
    /// redb's page cache, for the image (written by checkpoints, read at start-up).
    pub cache_bytes: usize,
    /// Bytes the tables may hold in memory (`mdt.*.memory_max`): past it, new inodes,
    /// names, xattrs and DoM data get ENOSPC, and removals still go.
    pub memory_max: u64,
    /// Checkpoints come at least this often while there are changes (and sooner when
    /// the log fills).
    pub checkpoint_interval: std::time::Duration,
    /// Changes answered before their commit are written within this (`mdt.*.commit_interval_ms`);
    /// a change someone waits for is written at once.
    pub commit_interval: std::time::Duration,
    /// A change that carries a reply key (a client's request) returns once it is on the
    /// drives (`mdt.*.sync_on_reply=1`); off, it returns once applied and staged, and
    /// its client keeps it until `last_committed` covers its transno (Lustre's way).
    /// Changes without a key (the MDT's own) always wait.
    pub sync_on_reply: bool,
}

impl Default for NamespaceOptions {
    fn default() -> Self {
        NamespaceOptions {
            sync: SyncMode::Ordered,
            cache_bytes: 16 << 20,
            memory_max: default_memory_max(),
            checkpoint_interval: wal::CHECKPOINT_INTERVAL,
            commit_interval: wal::COMMIT_INTERVAL,
            sync_on_reply: true,
        }
    }
}

/// A quarter of the machine's memory (at least 256 MiB): what one MDT may hold by
/// default.
pub fn default_memory_max() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb << 10)
    });
    (total.unwrap_or(4 << 30) / 4).max(256 << 20)
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
    /// An operation over several MDTs was begun as intent `id` (see [`dne`]).
    Intent(u64),
}

impl Answer {
    fn encode(&self) -> Vec<u8> {
        use nacre_proto::wire::Enc;
        match self {
            Answer::Attr(a) => a.put(Enc::new(1).u8(1)).done(),
            Answer::Opened(h, a) => a.put(Enc::new(1).u8(2).u64(*h)).done(),
            Answer::Done => Enc::new(1).u8(3).done(),
            Answer::Intent(id) => Enc::new(1).u8(4).u64(*id).done(),
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
            4 => Answer::Intent(d.u64("intent")?),
            k => return Err(storage(format!("stored reply of unknown kind {k}"))),
        };
        d.end()?;
        Ok(a)
    }
}

/// A change: checks and applies itself through a [`Tx`].
pub type Change = Box<dyn FnOnce(&mut Tx<'_>) -> Result<Answer> + Send>;

/// One OST's precreated objects not yet given to a file: ranges `[next, end)`, oldest
/// first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolState {
    pub ranges: std::collections::VecDeque<(u64, u64)>,
    /// The end of the last range ever added: objects of this OST at or past it were never
    /// recorded here (orphans of a precreate whose answer was lost).
    pub high: u64,
}

/// Ranges one OST's pool keeps at most (each one precreate batch).
const POOL_RANGES_MAX: usize = 64;

impl PoolState {
    pub fn available(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a).sum()
    }

    fn take(&mut self) -> Option<u64> {
        let (next, end) = self.ranges.front_mut()?;
        let oid = *next;
        *next += 1;
        if *next >= *end {
            self.ranges.pop_front();
        }
        Some(oid)
    }

    fn encode(&self) -> Vec<u8> {
        let mut e = Enc::new(1).u32(self.ranges.len() as u32);
        for (a, b) in &self.ranges {
            e = e.u64(*a).u64(*b);
        }
        e.u64(self.high).done()
    }

    fn decode(b: &[u8]) -> Result<PoolState> {
        let mut d = nacre_proto::wire::Dec::new(b, "object pool", 1)?;
        let n = d.u32("range count")? as usize;
        if n > POOL_RANGES_MAX {
            return Err(storage(format!("object pool of {n} ranges")));
        }
        let mut ranges = std::collections::VecDeque::with_capacity(n);
        for _ in 0..n {
            ranges.push_back((d.u64("range start")?, d.u64("range end")?));
        }
        let high = d.u64("high water")?;
        d.end()?;
        Ok(PoolState { ranges, high })
    }
}

/// A file's objects: per component, (OST index, object id) per stripe.
pub type FileObjects = Vec<Vec<(u32, u64)>>;

fn encode_objects(o: &FileObjects) -> Vec<u8> {
    let mut e = Enc::new(1).u32(o.len() as u32);
    for c in o {
        e = e.u32(c.len() as u32);
        for (ost, oid) in c {
            e = e.u32(*ost).u64(*oid);
        }
    }
    e.done()
}

fn decode_objects(b: &[u8]) -> Result<FileObjects> {
    let mut d = nacre_proto::wire::Dec::new(b, "file objects", 1)?;
    let n = d.u32("component count")? as usize;
    if n > nacre_proto::layout::COMPONENTS_MAX {
        return Err(storage(format!("objects of {n} components")));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let m = d.u32("stripe count")? as usize;
        if m > nacre_proto::layout::STRIPE_COUNT_MAX as usize {
            return Err(storage(format!("{m} stripes in one component")));
        }
        let mut c = Vec::with_capacity(m);
        for _ in 0..m {
            c.push((d.u32("OST")?, d.u64("object")?));
        }
        out.push(c);
    }
    d.end()?;
    Ok(out)
}

/// The OSTs files get objects on: their pools, and where round-robin placement is.
#[derive(Debug, Clone, Default)]
struct Pools {
    osts: BTreeMap<u32, PoolState>,
    rr: u64,
}

/// FID allocation: the current sequence of this MDT and its next object id.
#[derive(Debug, Clone, Copy)]
struct FidAlloc {
    seq_k: u32,
    next_oid: u32,
    /// Object ids below this (in sequence `seq_k`) are reserved in the database: FIDs
    /// under it need no write of the allocator, and a restart resumes from it.
    reserved: u32,
}

/// FIDs reserved at a time, so that the allocator is written once per this many creates.
const FID_RESERVE: u32 = 4096;

/// Open handles, in memory: they do not survive a restart (clients reopen, and files
/// unlinked while open are then removed).
#[derive(Default)]
struct Opens {
    next: u64,
    /// Handle → (inode, owning client, open for writing).
    handles: HashMap<u64, (u128, u64, bool)>,
    counts: HashMap<u128, u32>,
    /// Handles open for writing, per inode.
    writers: HashMap<u128, u32>,
    per_owner: HashMap<u64, usize>,
}

/// Space and inodes of an MDT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MdtStatFs {
    pub inodes: u64,
    pub bytes_used: u64,
    pub bytes_total: u64,
}

/// One MDT's namespace. Reads answer from memory; changes wait for their log write, so
/// their methods block: call them from blocking threads, or use [`Namespace::submit`]
/// from async code.
pub struct Namespace {
    index: u32,
    /// The log and its threads. Declared (so dropped) first: it writes and checkpoints
    /// everything staged before the image closes.
    wal: wal::Wal,
    mem: RwLock<Mem>,
    /// OST object pools, decoded, as the last change left them.
    pools: Mutex<Pools>,
    /// The image's length on the volume, and the room it has.
    db_len: Arc<std::sync::atomic::AtomicU64>,
    capacity: u64,
    /// `mdt.*.sync_on_reply` and `mdt.*.memory_max`, as set now.
    sync_on_reply: std::sync::atomic::AtomicBool,
    memory_max: std::sync::atomic::AtomicU64,
    alloc: Mutex<FidAlloc>,
    opens: Mutex<Opens>,
    /// OST pools by name, as the MGS last said (`None`: not heard yet).
    ost_pools: Mutex<Option<BTreeMap<String, Vec<u32>>>>,
    /// Log writes, changes, checkpoints.
    pub stats: Arc<NamespaceStats>,
}

#[derive(Debug, Default)]
pub struct NamespaceStats {
    /// Log writes (each carries every change staged meanwhile).
    pub commits: std::sync::atomic::AtomicU64,
    pub changes: std::sync::atomic::AtomicU64,
    /// Resent requests answered from their reply record.
    pub replayed: std::sync::atomic::AtomicU64,
    pub checkpoints: std::sync::atomic::AtomicU64,
    /// Log records replayed at start-up.
    pub recovered: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// The database's length after its next growth from `len` (redb doubles it, and past
/// 4 GiB adds 8 GiB at a time).
fn next_growth(len: u64) -> u64 {
    if len < 4 << 30 { len * 2 } else { len + (8 << 30) }
}

/// The cookie (and sort position) of a name.
fn cookie_of(name: &str) -> u64 {
    // 63 bits, as ext4's: a cookie is a directory offset (`loff_t`) and must not be
    // negative.
    (name_hash(name.as_bytes()) >> 1).clamp(COOKIE_MIN, i64::MAX as u64 - 1)
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(MdError::new(errno::EINVAL, format!("{name:?} cannot name a new entry")));
    }
    name_fits(name)?;
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

/// One change under way: its reads and writes of the tables, the redo record of its
/// writes, and their inverses.
pub struct Tx<'a> {
    mem: std::cell::RefCell<&'a mut Mem>,
    ns: &'a Namespace,
    alloc: FidAlloc,
    now: i64,
    /// Inodes whose last link went while open: they become orphans.
    opens: &'a HashMap<u128, u32>,
    /// The change's writes so far, encoded (see [`mem::Op::encode`]), and how many.
    log: std::cell::RefCell<Vec<u8>>,
    count: std::cell::Cell<u32>,
    /// The inverse of each write, in order.
    undo: std::cell::RefCell<Vec<Op>>,
    /// The object pools as this change leaves them, and the OSTs whose pool it changed.
    pools: std::cell::RefCell<Pools>,
    pools_changed: std::cell::RefCell<std::collections::BTreeSet<u32>>,
}

impl<'a> Tx<'a> {
    fn new(mem: &'a mut Mem, ns: &'a Namespace, opens: &'a HashMap<u128, u32>) -> Tx<'a> {
        Tx {
            mem: std::cell::RefCell::new(mem),
            ns,
            alloc: *lock(&ns.alloc),
            now: now_ns(),
            opens,
            log: Default::default(),
            count: Default::default(),
            undo: Default::default(),
            pools: std::cell::RefCell::new(lock(&ns.pools).clone()),
            pools_changed: Default::default(),
        }
    }

    /// The tables, to read.
    fn m(&self) -> std::cell::Ref<'_, &'a mut Mem> {
        self.mem.borrow()
    }

    /// Write: record `op` in the redo record, apply it, keep its inverse.
    fn apply(&self, op: Op) {
        let mut l = self.log.borrow_mut();
        *l = op.encode(Enc(std::mem::take(&mut *l))).0;
        self.count.set(self.count.get() + 1);
        let inverse = self.mem.borrow_mut().apply(op);
        self.undo.borrow_mut().push(inverse);
    }

    /// Undo every write so far, newest first, and forget them.
    fn roll_back(&self) {
        let undo = std::mem::take(&mut *self.undo.borrow_mut());
        let mut m = self.mem.borrow_mut();
        for op in undo.into_iter().rev() {
            m.apply(op);
        }
        self.log.borrow_mut().clear();
        self.count.set(0);
        *self.pools.borrow_mut() = lock(&self.ns.pools).clone();
        self.pools_changed.borrow_mut().clear();
    }

    fn get(&self, fid: Fid) -> Result<(Attr, Fid)> {
        let m = self.m();
        let i = m.inode(fid.key()).ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {fid}")))?;
        Ok((i.attr, i.parent))
    }

    fn mutations(&self) -> u32 {
        self.count.get()
    }

    /// The change's redo record.
    fn seal(&self) -> Vec<u8> {
        mem::encode_record(&self.log.borrow(), self.count.get())
    }

    fn put(&self, a: &Attr, parent: Fid) -> Result<()> {
        self.apply(Op::Inode(a.fid.key(), Some(Inode { attr: *a, parent })));
        Ok(())
    }

    fn put_symlink(&self, fid: Fid, target: &[u8]) -> Result<()> {
        self.apply(Op::Symlink(fid.key(), Some(target.into())));
        Ok(())
    }

    fn put_xattr(&self, fid: Fid, name: &str, value: &[u8]) -> Result<()> {
        self.apply(Op::Xattr(fid.key(), name.into(), Some(value.into())));
        Ok(())
    }

    /// Remove an xattr; false if there was none.
    fn del_xattr(&self, fid: Fid, name: &str) -> Result<bool> {
        let had = self.m().xattrs.contains_key(&(fid.key(), Box::<str>::from(name)));
        if had {
            self.apply(Op::Xattr(fid.key(), name.into(), None));
        }
        Ok(had)
    }

    fn put_layout(&self, fid: Fid, l: &Layout) -> Result<()> {
        self.apply(Op::Layout(fid.key(), Some(Arc::from(l.encode()))));
        Ok(())
    }

    fn del_layout(&self, fid: Fid) -> Result<()> {
        if self.m().layout(fid.key()).is_some() {
            self.apply(Op::Layout(fid.key(), None));
        }
        Ok(())
    }

    fn layout_of(&self, fid: Fid) -> Result<Option<Layout>> {
        match self.m().layout(fid.key()) {
            Some(v) => Ok(Some(Layout::decode(v)?)),
            None => Ok(None),
        }
    }

    /// The layout a new file in `dir` gets: `asked` if given, else the directory's
    /// default, else the file system's (the root's default, else one 1 MiB stripe); unset
    /// counts and sizes come from the file system default (Lustre's inheritance).
    fn layout_for_new_file(&self, dir: Fid, asked: Option<&Layout>) -> Result<Layout> {
        let root = self.layout_of(Fid::ROOT)?;
        let fs_default = root
            .as_ref()
            .and_then(|l| {
                l.components.iter().find_map(|c| match &c.kind {
                    Kind::Stripes(s) => Some(s.clone()),
                    Kind::Mdt => None,
                })
            })
            .map(|mut s| {
                s.fill_defaults(&Striping::fs_default());
                s
            })
            .unwrap_or_else(Striping::fs_default);
        let dir_default = match asked {
            Some(_) => None,
            None => self.layout_of(dir)?.or(root),
        };
        let mut l = match asked {
            Some(l) => l.clone(),
            None => Layout::inherited(dir_default.as_ref(), &fs_default),
        };
        // An MDT short of room puts no more new files' first bytes on itself: their
        // first striped component starts at 0 instead (as Lustre's dom_threshold_free_mb).
        if l.components.len() > 1 && l.components[0].kind == Kind::Mdt && !self.ns.has_room_for_dom() {
            l.components.remove(0);
            l.components[0].start = 0;
        }
        l.fill_defaults(&fs_default);
        l.validate().map_err(|e| MdError::new(errno::EINVAL, format!("layout: {e}")))?;
        self.ns.check_pools(&l)?;
        Ok(l)
    }

    /// Give a new file its OST objects: for each striped component, its stripe count
    /// of objects on consecutive OSTs from its starting one (round-robin when it has
    /// none), more than one per OST only when overstriping. Without OSTs attached a file
    /// has a layout and no objects.
    ///
    /// It checks before it takes: on an error nothing is taken. The objects are written
    /// with [`Tx::put_objects`].
    fn instantiate(&self, l: &Layout) -> Result<Option<FileObjects>> {
        let mut pools = self.pools.borrow_mut();
        let osts: Vec<u32> = pools.osts.keys().copied().collect();
        if osts.is_empty() {
            return Ok(None);
        }
        // Free placement (no starting OST) uses the OSTs that have objects, as Lustre
        // skips inactive OSTs; a starting OST is taken as asked.
        let ready: Vec<u32> =
            osts.iter().copied().filter(|o| pools.osts.get(o).is_some_and(|p| p.available() > 0)).collect();
        let mut objects: FileObjects = Vec::with_capacity(l.components.len());
        let mut want: Vec<(usize, u32)> = Vec::new();
        for c in &l.components {
            let Kind::Stripes(s) = &c.kind else {
                objects.push(Vec::new());
                continue;
            };
            let in_pool: Vec<u32>;
            let mut list: &[u32] = if s.offset < 0 && !ready.is_empty() { &ready } else { &osts };
            if let Some(p) = &s.pool {
                let members = self.ns.pool_osts(p)?;
                in_pool = list.iter().copied().filter(|o| members.contains(o)).collect();
                if in_pool.is_empty() {
                    return Err(MdError::new(
                        errno::ENOSPC,
                        format!("pool {p} has no OST this MDT has objects on (it lists {members:?})"),
                    ));
                }
                list = &in_pool;
            }
            let m = list.len() as u64;
            let count = match s.count {
                -1 => m,
                c if s.overstripe => c.max(1) as u64,
                c => (c.max(1) as u64).min(m),
            };
            let start = if s.offset >= 0 {
                list.iter().position(|&o| o == s.offset as u32).ok_or_else(|| {
                    MdError::new(
                        errno::EINVAL,
                        format!("layout starts on OST {}, which this file system does not have", s.offset),
                    )
                })? as u64
            } else {
                let at = pools.rr % m;
                pools.rr = pools.rr.wrapping_add(1);
                at
            };
            objects.push(Vec::with_capacity(count as usize));
            for i in 0..count {
                want.push((objects.len() - 1, list[((start + i) % m) as usize]));
            }
        }
        if want.len() > nacre_proto::layout::STRIPE_COUNT_MAX as usize {
            return Err(MdError::new(
                errno::EINVAL,
                format!(
                    "layout asks for {} objects; a file has at most {}",
                    want.len(),
                    nacre_proto::layout::STRIPE_COUNT_MAX
                ),
            ));
        }
        // Check every pool has what is asked before taking anything.
        let mut need: BTreeMap<u32, u64> = BTreeMap::new();
        for &(_, ost) in &want {
            *need.entry(ost).or_default() += 1;
        }
        for (ost, k) in &need {
            let have = pools.osts.get(ost).map_or(0, PoolState::available);
            if have < *k {
                return Err(MdError::new(
                    errno::ENOSPC,
                    format!(
                        "OST {ost} has {have} precreated objects and the file needs {k} (precreate is catching up)"
                    ),
                ));
            }
        }
        for (comp, ost) in want {
            let oid =
                pools.osts.get_mut(&ost).and_then(PoolState::take).ok_or_else(|| storage("object pool emptied"))?;
            objects[comp].push((ost, oid));
            self.pools_changed.borrow_mut().insert(ost);
        }
        Ok(Some(objects))
    }

    fn put_objects(&self, fid: Fid, objects: &FileObjects) -> Result<()> {
        self.apply(Op::Objects(fid.key(), Some(encode_objects(objects).into())));
        Ok(())
    }

    /// The file's DoM blocks `[first, last]` that exist.
    fn dom_blocks(&self, fid: Fid, first: u64, last: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        Ok(self.m().dom_of(fid.key(), first, last).map(|(b, v)| (b, v.to_vec())).collect())
    }

    fn put_dom(&self, fid: Fid, block: u64, data: &[u8]) -> Result<()> {
        self.apply(Op::Dom(fid.key(), block, Some(data.into())));
        Ok(())
    }

    fn del_dom(&self, fid: Fid, block: u64) -> Result<()> {
        if self.m().dom.contains_key(&(fid.key(), block)) {
            self.apply(Op::Dom(fid.key(), block, None));
        }
        Ok(())
    }

    /// Write `data` at `[offset, stop)` of file `fid`'s DoM blocks (the caller checked it
    /// is a regular file, the range lies in its DoM component, and the write is allowed);
    /// returns its attributes.
    fn write_dom_at(&mut self, fid: Fid, offset: u64, stop: u64, data: &[u8]) -> Result<Attr> {
        let (mut a, p) = self.get(fid)?;
        if data.is_empty() {
            return Ok(a);
        }
        let (first, last) = (offset / DOM_BLOCK, (stop - 1) / DOM_BLOCK);
        let mut old: HashMap<u64, Vec<u8>> = self.dom_blocks(fid, first, last)?.into_iter().collect();
        let mut added = 0u64;
        for b in first..=last {
            let start = b * DOM_BLOCK;
            let (lo, hi) = (offset.max(start), stop.min(start + DOM_BLOCK));
            let mut block = old.remove(&b).unwrap_or_default();
            let before = block.len() as u64;
            if (block.len() as u64) < hi - start {
                block.resize((hi - start) as usize, 0);
            }
            block[(lo - start) as usize..(hi - start) as usize]
                .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
            added += block.len() as u64 - before;
            self.put_dom(fid, b, &block)?;
        }
        a.size = a.size.max(stop);
        a.blocks += added.div_ceil(512);
        a.mtime_ns = self.now;
        a.ctime_ns = self.now;
        self.put(&a, p)?;
        Ok(a)
    }

    /// Cut the file's DoM data at `size`: blocks past it go, the block it ends in is cut.
    /// Returns the bytes removed.
    fn trim_dom(&self, fid: Fid, size: u64) -> Result<u64> {
        let blocks: Vec<(u64, u64)> =
            self.m().dom_of(fid.key(), size / DOM_BLOCK, u64::MAX).map(|(b, v)| (b, v.len() as u64)).collect();
        let mut removed = 0;
        for (b, len) in blocks {
            let start = b * DOM_BLOCK;
            if start >= size {
                self.del_dom(fid, b)?;
                removed += len;
            } else if start + len > size {
                let mut v = self.dom_blocks(fid, b, b)?.pop().map(|x| x.1).unwrap_or_default();
                v.truncate((size - start) as usize);
                removed += len - v.len() as u64;
                self.put_dom(fid, b, &v)?;
            }
        }
        Ok(removed)
    }

    fn put_orphan(&self, fid: Fid) -> Result<()> {
        self.apply(Op::Orphan(fid.key(), true));
        Ok(())
    }

    fn put_reply(&self, client: u64, xid: u64, v: &[u8]) -> Result<()> {
        self.apply(Op::Reply(client, xid, Some(v.into())));
        Ok(())
    }

    fn del_reply(&self, client: u64, xid: u64) -> Result<()> {
        self.apply(Op::Reply(client, xid, None));
        Ok(())
    }

    fn put_meta(&self, key: &str, v: u64) -> Result<()> {
        self.apply(Op::Meta(key.into(), Some(v)));
        Ok(())
    }

    fn meta(&self, key: &str) -> Option<u64> {
        self.m().meta.get(key).copied()
    }

    /// Queue OST object `oid` of `ost` for destruction.
    fn put_destroy(&self, ost: u32, oid: u64) {
        self.apply(Op::Destroy(ost, oid, true));
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
        self.not_striped(dir)?;
        Ok((d, p))
    }

    fn lookup(&self, dir: Fid, name: &str) -> Result<Option<(Fid, u32)>> {
        Ok(self.m().entry(dir.key(), cookie_of(name), name).map(|(f, k)| (Fid::from_key(f), k)))
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

    /// Entry `name` (inode `child`) of a directory with attributes `d`, checked before
    /// `cred` removes it or a rename replaces it, in Linux's order (`may_delete`, then the
    /// file system): its inode is here, it is no striped directory (that needs the
    /// coordinator), the sticky bit lets `cred` (EPERM), it is a directory exactly when
    /// `dir` (ENOTDIR, EISDIR), and a directory is empty (ENOTEMPTY). Its attributes, the
    /// parent they record, and whether it is a directory.
    fn removable(&self, cred: &Cred, d: &Attr, child: Fid, name: &str, dir: bool) -> Result<(Attr, Fid, bool)> {
        self.local(child)?;
        let (a, ap) = self.get(child)?;
        let is_dir = mode::is_dir(a.mode);
        if is_dir && self.dir_stripe(child)?.is_some() {
            return Err(coordinate(format!("{name:?} is a striped directory")));
        }
        if !Tx::sticky_ok(cred, d, &a) {
            return Err(MdError::new(errno::EPERM, format!("{name:?} is in a sticky directory and not yours")));
        }
        if dir && !is_dir {
            return Err(MdError::new(errno::ENOTDIR, format!("{name:?} is not a directory")));
        }
        if !dir && is_dir {
            return Err(MdError::new(errno::EISDIR, format!("{name:?} is a directory")));
        }
        if is_dir && !self.dir_is_empty(child)? {
            return Err(MdError::new(errno::ENOTEMPTY, format!("directory {name:?} is not empty")));
        }
        Ok((a, ap, is_dir))
    }

    fn add_entry(&self, dir: Fid, name: &str, child: Fid, kind: u32) -> Result<()> {
        let (dir, hash, to) = (dir.key(), cookie_of(name), Some((child.key(), kind)));
        self.apply(Op::Dirent { dir, hash, name: name.into(), to });
        Ok(())
    }

    fn remove_entry(&self, dir: Fid, name: &str) -> Result<()> {
        self.apply(Op::Dirent { dir: dir.key(), hash: cookie_of(name), name: name.into(), to: None });
        Ok(())
    }

    fn dir_is_empty(&self, dir: Fid) -> Result<bool> {
        Ok(!self.m().has_entries(dir.key()))
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
            return self.put_orphan(a.fid);
        }
        self.destroy(&a, false)
    }

    /// Remove an inode and everything hanging off it (what its type can have: a symlink
    /// its target, a file its layout, objects and DoM data, a directory its default
    /// layout; an orphan its orphan record).
    fn destroy(&self, a: &Attr, orphan: bool) -> Result<()> {
        let (fid, k) = (a.fid, a.fid.key());
        self.apply(Op::Inode(k, None));
        if mode::is_lnk(a.mode) && self.m().symlinks.contains_key(&k) {
            self.apply(Op::Symlink(k, None));
        }
        if orphan && self.m().orphans.contains(&k) {
            self.apply(Op::Orphan(k, false));
        }
        if mode::is_reg(a.mode) || mode::is_dir(a.mode) {
            self.del_layout(fid)?;
        }
        if mode::is_dir(a.mode) {
            self.del_dir_stripe(fid)?;
            self.set_dir_default(fid, None)?;
        }
        if mode::is_reg(a.mode) {
            // The file's OST objects go to the destroy log, destroyed in the background.
            let objects = self.m().objects.get(&k).map(|v| decode_objects(v)).transpose()?;
            if let Some(objects) = objects {
                self.apply(Op::Objects(k, None));
                for (ost, oid) in objects.into_iter().flatten() {
                    self.put_destroy(ost, oid);
                }
            }
            self.trim_dom(fid, 0)?;
            if self.m().ost_blocks.contains_key(&k) {
                self.apply(Op::OstBlocks(k, None));
            }
        }
        let names: Vec<String> = self.m().xattrs_of(k).map(|(n, _)| n.to_string()).collect();
        for n in names {
            self.del_xattr(fid, &n)?;
        }
        Ok(())
    }

    /// Make a new inode named `name` in `dir`.
    fn make(
        &mut self,
        cred: &Cred,
        dir: Fid,
        name: &str,
        mode_bits: u32,
        kind: u32,
        layout: Option<&Layout>,
    ) -> Result<(Attr, Attr, Fid)> {
        check_name(name)?;
        // As Linux: an existing name is EEXIST before any write permission is asked (the
        // lookup needs search permission only).
        let (d, dp) = self.get(dir)?;
        if mode::is_dir(d.mode)
            && may(cred, &d, X)
            && d.nlink > 0
            && let Some((f, _)) = self.lookup(dir, name)?
        {
            return Err(MdError::new(errno::EEXIST, format!("{name:?} exists in {dir} (as {f})")));
        }
        self.dir_for_change(cred, dir)?;
        self.ns.room_to_grow(&self.m())?;
        let layout = if kind == mode::S_IFREG { Some(self.layout_for_new_file(dir, layout)?) } else { None };
        // The last check (a pool may be short): after it only writes.
        let objects = match &layout {
            Some(l) => self.instantiate(l)?,
            None => None,
        };
        // A setgid directory passes its group (and, to subdirectories, the bit) down.
        let gid = if d.mode & mode::S_ISGID != 0 { d.gid } else { cred.gid };
        let mut perms = mode_bits & mode::PERMS;
        if kind == mode::S_IFDIR {
            // mkdir never takes setuid or setgid from the caller.
            perms &= !(mode::S_ISUID | mode::S_ISGID);
            if d.mode & mode::S_ISGID != 0 {
                perms |= mode::S_ISGID;
            }
        } else if perms & (mode::S_ISGID | 0o010) == (mode::S_ISGID | 0o010) && cred.uid != 0 && !cred.in_group(gid) {
            // Linux's mode_strip_sgid: no setgid-executable file of a group one is not in.
            perms &= !mode::S_ISGID;
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
        if kind == mode::S_IFDIR
            && let Some(def) = self.dir_default_of(dir)?.and_then(|d| d.inherited())
        {
            self.set_dir_default(fid, Some(def))?;
        }
        if let Some(l) = &layout {
            self.put_layout(fid, l)?;
        }
        // A new subdirectory takes its parent's default file layout, as on Lustre (the
        // root's is the file system's default, which applies everywhere anyway).
        if kind == mode::S_IFDIR
            && dir != Fid::ROOT
            && let Some(l) = self.layout_of(dir)?
        {
            self.put_layout(fid, &l)?;
        }
        if let Some(o) = &objects {
            self.put_objects(fid, o)?;
        }
        self.add_entry(dir, name, fid, kind)?;
        let d = self.touch_dir(d, dp, if kind == mode::S_IFDIR { 1 } else { 0 })?;
        Ok((a, d, dp))
    }
}

impl Namespace {
    /// Make a new, empty namespace (a root directory owned by root, mode 0755) as MDT
    /// `index` on `volume`.
    pub fn format(volume: Arc<Volume>, index: u32, opts: NamespaceOptions) -> Result<Namespace> {
        volume.write(0, &[0u8; 8192]).map_err(storage)?;
        let (db_bytes, _) = Self::regions(&volume)?;
        let backend = VolumeBackend::open(volume.clone(), 0, db_bytes, opts.sync)?;
        let db = Database::builder().set_cache_size(opts.cache_bytes).create_with_backend(backend)?;
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate).map_err(storage)?;
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
        let mut ops = vec![
            Op::Meta("format".into(), Some(FORMAT)),
            Op::Meta("mdt_index".into(), Some(index as u64)),
            Op::Meta("seq_k".into(), Some(0)),
            Op::Meta("next_oid".into(), Some(1)),
        ];
        // The root lives on MDT 0.
        if index == 0 {
            ops.push(Op::Inode(Fid::ROOT.key(), Some(Inode { attr: root, parent: Fid::ROOT })));
        }
        {
            let mut w = image::Writer::open(&txn)?;
            for op in &ops {
                w.apply(op)?;
            }
        }
        wal::Position { generation: wal::fresh_generation(), transno: 1, at: 0 }.store(&txn)?;
        txn.commit()?;
        drop(db);
        Namespace::open(volume, opts)
    }

    /// Open an existing namespace: load its image, replay the log past it (and write
    /// what it replayed into the image). Files that were unlinked while open are
    /// removed: their handles did not survive.
    pub fn open(volume: Arc<Volume>, opts: NamespaceOptions) -> Result<Namespace> {
        let (db_bytes, log_bytes) = Self::regions(&volume)?;
        let backend = VolumeBackend::open(volume.clone(), 0, db_bytes, opts.sync)?;
        let db_len = backend.len_handle();
        let db = Arc::new(Database::builder().set_cache_size(opts.cache_bytes).create_with_backend(backend)?);
        match image::meta(&db, "format")? {
            Some(FORMAT) => {}
            Some(f) => {
                return Err(MdError::new(
                    errno::EINVAL,
                    format!(
                        "metadata target of format {f}; this build reads format {FORMAT} (format 1 is the redb \
                         MDT of builds before the memory-resident namespace: copy its files off with such a build)"
                    ),
                ));
            }
            None => return Err(MdError::new(errno::EINVAL, "not a metadata target: its image has no format")),
        }
        let index = image::meta(&db, "mdt_index")?
            .ok_or_else(|| MdError::new(errno::EINVAL, "metadata target lacks its MDT index"))?
            as u32;
        let mut mem = image::load(&db)?;
        let from = wal::Position::load(&db)?;
        let region = wal::Region { vol: volume, base: db_bytes, room: log_bytes };
        let (records, end) = region.replay(from)?;
        // What the log held goes into the image now, and the log starts over under a
        // new generation: records a crash left past the cut never pass for new ones.
        let pos = wal::Position {
            generation: wal::fresh_generation(),
            transno: from.transno + records.len() as u64,
            at: end.next_multiple_of(4096),
        };
        {
            let mut txn = db.begin_write()?;
            txn.set_durability(redb::Durability::Immediate).map_err(storage)?;
            {
                let mut w = image::Writer::open(&txn)?;
                for (_, r) in &records {
                    for op in mem::decode_record(r)? {
                        w.apply(&op)?;
                        mem.apply(op);
                    }
                }
            }
            pos.store(&txn)?;
            txn.commit()?;
        }
        let mut pools = Pools::default();
        for (ost, v) in &mem.pools {
            pools.osts.insert(*ost, PoolState::decode(v)?);
        }
        let meta = |k: &str| {
            mem.meta.get(k).copied().ok_or_else(|| MdError::new(errno::EINVAL, format!("metadata target lacks {k}")))
        };
        let (mut seq_k, mut next_oid) = (meta("seq_k")? as u32, meta("next_oid")? as u32);
        if next_oid == u32::MAX {
            // The sequence may be used up to its last id: start the next one.
            (seq_k, next_oid) = (seq_k + 1, 1);
        }
        let orphans: Vec<u128> = mem.orphans.iter().copied().collect();
        let stats = Arc::new(NamespaceStats::default());
        stats.recovered.store(records.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let ns = Namespace {
            index,
            wal: wal::Wal::start(region, &opts, db, pos, stats.clone()),
            mem: RwLock::new(mem),
            pools: Mutex::new(pools),
            db_len,
            capacity: db_bytes,
            sync_on_reply: std::sync::atomic::AtomicBool::new(opts.sync_on_reply),
            memory_max: std::sync::atomic::AtomicU64::new(opts.memory_max),
            alloc: Mutex::new(FidAlloc { seq_k, next_oid, reserved: next_oid }),
            opens: Mutex::new(Opens::default()),
            ost_pools: Mutex::new(None),
            stats,
        };
        for k in orphans {
            ns.change(
                None,
                Box::new(move |tx| {
                    match tx.get(Fid::from_key(k)) {
                        Ok((a, _)) => tx.destroy(&a, true)?,
                        // An orphan record without its inode: only the record goes.
                        Err(_) => tx.apply(Op::Orphan(k, false)),
                    }
                    Ok(Answer::Done)
                }),
            )?;
        }
        Ok(ns)
    }

    /// The volume's split: the image from 0, then the log.
    fn regions(volume: &Volume) -> Result<(u64, u64)> {
        let cap = volume.capacity() / 4096 * 4096;
        let log = (cap / 8).min(LOG_BYTES_MAX) / 4096 * 4096;
        // A quarter of the log holds one change: a DoM write of DOM_IO_MAX needs 8 MiB.
        if log < (4 << 20) {
            return Err(MdError::new(errno::ENOSPC, format!("a metadata volume of {cap} bytes is too small")));
        }
        Ok((cap - log, log))
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// ENOSPC for new inodes, names and DoM data once the tables hold `memory_max`
    /// bytes (`m`: the tables, as the caller holds them), or once the image's next
    /// growth would not fit its region: redb doubles its file below 4 GiB (and adds up
    /// to two 4 GiB regions beyond), and a growth that fails poisons it until a
    /// restart. Removals are let through, to free room.
    fn room_to_grow(&self, m: &Mem) -> Result<()> {
        let (held, max) = (m.bytes(), self.memory_max());
        if held >= max {
            static SAID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let e = MdError::new(
                errno::ENOSPC,
                format!(
                    "MDT {} holds {} MiB of metadata in memory, its limit (mdt.*.memory_max = {} MiB): \
                     no new files until some go or the limit is raised",
                    self.index,
                    held >> 20,
                    max >> 20
                ),
            );
            // Said in the log once a minute at most.
            let minute = (now_ns() / 60_000_000_000) as u64;
            if SAID.swap(minute, std::sync::atomic::Ordering::Relaxed) != minute {
                eprintln!("mdt: {}", e.message);
            }
            return Err(e);
        }
        let used = self.db_len.load(std::sync::atomic::Ordering::Acquire);
        if next_growth(used) > self.capacity {
            return Err(MdError::new(
                errno::ENOSPC,
                format!(
                    "the MDT's image fills {} MiB of {} MiB, and its next growth would not fit",
                    used >> 20,
                    self.capacity >> 20
                ),
            ));
        }
        Ok(())
    }

    /// The OST pools as the MGS defines them (`lov.pool.NAME` parameters): layouts may
    /// name only these, and their objects go only to their OSTs.
    pub fn set_ost_pools(&self, pools: BTreeMap<String, Vec<u32>>) {
        *lock(&self.ost_pools) = Some(pools);
    }

    /// The OSTs of pool `name`; EINVAL if there is no such pool.
    fn pool_osts(&self, name: &str) -> Result<Vec<u32>> {
        match &*lock(&self.ost_pools) {
            None => Err(MdError::new(
                errno::EINVAL,
                format!("layout names pool {name:?}, and this MDT has no pools (they come from the MGS)"),
            )),
            Some(p) => p.get(name).cloned().ok_or_else(|| {
                let known: Vec<&String> = p.keys().collect();
                MdError::new(
                    errno::EINVAL,
                    format!(
                        "layout names pool {name:?}, which is not defined (pools: {known:?}; lov.pool.NAME on the MGS)"
                    ),
                )
            }),
        }
    }

    /// EINVAL unless every pool `l` names exists.
    fn check_pools(&self, l: &Layout) -> Result<()> {
        for c in &l.components {
            if let Kind::Stripes(Striping { pool: Some(p), .. }) = &c.kind {
                self.pool_osts(p)?;
            }
        }
        Ok(())
    }

    // ---- reads ----

    fn read_inode(&self, fid: Fid) -> Result<(Attr, Fid)> {
        let m = read(&self.mem);
        let i = m.inode(fid.key()).ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {fid}")))?;
        Ok((i.attr, i.parent))
    }

    pub fn getattr(&self, fid: Fid) -> Result<Attr> {
        Ok(self.read_inode(fid)?.0)
    }

    /// The entry `name` of `dir` with its attributes; needs search (X) permission on `dir`.
    pub fn lookup(&self, cred: &Cred, dir: Fid, name: &str) -> Result<Attr> {
        name_fits(name)?;
        let mut one = self.lookup_many(cred, dir, &[name])?;
        one.pop().unwrap_or_else(|| Err(storage("a lookup of one name answered none")))
    }

    /// Each of `names` in `dir`, in one read transaction (the client's statahead). The
    /// directory's own errors (missing, not a directory, no search permission, striped
    /// here) fail the whole call; a name's own (missing, too long) is its answer alone.
    pub fn lookup_many<S: AsRef<str>>(&self, cred: &Cred, dir: Fid, names: &[S]) -> Result<Vec<Result<Attr>>> {
        let m = read(&self.mem);
        let get = |f: Fid| -> Result<(Attr, Fid)> {
            let i = m.inode(f.key()).ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {f}")))?;
            Ok((i.attr, i.parent))
        };
        let (d, parent) = get(dir)?;
        if !mode::is_dir(d.mode) {
            return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
        }
        if !may(cred, &d, X) {
            return Err(denied(cred, "search", &d));
        }
        if names.iter().any(|n| !matches!(n.as_ref(), "." | "..")) {
            striped_here(&m, dir)?;
        }
        let one = |name: &str| -> Result<Attr> {
            name_fits(name)?;
            let (child, kind) = match name {
                "." => (dir, mode::S_IFDIR),
                ".." => (parent, mode::S_IFDIR),
                _ => {
                    let (f, k) = m
                        .entry(dir.key(), cookie_of(name), name)
                        .ok_or_else(|| MdError::new(errno::ENOENT, format!("no {name:?} in {dir}")))?;
                    (Fid::from_key(f), k)
                }
            };
            if child.mdt() != Some(self.index) {
                // Lustre's answer for a remote entry: its FID, whose sequence names the
                // MDT that has its attributes.
                return Ok(remote_attr(child, kind));
            }
            Ok(get(child)?.0)
        };
        Ok(names.iter().map(|n| one(n.as_ref())).collect())
    }

    /// Up to `max` entries of `dir` after `cookie` (0 starts), each with its attributes;
    /// `true` once the listing is complete. Needs read permission on `dir`.
    pub fn readdir(&self, cred: &Cred, dir: Fid, cookie: u64, max: usize) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        self.readdir_bounded(cred, dir, cookie, max, usize::MAX)
    }

    /// As [`Namespace::readdir`], with the page also bounded to about `max_bytes` of
    /// names and attributes ([`READDIR_ENTRY_BYTES`] plus the name per entry), so that it
    /// fits one reply.
    pub fn readdir_bounded(
        &self,
        cred: &Cred,
        dir: Fid,
        cookie: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        let m = read(&self.mem);
        let d = m.inode(dir.key()).ok_or_else(|| MdError::new(errno::ENOENT, format!("no inode {dir}")))?.attr;
        if !mode::is_dir(d.mode) {
            return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
        }
        if !may(cred, &d, R) {
            return Err(denied(cred, "list", &d));
        }
        striped_here(&m, dir)?;
        let mut out = Vec::new();
        let mut last = None;
        let mut bytes = 0usize;
        for (hash, e) in m.entries_after(dir.key(), cookie) {
            let name = &*e.name;
            bytes += READDIR_ENTRY_BYTES + name.len();
            if out.len() >= max.max(1) || (!out.is_empty() && bytes > max_bytes) {
                // Never split a group of equal hashes (the cookie could not resume inside
                // it): a page that would end inside one ends before it instead.
                if last != Some(hash) {
                    return Ok((out, false));
                }
                let keep = out.iter().take_while(|(e, _)| e.cookie != hash).count();
                if keep > 0 {
                    out.truncate(keep);
                    return Ok((out, false));
                }
            }
            let (child, kind) = (Fid::from_key(e.child), e.kind);
            let a = match m.inode(e.child) {
                Some(i) => i.attr,
                None if child.mdt() != Some(self.index) => remote_attr(child, kind),
                None => continue,
            };
            out.push((DirEntry { name: name.to_string(), fid: child, kind, cookie: hash }, a));
            last = Some(hash);
        }
        Ok((out, true))
    }

    pub fn readlink(&self, fid: Fid) -> Result<Vec<u8>> {
        self.getattr(fid)?;
        match read(&self.mem).symlinks.get(&fid.key()) {
            Some(v) => Ok(v.to_vec()),
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
        if !mode::is_reg(a.mode) && !mode::is_dir(a.mode) {
            // As Linux: user xattrs only on files and directories.
            return Err(MdError::new(
                errno::EPERM,
                format!("{} is neither a file nor a directory: no user xattrs", a.fid),
            ));
        }
        if !may(cred, a, want) {
            return Err(denied(cred, if want & W != 0 { "set xattrs of" } else { "read xattrs of" }, a));
        }
        Ok(())
    }

    pub fn getxattr(&self, cred: &Cred, fid: Fid, name: &str) -> Result<Vec<u8>> {
        let a = self.getattr(fid)?;
        if name == LAYOUT_XATTR {
            // The layout, as Lustre shows it through `lustre.lov` (here in Nacre's
            // encoding): what tools use to copy a file's striping.
            return match self.layout(fid)? {
                Some(l) => Ok(l.encode()),
                None => Err(MdError::new(errno::ENODATA, format!("{fid} has no layout"))),
            };
        }
        self.xattr_access(cred, &a, name, R)?;
        match read(&self.mem).xattrs.get(&(fid.key(), Box::<str>::from(name))) {
            Some(v) => Ok(v.to_vec()),
            None => Err(MdError::new(errno::ENODATA, format!("{fid} has no xattr {name}"))),
        }
    }

    /// Names of the xattrs the caller may see.
    pub fn listxattr(&self, cred: &Cred, fid: Fid) -> Result<Vec<String>> {
        self.getattr(fid)?;
        let m = read(&self.mem);
        Ok(m.xattrs_of(fid.key())
            .filter(|(n, _)| !n.starts_with("trusted.") || cred.uid == 0)
            .map(|(n, _)| n.to_string())
            .collect())
    }

    /// Whether `handle` is `owner`'s, on `fid`, and open for writing.
    pub fn writes_through(&self, handle: u64, fid: Fid, owner: u64) -> bool {
        lock(&self.opens).handles.get(&handle).is_some_and(|&(k, by, write)| k == fid.key() && by == owner && write)
    }

    /// Whether new files may keep their first bytes here (DoM): while the database can
    /// grow twice more. The last growth the volume holds is kept for inodes, so an MDT
    /// that DoM data filled still makes files (with their bytes on OSTs).
    pub fn has_room_for_dom(&self) -> bool {
        let used = self.db_len.load(std::sync::atomic::Ordering::Acquire);
        next_growth(next_growth(used)) <= self.capacity
    }

    /// Inodes in use, and the bytes the image occupies of its volume.
    pub fn statfs(&self) -> Result<MdtStatFs> {
        Ok(MdtStatFs {
            inodes: read(&self.mem).inode_count(),
            bytes_used: self.db_len.load(std::sync::atomic::Ordering::Acquire),
            bytes_total: self.capacity,
        })
    }

    // ---- changes ----

    /// Log bytes a change may take: its names and attributes, and its data with the
    /// DoM blocks it rewrites at both ends.
    fn reservation(weight: usize) -> u64 {
        (CHANGE_BYTES + weight) as u64 + if weight > 0 { 2 * DOM_BLOCK } else { 0 }
    }

    /// Run one change in memory (its room in the log reserved by the caller) and stage
    /// its record; returns its answer and the transno to wait for before answering (its
    /// own, or for a change that wrote nothing the last one staged, whose state it may
    /// have read). With a reply key, a change already run answers as it did then.
    fn run_change(&self, key: Option<ReplyKey>, change: Change, reserved: u64) -> Result<(Result<Answer>, u64)> {
        let r = self.run_reserved(key, change, reserved);
        if r.is_err() {
            self.wal.unreserve(reserved);
        }
        r
    }

    /// [`Namespace::run_change`]; an error gives the reservation back to the caller.
    fn run_reserved(&self, key: Option<ReplyKey>, change: Change, reserved: u64) -> Result<(Result<Answer>, u64)> {
        // Held to the end of the change: an open cannot slip in between the check that a
        // file is not open and its removal.
        let opens = lock(&self.opens);
        let mut mem = write(&self.mem);
        let mut tx = Tx::new(&mut mem, self, &opens.counts);
        let stored = key.and_then(|k| tx.m().replies.get(&(k.client, k.xid)).map(|v| (k, Stored::decode(v))));
        let mut answer = None;
        if let Some((k, stored)) = stored {
            match stored? {
                Stored { digest, answer: a } if digest == k.digest => {
                    self.stats.replayed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    answer = Some(a);
                }
                // An xid reused by a later incarnation of the client: the old record goes
                // and the request runs.
                _ => tx.del_reply(k.client, k.xid)?,
            }
        }
        let r = match answer {
            Some(a) => a,
            None => {
                // A panic inside a change must not leave half of it applied.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| change(&mut tx)))
                    .unwrap_or_else(|_| Err(MdError::new(errno::EIO, "the metadata change failed inside the server")));
                if r.is_err() && tx.mutations() > 0 {
                    // It failed after writing: nothing of it stays.
                    tx.roll_back();
                }
                if let Some(k) = key
                    && !r.as_ref().is_err_and(|e| e.errno == NEEDS_COORDINATION)
                {
                    tx.put_reply(k.client, k.xid, &Stored { digest: k.digest, answer: r.clone() }.encode())?;
                    self.prune_replies(&tx, k)?;
                }
                r
            }
        };
        let changed: Vec<u32> = tx.pools_changed.borrow().iter().copied().collect();
        for ost in changed {
            let v = tx.pools.borrow().osts.get(&ost).map(PoolState::encode).unwrap_or_default();
            tx.apply(Op::Pool(ost, Some(v.into())));
        }
        if tx.mutations() == 0 {
            self.wal.unreserve(reserved);
            return Ok((r, self.wal.last_transno()));
        }
        let mut alloc = tx.alloc;
        if alloc.seq_k != lock(&self.alloc).seq_k || alloc.next_oid > alloc.reserved {
            // Reserve the next stretch of FIDs: the log says where a restart resumes.
            alloc.reserved = alloc.next_oid.saturating_add(FID_RESERVE);
            tx.put_meta("seq_k", alloc.seq_k as u64)?;
            tx.put_meta("next_oid", alloc.reserved as u64)?;
        }
        let record = tx.seal();
        let pools = tx.pools.take();
        drop(tx);
        let transno = self.wal.stage(record, reserved)?;
        // Under the namespace's lock still: the next change starts from these.
        *lock(&self.alloc) = alloc;
        *lock(&self.pools) = pools;
        drop(mem);
        drop(opens);
        self.stats.changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok((r, transno))
    }

    /// Run one change and wait until it is on the drives; with a reply key, a change
    /// already run returns its stored answer.
    fn change(&self, key: Option<ReplyKey>, f: Change) -> Result<Answer> {
        self.change_weighted(key, f, 0)
    }

    /// As `change`, for a change that logs about `weight` bytes of data.
    fn change_weighted(&self, key: Option<ReplyKey>, f: Change, weight: usize) -> Result<Answer> {
        let reserved = Self::reservation(weight);
        self.wal.reserve(reserved, true)?;
        let (r, transno) = self.run_change(key, f, reserved)?;
        if self.waits_for_commit(key) {
            self.wal.wait_committed(transno)?;
        }
        r
    }

    /// Does a change with this key answer only once it is on the drives?
    fn waits_for_commit(&self, key: Option<ReplyKey>) -> bool {
        key.is_none() || self.sync_on_reply.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `mdt.*.sync_on_reply`: see [`NamespaceOptions::sync_on_reply`].
    pub fn set_sync_on_reply(&self, on: bool) {
        self.sync_on_reply.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn sync_on_reply(&self) -> bool {
        self.sync_on_reply.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `mdt.*.memory_max`: see [`NamespaceOptions::memory_max`].
    pub fn set_memory_max(&self, bytes: u64) {
        self.memory_max.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn memory_max(&self) -> u64 {
        self.memory_max.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// About the bytes the tables hold in memory (what `memory_max` bounds), and the
    /// inodes.
    pub fn memory_used(&self) -> (u64, u64) {
        let m = read(&self.mem);
        (m.bytes(), m.inode_count())
    }

    /// The log's bytes in use and its size.
    pub fn log_usage(&self) -> (u64, u64) {
        self.wal.usage()
    }

    /// Wait until every change answered so far is on the drives (`fsync`, `sync`).
    pub fn commit(&self) -> Result<()> {
        self.wal.wait_committed(self.wal.last_transno())
    }

    /// Wait until every change answered so far is in the image, so that the log holds
    /// none of it (for tests and for a clean stop).
    pub fn checkpoint(&self) -> Result<()> {
        self.wal.checkpoint()
    }

    /// Stop as a crash of the server would, for tests: changes staged and not yet
    /// written are lost, nothing is checkpointed, the image is never closed, and every
    /// change from now on fails.
    pub fn crash(&self) {
        self.wal.halt();
    }

    /// The highest transno given, and the highest on the drives (`last_committed`).
    pub fn transnos(&self) -> (u64, u64) {
        (self.wal.last_transno(), self.wal.last_committed())
    }

    /// Drop the records a client has acknowledged, and its oldest beyond the bound.
    fn prune_replies(&self, tx: &Tx<'_>, k: ReplyKey) -> Result<()> {
        let (mut old, kept): (Vec<u64>, usize) = {
            let m = tx.m();
            let old = m.replies.range((k.client, 0)..(k.client, k.acked_below)).map(|(key, _)| key.1).collect();
            (old, m.replies.range((k.client, k.acked_below)..=(k.client, u64::MAX)).count())
        };
        // Another MDT's steps are kept until it says their intents ended: dropping one
        // early could run it again after a restart.
        if kept > REPLIES_PER_CLIENT_MAX && !dne::is_coordinator_client(k.client) {
            let m = tx.m();
            let extra =
                m.replies.range((k.client, k.acked_below)..=(k.client, u64::MAX)).take(kept - REPLIES_PER_CLIENT_MAX);
            old.extend(extra.map(|(key, _)| key.1));
        }
        for x in old {
            tx.del_reply(k.client, x)?;
        }
        Ok(())
    }

    fn attr_of(a: Answer) -> Result<Attr> {
        match a {
            Answer::Attr(a) | Answer::Opened(_, a) => Ok(a),
            Answer::Done => Err(storage("a change that makes an inode answered nothing")),
            Answer::Intent(_) => Err(resent_intent()),
        }
    }

    /// A change's answer when it answers nothing but may have been resent.
    fn done(a: Answer) -> Result<()> {
        match a {
            Answer::Intent(_) => Err(resent_intent()),
            _ => Ok(()),
        }
    }

    /// Make a regular file `name` in `dir` with permission bits `perms`.
    pub fn create(&self, cred: &Cred, dir: Fid, name: &str, perms: u32, key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::create_change(cred, dir, name, perms))?)
    }

    /// The change `create` makes, for [`Namespace::submit`].
    pub fn create_change(cred: &Cred, dir: Fid, name: &str, perms: u32) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| Ok(Answer::Attr(tx.make(&cred, dir, &name, perms, mode::S_IFREG, None)?.0)))
    }

    /// Run a change from async code: in memory on the calling task (a few microseconds
    /// under the namespace's lock), then await its log write. Only a change that must
    /// wait for log room (a checkpoint behind) goes to a blocking thread.
    pub async fn submit(self: &Arc<Self>, key: Option<ReplyKey>, change: Change, weight: usize) -> Result<Answer> {
        let reserved = Self::reservation(weight);
        let (r, transno) = if self.wal.reserve(reserved, false)? {
            self.run_change(key, change, reserved)?
        } else {
            let ns = self.clone();
            tokio::task::spawn_blocking(move || {
                ns.wal.reserve(reserved, true)?;
                ns.run_change(key, change, reserved)
            })
            .await
            .map_err(|_| MdError::new(errno::EIO, "the metadata change was dropped"))??
        };
        if self.waits_for_commit(key) {
            self.wal.committed(transno).await?;
        }
        r
    }

    /// Make a regular file with the layout `layout` (`lfs setstripe` on a new file); it
    /// must validate. Without one the file inherits (see [`Namespace::layout`]).
    pub fn create_with_layout(
        &self,
        cred: &Cred,
        dir: Fid,
        name: &str,
        perms: u32,
        layout: Layout,
        key: Option<ReplyKey>,
    ) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::create_with_layout_change(cred, dir, name, perms, layout))?)
    }

    /// The change `create_with_layout` makes, for [`Namespace::submit`].
    pub fn create_with_layout_change(cred: &Cred, dir: Fid, name: &str, perms: u32, layout: Layout) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| Ok(Answer::Attr(tx.make(&cred, dir, &name, perms, mode::S_IFREG, Some(&layout))?.0)))
    }

    /// Set (or, with `None`, remove) the default layout of directory `dir`, which its new
    /// files inherit; on the root it is the file system's default. The owner or root may.
    pub fn set_dir_layout(&self, cred: &Cred, dir: Fid, layout: Option<Layout>, key: Option<ReplyKey>) -> Result<()> {
        self.change(key, self.set_dir_layout_change(cred, dir, layout)?)?;
        Ok(())
    }

    /// The change `set_dir_layout` makes (after checking the layout), for
    /// [`Namespace::submit`].
    pub fn set_dir_layout_change(&self, cred: &Cred, dir: Fid, layout: Option<Layout>) -> Result<Change> {
        if let Some(l) = &layout {
            l.validate().map_err(|e| MdError::new(errno::EINVAL, format!("layout: {e}")))?;
            self.check_pools(l)?;
        }
        let cred = cred.clone();
        Ok(Box::new(move |tx| {
            let (mut d, p) = tx.get(dir)?;
            if !mode::is_dir(d.mode) {
                return Err(MdError::new(
                    errno::ENOTDIR,
                    format!("{dir} is not a directory: a file's layout is set when it is made"),
                ));
            }
            if cred.uid != 0 && cred.uid != d.uid {
                return Err(MdError::new(errno::EPERM, format!("uid {} does not own {dir}", cred.uid)));
            }
            match &layout {
                Some(l) => tx.put_layout(dir, l)?,
                None => tx.del_layout(dir)?,
            }
            d.ctime_ns = tx.now;
            tx.put(&d, p)?;
            Ok(Answer::Done)
        }))
    }

    /// Where a file's DoM component ends, if its layout starts with one.
    fn dom_end(&self, fid: Fid) -> Result<Option<u64>> {
        Ok(self.layout(fid)?.and_then(|l| l.components.first().filter(|c| c.kind == Kind::Mdt).map(|c| c.end)))
    }

    /// Write `data` at `offset` of a file's DoM component (the bytes its layout keeps on
    /// the MDT). Bytes past the component belong to its OST components: EFBIG here.
    pub fn write_dom(
        &self,
        cred: &Cred,
        fid: Fid,
        offset: u64,
        data: &[u8],
        by_writer: bool,
        key: Option<ReplyKey>,
    ) -> Result<Attr> {
        let (change, weight) = self.write_dom_change(cred, fid, offset, data, by_writer)?;
        Self::attr_of(self.change_weighted(key, change, weight)?)
    }

    /// The change `write_dom` makes and the bytes it logs, for [`Namespace::submit`]; the
    /// checks that need no transaction are made here.
    /// `by_writer`: through a handle open for writing (checked by the MDS), so the write
    /// permission is not checked again.
    pub fn write_dom_change(
        &self,
        cred: &Cred,
        fid: Fid,
        offset: u64,
        data: &[u8],
        by_writer: bool,
    ) -> Result<(Change, usize)> {
        if data.len() > DOM_IO_MAX {
            return Err(MdError::new(
                errno::EINVAL,
                format!("DoM write of {} bytes (at most {DOM_IO_MAX})", data.len()),
            ));
        }
        let end =
            self.dom_end(fid)?.ok_or_else(|| MdError::new(errno::EINVAL, format!("{fid} keeps no data on the MDT")))?;
        self.room_to_grow(&read(&self.mem))?;
        let stop = offset.checked_add(data.len() as u64).filter(|&s| s <= end).ok_or_else(|| {
            MdError::new(
                errno::EFBIG,
                format!("DoM write of {} bytes at {offset} passes the component's end at {end}", data.len()),
            )
        })?;
        let (cred, data, weight) = (cred.clone(), data.to_vec(), data.len());
        Ok((
            Box::new(move |tx| {
                let (a, _) = tx.get(fid)?;
                if !mode::is_reg(a.mode) {
                    return Err(MdError::new(errno::EISDIR, format!("{fid} is not a regular file: no data")));
                }
                if !by_writer && !may(&cred, &a, W) {
                    return Err(denied(&cred, "write", &a));
                }
                Ok(Answer::Attr(tx.write_dom_at(fid, offset, stop, &data)?))
            }),
            weight,
        ))
    }

    /// See [`Namespace::create_with_data_change`].
    pub fn create_with_data(
        &self,
        cred: &Cred,
        dir: Fid,
        name: &str,
        perms: u32,
        data: &[u8],
        key: Option<ReplyKey>,
    ) -> Result<Attr> {
        let (change, weight) = self.create_with_data_change(cred, dir, name, perms, data)?;
        Self::attr_of(self.change_weighted(key, change, weight)?)
    }

    /// Make a regular file whose layout starts with a DoM component and write `data` at
    /// its start, in one change: a small file in one request instead of two. The file's
    /// layout is inherited as for any create; it must keep the data on the MDT.
    pub fn create_with_data_change(
        &self,
        cred: &Cred,
        dir: Fid,
        name: &str,
        perms: u32,
        data: &[u8],
    ) -> Result<(Change, usize)> {
        if data.len() > DOM_IO_MAX {
            return Err(MdError::new(
                errno::EINVAL,
                format!("data of {} bytes with a create (at most {DOM_IO_MAX})", data.len()),
            ));
        }
        self.room_to_grow(&read(&self.mem))?;
        let (cred, name, data, weight) = (cred.clone(), name.to_string(), data.to_vec(), data.len());
        Ok((
            Box::new(move |tx| {
                // Checked before anything is written: the layout the file will get.
                let l = tx.layout_for_new_file(dir, None)?;
                let end = l.components.first().filter(|c| c.kind == Kind::Mdt).map(|c| c.end).ok_or_else(|| {
                    MdError::new(
                        errno::EINVAL,
                        format!("a new file in {dir} keeps no data on the MDT (no DoM component)"),
                    )
                })?;
                if data.len() as u64 > end {
                    return Err(MdError::new(
                        errno::EFBIG,
                        format!("{} bytes with a create pass the DoM component's end at {end}", data.len()),
                    ));
                }
                let (a, _, _) = tx.make(&cred, dir, &name, perms, mode::S_IFREG, None)?;
                if data.is_empty() {
                    return Ok(Answer::Attr(a));
                }
                Ok(Answer::Attr(tx.write_dom_at(a.fid, 0, data.len() as u64, &data)?))
            }),
            weight,
        ))
    }

    /// Read up to `len` bytes at `offset` of a file's DoM component; short at the end of
    /// the file or of the component, zeros in holes.
    pub fn read_dom(&self, cred: &Cred, fid: Fid, offset: u64, len: usize) -> Result<Vec<u8>> {
        if len > DOM_IO_MAX {
            return Err(MdError::new(errno::EINVAL, format!("DoM read of {len} bytes (at most {DOM_IO_MAX})")));
        }
        let a = self.getattr(fid)?;
        if !mode::is_reg(a.mode) {
            return Err(MdError::new(errno::EISDIR, format!("{fid} is not a regular file: no data")));
        }
        if !may(cred, &a, R) {
            return Err(denied(cred, "read", &a));
        }
        let end =
            self.dom_end(fid)?.ok_or_else(|| MdError::new(errno::EINVAL, format!("{fid} keeps no data on the MDT")))?;
        let stop = offset.saturating_add(len as u64).min(a.size).min(end);
        if stop <= offset {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (stop - offset) as usize];
        let m = read(&self.mem);
        for (b, v) in m.dom_of(fid.key(), offset / DOM_BLOCK, (stop - 1) / DOM_BLOCK) {
            let start = b * DOM_BLOCK;
            let (lo, hi) = (offset.max(start), stop.min(start + v.len() as u64));
            if lo < hi {
                out[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&v[(lo - start) as usize..(hi - start) as usize]);
            }
        }
        Ok(out)
    }

    /// Give new files objects on these OSTs (from now on). An OST's pool starts empty and
    /// fills as precreated objects are added ([`Namespace::add_precreated`]).
    ///
    /// Attaching goes through group commit like any change, so no batch running at the
    /// same time can drop it, and it is recorded: a restart finds the OSTs attached.
    pub fn attach_osts(&self, osts: &[u32]) -> Result<()> {
        let osts = osts.to_vec();
        self.change(
            None,
            Box::new(move |tx| {
                let mut pools = tx.pools.borrow_mut();
                for o in osts {
                    if let std::collections::btree_map::Entry::Vacant(e) = pools.osts.entry(o) {
                        e.insert(PoolState::default());
                        tx.pools_changed.borrow_mut().insert(o);
                    }
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// Objects `[first, first + count)` of OST `ost` were made but will not be used (they
    /// could not be added to its pool): queue them for destruction.
    pub fn discard_objects(&self, ost: u32, first: u64, count: u64) -> Result<()> {
        if count > 1 << 16 || first.checked_add(count).is_none() {
            return Err(MdError::new(errno::EINVAL, format!("discarding {count} objects at {first}")));
        }
        self.change(
            None,
            Box::new(move |tx| {
                for oid in first..first + count {
                    tx.put_destroy(ost, oid);
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// Reclaim OST `ost`'s orphans below `next` (its next object id): the objects from the
    /// end of the last range this MDT recorded up to `next`, at most 4,096 per call, go to
    /// the destroy log and the high-water mark rises past them, in one change, so a
    /// precreate answer that arrives late can no longer add them to the pool. Returns
    /// true while some remain. An OST this MDT never precreated on is left alone.
    ///
    /// This assumes one MDT creates on the OST; with several (DNE), each needs its own
    /// object sequence there, as in Lustre.
    pub fn reclaim_orphans(&self, ost: u32, next: u64) -> Result<bool> {
        let more = self.change(
            None,
            Box::new(move |tx| {
                let mut pools = tx.pools.borrow_mut();
                let Some(p) = pools.osts.get_mut(&ost) else { return Ok(Answer::Done) };
                if p.high == 0 || p.high >= next {
                    return Ok(Answer::Done);
                }
                let upto = next.min(p.high.saturating_add(4096));
                for oid in p.high..upto {
                    tx.put_destroy(ost, oid);
                }
                p.high = upto;
                tx.pools_changed.borrow_mut().insert(ost);
                Ok(if upto < next { Answer::Attr(Attr::default()) } else { Answer::Done })
            }),
        )?;
        Ok(matches!(more, Answer::Attr(_)))
    }

    /// Each attached OST and how many precreated objects its pool holds.
    pub fn pool_levels(&self) -> Vec<(u32, u64)> {
        lock(&self.pools).osts.iter().map(|(o, p)| (*o, p.available())).collect()
    }

    /// Objects `[first, first + count)` now exist on OST `ost`: files may take them.
    pub fn add_precreated(&self, ost: u32, first: u64, count: u64) -> Result<()> {
        if count == 0 || first.checked_add(count).is_none() {
            return Err(MdError::new(errno::EINVAL, format!("precreated range {first}+{count}")));
        }
        self.change(
            None,
            Box::new(move |tx| {
                let mut pools = tx.pools.borrow_mut();
                let p = pools
                    .osts
                    .get_mut(&ost)
                    .ok_or_else(|| MdError::new(errno::EINVAL, format!("OST {ost} is not attached")))?;
                if p.ranges.len() >= POOL_RANGES_MAX {
                    return Err(MdError::new(
                        errno::ENOSPC,
                        format!("OST {ost}'s pool holds {POOL_RANGES_MAX} ranges already"),
                    ));
                }
                if first < p.high {
                    return Err(MdError::new(
                        errno::ESTALE,
                        format!("objects {first}+{count} of OST {ost} are below its high-water mark {}: reclaimed as orphans", p.high),
                    ));
                }
                if p.ranges.iter().any(|&(a, b)| first < b && a < first + count) {
                    return Err(MdError::new(
                        errno::EEXIST,
                        format!("objects {first}+{count} of OST {ost} are in its pool already"),
                    ));
                }
                p.ranges.push_back((first, first + count));
                p.high = p.high.max(first + count);
                tx.pools_changed.borrow_mut().insert(ost);
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// A file's OST objects (empty when it has none).
    pub fn objects(&self, fid: Fid) -> Result<FileObjects> {
        self.getattr(fid)?;
        match read(&self.mem).objects.get(&fid.key()) {
            Some(v) => decode_objects(v),
            None => Ok(Vec::new()),
        }
    }

    /// Up to `max` objects of removed files still to destroy, on OST `ost` or on any.
    pub fn pending_destroys(&self, ost: Option<u32>, max: usize) -> Result<Vec<(u32, u64)>> {
        let m = read(&self.mem);
        Ok(match ost {
            Some(o) => m.destroys.range((o, 0)..=(o, u64::MAX)).take(max).copied().collect(),
            None => m.destroys.iter().take(max).copied().collect(),
        })
    }

    /// These objects are destroyed on their OSTs: forget them.
    pub fn destroyed(&self, done: Vec<(u32, u64)>) -> Result<()> {
        if done.is_empty() {
            return Ok(());
        }
        self.change(
            None,
            Box::new(move |tx| {
                for (ost, oid) in done {
                    if tx.m().destroys.contains(&(ost, oid)) {
                        tx.apply(Op::Destroy(ost, oid, false));
                    }
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// The layout of a file, or the default layout of a directory (`None`: it has none
    /// and its files inherit the file system's).
    pub fn layout(&self, fid: Fid) -> Result<Option<Layout>> {
        self.getattr(fid)?;
        match read(&self.mem).layout(fid.key()) {
            Some(v) => Ok(Some(Layout::decode(v)?)),
            None => Ok(None),
        }
    }

    pub fn mkdir(&self, cred: &Cred, dir: Fid, name: &str, perms: u32, key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::mkdir_change(cred, dir, name, perms))?)
    }

    /// The change `mkdir` makes, for [`Namespace::submit`].
    pub fn mkdir_change(cred: &Cred, dir: Fid, name: &str, perms: u32) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| Ok(Answer::Attr(tx.make(&cred, dir, &name, perms, mode::S_IFDIR, None)?.0)))
    }

    pub fn symlink(&self, cred: &Cred, dir: Fid, name: &str, target: &[u8], key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::symlink_change(cred, dir, name, target)?)?)
    }

    /// The change `symlink` makes (after checking the target), for [`Namespace::submit`].
    pub fn symlink_change(cred: &Cred, dir: Fid, name: &str, target: &[u8]) -> Result<Change> {
        if target.is_empty() || target.len() > SYMLINK_MAX {
            return Err(MdError::new(
                if target.is_empty() { errno::ENOENT } else { errno::ENAMETOOLONG },
                format!("symlink target of {} bytes (1 to {SYMLINK_MAX})", target.len()),
            ));
        }
        let (cred, name, target) = (cred.clone(), name.to_string(), target.to_vec());
        Ok(Box::new(move |tx| {
            let (mut a, _, _) = tx.make(&cred, dir, &name, 0o777, mode::S_IFLNK, None)?;
            a.size = target.len() as u64;
            tx.put(&a, Fid::default())?;
            tx.put_symlink(a.fid, &target)?;
            Ok(Answer::Attr(a))
        }))
    }

    /// A new name `name` in `dir` for the existing file `fid`.
    pub fn link(&self, cred: &Cred, fid: Fid, dir: Fid, name: &str, key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::link_change(cred, fid, dir, name))?)
    }

    /// The change `link` makes, for [`Namespace::submit`].
    pub fn link_change(cred: &Cred, fid: Fid, dir: Fid, name: &str) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| {
            check_name(&name)?;
            let (d, dp) = tx.dir_for_change(&cred, dir)?;
            tx.local(fid)?;
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
        })
    }

    /// Remove the entry `name` of `dir`: a non-directory (`rmdir` false) or an empty
    /// directory (`rmdir` true).
    pub fn remove(&self, cred: &Cred, dir: Fid, name: &str, rmdir: bool, key: Option<ReplyKey>) -> Result<()> {
        Self::done(self.change(key, Self::remove_change(cred, dir, name, rmdir))?)
    }

    /// The change `remove` makes, for [`Namespace::submit`].
    pub fn remove_change(cred: &Cred, dir: Fid, name: &str, rmdir: bool) -> Change {
        let (cred, name) = (cred.clone(), name.to_string());
        Box::new(move |tx| {
            if name == "." || name == ".." {
                return Err(MdError::new(errno::EINVAL, format!("cannot remove {name:?}")));
            }
            let (d, dp) = tx.dir_for_change(&cred, dir)?;
            let (child, _) =
                tx.lookup(dir, &name)?.ok_or_else(|| MdError::new(errno::ENOENT, format!("no {name:?} in {dir}")))?;
            let (a, ap, is_dir) = tx.removable(&cred, &d, child, &name, rmdir)?;
            tx.remove_entry(dir, &name)?;
            tx.touch_dir(d, dp, if is_dir { -1 } else { 0 })?;
            tx.drop_link(a, ap)?;
            Ok(Answer::Done)
        })
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
        Self::done(self.change(key, Self::rename_change(cred, src_dir, src_name, dst_dir, dst_name, how))?)
    }

    /// The change `rename` makes, for [`Namespace::submit`].
    pub fn rename_change(
        cred: &Cred,
        src_dir: Fid,
        src_name: &str,
        dst_dir: Fid,
        dst_name: &str,
        how: RenameMode,
    ) -> Change {
        let (cred, src_name, dst_name) = (cred.clone(), src_name.to_string(), dst_name.to_string());
        Box::new(move |tx| {
            check_name(&dst_name)?;
            if src_name == "." || src_name == ".." {
                return Err(MdError::new(errno::EINVAL, format!("cannot rename {src_name:?}")));
            }
            let (sd, sdp) = tx.dir_for_change(&cred, src_dir)?;
            tx.local(dst_dir)?;
            let (dd, ddp) = if dst_dir == src_dir { (sd, sdp) } else { tx.dir_for_change(&cred, dst_dir)? };
            let (child, kind) = tx
                .lookup(src_dir, &src_name)?
                .ok_or_else(|| MdError::new(errno::ENOENT, format!("no {src_name:?} in {src_dir}")))?;
            tx.local(child)?;
            let (mut a, ap) = tx.get(child)?;
            if !Tx::sticky_ok(&cred, &sd, &a) {
                return Err(MdError::new(errno::EPERM, format!("{src_name:?} is in a sticky directory and not yours")));
            }
            let is_dir = mode::is_dir(a.mode);
            let victim = tx.lookup(dst_dir, &dst_name)?;
            if let Some((v, _)) = victim {
                if how == RenameMode::NoReplace {
                    return Err(MdError::new(errno::EEXIST, format!("{dst_name:?} exists in {dst_dir}")));
                }
                if v == child {
                    // Two names of one inode: POSIX says do nothing.
                    return Ok(Answer::Done);
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
                    tx.local(at)?;
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
                Some((v, _)) => Some(tx.removable(&cred, &dd, v, &dst_name, is_dir)?),
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
        })
    }

    /// Change attributes, with POSIX's rules on who may change what.
    pub fn setattr(&self, cred: &Cred, fid: Fid, s: SetAttr, key: Option<ReplyKey>) -> Result<Attr> {
        Self::attr_of(self.change(key, Self::setattr_change(cred, fid, s))?)
    }

    /// The change `setattr` makes, for [`Namespace::submit`].
    pub fn setattr_change(cred: &Cred, fid: Fid, s: SetAttr) -> Change {
        let cred = cred.clone();
        Box::new(move |tx| {
            tx.local(fid)?;
            if (s.mode.is_some() || s.uid.is_some() || s.gid.is_some()) && tx.dir_stripe(fid)?.is_some() {
                // Its shards take the same (see `dne`).
                return Err(coordinate(format!("{fid} is a striped directory")));
            }
            Self::setattr_change_plain(&cred, fid, s)(tx)
        })
    }

    /// As [`Namespace::setattr_change`], for the inode alone (a striped directory's
    /// master, whose shards the coordinator changes after it).
    pub fn setattr_change_plain(cred: &Cred, fid: Fid, s: SetAttr) -> Change {
        let cred = cred.clone();
        Box::new(move |tx| {
            let (mut a, p) = tx.get(fid)?;
            let owner = cred.uid == 0 || cred.uid == a.uid;
            let writer = s.by_writer || may(&cred, &a, W);
            if let Some(m) = s.mode {
                // What the kernel sends for a writer that is not the owner (Linux's
                // file_remove_privs on write and truncate): the mode less setuid and
                // setgid, nothing else changed.
                let privs = mode::S_ISUID | mode::S_ISGID;
                let drops_privs = m != a.mode & mode::PERMS
                    && m & !privs == a.mode & mode::PERMS & !privs
                    && m & privs & !a.mode == 0;
                let kills_privs = drops_privs && writer && mode::is_reg(a.mode);
                if !(owner || kills_privs) {
                    return Err(MdError::new(errno::EPERM, format!("uid {} does not own {fid}: no chmod", cred.uid)));
                }
                if m & !mode::PERMS != 0 {
                    return Err(MdError::new(errno::EINVAL, format!("mode {m:o} has bits beyond {:o}", mode::PERMS)));
                }
            }
            // Linux's chown_ok and chgrp_ok: the owner may "change" the owner to itself
            // and the group to one of its groups; anything else is root's.
            if let Some(u) = s.uid
                && cred.uid != 0
                && !(cred.uid == a.uid && u == a.uid)
            {
                return Err(MdError::new(errno::EPERM, format!("uid {} may not give {fid} to uid {u}", cred.uid)));
            }
            if let Some(g) = s.gid
                && cred.uid != 0
                && !(cred.uid == a.uid && (g == a.gid || cred.in_group(g)))
            {
                return Err(MdError::new(errno::EPERM, format!("uid {} may not give {fid} to group {g}", cred.uid)));
            }
            if s.ost_blocks.is_some() && (!mode::is_reg(a.mode) || !writer) {
                return Err(denied(&cred, "publish the blocks of", &a));
            }
            if let Some(size) = s.size {
                if mode::is_dir(a.mode) {
                    return Err(MdError::new(errno::EISDIR, format!("{fid} is a directory: no truncate")));
                }
                if !mode::is_reg(a.mode) {
                    return Err(MdError::new(errno::EINVAL, format!("{fid} is not a regular file: no truncate")));
                }
                if !writer {
                    return Err(denied(&cred, "truncate", &a));
                }
                if size > i64::MAX as u64 {
                    return Err(MdError::new(errno::EFBIG, format!("size {size} is too large")));
                }
            }
            for t in [s.atime_ns, s.mtime_ns].into_iter().flatten() {
                // Explicit times need ownership (EPERM); "now" also suits a writer
                // (EACCES otherwise).
                match t {
                    Some(_) if !owner => {
                        return Err(MdError::new(errno::EPERM, format!("uid {} may not set times of {fid}", cred.uid)));
                    }
                    None if !owner && !writer => return Err(denied(&cred, "touch", &a)),
                    _ => {}
                }
            }
            let group_exec = |m: u32| m & 0o010 != 0;
            if (s.uid.is_some() || s.gid.is_some()) && !mode::is_dir(a.mode) {
                // A chown clears setuid, and setgid where it means set-group-id (with
                // group execute).
                a.mode &= !mode::S_ISUID;
                if group_exec(a.mode) {
                    a.mode &= !mode::S_ISGID;
                }
            }
            if let Some(u) = s.uid {
                a.uid = u;
            }
            if let Some(g) = s.gid {
                a.gid = g;
            }
            if let Some(m) = s.mode {
                let mut m = m;
                // Without the (new) group, a non-root owner's chmod drops setgid.
                if cred.uid != 0 && !cred.in_group(a.gid) {
                    m &= !mode::S_ISGID;
                }
                a.mode = (a.mode & mode::S_IFMT) | m;
            }
            if let Some(b) = s.ost_blocks {
                // What the objects held last time is replaced by what they hold now.
                let k = fid.key();
                let old = tx.m().ost_blocks.get(&k).copied().unwrap_or(0);
                tx.apply(Op::OstBlocks(k, Some(b)));
                a.blocks = a.blocks.saturating_sub(old) + b;
            }
            if let Some(size) = s.size {
                if size < a.size {
                    let removed = tx.trim_dom(fid, size)?;
                    a.blocks = a.blocks.saturating_sub(removed / 512);
                }
                a.size = size;
                a.mtime_ns = tx.now;
                if cred.uid != 0 {
                    // As a write does: no setuid after a change by someone else.
                    a.mode &= !mode::S_ISUID;
                    if group_exec(a.mode) {
                        a.mode &= !mode::S_ISGID;
                    }
                }
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
        })
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
        let (change, weight) = self.setxattr_change(cred, fid, name, value, create, replace)?;
        self.change_weighted(key, change, weight)?;
        Ok(())
    }

    /// The change `setxattr` makes (after checking access) and the bytes it logs, for
    /// [`Namespace::submit`].
    pub fn setxattr_change(
        &self,
        cred: &Cred,
        fid: Fid,
        name: &str,
        value: &[u8],
        create: bool,
        replace: bool,
    ) -> Result<(Change, usize)> {
        if value.len() > XATTR_SIZE_MAX {
            return Err(MdError::new(
                errno::E2BIG,
                format!("xattr value of {} bytes (at most {XATTR_SIZE_MAX})", value.len()),
            ));
        }
        let a = self.getattr(fid)?;
        self.xattr_access(cred, &a, name, W)?;
        let (name, value, weight) = (name.to_string(), value.to_vec(), value.len());
        let change: Change = Box::new(move |tx| {
            let (mut a, p) = tx.get(fid)?;
            let mut used = 0usize;
            let mut old = None;
            for (n, v) in tx.m().xattrs_of(fid.key()) {
                if n == name {
                    old = Some(n.len() + v.len());
                } else {
                    used += n.len() + v.len();
                }
            }
            if create && old.is_some() {
                return Err(MdError::new(errno::EEXIST, format!("{fid} has xattr {name} already")));
            }
            if replace && old.is_none() {
                return Err(MdError::new(errno::ENODATA, format!("{fid} has no xattr {name}")));
            }
            if used + name.len() + value.len() > XATTRS_BYTES_MAX {
                return Err(MdError::new(
                    errno::ENOSPC,
                    format!("{fid} would hold more than {XATTRS_BYTES_MAX} bytes of xattrs"),
                ));
            }
            tx.put_xattr(fid, &name, &value)?;
            a.ctime_ns = tx.now;
            tx.put(&a, p)?;
            Ok(Answer::Done)
        });
        Ok((change, weight))
    }

    pub fn removexattr(&self, cred: &Cred, fid: Fid, name: &str, key: Option<ReplyKey>) -> Result<()> {
        self.change(key, self.removexattr_change(cred, fid, name)?)?;
        Ok(())
    }

    /// The change `removexattr` makes (after checking access), for [`Namespace::submit`].
    pub fn removexattr_change(&self, cred: &Cred, fid: Fid, name: &str) -> Result<Change> {
        let a = self.getattr(fid)?;
        self.xattr_access(cred, &a, name, W)?;
        let name = name.to_string();
        Ok(Box::new(move |tx| {
            let (mut a, p) = tx.get(fid)?;
            if !tx.del_xattr(fid, &name)? {
                return Err(MdError::new(errno::ENODATA, format!("{fid} has no xattr {name}")));
            }
            a.ctime_ns = tx.now;
            tx.put(&a, p)?;
            Ok(Answer::Done)
        }))
    }

    /// Open `fid` for reading and/or writing on behalf of client `owner`; returns a
    /// handle for `close_file`.
    pub fn open_file(&self, owner: u64, cred: &Cred, fid: Fid, read: bool, write: bool) -> Result<(u64, Attr)> {
        self.open_as(owner, Some(cred), fid, read, write)
    }

    /// [`Namespace::open_file`], with the whole file's bytes when it is opened for reading,
    /// its layout keeps all of them here and they are at most `dom_read` (DoM
    /// read-on-open: a small file is opened and read in one request); none otherwise.
    /// `None` only with [`Wait::No`], while a commit holds the handle table.
    #[allow(clippy::too_many_arguments)]
    pub fn open_reading(
        &self,
        wait: Wait,
        owner: u64,
        cred: &Cred,
        fid: Fid,
        read: bool,
        write: bool,
        dom_read: u32,
    ) -> Option<Result<(u64, Attr, Vec<u8>)>> {
        let o = self.opens(wait)?;
        Some(self.open_locked(o, owner, Some(cred), fid, read, write).map(|(handle, attr)| {
            let data = self.read_on_open(cred, &attr, read, dom_read);
            (handle, attr, data)
        }))
    }

    /// The whole of a file just opened, if it was opened for reading and its bytes are
    /// all here and at most `dom_read` (none otherwise). They are a bonus: if they cannot
    /// be read now, the open stands without them and the reader's own read meets the
    /// error.
    fn read_on_open(&self, cred: &Cred, attr: &Attr, read: bool, dom_read: u32) -> Vec<u8> {
        let whole = read
            && mode::is_reg(attr.mode)
            && attr.size > 0
            && attr.size <= u64::from(dom_read).min(DOM_IO_MAX as u64)
            && self.dom_end(attr.fid).ok().flatten().is_some_and(|end| attr.size <= end);
        if whole { self.read_dom(cred, attr.fid, 0, attr.size as usize).unwrap_or_default() } else { Vec::new() }
    }

    /// Open `name` in `dir` as [`Namespace::open_reading`] (the lookup and the open in one
    /// call), unless the entry's inode is on another MDT. `None` only with [`Wait::No`].
    #[allow(clippy::too_many_arguments)]
    pub fn open_at(
        &self,
        wait: Wait,
        owner: u64,
        cred: &Cred,
        dir: Fid,
        name: &str,
        read: bool,
        write: bool,
        dom_read: u32,
    ) -> Option<Result<OpenAnswer>> {
        let a = match self.lookup(cred, dir, name) {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        if a.fid.mdt() != Some(self.index) {
            return Some(Ok(OpenAnswer::Elsewhere(a)));
        }
        Some(self.open_reading(wait, owner, cred, a.fid, read, write, dom_read)?.map(OpenAnswer::Here))
    }

    /// Open a regular file the caller has just made (create-open): as open(2) with
    /// O_CREAT, the creator may open it whatever its mode says.
    pub fn open_created(&self, owner: u64, fid: Fid, read: bool, write: bool) -> Result<(u64, Attr)> {
        self.open_as(owner, None, fid, read, write)
    }

    /// Open `fid`, checking `cred`'s permission if given.
    fn open_as(&self, owner: u64, cred: Option<&Cred>, fid: Fid, read: bool, write: bool) -> Result<(u64, Attr)> {
        self.open_locked(lock(&self.opens), owner, cred, fid, read, write)
    }

    /// The open-handle table; with `Wait::No`, only if no commit holds it now (a commit
    /// holds it for its whole batch).
    fn opens(&self, wait: Wait) -> Option<MutexGuard<'_, Opens>> {
        match wait {
            Wait::Yes => Some(lock(&self.opens)),
            Wait::No => match self.opens.try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            },
        }
    }

    /// `open_as` with the handle table held.
    fn open_locked(
        &self,
        mut o: MutexGuard<'_, Opens>,
        owner: u64,
        cred: Option<&Cred>,
        fid: Fid,
        read: bool,
        write: bool,
    ) -> Result<(u64, Attr)> {
        // Under the lock a commit holds for its whole batch: the inode read here is not
        // being removed meanwhile.
        let a = self.getattr(fid)?;
        if a.nlink == 0 {
            return Err(MdError::new(errno::ENOENT, format!("{fid} was unlinked")));
        }
        if write && mode::is_dir(a.mode) {
            return Err(MdError::new(errno::EISDIR, format!("{fid} is a directory: not for writing")));
        }
        let want = if read { R } else { 0 } | if write { W } else { 0 };
        if let Some(cred) = cred
            && !may(cred, &a, want)
        {
            return Err(denied(cred, "open", &a));
        }
        let held = o.per_owner.entry(owner).or_default();
        if *held >= OPEN_HANDLES_PER_CLIENT_MAX {
            return Err(MdError::new(
                errno::EMFILE,
                format!("client {owner:#x} holds {OPEN_HANDLES_PER_CLIENT_MAX} open handles"),
            ));
        }
        *held += 1;
        o.next += 1;
        let h = o.next;
        o.handles.insert(h, (fid.key(), owner, write));
        *o.counts.entry(fid.key()).or_default() += 1;
        if write {
            *o.writers.entry(fid.key()).or_default() += 1;
        }
        Ok((h, a))
    }

    /// Whether some client has `fid` open for writing.
    pub fn is_open_for_write(&self, fid: Fid) -> bool {
        lock(&self.opens).writers.contains_key(&fid.key())
    }

    /// Those of `fids` some client has open for writing (as
    /// [`Namespace::is_open_for_write`]), under one look at the table.
    pub fn open_for_write(&self, fids: impl IntoIterator<Item = Fid>) -> std::collections::HashSet<Fid> {
        let o = lock(&self.opens);
        fids.into_iter().filter(|f| o.writers.contains_key(&f.key())).collect()
    }

    /// Drop every handle of a client that is gone (evicted): its unlinked files go.
    pub fn release_client(&self, owner: u64) -> Result<()> {
        let handles: Vec<u64> =
            lock(&self.opens).handles.iter().filter(|(_, (_, o, _))| *o == owner).map(|(h, _)| *h).collect();
        for h in handles {
            self.close_file(owner, h)?;
        }
        Ok(())
    }

    /// Let go of client `client` (the transport evicted it, or it left): its open files
    /// are closed and its reply records deleted.
    pub fn forget_client(&self, client: u64) -> Result<()> {
        self.release_client(client)?;
        self.change(
            None,
            Box::new(move |tx| {
                let xids: Vec<u64> = tx.m().replies.range((client, 0)..=(client, u64::MAX)).map(|(k, _)| k.1).collect();
                for x in xids {
                    tx.del_reply(client, x)?;
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// Reply records kept for `client`.
    pub fn reply_records(&self, client: u64) -> Result<usize> {
        Ok(read(&self.mem).replies.range((client, 0)..=(client, u64::MAX)).count())
    }

    /// Close a handle of client `owner`; the last close of a file unlinked meanwhile
    /// removes it.
    pub fn close_file(&self, owner: u64, handle: u64) -> Result<()> {
        let Some(key) = release(&mut lock(&self.opens), owner, handle)? else { return Ok(()) };
        // Only an unlinked file needs a change.
        if self.read_inode(Fid::from_key(key)).is_ok_and(|(a, _)| a.nlink > 0) {
            return Ok(());
        }
        self.change(
            None,
            Box::new(move |tx| {
                let orphan = tx.m().orphans.contains(&key);
                if orphan && tx.opens.get(&key).is_none_or(|&n| n == 0) {
                    let (a, _) = tx.get(Fid::from_key(key))?;
                    tx.destroy(&a, true)?;
                }
                Ok(Answer::Done)
            }),
        )?;
        Ok(())
    }

    /// [`Namespace::close_file`] if it need not wait: `None` (and nothing done) while a
    /// commit holds the handle table, or when this close must remove a file unlinked
    /// meanwhile (a change, which waits for its commit).
    pub fn try_close_file(&self, owner: u64, handle: u64) -> Option<Result<()>> {
        let mut o = self.opens(Wait::No)?;
        if let Some(&(k, by, _)) = o.handles.get(&handle)
            && by == owner
            && o.counts.get(&k) == Some(&1)
            && !self.read_inode(Fid::from_key(k)).is_ok_and(|(a, _)| a.nlink > 0)
        {
            return None;
        }
        // The last close of a linked file, or not the last close: nothing to change (an
        // unlink decides under this same lock whether the file is open).
        Some(release(&mut o, owner, handle).map(|_| ()))
    }
}

/// Drop handle `handle` of client `owner`; the file's key if that was its last handle.
fn release(o: &mut Opens, owner: u64, handle: u64) -> Result<Option<u128>> {
    let Some(&(k, by, write)) = o.handles.get(&handle).filter(|(_, by, _)| *by == owner) else {
        return Err(MdError::new(errno::EBADF, format!("client {owner:#x} has no open handle {handle}")));
    };
    o.handles.remove(&handle);
    if write && let Some(w) = o.writers.get_mut(&k) {
        *w -= 1;
        if *w == 0 {
            o.writers.remove(&k);
        }
    }
    if let Some(n) = o.per_owner.get_mut(&by) {
        *n -= 1;
        if *n == 0 {
            o.per_owner.remove(&by);
        }
    }
    let n = o.counts.entry(k).or_default();
    *n -= 1;
    if *n > 0 {
        return Ok(None);
    }
    o.counts.remove(&k);
    Ok(Some(k))
}
