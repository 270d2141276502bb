//! Where a file's bytes live: a read or write split by the file's layout into pieces, one
//! per object and RPC, and the file size that the objects' sizes imply (a glimpse).
//!
//! A component `[start, end)` striped over `count` objects with stripes of `size` bytes
//! keeps byte `x` in object `(x - start) / size % count`, at offset
//! `(x - start) / (size * count) * size + (x - start) % size` of it
//! ([`nacre_proto::layout::stripe_of`]). A DoM component keeps its bytes on the MDT at
//! their file offset.

use nacre_proto::layout::{DEFAULT_STRIPE_SIZE, EOF, Kind, Layout, Striping, stripe_of};

use crate::error::{Error, Result, errno};

/// A file's layout with the objects the MDS gave each component: per component, (OST
/// index, object id) per stripe. A component without objects has an empty list: a DoM
/// one, or a striped one no write has reached yet (the MDS gives a striped component
/// its objects at the first write that needs them, a layout intent, as Lustre
/// instantiates PFL components), or one of a file made while no OST was there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLayout {
    pub layout: Layout,
    pub objects: Vec<Vec<(u32, u64)>>,
}

/// Where one piece of an IO goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    /// The file's DoM component, on its MDT, at the piece's file offset.
    Mdt,
    /// An OST object.
    Object { ost: u32, oid: u64 },
    /// Bytes of a striped component that has no objects yet: zeros (a read only).
    Hole,
}

/// One RPC's worth of an IO: `len` bytes at `offset` of `place`, gathered from (or
/// scattered to) the spans `(file offset, length)` of the file, in object order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub place: Place,
    pub offset: u64,
    pub len: u64,
    pub spans: Vec<(u64, u64)>,
}

impl FileLayout {
    /// Does a striped component that begins before byte `end` still lack its objects
    /// (so a write up to `end` needs a layout intent first, and a read there a fresh
    /// look at the layout)?
    pub fn lacks_objects_before(&self, end: u64) -> bool {
        self.layout
            .components
            .iter()
            .enumerate()
            .any(|(i, c)| c.start < end && matches!(c.kind, Kind::Stripes(_)) && self.objects_of(i).is_empty())
    }

    /// May this layout still change: does a striped component lack its objects? Once
    /// each has them, the layout and objects are the file's for good.
    pub fn incomplete(&self) -> bool {
        self.lacks_objects_before(EOF)
    }

    /// How many components have their objects (a layout only ever gains them).
    pub fn instantiated(&self) -> usize {
        self.objects.iter().filter(|o| !o.is_empty()).count()
    }

    /// Does no OST object hold any of the file's bytes yet (its bytes, if any, are all
    /// on the MDT)?
    pub fn no_objects(&self) -> bool {
        self.objects.iter().all(Vec::is_empty)
    }

    fn objects_of(&self, component: usize) -> &[(u32, u64)] {
        self.objects.get(component).map(Vec::as_slice).unwrap_or_default()
    }

    /// Split `[offset, offset + len)` of the file into pieces of at most `rpc_max` bytes,
    /// joining the stripes that are adjacent in one object (a write of a whole stripe
    /// width gives one piece per object). Bytes no component covers (past the end of a
    /// DoM-only layout) are `EFBIG`; a striped component without objects is `ENOSPC`
    /// (a write gets them first with a layout intent).
    pub fn plan(&self, offset: u64, len: u64, rpc_max: u64) -> Result<Vec<Piece>> {
        self.plan_as(offset, len, rpc_max, false)
    }

    /// [`FileLayout::plan`] for a read: the bytes of a striped component without objects
    /// are a hole (no write has reached them), read as zeros ([`Place::Hole`]).
    pub fn plan_read(&self, offset: u64, len: u64, rpc_max: u64) -> Result<Vec<Piece>> {
        self.plan_as(offset, len, rpc_max, true)
    }

    fn plan_as(&self, offset: u64, len: u64, rpc_max: u64, holes: bool) -> Result<Vec<Piece>> {
        let rpc_max = rpc_max.max(1);
        let end = offset.checked_add(len).ok_or_else(|| Error::new(errno::EFBIG, "offset and length overflow"))?;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut x = offset;
        while x < end {
            let Some((ci, c)) = self.layout.component_at(x) else {
                return Err(Error::new(
                    errno::EFBIG,
                    format!("byte {x} is past the file's last component (its layout ends there)"),
                ));
            };
            let comp_end = if c.end == EOF { end } else { c.end.min(end) };
            match &c.kind {
                Kind::Mdt => {
                    push(&mut pieces, Place::Mdt, x, x, comp_end - x, rpc_max);
                    x = comp_end;
                }
                Kind::Stripes(s) => {
                    let objects = self.objects_of(ci);
                    if objects.is_empty() && holes {
                        push(&mut pieces, Place::Hole, x, x, comp_end - x, rpc_max);
                        x = comp_end;
                        continue;
                    }
                    if objects.is_empty() {
                        return Err(Error::new(
                            errno::ENOSPC,
                            format!("component {} of the file has no OST objects (no OST could give them)", ci + 1),
                        ));
                    }
                    let size = stripe_size(s);
                    while x < comp_end {
                        let (stripe, at) = stripe_of(c.start, size, objects.len() as u32, x);
                        let n = (size - (x - c.start) % size).min(comp_end - x);
                        let (ost, oid) = objects[stripe as usize];
                        push(&mut pieces, Place::Object { ost, oid }, at, x, n, rpc_max);
                        x += n;
                    }
                }
            }
        }
        pieces.sort_by_key(|p| (p.place, p.offset));
        Ok(pieces)
    }

