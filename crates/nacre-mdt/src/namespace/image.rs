//! The MDT's image: every table in redb on the metadata volume, written only by
//! checkpoints (the log's records applied in one large transaction, made durable with
//! the log position they reach) and read whole at start-up. DoM blocks' bytes are not
//! in it but in the DoM area beside it (see [`super::area`]); it keeps where they are.
//!
//! redb keeps its own copy-on-write pages and commits atomically, so a crash during a
//! checkpoint leaves the previous image and the log position that goes with it: start-up
//! replays from there. It costs about 120 µs per commit, which the change path no longer
//! pays: a checkpoint of thousands of changes pays it once.

use std::sync::Arc;

use nacre_proto::mdt::errno;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use super::area::{self, Run};
use super::mem::{Mem, Op, Stored, decode_inode, encode_inode};
use super::{MdError, Result};

pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const INODES: TableDefinition<u128, &[u8]> = TableDefinition::new("inodes");
const DIRENTS: TableDefinition<(u128, u64, &str), (u128, u32)> = TableDefinition::new("dirents");
const SYMLINKS: TableDefinition<u128, &[u8]> = TableDefinition::new("symlinks");
const XATTRS: TableDefinition<(u128, &str), &[u8]> = TableDefinition::new("xattrs");
const ORPHANS: TableDefinition<u128, u8> = TableDefinition::new("orphans");
const LAYOUTS: TableDefinition<u128, &[u8]> = TableDefinition::new("layouts");
const OBJECTS: TableDefinition<u128, &[u8]> = TableDefinition::new("objects");
const OST_BLOCKS: TableDefinition<u128, u64> = TableDefinition::new("ost_blocks");
const POOLS: TableDefinition<u32, &[u8]> = TableDefinition::new("pools");
const DESTROYS: TableDefinition<(u32, u64), u8> = TableDefinition::new("destroys");
/// Where each DoM block's bytes are ([`area::Value`]): the DoM area, or the entry itself.
const DOM: TableDefinition<(u128, u64), &[u8]> = TableDefinition::new("dom_index");
/// The DoM blocks' bytes themselves, as MDTs of format 3 (before the DoM area) kept them.
const DOM_FORMAT_3: TableDefinition<(u128, u64), &[u8]> = TableDefinition::new("dom");
const REPLIES: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("replies");
const DIRSTRIPES: TableDefinition<u128, &[u8]> = TableDefinition::new("dirstripes");
const DIRDEFAULTS: TableDefinition<u128, &[u8]> = TableDefinition::new("dirdefaults");
const INTENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("intents");
/// What the MDT keeps of other services' state, by name: the file system's configuration
/// as the MGS last gave it (see [`Namespace::keep_config_copy`](super::Namespace)). Written
/// apart from checkpoints, in its own transaction; not part of the namespace.
const KEPT: TableDefinition<&str, &[u8]> = TableDefinition::new("kept");

/// Every table of the image, open in one write transaction: a checkpoint opens them
/// once and writes thousands of ops (opening a table per op cost more than the op).
pub struct Writer<'t> {
    meta: redb::Table<'t, &'static str, u64>,
    inodes: redb::Table<'t, u128, &'static [u8]>,
    dirents: redb::Table<'t, (u128, u64, &'static str), (u128, u32)>,
    symlinks: redb::Table<'t, u128, &'static [u8]>,
    xattrs: redb::Table<'t, (u128, &'static str), &'static [u8]>,
    orphans: redb::Table<'t, u128, u8>,
    replies: redb::Table<'t, (u64, u64), &'static [u8]>,
    layouts: redb::Table<'t, u128, &'static [u8]>,
    objects: redb::Table<'t, u128, &'static [u8]>,
    ost_blocks: redb::Table<'t, u128, u64>,
    pools: redb::Table<'t, u32, &'static [u8]>,
    destroys: redb::Table<'t, (u32, u64), u8>,
    dom: redb::Table<'t, (u128, u64), &'static [u8]>,
    dirstripes: redb::Table<'t, u128, &'static [u8]>,
    dirdefaults: redb::Table<'t, u128, &'static [u8]>,
    intents: redb::Table<'t, u64, &'static [u8]>,
}

