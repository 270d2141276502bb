//! The namespace's working state, in memory, and the one kind of mutation that changes
//! it.
//!
//! [`Mem`] holds every table of the MDT in structures made for its use: inodes in a hash
//! map, each directory's entries in a B-tree by name hash (the readdir cookie), layouts
//! shared between the files that have the same one. A change never writes a table
//! directly: it makes [`Op`]s (put or delete one key of one table), and each op is
//! encoded into the change's redo record, applied here, and answered with its inverse
//! (the same key with the value it replaced), which undoes it should the change fail
//! after writing. The same ops, decoded from the log, replay a crashed MDT's tail at
//! start-up and are written to the image ([`super::image`]) by checkpoints.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use nacre_proto::fid::Fid;
use nacre_proto::mdt::{Attr, NAME_MAX, SYMLINK_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX, mode};
use nacre_proto::wire::{Dec, Enc};

use super::{DOM_BLOCK, MdError, Result, storage};

/// An inode: its attributes and, for a directory, its parent (rename's loop check and
/// `..`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inode {
    pub attr: Attr,
    pub parent: Fid,
    /// The transno of the last change to it, while that may not be committed (0: none
    /// such; not stored). Changes report it as what they depend on (version-based
    /// recovery).
    pub version: u64,
}

/// An inode as memory keeps it: its attributes without the FID (its place in the
/// table), and its layout. 72 bytes where an [`Inode`] and a separate layout map took
/// 136. `mode` holds [`IN_USE`] besides the mode: a slot without it is free. A device
/// node has no data, so its `size` holds its device number.
#[derive(Debug, Clone, Default)]
struct Node {
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    blocks: u64,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    layout: Option<Arc<[u8]>>,
}

impl Node {
    fn attr(&self, fid: u128) -> Attr {
        let device = mode::is_device(self.mode);
        Attr {
            fid: Fid::from_key(fid),
            mode: self.mode & !IN_USE,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            size: if device { 0 } else { self.size },
            blocks: self.blocks,
            atime_ns: self.atime_ns,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            rdev: if device { self.size as u32 } else { 0 },
        }
    }

    fn set(&mut self, a: &Attr) {
        (self.mode, self.nlink, self.uid, self.gid) = (a.mode | IN_USE, a.nlink, a.uid, a.gid);
        let size = if mode::is_device(a.mode) { a.rdev.into() } else { a.size };
        (self.size, self.blocks) = (size, a.blocks);
        (self.atime_ns, self.mtime_ns, self.ctime_ns) = (a.atime_ns, a.mtime_ns, a.ctime_ns);
    }
}

/// A bit of [`Node::mode`] no mode has (they fit 16 bits).
const IN_USE: u32 = 1 << 31;

/// Slots per page of the inode table.
const PAGE: usize = 256;

/// Inodes by FID, in pages of [`PAGE`] consecutive object ids: FIDs are handed out in
/// order, so pages fill, and an inode costs its [`Node`] and little more (a hash map
/// doubles its buckets as it grows, and spent up to twice that).
#[derive(Default)]
struct InodeTable {
    pages: HashMap<u128, Box<[Node; PAGE]>>,
    /// Inodes in each page, to free it when it empties.
    used: HashMap<u128, u16>,
    count: u64,
}

/// A FID key's page and slot: the object id's low bits pick the slot.
fn page_of(k: u128) -> (u128, usize) {
    let slot = ((k >> 32) as usize) % PAGE;
    (k & !(((PAGE - 1) as u128) << 32), slot)
}

impl InodeTable {
    fn get(&self, k: u128) -> Option<&Node> {
        let (page, slot) = page_of(k);
        self.pages.get(&page).map(|p| &p[slot]).filter(|n| n.mode & IN_USE != 0)
    }

    fn get_mut(&mut self, k: u128) -> Option<&mut Node> {
        let (page, slot) = page_of(k);
        self.pages.get_mut(&page).map(|p| &mut p[slot]).filter(|n| n.mode & IN_USE != 0)
    }

    /// The slot of `k`, made free if it was not there.
    fn slot(&mut self, k: u128) -> &mut Node {
        let (page, slot) = page_of(k);
        let p = self.pages.entry(page).or_insert_with(|| Box::new(std::array::from_fn(|_| Node::default())));
        if p[slot].mode & IN_USE == 0 {
            *self.used.entry(page).or_default() += 1;
            self.count += 1;
        }
        &mut p[slot]
    }

    fn remove(&mut self, k: u128) -> Option<Node> {
        let (page, slot) = page_of(k);
        let p = self.pages.get_mut(&page)?;
        if p[slot].mode & IN_USE == 0 {
            return None;
        }
        let n = std::mem::take(&mut p[slot]);
        self.count -= 1;
        let used = self.used.entry(page).or_default();
        *used -= 1;
        if *used == 0 {
            self.used.remove(&page);
            self.pages.remove(&page);
        }
        Some(n)
    }
}

/// One directory entry. Entries whose names share a hash are chained (rare: 63 bits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Box<str>,
    pub child: u128,
    pub kind: u32,
    next: Option<Box<Entry>>,
}

/// A directory's entries by name hash, which is also each one's readdir cookie.
pub type Dir = BTreeMap<u64, Entry>;

/// Find `name` among the entries chained at one hash.
fn find<'e>(mut e: Option<&'e Entry>, name: &str) -> Option<&'e Entry> {
    while let Some(x) = e {
        if &*x.name == name {
            return Some(x);
        }
        e = x.next.as_deref();
    }
    None
}

