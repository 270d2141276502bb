//! The target's locks: per object, shared by reads and writes and exclusive for operations
//! that free space (truncate, punch, destroy) so no read ever follows a map entry into a
//! chunk that is being given away; and per chunk of an object while a write allocates it,
//! so two writers into the same new chunk do not both allocate one.
//!
//! Entries exist only while held: the table's size is bounded by the operations running.

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct State {
    /// > 0: that many shared holders; -1: one exclusive holder.
    objects: HashMap<u64, i64>,
    chunks: HashSet<(u64, u64)>,
}

#[derive(Default)]
pub struct Locks {
    state: Mutex<State>,
    changed: Condvar,
}

pub struct ObjectGuard<'a> {
    locks: &'a Locks,
    oid: u64,
}

pub struct ChunkGuard<'a> {
    locks: &'a Locks,
    keys: Vec<(u64, u64)>,
}

impl Locks {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    pub fn shared(&self, oid: u64) -> ObjectGuard<'_> {
        let mut s = self.lock();
        while s.objects.get(&oid).is_some_and(|&n| n < 0) {
            s = self.wait(s);
        }
        *s.objects.entry(oid).or_insert(0) += 1;
        ObjectGuard { locks: self, oid }
    }

    pub fn exclusive(&self, oid: u64) -> ObjectGuard<'_> {
        let mut s = self.lock();
        while s.objects.contains_key(&oid) {
            s = self.wait(s);
        }
        s.objects.insert(oid, -1);
        ObjectGuard { locks: self, oid }
    }

    /// Lock chunks of one object for allocation, in ascending order (no deadlock between
    /// two writers).
    pub fn chunks(&self, oid: u64, mut chunks: Vec<u64>) -> ChunkGuard<'_> {
        chunks.sort_unstable();
        chunks.dedup();
        let mut keys = Vec::with_capacity(chunks.len());
        let mut s = self.lock();
        for c in chunks {
            while s.chunks.contains(&(oid, c)) {
                s = self.wait(s);
            }
            s.chunks.insert((oid, c));
            keys.push((oid, c));
        }
        ChunkGuard { locks: self, keys }
    }

    /// Entries held now (for tests of boundedness).
    pub fn held(&self) -> usize {
        let s = self.lock();
        s.objects.len() + s.chunks.len()
    }
}

impl Drop for ObjectGuard<'_> {
    fn drop(&mut self) {
        let mut s = self.locks.lock();
        if let Some(n) = s.objects.get_mut(&self.oid) {
            if *n > 1 {
                *n -= 1;
            } else {
                s.objects.remove(&self.oid);
            }
        }
        drop(s);
        self.locks.changed.notify_all();
    }
}

impl Drop for ChunkGuard<'_> {
    fn drop(&mut self) {
        let mut s = self.locks.lock();
        for k in &self.keys {
            s.chunks.remove(k);
        }
        drop(s);
        self.locks.changed.notify_all();
    }
}
