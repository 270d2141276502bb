//! Byte-range locks across mounts (`fcntl` and `flock`), as Lustre's LDLM serves flock
//! locks: the MDS that owns a file keeps its locks in memory, grants a lock that conflicts
//! with nothing, queues one that must wait, and finds deadlocks across clients.
//!
//! A lock belongs to an [`Owner`]: a client and the kernel's lock owner there (a process
//! for `fcntl`, an open file for `flock`). Locks of one owner never conflict with each
//! other; a new one replaces, splits or merges with that owner's locks over its range, as
//! POSIX says. Locks of different owners conflict where they overlap and one of them is a
//! write lock. Waiters are granted, in arrival order, as soon as nothing conflicts.
//!
//! What a remote party can make grow is bounded: lock records and waits per client
//! ([`HELD_PER_CLIENT_MAX`], [`WAITING_PER_CLIENT_MAX`]); past them a request gets ENOLCK.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use nacre_proto::fid::Fid;
use nacre_proto::mdt::errno::{self, EAGAIN, EDEADLK, EINTR, ENOLCK};
use nacre_proto::mdt::lock::{Held, apply};
use tokio::sync::oneshot;

/// Lock records one client may hold over all files of this MDS (a lock costs time in
/// proportion to the records of its file).
pub const HELD_PER_CLIENT_MAX: usize = 16_384;
/// Lock requests of one client that may wait at once.
pub const WAITING_PER_CLIENT_MAX: usize = 1024;
/// Owners a deadlock search follows at most (Linux's `MAX_DEADLK_ITERATIONS` is 10 for
/// its chain; this walks a graph, so it allows more).
const DEADLOCK_SEARCH_MAX: usize = 4096;

/// Who holds a lock: a client, and the kernel's lock owner on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    pub client: u64,
    pub owner: u64,
}

/// Locks live apart by file and space: the users' locks, and the mounts' own
/// serialization of O_APPEND writes, which must never meet a user's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Resource {
    pub fid: Fid,
    pub append: bool,
}

/// One lock: bytes `start..=end` of an [`Owner`], with the pid shown to whoever it
/// conflicts with (`F_GETLK`).
pub type Lock = Held<Owner>;

/// Why a lock was not granted: an errno and a message naming the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockError {
    pub errno: i32,
    pub message: String,
}

impl LockError {
    fn new(errno: i32, message: String) -> LockError {
        LockError { errno, message }
    }
}

/// A lock that must wait: the answer comes through `granted` (or an error if its owner
/// let go, was evicted, or the wait was cancelled). [`LockTable::cancel`] with `id` ends
/// the wait.
#[derive(Debug)]
pub struct Queued {
    pub id: u64,
    pub granted: oneshot::Receiver<Result<(), LockError>>,
}

struct Waiter {
    id: u64,
    want: Lock,
    tx: oneshot::Sender<Result<(), LockError>>,
}

#[derive(Default)]
struct FileLocks {
    held: Vec<Lock>,
    waiting: VecDeque<Waiter>,
}

/// Figures for `mdt.*.locks`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LockStats {
    pub held: u64,
    pub waiting: u64,
    pub granted: u64,
    pub waited: u64,
    pub conflicts: u64,
    pub deadlocks: u64,
    pub evicted: u64,
}

#[derive(Default)]
struct Inner {
    files: HashMap<Resource, FileLocks>,
    held_by: HashMap<u64, usize>,
    waiting_by: HashMap<u64, usize>,
    next_id: u64,
    stats: LockStats,
}

/// The locks of one MDS's files.
#[derive(Default)]
pub struct LockTable {
    inner: Mutex<Inner>,
}

