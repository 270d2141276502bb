//! Stripe locks: writers to one stripe run one at a time, writers to different stripes
//! run in parallel.
//!
//! Parity is a function of a whole stripe, so two read-modify-writes of one stripe must
//! not interleave. The lock table is sharded by stripe number so that unrelated stripes
//! rarely meet on a mutex. A caller that needs several stripes takes them in ascending
//! order, which rules out deadlock between callers.

use std::collections::HashSet;
use std::sync::{Condvar, Mutex};

const SHARDS: usize = 64;

pub struct StripeLocks {
    shards: Vec<(Mutex<HashSet<u64>>, Condvar)>,
}

/// Holds one stripe until dropped.
pub struct StripeGuard<'a> {
    locks: &'a StripeLocks,
    stripe: u64,
}

impl StripeLocks {
    pub fn new() -> StripeLocks {
        StripeLocks { shards: (0..SHARDS).map(|_| (Mutex::new(HashSet::new()), Condvar::new())).collect() }
    }

    pub fn lock(&self, stripe: u64) -> StripeGuard<'_> {
        let (set, cv) = &self.shards[(stripe % SHARDS as u64) as usize];
        let mut held = set.lock().unwrap_or_else(|e| e.into_inner());
        while held.contains(&stripe) {
            held = cv.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.insert(stripe);
        StripeGuard { locks: self, stripe }
    }
}

impl Default for StripeLocks {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for StripeGuard<'_> {
    fn drop(&mut self) {
        let (set, cv) = &self.locks.shards[(self.stripe % SHARDS as u64) as usize];
        set.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.stripe);
        cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_writer_per_stripe() {
        let locks = StripeLocks::new();
        let inside = AtomicUsize::new(0);
        let max_seen = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..500 {
                        let _g = locks.lock(7);
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max_seen.fetch_max(now, Ordering::SeqCst);
                        std::hint::spin_loop();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(max_seen.load(Ordering::SeqCst), 1);
        // Different stripes do not block each other.
        let _a = locks.lock(1);
        let _b = locks.lock(2);
        let _c = locks.lock(1 + SHARDS as u64);
    }
}
