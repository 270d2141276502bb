//! The byte-range locks (`fcntl`, `flock`) this mount's owners hold, and those the MDS
//! holds for them.
//!
//! The MDS holds every lock, between all mounts. A mount that listens for lease callbacks
//! asks for each lock it takes to be kept (`lock::CACHE`) and is granted the file's
//! `Locks` lease while nobody waits for a lock of the file. While it holds the lease:
//! - an owner's unlock leaves the lock at the MDS, with no request: the MDS holds for
//!   each owner at least what the owner holds;
//! - an owner's lock the MDS already holds for it (a read lock under a write lock too)
//!   is taken with no request.
//!
//! When another mount's lock or test conflicts with what the MDS holds for this one, the
//! MDS calls the lease back, and this mount lets go of what its owners no longer hold
//! (unlocks, and write locks back to read) before it acknowledges. Lustre's clients keep
//! their unused LDLM locks in the same way until a blocking callback. Without the lease,
//! every lock and unlock is a request, and the MDS holds what the owners hold.
//!
//! Order. An owner's requests, and the letting go of what it no longer holds, go one at
//! a time under the owner's gate, except a lock that waits for another holder (it may
//! wait long): it is noted in flight, and letting go leaves its range alone. The lease's
//! callback never waits for a gate: an owner busy with a request lets go itself when the
//! request is answered (`OwnerLocks::let_go_after`). A gate held across a request that
//! waits for another mount's callback would otherwise close a cycle of mounts.

use std::collections::HashMap;
use std::sync::Arc;

use nacre_proto::fid::Fid;
use nacre_proto::mdt::lease::Key as LeaseKey;
use nacre_proto::mdt::{Creds, Reply, Request, lock};
use nacre_proto::mgs::TargetKind;

use crate::error::{Error, Result, errno};
use crate::fs::{FileSystem, lock as guard, mdt_of};

/// A lock held: bytes `start..=end`, read or write, with the pid its owner gave.
type Held = lock::Held<()>;

/// Ranges the MDS may hold for an owner beyond what it holds; past that, an unlock is a
/// request. They count against the MDS's bound on a client's lock records: a lock the MDS
/// refuses for that (ENOLCK) makes the mount let go of every such range first.
const KEPT_MAX: usize = 16;

/// One change to what the MDS holds for an owner: `kind` (`lock::UNLOCK`, or
/// `lock::READ` to turn part of a write lock into a read lock) over `start..=end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub kind: u8,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// The locks of one file on this mount, by owner.
#[derive(Default)]
pub(crate) struct FileLocks {
    owners: HashMap<u64, OwnerLocks>,
}