    /// The file size that objects of these sizes imply: one past the last byte any of
    /// them holds. `sizes` gives each object's size, in the order of `objects`.
    pub fn size_from_objects(&self, sizes: &[Vec<u64>]) -> u64 {
        let mut file_size = 0;
        for (ci, c) in self.layout.components.iter().enumerate() {
            let Kind::Stripes(s) = &c.kind else { continue };
            let count = self.objects.get(ci).map_or(0, Vec::len) as u64;
            let size = stripe_size(s);
            for (i, &object_size) in sizes.get(ci).map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
                if object_size == 0 || count == 0 {
                    continue;
                }
                // An object size from the wire may be anything: past the largest file it
                // maps nowhere.
                let last = object_size - 1;
                let x = (last / size)
                    .checked_mul(count)
                    .and_then(|r| r.checked_add(i as u64))
                    .and_then(|s| s.checked_mul(size))
                    .and_then(|b| b.checked_add(last % size))
                    .and_then(|o| o.checked_add(c.start));
                if let Some(x) = x.filter(|&x| x < c.end && x < i64::MAX as u64) {
                    file_size = file_size.max(x + 1);
                }
            }
        }
        file_size
    }

    /// Each object's size when the file is `file_size` bytes long: the part of
    /// `[0, file_size)` that maps to it (what a truncate leaves in every object).
    pub fn object_sizes(&self, file_size: u64) -> Vec<Vec<u64>> {
        let mut out = Vec::with_capacity(self.layout.components.len());
        for (ci, c) in self.layout.components.iter().enumerate() {
            let objects = self.objects.get(ci).map_or(0, Vec::len) as u64;
            let Kind::Stripes(s) = &c.kind else {
                out.push(Vec::new());
                continue;
            };
            let stop = file_size.min(c.end);
            let within = stop.saturating_sub(c.start);
            let size = stripe_size(s);
            let mut sizes = vec![0u64; objects as usize];
            if objects > 0 && within > 0 {
                let width = size * objects;
                let (rounds, rest) = (within / width, within % width);
                for (i, v) in sizes.iter_mut().enumerate() {
                    let tail = rest.saturating_sub(i as u64 * size).min(size);
                    *v = rounds * size + tail;
                }
            }
            out.push(sizes);
        }
        out
    }
}

/// A component's stripe size (the MDS fills it in; an unset one is the default).
fn stripe_size(s: &Striping) -> u64 {
    if s.size == 0 { DEFAULT_STRIPE_SIZE } else { s.size }
}

