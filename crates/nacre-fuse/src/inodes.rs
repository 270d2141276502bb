//! Inode numbers for the kernel, derived from FIDs: the same on every mount, across
//! remounts and server restarts, unique in the file system and shared by hard links (one
//! FID). FIDs are 128 bits and FUSE's inode numbers 64, so an ordinary FID — sequence
//! `FID_SEQ_NORMAL + (mdt << 32) + k`, object id `oid`, version 0 — is packed as
//! `mdt << 48 | 1 << 47 | k << 32 | oid` while `k < 2^15` (2^47 files per MDT, as Lustre
//! folds a FID into `st_ino`). Bit 47 keeps them apart from the root (1) and from the
//! numbers any other FID gets: one of its own, kept while the kernel holds a lookup
//! reference on it (`forget` gives it back).

use std::collections::HashMap;
use std::sync::Mutex;

use nacre_client::Fid;
use nacre_proto::fid::{FID_SEQ_NORMAL, MDT_COUNT_MAX};

pub const ROOT: u64 = 1;

/// The bit every inode number derived from a FID has.
const DERIVED: u64 = 1 << 47;
/// Sequences per MDT whose FIDs get derived numbers.
const SEQS_DERIVED: u64 = 1 << 15;

/// The inode number of an ordinary FID, if it has one derived from it.
pub fn derived(fid: Fid) -> Option<u64> {
    let rel = fid.seq.checked_sub(FID_SEQ_NORMAL)?;
    let (mdt, k) = (rel >> 32, rel & 0xffff_ffff);
    (fid.ver == 0 && mdt < MDT_COUNT_MAX as u64 && k < SEQS_DERIVED)
        .then_some(mdt << 48 | DERIVED | k << 32 | fid.oid as u64)
}

/// The FID a derived inode number stands for.
fn underived(ino: u64) -> Option<Fid> {
    (ino & DERIVED != 0).then(|| {
        let (mdt, k, oid) = (ino >> 48, (ino >> 32) & (SEQS_DERIVED - 1), ino as u32);
        Fid::new(FID_SEQ_NORMAL + (mdt << 32) + k, oid)
    })
}

struct Table {
    next: u64,
    /// Inode → (FID, lookup references the kernel holds).
    by_ino: HashMap<u64, (Fid, u64)>,
    by_fid: HashMap<Fid, u64>,
}

pub struct Inodes {
    t: Mutex<Table>,
}

impl Inodes {
    pub fn new() -> Inodes {
        let mut by_ino = HashMap::new();
        let mut by_fid = HashMap::new();
        by_ino.insert(ROOT, (Fid::ROOT, u64::MAX));
        by_fid.insert(Fid::ROOT, ROOT);
        Inodes { t: Mutex::new(Table { next: ROOT + 1, by_ino, by_fid }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.t.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn fid(&self, ino: u64) -> Option<Fid> {
        underived(ino).or_else(|| self.lock().by_ino.get(&ino).map(|(f, _)| *f))
    }

    /// The inode number of `fid`, with one more lookup reference (derived numbers need
    /// none).
    pub fn remember(&self, fid: Fid) -> u64 {
        if let Some(ino) = derived(fid) {
            return ino;
        }
        let mut t = self.lock();
        if let Some(&ino) = t.by_fid.get(&fid) {
            if let Some(e) = t.by_ino.get_mut(&ino) {
                e.1 = e.1.saturating_add(1);
            }
            return ino;
        }
        let ino = t.next;
        t.next += 1;
        t.by_ino.insert(ino, (fid, 1));
        t.by_fid.insert(fid, ino);
        ino
    }

    /// The kernel dropped `n` references: at none the number is free.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT || ino & DERIVED != 0 {
            return;
        }
        let mut t = self.lock();
        let Some(e) = t.by_ino.get_mut(&ino) else { return };
        e.1 = e.1.saturating_sub(n);
        if e.1 == 0 {
            let fid = e.0;
            t.by_ino.remove(&ino);
            t.by_fid.remove(&fid);
        }
    }

    /// The inode number `fid` has with the kernel, if any (no reference taken).
    pub fn ino_of(&self, fid: Fid) -> Option<u64> {
        derived(fid).or_else(|| self.lock().by_fid.get(&fid).copied())
    }

    /// A number for a listing without attributes (no reference taken): the FID's own if
    /// the kernel holds it, else one derived from the FID (`d_ino` is only shown).
    pub fn peek_or_temp(&self, fid: Fid) -> u64 {
        if let Some(ino) = derived(fid) {
            return ino;
        }
        if let Some(&ino) = self.lock().by_fid.get(&fid) {
            return ino;
        }
        let k = fid.key();
        ((k >> 64) as u64 ^ k as u64) | 1 << 63
    }

    /// Inode numbers in use.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().by_ino.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_fids_have_numbers_of_their_own_on_every_mount() {
        let (a, b) = (Inodes::new(), Inodes::new());
        let f = Fid::new(Fid::seq_of(3, 5), 0x1234);
        let i = a.remember(f);
        assert_eq!(i, 3 << 48 | 1 << 47 | 5 << 32 | 0x1234);
        assert_eq!((b.remember(f), b.peek_or_temp(f)), (i, i), "the same on another mount");
        a.forget(i, 10);
        assert_eq!(a.fid(i), Some(f), "and without a table");
        assert_eq!(a.len(), 1);
        assert_eq!(derived(Fid::ROOT), None);
        assert_eq!(a.remember(Fid::ROOT), ROOT);
        // The first file of MDT 0 is not the root; the largest MDT and sequence fit.
        let first = Fid::new(Fid::seq_of(0, 0), 1);
        assert_eq!(a.fid(a.remember(first)), Some(first));
        assert_ne!(a.remember(first), ROOT);
        let last = Fid::new(Fid::seq_of(MDT_COUNT_MAX - 1, (SEQS_DERIVED - 1) as u32), u32::MAX);
        assert_eq!(a.fid(a.remember(last)), Some(last));
        // Distinct FIDs, distinct numbers.
        let mut seen = std::collections::HashSet::new();
        for mdt in [0, 1, 7, MDT_COUNT_MAX - 1] {
            for k in [0u32, 1, 2, (SEQS_DERIVED - 1) as u32] {
                for oid in [1, 2, u32::MAX] {
                    assert!(seen.insert(a.remember(Fid::new(Fid::seq_of(mdt, k), oid))));
                }
            }
        }
    }

    #[test]
    fn numbers_live_while_referenced() {
        let t = Inodes::new();
        // A FID outside the derived range (a sequence past 2^15 of its MDT).
        let f = Fid::new(Fid::seq_of(0, SEQS_DERIVED as u32), 7);
        assert_eq!(derived(f), None);
        let i = t.remember(f);
        assert_eq!(t.remember(f), i);
        assert_eq!(t.fid(i), Some(f));
        t.forget(i, 1);
        assert_eq!(t.fid(i), Some(f), "one reference left");
        t.forget(i, 1);
        assert_eq!(t.fid(i), None);
        assert_eq!(t.len(), 1, "only the root");
        t.forget(ROOT, 100);
        assert_eq!(t.fid(ROOT), Some(Fid::ROOT));
        assert_ne!(t.remember(f), i, "a forgotten number is not reused");
    }
}