/// Every table of one MDT.
#[derive(Default)]
pub struct Mem {
    pub meta: BTreeMap<Box<str>, u64>,
    inodes: InodeTable,
    /// Each directory's parent (other inodes record none).
    parents: HashMap<u128, Fid>,
    /// Layouts whose inode is not here (none, but for a moment within a change that
    /// removes or makes one): they keep the ops' inverses exact in any order.
    loose_layouts: HashMap<u128, Arc<[u8]>>,
    layout_count: u64,
    /// Directories with entries (an empty directory has none here).
    pub dirs: HashMap<u128, Dir>,
    pub symlinks: HashMap<u128, Box<[u8]>>,
    pub xattrs: BTreeMap<(u128, Box<str>), Box<[u8]>>,
    pub orphans: BTreeSet<u128>,
    pub replies: BTreeMap<(u64, u64), Box<[u8]>>,
    /// How many of `replies` each client has (a client with none is not here).
    pub reply_counts: HashMap<u64, usize>,
    /// Layouts ([`nacre_proto::layout::Layout::encode`]), each kept once however many
    /// files have it.
    shared_layouts: HashSet<Arc<[u8]>>,
    pub objects: HashMap<u128, Box<[u8]>>,
    pub ost_blocks: HashMap<u128, u64>,
    pub pools: BTreeMap<u32, Box<[u8]>>,
    pub destroys: BTreeSet<(u32, u64)>,
    /// DoM blocks: their bytes until a checkpoint wrote them out, then only where they
    /// are (the block index; the bytes are read from the area or the image).
    dom: BTreeMap<(u128, u64), DomBlock>,
    pub dirstripes: HashMap<u128, Box<[u8]>>,
    pub dirdefaults: HashMap<u128, Box<[u8]>>,
    pub intents: BTreeMap<u64, Box<[u8]>>,
    /// Bytes of names, values and data held (the variable part of [`Mem::bytes`]).
    held: u64,
    /// Directory entries.
    entries: u64,
    /// Bytes of DoM data held.
    pub dom_bytes: u64,
    /// The same in whole 4 KiB units: the DoM area's room they will take.
    pub dom_units: u64,
    /// The transno of the change applying ops now: DoM blocks it writes carry it, and
    /// leave memory once a checkpoint covered it.
    pub stamp: u64,
    /// Inode versions (see [`Inode::version`]), apart from the inodes: only the changed
    /// ones have one, until it is committed.
    pub versions: Versions,
    /// The last change's redo record, its buffer kept for the next change (see
    /// [`reuse_record`]).
    pub record: Vec<u8>,
}

/// The versions of recently changed inodes. Those at or below `last_committed` are let
/// go now and then (they concern no replay), whenever the map has doubled since.
#[derive(Default)]
pub struct Versions {
    map: HashMap<u128, u64>,
    /// The size after the last pruning: the next comes at twice it (at least 4,096).
    pruned_at: usize,
}

impl Versions {
    pub fn get(&self, k: u128) -> u64 {
        self.map.get(&k).copied().unwrap_or(0)
    }

    fn set(&mut self, k: u128, version: u64) {
        if version == 0 {
            self.map.remove(&k);
        } else {
            self.map.insert(k, version);
        }
    }

    /// Forget the versions at or below `committed`, if the map has grown enough since the
    /// last time for it to pay.
    pub fn prune(&mut self, committed: u64) {
        if self.map.len() < (2 * self.pruned_at).max(4096) {
            return;
        }
        self.map.retain(|_, v| *v > committed);
        self.pruned_at = self.map.len();
    }
}

/// `bytes` in whole units of the DoM area.
fn whole_units(bytes: u64) -> u64 {
    bytes.div_ceil(super::area::UNIT) * super::area::UNIT
}

/// A DoM block as memory keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomBlock {
    /// Its bytes, written by the change of transno `stamp` (or one before it), not yet
    /// in the image by a checkpoint that covered that transno.
    Here { stamp: u64, data: Box<[u8]> },
    /// Written out by a checkpoint, there.
    Imaged(Stored),
}

/// Where a checkpoint wrote a DoM block's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// In its entry of the image's index, of this many bytes.
    Inline(u32),
    /// In the DoM area.
    Area(super::area::Extent),
}

impl Stored {
    /// The block's length in bytes.
    pub fn bytes(&self) -> u32 {
        match self {
            Stored::Inline(n) => *n,
            Stored::Area(e) => e.len,
        }
    }
}

impl DomBlock {
    /// The block's length.
    pub fn bytes(&self) -> u64 {
        match self {
            DomBlock::Here { data, .. } => data.len() as u64,
            DomBlock::Imaged(s) => s.bytes() as u64,
        }
    }

    /// Keep only where the bytes are, `stored`; returns the bytes freed.
    fn take_out(&mut self, stored: Stored) -> u64 {
        let freed = self.held();
        *self = DomBlock::Imaged(stored);
        freed
    }

    /// Bytes held in memory.
    fn held(&self) -> u64 {
        match self {
            DomBlock::Here { data, .. } => data.len() as u64,
            DomBlock::Imaged(_) => 0,
        }
    }
}

/// What undoes an op: another op, or (for a DoM block whose bytes are in the image, not
/// here) putting its index entry back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    Op(Op),
    DomImaged(u128, u64, Stored),
}

/// Bytes an entry of each kind costs besides its variable part, about: what the maps
/// take per key, measured with `nacre bench mdt`.
pub const INODE_BYTES: u64 = 128;
pub const ENTRY_BYTES: u64 = 96;
pub const VALUE_BYTES: u64 = 64;

