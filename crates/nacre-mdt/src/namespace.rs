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
//!
//! The module's parts: [`mem`] (the tables and their ops), [`wal`] (the log and
//! checkpoints), `image` (redb), `changes`, `reads`, `opens` (open handles), `dom` (data
//! on the MDT), `pools` (OST objects), [`dne`] (steps of operations over several MDTs).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use nacre_osd::SyncMode;
use nacre_osd::backend::VolumeBackend;
use nacre_proto::acl::{self, Acl};
use nacre_proto::fid::{Fid, name_hash};
use nacre_proto::layout::{Kind, Layout, Striping};
use nacre_proto::mdt::lease::Key as LeaseKey;
use nacre_proto::mdt::{Attr, DirEntry, NAME_MAX, SYMLINK_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX, errno, mode, now_ns};
use nacre_proto::wire::Enc;

mod area;
mod changes;
pub mod dne;
mod dom;
mod image;
pub mod mem;
mod opens;
mod pools;
mod reads;
pub mod wal;
use mem::{Inode, Mem, Op};
use nacre_raid::Volume;
use opens::Opens;
pub use pools::{FileObjects, PoolState};
use pools::{Pools, decode_objects};
use redb::Database;

/// The image's format: 2 since the namespace lives in memory (format 1 was redb with a
/// redo log of its own, read by older builds); 3 since inodes keep a device number; 4
/// since DoM bytes live in the DoM area (a format 3 image is moved to 4 when opened).
const FORMAT: u64 = 4;
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
    /// Applied to what a create makes, unless its directory has a default ACL.
    pub umask: u32,
}

impl Cred {
    pub fn root() -> Cred {
        Cred::default()
    }

