//! Small files this mount knows whole: every byte of each, as its MDT holds them, for as
//! long as the mount holds the lease on its attributes. An open for reading of such a
//! file costs no request: its reads are answered from these bytes and its close has no
//! handle to give back. Lustre spares repeated opens the same way with a handle cached
//! under an open lock; here the lease is that lock, and the bytes make a handle
//! needless, since a file removed meanwhile still reads as it was (as an open file
//! unlinked by another process does).
//!
//! A file is known whole when an open for reading brought all of it (DoM read-on-open),
//! or when the last handle here that wrote it closes, having written all of it since it
//! was empty, while the mount held its lease all along (the file's [`Image`]). It is
//! forgotten when the lease goes (another mount changed it, or will), when a handle here
//! opens it for writing, and at any attribute change made here.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use nacre_proto::fid::Fid;
use nacre_proto::mdt::Attr;

use crate::fs::lock;
use crate::striping::FileLayout;

/// Largest file kept whole (as large as an open brings with its answer).
pub(crate) const WHOLE_MAX: u64 = 64 << 10;
/// Bytes and files kept at most; the oldest go first.
const BYTES_MAX: usize = 64 << 20;
const FILES_MAX: usize = 16_384;

/// A file known whole: its attributes and layout when its bytes were known.
#[derive(Clone)]
pub(crate) struct Whole {
    pub attr: Attr,
    pub layout: Arc<FileLayout>,
    pub bytes: Bytes,
}

#[derive(Default)]
pub(crate) struct WholeFiles {
    m: Mutex<Kept>,
    /// Files kept, opens answered from them, and files forgotten while kept.
    kept: AtomicU64,
    opened: AtomicU64,
    forgotten: AtomicU64,
}

#[derive(Default)]
struct Kept {
    /// Each with the number it was kept under.
    files: HashMap<Fid, (u64, Whole)>,
    /// In the order they were kept, by number (a file kept again is listed again: its
    /// older place no longer stands for it).
    order: VecDeque<(Fid, u64)>,
    next: u64,
    bytes: usize,
}

impl WholeFiles {
    /// Keep `w`: call under the lease gate, with the lease on its attributes held.
    pub(crate) fn keep(&self, w: Whole) {
        if w.bytes.len() as u64 > WHOLE_MAX {
            return;
        }
        let mut k = lock(&self.m);
        let (fid, n) = (w.attr.fid, k.next);
        k.next += 1;
        k.bytes += w.bytes.len();
        if let Some((_, old)) = k.files.insert(fid, (n, w)) {
            k.bytes -= old.bytes.len();
        }
        k.order.push_back((fid, n));
        while k.bytes > BYTES_MAX || k.files.len() > FILES_MAX || k.order.len() > 2 * FILES_MAX {
            let Some((f, n)) = k.order.pop_front() else { break };
            if k.files.get(&f).is_some_and(|(m, _)| *m == n)
                && let Some((_, old)) = k.files.remove(&f)
            {
                k.bytes -= old.bytes.len();
            }
        }
        self.kept.fetch_add(1, Ordering::Relaxed);
    }

    /// `fid` if known whole: call under the lease gate, and use it only while the lease
    /// on its attributes is held.
    pub(crate) fn get(&self, fid: Fid) -> Option<Whole> {
        let w = lock(&self.m).files.get(&fid).map(|(_, w)| w.clone());
        if w.is_some() {
            self.opened.fetch_add(1, Ordering::Relaxed);
        }
        w
    }

    /// `fid` may change, or has changed.
    pub(crate) fn forget(&self, fid: Fid) {
        let mut k = lock(&self.m);
        if let Some((_, old)) = k.files.remove(&fid) {
            k.bytes -= old.bytes.len();
            self.forgotten.fetch_add(1, Ordering::Relaxed);
        }
        if k.files.is_empty() {
            k.order.clear();
        }
    }

    /// `llite.*.whole_files`: what is kept, and what it served.
    pub(crate) fn render(&self) -> String {
        let (files, bytes) = {
            let k = lock(&self.m);
            (k.files.len(), k.bytes)
        };
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "files {files}\nbytes {bytes}\nkept {}\nopens_answered {}\nforgotten {}\n",
            g(&self.kept),
            g(&self.opened),
            g(&self.forgotten)
        )
    }
}

/// A file's bytes as the handles of this mount wrote them, from an empty file, while
/// the mount held the lease on its attributes (no other mount can have written it
/// meanwhile: that takes the lease back first, and drops the image). `bytes` is `None`
/// while unknown. `changes` counts the writes and truncates made here.
#[derive(Default)]
pub(crate) struct Image {
    bytes: Option<Vec<u8>>,
    pub changes: u64,
}