impl LockTable {
    pub fn new() -> LockTable {
        LockTable::default()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first lock of another owner that `want` would conflict with (`F_GETLK`).
    pub fn test(&self, r: Resource, want: &Lock) -> Option<Lock> {
        let t = self.inner();
        t.files.get(&r).and_then(|f| f.held.iter().find(|h| h.conflicts(want)).copied())
    }

    /// The clients, other than `want`'s, whose locks on `r` conflict with `want`.
    pub fn conflicting_clients(&self, r: Resource, want: &Lock) -> Vec<u64> {
        let t = self.inner();
        let mut v: Vec<u64> = t.files.get(&r).map_or(vec![], |f| {
            f.held
                .iter()
                .filter(|h| h.conflicts(want) && h.owner.client != want.owner.client)
                .map(|h| h.owner.client)
                .collect()
        });
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Does some request wait for a lock of `r`?
    pub fn has_waiters(&self, r: Resource) -> bool {
        self.inner().files.get(&r).is_some_and(|f| !f.waiting.is_empty())
    }

    /// Take `want` if nothing conflicts with it: `Ok(true)`. On a conflict, `Ok(false)`,
    /// and nothing is changed or counted (the caller refuses or queues it with
    /// [`LockTable::lock`]).
    pub fn try_lock(&self, r: Resource, want: Lock) -> Result<bool, LockError> {
        let mut t = self.inner();
        if t.files.get(&r).is_some_and(|f| f.held.iter().any(|h| h.conflicts(&want))) {
            return Ok(false);
        }
        t.grant(r, want)?;
        Ok(true)
    }

    /// Take `want`: `Ok(None)` when granted now; when something conflicts, EAGAIN, or
    /// with `wait` a place in the queue (`Ok(Some(_))`), or EDEADLK if waiting would
    /// close a cycle of owners waiting for each other.
    pub fn lock(&self, r: Resource, want: Lock, wait: bool) -> Result<Option<Queued>, LockError> {
        let mut t = self.inner();
        let blockers: Vec<Owner> =
            t.files.get(&r).map_or(vec![], |f| f.held.iter().filter(|h| h.conflicts(&want)).map(|h| h.owner).collect());
        if blockers.is_empty() {
            t.grant(r, want)?;
            return Ok(None);
        }
        if !wait {
            t.stats.conflicts += 1;
            return Err(LockError::new(
                EAGAIN,
                format!("bytes {}..={} of {} are locked by another owner", want.start, want.end, r.fid),
            ));
        }
        if t.waits_for(&blockers, want.owner) {
            t.stats.deadlocks += 1;
            return Err(LockError::new(
                EDEADLK,
                format!("waiting for bytes {}..={} of {} would deadlock", want.start, want.end, r.fid),
            ));
        }
        let waiting = t.waiting_by.get(&want.owner.client).copied().unwrap_or(0);
        if waiting >= WAITING_PER_CLIENT_MAX {
            return Err(LockError::new(
                ENOLCK,
                format!("client has {waiting} lock requests waiting already (at most {WAITING_PER_CLIENT_MAX})"),
            ));
        }
        let id = t.next_id;
        t.next_id += 1;
        let (tx, granted) = oneshot::channel();
        t.files.entry(r).or_default().waiting.push_back(Waiter { id, want, tx });
        *t.waiting_by.entry(want.owner.client).or_default() += 1;
        t.stats.waited += 1;
        Ok(Some(Queued { id, granted }))
    }

    /// Unlock bytes `start..=end` of `owner`'s locks on `r` (`F_UNLCK`): what is left of
    /// them outside the range stays.
    pub fn unlock(&self, r: Resource, owner: Owner, start: u64, end: u64) {
        let mut t = self.inner();
        let Some(f) = t.files.get_mut(&r) else { return };
        let gone = Lock { owner, write: false, start, end, pid: 0 };
        let delta = apply(&mut f.held, gone, true);
        t.count_held(owner.client, delta);
        t.wake(r);
    }

    /// Let go of every lock of `owner` on `r` and end its waits with EINTR (a close).
    pub fn release(&self, r: Resource, owner: Owner) {
        let mut t = self.inner();
        t.drop_where(|res, o| *res == r && o == owner, EINTR, "its owner closed the file");
    }

    /// End the wait `id` (its request gave up); true if it was still waiting, false if
    /// it was granted meanwhile (the grant is in its receiver) or is unknown.
    pub fn cancel(&self, r: Resource, id: u64) -> bool {
        let mut t = self.inner();
        let Some(f) = t.files.get_mut(&r) else { return false };
        let Some(at) = f.waiting.iter().position(|w| w.id == id) else { return false };
        let w = f.waiting.remove(at).expect("a waiter found by position");
        t.count_waiting(w.want.owner.client, -1);
        t.wake(r);
        true
    }

    /// Drop every lock and wait of `client` (evicted or gone); returns how many locks.
    pub fn evict(&self, client: u64) -> usize {
        let mut t = self.inner();
        let held = t.held_by.get(&client).copied().unwrap_or(0);
        t.drop_where(|_, o| o.client == client, ENOLCK, "its client was evicted");
        t.stats.evicted += held as u64;
        held
    }

    /// Lock records held and requests waiting, by client.
    pub fn by_client(&self) -> HashMap<u64, (usize, usize)> {
        let t = self.inner();
        let mut m: HashMap<u64, (usize, usize)> = t.held_by.iter().map(|(c, n)| (*c, (*n, 0))).collect();
        for (c, n) in &t.waiting_by {
            m.entry(*c).or_default().1 = *n;
        }
        m
    }

    pub fn stats(&self) -> LockStats {
        let t = self.inner();
        LockStats {
            held: t.held_by.values().sum::<usize>() as u64,
            waiting: t.waiting_by.values().sum::<usize>() as u64,
            ..t.stats
        }
    }
}

impl Inner {
    fn count_held(&mut self, client: u64, delta: isize) {
        let n = self.held_by.entry(client).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.held_by.remove(&client);
        }
    }

    fn count_waiting(&mut self, client: u64, delta: isize) {
        let n = self.waiting_by.entry(client).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.waiting_by.remove(&client);
        }
    }