    pub fn user(uid: u32, gid: u32) -> Cred {
        Cred { uid, gid, groups: Vec::new(), umask: 0 }
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
    /// A size the file's objects hold at least (its writer publishing it): the size
    /// grows to it, never shrinks.
    pub size_at_least: Option<u64>,
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
            sync_on_reply: false,
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

/// Version of a stored answer: 2 since attributes carry `rdev`.
const ANSWER_VERSION: u8 = 2;

impl Answer {
    fn encode(&self) -> Vec<u8> {
        use nacre_proto::wire::Enc;
        let e = Enc::new(ANSWER_VERSION);
        match self {
            Answer::Attr(a) => a.put(e.u8(1)).done(),
            Answer::Opened(h, a) => a.put(e.u8(2).u64(*h)).done(),
            Answer::Done => e.u8(3).done(),
            Answer::Intent(id) => e.u8(4).u64(*id).done(),
        }
    }

    fn decode(b: &[u8]) -> Result<Answer> {
        let mut d = nacre_proto::wire::Dec::new(b, "stored answer", ANSWER_VERSION)?;
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
    /// The tables. The checkpoint thread shares them: it takes DoM bytes it wrote to
    /// the image out of memory.
    mem: Arc<RwLock<Mem>>,
    /// The image, where DoM blocks out of memory are read.
    db: Arc<Database>,
    /// OST object pools, decoded, as the last change left them.
    pools: Mutex<Pools>,
    /// The image's length on the volume, the most it may grow to now (up to the DoM
    /// area's floor), and the room of both together.
    db_len: Arc<std::sync::atomic::AtomicU64>,
    db_max: Arc<std::sync::atomic::AtomicU64>,
    capacity: u64,
    /// Where checkpoints write DoM blocks' bytes (shared with the log's checkpoint
    /// thread).
    area: Arc<Mutex<area::Area>>,
    /// `mdt.*.sync_on_reply` and `mdt.*.memory_max`, as set now.
    sync_on_reply: std::sync::atomic::AtomicBool,
    memory_max: std::sync::atomic::AtomicU64,
    alloc: Mutex<FidAlloc>,
    opens: Mutex<Opens>,
    /// Changes from async code take their turn here, where a task waits without holding
    /// its runtime thread, before the namespace's locks, where a thread would sleep.
    turn: tokio::sync::Mutex<()>,
    /// OST pools by name, as the MGS last said (`None`: not heard yet).
    ost_pools: Mutex<Option<BTreeMap<String, Vec<u32>>>>,
    /// Until when new files wait for the object pools to refill after a restart (see
    /// [`Namespace::objects_ready`]).
    refill_until: Mutex<Option<std::time::Instant>>,
    /// Who takes back the leases on what changes write (the MDS's lease table).
    recaller: std::sync::OnceLock<Recaller>,
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

/// [`may`], by the inode's access ACL when it has one and the caller is neither root nor
/// its owner (whom the mode's bits answer: an ACL's owner entry is those bits).
fn may_acl(m: &Mem, cred: &Cred, a: &Attr, want: u32) -> bool {
    if cred.uid == 0 || cred.uid == a.uid {
        return may(cred, a, want);
    }
    match m.access_acl(a.fid.key()) {
        Some(acl) => acl.permits(cred.uid, |g| cred.in_group(g), a.uid, a.gid, want),
        None => may(cred, a, want),
    }
}

fn denied(cred: &Cred, what: &str, a: &Attr) -> MdError {
    MdError::new(errno::EACCES, format!("uid {} may not {what} {} (mode {:o})", cred.uid, a.fid, a.mode & 0o7777))
}

/// A change's transno (0 if it failed before its record was staged, or, for a change
/// that wrote nothing, the last one staged), and what it depended on: the transnos of
/// the last changes, not yet committed, to the inodes it changed (their versions; a
/// directory's are not kept). After a restart its replay fails if one of those was
/// lost with its client (version-based recovery, as Lustre's): it would apply to a
/// state its client never saw.
///
/// `recalled`: the lease revocations the change caused, as the [`Recaller`] numbered
/// them (client, revocation): its answer waits for them to be carried out; `recall`
/// the recall clock's value then (0: no recall).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Numbered {
    pub transno: u64,
    pub depends: Vec<u64>,
    pub recall: u64,
    pub recalled: Vec<(u64, u64)>,
    /// The change's answer is the first this MDT keeps for its client (it knew no answer
    /// of that client's before): see [`Namespace::knows_client`].
    pub first: bool,
}

/// Told of every change, once it is applied, with the client that asked for it (none for
/// the MDT's own) and the lease keys it wrote; takes back the leases other clients hold on
/// them and returns the recall clock and the revocations to wait for (see [`Numbered`]).
pub type Recaller = Arc<dyn Fn(Option<u64>, &[LeaseKey]) -> (u64, Vec<(u64, u64)>) + Send + Sync>;

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
    /// What undoes each write, in order.
    undo: std::cell::RefCell<Vec<mem::Undo>>,
    /// The object pools as this change leaves them, and the OSTs whose pool it changed.
    pools: std::cell::RefCell<Pools>,
    pools_changed: std::cell::RefCell<std::collections::BTreeSet<u32>>,
    /// The FID the next new inode gets: a replayed create's, as its first reply said.
    replay_fid: Option<Fid>,
    /// The layout (encoded; empty: not given) and OST objects the next new regular file
    /// gets: a replayed create's, as its first reply said.
    replay_objects: Option<(Vec<u8>, FileObjects)>,
    /// The versions of the inodes this change changed, as it found them (what it
    /// depends on: see [`Numbered`]).
    depends: std::cell::RefCell<Vec<u64>>,
    /// The lease keys its writes touched, each once.
    touched: std::cell::RefCell<Vec<LeaseKey>>,
}

impl<'a> Tx<'a> {
    fn new(mem: &'a mut Mem, ns: &'a Namespace, opens: &'a HashMap<u128, u32>) -> Tx<'a> {
        // Stable under the namespace's lock: the transno this change will get.
        mem.stamp = ns.wal.next_transno();
        let record = mem::reuse_record(std::mem::take(&mut mem.record));
        Tx {
            mem: std::cell::RefCell::new(mem),
            ns,
            alloc: *lock(&ns.alloc),
            now: now_ns(),
            opens,
            log: std::cell::RefCell::new(record),
            count: Default::default(),
            undo: Default::default(),
            pools: std::cell::RefCell::new(lock(&ns.pools).clone()),
            pools_changed: Default::default(),
            replay_fid: None,
            replay_objects: None,
            depends: Default::default(),
            touched: Default::default(),
        }
    }

    /// The tables, to read.
    fn m(&self) -> std::cell::Ref<'_, &'a mut Mem> {
        self.mem.borrow()
    }

    /// Write: record `op` in the redo record, apply it, keep its inverse.
    fn apply(&self, op: Op) {
        if let Some(k) = lease_key(&op) {
            let mut t = self.touched.borrow_mut();
            if !t.contains(&k) {
                t.push(k);
            }
        }
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
        for u in undo.into_iter().rev() {
            m.undo(u);
        }
        self.log.borrow_mut().truncate(mem::RECORD_HEADER);
        self.count.set(0);
        self.touched.borrow_mut().clear();
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
        let mut record = self.log.take();
        mem::seal_record(&mut record, self.count.get());
        record
    }

    fn put(&self, a: &Attr, parent: Fid) -> Result<()> {
        self.depend_on(a.fid);
        // A directory's version is not kept: its entries are checked by name when a
        // change replays, and changes to other names do not concern it.
        let version = if mode::is_dir(a.mode) { 0 } else { self.m().stamp };
        self.apply(Op::Inode(a.fid.key(), Some(Inode { attr: *a, parent, version })));
        Ok(())
    }

    /// This change changes inode `fid`: it depends on the last change to it (unless that
    /// is its own, or a directory's, or from before this MDT started).
    fn depend_on(&self, fid: Fid) {
        let m = self.m();
        let Some(i) = m.inode(fid.key()) else { return };
        if i.version == 0 || i.version == m.stamp || mode::is_dir(i.attr.mode) {
            return;
        }
        let mut d = self.depends.borrow_mut();
        if !d.contains(&i.version) {
            d.push(i.version);
        }
    }

    fn put_symlink(&self, fid: Fid, target: &[u8]) -> Result<()> {
        self.apply(Op::Symlink(fid.key(), Some(target.into())));
        Ok(())
    }

    /// [`may_acl`] within this change.
    fn permits(&self, cred: &Cred, a: &Attr, want: u32) -> bool {
        may_acl(&self.m(), cred, a, want)
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
            ops.push(Op::Inode(Fid::ROOT.key(), Some(Inode { attr: root, parent: Fid::ROOT, version: 0 })));
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
        let (db_len, db_max, db_at) = (backend.len_handle(), backend.max_len_handle(), backend.data_offset());
        // The image may not grow until the DoM area above it is known (an error path's
        // redb may commit on drop): only a format-3 image, which has no area, may. A
        // region with no image at all (not an MDT: refused below) is let be.
        let len = db_len.load(std::sync::atomic::Ordering::Acquire);
        let full = if len > 0 { db_max.swap(len, std::sync::atomic::Ordering::AcqRel) } else { 0 };
        let db = Arc::new(Database::builder().set_cache_size(opts.cache_bytes).create_with_backend(backend)?);
        match image::meta(&db, "format")? {
            Some(FORMAT) => {}
            Some(3) => {
                db_max.fetch_max(full, std::sync::atomic::Ordering::AcqRel);
                Self::from_format_3(&db)?;
            }
            Some(f) => {
                return Err(MdError::new(
                    errno::EINVAL,
                    format!(
                        "metadata target of format {f}; this build reads format {FORMAT} and 3 (format 1 is the \
                         redb MDT of builds before the memory-resident namespace, format 2 had no device numbers: \
                         copy its files off with such a build)"
                    ),
                ));
            }
            None => return Err(MdError::new(errno::EINVAL, "not a metadata target: its image has no format")),
        }
        let index = image::meta(&db, "mdt_index")?
            .ok_or_else(|| MdError::new(errno::EINVAL, "metadata target lacks its MDT index"))?
            as u32;
        // From a copy read sequentially while the image fits the memory the namespace may
        // hold (an image of an MDT formatted before the DoM area may be full of DoM
        // bytes); else page by page.
        let mut mem = if db_len.load(std::sync::atomic::Ordering::Acquire) <= opts.memory_max {
            image::load_copy(volume.clone(), db_bytes, opts.sync)?
        } else {
            image::load(&db)?
        };
        // The DoM area as the image left it, before anything grows the image.
        let area =
            Arc::new(Mutex::new(area::Area::new(db_bytes, db_at, db_len.clone(), db_max.clone(), 2 * log_bytes)));
        lock(&area).rebuild(mem.dom_in_area())?;
        let from = wal::Position::load(&db)?;
        let region = wal::Region { vol: volume.clone(), base: db_bytes, room: log_bytes };
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
            // Memory takes every op in order; the image the last of each key.
            let mut last = BTreeMap::new();
            for (_, r) in &records {
                for op in mem::decode_record(r)? {
                    last.insert(op.slot(), op.clone());
                    mem.apply(op);
                }
            }
            let written = {
                let mut w = image::Writer::open(&txn)?;
                wal::write_ops(&mut w, last.values(), &area, &volume)?
            };
            pos.store(&txn)?;
            txn.commit()?;
            lock(&area).free_runs(&written.freed);
            // The replayed DoM bytes are written out: memory keeps where they are.
            for (k, b, stored) in written.stored {
                mem.imaged(k, b, u64::MAX, stored);
            }
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
        let mem = Arc::new(RwLock::new(mem));
        let stats = Arc::new(NamespaceStats::default());
        stats.recovered.store(records.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let ns = Namespace {
            index,
            wal: wal::Wal::start(region, &opts, db.clone(), pos, stats.clone(), mem.clone(), area.clone()),
            mem,
            db,
            pools: Mutex::new(pools),
            db_len,
            db_max,
            capacity: db_bytes,
            area,
            sync_on_reply: std::sync::atomic::AtomicBool::new(opts.sync_on_reply),
            memory_max: std::sync::atomic::AtomicU64::new(opts.memory_max),
            alloc: Mutex::new(FidAlloc { seq_k, next_oid, reserved: next_oid }),
            opens: Mutex::new(Opens::new()),
            turn: tokio::sync::Mutex::new(()),
            ost_pools: Mutex::new(None),
            refill_until: Mutex::new(None),
            recaller: Default::default(),
            stats,
        };
        // Files unlinked while open: clients that may reopen them by replay get the
        // chance (their MDS removes the rest when recovery ends); with none, they go now.
        if ns.known_clients().is_empty() {
            ns.remove_orphans()?;
        }
        Ok(ns)
    }

    /// Tell `r` of every change from now on (once; a second is ignored): see [`Recaller`].
    pub fn set_recaller(&self, r: Recaller) {
        let _ = self.recaller.set(r);
    }

    /// Remove the files unlinked while open that no handle holds (after a restart, once
    /// recovery gave clients the chance to reopen theirs); returns how many.
    pub fn remove_orphans(&self) -> Result<usize> {
        let orphans: Vec<u128> = {
            let o = lock(&self.opens);
            read(&self.mem).orphans.iter().copied().filter(|k| !o.counts.contains_key(k)).collect()
        };
        for &k in &orphans {
            self.change(
                None,
                Box::new(move |tx| {
                    if tx.opens.contains_key(&k) {
                        // Reopened meanwhile.
                        return Ok(Answer::Done);
                    }
                    match tx.get(Fid::from_key(k)) {
                        Ok((a, _)) => tx.destroy(&a, true)?,
                        // An orphan record without its inode: only the record goes.
                        Err(_) => tx.apply(Op::Orphan(k, false)),
                    }
                    Ok(Answer::Done)
                }),
            )?;
        }
        Ok(orphans.len())
    }

    /// Move an image of format 3 to format 4: its DoM blocks' bytes, in a table of their
    /// own, go into the DoM index, inline (they move to the DoM area when written again).
    fn from_format_3(db: &Database) -> Result<()> {
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate).map_err(storage)?;
        let moved = image::move_format_3_dom(&txn).map_err(|e| {
            MdError::new(
                e.errno,
                format!(
                    "moving the DoM blocks of a format-3 image into its DoM index (a copy of them, in one \
                     transaction: the image needs room for both) failed, nothing changed: {}",
                    e.message
                ),
            )
        })?;
        image::Writer::open(&txn)?.apply(&Op::Meta("format".into(), Some(FORMAT)))?;
        txn.commit()?;
        eprintln!("mdt: metadata target of format 3 moved to format {FORMAT} ({moved} DoM blocks indexed)");
        Ok(())
    }

    /// The volume's split: the image from 0 and the DoM area down from its top (see
    /// [`area`]), then the log.
    fn regions(volume: &Volume) -> Result<(u64, u64)> {
        let cap = volume.capacity() / 4096 * 4096;
        let log = (cap / 8).min(LOG_BYTES_MAX) / 4096 * 4096;
        // A quarter of the log holds one change: a DoM write of DOM_IO_MAX (with the two
        // blocks it may rewrite) needs a log of 4.5 MiB.
        if log < (6 << 20) {
            return Err(MdError::new(errno::ENOSPC, format!("a metadata volume of {cap} bytes is too small")));
        }
        Ok((cap - log, log))
    }

    /// Keep on this MDT's volume the file system's configuration as the MGS last gave it
    /// (its encoding), so that a start while no MGS answers still knows the targets, the
    /// OST pools and the stored parameters: Lustre keeps a local copy of the
    /// configuration log on each target for the same reason. A blocking call.
    pub fn keep_config_copy(&self, config: &[u8]) -> Result<()> {
        image::put_kept(&self.db, "mgs_config", config)
    }

    /// The configuration [`Namespace::keep_config_copy`] kept last, if any. A blocking
    /// call.
    pub fn config_copy(&self) -> Result<Option<Vec<u8>>> {
        image::kept(&self.db, "mgs_config")
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
        let max = self.db_max.load(std::sync::atomic::Ordering::Acquire);
        // Room for its next growth, and for a checkpoint of a full log (twice the log:
        // see `area::Area::new`), which the DoM area leaves it.
        if next_growth(used) > max || used + 2 * self.wal.room() > max {
            return Err(MdError::new(
                errno::ENOSPC,
                format!(
                    "the MDT's image fills {} MiB of the {} MiB its volume has left beside {} MiB of DoM data, and \
                     its next growth would not fit",
                    used >> 20,
                    max >> 20,
                    lock(&self.area).used() >> 20
                ),
            ));
        }
        Ok(())
    }

    // ---- running a change (the changes themselves are in `changes`) ----

    /// Log bytes a change may take: its names and attributes, and its data with the
    /// DoM blocks it rewrites at both ends.
    fn reservation(weight: usize) -> u64 {
        (CHANGE_BYTES + weight) as u64 + if weight > 0 { 2 * DOM_BLOCK } else { 0 }
    }

    /// Run one change in memory (its room in the log reserved by the caller) and stage
    /// its record; returns its answer and the transno to wait for before answering (its
    /// own, or for a change that wrote nothing the last one staged, whose state it may
    /// have read). With a reply key, a change already run answers as it did then.
    fn run_change(&self, key: Option<ReplyKey>, change: Change, reserved: u64) -> Result<(Result<Answer>, Numbered)> {
        let r = self.run_reserved(key, change, reserved);
        if r.is_err() {
            self.wal.unreserve(reserved);
        }
        r
    }

    /// [`Namespace::run_change`]; an error gives the reservation back to the caller.
    fn run_reserved(&self, key: Option<ReplyKey>, change: Change, reserved: u64) -> Result<(Result<Answer>, Numbered)> {
        // Held to the end of the change: an open cannot slip in between the check that a
        // file is not open and its removal.
        let opens = lock(&self.opens);
        let mut mem = write(&self.mem);
        let mut tx = Tx::new(&mut mem, self, &opens.counts);
        let stored = key.and_then(|k| tx.m().replies.get(&(k.client, k.xid)).map(|v| (k, Stored::decode(v))));
        let mut answer = None;
        let mut first = false;
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
                if r.is_err() && (tx.mutations() > 0 || !tx.pools_changed.borrow().is_empty()) {
                    // It failed after writing (or taking objects): nothing of it stays.
                    tx.roll_back();
                }
                if let Some(k) = key
                    && !r.as_ref().is_err_and(|e| e.errno == NEEDS_COORDINATION)
                {
                    first = tx.m().reply_count(k.client) == 0;
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
            return Ok((r, Numbered { transno: self.wal.last_transno(), first, ..Numbered::default() }));
        }
        let mut alloc = tx.alloc;
        if alloc.seq_k != lock(&self.alloc).seq_k || alloc.next_oid > alloc.reserved {
            // Reserve the next stretch of FIDs: the log says where a restart resumes.
            alloc.reserved = alloc.next_oid.saturating_add(FID_RESERVE);
            tx.put_meta("seq_k", alloc.seq_k as u64)?;
            tx.put_meta("next_oid", alloc.reserved as u64)?;
        }
        let record = tx.seal();
        let transno = match self.wal.stage(&record, reserved) {
            Ok(t) => t,
            Err(e) => {
                // Not logged, so not kept.
                tx.roll_back();
                return Err(e);
            }
        };
        let pools = tx.pools.take();
        let committed = self.wal.last_committed();
        let mut depends = tx.depends.take();
        depends.retain(|&d| d > committed);
        let touched = tx.touched.take();
        drop(tx);
        mem.versions.prune(committed);
        mem.record = record;
        // Under the namespace's lock still: the next change starts from these.
        *lock(&self.alloc) = alloc;
        *lock(&self.pools) = pools;
        drop(mem);
        drop(opens);
        self.stats.changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Applied: leases on what it wrote are taken back from now on.
        let (recall, recalled) = match self.recaller.get() {
            Some(recall) if !touched.is_empty() => recall(key.map(|k| k.client), &touched),
            _ => (0, Vec::new()),
        };
        Ok((r, Numbered { transno, depends, recall, recalled, first }))
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
        let (r, n) = self.run_change(key, f, reserved)?;
        if self.waits_for_commit(key) {
            self.wal.wait_committed(n.transno)?;
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

    /// `mdt.*.commit_interval_ms`: see [`NamespaceOptions::commit_interval`].
    pub fn set_commit_interval(&self, d: std::time::Duration) {
        self.wal.set_commit_interval(d);
    }

    pub fn commit_interval(&self) -> std::time::Duration {
        self.wal.commit_interval()
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

    /// Bytes of DoM data held in memory (written since their last checkpoint).
    pub fn dom_bytes_in_memory(&self) -> u64 {
        read(&self.mem).dom_bytes
    }

    /// Bytes of the volume the DoM area holds in use (whole 4 KiB units).
    pub fn dom_area_bytes(&self) -> u64 {
        lock(&self.area).used()
    }

    /// The log's bytes in use and its size.
    pub fn log_usage(&self) -> (u64, u64) {
        self.wal.usage()
    }

    /// Wait until every change answered so far is on the drives (`fsync`, `sync`).
    pub fn commit(&self) -> Result<()> {
        self.wal.wait_committed(self.wal.last_transno())
    }

    /// [`Namespace::commit`] from async code.
    pub async fn committed_all(&self) -> Result<()> {
        self.wal.committed(self.wal.last_transno()).await
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

    /// Close now, though something may still hold this namespace (a request in flight
    /// when its target moved to another node): what is staged is written and
    /// checkpointed, the log's threads end, and every change from now on fails. Blocking.
    pub fn close(&self) {
        self.wal.close();
    }

    /// The highest transno on the drives (`last_committed`).
    pub fn last_committed(&self) -> u64 {
        self.wal.last_committed()
    }

    /// The highest transno given, and the highest on the drives (`last_committed`).
    pub fn transnos(&self) -> (u64, u64) {
        (self.wal.last_transno(), self.wal.last_committed())
    }

    /// Drop the records a client has acknowledged, and its oldest beyond the bound.
    fn prune_replies(&self, tx: &Tx<'_>, k: ReplyKey) -> Result<()> {
        let (mut old, kept): (Vec<u64>, usize) = {
            let m = tx.m();
            let old: Vec<u64> =
                m.replies.range((k.client, 0)..(k.client, k.acked_below)).map(|(key, _)| key.1).collect();
            // Counted, not walked: a client's oldest request still waiting (a callback
            // poll) can keep a thousand records above it.
            let kept = m.reply_count(k.client).saturating_sub(old.len());
            (old, kept)
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

    /// Run a change from async code: in memory on the calling task (a few microseconds
    /// under the namespace's lock), then await its log write. Only a change that must
    /// wait for log room (a checkpoint behind) goes to a blocking thread.
    pub async fn submit(self: &Arc<Self>, key: Option<ReplyKey>, change: Change, weight: usize) -> Result<Answer> {
        self.submit_numbered(key, change, weight).await.0
    }

    /// [`Namespace::submit`], with the transno the change got and what it depended on
    /// (see [`Numbered`]): the client keeps the change for replay until `last_committed`
    /// covers it. A change answered before commit that gives no transno does not exist.
    pub async fn submit_numbered(
        self: &Arc<Self>,
        key: Option<ReplyKey>,
        change: Change,
        weight: usize,
    ) -> (Result<Answer>, Numbered) {
        let reserved = Self::reservation(weight);
        let ran = match self.wal.reserve(reserved, false) {
            Ok(true) => {
                let _turn = self.turn.lock().await;
                self.run_change(key, change, reserved)
            }
            Ok(false) => {
                let ns = self.clone();
                tokio::task::spawn_blocking(move || {
                    ns.wal.reserve(reserved, true)?;
                    ns.run_change(key, change, reserved)
                })
                .await
                .unwrap_or_else(|_| Err(MdError::new(errno::EIO, "the metadata change was dropped")))
            }
            Err(e) => Err(e),
        };
        let (r, n) = match ran {
            Ok(v) => v,
            Err(e) => return (Err(e), Numbered::default()),
        };
        if self.waits_for_commit(key)
            && let Err(e) = self.wal.committed(n.transno).await
        {
            return (Err(e), Numbered::default());
        }
        (r, n)
    }

    /// `change`, replayed after a restart: the inode it makes gets what its first run
    /// gave (the client has used them since): its FID, and a regular file's layout and
    /// objects when the first answer named them.
    pub fn replaying(first: FirstAnswer, change: Change) -> Change {
        Box::new(move |tx| {
            tx.replay_fid = Some(first.fid);
            if !first.objects.is_empty() {
                tx.replay_objects = Some((first.layout, first.objects));
            }
            change(tx)
        })
    }

    /// Clients whose changes this MDT keeps answers for: after a restart, those that may
    /// hold answered changes it lost, which recovery waits for. Another MDT's
    /// coordinator is not one (it finishes its operations itself).
    pub fn known_clients(&self) -> Vec<u64> {
        let m = read(&self.mem);
        let mut clients = Vec::new();
        let mut next = (0u64, 0u64);
        while let Some((&(c, _), _)) = m.replies.range(next..).next() {
            if !dne::is_coordinator_client(c) {
                clients.push(c);
            }
            match c.checked_add(1) {
                Some(n) => next = (n, 0),
                None => break,
            }
        }
        clients
    }

    /// Does this MDT keep answers for `client` (see [`Namespace::known_clients`])?
    pub fn knows_client(&self, client: u64) -> bool {
        read(&self.mem).replies.range((client, 0)..=(client, u64::MAX)).next().is_some()
    }
}

/// What a create's first answer gave, for its replay ([`Namespace::replaying`]): the new
/// inode's FID and, for a regular file with OST objects, its layout (encoded) and objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FirstAnswer {
    pub fid: Fid,
    pub layout: Vec<u8>,
    pub objects: FileObjects,
}

/// The lease key an op writes, if leases cover it: an inode's attributes, xattrs, symlink
/// target, layout and objects, data on the MDT and directory stripes count as its attributes; an
/// entry as its name.
fn lease_key(op: &Op) -> Option<LeaseKey> {
    match op {
        Op::Inode(k, _)
        | Op::Symlink(k, _)
        | Op::Xattr(k, _, _)
        | Op::Layout(k, _)
        | Op::Objects(k, _)
        | Op::Dom(k, _, _)
        | Op::DirStripe(k, _)
        | Op::DirDefault(k, _) => Some(LeaseKey::Attr(Fid::from_key(*k))),
        Op::Dirent { dir, name, .. } => Some(LeaseKey::Name(Fid::from_key(*dir), name.to_string())),
        Op::Meta(..)
        | Op::Orphan(..)
        | Op::Reply(..)
        | Op::Pool(..)
        | Op::Destroy(..)
        | Op::Intent(..)
        | Op::OstBlocks(..) => None,
    }
}
