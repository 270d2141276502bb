//! Write-behind of one file on this mount, shared by all of its handles as the dirty pages
//! of the page cache are shared by the processes of one node. ior-hard's tasks write
//! interleaved 47,008-byte blocks of one file: kept per handle, no task's blocks ever
//! touched one another and each went out as a write of its own; kept per file, the
//! tasks' blocks join into long extents that go out as full RPCs.
//!
//! Dirty bytes hold part of the mount's `max_dirty_mb`. A write-back takes every dirty
//! extent and sends it after any write-back in flight that overlaps it, so that bytes
//! land in the order they were written. A write-back's failure is kept with a sequence
//! number, as Linux's errseq: every handle reports it once, at its next write, fsync or
//! close.

use std::collections::BTreeMap;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::error::Error;

/// Bytes in the order they lie in a file, kept as the writes brought them: joining two
/// extents links their parts, so a byte is copied once when written and once more at
/// most when sent. Kept in one growing buffer, an extent of ior-hard's blocks was copied
/// again at every doubling and merge, on freshly zeroed pages: 13% of the mount's CPU in
/// page clearing and as much again in copies, through the mount.
#[derive(Default, Clone, Debug)]
pub(crate) struct Rope {
    parts: Vec<Bytes>,
    /// Where each part starts in the rope.
    starts: Vec<u64>,
    len: u64,
}

impl Rope {
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Add `b` at the end.
    pub fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.starts.push(self.len);
            self.len += b.len() as u64;
            self.parts.push(b);
        }
    }

    /// Add `other`'s bytes at the end.
    pub fn append(&mut self, other: Rope) {
        for p in other.parts {
            self.push(p);
        }
    }

    /// The parts overlapping `[at, at + n)`, each with the range of it that lies there.
    fn pieces(&self, at: u64, n: u64) -> impl Iterator<Item = (&Bytes, usize, usize)> {
        let end = (at + n).min(self.len);
        let first = self.starts.partition_point(|&s| s <= at).saturating_sub(1);
        self.parts[first..].iter().zip(&self.starts[first..]).take_while(move |(_, s)| **s < end).map(move |(p, &s)| {
            let lo = at.max(s) - s;
            let hi = end.min(s + p.len() as u64) - s;
            (p, lo as usize, hi as usize)
        })
    }

    /// Bytes `[at, at + n)`: a slice of a part when they lie in one, else copied out.
    pub fn slice(&self, at: u64, n: u64) -> Bytes {
        let mut it = self.pieces(at, n);
        match (it.next(), it.next()) {
            (Some((p, lo, hi)), None) => p.slice(lo..hi),
            _ => {
                let mut v = Vec::with_capacity(n as usize);
                self.copy_to(at, n, &mut v);
                Bytes::from(v)
            }
        }
    }

    /// Append bytes `[at, at + n)` to `out`.
    pub fn copy_to(&self, at: u64, n: u64, out: &mut Vec<u8>) {
        for (p, lo, hi) in self.pieces(at, n) {
            out.extend_from_slice(&p[lo..hi]);
        }
    }
}

impl From<Bytes> for Rope {
    fn from(b: Bytes) -> Rope {
        let mut r = Rope::default();
        r.push(b);
        r
    }
}

/// Bytes written and not yet sent, and the part of the dirty budget they hold.
pub(crate) struct Extent {
    pub data: Rope,
    pub permit: Option<OwnedSemaphorePermit>,
}

/// A write-back on its way: the file range it covers, and `true` once it has ended.
struct InFlight {
    start: u64,
    end: u64,
    done: watch::Receiver<bool>,
}

/// What a write-back takes: the extents, the write-backs it must follow, and the sender
/// that tells everyone it has ended.
pub(crate) struct Taken {
    pub extents: BTreeMap<u64, Extent>,
    pub after: Vec<watch::Receiver<bool>>,
    pub done: watch::Sender<bool>,
}

#[derive(Default)]
pub(crate) struct WriteBehind {
    extents: BTreeMap<u64, Extent>,
    bytes: u64,
    in_flight: Vec<InFlight>,
    /// The last write-back failure, and how many there have been.
    error: Option<Error>,
    errors: u64,
    /// Write-backs that have landed (for `fsync`: whether there is anything to sync).
    landed: u64,
}