/// One mutation: put (`Some`) or delete (`None`) one key of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Meta(Box<str>, Option<u64>),
    Inode(u128, Option<Inode>),
    Dirent { dir: u128, hash: u64, name: Box<str>, to: Option<(u128, u32)> },
    Symlink(u128, Option<Box<[u8]>>),
    Xattr(u128, Box<str>, Option<Box<[u8]>>),
    Orphan(u128, bool),
    Reply(u64, u64, Option<Box<[u8]>>),
    Layout(u128, Option<Arc<[u8]>>),
    Objects(u128, Option<Box<[u8]>>),
    Pool(u32, Option<Box<[u8]>>),
    Destroy(u32, u64, bool),
    Dom(u128, u64, Option<Box<[u8]>>),
    DirStripe(u128, Option<Box<[u8]>>),
    DirDefault(u128, Option<Box<[u8]>>),
    Intent(u64, Option<Box<[u8]>>),
    OstBlocks(u128, Option<u64>),
}

/// The key an [`Op`] writes: ops of one key replace each other, so a checkpoint need
/// only write the last of each (a directory's inode changed by every create in it, a
/// reply record put and then pruned, a file made and removed between checkpoints).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Slot {
    Meta(Box<str>),
    Inode(u128),
    Dirent(u128, u64, Box<str>),
    Symlink(u128),
    Xattr(u128, Box<str>),
    Orphan(u128),
    Reply(u64, u64),
    Layout(u128),
    Objects(u128),
    Pool(u32),
    Destroy(u32, u64),
    Dom(u128, u64),
    DirStripe(u128),
    DirDefault(u128),
    Intent(u64),
    OstBlocks(u128),
}

impl Op {
    /// The key this op writes.
    pub fn slot(&self) -> Slot {
        match self {
            Op::Meta(k, _) => Slot::Meta(k.clone()),
            Op::Inode(k, _) => Slot::Inode(*k),
            Op::Dirent { dir, hash, name, .. } => Slot::Dirent(*dir, *hash, name.clone()),
            Op::Symlink(k, _) => Slot::Symlink(*k),
            Op::Xattr(k, n, _) => Slot::Xattr(*k, n.clone()),
            Op::Orphan(k, _) => Slot::Orphan(*k),
            Op::Reply(c, x, _) => Slot::Reply(*c, *x),
            Op::Layout(k, _) => Slot::Layout(*k),
            Op::Objects(k, _) => Slot::Objects(*k),
            Op::Pool(o, _) => Slot::Pool(*o),
            Op::Destroy(o, x, _) => Slot::Destroy(*o, *x),
            Op::Dom(k, b, _) => Slot::Dom(*k, *b),
            Op::DirStripe(k, _) => Slot::DirStripe(*k),
            Op::DirDefault(k, _) => Slot::DirDefault(*k),
            Op::Intent(k, _) => Slot::Intent(*k),
            Op::OstBlocks(k, _) => Slot::OstBlocks(*k),
        }
    }
}

// Tables and kinds of logged mutations.
const T_META: u8 = 1;
const T_INODES: u8 = 2;
const T_DIRENTS: u8 = 3;
const T_SYMLINKS: u8 = 4;
const T_XATTRS: u8 = 5;
const T_ORPHANS: u8 = 6;
const T_REPLIES: u8 = 7;
const T_LAYOUTS: u8 = 8;
const T_OBJECTS: u8 = 9;
const T_POOLS: u8 = 10;
const T_DESTROYS: u8 = 11;
const T_DOM: u8 = 12;
const T_DIRSTRIPES: u8 = 13;
const T_DIRDEFAULTS: u8 = 14;
const T_INTENTS: u8 = 15;
const T_OST_BLOCKS: u8 = 16;
const PUT: u8 = 1;
const DEL: u8 = 2;

/// A FID key in a log record.
fn big(e: Enc, k: u128) -> Enc {
    e.u64((k >> 64) as u64).u64(k as u64)
}

fn get_big(d: &mut Dec<'_>, what: &'static str) -> Result<u128> {
    Ok(((d.u64(what)? as u128) << 64) | d.u64(what)? as u128)
}

/// Version of a stored inode: 2 since attributes carry `rdev`.
const INODE_VERSION: u8 = 2;

pub fn encode_inode(i: &Inode) -> Vec<u8> {
    i.parent.put(i.attr.put(Enc::new(INODE_VERSION))).done()
}

pub fn decode_inode(b: &[u8]) -> Result<Inode> {
    let mut d = Dec::new(b, "inode", INODE_VERSION)?;
    let attr = Attr::get(&mut d)?;
    let parent = Fid::get(&mut d, "parent")?;
    d.end()?;
    Ok(Inode { attr, parent, version: 0 })
}

