//! Leases: what each client may cache of this MDT's namespace, and their recall, as
//! Lustre's MDS hands out inodebits locks and calls them back (blocking ASTs).
//!
//! A client that listens for callbacks (its [`Leases::poll`], a long poll) is granted a
//! lease on each key its reads are answered with ([`nacre_proto::mdt::lease::granted`]).
//! Every change, once applied, recalls the leases other clients hold on the keys it
//! wrote ([`Leases::recall`]): each holder is sent a numbered revocation, and the change's
//! answer waits until every holder has acknowledged it, or evicts one that has not within
//! `callback_timeout`.
//!
//! A grant must never outlive a change it did not see. A read notes the recall clock
//! before it reads ([`Leases::clock`]); its grant is refused if any of its keys was
//! recalled since, so a lease is granted only on what was read after the last change to
//! it, or is recalled by a change that follows. A key recalled lately by another client
//! is contended and not leased for a while, so two clients that take turns changing and
//! reading one directory do not pay a callback round trip each time.
//!
//! Bounded: leases per client and in all (past either, the oldest is revoked, without
//! waiting), revocations queued per client (past twice the per-client bound, the client
//! is not listening: it is evicted), and the record of recent recalls.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nacre_proto::mdt::lease::{Key, REVOKED_MAX};
use tokio::sync::{Notify, watch};

/// Leases one client may hold by default (Lustre's `lru_size` plays this part): a
/// listing of a large directory takes two per entry.
pub const PER_CLIENT_DEFAULT: usize = 1 << 18;
/// Leases of all clients together by default: about 200 bytes each.
pub const TOTAL_DEFAULT: usize = 4 << 20;
/// How long a change waits for a holder to acknowledge a revocation before evicting it.
pub const CALLBACK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// How long a key changed by one client is not leased to others.
pub const CONTENDED_DEFAULT: Duration = Duration::from_secs(1);
/// Recent recalls remembered (older ones refuse every grant whose read began before).
const RECALLED_MAX: usize = 65_536;

/// Counters, for `get-param`.
#[derive(Debug, Default)]
pub struct LeaseStats {
    pub granted: AtomicU64,
    /// Grants refused because a key changed since the read began, or lately.
    pub refused: AtomicU64,
    pub revoked: AtomicU64,
    /// Revoked to keep within the bounds, not for a change.
    pub reclaimed: AtomicU64,
    /// Holders evicted for not acknowledging a revocation in time.
    pub timeouts: AtomicU64,
}

/// What a poll finds: revocations to send, or nothing yet (wait on the notify).
#[derive(Debug)]
pub enum Poll {
    Revoked(Vec<(u64, Key)>),
    Wait(Arc<Notify>),
}

struct Holder {
    /// Held keys, with the stamp of their grant (their place in `State::order`).
    held: HashMap<Key, u64>,
    /// Revocations sent or to send, not yet acknowledged, in order.
    pending: VecDeque<(u64, Key)>,
    /// The number of the last revocation queued.
    sent: u64,
    /// The highest revocation acknowledged.
    acked: watch::Sender<u64>,
    wake: Arc<Notify>,
}

#[derive(Default)]
struct State {
    holders: HashMap<Key, Vec<u64>>,
    clients: HashMap<u64, Holder>,
    /// Every lease by the stamp of its grant: the oldest first.
    order: BTreeMap<u64, (u64, Key)>,
    next_stamp: u64,
    /// Keys recalled lately: the clock value, when, and by whom.
    recalled: HashMap<Key, (u64, Instant, Option<u64>)>,
    recalled_order: VecDeque<(u64, Key)>,
    /// Grants of reads begun at or before this clock value are refused: the recalls
    /// since then are no longer all remembered.
    floor: u64,
    /// When the last recall that remembered its keys was.
    last_recall: Option<Instant>,
}