    /// Apply `want`, which conflicts with nothing held, within the owner's bound.
    fn grant(&mut self, r: Resource, want: Lock) -> Result<(), LockError> {
        let held = self.held_by.get(&want.owner.client).copied().unwrap_or(0);
        let f = self.files.entry(r).or_default();
        // A lock adds at most two records (one split in three); near the bound, what it
        // adds is counted, and a lock that would pass it is taken back.
        let near = held + 2 > HELD_PER_CLIENT_MAX;
        let before = near.then(|| f.held.clone());
        let delta = apply(&mut f.held, want, false);
        if let Some(before) = before
            && held.saturating_add_signed(delta) > HELD_PER_CLIENT_MAX
        {
            f.held = before;
            return Err(LockError::new(
                ENOLCK,
                format!("client holds {held} lock records already (at most {HELD_PER_CLIENT_MAX})"),
            ));
        }
        self.count_held(want.owner.client, delta);
        self.stats.granted += 1;
        Ok(())
    }

    /// Grant, in order, every waiter of `r` that no lock held now conflicts with; forget
    /// the file once nothing is held or waiting.
    fn wake(&mut self, r: Resource) {
        loop {
            let Some(f) = self.files.get_mut(&r) else { return };
            let next = f.waiting.iter().position(|w| w.tx.is_closed() || !f.held.iter().any(|h| h.conflicts(&w.want)));
            let Some(at) = next else { break };
            let w = f.waiting.remove(at).expect("a waiter found by position");
            self.count_waiting(w.want.owner.client, -1);
            if w.tx.is_closed() {
                continue;
            }
            let granted = self.grant(r, w.want);
            let _ = w.tx.send(granted);
        }
        if self.files.get(&r).is_some_and(|f| f.held.is_empty() && f.waiting.is_empty()) {
            self.files.remove(&r);
        }
    }

    /// Drop the locks and waits of owners `which` picks, answering the waits with
    /// `errno`; then grant what can go.
    fn drop_where(&mut self, which: impl Fn(&Resource, Owner) -> bool, errno: i32, why: &str) {
        let mut touched = Vec::new();
        let mut held_gone: HashMap<u64, isize> = HashMap::new();
        let mut waits_gone: HashMap<u64, isize> = HashMap::new();
        for (r, f) in &mut self.files {
            let before = (f.held.len(), f.waiting.len());
            f.held.retain(|h| {
                let go = which(r, h.owner);
                if go {
                    *held_gone.entry(h.owner.client).or_default() -= 1;
                }
                !go
            });
            let mut kept = VecDeque::with_capacity(f.waiting.len());
            for w in f.waiting.drain(..) {
                if which(r, w.want.owner) {
                    *waits_gone.entry(w.want.owner.client).or_default() -= 1;
                    let _ = w.tx.send(Err(LockError::new(errno, format!("the lock wait ended: {why}"))));
                } else {
                    kept.push_back(w);
                }
            }
            f.waiting = kept;
            if before != (f.held.len(), f.waiting.len()) {
                touched.push(*r);
            }
        }
        for (c, d) in held_gone {
            self.count_held(c, d);
        }
        for (c, d) in waits_gone {
            self.count_waiting(c, d);
        }
        for r in touched {
            self.wake(r);
        }
    }

    /// Does one of `blockers` wait, directly or through others, for `me`?
    fn waits_for(&self, blockers: &[Owner], me: Owner) -> bool {
        // Who each waiting owner waits for: the owners of the locks its request meets.
        let mut edges: HashMap<Owner, Vec<Owner>> = HashMap::new();
        for f in self.files.values() {
            for w in &f.waiting {
                let e = edges.entry(w.want.owner).or_default();
                e.extend(f.held.iter().filter(|h| h.conflicts(&w.want)).map(|h| h.owner));
            }
        }
        let mut seen = HashSet::new();
        let mut todo: Vec<Owner> = blockers.to_vec();
        while let Some(o) = todo.pop() {
            if o == me {
                return true;
            }
            if !seen.insert(o) || seen.len() > DEADLOCK_SEARCH_MAX {
                continue;
            }
            if let Some(next) = edges.get(&o) {
                todo.extend(next.iter().copied());
            }
        }
        false
    }
}