impl Op {
    /// Append this op to a redo record.
    pub fn encode(&self, e: Enc) -> Enc {
        fn put_or_del<T>(e: Enc, table: u8, v: &Option<T>) -> Enc {
            e.u8(table).u8(if v.is_some() { PUT } else { DEL })
        }
        fn opt(e: Enc, v: &Option<impl AsRef<[u8]>>) -> Enc {
            match v {
                Some(v) => e.bytes(v.as_ref()),
                None => e,
            }
        }
        match self {
            Op::Meta(k, v) => {
                let e = put_or_del(e, T_META, v).bytes(k.as_bytes());
                match v {
                    Some(v) => e.u64(*v),
                    None => e,
                }
            }
            Op::Inode(k, v) => opt(big(put_or_del(e, T_INODES, v), *k), &v.as_ref().map(encode_inode)),
            Op::Dirent { dir, hash, name, to } => {
                let e = big(put_or_del(e, T_DIRENTS, to), *dir).u64(*hash).bytes(name.as_bytes());
                match to {
                    Some((child, kind)) => big(e, *child).u32(*kind),
                    None => e,
                }
            }
            Op::Symlink(k, v) => opt(big(put_or_del(e, T_SYMLINKS, v), *k), v),
            Op::Xattr(k, name, v) => opt(big(put_or_del(e, T_XATTRS, v), *k).bytes(name.as_bytes()), v),
            Op::Orphan(k, put) => big(put_or_del(e, T_ORPHANS, &put.then_some(())), *k),
            Op::Reply(c, x, v) => opt(put_or_del(e, T_REPLIES, v).u64(*c).u64(*x), v),
            Op::Layout(k, v) => opt(big(put_or_del(e, T_LAYOUTS, v), *k), v),
            Op::Objects(k, v) => opt(big(put_or_del(e, T_OBJECTS, v), *k), v),
            Op::Pool(ost, v) => opt(put_or_del(e, T_POOLS, v).u32(*ost), v),
            Op::Destroy(ost, oid, put) => put_or_del(e, T_DESTROYS, &put.then_some(())).u32(*ost).u64(*oid),
            Op::Dom(k, b, v) => opt(big(put_or_del(e, T_DOM, v), *k).u64(*b), v),
            Op::DirStripe(k, v) => opt(big(put_or_del(e, T_DIRSTRIPES, v), *k), v),
            Op::DirDefault(k, v) => opt(big(put_or_del(e, T_DIRDEFAULTS, v), *k), v),
            Op::Intent(k, v) => opt(put_or_del(e, T_INTENTS, v).u64(*k), v),
            Op::OstBlocks(k, v) => {
                let e = big(put_or_del(e, T_OST_BLOCKS, v), *k);
                match v {
                    Some(v) => e.u64(*v),
                    None => e,
                }
            }
        }
    }

    /// Read one op of a redo record.
    pub fn decode(d: &mut Dec<'_>) -> Result<Op> {
        let (table, op) = (d.u8("table")?, d.u8("operation")?);
        let put = match op {
            PUT => true,
            DEL => false,
            other => return Err(storage(format!("log record with operation {other}"))),
        };
        // The value, read only for a put.
        macro_rules! val {
            ($e:expr) => {
                if put { Some($e) } else { None }
            };
        }
        let boxed = |d: &mut Dec<'_>, what, max| -> Result<Option<Box<[u8]>>> {
            Ok(if put { Some(d.bytes(what, max)?.into()) } else { None })
        };
        Ok(match table {
            T_META => {
                let k = d.str("meta key", 64)?.into();
                Op::Meta(k, val!(d.u64("meta value")?))
            }
            T_INODES => {
                let k = get_big(d, "inode")?;
                Op::Inode(k, val!(decode_inode(d.bytes("inode", 1 << 16)?)?))
            }
            T_DIRENTS => {
                let (dir, hash, name) = (get_big(d, "directory")?, d.u64("hash")?, d.str("name", NAME_MAX)?.into());
                Op::Dirent { dir, hash, name, to: val!((get_big(d, "child")?, d.u32("type")?)) }
            }
            T_SYMLINKS => {
                let k = get_big(d, "symlink")?;
                Op::Symlink(k, boxed(d, "target", SYMLINK_MAX)?)
            }
            T_XATTRS => {
                let (k, name) = (get_big(d, "xattr inode")?, d.str("xattr name", XATTR_NAME_MAX)?.into());
                Op::Xattr(k, name, boxed(d, "xattr value", XATTR_SIZE_MAX)?)
            }
            T_ORPHANS => Op::Orphan(get_big(d, "orphan")?, put),
            T_REPLIES => {
                let (c, x) = (d.u64("client")?, d.u64("xid")?);
                Op::Reply(c, x, boxed(d, "reply", 1 << 16)?)
            }
            T_LAYOUTS => {
                let k = get_big(d, "layout inode")?;
                Op::Layout(k, val!(Arc::from(d.bytes("layout", 1 << 16)?)))
            }
            T_OBJECTS => {
                let k = get_big(d, "objects inode")?;
                Op::Objects(k, boxed(d, "objects", 1 << 20)?)
            }
            T_POOLS => {
                let ost = d.u32("pool OST")?;
                Op::Pool(ost, boxed(d, "pool", 1 << 16)?)
            }
            T_DESTROYS => Op::Destroy(d.u32("destroy OST")?, d.u64("destroy object")?, put),
            T_DOM => {
                let (k, b) = (get_big(d, "DoM inode")?, d.u64("DoM block")?);
                Op::Dom(k, b, boxed(d, "DoM data", DOM_BLOCK as usize)?)
            }
            T_DIRSTRIPES => {
                let k = get_big(d, "striped directory")?;
                Op::DirStripe(k, boxed(d, "directory stripe", 1 << 16)?)
            }
            T_DIRDEFAULTS => {
                let k = get_big(d, "directory default")?;
                Op::DirDefault(k, boxed(d, "directory default", 64)?)
            }
            T_INTENTS => {
                let k = d.u64("intent")?;
                Op::Intent(k, boxed(d, "intent", 1 << 20)?)
            }
            T_OST_BLOCKS => {
                let k = get_big(d, "OST blocks inode")?;
                Op::OstBlocks(k, val!(d.u64("OST blocks")?))
            }
            other => return Err(storage(format!("log record for table {other}"))),
        })
    }
}

/// The version of a redo record's format.
const RECORD_VERSION: u8 = 1;

/// A redo record with no ops yet: a change appends its ops (see [`Op::encode`]) and
/// [`seal_record`] writes their count, so the record is never copied.
pub fn empty_record() -> Vec<u8> {
    reuse_record(Vec::new())
}

/// The biggest redo record buffer kept for the next change: a change that logged more
/// (many xattrs removed at once) gives its buffer back to the allocator.
const RECORD_KEPT_MAX: usize = 256 << 10;

