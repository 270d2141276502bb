//! Multi-mount protection: which node may write a set of shared drives.
//!
//! Drives that two servers can open (a failover pair on shared NVMe or SAS) need an
//! arbiter that lives on the drives themselves, as Lustre's MMP block and Pacemaker's SBD
//! partition are. Each drive carries a lease block in its reserved area (4 KiB at 8 KiB):
//! the holder's node name, the lease's epoch (one more at every take), a heartbeat
//! sequence, the heartbeat interval and the expiry the holder promises to respect, and
//! where the holder runs (host boot id, process id).
//!
//! The protocol, with `I` the interval and `E` the expiry (at least `4I`):
//!
//! - **Holding.** The holder's heartbeat thread reads every drive's block, checks that
//!   each still shows its own epoch and last sequence, and writes the next sequence to
//!   every drive, once per `I`. A renewal that reaches a majority of the drives makes the
//!   holder's writes valid until `E/2` after the renewal began. Past that instant, or as
//!   soon as a block shows another holder, the holder is fenced for good: [`FencedDrive`]s
//!   refuse every write from then on, so a node whose drives or clock stalled, or a process
//!   stopped and resumed, writes nothing once a partner may have taken over.
//! - **Taking.** A node that wants the drives reads every block. A released lease (or
//!   drives never leased) is free. A held lease is watched: a block that changes within `E`
//!   has a live holder, and the taker refuses, naming it; blocks unchanged for `E` belong to
//!   a holder that can no longer write. A holder on this very host whose process is gone is
//!   known dead at once. The taker reads once more, writes its own block with the next
//!   epoch, waits `E/2 + I` and reads again. Any node that could still write when the claim
//!   landed had to renew within `E/2`, found the claim and stopped; a taker racing this one
//!   has written its claim by then, and the greater claim (epoch, then node) wins while
//!   the other backs off.
//! - **Releasing.** A holder that stops cleanly marks its blocks released, so that the
//!   next taker needs no watch. A holder asked to move its target releases it *to* a named
//!   node: that node takes it at once, and waits only a heartbeat after its claim (the
//!   holder writes nothing after its release); any other node watches it as held by the
//!   named node (which writes its claim within the expiry, or is taken to be gone).
//! - **Moving.** An operator, or a node that cannot reach the target over the network,
//!   asks the holder to move by writing a move request in the block after the lease (4 KiB
//!   at 12 KiB, as Pacemaker's SBD leaves messages in a node's slot): the node to move to
//!   and why ([`MoveWhy`]), for the lease's current epoch. The holder's heartbeat reads it
//!   at every renewal; a request for an older epoch is stale and ignored.
//!
//! A block whose checksum is wrong is never taken for free: it counts as held by an
//! unknown node and must stay unchanged for `E` like any other.
//!
//! Safety rests on every wait of a taker being longer than a holder's validity (`E` and
//! `E/2 + I` against `E/2`), whatever stalls either side; the clocks need only run at the
//! same rate. The check is made just before each write reaches the drive; a process frozen
//! between that check and its `pwrite` is the one case left to storage-side fencing
//! (reservations), which drive files do not have.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::align::AlignedBuf;
use crate::drive::BlockDevice;
use crate::superblock::crc32c;
pub use crate::superblock::{LEASE_BYTES, LEASE_OFFSET, MOVE_BYTES, MOVE_OFFSET};

const MAGIC: &[u8; 8] = b"NACREMMP";
const VERSION: u32 = 1;
/// Longest node name a lease names.
pub const NODE_MAX: usize = 63;
const CRC_AT: usize = LEASE_BYTES - 4;
/// Bounds on what a block may declare (a damaged or hostile block must not make a taker
/// wait forever).
const INTERVAL_MAX: Duration = Duration::from_secs(60);
const EXPIRY_MAX: Duration = Duration::from_secs(600);

/// What a lease block says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseBlock {
    pub released: bool,
    pub node: String,
    pub epoch: u64,
    pub seq: u64,
    pub interval: Duration,
    pub expiry: Duration,
    /// The holder's host (its boot id) and process.
    pub boot: String,
    pub pid: u32,
    /// The holder's wall clock when it wrote the block (ms since the epoch): for people
    /// (`nacre status`), never for deciding anything.
    pub stamp_ms: u64,
    /// A released lease's next holder, when its holder handed it over (empty: none).
    pub to: String,
}