#[derive(Default)]
struct OwnerLocks {
    /// What the owner holds: replayed after an MDS restart.
    held: Vec<Held>,
    /// What the MDS holds for it: `held`, and what it let go of under the lease.
    at_mds: Vec<Held>,
    /// The MDT import's restart count `at_mds` stands for: a restarted MDS holds only
    /// what was replayed, `held`.
    epoch: u64,
    /// The handle its last lock went through (any open one of the owner serves: closing
    /// one lets go of all its locks).
    handle: u64,
    /// The keys of its lock requests kept for replay.
    keys: Vec<u64>,
    /// Lock requests in flight that wait (`lock::WAIT`): their ranges, by id.
    waiting: Vec<(u64, u64, u64)>,
    /// Requests answered, counted: a waiting lock answered after another request of the
    /// owner no longer knows in which order the MDS took them.
    answered: u64,
    /// Closes counted: an answer to a request sent before a close is no longer the
    /// owner's (the close let go of everything at the MDS).
    closes: u64,
    /// `at_mds` is not known for sure (a waiting lock was answered beside another
    /// request, in an order the mount cannot know): nothing is taken or let go of under
    /// the lease until the owner holds nothing.
    unsure: bool,
    /// The lease was called back while the owner's gate was taken: whoever holds it lets
    /// go of what the owner no longer holds before giving it back.
    let_go_after: bool,
    /// A lock was asked since the owner's last close: its close tells the MDS, whatever
    /// this mount believes the MDS holds.
    asked: bool,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl OwnerLocks {
    fn idle(&self) -> bool {
        self.held.is_empty()
            && self.at_mds.is_empty()
            && self.waiting.is_empty()
            && !self.let_go_after
            && !self.asked
            && Arc::strong_count(&self.gate) == 1
    }

    /// `at_mds` as the MDS behind an import at restart count `restarts` holds it.
    fn at(&mut self, restarts: u64) {
        if self.epoch != restarts {
            self.at_mds = self.held.clone();
            self.epoch = restarts;
        }
    }

    /// What to send so the MDS holds no more than the owner does, apart from the
    /// ranges of locks in flight, limited to the pieces that overlap `range` if given.
    fn unused(&self, range: Option<(u64, u64)>) -> Vec<Piece> {
        if self.unsure {
            return Vec::new();
        }
        let flying: Vec<(u64, u64)> = self.waiting.iter().map(|&(_, s, e)| (s, e)).collect();
        let mut out = Vec::new();
        for p in unused(&self.at_mds, &self.held) {
            if range.is_some_and(|(s, e)| p.end < s || e < p.start) {
                continue;
            }
            for (start, end) in subtract((p.start, p.end), &flying) {
                out.push(Piece { start, end, ..p });
            }
        }
        out
    }

    /// Take `pieces` out of `at_mds` (they are being sent).
    fn give_up(&mut self, pieces: &[Piece]) {
        for p in pieces {
            apply_piece(&mut self.at_mds, *p);
        }
    }
}

/// Does `at_mds` hold every byte of `start..=end`, as a write lock if `write`?
pub(crate) fn covers(at_mds: &[Held], write: bool, start: u64, end: u64) -> bool {
    let mut spans: Vec<(u64, u64)> =
        at_mds.iter().filter(|h| (h.write || !write) && h.overlaps(start, end)).map(|h| (h.start, h.end)).collect();
    spans.sort_unstable();
    let mut next = start;
    for (s, e) in spans {
        if s > next {
            return false;
        }
        if e >= end {
            return true;
        }
        next = next.max(e + 1);
    }
    false
}

/// `(start, end)` less every range of `ranges`.
pub(crate) fn subtract(span: (u64, u64), ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut left = vec![span];
    for &(s, e) in ranges {
        let mut next = Vec::with_capacity(left.len() + 1);
        for (a, b) in left {
            if e < a || b < s {
                next.push((a, b));
                continue;
            }
            if a < s {
                next.push((a, s - 1));
            }
            if e < b {
                next.push((e + 1, b));
            }
        }
        left = next;
    }
    left
}

/// The pieces that bring `at_mds` down to `held` (which it covers): unlocks of what no
/// lock of `held` covers, and read locks where `held` reads what `at_mds` writes.
pub(crate) fn unused(at_mds: &[Held], held: &[Held]) -> Vec<Piece> {
    let all: Vec<(u64, u64)> = held.iter().map(|h| (h.start, h.end)).collect();
    let mut out = Vec::new();
    for m in at_mds {
        for (start, end) in subtract((m.start, m.end), &all) {
            out.push(Piece { kind: lock::UNLOCK, start, end, pid: m.pid });
        }
        if m.write {
            for h in held.iter().filter(|h| !h.write && h.overlaps(m.start, m.end)) {
                out.push(Piece { kind: lock::READ, start: h.start.max(m.start), end: h.end.min(m.end), pid: h.pid });
            }
        }
    }
    out
}

/// Apply `p` to what the MDS holds for an owner.
fn apply_piece(at_mds: &mut Vec<Held>, p: Piece) {
    let h = Held { owner: (), write: false, start: p.start, end: p.end, pid: p.pid };
    lock::apply(at_mds, h, p.kind == lock::UNLOCK);
}

/// One owner's pieces to send, under its gate (taken here, or by the caller).
struct LetGo {
    owner: u64,
    handle: u64,
    pieces: Vec<Piece>,
    gate: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// A waiting lock request in flight, noted in its owner's `waiting`: the note goes when
/// this does, even if the request is dropped before its answer.
struct InFlight<'a> {
    fs: &'a FileSystem,
    fid: Fid,
    owner: u64,
    id: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(o) = guard(&self.fs.inner.locks).get_mut(&self.fid).and_then(|f| f.owners.get_mut(&self.owner)) {
            o.waiting.retain(|w| w.0 != self.id);
        }
    }
}

impl FileSystem {
    /// The gate of `owner`'s locks on `fid`.
    fn owner_gate(&self, fid: Fid, owner: u64) -> Arc<tokio::sync::Mutex<()>> {
        guard(&self.inner.locks).entry(fid).or_default().owners.entry(owner).or_default().gate.clone()
    }

