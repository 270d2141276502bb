//! The leases this mount holds: what it may answer from its caches (the kernel's, through
//! a FUSE mount) without asking the MDT, until the MDT revokes them.
//!
//! A lease is kept only if nothing could have revoked it before it was recorded: a reply
//! that comes back across a revocation this mount carried out, or across a restart or
//! eviction of its MDT (which forgets every lease), grants nothing. Whoever answers from a
//! lease holds the [`Leases::gate`] (shared) from the check to the answer; a revocation
//! takes it (exclusive) after removing its keys and before invalidating, so no answer
//! made under a lease reaches the kernel after that lease's invalidation.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, RwLock};

use nacre_proto::fid::Fid;
use nacre_proto::mdt::lease::Key;

/// Where a reply's grant was asked: the MDT's restart count and this mount's revocation
/// count when the request went out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked {
    pub restarts: u64,
    pub revocations: u64,
}

#[derive(Default)]
struct State {
    held: HashSet<Key>,
    /// Revocations carried out (and leases dropped wholesale) so far.
    revocations: u64,
    /// Per MDT, its import's restart count as the callback channel last saw it: grants
    /// from another one are not kept until the channel has seen it too (and dropped what
    /// the restart voided).
    epochs: HashMap<u32, u64>,
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
        Asked { restarts, revocations: self.state().revocations }
    }

    /// A reply from MDT `mdt` asked at `asked`, answered with its import at `restarts`,
    /// granted `keys`: kept if nothing came between.
    pub fn granted(&self, mdt: u32, asked: Asked, restarts: u64, keys: Vec<Key>) -> bool {
        let mut s = self.state();
        if asked.restarts != restarts || asked.revocations != s.revocations || s.epochs.get(&mdt) != Some(&restarts) {
            return false;
        }
        s.held.extend(keys);
        true
    }

    /// The callback channel of MDT `mdt` saw its import at `restarts`: if that is new,
    /// every lease of that MDT is void. Returns the keys dropped.
    pub fn epoch(&self, mdt: u32, restarts: u64, on_mdt: impl Fn(Fid) -> bool) -> Vec<Key> {
        let mut s = self.state();
        if s.epochs.insert(mdt, restarts) == Some(restarts) {
            return Vec::new();
        }
        s.revocations += 1;
        let dropped: Vec<Key> = s.held.iter().filter(|k| on_mdt(k.fid())).cloned().collect();
        for k in &dropped {
            s.held.remove(k);
        }
        dropped
    }

    /// Drop every lease of MDT `mdt` (its channel failed: it may have revoked some
    /// unheard), and forget its epoch until the channel works again.
    pub fn drop_mdt(&self, mdt: u32, on_mdt: impl Fn(Fid) -> bool) -> Vec<Key> {
        let mut s = self.state();
        s.epochs.remove(&mdt);
        s.revocations += 1;
        let dropped: Vec<Key> = s.held.iter().filter(|k| on_mdt(k.fid())).cloned().collect();
        for k in &dropped {
            s.held.remove(k);
        }
        dropped
    }

    /// The MDT revoked `keys`.
    pub fn revoke(&self, keys: &[Key]) {
        let mut s = self.state();
        s.revocations += 1;
        for k in keys {
            s.held.remove(k);
        }
        drop(s);
        // Answers checked under a lease just dropped have reached the kernel.
        drop(self.gate.write().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn holds(&self, key: &Key) -> bool {
        self.state().held.contains(key)
    }

    pub fn count(&self) -> usize {
        self.state().held.len()
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
        // A revocation meanwhile: the grant asked before it is not kept.
        let asked = l.ask(1);
        l.revoke(std::slice::from_ref(&a));
        assert!(!l.granted(0, asked, 1, vec![b.clone()]));
        assert!(!l.holds(&a) && !l.holds(&b));
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