const BOOT_MAX: usize = 40;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl LeaseBlock {
    fn encode(&self) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(LEASE_BYTES);
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12] = u8::from(self.released);
        let node = &self.node.as_bytes()[..self.node.len().min(NODE_MAX)];
        b[13] = node.len() as u8;
        b[16..16 + node.len()].copy_from_slice(node);
        b[80..88].copy_from_slice(&self.epoch.to_le_bytes());
        b[88..96].copy_from_slice(&self.seq.to_le_bytes());
        b[96..100].copy_from_slice(&(self.interval.as_millis() as u32).to_le_bytes());
        b[100..104].copy_from_slice(&(self.expiry.as_millis() as u32).to_le_bytes());
        b[104..108].copy_from_slice(&self.pid.to_le_bytes());
        let boot = &self.boot.as_bytes()[..self.boot.len().min(BOOT_MAX)];
        b[108] = boot.len() as u8;
        b[112..112 + boot.len()].copy_from_slice(boot);
        b[152..160].copy_from_slice(&self.stamp_ms.to_le_bytes());
        let to = &self.to.as_bytes()[..self.to.len().min(NODE_MAX)];
        b[14] = to.len() as u8;
        b[160..160 + to.len()].copy_from_slice(to);
        let crc = crc32c(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` for a block never written (all zeros).
    fn decode(b: &[u8]) -> Result<Option<LeaseBlock>, String> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
        if u32_at(CRC_AT) != crc32c(&b[..CRC_AT]) {
            return Err("bad checksum".into());
        }
        if &b[0..8] != MAGIC {
            return Err("not a lease block (bad magic)".into());
        }
        if u32_at(8) != VERSION {
            return Err(format!("lease version {} (this build reads {VERSION})", u32_at(8)));
        }
        let (node_len, boot_len, to_len) = (b[13] as usize, b[108] as usize, b[14] as usize);
        if node_len > NODE_MAX || boot_len > BOOT_MAX || to_len > NODE_MAX || b[12] > 1 {
            return Err("bad lengths or state".into());
        }
        let text = |r: std::ops::Range<usize>| String::from_utf8_lossy(&b[r]).into_owned();
        let interval = Duration::from_millis(u64::from(u32_at(96)));
        let expiry = Duration::from_millis(u64::from(u32_at(100)));
        if interval.is_zero() || interval > INTERVAL_MAX || expiry < 2 * interval || expiry > EXPIRY_MAX {
            return Err(format!("interval {interval:?} and expiry {expiry:?} out of bounds"));
        }
        Ok(Some(LeaseBlock {
            released: b[12] == 1,
            node: text(16..16 + node_len),
            epoch: u64_at(80),
            seq: u64_at(88),
            interval,
            expiry,
            boot: text(112..112 + boot_len),
            pid: u32_at(104),
            stamp_ms: u64_at(152),
            to: text(160..160 + to_len),
        }))
    }
}

const MOVE_MAGIC: &[u8; 8] = b"NACREMOV";
/// Move requests of the first format: an operator's only.
const MOVE_OPERATOR: u32 = 1;
/// Move requests that carry a reason: a holder that knows no reasons (of the first
/// format) ignores them, instead of obeying a request it cannot judge.
const MOVE_WITH_REASON: u32 = 2;

/// A request that the holder of a lease move its target: the block after the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveRequest {
    /// The lease epoch it is for: a holder acts on a request for its own epoch only.
    pub epoch: u64,
    /// The node to hand the drives to.
    pub to: String,
    pub why: MoveWhy,
    /// The asker's wall clock (ms since 1970): tells one request from the next, shown,
    /// never trusted.
    pub stamp_ms: u64,
}

/// Who asks for a move, and so what the holder makes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveWhy {
    /// An operator (`nacre failover`, `failback`): the holder moves.
    Operator,
    /// The node named cannot reach the target over the network (while the MGS answers
    /// it, for a target): the holder moves only if its own checks fail too.
    Unreachable,
}

impl MoveRequest {
    fn encode(&self) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(MOVE_BYTES);
        b[0..8].copy_from_slice(MOVE_MAGIC);
        let (version, why) = match self.why {
            MoveWhy::Operator => (MOVE_OPERATOR, 0),
            MoveWhy::Unreachable => (MOVE_WITH_REASON, 1),
        };
        b[8..12].copy_from_slice(&version.to_le_bytes());
        let to = &self.to.as_bytes()[..self.to.len().min(NODE_MAX)];
        b[12] = to.len() as u8;
        b[13] = why;
        b[16..16 + to.len()].copy_from_slice(to);
        b[80..88].copy_from_slice(&self.epoch.to_le_bytes());
        b[88..96].copy_from_slice(&self.stamp_ms.to_le_bytes());
        let crc = crc32c(&b[..MOVE_BYTES - 4]);
        b[MOVE_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` for no request (all zeros) or one that does not decode: a damaged request
    /// moves nothing.
    fn decode(b: &[u8]) -> Option<MoveRequest> {
        let at = MOVE_BYTES - 4;
        if &b[0..8] != MOVE_MAGIC || b[at..] != crc32c(&b[..at]).to_le_bytes() {
            return None;
        }
        let to_len = b[12] as usize;
        let version = u32::from_le_bytes(b[8..12].try_into().ok()?);
        if to_len == 0 || to_len > NODE_MAX {
            return None;
        }
        let why = match (version, b[13]) {
            (MOVE_OPERATOR | MOVE_WITH_REASON, 0) => MoveWhy::Operator,
            (MOVE_WITH_REASON, 1) => MoveWhy::Unreachable,
            _ => return None,
        };
        Some(MoveRequest {
            to: String::from_utf8_lossy(&b[16..16 + to_len]).into_owned(),
            why,
            epoch: u64::from_le_bytes(b[80..88].try_into().ok()?),
            stamp_ms: u64::from_le_bytes(b[88..96].try_into().ok()?),
        })
    }
}