/// [`empty_record`] in `buf`, the buffer of an earlier record: changes run one at a time
/// under the namespace's lock, so one buffer serves them all and a change allocates
/// nothing for its record (a 3,901-byte DoM create grew a fresh one twice).
pub fn reuse_record(mut buf: Vec<u8>) -> Vec<u8> {
    if buf.capacity() < 512 || buf.capacity() > RECORD_KEPT_MAX {
        buf = Vec::with_capacity(512);
    }
    buf.clear();
    buf.push(RECORD_VERSION);
    buf.extend_from_slice(&0u32.to_le_bytes());
    buf
}

/// Write the count of the ops appended to `rec`, made by [`empty_record`].
pub fn seal_record(rec: &mut [u8], count: u32) {
    rec[1..RECORD_HEADER].copy_from_slice(&count.to_le_bytes());
}

/// Bytes of a redo record before its ops: its version and their count.
pub const RECORD_HEADER: usize = 5;

/// The ops of a redo record.
pub fn decode_record(rec: &[u8]) -> Result<Vec<Op>> {
    let mut d = Dec::new(rec, "metadata log record", RECORD_VERSION)?;
    let n = d.u32("mutation count")?;
    let mut ops = Vec::with_capacity((n as usize).min(1 << 16));
    for _ in 0..n {
        ops.push(Op::decode(&mut d)?);
    }
    d.end()?;
    Ok(ops)
}

fn len_of(v: &Option<impl AsRef<[u8]>>) -> u64 {
    v.as_ref().map_or(0, |v| v.as_ref().len() as u64)
}

impl Mem {
    /// Undo an op (see [`Mem::apply`]).
    pub fn undo(&mut self, u: Undo) {
        match u {
            Undo::Op(op) => {
                self.apply(op);
            }
            Undo::DomImaged(k, b, stored) => self.index_dom(k, b, stored),
        }
    }

    /// Record that DoM block `b` of `k` is written out, `stored` (start-up).
    pub fn index_dom(&mut self, k: u128, b: u64, stored: Stored) {
        let old = self.dom.insert((k, b), DomBlock::Imaged(stored));
        let gone = old.as_ref().map_or(0, DomBlock::held);
        self.dom_bytes -= gone;
        self.dom_units -= whole_units(gone);
        self.held -= gone;
    }

    /// A checkpoint wrote every change below transno `below` out, DoM block `b` of `k`
    /// among them, `stored`: if no later change wrote the block again, memory keeps only
    /// where it is. (Comparing bytes would not do: a block truncated and written back
    /// with the same bytes after the checkpoint took its batch is not out as it is here.)
    pub fn imaged(&mut self, k: u128, b: u64, below: u64, stored: Stored) {
        if let Some(block) = self.dom.get_mut(&(k, b))
            && matches!(block, DomBlock::Here { stamp, .. } if *stamp < below)
        {
            let freed = block.take_out(stored);
            self.dom_bytes -= freed;
            self.dom_units -= whole_units(freed);
            self.held -= freed;
        }
    }

    /// Where every DoM block in the area is (start-up).
    pub fn dom_in_area(&self) -> impl Iterator<Item = &super::area::Extent> {
        self.dom.values().filter_map(|b| match b {
            DomBlock::Imaged(Stored::Area(e)) => Some(e),
            _ => None,
        })
    }

    /// Apply `op`; returns what undoes it (mostly the same key with what it held
    /// before).
    pub fn apply(&mut self, op: Op) -> Undo {
        macro_rules! swap {
            ($map:expr, $k:expr, $v:expr) => {
                match $v {
                    Some(v) => $map.insert($k, v),
                    None => $map.remove(&$k),
                }
            };
        }
        // Variable bytes held: `+new - old` for values that have them.
        let (add, sub);
        let inverse = match op {
            Op::Meta(k, v) => {
                let old = swap!(self.meta, k.clone(), v);
                (add, sub) = (0, 0);
                Op::Meta(k, old)
            }
            Op::Inode(k, v) => {
                (add, sub) = (0, 0);
                Op::Inode(k, self.put_inode(k, v))
            }
            Op::Dirent { dir, hash, name, to } => {
                let old = self.put_entry(dir, hash, &name, to);
                add = if to.is_some() { name.len() as u64 } else { 0 };
                sub = if old.is_some() { name.len() as u64 } else { 0 };
                Op::Dirent { dir, hash, name, to: old }
            }
            Op::Symlink(k, v) => {
                add = len_of(&v);
                let old = swap!(self.symlinks, k, v);
                sub = len_of(&old);
                Op::Symlink(k, old)
            }
            Op::Xattr(k, name, v) => {
                add = len_of(&v) + if v.is_some() { name.len() as u64 } else { 0 };
                let old = swap!(self.xattrs, (k, name.clone()), v);
                sub = len_of(&old) + if old.is_some() { name.len() as u64 } else { 0 };
                Op::Xattr(k, name, old)
            }
            Op::Orphan(k, put) => {
                let had = if put { !self.orphans.insert(k) } else { self.orphans.remove(&k) };
                (add, sub) = (0, 0);
                Op::Orphan(k, had)
            }
            Op::Reply(c, x, v) => {
                add = len_of(&v);
                let put = v.is_some();
                let old = swap!(self.replies, (c, x), v);
                sub = len_of(&old);
                match (put, old.is_some()) {
                    (true, false) => *self.reply_counts.entry(c).or_default() += 1,
                    (false, true) => {
                        if let Some(n) = self.reply_counts.get_mut(&c) {
                            *n -= 1;
                            if *n == 0 {
                                self.reply_counts.remove(&c);
                            }
                        }
                    }
                    _ => {}
                }
                Op::Reply(c, x, old)
            }
            Op::Layout(k, v) => {
                let v = v.map(|l| self.share_layout(l));
                (add, sub) = (0, 0);
                Op::Layout(k, self.put_layout(k, v))
            }
            Op::Objects(k, v) => {
                add = len_of(&v);
                let old = swap!(self.objects, k, v);
                sub = len_of(&old);
                Op::Objects(k, old)
            }
            Op::Pool(ost, v) => {
                let old = swap!(self.pools, ost, v);
                (add, sub) = (0, 0);
                Op::Pool(ost, old)
            }
            Op::Destroy(ost, oid, put) => {
                let had = if put { !self.destroys.insert((ost, oid)) } else { self.destroys.remove(&(ost, oid)) };
                (add, sub) = (0, 0);
                Op::Destroy(ost, oid, had)
            }
            Op::Dom(k, b, v) => {
                add = len_of(&v);
                let stamp = self.stamp;
                let old = swap!(self.dom, (k, b), v.map(|data| DomBlock::Here { stamp, data }));
                sub = old.as_ref().map_or(0, DomBlock::held);
                self.dom_bytes = (self.dom_bytes + add).saturating_sub(sub);
                self.dom_units = (self.dom_units + whole_units(add)).saturating_sub(whole_units(sub));
                match old {
                    Some(DomBlock::Imaged(stored)) => {
                        self.held = (self.held + add).saturating_sub(sub);
                        return Undo::DomImaged(k, b, stored);
                    }
                    Some(DomBlock::Here { data, .. }) => Op::Dom(k, b, Some(data)),
                    None => Op::Dom(k, b, None),
                }
            }
            Op::DirStripe(k, v) => {
                add = len_of(&v);
                let old = swap!(self.dirstripes, k, v);
                sub = len_of(&old);
                Op::DirStripe(k, old)
            }
            Op::DirDefault(k, v) => {
                add = len_of(&v);
                let old = swap!(self.dirdefaults, k, v);
                sub = len_of(&old);
                Op::DirDefault(k, old)
            }
            Op::Intent(k, v) => {
                add = len_of(&v);
                let old = swap!(self.intents, k, v);
                sub = len_of(&old);
                Op::Intent(k, old)
            }
            Op::OstBlocks(k, v) => {
                let old = swap!(self.ost_blocks, k, v);
                (add, sub) = (0, 0);
                Op::OstBlocks(k, old)
            }
        };
        self.held = (self.held + add).saturating_sub(sub);
        Undo::Op(inverse)
    }