/// A lock request's range as the kernel gives it (`start..=end`), checked.
pub fn check_range(start: u64, end: u64) -> Result<(), LockError> {
    if start > end {
        return Err(LockError::new(
            errno::EINVAL,
            format!("a lock range that ends ({end}) before it starts ({start})"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Owner = Owner { client: 1, owner: 10 };
    const B: Owner = Owner { client: 2, owner: 20 };
    const C: Owner = Owner { client: 3, owner: 30 };

    fn res(n: u32) -> Resource {
        Resource { fid: Fid::new(0x2_0000_0400, n), append: false }
    }

    fn l(owner: Owner, write: bool, start: u64, end: u64) -> Lock {
        Lock { owner, write, start, end, pid: owner.owner as u32 }
    }

    fn held(t: &LockTable, r: Resource) -> Vec<(u64, bool, u64, u64)> {
        let i = t.inner();
        let mut v: Vec<_> = i
            .files
            .get(&r)
            .map_or(vec![], |f| f.held.iter().map(|h| (h.owner.owner, h.write, h.start, h.end)).collect());
        v.sort();
        v
    }

    #[test]
    fn one_owners_locks_split_merge_and_change_kind() {
        let t = LockTable::new();
        let r = res(1);
        t.lock(r, l(A, false, 0, 99), false).unwrap();
        // A write lock in the middle splits the read lock in three.
        t.lock(r, l(A, true, 40, 59), false).unwrap();
        assert_eq!(held(&t, r), vec![(10, false, 0, 39), (10, false, 60, 99), (10, true, 40, 59)]);
        // Back to read: all one lock again.
        t.lock(r, l(A, false, 40, 59), false).unwrap();
        assert_eq!(held(&t, r), vec![(10, false, 0, 99)]);
        // Adjacent locks of one kind merge; an unlock in the middle splits.
        t.lock(r, l(A, false, 100, 199), false).unwrap();
        assert_eq!(held(&t, r), vec![(10, false, 0, 199)]);
        t.unlock(r, A, 50, 149);
        assert_eq!(held(&t, r), vec![(10, false, 0, 49), (10, false, 150, 199)]);
        // To the end of the file, and everything unlocked.
        t.lock(r, l(A, true, 300, nacre_proto::mdt::lock::EOF), false).unwrap();
        t.unlock(r, A, 0, u64::MAX);
        assert!(held(&t, r).is_empty() && t.inner().files.is_empty());
        assert_eq!(t.stats().held, 0);
    }

    #[test]
    fn owners_conflict_on_overlapping_writes_only() {
        let t = LockTable::new();
        let r = res(1);
        t.lock(r, l(A, false, 0, 99), false).unwrap();
        t.lock(r, l(B, false, 50, 149), false).unwrap();
        let e = t.lock(r, l(C, true, 90, 95), false).unwrap_err();
        assert_eq!(e.errno, EAGAIN);
        assert_eq!(t.test(r, &l(C, true, 90, 95)).map(|h| h.owner), Some(A));
        assert_eq!(t.test(r, &l(C, true, 100, 120)).map(|h| h.owner), Some(B));
        assert_eq!(t.test(r, &l(C, false, 0, 200)), None);
        t.lock(r, l(C, true, 150, 200), false).unwrap();
        // Another file is another resource, and so is the append space of the same file.
        t.lock(res(2), l(C, true, 0, 99), false).unwrap();
        t.lock(Resource { append: true, ..r }, l(C, true, 0, u64::MAX), false).unwrap();
        // An upgrade waits for the other reader.
        let e = t.lock(r, l(A, true, 0, 99), false).unwrap_err();
        assert_eq!(e.errno, EAGAIN);
        assert_eq!(t.stats().conflicts, 2);
    }

    #[tokio::test]
    async fn waiters_are_granted_when_the_conflict_goes_and_deadlocks_are_refused() {
        let t = LockTable::new();
        let (f1, f2) = (res(1), res(2));
        t.lock(f1, l(A, true, 0, 9), false).unwrap();
        t.lock(f2, l(B, true, 0, 9), false).unwrap();
        // A waits for B's lock on f2; B asking for A's on f1 would close the cycle.
        let q = t.lock(f2, l(A, true, 5, 5), true).unwrap().expect("A waits");
        let e = t.lock(f1, l(B, false, 0, 0), true).unwrap_err();
        assert_eq!((e.errno, t.stats().deadlocks), (EDEADLK, 1));
        // Through a third owner too: C holds f3, waits for A; A... is already waiting, so
        // B asking for C's f3 closes B -> C -> A -> B.
        let f3 = res(3);
        t.lock(f3, l(C, true, 0, 0), false).unwrap();
        let qc = t.lock(f1, l(C, false, 1, 1), true).unwrap().expect("C waits for A");
        assert_eq!(t.lock(f3, l(B, true, 0, 0), true).unwrap_err().errno, EDEADLK);
        // B lets go of f2: A gets its lock.
        t.unlock(f2, B, 0, 9);
        q.granted.await.unwrap().unwrap();
        assert_eq!(held(&t, f2), vec![(10, true, 5, 5)]);
        // A closes f1: C's wait is granted.
        t.release(f1, A);
        qc.granted.await.unwrap().unwrap();
        assert_eq!(held(&t, f1), vec![(30, false, 1, 1)]);
        assert_eq!(t.stats().waiting, 0);
    }

    #[tokio::test]
    async fn a_close_ends_the_owners_waits_and_eviction_drops_a_clients_locks() {
        let t = LockTable::new();
        let r = res(1);
        t.lock(r, l(A, true, 0, 99), false).unwrap();
        let qb = t.lock(r, l(B, true, 0, 0), true).unwrap().unwrap();
        let qc = t.lock(r, l(C, false, 50, 50), true).unwrap().unwrap();
        t.release(r, B);
        assert_eq!(qb.granted.await.unwrap().unwrap_err().errno, EINTR);
        // A cancelled wait leaves the queue; one granted meanwhile is not cancelled.
        assert_eq!(t.stats().waiting, 1);
        assert_eq!(t.evict(A.client), 1);
        qc.granted.await.unwrap().unwrap();
        assert!(!t.cancel(r, qc.id), "granted before the cancel");
        assert_eq!(held(&t, r), vec![(30, false, 50, 50)]);
        let qa = t.lock(r, l(A, true, 0, 99), true).unwrap().unwrap();
        assert!(t.cancel(r, qa.id));
        assert_eq!(t.stats(), LockStats { held: 1, granted: 2, waited: 3, evicted: 1, ..LockStats::default() });
        // A waiter whose request is gone is skipped.
        let qa = t.lock(r, l(A, true, 0, 99), true).unwrap().unwrap();
        drop(qa);
        t.release(r, C);
        assert!(held(&t, r).is_empty());
    }

    #[test]
    fn a_clients_records_and_waits_are_bounded() {
        let t = LockTable::new();
        let r = res(1);
        // Every other byte: records that cannot merge.
        for i in 0..HELD_PER_CLIENT_MAX as u64 {
            t.lock(r, l(A, true, 2 * i, 2 * i), false).unwrap();
        }
        let e = t.lock(r, l(A, true, 1 << 40, 1 << 40), false).unwrap_err();
        assert_eq!(e.errno, ENOLCK, "{}", e.message);
        assert_eq!(t.stats().held, HELD_PER_CLIENT_MAX as u64, "nothing changed");
        // A write lock in a read lock's middle would split it: refused too.
        t.unlock(r, A, 0, 5);
        t.lock(r, l(A, false, 1 << 41, (1 << 41) + 10), false).unwrap();
        t.lock(r, l(A, true, 1 << 42, 1 << 42), false).unwrap();
        assert_eq!(t.stats().held, HELD_PER_CLIENT_MAX as u64 - 1);
        let e = t.lock(r, l(A, true, (1 << 41) + 5, (1 << 41) + 5), false).unwrap_err();
        assert_eq!(e.errno, ENOLCK);
        // Merging what it holds is still fine: one record for all the small ones.
        t.lock(r, l(A, true, 0, 1 << 20), false).unwrap();
        assert_eq!(t.stats().held, 3);
        let mut waits = Vec::new();
        for i in 0..WAITING_PER_CLIENT_MAX as u32 {
            t.lock(res(2 + i), l(B, true, 0, 0), false).unwrap();
            waits.push(t.lock(res(2 + i), l(C, true, 0, 0), true).unwrap());
        }
        assert_eq!(t.lock(r, l(C, true, 0, 0), true).unwrap_err().errno, ENOLCK);
        assert!(check_range(5, 4).is_err() && check_range(4, 4).is_ok());
    }
}