impl WriteBehind {
    /// Whether dirty bytes overlap `[offset, end)`.
    pub fn overlaps(&self, offset: u64, end: u64) -> bool {
        self.extents.range(..end).next_back().is_some_and(|(&s, e)| s + e.data.len() > offset)
    }

    /// The file's dirty bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether nothing is dirty or on its way.
    pub fn is_idle(&mut self) -> bool {
        self.prune();
        self.extents.is_empty() && self.in_flight.is_empty()
    }

    /// Add `data` at `offset`, which overlaps no dirty byte (see `overlaps`), joining the
    /// extents it touches. Returns the dirty bytes of the file.
    pub fn add(&mut self, offset: u64, data: &[u8], permit: Option<OwnedSemaphorePermit>) -> u64 {
        let end = offset + data.len() as u64;
        let before = self.extents.range(..=offset).next_back().map(|(&s, e)| (s, s + e.data.len()));
        let start = match before {
            Some((s, e)) if e == offset => s,
            _ => {
                self.extents.insert(offset, Extent { data: Rope::default(), permit: None });
                offset
            }
        };
        let after = self.extents.remove(&end);
        if let Some(x) = self.extents.get_mut(&start) {
            x.data.push(Bytes::copy_from_slice(data));
            merge(&mut x.permit, permit);
            if let Some(a) = after {
                x.data.append(a.data);
                merge(&mut x.permit, a.permit);
            }
        }
        self.bytes += data.len() as u64;
        self.bytes
    }

    /// The dirty extents of at least `min_len` bytes (0: all of them), for a write-back
    /// that follows those in flight over its range and is in flight itself from now on.
    /// `None`: nothing to take. Short extents left behind are where writers have not met
    /// yet (ior-hard's tasks, some blocks apart): they may still join, and go at the
    /// latest when the dirty budget runs out, or at an fsync or close.
    pub fn take(&mut self, min_len: u64) -> Option<Taken> {
        let extents: BTreeMap<u64, Extent> = if min_len == 0 {
            std::mem::take(&mut self.extents)
        } else {
            let long: Vec<u64> =
                self.extents.iter().filter(|(_, e)| e.data.len() >= min_len).map(|(&s, _)| s).collect();
            long.into_iter().filter_map(|s| self.extents.remove_entry(&s)).collect()
        };
        if extents.is_empty() {
            return None;
        }
        let taken: u64 = extents.values().map(|e| e.data.len()).sum();
        self.bytes -= taken.min(self.bytes);
        let start = extents.keys().next().copied().unwrap_or(0);
        let end = extents.last_key_value().map_or(start, |(&s, e)| s + e.data.len());
        self.prune();
        let after = self.in_flight.iter().filter(|f| f.start < end && start < f.end).map(|f| f.done.clone()).collect();
        let (done, rx) = watch::channel(false);
        self.in_flight.push(InFlight { start, end, done: rx });
        Some(Taken { extents, after, done })
    }

    /// The write-backs in flight now, to wait for.
    pub fn in_flight(&mut self) -> Vec<watch::Receiver<bool>> {
        self.prune();
        self.in_flight.iter().map(|f| f.done.clone()).collect()
    }

    /// A write-back landed (before it says it has ended).
    pub fn landed_one(&mut self) {
        self.landed += 1;
    }

    /// How many write-backs have landed so far.
    pub fn landed(&self) -> u64 {
        self.landed
    }

    /// A write-back failed (before it says it has ended).
    pub fn failed(&mut self, e: Error) {
        self.error = Some(e);
        self.errors += 1;
    }

    /// How many write-backs have failed: a handle opened now reports none of them.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// The last failure, if any came after the `seen`th, and the count to remember.
    pub fn error_since(&self, seen: u64) -> Option<(u64, Error)> {
        if self.errors > seen { self.error.clone().map(|e| (self.errors, e)) } else { None }
    }

    /// Forget the write-backs that have ended.
    fn prune(&mut self) {
        self.in_flight.retain(|f| !*f.done.borrow() && f.done.has_changed().is_ok());
    }
}