/// Add `n` bytes at `offset` of `place` (file offset `file_offset`), joining the previous
/// piece of the same place when they are adjacent and there is room.
fn push(pieces: &mut Vec<Piece>, place: Place, offset: u64, file_offset: u64, n: u64, rpc_max: u64) {
    let (mut offset, mut file_offset, mut n) = (offset, file_offset, n);
    while n > 0 {
        let open = pieces.iter_mut().rev().find(|p| p.place == place && p.offset + p.len == offset && p.len < rpc_max);
        match open {
            Some(p) => {
                let take = n.min(rpc_max - p.len);
                p.len += take;
                match p.spans.last_mut() {
                    Some(s) if s.0 + s.1 == file_offset => s.1 += take,
                    _ => p.spans.push((file_offset, take)),
                }
                (offset, file_offset, n) = (offset + take, file_offset + take, n - take);
            }
            None => {
                let take = n.min(rpc_max);
                pieces.push(Piece { place, offset, len: take, spans: vec![(file_offset, take)] });
                (offset, file_offset, n) = (offset + take, file_offset + take, n - take);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lfs(a: &str) -> Layout {
        Layout::from_lfs_args(&a.split_whitespace().collect::<Vec<_>>()).unwrap()
    }

    fn with_objects(l: &str, counts: &[usize]) -> FileLayout {
        let layout = lfs(l);
        let mut next = 100;
        let objects = counts
            .iter()
            .map(|&n| {
                (0..n)
                    .map(|i| {
                        next += 1;
                        (i as u32, next)
                    })
                    .collect()
            })
            .collect();
        FileLayout { layout, objects }
    }

    /// Every byte of the range lands in exactly one piece, at the place the layout says.
    fn check_cover(f: &FileLayout, offset: u64, len: u64, rpc_max: u64) {
        let pieces = f.plan(offset, len, rpc_max).unwrap();
        let mut seen = vec![false; len as usize];
        for p in &pieces {
            assert!(p.len <= rpc_max, "{p:?} over {rpc_max}");
            assert_eq!(p.spans.iter().map(|s| s.1).sum::<u64>(), p.len);
            let mut at = p.offset;
            for &(fo, n) in &p.spans {
                for k in 0..n {
                    let x = fo + k;
                    assert!(!seen[(x - offset) as usize], "byte {x} twice");
                    seen[(x - offset) as usize] = true;
                    let (ci, c) = f.layout.component_at(x).unwrap();
                    match &c.kind {
                        Kind::Mdt => assert_eq!((p.place, at + k), (Place::Mdt, x)),
                        Kind::Stripes(s) => {
                            let (i, o) = stripe_of(c.start, s.size, f.objects[ci].len() as u32, x);
                            let (ost, oid) = f.objects[ci][i as usize];
                            assert_eq!((p.place, at + k), (Place::Object { ost, oid }, o), "byte {x}");
                        }
                    }
                }
                at += n;
            }
        }
        assert!(seen.iter().all(|&s| s), "bytes missing");
    }

    #[test]
    fn pieces_cover_every_byte_once_where_the_layout_puts_it() {
        let plain = with_objects("-c 3 -S 64K", &[3]);
        check_cover(&plain, 0, 3 << 16, 1 << 20);
        check_cover(&plain, 1000, 500_000, 128 << 10);
        check_cover(&plain, 65_535, 2, 4096);
        let pfl = with_objects("-E 128K -L mdt -E 1M -c 2 -S 64K -E -1 -c 3 -S 128K", &[0, 2, 3]);
        check_cover(&pfl, 0, 3 << 20, 1 << 20);
        check_cover(&pfl, 100_000, 1_200_000, 96 << 10);
    }

    #[test]
    fn a_full_stripe_width_is_one_piece_per_object() {
        let f = with_objects("-c 4 -S 1M", &[4]);
        let pieces = f.plan(0, 16 << 20, 4 << 20).unwrap();
        assert_eq!(pieces.len(), 4);
        for p in &pieces {
            assert_eq!((p.offset, p.len, p.spans.len()), (0, 4 << 20, 4));
        }
    }

    /// A striped component without objects (no write has reached it) is a hole to a
    /// read and needs a layout intent before a write.
    #[test]
    fn components_without_objects_read_as_holes_and_are_named_for_writes() {
        let f = with_objects("-E 64K -L mdt -E 1M -c 1 -S 64K -E -1 -c 2 -S 64K", &[0, 0, 0]);
        assert!(f.incomplete() && f.no_objects() && f.instantiated() == 0);
        assert!(!f.lacks_objects_before(65_536), "the DoM component needs none");
        assert!(f.lacks_objects_before(65_537));
        assert_eq!(f.plan(60_000, 10_000, 1 << 20).unwrap_err().errno, errno::ENOSPC);
        let pieces = f.plan_read(60_000, 2 << 20, 1 << 20).unwrap();
        let holes: u64 = pieces.iter().filter(|p| p.place == Place::Hole).map(|p| p.len).sum();
        let mdt: u64 = pieces.iter().filter(|p| p.place == Place::Mdt).map(|p| p.len).sum();
        assert_eq!((mdt, holes), (65_536 - 60_000, (2 << 20) - (65_536 - 60_000)));
        let half = with_objects("-E 64K -L mdt -E 1M -c 1 -S 64K -E -1 -c 2 -S 64K", &[0, 1, 0]);
        assert!(half.incomplete() && !half.lacks_objects_before(1 << 20) && half.lacks_objects_before((1 << 20) + 1));
        check_cover(&half, 0, 1 << 20, 1 << 20);
        let full = with_objects("-E 64K -L mdt -E 1M -c 1 -S 64K -E -1 -c 2 -S 64K", &[0, 1, 2]);
        assert!(!full.incomplete() && full.instantiated() == 2 && !full.no_objects());
    }

    #[test]
    fn bytes_past_a_dom_only_layout_and_stripes_without_objects_are_refused() {
        let dom = with_objects("-E 64K -L mdt", &[0]);
        assert_eq!(dom.plan(60_000, 10_000, 1 << 20).unwrap_err().errno, errno::EFBIG);
        assert!(dom.plan(0, 65_536, 1 << 20).is_ok());
        let bare = with_objects("-c 2", &[0]);
        assert_eq!(bare.plan(0, 1, 1 << 20).unwrap_err().errno, errno::ENOSPC);
    }

    #[test]
    fn object_sizes_and_the_size_they_imply_agree() {
        for (l, counts) in [("-c 3 -S 64K", vec![3]), ("-E 1M -c 2 -S 64K -E -1 -c 3 -S 128K", vec![2, 3])] {
            let f = with_objects(l, &counts);
            for size in [0, 1, 65_535, 65_536, 65_537, 200_000, 1 << 20, (1 << 20) + 5, 5_000_000] {
                let sizes = f.object_sizes(size);
                assert_eq!(f.size_from_objects(&sizes), size, "{l} at {size}: {sizes:?}");
                let total: u64 = sizes.iter().flatten().sum();
                assert_eq!(total, size, "{l}: the objects hold every byte once");
            }
        }
    }
}
