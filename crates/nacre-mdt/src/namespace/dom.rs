//! Data on the MDT (DoM): a file's first bytes in 64 KiB blocks, written and read
//! through the namespace, logged like any change.

use super::*;
use mem::{DomBlock, Stored};

/// The DoM blocks `[first, last]` of inode `k` that exist, with their bytes: from
/// memory, from the DoM area, or from the image's index for a block it keeps inline.
/// Called under the namespace's lock (read or write), which keeps memory, the area and
/// the image's last commit in step: a block is marked written out only once the commit
/// that points at its bytes is done, a block written since is in memory again, and
/// units are reused only after the commit that let them go.
fn dom_bytes(m: &Mem, ns: &Namespace, k: u128, first: u64, last: u64) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut inline = Vec::new();
    let fid = || Fid::from_key(k);
    for (b, v) in m.dom_of(k, first, last) {
        match v {
            DomBlock::Here { data, .. } => out.push((b, data.to_vec())),
            DomBlock::Imaged(Stored::Inline(len)) => inline.push((b, *len)),
            DomBlock::Imaged(Stored::Area(e)) => {
                let data = area::read(ns.wal.volume(), e)
                    .map_err(|why| MdError::new(errno::EIO, format!("DoM block {b} of {}: {why}", fid())))?;
                out.push((b, data));
            }
        }
    }
    if !inline.is_empty() {
        for ((b, len), data) in inline.iter().zip(image::read_dom(&ns.db, k, inline.iter().map(|x| x.0))?) {
            let data = data
                .filter(|d| d.len() == *len as usize)
                .ok_or_else(|| storage(format!("DoM block {b} of {} is not in the image as the index says", fid())))?;
            out.push((*b, data));
        }
    }
    out.sort_unstable_by_key(|x| x.0);
    Ok(out)
}

impl Tx<'_> {
    /// The file's DoM blocks `[first, last]` that exist, with their bytes (read from the
    /// image for those a checkpoint took out of memory).
    pub(super) fn dom_blocks(&self, fid: Fid, first: u64, last: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let m = self.m();
        dom_bytes(&m, self.ns, fid.key(), first, last)
    }

    /// Put block `block` of the file: `data` becomes it (no copy when its capacity is
    /// its length, as a block built by `resize` from empty has).
    pub(super) fn put_dom(&self, fid: Fid, block: u64, data: Vec<u8>) -> Result<()> {
        self.apply(Op::Dom(fid.key(), block, Some(data.into_boxed_slice())));
        Ok(())
    }

    pub(super) fn del_dom(&self, fid: Fid, block: u64) -> Result<()> {
        if self.m().dom_of(fid.key(), block, block).next().is_some() {
            self.apply(Op::Dom(fid.key(), block, None));
        }
        Ok(())
    }

    /// Write `data` at `[offset, stop)` of file `fid`'s DoM blocks (the caller checked it
    /// is a regular file, the range lies in its DoM component, and the write is allowed);
    /// returns its attributes.
    pub(super) fn write_dom_at(&mut self, fid: Fid, offset: u64, stop: u64, data: &[u8]) -> Result<Attr> {
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
            self.put_dom(fid, b, block)?;
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
    pub(super) fn trim_dom(&self, fid: Fid, size: u64) -> Result<u64> {
        let blocks: Vec<(u64, u64)> =
            self.m().dom_of(fid.key(), size / DOM_BLOCK, u64::MAX).map(|(b, v)| (b, v.bytes())).collect();
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
                self.put_dom(fid, b, v)?;
            }
        }
        Ok(removed)
    }
}

impl Namespace {
    /// Whether new files may keep their first bytes here (DoM): while the DoM area can
    /// take the DoM bytes waiting in memory (`pending`) and a block more, and still leave
    /// the image two growths. That last room is kept for inodes, so an MDT that DoM data
    /// filled still makes files (with their bytes on OSTs).
    pub(super) fn dom_fits(&self, pending: u64) -> bool {
        lock(&self.area).room(2) >= pending + DOM_BLOCK
    }

    /// [`Namespace::dom_fits`] with what waits in memory now.
    pub fn has_room_for_dom(&self) -> bool {
        self.dom_fits(read(&self.mem).dom_units)
    }

    /// ENOSPC for `bytes` more of DoM data once the DoM area could not take them with the
    /// DoM bytes waiting in memory (`m`: the tables, as the caller holds them) and leave
    /// the image one growth.
    fn room_for_dom(&self, m: &Mem, bytes: usize) -> Result<()> {
        let room = lock(&self.area).room(1);
        if m.dom_units + bytes as u64 > room {
            return Err(MdError::new(
                errno::ENOSPC,
                format!(
                    "MDT {}'s DoM data fills the room its volume has left: {} KiB, for {} KiB waiting to be \
                     written out and {bytes} bytes more",
                    self.index,
                    room >> 10,
                    m.dom_bytes >> 10
                ),
            ));
        }
        Ok(())
    }

    /// Where a file's DoM component ends, if its layout starts with one.
    pub(super) fn dom_end(&self, fid: Fid) -> Result<Option<u64>> {
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
        {
            let m = read(&self.mem);
            self.room_to_grow(&m)?;
            self.room_for_dom(&m, data.len())?;
        }
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
                if !by_writer && !tx.permits(&cred, &a, W) {
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
                // Checked once the layout is known: an MDT short of room gives new files
                // no DoM component (EINVAL above), which a client takes as "create, then
                // write".
                tx.ns.room_for_dom(&tx.m(), data.len())?;
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
        if !may_acl(&read(&self.mem), cred, &a, R) {
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
        for (b, v) in dom_bytes(&m, self, fid.key(), offset / DOM_BLOCK, (stop - 1) / DOM_BLOCK)? {
            let start = b * DOM_BLOCK;
            let (lo, hi) = (offset.max(start), stop.min(start + v.len() as u64));
            if lo < hi {
                out[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&v[(lo - start) as usize..(hi - start) as usize]);
            }
        }
        Ok(out)
    }
}