impl Image {
    /// The file is empty now, as a create or a truncate to nothing leaves it.
    pub(crate) fn empty(&mut self) {
        self.bytes = Some(Vec::new());
    }

    pub(crate) fn unknown(&mut self) {
        self.bytes = None;
    }

    /// `data` was written at `offset`.
    pub(crate) fn wrote(&mut self, offset: u64, data: &[u8]) {
        self.changes += 1;
        let Some(v) = &mut self.bytes else { return };
        let end = offset.saturating_add(data.len() as u64);
        if offset > v.len() as u64 || end > WHOLE_MAX {
            self.bytes = None;
            return;
        }
        let (at, end) = (offset as usize, end as usize);
        if end > v.len() {
            v.resize(end, 0);
        }
        v[at..end].copy_from_slice(data);
    }

    /// The file was cut (or extended) to `size` bytes.
    pub(crate) fn resized(&mut self, size: u64) {
        self.changes += 1;
        let Some(v) = &mut self.bytes else { return };
        if size > WHOLE_MAX {
            self.bytes = None;
        } else {
            v.resize(size as usize, 0);
        }
    }

    /// The bytes, if known and `size` long.
    pub(crate) fn bytes(&self, size: u64) -> Option<Bytes> {
        self.bytes.as_ref().filter(|v| v.len() as u64 == size).map(|v| Bytes::copy_from_slice(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nacre_proto::layout::Layout;

    fn whole(oid: u32, len: usize) -> Whole {
        let layout = Layout::from_lfs_args(&["-E", "1M", "-L", "mdt"]).unwrap();
        let attr = Attr { fid: Fid { seq: 0x2_0000_0400, oid, ver: 0 }, size: len as u64, ..Attr::default() };
        Whole {
            attr,
            layout: Arc::new(FileLayout { layout, objects: vec![vec![]] }),
            bytes: Bytes::from(vec![1u8; len]),
        }
    }

    #[test]
    fn the_files_kept_whole_stay_within_their_bounds_the_oldest_going_first() {
        let w = WholeFiles::default();
        w.keep(whole(1, 10));
        w.keep(whole(2, 20));
        // Kept again: its older place in the order no longer stands for it.
        w.keep(whole(1, 30));
        assert_eq!(w.get(whole(1, 0).attr.fid).map(|x| x.bytes.len()), Some(30));
        w.forget(whole(2, 0).attr.fid);
        assert!(w.get(whole(2, 0).attr.fid).is_none());
        w.keep(whole(3, WHOLE_MAX as usize + 1));
        assert!(w.get(whole(3, 0).attr.fid).is_none(), "a file larger than kept ones was kept");
        // 64 KiB files: the byte bound (64 MiB) holds 1,024 of them.
        for oid in 10..(10 + 2_000) {
            w.keep(whole(oid, WHOLE_MAX as usize));
        }
        let k = lock(&w.m);
        assert!(k.bytes <= BYTES_MAX, "{} bytes kept", k.bytes);
        assert_eq!(k.bytes, k.files.values().map(|(_, x)| x.bytes.len()).sum::<usize>());
        assert!(k.files.contains_key(&whole(2_009, 0).attr.fid), "the newest went");
        assert!(!k.files.contains_key(&whole(10, 0).attr.fid), "the oldest stayed");
        assert!(!k.files.contains_key(&whole(1, 0).attr.fid), "the oldest stayed");
    }

    #[test]
    fn an_image_follows_writes_from_empty_and_gives_up_past_a_gap() {
        let mut i = Image::default();
        i.wrote(0, b"abc");
        assert!(i.bytes(3).is_none(), "no image before the file is known empty");
        i.empty();
        i.wrote(0, b"hello");
        i.wrote(5, b" world");
        i.wrote(0, b"J");
        assert_eq!(i.bytes(11).as_deref(), Some(&b"Jello world"[..]));
        assert_eq!(i.changes, 4, "every write counts, known or not");
        assert!(i.bytes(10).is_none(), "a size other than the image's is not it");
        i.resized(5);
        assert_eq!(i.bytes(5).as_deref(), Some(&b"Jello"[..]));
        i.resized(7);
        assert_eq!(i.bytes(7).as_deref(), Some(&b"Jello\0\0"[..]));
        i.wrote(9, b"x");
        assert!(i.bytes(10).is_none(), "a write past the end leaves a gap it does not know");
        i.empty();
        i.wrote(WHOLE_MAX - 1, b"");
        assert!(i.bytes(0).is_none(), "a write starting past the end, even empty, gives up");
        i.empty();
        i.wrote(0, &vec![7u8; WHOLE_MAX as usize + 1]);
        assert!(i.bytes(WHOLE_MAX + 1).is_none(), "larger than a kept file");
    }
}