fn merge(into: &mut Option<OwnedSemaphorePermit>, p: Option<OwnedSemaphorePermit>) {
    match (into.as_mut(), p) {
        (Some(a), Some(b)) => a.merge(b),
        (None, b) => *into = b,
        (Some(_), None) => {}
    }
}

/// Wait until a write-back has ended (a dropped sender counts as ended).
pub(crate) async fn ended(mut done: watch::Receiver<bool>) {
    let _ = done.wait_for(|d| *d).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirty(w: &WriteBehind) -> Vec<(u64, Vec<u8>)> {
        w.extents.iter().map(|(&s, e)| (s, e.data.slice(0, e.data.len()).to_vec())).collect()
    }

    #[test]
    fn interleaved_writes_join_into_one_extent() {
        let mut w = WriteBehind::default();
        // Four "tasks" writing blocks of 3 in the order 0, 2, 3, 1 (3 bridges 2 and 4).
        w.add(0, b"aaa", None);
        w.add(6, b"ccc", None);
        w.add(9, b"ddd", None);
        assert_eq!(dirty(&w), vec![(0, b"aaa".to_vec()), (6, b"cccddd".to_vec())]);
        assert_eq!(w.add(3, b"bbb", None), 12);
        assert_eq!(dirty(&w), vec![(0, b"aaabbbcccddd".to_vec())]);
        w.add(20, b"z", None);
        assert!(w.overlaps(11, 12) && !w.overlaps(12, 20) && w.overlaps(20, 21));
        // Only the long extent goes; the short one waits to join its neighbours.
        let t = w.take(4).unwrap();
        assert_eq!(t.extents.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(dirty(&w), vec![(20, b"z".to_vec())]);
        assert_eq!(w.add(21, b"y", None), 2, "the bytes left dirty");
        // None long enough: none of them, until all are asked for.
        assert!(w.take(4).is_none());
        assert_eq!(w.take(0).unwrap().extents.len(), 1);
        assert!(w.take(0).is_none());
    }

    #[test]
    fn a_rope_slices_within_a_part_and_gathers_across_parts() {
        let mut r = Rope::from(Bytes::from_static(b"hello "));
        r.push(Bytes::new());
        let mut tail = Rope::from(Bytes::from_static(b"wide "));
        tail.push(Bytes::from_static(b"world"));
        r.append(tail);
        assert_eq!(r.len(), 16);
        assert_eq!(&r.slice(0, 16)[..], b"hello wide world");
        assert_eq!(&r.slice(1, 3)[..], b"ell", "within a part");
        assert_eq!(&r.slice(4, 4)[..], b"o wi", "across two");
        assert_eq!(&r.slice(11, 5)[..], b"world", "the last part");
        assert_eq!(&r.slice(5, 100)[..], b" wide world", "cut at the end");
        let mut out = b">".to_vec();
        r.copy_to(3, 10, &mut out);
        assert_eq!(out, b">lo wide wo");
    }

    #[test]
    fn a_write_back_follows_those_in_flight_over_its_range() {
        let mut w = WriteBehind::default();
        w.add(0, b"old", None);
        let first = w.take(0).unwrap();
        assert!(first.after.is_empty() && !w.is_idle());
        w.add(1, b"n", None);
        let second = w.take(0).unwrap();
        assert_eq!(second.after.len(), 1, "it waits for the first");
        w.add(100, b"far", None);
        let third = w.take(0).unwrap();
        assert!(third.after.is_empty(), "no overlap, no wait");
        first.done.send(true).unwrap();
        drop(second);
        third.done.send(true).unwrap();
        assert!(w.is_idle(), "ended, or dropped unsent");
    }

    #[test]
    fn each_handle_reports_a_failure_once() {
        let mut w = WriteBehind::default();
        let (a, b) = (w.errors(), w.errors());
        w.failed(Error::new(5, "disk on fire"));
        let (seen, e) = w.error_since(a).unwrap();
        assert_eq!(e.errno, 5);
        assert!(w.error_since(seen).is_none(), "reported once");
        assert!(w.error_since(b).is_some(), "the other handle reports it too");
        assert!(w.error_since(w.errors()).is_none(), "a handle opened after it does not");
    }
}