/// Ask the holder of epoch `epoch` of `drives`' lease to hand them to node `to`, for
/// reason `why`: the request is written to every drive, and must reach a majority.
pub fn ask_move(drives: &[Arc<dyn BlockDevice>], epoch: u64, to: &str, why: MoveWhy) -> Result<(), String> {
    if to.is_empty() || to.len() > NODE_MAX {
        return Err(format!("node name {to:?}: 1 to {NODE_MAX} bytes"));
    }
    let buf = MoveRequest { epoch, to: to.to_string(), why, stamp_ms: now_ms() }.encode();
    // Flushed: written once, and read by the holder maybe much later.
    let (written, first_error) = write_each(drives, &buf, MOVE_OFFSET, true);
    if written < majority(drives.len()) {
        return Err(format!("the move request reached {written} of {} drives: {first_error}", drives.len()));
    }
    Ok(())
}

/// The move request for epoch `epoch` that a majority of `drives` carry, if any (one not
/// yet acted on: a request for an older epoch is stale).
pub fn move_asked(drives: &[Arc<dyn BlockDevice>], epoch: u64) -> Option<MoveRequest> {
    let mut buf = AlignedBuf::zeroed(MOVE_BYTES);
    let mut votes: Vec<MoveRequest> = Vec::new();
    for d in drives {
        if d.read_at(&mut buf, MOVE_OFFSET).is_ok()
            && let Some(r) = MoveRequest::decode(&buf)
            && r.epoch == epoch
        {
            votes.push(r);
        }
    }
    let count = |r: &MoveRequest| votes.iter().filter(|v| *v == r).count();
    let r = votes.iter().max_by_key(|v| count(v))?.clone();
    (count(&r) >= majority(drives.len())).then_some(r)
}

/// Why a lease could not be taken or kept.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("the drives are held by node {node} (its heartbeat on {drive} moved within {waited:?}): refusing to start")]
    Held { node: String, drive: String, waited: Duration },
    #[error("another node ({node}) took the drives at the same time; it keeps them")]
    Raced { node: String },
    #[error("the lease could not be written to most of the drives ({written} of {drives}): {detail}")]
    Unwritable { written: usize, drives: usize, detail: String },
    #[error("the drives are {0}: nothing to take over")]
    NotHeld(Taken),
    #[error("bad lease settings: {0}")]
    Settings(String),
}

/// How a node holds its lease.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// This node's name, as others will see it.
    pub node: String,
    /// Heartbeat interval.
    pub interval: Duration,
    /// How long a taker waits for an unchanged lease; at least 4 intervals.
    pub expiry: Duration,
}

impl LeaseOptions {
    /// Heartbeat every second, expiry after five: a dead holder's drives are taken about
    /// eight and a half seconds after its last heartbeat, free drives in three and a half.
    pub fn new(node: &str) -> LeaseOptions {
        LeaseOptions { node: node.to_string(), interval: Duration::from_secs(1), expiry: Duration::from_secs(5) }
    }

    fn check(&self) -> Result<(), LeaseError> {
        if self.node.is_empty() || self.node.len() > NODE_MAX {
            return Err(LeaseError::Settings(format!("node name {:?}: 1 to {NODE_MAX} bytes", self.node)));
        }
        if self.interval.is_zero() || self.interval > INTERVAL_MAX {
            return Err(LeaseError::Settings(format!("interval {:?} (at most {INTERVAL_MAX:?})", self.interval)));
        }
        if self.expiry < 4 * self.interval || self.expiry > EXPIRY_MAX {
            return Err(LeaseError::Settings(format!(
                "expiry {:?}: from 4 intervals ({:?}) to {EXPIRY_MAX:?}",
                self.expiry,
                4 * self.interval
            )));
        }
        Ok(())
    }
}