    /// Put (or with `None` remove) inode `k`; what it was before. Its layout stays as
    /// it was (with the inode, or loose while there is none).
    fn put_inode(&mut self, k: u128, v: Option<Inode>) -> Option<Inode> {
        let old = self.inode(k);
        match v {
            Some(i) => {
                let layout = self.loose_layouts.remove(&k);
                let n = self.inodes.slot(k);
                if n.mode & IN_USE == 0 {
                    n.layout = layout;
                }
                n.set(&i.attr);
                self.versions.set(k, i.version);
                if mode::is_dir(i.attr.mode) {
                    self.parents.insert(k, i.parent);
                } else {
                    self.parents.remove(&k);
                }
            }
            None => {
                self.versions.set(k, 0);
                if let Some(n) = self.inodes.remove(k)
                    && let Some(l) = n.layout
                {
                    self.loose_layouts.insert(k, l);
                }
                self.parents.remove(&k);
            }
        }
        old
    }

    /// Put (or with `None` remove) the layout of `k`; what it was before.
    fn put_layout(&mut self, k: u128, v: Option<Arc<[u8]>>) -> Option<Arc<[u8]>> {
        let old = match self.inodes.get_mut(k) {
            Some(n) => std::mem::replace(&mut n.layout, v),
            None => match v {
                Some(l) => self.loose_layouts.insert(k, l),
                None => self.loose_layouts.remove(&k),
            },
        };
        match (&old, self.layout(k)) {
            (None, Some(_)) => self.layout_count += 1,
            (Some(_), None) => self.layout_count -= 1,
            _ => {}
        }
        old
    }

    /// Inode `k`, if it is here.
    pub fn inode(&self, k: u128) -> Option<Inode> {
        let n = self.inodes.get(k)?;
        let parent = self.parents.get(&k).copied().unwrap_or_default();
        Some(Inode { attr: n.attr(k), parent, version: self.versions.get(k) })
    }

    pub fn has_inode(&self, k: u128) -> bool {
        self.inodes.get(k).is_some()
    }

    pub fn inode_count(&self) -> u64 {
        self.inodes.count
    }

    /// The layout of `k` (a file's, or a directory's default).
    pub fn layout(&self, k: u128) -> Option<&Arc<[u8]>> {
        match self.inodes.get(k) {
            Some(n) => n.layout.as_ref(),
            None => self.loose_layouts.get(&k),
        }
    }

