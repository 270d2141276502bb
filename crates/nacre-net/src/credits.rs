//! Credits: how many messages may be in flight, to one peer (`peer_credits`) and through
//! one interface (`credits`), after LNet.
//!
//! A sender takes one peer credit, then one interface credit, before it sends, and gives
//! both back when the message is done. A sender that finds none waits in a FIFO queue; it
//! never allocates past the bound. Each pool keeps LNet's counters: `available` goes
//! negative while senders wait (−3 means three are queued), and `min_available` is its low
//! water mark since the counters were reset, the first thing to read when a server is
//! credit-starved (CEA at 20,000 clients).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A pool of credits with LNet-style counters.
#[derive(Debug)]
pub struct CreditPool {
    max: u32,
    sem: Arc<Semaphore>,
    available: AtomicI64,
    min_available: AtomicI64,
}

/// Counters of a pool, as `get-param` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreditStats {
    pub max: u32,
    /// Credits free now; negative: that many senders are queued.
    pub available: i64,
    /// Lowest `available` since the last reset.
    pub min_available: i64,
}

/// A held credit; dropping it gives the credit back.
#[derive(Debug)]
pub struct Credit {
    pool: Arc<CreditPool>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Credit {
    fn drop(&mut self) {
        self.pool.available.fetch_add(1, Ordering::AcqRel);
    }
}

impl CreditPool {
    /// A pool of `max` credits (at least 1).
    pub fn new(max: u32) -> Arc<CreditPool> {
        let max = max.max(1);
        Arc::new(CreditPool {
            max,
            sem: Arc::new(Semaphore::new(max as usize)),
            available: AtomicI64::new(max as i64),
            min_available: AtomicI64::new(max as i64),
        })
    }

    /// Take a credit, waiting in FIFO order if there is none. A waiter that is cancelled
    /// (its future dropped, e.g. by a timeout) leaves the counters as they were.
    pub async fn acquire(self: &Arc<Self>) -> Credit {
        let now = self.available.fetch_sub(1, Ordering::AcqRel) - 1;
        self.min_available.fetch_min(now, Ordering::AcqRel);
        let queued = Queued(self);
        // The semaphore is never closed, so acquiring cannot fail.
        let permit = self.sem.clone().acquire_owned().await.expect("credit semaphore is never closed");
        // From here the count is the credit's to give back.
        std::mem::forget(queued);
        Credit { pool: self.clone(), _permit: permit }
    }

    /// Take a credit only if one is free now.
    pub fn try_acquire(self: &Arc<Self>) -> Option<Credit> {
        let permit = self.sem.clone().try_acquire_owned().ok()?;
        let now = self.available.fetch_sub(1, Ordering::AcqRel) - 1;
        self.min_available.fetch_min(now, Ordering::AcqRel);
        Some(Credit { pool: self.clone(), _permit: permit })
    }

    pub fn stats(&self) -> CreditStats {
        CreditStats {
            max: self.max,
            available: self.available.load(Ordering::Acquire),
            min_available: self.min_available.load(Ordering::Acquire),
        }
    }

    /// Start a new low-water window (like writing to LNet's `peers` stats).
    pub fn reset_min(&self) {
        self.min_available.store(self.available.load(Ordering::Acquire), Ordering::Release);
    }
}

/// Gives back the count taken by a waiter that never got its credit.
struct Queued<'a>(&'a CreditPool);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.available.fetch_add(1, Ordering::AcqRel);
    }
}

/// The two credits a message to a peer holds while in flight.
#[derive(Debug)]
pub struct SendCredits {
    _peer: Credit,
    _interface: Credit,
}

/// Take a peer credit, then an interface credit: always in this order, so senders never
/// hold an interface credit while waiting on a busy peer (which would starve other peers).
pub async fn acquire_send(peer: &Arc<CreditPool>, interface: &Arc<CreditPool>) -> SendCredits {
    let p = peer.acquire().await;
    let i = interface.acquire().await;
    SendCredits { _peer: p, _interface: i }
}
