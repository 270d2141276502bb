//! Inode numbers for the kernel: FIDs are 128 bits, FUSE's inode numbers 64, so each FID
//! the kernel holds gets a number of its own, kept while the kernel holds a lookup
//! reference on it (`forget` gives them back). The root is inode 1, always.

use std::collections::HashMap;
use std::sync::Mutex;

use nacre_client::Fid;

pub const ROOT: u64 = 1;

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
        self.lock().by_ino.get(&ino).map(|(f, _)| *f)
    }

    /// The inode number of `fid`, with one more lookup reference.
    pub fn remember(&self, fid: Fid) -> u64 {
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
        if ino == ROOT {
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

    /// A number for a listing without attributes (no reference taken): the FID's own if
    /// the kernel holds it, else one derived from the FID (`d_ino` is only shown).
    pub fn peek_or_temp(&self, fid: Fid) -> u64 {
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
    fn numbers_live_while_referenced() {
        let t = Inodes::new();
        let f = Fid::new(0x2_0000_0400, 7);
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