    /// Put (or with `None` remove) entry `name` of `dir` at `hash`; what it named before.
    fn put_entry(&mut self, dir: u128, hash: u64, name: &str, to: Option<(u128, u32)>) -> Option<(u128, u32)> {
        use std::collections::btree_map::Entry as Slot;
        let d = self.dirs.entry(dir).or_default();
        let old = match (d.entry(hash), to) {
            (Slot::Vacant(v), Some((child, kind))) => {
                v.insert(Entry { name: name.into(), child, kind, next: None });
                None
            }
            (Slot::Vacant(_), None) => None,
            (Slot::Occupied(mut o), to) => {
                // Walk the chain to `name`'s link (or its end).
                let mut link: &mut Entry = o.get_mut();
                let old = loop {
                    if &*link.name == name {
                        break Some((link.child, link.kind));
                    }
                    match link.next {
                        Some(ref mut n) => link = n,
                        None => break None,
                    }
                };
                match (old, to) {
                    (Some(_), Some((child, kind))) => {
                        (link.child, link.kind) = (child, kind);
                    }
                    (None, Some((child, kind))) => {
                        link.next = Some(Box::new(Entry { name: name.into(), child, kind, next: None }));
                    }
                    (Some(_), None) => {
                        if &*o.get().name == name {
                            // The head goes: the next in the chain (if any) takes its place.
                            let head = o.get_mut();
                            match head.next.take() {
                                Some(next) => *head = *next,
                                None => {
                                    o.remove();
                                }
                            }
                        } else {
                            let mut link: &mut Entry = o.get_mut();
                            while link.next.as_deref().is_some_and(|n| &*n.name != name) {
                                link = link.next.as_deref_mut().expect("checked just above");
                            }
                            if let Some(gone) = link.next.take() {
                                link.next = gone.next;
                            }
                        }
                    }
                    (None, None) => {}
                }
                old
            }
        };
        if self.dirs.get(&dir).is_some_and(|d| d.is_empty()) {
            self.dirs.remove(&dir);
        }
        match (old.is_some(), to.is_some()) {
            (false, true) => self.entries += 1,
            (true, false) => self.entries -= 1,
            _ => {}
        }
        old
    }

    /// The one shared copy of a layout.
    fn share_layout(&mut self, l: Arc<[u8]>) -> Arc<[u8]> {
        if let Some(s) = self.shared_layouts.get(&*l) {
            return s.clone();
        }
        if self.shared_layouts.len() >= 64 && self.shared_layouts.len().is_power_of_two() {
            // Forget the layouts no file has any more.
            self.shared_layouts.retain(|s| Arc::strong_count(s) > 1);
        }
        self.shared_layouts.insert(l.clone());
        l
    }

    /// Reply records kept for `client` (counted as they are put and removed).
    pub fn reply_count(&self, client: u64) -> usize {
        self.reply_counts.get(&client).copied().unwrap_or(0)
    }

    /// The entry `name` of `dir`: its child and type.
    pub fn entry(&self, dir: u128, hash: u64, name: &str) -> Option<(u128, u32)> {
        find(self.dirs.get(&dir)?.get(&hash), name).map(|e| (e.child, e.kind))
    }

    /// The entries of `dir` after cookie `after`, in cookie order: (cookie, entry).
    pub fn entries_after(&self, dir: u128, after: u64) -> impl Iterator<Item = (u64, &Entry)> {
        self.dirs.get(&dir).into_iter().flat_map(move |d| {
            d.range(after.saturating_add(1)..)
                .flat_map(|(h, e)| std::iter::successors(Some(e), |e| e.next.as_deref()).map(move |e| (*h, e)))
        })
    }

    pub fn has_entries(&self, dir: u128) -> bool {
        self.dirs.get(&dir).is_some_and(|d| !d.is_empty())
    }