impl State {
    /// Take `key` from `client` and queue its revocation; the revocation's number.
    fn revoke(&mut self, client: u64, key: &Key) -> Option<u64> {
        let h = self.clients.get_mut(&client)?;
        let stamp = h.held.remove(key)?;
        self.order.remove(&stamp);
        h.sent += 1;
        h.pending.push_back((h.sent, key.clone()));
        h.wake.notify_one();
        let seq = h.sent;
        self.unhold(key, client);
        Some(seq)
    }

    /// `client` no longer holds `key`.
    fn unhold(&mut self, key: &Key, client: u64) {
        if let Some(v) = self.holders.get_mut(key) {
            v.retain(|c| *c != client);
            if v.is_empty() {
                self.holders.remove(key);
            }
        }
    }

    /// Forget `client` and every lease it holds.
    fn drop_client(&mut self, client: u64) -> usize {
        let Some(h) = self.clients.remove(&client) else { return 0 };
        for (key, stamp) in &h.held {
            self.order.remove(stamp);
            self.unhold(key, client);
        }
        h.held.len()
    }
}

pub struct Leases {
    state: Mutex<State>,
    clock: AtomicU64,
    per_client_max: AtomicUsize,
    total_max: AtomicUsize,
    callback_timeout_ms: AtomicU64,
    contended_ms: AtomicU64,
    pub stats: LeaseStats,
}

impl Default for Leases {
    fn default() -> Self {
        Leases::new()
    }
}