impl<'t> Writer<'t> {
    pub fn open(txn: &'t WriteTransaction) -> Result<Writer<'t>> {
        Ok(Writer {
            meta: txn.open_table(META)?,
            inodes: txn.open_table(INODES)?,
            dirents: txn.open_table(DIRENTS)?,
            symlinks: txn.open_table(SYMLINKS)?,
            xattrs: txn.open_table(XATTRS)?,
            orphans: txn.open_table(ORPHANS)?,
            replies: txn.open_table(REPLIES)?,
            layouts: txn.open_table(LAYOUTS)?,
            objects: txn.open_table(OBJECTS)?,
            ost_blocks: txn.open_table(OST_BLOCKS)?,
            pools: txn.open_table(POOLS)?,
            destroys: txn.open_table(DESTROYS)?,
            dom: txn.open_table(DOM)?,
            dirstripes: txn.open_table(DIRSTRIPES)?,
            dirdefaults: txn.open_table(DIRDEFAULTS)?,
            intents: txn.open_table(INTENTS)?,
        })
    }

    /// Write `op` into the image.
    pub fn apply(&mut self, op: &Op) -> Result<()> {
        macro_rules! put_or_del {
            ($t:expr, $key:expr, $value:expr) => {{
                match $value {
                    Some(v) => {
                        $t.insert($key, v)?;
                    }
                    None => {
                        $t.remove($key)?;
                    }
                }
            }};
        }
        match op {
            Op::Meta(k, v) => put_or_del!(self.meta, &**k, *v),
            Op::Inode(k, v) => put_or_del!(self.inodes, *k, v.as_ref().map(encode_inode).as_deref()),
            Op::Dirent { dir, hash, name, to } => put_or_del!(self.dirents, (*dir, *hash, &**name), *to),
            Op::Symlink(k, v) => put_or_del!(self.symlinks, *k, v.as_deref()),
            Op::Xattr(k, name, v) => put_or_del!(self.xattrs, (*k, &**name), v.as_deref()),
            Op::Orphan(k, put) => put_or_del!(self.orphans, *k, put.then_some(1u8)),
            Op::Reply(c, x, v) => put_or_del!(self.replies, (*c, *x), v.as_deref()),
            Op::Layout(k, v) => put_or_del!(self.layouts, *k, v.as_deref()),
            Op::Objects(k, v) => put_or_del!(self.objects, *k, v.as_deref()),
            Op::Pool(ost, v) => put_or_del!(self.pools, *ost, v.as_deref()),
            Op::Destroy(ost, oid, put) => put_or_del!(self.destroys, (*ost, *oid), put.then_some(1u8)),
            // Their bytes go to the DoM area and the runs they replace are freed after the
            // commit: `wal::write_ops` writes them, with `Writer::dom`.
            Op::Dom(k, b, _) => {
                return Err(MdError::new(
                    errno::EINVAL,
                    format!("DoM block {b} of {} written without the DoM area", nacre_proto::fid::Fid::from_key(*k)),
                ));
            }
            Op::DirStripe(k, v) => put_or_del!(self.dirstripes, *k, v.as_deref()),
            Op::DirDefault(k, v) => put_or_del!(self.dirdefaults, *k, v.as_deref()),
            Op::Intent(k, v) => put_or_del!(self.intents, *k, v.as_deref()),
            Op::OstBlocks(k, v) => put_or_del!(self.ost_blocks, *k, *v),
        }
        Ok(())
    }

    /// Put (or with `None` remove) the index entry of DoM block `b` of `k`
    /// ([`area::Value`] encoded); returns the area runs of the entry it replaced, which
    /// are free once this transaction is committed.
    pub fn dom(&mut self, k: u128, b: u64, value: Option<&[u8]>) -> Result<Option<Box<[Run]>>> {
        let old = match value {
            Some(v) => self.dom.insert((k, b), v)?,
            None => self.dom.remove((k, b))?,
        };
        let Some(old) = old else { return Ok(None) };
        match area::Value::decode(old.value()) {
            Ok(area::Value::Area(e)) => Ok(Some(e.runs)),
            Ok(area::Value::Inline(_)) => Ok(None),
            // Its units stay taken until a restart rebuilds the area from the index.
            Err(e) => {
                let fid = nacre_proto::fid::Fid::from_key(k);
                eprintln!("mdt: DoM block {b} of {fid} replaced a damaged entry ({}); its units stay taken", e.message);
                Ok(None)
            }
        }
    }
}

/// Move the DoM blocks of an image of format 3 (their bytes in a table of their own)
/// into the index, each inline: nothing is copied out to the DoM area, blocks go there
/// as they are written again. Returns how many moved.
pub fn move_format_3_dom(txn: &WriteTransaction) -> Result<u64> {
    let mut index = txn.open_table(DOM)?;
    let mut n = 0;
    {
        let old = match txn.open_table(DOM_FORMAT_3) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        for row in old.iter()? {
            let (k, v) = row?;
            index.insert(k.value(), area::Value::Inline(v.value()).encode().as_slice())?;
            n += 1;
        }
    }
    txn.delete_table(DOM_FORMAT_3)?;
    Ok(n)
}

/// The image's META value `k`.
pub fn meta(db: &Database, k: &str) -> Result<Option<u64>> {
    let txn = db.begin_read()?;
    let t = txn
        .open_table(META)
        .map_err(|e| MdError::new(errno::EINVAL, format!("not a metadata target (no meta table: {e})")))?;
    Ok(t.get(k)?.map(|v| v.value()))
}

/// Keep `value` under `name` in the image's `kept` table, durably, in a transaction of
/// its own.
pub fn put_kept(db: &Database, name: &str, value: &[u8]) -> Result<()> {
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate).map_err(|e| MdError::new(errno::EIO, e.to_string()))?;
    txn.open_table(KEPT)?.insert(name, value)?;
    txn.commit()?;
    Ok(())
}