    /// The restart count of the import of `fid`'s MDT (0 if it cannot be had).
    async fn restarts_of(&self, fid: Fid) -> u64 {
        match mdt_of(fid) {
            Ok(mdt) => self.target_link(TargetKind::Mdt, mdt).await.map_or(0, |(i, _)| i.restarts()),
            Err(_) => 0,
        }
    }

    /// May `owner` hold locks of `fid` through this mount, here or at the MDS, or have a
    /// lock request under way? (Then its close must let go of them.) An owner is
    /// remembered from its first lock request to its close.
    pub fn holds_locks(&self, fid: Fid, owner: u64) -> bool {
        guard(&self.inner.locks).get(&fid).is_some_and(|f| f.owners.contains_key(&owner))
    }

    /// Owner `owner` takes (or with `lock::UNLOCK` drops) bytes `start..=end` of `fid`
    /// through `handle`, with the request's `flags` (`lock::WAIT`). Under the file's
    /// `Locks` lease with no request if it can be; otherwise through the MDS, asking it
    /// to keep the lock if this mount listens for callbacks.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn user_lock(
        &self,
        creds: &Creds,
        fid: Fid,
        handle: u64,
        owner: u64,
        pid: u32,
        kind: u8,
        flags: u8,
        start: u64,
        end: u64,
    ) -> Result<()> {
        let mdt = mdt_of(fid)?;
        let (import, _) = self.target_link(TargetKind::Mdt, mdt).await?;
        let new = Held { owner: (), write: kind == lock::WRITE, start, end, pid };
        let (unlock, wait) = (kind == lock::UNLOCK, flags & lock::WAIT != 0);
        let gate = self.owner_gate(fid, owner);
        let taken = gate.clone().lock_owned().await;
        drop(gate);
        // Under the lease, with no request if it can be; else the owner's own let-go
        // locks in the way of a lock that waits go first (it must not wait for them).
        let (done_here, own, handle_was) = {
            let mut all = guard(&self.inner.locks);
            let file = all.entry(fid).or_default();
            // Checked under the map's lock: a callback that comes after this sees what
            // it did (see `FileSystem::locks_called_back`).
            let restarts = import.restarts();
            let leased = self.inner.leases.holds_at(&LeaseKey::Locks(fid), mdt, restarts);
            let waits_here = file.owners.values().any(|o| !o.waiting.is_empty());
            let o = file.owners.entry(owner).or_default();
            o.at(restarts);
            o.asked |= !unlock;
            let local = leased
                && !o.unsure
                && o.waiting.is_empty()
                && if unlock {
                    !waits_here && o.at_mds.len() <= o.held.len() + KEPT_MAX
                } else {
                    covers(&o.at_mds, new.write, start, end)
                };
            if local {
                self.record(&import, fid, owner, o, new, unlock, handle);
                (true, Vec::new(), o.handle)
            } else if wait && !unlock {
                let own = o.unused(Some((start, end)));
                o.give_up(&own);
                (false, own, o.handle)
            } else {
                (false, Vec::new(), o.handle)
            }
        };
        if done_here {
            self.settle_owner(fid, owner, taken, import.restarts()).await;
            return Ok(());
        }
        self.send_pieces(fid, owner, handle_was, &own).await;
        // Noted before the other owners let go: from here none of them lets go of a
        // lock here with no request (this may wait for it).
        let (id, answered, closes) = {
            let mut all = guard(&self.inner.locks);
            let o = all.entry(fid).or_default().owners.entry(owner).or_default();
            let id = self.inner.lock_keys.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if wait {
                o.waiting.push((id, start, end));
            }
            (id, o.answered, o.closes)
        };
        let in_flight = wait.then_some(InFlight { fs: self, fid, owner, id });
        // Other owners' locks the MDS holds here and they let go of would conflict.
        if !unlock {
            self.let_go(fid, Some(owner), Some((start, end))).await;
        }
        let keep = !unlock && self.inner.revoker.get().is_some();
        let r = Request::Lock {
            fid,
            handle,
            owner,
            pid,
            kind,
            flags: flags | if keep { lock::CACHE } else { 0 },
            start,
            end,
        };
        // A lock that waits lets the owner's other requests go meanwhile.
        let taken = if wait {
            drop(taken);
            None
        } else {
            Some(taken)
        };
        let mut spent = false;
        let sent = loop {
            match self.md(mdt, creds, &r, &[]).await {
                Err(e) if wait && e.errno == errno::ETIMEDOUT => continue,
                // The MDS counts the locks this mount let go of but keeps: let go of
                // them everywhere, and ask once more.
                Err(e) if e.errno == errno::ENOLCK && !unlock && !spent => {
                    spent = true;
                    self.let_go_everywhere(fid, owner).await;
                }
                other => break other,
            }
        };
        let taken = match taken {
            Some(t) => t,
            None => self.owner_gate(fid, owner).lock_owned().await,
        };
        drop(in_flight);
        let restarts = import.restarts();
        let stray = {
            let mut all = guard(&self.inner.locks);
            let o = all.entry(fid).or_default().owners.entry(owner).or_default();
            o.at(restarts);
            if o.closes != closes {
                // Closed meanwhile: the close let go of everything at the MDS, but a
                // lock granted after it is not this owner's to keep.
                sent.is_ok() && !unlock
            } else {
                if sent.is_ok() {
                    if wait && o.answered != answered {
                        // Taken by the MDS in an order this mount does not know.
                        o.unsure = true;
                    } else {
                        lock::apply(&mut o.at_mds, new, unlock);
                    }
                    self.record(&import, fid, owner, o, new, unlock, handle);
                }
                if o.unsure {
                    o.at_mds = o.held.clone();
                    o.unsure = !o.held.is_empty();
                }
                false
            }
        };
        if stray {
            let gone = Piece { kind: lock::UNLOCK, start, end, pid };
            self.send_pieces(fid, owner, handle, &[gone]).await;
        }
        self.settle_owner(fid, owner, taken, restarts).await;
        sent.map(|_| ())
    }

    /// What would conflict with a lock of `kind` over `start..=end` for `owner`
    /// (`F_GETLK`): the kind, range and pid of such a lock, or `None`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn user_test(
        &self,
        creds: &Creds,
        fid: Fid,
        handle: u64,
        owner: u64,
        kind: u8,
        start: u64,
        end: u64,
    ) -> Result<Option<(u8, u64, u64, u32)>> {
        let taken = self.owner_gate(fid, owner).lock_owned().await;
        self.let_go(fid, Some(owner), Some((start, end))).await;
        let r = Request::Lock { fid, handle, owner, pid: 0, kind, flags: lock::TEST, start, end };
        let answer = self.md(mdt_of(fid)?, creds, &r, &[]).await;
        let restarts = self.restarts_of(fid).await;
        self.settle_owner(fid, owner, taken, restarts).await;
        match answer?.0 {
            Reply::Lock { kind: lock::UNLOCK, .. } => Ok(None),
            Reply::Lock { kind, start, end, pid } => Ok(Some((kind, start, end, pid))),
            _ => Err(Error::protocol("lock test", "the MDS did not answer with a lock")),
        }
    }

    /// Owner `owner` let go of every lock it held on `fid`, and ends its waits (a close):
    /// the MDS is told, and nothing of it is replayed any more.
    pub(crate) async fn user_unlock_all(&self, creds: &Creds, fid: Fid, owner: u64) -> Result<()> {
        let import = self.target_link(TargetKind::Mdt, mdt_of(fid)?).await.ok().map(|(i, _)| i);
        let taken = self.owner_gate(fid, owner).lock_owned().await;
        let keys = match guard(&self.inner.locks).entry(fid).or_default().owners.get_mut(&owner) {
            Some(o) => {
                o.held.clear();
                o.at_mds.clear();
                o.let_go_after = false;
                o.unsure = false;
                o.asked = false;
                o.closes += 1;
                std::mem::take(&mut o.keys)
            }
            None => Vec::new(),
        };
        if let Some(import) = &import {
            for key in keys {
                import.forget_state(key);
            }
        }
        let sent = self.md(mdt_of(fid)?, creds, &Request::Unlock { fid, owner }, &[]).await;
        let restarts = import.map_or(0, |i| i.restarts());
        self.settle_owner(fid, owner, taken, restarts).await;
        sent.map(|_| ())
    }

    /// The MDS called back (or this mount gave up) the `Locks` lease of `fid`: let go
    /// of what every owner no longer holds, before the callback is acknowledged.
    pub(crate) async fn locks_called_back(&self, fid: Fid) {
        self.let_go(fid, None, None).await;
    }

    /// Let go at the MDS of what owners of `fid` (all but `except`) no longer hold,
    /// the pieces that overlap `range` if given. An owner whose gate is taken is left to
    /// let go itself when its request is answered; one let go of here is settled after
    /// (a callback that came meanwhile is heard).
    async fn let_go(&self, fid: Fid, except: Option<u64>, range: Option<(u64, u64)>) {
        let restarts = self.restarts_of(fid).await;
        let jobs: Vec<LetGo> = {
            let mut all = guard(&self.inner.locks);
            let Some(file) = all.get_mut(&fid) else { return };
            let mut jobs = Vec::new();
            for (&owner, o) in file.owners.iter_mut() {
                if Some(owner) == except {
                    continue;
                }
                o.at(restarts);
                let pieces = o.unused(range);
                if pieces.is_empty() {
                    continue;
                }
                match o.gate.clone().try_lock_owned() {
                    Ok(g) => {
                        o.give_up(&pieces);
                        jobs.push(LetGo { owner, handle: o.handle, pieces, gate: Some(g) });
                    }
                    Err(_) => o.let_go_after = true,
                }
            }
            jobs
        };
        for LetGo { owner, handle, pieces, gate } in jobs {
            self.send_pieces(fid, owner, handle, &pieces).await;
            if let Some(g) = gate {
                self.settle_owner(fid, owner, g, restarts).await;
            }
        }
    }

    /// Let go of what every owner of every file no longer holds (the MDS refused a lock
    /// for the records this mount keeps there); `owner` of `fid`, whose gate the caller
    /// holds, included.
    async fn let_go_everywhere(&self, fid: Fid, owner: u64) {
        let restarts = self.restarts_of(fid).await;
        let (fids, own, handle) = {
            let mut all = guard(&self.inner.locks);
            let fids: Vec<Fid> = all.keys().copied().collect();
            let (own, handle) = match all.get_mut(&fid).and_then(|f| f.owners.get_mut(&owner)) {
                Some(o) => {
                    o.at(restarts);
                    let own = o.unused(None);
                    o.give_up(&own);
                    (own, o.handle)
                }
                None => (Vec::new(), 0),
            };
            (fids, own, handle)
        };
        self.send_pieces(fid, owner, handle, &own).await;
        for f in fids {
            self.let_go(f, (f == fid).then_some(owner), None).await;
        }
    }

    /// End a request of `owner` on `fid` (its gate `taken`), made through an import at
    /// restart count `restarts`: let go of what it no longer holds if the lease went
    /// meanwhile, then give the gate back, and forget an owner with nothing left.
    async fn settle_owner(&self, fid: Fid, owner: u64, taken: tokio::sync::OwnedMutexGuard<()>, restarts: u64) {
        let mdt = mdt_of(fid).unwrap_or(0);
        let mut taken = Some(taken);
        loop {
            let (handle, pieces) = {
                let mut all = guard(&self.inner.locks);
                let leased = self.inner.leases.holds_at(&LeaseKey::Locks(fid), mdt, restarts);
                let Some(file) = all.get_mut(&fid) else { return };
                let Some(o) = file.owners.get_mut(&owner) else { return };
                o.at(restarts);
                let pieces = if o.let_go_after || !leased { o.unused(None) } else { Vec::new() };
                o.let_go_after = false;
                if pieces.is_empty() {
                    // Given back under the map's lock: a callback that finds the gate
                    // taken has marked `let_go_after` before this looked.
                    drop(taken.take());
                    file.owners.retain(|_, o| !o.idle());
                    if file.owners.is_empty() {
                        all.remove(&fid);
                    }
                    return;
                }
                o.give_up(&pieces);
                (o.handle, pieces)
            };
            self.send_pieces(fid, owner, handle, &pieces).await;
        }
    }

    /// Send `owner`'s `pieces` through `handle`. A failure leaves the lock at the MDS
    /// until the owner's close (or this mount's eviction) drops it.
    async fn send_pieces(&self, fid: Fid, owner: u64, handle: u64, pieces: &[Piece]) {
        let Ok(mdt) = mdt_of(fid) else { return };
        for p in pieces {
            let r =
                Request::Lock { fid, handle, owner, pid: p.pid, kind: p.kind, flags: 0, start: p.start, end: p.end };
            if let Err(e) = self.md(mdt, &Creds::default(), &r, &[]).await {
                eprintln!("nacre: letting go of bytes {}..={} of {fid} at its MDT: {e}", p.start, p.end);
            }
        }
    }

    /// Owner `owner` of `fid` now holds `new` (or, with `unlock`, no longer its range),
    /// taken through `handle`: recorded, counted, and kept for replay.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        import: &nacre_net::client::Import,
        fid: Fid,
        owner: u64,
        o: &mut OwnerLocks,
        new: Held,
        unlock: bool,
        handle: u64,
    ) {
        lock::apply(&mut o.held, new, unlock);
        o.handle = handle;
        o.answered += 1;
        self.keep_for_replay(import, fid, owner, o);
    }

    /// Keep what `owner` holds on `fid` for replay, a lock request per record, so that an
    /// MDS that restarts gets every lock back from its holders during recovery, after
    /// their opens.
    fn keep_for_replay(&self, import: &nacre_net::client::Import, fid: Fid, owner: u64, o: &mut OwnerLocks) {
        for key in o.keys.drain(..) {
            import.forget_state(key);
        }
        let creds = Creds::default();
        for h in &o.held {
            let kind = if h.write { lock::WRITE } else { lock::READ };
            let r =
                Request::Lock { fid, handle: o.handle, owner, pid: h.pid, kind, flags: 0, start: h.start, end: h.end };
            let (op, body) = r.encode(&creds);
            let key = self.inner.lock_keys.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            import.keep_state(key, op, &body);
            o.keys.push(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(write: bool, start: u64, end: u64) -> Held {
        Held { owner: (), write, start, end, pid: 7 }
    }

    #[test]
    fn cover_needs_every_byte_and_a_write_lock_for_a_write() {
        let m = [h(true, 0, 9), h(false, 10, 19), h(true, 30, 39)];
        assert!(covers(&m, true, 2, 9));
        assert!(covers(&m, false, 0, 19), "a read is covered by a write and a read lock side by side");
        assert!(!covers(&m, true, 5, 12), "a write over a read lock");
        assert!(!covers(&m, false, 15, 31), "a gap");
        assert!(covers(&m, false, 30, 30));
        assert!(!covers(&[], false, 0, 0));
    }

    #[test]
    fn subtract_splits_and_trims() {
        assert_eq!(subtract((0, 99), &[(10, 19), (50, 200)]), vec![(0, 9), (20, 49)]);
        assert_eq!(subtract((0, u64::MAX), &[(0, u64::MAX)]), vec![]);
        assert_eq!(subtract((5, 5), &[(0, 4), (6, 9)]), vec![(5, 5)]);
    }

    #[test]
    fn unused_unlocks_what_is_let_go_and_turns_writes_to_reads() {
        // The MDS holds a write lock on 0..=99; the owner now reads 10..=19 and writes
        // 50..=59.
        let at = [h(true, 0, 99)];
        let held = [h(false, 10, 19), h(true, 50, 59)];
        let p = unused(&at, &held);
        let unlocks: Vec<(u64, u64)> = p.iter().filter(|p| p.kind == lock::UNLOCK).map(|p| (p.start, p.end)).collect();
        assert_eq!(unlocks, vec![(0, 9), (20, 49), (60, 99)]);
        let reads: Vec<(u64, u64)> = p.iter().filter(|p| p.kind == lock::READ).map(|p| (p.start, p.end)).collect();
        assert_eq!(reads, vec![(10, 19)]);
        // Applied, the pieces leave the MDS holding what the owner holds.
        let mut m = at.to_vec();
        for x in p {
            apply_piece(&mut m, x);
        }
        m.sort_by_key(|h| h.start);
        let got: Vec<(bool, u64, u64)> = m.iter().map(|h| (h.write, h.start, h.end)).collect();
        assert_eq!(got, vec![(false, 10, 19), (true, 50, 59)]);
        assert!(unused(&held, &held).is_empty());
    }

    #[test]
    fn an_owners_unused_leaves_locks_in_flight_alone() {
        let o = OwnerLocks { at_mds: vec![h(true, 0, 99)], waiting: vec![(1, 40, 49)], ..OwnerLocks::default() };
        let got: Vec<(u64, u64)> = o.unused(None).iter().map(|p| (p.start, p.end)).collect();
        assert_eq!(got, vec![(0, 39), (50, 99)]);
        let got: Vec<(u64, u64)> = o.unused(Some((95, 200))).iter().map(|p| (p.start, p.end)).collect();
        assert_eq!(got, vec![(0, 39), (50, 99)], "a piece that overlaps the range goes whole");
        assert!(o.unused(Some((100, 200))).is_empty());
    }
}