/// What one read of every drive found.
#[derive(Clone, PartialEq)]
struct Seen {
    /// Per drive: a checksum of its block (to see any change), or `None` if unreadable.
    crcs: Vec<Option<u32>>,
    blocks: Vec<Result<Option<LeaseBlock>, String>>,
}

fn read_all(drives: &[Arc<dyn BlockDevice>]) -> Seen {
    let mut crcs = Vec::with_capacity(drives.len());
    let mut blocks = Vec::with_capacity(drives.len());
    let mut buf = AlignedBuf::zeroed(LEASE_BYTES);
    for d in drives {
        match d.read_at(&mut buf, LEASE_OFFSET) {
            Ok(()) => {
                // Not over the stored checksum too: a block followed by its own CRC
                // always sums to the same residue.
                crcs.push(Some(crc32c(&buf[..CRC_AT])));
                blocks.push(LeaseBlock::decode(&buf));
            }
            Err(e) => {
                crcs.push(None);
                blocks.push(Err(format!("unreadable: {e}")));
            }
        }
    }
    Seen { crcs, blocks }
}

/// Write `block` to a majority of the drives at least.
fn claim(drives: &[Arc<dyn BlockDevice>], block: &LeaseBlock) -> Result<(), LeaseError> {
    let (written, detail) = write_all(drives, block);
    if written < majority(drives.len()) {
        return Err(LeaseError::Unwritable { written, drives: drives.len(), detail });
    }
    Ok(())
}

/// Write `block` to every drive; how many took it, and the first failure. No flush: what
/// matters is that the other node sees the block, which it does once the write completes
/// (drives opened with O_DIRECT); after a power loss every lease has expired anyway. A
/// flush per drive per heartbeat would also make a renewal as slow as the busiest drive's
/// cache, and a renewal that slow fences its node.
fn write_all(drives: &[Arc<dyn BlockDevice>], block: &LeaseBlock) -> (usize, String) {
    write_each(drives, &block.encode(), LEASE_OFFSET, false)
}

/// Write `buf` at `offset` of every drive (flushed, with `flush`); how many took it, and
/// the first failure.
fn write_each(drives: &[Arc<dyn BlockDevice>], buf: &[u8], offset: u64, flush: bool) -> (usize, String) {
    let mut written = 0;
    let mut first_error = String::new();
    for d in drives {
        match d.write_at(buf, offset).and_then(|()| if flush { d.sync() } else { Ok(()) }) {
            Ok(()) => written += 1,
            Err(e) if first_error.is_empty() => first_error = format!("{}: {e}", d.path().display()),
            Err(_) => {}
        }
    }
    (written, first_error)
}

fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// This host's boot id (the same for every process until a reboot).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Whether `b`'s holder is a process of this host that no longer exists.
fn holder_is_gone(b: &LeaseBlock, boot: &str) -> bool {
    if boot.is_empty() || b.boot != boot || b.pid == std::process::id() || b.pid == 0 {
        return false;
    }
    process_gone(b.pid)
}

/// Whether process `pid` of this host is gone: no such process, or dead and not yet
/// reaped (a zombie) with none of its threads left. A pid that cannot be checked counts
/// as alive.
///
/// A killed process's first thread turns zombie while its other threads may still be
/// finishing a write or holding its files (and so its locks): only when they are gone
/// too can nothing of it write again.
pub fn process_gone(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: kill with signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc != 0 {
        return io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    // A zombie's state follows its name in /proc/PID/stat.
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false);
    let others = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| tasks.flatten().any(|t| t.file_name().to_str() != Some(pid.to_string().as_str())))
            .unwrap_or(true)
    };
    zombie && !others()
}

/// How a lease was found when it was taken (in the order of how much it says: a
/// set of drives with blocks in several states is described by the last).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Taken {
    /// No drive had ever been leased.
    Free,
    /// Its holder had released it.
    Released { node: String },
    /// Its holder had handed it over to node `to` (this one, or one that did not take it
    /// within the expiry).
    Handed { from: String, to: String },
    /// Its holder's process on this host was gone.
    Gone { node: String, pid: u32 },
    /// Its holder's heartbeat had stopped for the expiry (an unknown node: a block that
    /// did not decode).
    Expired { node: String },
}

impl std::fmt::Display for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Taken::Free => write!(f, "never leased before"),
            Taken::Released { node } => write!(f, "released by node {node}"),
            Taken::Handed { from, to } => write!(f, "handed by node {from} to node {to}"),
            Taken::Gone { node, pid } => write!(f, "held by node {node}, whose process {pid} on this host is gone"),
            Taken::Expired { node } => write!(f, "held by node {node}, whose heartbeat stopped for the expiry"),
        }
    }
}