impl Leases {
    pub fn new() -> Leases {
        Leases {
            state: Mutex::default(),
            clock: AtomicU64::new(0),
            per_client_max: AtomicUsize::new(PER_CLIENT_DEFAULT),
            total_max: AtomicUsize::new(TOTAL_DEFAULT),
            callback_timeout_ms: AtomicU64::new(CALLBACK_TIMEOUT_DEFAULT.as_millis() as u64),
            contended_ms: AtomicU64::new(CONTENDED_DEFAULT.as_millis() as u64),
            stats: LeaseStats::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The recall clock: note it before a read whose answer may be leased.
    pub fn clock(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// Grant `client` leases on `keys`, read after clock value `since`: all or none. None
    /// if the client does not listen for callbacks, or a key was recalled since (the read
    /// may be older than the change), or is contended (changed lately by another client).
    pub fn grant(&self, client: u64, keys: &[Key], since: u64) -> bool {
        if keys.is_empty() {
            return false;
        }
        let mut s = self.state();
        if !s.clients.contains_key(&client) {
            return false;
        }
        let contended = self.contended();
        // Nothing recalled since the read began, nor within the contended time: no key
        // to look up (a listing grants two per entry).
        let quiet = self.clock() == since && s.last_recall.is_none_or(|at| at.elapsed() >= contended);
        let stale = s.floor > since
            || !quiet
                && keys.iter().any(|k| {
                    s.recalled
                        .get(k)
                        .is_some_and(|(c, at, by)| *c > since || (*by != Some(client) && at.elapsed() < contended))
                });
        if stale {
            drop(s);
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        for k in keys {
            let stamp = s.next_stamp;
            let Some(h) = s.clients.get_mut(&client) else { return false };
            if h.held.contains_key(k) {
                // Held already: it keeps its place (the order is of first grants).
                continue;
            }
            h.held.insert(k.clone(), stamp);
            s.next_stamp += 1;
            s.holders.entry(k.clone()).or_default().push(client);
            s.order.insert(stamp, (client, k.clone()));
        }
        self.stats.granted.fetch_add(keys.len() as u64, Ordering::Relaxed);
        self.reclaim(&mut s, client);
        true
    }

    /// Keep within the bounds: revoke `client`'s oldest past its own, then the oldest of
    /// all past the total.
    fn reclaim(&self, s: &mut State, client: u64) {
        let per_client = self.per_client_max.load(Ordering::Relaxed).max(1);
        let total = self.total_max.load(Ordering::Relaxed).max(1);
        let mut reclaimed = 0;
        while s.clients.get(&client).is_some_and(|h| h.held.len() > per_client) {
            let Some(oldest) = s.order.iter().find(|(_, (c, _))| *c == client).map(|(_, (_, k))| k.clone()) else {
                break;
            };
            s.revoke(client, &oldest);
            reclaimed += 1;
        }
        while s.order.len() > total {
            let Some((_, (c, k))) = s.order.iter().next().map(|(st, v)| (*st, v.clone())) else { break };
            s.revoke(c, &k);
            reclaimed += 1;
        }
        if reclaimed > 0 {
            self.stats.reclaimed.fetch_add(reclaimed, Ordering::Relaxed);
        }
    }

    /// A change by `by` (none: the MDT's own) wrote `keys`: take them back from every
    /// other holder. Returns the clock value of this recall and the revocations queued,
    /// (client, number), to wait for with [`Leases::acknowledged`].
    pub fn recall(&self, by: Option<u64>, keys: &[Key]) -> (u64, Vec<(u64, u64)>) {
        let mut s = self.state();
        let c = self.clock.fetch_add(1, Ordering::SeqCst) + 1;
        if s.clients.is_empty() {
            // Nobody to grant to: no need to remember what changed.
            s.floor = c;
            return (c, Vec::new());
        }
        let now = Instant::now();
        s.last_recall = Some(now);
        let mut revoked = Vec::new();
        // A change to a file's attributes (its size) voids the end its cached append
        // lock's holder knows.
        let appends: Vec<Key> =
            keys.iter().filter_map(|k| if let Key::Attr(f) = k { Some(Key::Append(*f)) } else { None }).collect();
        for k in keys.iter().chain(&appends) {
            s.recalled.insert(k.clone(), (c, now, by));
            s.recalled_order.push_back((c, k.clone()));
            let others: Vec<u64> =
                s.holders.get(k).map(|v| v.iter().copied().filter(|h| Some(*h) != by).collect()).unwrap_or_default();
            for h in others {
                if let Some(seq) = s.revoke(h, k) {
                    revoked.push((h, seq));
                }
            }
        }
        while s.recalled_order.len() > RECALLED_MAX {
            let Some((old, k)) = s.recalled_order.pop_front() else { break };
            if s.recalled.get(&k).is_some_and(|(at, _, _)| *at == old) {
                s.recalled.remove(&k);
            }
            s.floor = s.floor.max(old);
        }
        self.stats.revoked.fetch_add(revoked.len() as u64, Ordering::Relaxed);
        (c, revoked)
    }

    /// Wait until every revocation of `revoked` is acknowledged, or `callback_timeout`
    /// has passed: the clients that did not acknowledge in time (evict them).
    pub async fn acknowledged(&self, revoked: &[(u64, u64)]) -> Vec<u64> {
        let waits: Vec<(u64, u64, watch::Receiver<u64>)> = {
            let s = self.state();
            revoked.iter().filter_map(|&(c, seq)| Some((c, seq, s.clients.get(&c)?.acked.subscribe()))).collect()
        };
        let deadline = tokio::time::Instant::now() + self.callback_timeout();
        let mut late = Vec::new();
        for (client, seq, mut rx) in waits {
            // A dropped sender: the client was let go, and its leases with it.
            match tokio::time::timeout_at(deadline, rx.wait_for(|a| *a >= seq)).await {
                Ok(_) => {}
                Err(_) => {
                    if !late.contains(&client) {
                        late.push(client);
                    }
                }
            }
        }
        self.stats.timeouts.fetch_add(late.len() as u64, Ordering::Relaxed);
        late
    }

    /// A poll of `client`'s callback channel, which has carried out every revocation up
    /// to `acked`: the ones after it, or a notify to wait on. The first poll makes the
    /// client a holder. An acknowledgement of a revocation never sent is refused, and
    /// changes nothing.
    pub fn poll(&self, client: u64, acked: u64) -> Result<Poll, String> {
        let per_client = self.per_client_max.load(Ordering::Relaxed);
        let mut s = self.state();
        let h = s.clients.entry(client).or_insert_with(|| Holder {
            held: HashMap::new(),
            pending: VecDeque::new(),
            sent: 0,
            acked: watch::channel(0).0,
            wake: Arc::new(Notify::new()),
        });
        if acked > h.sent {
            return Err(format!(
                "the poll acknowledges revocation {acked}, but only {} were sent to client {client:016x}",
                h.sent
            ));
        }
        while h.pending.front().is_some_and(|(seq, _)| *seq <= acked) {
            h.pending.pop_front();
        }
        h.acked.send_if_modified(|a| {
            let newer = acked > *a;
            *a = (*a).max(acked);
            newer
        });
        if h.pending.is_empty() {
            return Ok(Poll::Wait(h.wake.clone()));
        }
        if h.pending.len() > per_client.saturating_mul(2).max(REVOKED_MAX) {
            s.drop_client(client);
            return Err(format!("client {client:016x} left too many revocations unacknowledged"));
        }
        Ok(Poll::Revoked(h.pending.iter().take(REVOKED_MAX).cloned().collect()))
    }

    /// Let go of `client` (evicted, or gone): its leases and revocations go; waits on
    /// them end.
    pub fn evict(&self, client: u64) -> usize {
        self.state().drop_client(client)
    }

    /// Does `client` listen for callbacks (so may be granted leases)?
    pub fn listens(&self, client: u64) -> bool {
        self.state().clients.contains_key(&client)
    }

    /// Leases held in all, and clients that listen for callbacks.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.state();
        (s.order.len(), s.clients.len())
    }

    /// Does `client` hold a lease on `key`?
    pub fn holds(&self, client: u64, key: &Key) -> bool {
        self.state().clients.get(&client).is_some_and(|h| h.held.contains_key(key))
    }

    /// Leases `client` holds (`None`: it does not listen).
    pub fn held_by(&self, client: u64) -> Option<usize> {
        self.state().clients.get(&client).map(|h| h.held.len())
    }

    pub fn callback_timeout(&self) -> Duration {
        Duration::from_millis(self.callback_timeout_ms.load(Ordering::Relaxed))
    }

    pub fn set_callback_timeout(&self, d: Duration) {
        self.callback_timeout_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn contended(&self) -> Duration {
        Duration::from_millis(self.contended_ms.load(Ordering::Relaxed))
    }

    pub fn set_contended(&self, d: Duration) {
        self.contended_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn per_client_max(&self) -> usize {
        self.per_client_max.load(Ordering::Relaxed)
    }

    pub fn set_per_client_max(&self, n: usize) {
        self.per_client_max.store(n.max(1), Ordering::Relaxed);
    }

    pub fn total_max(&self) -> usize {
        self.total_max.load(Ordering::Relaxed)
    }

    pub fn set_total_max(&self, n: usize) {
        self.total_max.store(n.max(1), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nacre_proto::fid::Fid;

    fn attr(oid: u32) -> Key {
        Key::Attr(Fid::new(1, oid))
    }

    fn revoked(l: &Leases, client: u64, acked: u64) -> Vec<(u64, Key)> {
        match l.poll(client, acked).unwrap() {
            Poll::Revoked(v) => v,
            Poll::Wait(_) => vec![],
        }
    }

    #[test]
    fn only_listeners_are_granted_and_a_change_revokes_the_others() {
        let l = Leases::new();
        l.set_contended(Duration::ZERO);
        let since = l.clock();
        assert!(!l.grant(1, &[attr(1)], since), "not listening yet");
        assert!(revoked(&l, 1, 0).is_empty());
        assert!(revoked(&l, 2, 0).is_empty());
        assert!(l.grant(1, &[attr(1)], since));
        assert!(l.grant(2, &[attr(1), attr(2)], since));
        // Client 2 changes inode 1: client 1 loses its lease, client 2 keeps its own.
        let (_, r) = l.recall(Some(2), &[attr(1)]);
        assert_eq!(r, vec![(1, 1)]);
        assert_eq!(l.held_by(1), Some(0));
        assert_eq!(l.held_by(2), Some(2));
        assert_eq!(revoked(&l, 1, 0), vec![(1, attr(1))]);
        // Sent again until acknowledged; an acknowledgement of one never sent is refused.
        assert_eq!(revoked(&l, 1, 0), vec![(1, attr(1))]);
        assert!(l.poll(1, 2).unwrap_err().contains("acknowledges revocation 2"));
        assert!(revoked(&l, 1, 1).is_empty());
        // The MDT's own change revokes everyone's.
        let (_, r) = l.recall(None, &[attr(2)]);
        assert_eq!(r, vec![(2, 1)]);
    }

    #[test]
    fn a_read_older_than_a_recall_is_not_leased() {
        let l = Leases::new();
        l.set_contended(Duration::ZERO);
        revoked(&l, 1, 0);
        let since = l.clock();
        l.recall(Some(2), &[attr(1)]);
        assert!(!l.grant(1, &[attr(1)], since), "read before the change");
        assert!(l.grant(1, &[attr(2)], since), "another key");
        assert!(l.grant(1, &[attr(1)], l.clock()), "read after it");
        assert_eq!(l.stats.refused.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_key_changed_lately_by_another_is_contended() {
        let l = Leases::new();
        revoked(&l, 1, 0);
        revoked(&l, 2, 0);
        let (c, _) = l.recall(Some(2), &[attr(1)]);
        assert!(!l.grant(1, &[attr(1)], c), "changed by client 2 just now");
        assert!(l.grant(2, &[attr(1)], c), "its own change");
        l.set_contended(Duration::ZERO);
        assert!(l.grant(1, &[attr(1)], c));
    }

    #[tokio::test]
    async fn acknowledgements_end_the_wait_and_a_silent_holder_is_named() {
        let l = Arc::new(Leases::new());
        l.set_contended(Duration::ZERO);
        l.set_callback_timeout(Duration::from_millis(200));
        revoked(&l, 1, 0);
        revoked(&l, 3, 0);
        assert!(l.grant(1, &[attr(1)], l.clock()));
        assert!(l.grant(3, &[attr(1)], l.clock()));
        let (_, r) = l.recall(Some(2), &[attr(1)]);
        assert_eq!(r.len(), 2);
        let l2 = l.clone();
        let acker = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let v = revoked(&l2, 1, 0);
            revoked(&l2, 1, v[0].0);
        });
        let t = Instant::now();
        assert_eq!(l.acknowledged(&r).await, vec![3], "client 3 never acknowledged");
        assert!(t.elapsed() >= Duration::from_millis(200));
        acker.await.unwrap();
        assert_eq!(l.evict(3), 0);
        assert_eq!(l.counts(), (0, 1));
    }

    #[test]
    fn bounds_revoke_the_oldest() {
        let l = Leases::new();
        l.set_contended(Duration::ZERO);
        l.set_per_client_max(3);
        l.set_total_max(5);
        revoked(&l, 1, 0);
        revoked(&l, 2, 0);
        for i in 1..=4 {
            assert!(l.grant(1, &[attr(i)], l.clock()));
        }
        assert_eq!(l.held_by(1), Some(3));
        assert_eq!(revoked(&l, 1, 0), vec![(1, attr(1))], "the oldest went");
        for i in 10..13 {
            assert!(l.grant(2, &[attr(i)], l.clock()));
        }
        assert_eq!(l.counts().0, 5);
        assert_eq!(revoked(&l, 1, 0), vec![(1, attr(1)), (2, attr(2))]);
        assert_eq!(l.stats.reclaimed.load(Ordering::Relaxed), 2);
    }
}