/// What the image keeps under `name`, if anything (an image made before the table was
/// has nothing).
pub fn kept(db: &Database, name: &str) -> Result<Option<Vec<u8>>> {
    let txn = db.begin_read()?;
    let t = match txn.open_table(KEPT) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(t.get(name)?.map(|v| v.value().to_vec()))
}

/// DoM blocks `blocks` of inode `k` whose bytes the index holds inline, from the image's
/// last commit (`None` for a block it has not, or not inline).
pub fn read_dom(db: &Database, k: u128, blocks: impl Iterator<Item = u64>) -> Result<Vec<Option<Vec<u8>>>> {
    let txn = db.begin_read()?;
    let t = txn.open_table(DOM)?;
    blocks
        .map(|b| {
            Ok(t.get((k, b))?.and_then(|v| match area::Value::decode(v.value()) {
                Ok(area::Value::Inline(d)) => Some(d.to_vec()),
                _ => None,
            }))
        })
        .collect()
}

/// Read the whole image into memory (but DoM blocks, whose index only is kept), from a
/// copy of it read in large sequential reads: redb walking its B-trees on the volume
/// reads one page at a time (a million-file image took 8 s on this machine's disk
/// that way, and loads in about 2 s from memory). The copy is let go at the end.
pub fn load_copy(volume: std::sync::Arc<nacre_raid::Volume>, size: u64, sync: nacre_osd::SyncMode) -> Result<Mem> {
    use redb::StorageBackend;
    const CHUNK: u64 = 8 << 20;
    let src = nacre_osd::backend::VolumeBackend::open(volume, 0, size, sync)?;
    let len = src.len()?;
    let copy = redb::backends::InMemoryBackend::new();
    copy.set_len(len)?;
    let mut buf = vec![0u8; CHUNK.min(len) as usize];
    let mut at = 0;
    while at < len {
        let n = CHUNK.min(len - at) as usize;
        src.read(at, &mut buf[..n])?;
        copy.write(at, &buf[..n])?;
        at += n as u64;
    }
    drop(buf);
    load(&Arc::new(Database::builder().create_with_backend(copy)?))
}

/// Read the whole image into memory (but DoM blocks, whose index only is kept).
pub fn load(db: &Arc<Database>) -> Result<Mem> {
    let txn = db.begin_read()?;
    let mut m = Mem::default();
    // Each table's rows become the ops that would have written them.
    macro_rules! each {
        ($table:expr, |$k:ident, $v:ident| $op:expr) => {
            for row in txn.open_table($table)?.iter()? {
                let (k, v) = row?;
                let ($k, $v) = (k.value(), v.value());
                m.apply($op);
            }
        };
    }
    each!(META, |k, v| Op::Meta(k.into(), Some(v)));
    for row in txn.open_table(INODES)?.iter()? {
        let (k, v) = row?;
        m.apply(Op::Inode(k.value(), Some(decode_inode(v.value())?)));
    }
    each!(DIRENTS, |k, v| Op::Dirent { dir: k.0, hash: k.1, name: k.2.into(), to: Some(v) });
    each!(SYMLINKS, |k, v| Op::Symlink(k, Some(v.into())));
    each!(XATTRS, |k, v| Op::Xattr(k.0, k.1.into(), Some(v.into())));
    each!(ORPHANS, |k, _v| Op::Orphan(k, true));
    each!(REPLIES, |k, v| Op::Reply(k.0, k.1, Some(v.into())));
    each!(LAYOUTS, |k, v| Op::Layout(k, Some(Arc::from(v))));
    each!(OBJECTS, |k, v| Op::Objects(k, Some(v.into())));
    each!(OST_BLOCKS, |k, v| Op::OstBlocks(k, Some(v)));
    each!(POOLS, |k, v| Op::Pool(k, Some(v.into())));
    each!(DESTROYS, |k, _v| Op::Destroy(k.0, k.1, true));
    // DoM blocks stay where they are: memory keeps their index.
    for row in txn.open_table(DOM)?.iter()? {
        let (k, v) = row?;
        let (f, b) = k.value();
        let stored = match area::Value::decode(v.value()) {
            Ok(area::Value::Inline(d)) => Stored::Inline(d.len() as u32),
            Ok(area::Value::Area(e)) => Stored::Area(e),
            Err(e) => {
                let fid = nacre_proto::fid::Fid::from_key(f);
                return Err(MdError::new(e.errno, format!("DoM block {b} of {fid}: {}", e.message)));
            }
        };
        m.index_dom(f, b, stored);
    }
    each!(DIRSTRIPES, |k, v| Op::DirStripe(k, Some(v.into())));
    each!(DIRDEFAULTS, |k, v| Op::DirDefault(k, Some(v.into())));
    each!(INTENTS, |k, v| Op::Intent(k, Some(v.into())));
    Ok(m)
}