    /// The value of xattr `name` of inode `k`, if it has it.
    pub fn xattr(&self, k: u128, name: &str) -> Option<&[u8]> {
        self.xattrs_of(k).find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The access ACL of inode `k`, if it has one (a malformed one counts as none: it
    /// was checked when set).
    pub fn access_acl(&self, k: u128) -> Option<nacre_proto::acl::Acl> {
        nacre_proto::acl::Acl::from_xattr(self.xattr(k, nacre_proto::acl::ACCESS)?).ok()
    }

    /// The xattrs of inode `k`: (name, value).
    pub fn xattrs_of(&self, k: u128) -> impl Iterator<Item = (&str, &[u8])> {
        self.xattrs
            .range((k, Box::<str>::from(""))..)
            .take_while(move |((o, _), _)| *o == k)
            .map(|((_, n), v)| (&**n, &**v))
    }

    /// The DoM blocks of inode `k` in `[first, last]`.
    pub fn dom_of(&self, k: u128, first: u64, last: u64) -> impl Iterator<Item = (u64, &DomBlock)> {
        self.dom.range((k, first)..=(k, last)).map(|((_, b), v)| (*b, v))
    }

    /// About the bytes the tables hold: a fixed cost per inode and per entry of every
    /// other table, plus the names, values and data.
    pub fn bytes(&self) -> u64 {
        self.inodes.count * INODE_BYTES
            + self.entries * ENTRY_BYTES
            + (self.symlinks.len()
                + self.xattrs.len()
                + self.replies.len()
                + self.parents.len()
                + self.objects.len()
                + self.dom.len()
                + self.ost_blocks.len()) as u64
                * VALUE_BYTES
            + self.held
    }
}

/// The error of an op that cannot be: used where an image holds what no op could write.
pub fn corrupt(what: impl std::fmt::Display) -> MdError {
    storage(format!("metadata image: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ent(dir: u128, hash: u64, name: &str, to: Option<(u128, u32)>) -> Op {
        Op::Dirent { dir, hash, name: name.into(), to }
    }

    #[test]
    fn reply_records_are_counted_per_client_through_puts_removals_and_undo() {
        let mut m = Mem::default();
        let rec = || Some(b"r".to_vec().into_boxed_slice());
        let counted = |m: &Mem, c: u64| m.replies.range((c, 0)..=(c, u64::MAX)).count();
        let mut undo = Vec::new();
        for (c, x) in [(1, 1), (1, 2), (2, 1), (1, 2), (1, 3)] {
            undo.push(m.apply(Op::Reply(c, x, rec())));
        }
        undo.push(m.apply(Op::Reply(1, 1, None)));
        undo.push(m.apply(Op::Reply(3, 1, None)));
        for c in [1, 2, 3] {
            assert_eq!(m.reply_count(c), counted(&m, c), "client {c}");
        }
        assert_eq!(m.reply_counts.get(&1), Some(&2), "a record put twice counts once");
        for u in undo.into_iter().rev() {
            m.undo(u);
        }
        assert!(m.replies.is_empty() && m.reply_counts.is_empty(), "undone, nothing is counted");
    }

    #[test]
    fn ops_round_trip_and_undo() {
        let ops = vec![
            Op::Meta("next_oid".into(), Some(7)),
            Op::Inode(
                5,
                Some(Inode { attr: Attr { mode: 0o100644, ..Attr::default() }, parent: Fid::ROOT, version: 0 }),
            ),
            ent(1, 9, "a", Some((5, 0o100000))),
            Op::Xattr(5, "user.x".into(), Some(b"v".to_vec().into())),
            Op::Orphan(5, true),
            Op::Layout(5, Some(Arc::from(&b"lay"[..]))),
            Op::Destroy(1, 2, true),
            Op::Dom(5, 0, Some(vec![1u8; 10].into())),
            Op::OstBlocks(5, Some(8)),
            Op::Reply(1, 2, None),
        ];
        let mut e = Enc(empty_record());
        for op in &ops {
            e = op.encode(e);
        }
        let mut rec = e.done();
        seal_record(&mut rec, ops.len() as u32);
        assert_eq!(decode_record(&rec).unwrap(), ops);

        let mut m = Mem::default();
        let undo: Vec<Undo> = ops.iter().cloned().map(|o| m.apply(o)).collect();
        assert_eq!(m.entry(1, 9, "a"), Some((5, 0o100000)));
        assert_eq!(m.dom_bytes, 10);
        assert!(m.bytes() > 0);
        for u in undo.into_iter().rev() {
            m.undo(u);
        }
        assert!(
            m.inodes.pages.is_empty()
                && m.inodes.count == 0
                && m.dirs.is_empty()
                && m.xattrs.is_empty()
                && m.orphans.is_empty()
        );
        assert!(m.loose_layouts.is_empty() && m.destroys.is_empty() && m.dom.is_empty() && m.ost_blocks.is_empty());
        assert_eq!(m.layout_count, 0);
        assert_eq!((m.dom_bytes, m.held), (0, 0));
    }

    #[test]
    fn versions_of_committed_changes_go_once_the_map_has_doubled() {
        let mut v = Versions::default();
        for k in 1..=5000u128 {
            v.set(k, k as u64);
        }
        v.set(7, 0);
        assert_eq!((v.get(7), v.get(8)), (0, 8));
        v.prune(4000);
        assert_eq!((v.get(3999), v.get(4001), v.map.len()), (0, 4001, 1000));
        for k in 1..=2000u128 {
            v.set(k, 1);
        }
        v.prune(u64::MAX);
        assert_eq!(v.map.len(), 3000, "not doubled since: kept");
        for k in 3001..=6000u128 {
            v.set(k << 20, 1);
        }
        v.prune(u64::MAX);
        assert!(v.map.is_empty());
    }

    #[test]
    fn inodes_fill_pages_and_free_them() {
        let mut m = Mem::default();
        let fid = |oid: u32| Fid::new(0x2_0000_0400, oid).key();
        let file = |oid: u32| Inode {
            attr: Attr { fid: Fid::from_key(fid(oid)), mode: 0, nlink: 1, ..Attr::default() },
            parent: Fid::ROOT,
            version: 0,
        };
        for oid in 1..=600 {
            assert_eq!(m.apply(Op::Inode(fid(oid), Some(file(oid)))), Undo::Op(Op::Inode(fid(oid), None)));
        }
        assert_eq!((m.inode_count(), m.inodes.pages.len()), (600, 3));
        // Mode 0 is an inode too, and a file records no parent.
        assert_eq!(m.inode(fid(300)).unwrap(), Inode { parent: Fid::default(), ..file(300) });
        assert!(m.inode(fid(601)).is_none() && m.inode(fid(0)).is_none());
        m.apply(Op::Layout(fid(7), Some(Arc::from(&b"L"[..]))));
        for oid in 1..=600 {
            m.apply(Op::Inode(fid(oid), None));
        }
        assert_eq!((m.inode_count(), m.inodes.pages.len(), m.inodes.used.len()), (0, 0, 0));
        // The layout of a removed inode waits, loose, for its own removal.
        assert_eq!(m.layout(fid(7)).map(|l| &l[..]), Some(&b"L"[..]));
        m.apply(Op::Layout(fid(7), None));
        assert!(m.loose_layouts.is_empty() && m.layout_count == 0);
    }

    #[test]
    fn names_sharing_a_hash_chain() {
        let mut m = Mem::default();
        for (n, c) in [("a", 1), ("b", 2), ("c", 3)] {
            assert_eq!(m.apply(ent(1, 7, n, Some((c, 0)))), Undo::Op(ent(1, 7, n, None)));
        }
        m.apply(ent(1, 8, "d", Some((4, 0))));
        let listed: Vec<(u64, String)> = m.entries_after(1, 0).map(|(h, e)| (h, e.name.to_string())).collect();
        assert_eq!(listed, [(7, "a".into()), (7, "b".into()), (7, "c".into()), (8, "d".into())]);
        assert_eq!(m.entries_after(1, 7).count(), 1);
        // Removing the middle, then the head, keeps the rest.
        assert_eq!(m.apply(ent(1, 7, "b", None)), Undo::Op(ent(1, 7, "b", Some((2, 0)))));
        assert_eq!(m.apply(ent(1, 7, "a", None)), Undo::Op(ent(1, 7, "a", Some((1, 0)))));
        assert_eq!(m.entry(1, 7, "c"), Some((3, 0)));
        assert_eq!(m.entry(1, 7, "a"), None);
        m.apply(ent(1, 7, "c", None));
        m.apply(ent(1, 8, "d", None));
        assert!(!m.has_entries(1) && m.dirs.is_empty());
    }
}