/// The lease of a set of drives, held: a heartbeat thread renews it until dropped (which
/// releases it) or until it is lost (which fences every [`FencedDrive`] made from it).
pub struct Held {
    fence: Arc<Fence>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    notes: Vec<String>,
    taken: Taken,
    /// Heartbeats held back until then (tests: a node whose clock or process stalls).
    stall: Arc<Mutex<Option<Instant>>>,
    /// The move asked for, as the heartbeat read it.
    asked: Arc<Mutex<Option<MoveRequest>>>,
    /// The node the release hands the drives to ([`Held::hand_to`]).
    handed: Arc<Mutex<Option<String>>>,
}

/// What a holder is told when its lease is lost.
type OnLost = Box<dyn FnOnce(&str) + Send>;

/// Whether writes may go to the drives: the lease's validity, and its loss.
pub struct Fence {
    node: String,
    epoch: u64,
    base: Instant,
    /// Nanoseconds after `base` until which writes are allowed.
    valid_until: AtomicU64,
    /// Why, and when writes stopped being allowed.
    lost: Mutex<Option<(String, Instant)>>,
    on_lost: Mutex<Option<OnLost>>,
}

impl Fence {
    /// `Ok` if this node may write now; else why not.
    pub fn check(&self) -> io::Result<()> {
        let now = self.base.elapsed().as_nanos() as u64;
        if now < self.valid_until.load(Ordering::Acquire) {
            return Ok(());
        }
        let why = self.lose("its lease was not renewed in time (drives, clock or process stalled)");
        Err(io::Error::other(format!("node {} no longer holds the lease of these drives: {why}", self.node)))
    }

    /// Why the lease was lost, if it was.
    pub fn lost(&self) -> Option<String> {
        lock(&self.lost).as_ref().map(|(why, _)| why.clone())
    }

