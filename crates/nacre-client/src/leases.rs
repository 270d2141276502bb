//! The leases this mount holds: what it may answer from its caches (the kernel's, through
//! a FUSE mount) without asking the MDT, until the MDT revokes them.
//!
//! A lease is kept only if nothing could have revoked it before it was recorded: a key
//! revoked after its request went out is not kept, and a reply that comes back across a
//! restart or eviction of its MDT (which forgets every lease) grants nothing. Whoever answers from a
//! lease holds the [`Leases::gate`] (shared) from the check to the answer; a revocation
//! takes it (exclusive) after removing its keys and before invalidating, so no answer
//! made under a lease reaches the kernel after that lease's invalidation.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, RwLock};

use nacre_proto::fid::Fid;
use nacre_proto::mdt::lease::Key;

/// Where a reply's grant was asked: the MDT's restart count and this mount's revocation
/// counts when the request went out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked {
    pub restarts: u64,
    revoked: u64,
    voided: u64,
}

/// Revoked keys remembered (with when) to tell a grant asked before their revocation.
const REVOKED_KEPT: usize = 65_536;

#[derive(Default)]
struct State {
    held: HashSet<Key>,
    /// Keys revoked one by one so far, and the last revocation of each lately (by that
    /// count); `revoked_floor`: those at or below it are no longer all remembered.
    revoked: u64,
    last_revoked: HashMap<Key, u64>,
    revoked_order: std::collections::VecDeque<(u64, Key)>,
    revoked_floor: u64,
    /// Times every lease of an MDT was dropped at once (a restart, a failed channel).
    voided: u64,
    /// Per MDT, its import's restart count as the callback channel last saw it: grants
    /// from another one are not kept until the channel has seen it too (and dropped what
    /// the restart voided).
    epochs: HashMap<u32, u64>,
}

impl State {
    /// Drop every lease of an MDT (`on_mdt` says which inodes are its) at once; returns
    /// the keys dropped.
    fn void(&mut self, on_mdt: impl Fn(Fid) -> bool) -> Vec<Key> {
        self.voided += 1;
        let dropped: Vec<Key> = self.held.iter().filter(|k| on_mdt(k.fid())).cloned().collect();
        for k in &dropped {
            self.held.remove(k);
        }
        dropped
    }
}

#[derive(Default)]
pub(crate) struct Leases {
    state: Mutex<State>,
    gate: RwLock<()>,
}

impl Leases {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Note before sending a request whose reply may grant leases.
    pub fn ask(&self, restarts: u64) -> Asked {
        let s = self.state();
        Asked { restarts, revoked: s.revoked, voided: s.voided }
    }

    /// A reply from MDT `mdt` asked at `asked`, answered with its import at `restarts`,
    /// granted `keys`: those not revoked since are kept, none if the MDT restarted or
    /// every lease was dropped meanwhile. Returns whether all were kept.
    pub fn granted(&self, mdt: u32, asked: Asked, restarts: u64, keys: Vec<Key>) -> bool {
        let mut s = self.state();
        if asked.restarts != restarts
            || asked.voided != s.voided
            || s.epochs.get(&mdt) != Some(&restarts)
            || (asked.revoked != s.revoked && s.revoked_floor > asked.revoked)
        {
            return false;
        }
        let n = keys.len();
        let fresh: Vec<Key> = if asked.revoked == s.revoked {
            keys
        } else {
            keys.into_iter().filter(|k| s.last_revoked.get(k).is_none_or(|&at| at <= asked.revoked)).collect()
        };
        let all = fresh.len() == n;
        s.held.extend(fresh);
        all
    }

    /// The callback channel of MDT `mdt` saw its import at `restarts`: if that is new,
    /// every lease of that MDT is void. Returns the keys dropped.
    pub fn epoch(&self, mdt: u32, restarts: u64, on_mdt: impl Fn(Fid) -> bool) -> Vec<Key> {
        let mut s = self.state();
        if s.epochs.insert(mdt, restarts) == Some(restarts) {
            return Vec::new();
        }
        s.void(on_mdt)
    }

    /// Drop every lease of MDT `mdt` (its channel failed: it may have revoked some
    /// unheard), and forget its epoch until the channel works again.
    pub fn drop_mdt(&self, mdt: u32, on_mdt: impl Fn(Fid) -> bool) -> Vec<Key> {
        let mut s = self.state();
        s.epochs.remove(&mdt);
        s.void(on_mdt)
    }

    /// The MDT revoked `keys`.
    pub fn revoke(&self, keys: &[Key]) {
        let mut s = self.state();
        s.revoked += 1;
        let at = s.revoked;
        for k in keys {
            s.held.remove(k);
            s.last_revoked.insert(k.clone(), at);
            s.revoked_order.push_back((at, k.clone()));
        }
        while s.revoked_order.len() > REVOKED_KEPT {
            let Some((old, k)) = s.revoked_order.pop_front() else { break };
            if s.last_revoked.get(&k) == Some(&old) {
                s.last_revoked.remove(&k);
            }
            s.revoked_floor = s.revoked_floor.max(old);
        }
        drop(s);
        // Answers checked under a lease just dropped have reached the kernel.
        drop(self.gate.write().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn holds(&self, key: &Key) -> bool {
        self.state().held.contains(key)
    }

    /// Is `key`, of MDT `mdt`, held, with the callback channel having seen the MDT's
    /// import at `restarts` (its count now)? A lease is void from the moment its import
    /// meets a restarted MDT, before the channel drops it.
    pub fn holds_at(&self, key: &Key, mdt: u32, restarts: u64) -> bool {
        let s = self.state();
        s.epochs.get(&mdt) == Some(&restarts) && s.held.contains(key)
    }

    /// Held (shared) by whoever answers from a lease, from the check to the answer.
    pub fn gate(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_across_a_revocation_or_a_restart_is_not_kept() {
        let l = Leases::default();
        let (a, b) = (Key::Attr(Fid::new(1, 1)), Key::Attr(Fid::new(1, 2)));
        let all = |_: Fid| true;
        assert!(l.epoch(0, 1, all).is_empty());
        let asked = l.ask(1);
        assert!(l.granted(0, asked, 1, vec![a.clone()]));
        assert!(l.holds(&a));
        // A revocation meanwhile: the key revoked is not kept from a grant asked before
        // it, the others are.
        let asked = l.ask(1);
        l.revoke(std::slice::from_ref(&a));
        assert!(!l.granted(0, asked, 1, vec![a.clone(), b.clone()]));
        assert!(!l.holds(&a) && l.holds(&b));
        l.revoke(std::slice::from_ref(&b));
        // A restart (eviction) the channel has not seen yet: not kept either.
        let asked = l.ask(2);
        assert!(!l.granted(0, asked, 2, vec![b.clone()]));
        assert!(l.granted(0, l.ask(1), 1, vec![b.clone()]));
        assert_eq!(l.epoch(0, 2, all), vec![b.clone()], "the restart voids it");
        assert!(l.granted(0, l.ask(2), 2, vec![b.clone()]));
        assert_eq!(l.drop_mdt(0, all), vec![b.clone()]);
        assert!(!l.granted(0, l.ask(2), 2, vec![b]), "no channel, no lease");
    }
}