    /// When this node's writes were first allowed, and when they stopped being (once the
    /// lease is lost).
    pub fn window(&self) -> (Instant, Option<Instant>) {
        (self.base, lock(&self.lost).as_ref().map(|(_, end)| *end))
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Fence for good (the first reason stays) and tell the owner once.
    fn lose(&self, why: &str) -> String {
        let until = self.valid_until.swap(0, Ordering::AcqRel);
        let now = self.base.elapsed().as_nanos() as u64;
        let mut lost = lock(&self.lost);
        let first = lost.is_none();
        let (why, _) =
            lost.get_or_insert_with(|| (why.to_string(), self.base + Duration::from_nanos(until.min(now)))).clone();
        drop(lost);
        if first && let Some(f) = lock(&self.on_lost).take() {
            f(&why);
        }
        why
    }

    /// Refuse writes from now on, without telling the owner: the lease was let go on
    /// purpose.
    fn retire(&self, why: &str) {
        // The reason first, and the owner's callback gone: a check that finds the
        // validity over must see a lease let go, never a lost one.
        drop(lock(&self.on_lost).take());
        let now = self.base.elapsed();
        lock(&self.lost).get_or_insert_with(|| (why.to_string(), self.base + now));
        self.valid_until.store(0, Ordering::Release);
    }

    fn extend(&self, renewal_began: Instant, by: Duration) {
        let until = (renewal_began - self.base + by).as_nanos() as u64;
        if lock(&self.lost).is_none() {
            self.valid_until.fetch_max(until, Ordering::AcqRel);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Held {
    /// Take the lease of `drives` (every drive of the volumes one target is made of), or
    /// say who holds it. Takes `E/2 + I` when the drives are free, and the holder's expiry
    /// more when they are held; returns with [`LeaseError::Held`] as soon as a heartbeat
    /// moves.
    pub fn acquire(drives: Vec<Arc<dyn BlockDevice>>, opts: &LeaseOptions) -> Result<Held, LeaseError> {
        Held::take(drives, opts, false)
    }

    /// Take the lease of `drives` only from a holder whose heartbeat stopped (a partner's
    /// standby): drives never leased, or released by a node that stopped on purpose, are
    /// left alone ([`LeaseError::NotHeld`]).
    pub fn acquire_expired(drives: Vec<Arc<dyn BlockDevice>>, opts: &LeaseOptions) -> Result<Held, LeaseError> {
        Held::take(drives, opts, true)
    }

    fn take(drives: Vec<Arc<dyn BlockDevice>>, opts: &LeaseOptions, expired_only: bool) -> Result<Held, LeaseError> {
        opts.check()?;
        let boot = boot_id();
        let mut notes = Vec::new();
        let first = read_all(&drives);
        let mut watch: Option<Duration> = None;
        let mut taken = Taken::Free;
        for (d, b) in drives.iter().zip(&first.blocks) {
            match b {
                Ok(None) => {}
                Ok(Some(b)) if b.released && !b.to.is_empty() => {
                    if b.to != opts.node {
                        // Its next holder claims it within the expiry, else is gone.
                        watch = watch.max(Some(b.expiry));
                    }
                    taken = taken.max(Taken::Handed { from: b.node.clone(), to: b.to.clone() });
                }
                Ok(Some(b)) if b.released => taken = taken.max(Taken::Released { node: b.node.clone() }),
                Ok(Some(b)) if holder_is_gone(b, &boot) => {
                    taken = taken.max(Taken::Gone { node: b.node.clone(), pid: b.pid });
                }
                Ok(Some(b)) => {
                    watch = watch.max(Some(b.expiry));
                    taken = taken.max(Taken::Expired { node: b.node.clone() });
                }
                Err(why) if why.starts_with("unreadable") => {}
                Err(why) => {
                    notes.push(format!(
                        "lease block on {}: {why}; treated as held by an unknown node",
                        d.path().display()
                    ));
                    // Whatever it declared, it is watched for this node's own expiry.
                    watch = watch.max(Some(opts.expiry));
                    taken = taken.max(Taken::Expired { node: "(unknown)".into() });
                }
            }
        }
        if expired_only && !matches!(taken, Taken::Expired { .. } | Taken::Gone { .. } | Taken::Handed { .. }) {
            return Err(LeaseError::NotHeld(taken));
        }
        if first.crcs.iter().filter(|c| c.is_some()).count() < majority(drives.len()) {
            return Err(LeaseError::Unwritable {
                written: 0,
                drives: drives.len(),
                detail: "most of the drives cannot be read".into(),
            });
        }
        if let Some(expiry) = watch {
            // Watched for the holder's expiry: any change is a live holder.
            let started = Instant::now();
            let step = opts.interval.min(expiry / 4);
            while started.elapsed() < expiry {
                std::thread::sleep(step);
                let now = read_all(&drives);
                if let Some(i) = (0..drives.len()).find(|&i| now.crcs[i].is_some() && now.crcs[i] != first.crcs[i]) {
                    let node = match &now.blocks[i] {
                        Ok(Some(b)) => b.node.clone(),
                        _ => "(unknown: its block does not decode)".into(),
                    };
                    return Err(LeaseError::Held {
                        node,
                        drive: drives[i].path().display().to_string(),
                        waited: started.elapsed(),
                    });
                }
            }
        }
        let epoch = first.blocks.iter().filter_map(|b| b.as_ref().ok()?.as_ref().map(|b| b.epoch)).max().unwrap_or(0);
        let mut mine = LeaseBlock {
            released: false,
            node: opts.node.clone(),
            epoch: epoch + 1,
            seq: 1,
            interval: opts.interval,
            expiry: opts.expiry,
            boot,
            pid: std::process::id(),
            stamp_ms: now_ms(),
            to: String::new(),
        };
        // Compare, then write: a taker that read long ago and stalled since must not
        // write over a node that took the drives meanwhile.
        let again = read_all(&drives);
        if again.crcs != first.crcs {
            let node = again.blocks.iter().flatten().flatten().map(|b| b.node.clone()).next();
            return Err(LeaseError::Raced { node: node.unwrap_or_else(|| "(unknown)".into()) });
        }
        let key = |b: &LeaseBlock| (b.epoch, b.node.clone(), b.boot.clone(), b.pid);
        // Any node that could write when our claim landed must renew within the validity,
        // and its renewal finds our claim: past this wait it writes no more. A taker
        // racing us has written its claim by then too. Drives handed to this node need
        // only a heartbeat's check: their holder let go on purpose and writes nothing, and
        // every other node watches them for the expiry before it claims.
        let handed_here = matches!(&taken, Taken::Handed { to, .. } if *to == opts.node);
        let settle = if handed_here { opts.interval } else { opts.expiry / 2 + opts.interval };
        let mut rounds = 0;
        let began = loop {
            claim(&drives, &mine)?;
            std::thread::sleep(settle);
            let began = Instant::now();
            let after = read_all(&drives);
            let foreign: Vec<&LeaseBlock> = after.blocks.iter().flatten().flatten().filter(|b| **b != mine).collect();
            if foreign.is_empty() {
                break began;
            }
            // The greater claim wins; over a lesser one (which may be a node still
            // renewing), ours is written again and waited for again.
            rounds += 1;
            if let Some(b) = foreign.iter().max_by_key(|b| key(b)).filter(|b| key(b) > key(&mine) || rounds == 3) {
                return Err(LeaseError::Raced { node: b.node.clone() });
            }
            mine.seq += 1;
            mine.stamp_ms = now_ms();
        };
        let fence = Arc::new(Fence {
            node: opts.node.clone(),
            epoch: mine.epoch,
            base: began,
            valid_until: AtomicU64::new(0),
            lost: Mutex::new(None),
            on_lost: Mutex::new(None),
        });
        fence.extend(began, opts.expiry / 2);
        let stop = Arc::new(AtomicBool::new(false));
        let (stall, asked, handed) = (Arc::default(), Arc::default(), Arc::default());
        let beat = Heartbeat {
            drives,
            mine,
            fence: fence.clone(),
            stop: stop.clone(),
            stall: Arc::clone(&stall),
            asked: Arc::clone(&asked),
            handed: Arc::clone(&handed),
        };
        let thread = std::thread::Builder::new()
            .name(format!("lease-{}", opts.node))
            .spawn(move || beat.run())
            .map_err(|e| LeaseError::Settings(format!("cannot start the heartbeat thread: {e}")))?;
        Ok(Held { fence, stop, thread: Some(thread), notes, stall, taken, asked, handed })
    }

    /// The fence the drives of this lease are wrapped in ([`FencedDrive::wrap`]).
    pub fn fence(&self) -> &Arc<Fence> {
        &self.fence
    }

    /// From whom, and how, the drives were taken.
    pub fn taken(&self) -> &Taken {
        &self.taken
    }

    /// What the taking saw and the log should say (blocks with bad checksums).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Call `f` once, with the reason, when the lease is lost (from the heartbeat thread,
    /// or from the write that found it expired).
    pub fn on_lost(&self, f: impl FnOnce(&str) + Send + 'static) {
        *lock(&self.fence.on_lost) = Some(Box::new(f));
        if let Some(why) = self.fence.lost()
            && let Some(f) = lock(&self.fence.on_lost).take()
        {
            f(&why);
        }
    }

    /// The move asked of this holder (see [`ask_move`]), once a renewal has read the
    /// request.
    pub fn move_asked(&self) -> Option<MoveRequest> {
        lock(&self.asked).clone()
    }

    /// Release the drives to node `node`, which takes them at once (others watch them as
    /// held by it). Call once the target is closed: from the release on, this node's
    /// writes are refused.
    pub fn hand_to(self, node: &str) {
        *lock(&self.handed) = Some(node.to_string());
        drop(self);
    }

    /// Hold back heartbeats for `d`, as a node whose clock or process stalls (tests).
    #[doc(hidden)]
    pub fn stall(&self, d: Duration) {
        *lock(&self.stall) = Some(Instant::now() + d);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Heartbeat {
    drives: Vec<Arc<dyn BlockDevice>>,
    mine: LeaseBlock,
    fence: Arc<Fence>,
    stop: Arc<AtomicBool>,
    stall: Arc<Mutex<Option<Instant>>>,
    asked: Arc<Mutex<Option<MoveRequest>>>,
    handed: Arc<Mutex<Option<String>>>,
}

impl Heartbeat {
    fn run(mut self) {
        let (interval, valid) = (self.mine.interval, self.mine.expiry / 2);
        let tick = (interval / 10).max(Duration::from_millis(1));
        let mut next = Instant::now() + interval;
        loop {
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            let stalled = lock(&self.stall).is_some_and(|until| Instant::now() < until);
            if stalled || Instant::now() < next {
                std::thread::sleep(tick);
                continue;
            }
            next += interval;
            // Too late already (a stalled node): fenced, and nothing written.
            if self.fence.check().is_err() {
                return;
            }
            let began = Instant::now();
            if let Err(why) = self.renew(false) {
                self.fence.lose(&why);
                return;
            }
            self.fence.extend(began, valid);
            if let Some(r) = move_asked(&self.drives, self.mine.epoch).filter(|r| r.to != self.mine.node) {
                *lock(&self.asked) = Some(r);
            }
        }
        // A clean stop releases the drives (to a node, for a move), unless they are
        // another node's by now. This node's writes stop first: none can land after a
        // taker could see the release.
        let ours = self.fence.check().is_ok();
        self.fence.retire("the lease was released");
        if ours {
            let _ = self.renew(true);
        }
    }

    /// Check every block is still ours, then write the next sequence (or the release, to
    /// the node it is handed to if any).
    fn renew(&mut self, release: bool) -> Result<(), String> {
        let seen = read_all(&self.drives);
        for (d, b) in self.drives.iter().zip(&seen.blocks) {
            match b {
                Ok(Some(b)) if *b == self.mine => {}
                Ok(Some(b)) => {
                    return Err(format!(
                        "node {} (epoch {}) wrote the lease on {}: it holds the drives now",
                        b.node,
                        b.epoch,
                        d.path().display()
                    ));
                }
                Ok(None) => return Err(format!("the lease on {} was wiped", d.path().display())),
                // A failed drive is the RAID's business; a majority must still take the write.
                Err(why) if why.starts_with("unreadable") => {}
                Err(why) => return Err(format!("the lease on {}: {why}", d.path().display())),
            }
        }
        let mut next = self.mine.clone();
        next.seq += 1;
        next.released = release;
        if release {
            next.to = lock(&self.handed).take().unwrap_or_default();
        }
        next.stamp_ms = now_ms();
        let (written, detail) = write_all(&self.drives, &next);
        self.mine = next;
        if written < majority(self.drives.len()) {
            return Err(format!("the lease reached {written} of {} drives: {detail}", self.drives.len()));
        }
        Ok(())
    }
}

/// A drive whose writes go through only while its node holds the lease.
pub struct FencedDrive {
    inner: Arc<dyn BlockDevice>,
    fence: Arc<Fence>,
}

impl FencedDrive {
    /// `drives`, each refusing writes once `fence`'s lease is lost or expired.
    pub fn wrap(drives: Vec<Arc<dyn BlockDevice>>, fence: &Arc<Fence>) -> Vec<Arc<dyn BlockDevice>> {
        drives
            .into_iter()
            .map(|inner| Arc::new(FencedDrive { inner, fence: fence.clone() }) as Arc<dyn BlockDevice>)
            .collect()
    }
}

impl BlockDevice for FencedDrive {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.fence.check()?;
        self.inner.write_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.fence.check()?;
        self.inner.sync()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn path(&self) -> &std::path::Path {
        self.inner.path()
    }

    fn identity(&self) -> Option<(u64, u64)> {
        self.inner.identity()
    }
}

/// Who holds the drives now, as their blocks say (for `nacre status`, and for a standby
/// watching its partner): the newest valid block, or why none decodes.
pub fn holder(drives: &[Arc<dyn BlockDevice>]) -> Result<Option<LeaseBlock>, String> {
    let seen = read_all(drives);
    let mut best: Option<LeaseBlock> = None;
    let mut problem = None;
    for b in seen.blocks {
        match b {
            Ok(Some(b)) => {
                if best.as_ref().is_none_or(|x| (b.epoch, b.seq) > (x.epoch, x.seq)) {
                    best = Some(b);
                }
            }
            Ok(None) => {}
            Err(why) => problem = Some(why),
        }
    }
    match (best, problem) {
        (Some(b), _) => Ok(Some(b)),
        (None, Some(why)) => Err(why),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_damage_is_named() {
        let b = LeaseBlock {
            released: false,
            node: "oss1".into(),
            epoch: 7,
            seq: 42,
            interval: Duration::from_millis(500),
            expiry: Duration::from_secs(3),
            boot: "1c3e2d9a-0000-4000-8000-000000000000".into(),
            pid: 1234,
            stamp_ms: 1_795_000_000_000,
            to: "oss2".into(),
        };
        let bytes = b.encode();
        assert_eq!(LeaseBlock::decode(&bytes).unwrap(), Some(b));
        let mut bad = bytes.to_vec();
        bad[20] ^= 1;
        assert_eq!(LeaseBlock::decode(&bad).unwrap_err(), "bad checksum");
        assert_eq!(LeaseBlock::decode(&[0u8; LEASE_BYTES]).unwrap(), None);
    }

    #[test]
    fn a_move_request_round_trips_and_a_damaged_one_moves_nothing() {
        for (why, version) in [(MoveWhy::Operator, MOVE_OPERATOR), (MoveWhy::Unreachable, MOVE_WITH_REASON)] {
            let r = MoveRequest { epoch: 3, to: "oss2".into(), why, stamp_ms: 1_795_000_000_000 };
            let bytes = r.encode();
            assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), version);
            assert_eq!(MoveRequest::decode(&bytes), Some(r));
        }
        let r = MoveRequest { epoch: 3, to: "oss2".into(), why: MoveWhy::Operator, stamp_ms: 1_795_000_000_000 };
        let bytes = r.encode();
        let mut bad = bytes.to_vec();
        bad[17] ^= 1;
        assert_eq!(MoveRequest::decode(&bad), None);
        assert_eq!(MoveRequest::decode(&[0u8; MOVE_BYTES]), None);
    }
}
