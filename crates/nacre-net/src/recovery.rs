//! Recovery after a server restart, the server's side (Lustre's target recovery).
//!
//! A service that answers changes before they are on its drives ([`Commits`]) starts its
//! server in recovery when it knows clients from before the restart. Until recovery ends:
//!
//! - those clients reconnect (the connect reply says `recovering`), replay what they kept
//!   (requests flagged `REPLAY`, one at a time each) and say `OP_REPLAY_DONE`;
//! - replays run one at a time, in transno order over all clients. A replay runs when its
//!   transno is the next one, or is already committed, or when every expected client has
//!   either finished or has its next replay waiting, so nothing lower can still come;
//! - new requests, and requests of clients that finished replaying, wait (bounded by the
//!   request buffers they hold); new clients are refused with `EBUSY` and retry.
//!
//! The window is `recovery_time_soft` from the start, pushed out by each reconnect, and
//! never past `recovery_time_hard`. When it closes, clients not back are evicted (a later
//! change that depended on one of theirs fails with the error its checks give) and the
//! others' replays go on past the gaps; at `recovery_time_hard` a client still not done
//! is evicted too, with its replays, and recovery ends.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use crate::transport::BoxFuture;

/// What a service that answers before commit tells its server: replies carry
/// `last_committed`, `OP_COMMIT` waits for a commit, and a client that leaves is
/// forgotten before it is told it may go.
pub trait Commits: Send + Sync {
    /// The highest transno on the drives.
    fn last_committed(&self) -> u64;
    /// Commit everything answered so far; the new `last_committed`.
    fn commit(&self) -> BoxFuture<'static, u64>;
    /// `client` disconnected cleanly: drop, durably, what is kept for it (so that a
    /// restart does not wait for it). Its disconnect is answered after this.
    fn forget(&self, client: u64) -> BoxFuture<'static, ()> {
        let _ = client;
        Box::pin(async {})
    }
    /// Recovery ended: what no client reclaimed by replay may go (files unlinked while
    /// open and not reopened).
    fn recovered(&self) {}
}

/// A server's start after a restart: the clients it waits for.
#[derive(Debug, Clone, Default)]
pub struct Recovering {
    /// Clients that may hold answered changes the service has lost.
    pub clients: Vec<u64>,
    /// `last_committed` at start: replays at or below it only fetch their stored answer,
    /// and the first replay that must run in order is the one after it.
    pub last_committed: u64,
}

/// Where a client from before the restart stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stand {
    /// Not reconnected yet.
    Absent,
    /// Reconnected; replaying.
    Replaying,
    /// Sent `OP_REPLAY_DONE`.
    Done,
}

/// The figures of a recovery, as `recovery_status` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecoveryStats {
    pub recovering: bool,
    /// Clients waited for at start.
    pub clients: usize,
    /// Of those, back and done replaying.
    pub completed: usize,
    pub evicted: usize,
    /// Replays run, and those that failed.
    pub replayed: u64,
    pub replay_failed: u64,
    /// Requests held until recovery ends.
    pub held: usize,
    /// Milliseconds recovery took (once over), or has left until the window closes.
    pub duration_ms: u64,
    pub remaining_ms: u64,
}

impl RecoveryStats {
    /// `recovery_status` as Lustre's targets print it (`status: COMPLETE`, `completed_clients:
    /// 2/2`, …) for the recovery `r` of a server (`None`: none ran since it started).
    pub fn render(r: Option<RecoveryStats>) -> String {
        let Some(r) = r else { return "status: INACTIVE".into() };
        let status = match (r.recovering, r.clients) {
            (true, _) => "RECOVERING",
            (false, 0) => "INACTIVE",
            (false, _) => "COMPLETE",
        };
        let time = if r.recovering { "time_remaining_ms" } else { "recovery_duration_ms" };
        format!(
            "status: {status}\ncompleted_clients: {}/{}\nevicted_clients: {}\n\
             replayed_requests: {}\nfailed_replays: {}\nheld_requests: {}\n{time}: {}",
            r.completed,
            r.clients,
            r.evicted,
            r.replayed,
            r.replay_failed,
            r.held,
            if r.recovering { r.remaining_ms } else { r.duration_ms }
        )
    }
}

/// A replay's place in the recovery queue: transno order, and an open (state replayed
/// for as long as it is held, whose transno is the last change it may depend on) after
/// the change of its transno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Turn {
    pub transno: u64,
    pub open: bool,
    pub client: u64,
    pub xid: u64,
}

/// The server's recovery state; `T` is a queued request.
pub(crate) struct Recovery<T> {
    pub started_ms: u64,
    pub deadline_ms: u64,
    pub hard_ms: u64,
    pub soft: Duration,
    pub clients: HashMap<u64, Stand>,
    /// Replays waiting for their turn: (transno, client, xid).
    pub queue: BTreeMap<Turn, T>,
    /// A replay is running (they run one at a time).
    pub running: bool,
    /// The transno a replay must carry to run without waiting for the others.
    pub next: u64,
    pub committed: u64,
    /// Requests that wait for the end.
    pub held: VecDeque<T>,
    pub stats: RecoveryStats,
}

impl<T> Recovery<T> {
    pub fn new(r: &Recovering, now_ms: u64, soft: Duration, hard: Duration) -> Recovery<T> {
        let soft_ms = soft.as_millis() as u64;
        Recovery {
            started_ms: now_ms,
            deadline_ms: now_ms + soft_ms,
            hard_ms: now_ms + (hard.as_millis() as u64).max(soft_ms),
            soft,
            clients: r.clients.iter().map(|&c| (c, Stand::Absent)).collect(),
            queue: BTreeMap::new(),
            running: false,
            next: r.last_committed + 1,
            committed: r.last_committed,
            held: VecDeque::new(),
            stats: RecoveryStats { recovering: true, clients: r.clients.len(), ..RecoveryStats::default() },
        }
    }

    /// A new window (`recovery_time_soft`, `_hard` set while recovering): both limits
    /// are counted again from the start of recovery, so a shorter one may close it at
    /// the next tick.
    pub fn set_window(&mut self, soft: Duration, hard: Duration) {
        let soft_ms = soft.as_millis() as u64;
        self.soft = soft;
        self.hard_ms = self.started_ms + (hard.as_millis() as u64).max(soft_ms);
        self.deadline_ms = (self.started_ms + soft_ms).min(self.hard_ms);
    }

    /// A client reconnected: is it one to wait for (then it replays)?
    pub fn reconnect(&mut self, client: u64, now_ms: u64) -> bool {
        match self.clients.get_mut(&client) {
            Some(s @ (Stand::Absent | Stand::Replaying)) => {
                *s = Stand::Replaying;
                self.deadline_ms = (now_ms + self.soft.as_millis() as u64).max(self.deadline_ms).min(self.hard_ms);
                true
            }
            _ => false,
        }
    }

    pub fn is_replaying(&self, client: u64) -> bool {
        self.clients.get(&client) == Some(&Stand::Replaying)
    }

    pub fn done(&mut self, client: u64) {
        if let Some(s) = self.clients.get_mut(&client)
            && *s == Stand::Replaying
        {
            *s = Stand::Done;
            self.stats.completed += 1;
        }
    }

    /// The next replay, if it may run now (see the module docs).
    pub fn next_ready(&mut self) -> Option<T> {
        if self.running {
            return None;
        }
        let &Turn { transno, open, .. } = self.queue.keys().next()?;
        // A change runs when every lower transno has; an open once its own has too.
        let free = transno <= self.committed || transno < self.next || (transno == self.next && !open);
        let all_in = || {
            self.clients.iter().all(|(c, s)| match s {
                Stand::Absent => false,
                Stand::Done => true,
                Stand::Replaying => self.queue.keys().any(|t| t.client == *c),
            })
        };
        if !free && !all_in() {
            return None;
        }
        self.running = true;
        self.queue.pop_first().map(|(t, q)| {
            self.next = self.next.max(t.transno + 1);
            q
        })
    }

    /// The clients to evict at `now_ms` (not back once the window closed, not done at the
    /// hard limit), and their replays to drop.
    pub fn close(&mut self, now_ms: u64) -> (Vec<u64>, Vec<T>) {
        let late = |s: Stand| match s {
            Stand::Absent => now_ms >= self.deadline_ms,
            Stand::Replaying => now_ms >= self.hard_ms,
            Stand::Done => false,
        };
        let late: Vec<u64> = self.clients.iter().filter(|(_, s)| late(**s)).map(|(c, _)| *c).collect();
        for c in &late {
            self.clients.remove(c);
        }
        self.stats.evicted += late.len();
        let keys: Vec<_> = self.queue.keys().filter(|t| late.contains(&t.client)).copied().collect();
        let dropped = keys.into_iter().filter_map(|k| self.queue.remove(&k)).collect();
        (late, dropped)
    }

    /// Every client done (or evicted) and no replay left.
    pub fn finished(&self) -> bool {
        !self.running && self.queue.is_empty() && self.clients.values().all(|s| *s == Stand::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(transno: u64, client: u64, xid: u64) -> Turn {
        Turn { transno, open: false, client, xid }
    }

    fn rec(clients: &[u64], committed: u64) -> Recovery<&'static str> {
        let r = Recovering { clients: clients.to_vec(), last_committed: committed };
        Recovery::new(&r, 0, Duration::from_secs(10), Duration::from_secs(30))
    }

    #[test]
    fn replays_run_in_transno_order_over_clients() {
        let mut r = rec(&[1, 2], 10);
        r.reconnect(1, 0);
        r.reconnect(2, 0);
        // Client 1 replays transno 13 first: 11 and 12 may still come from client 2.
        r.queue.insert(change(13, 1, 5), "c1-13");
        assert_eq!(r.next_ready(), None);
        r.queue.insert(change(11, 2, 7), "c2-11");
        assert_eq!(r.next_ready(), Some("c2-11"), "the next transno runs at once");
        assert_eq!(r.next_ready(), None, "one at a time");
        r.running = false;
        // 12 may still come from client 2, which has nothing queued and is not done.
        assert_eq!(r.next_ready(), None);
        r.done(2);
        assert_eq!(r.next_ready(), Some("c1-13"), "with client 2 done, nothing lower can come");
        r.running = false;
        assert!(!r.finished(), "client 1 is not done");
        r.done(1);
        assert!(r.finished());
        assert_eq!(r.stats.completed, 2);
    }

    #[test]
    fn committed_replays_run_at_once_and_absent_clients_hold_the_rest() {
        let mut r = rec(&[1, 2], 10);
        r.reconnect(1, 0);
        r.queue.insert(change(9, 1, 1), "answered from its record");
        assert_eq!(r.next_ready(), Some("answered from its record"));
        r.running = false;
        r.queue.insert(change(14, 1, 2), "gap");
        assert_eq!(r.next_ready(), None, "client 2 is not back");
        assert_eq!(r.close(9_999), (vec![], vec![]), "the window is open");
        assert_eq!(r.close(10_000), (vec![2], vec![]), "client 2 never came back; client 1 replays on");
        assert_eq!(r.next_ready(), Some("gap"), "past the gap");
        r.running = false;
        assert_eq!(r.close(30_000), (vec![1], vec![]), "at the hard limit, client 1 is not done");
        assert!(r.finished());
    }

    #[test]
    fn the_window_grows_with_reconnects_up_to_the_hard_limit() {
        let mut r = rec(&[1, 2, 3], 0);
        assert_eq!(r.deadline_ms, 10_000);
        r.reconnect(1, 5_000);
        assert_eq!(r.deadline_ms, 15_000);
        r.reconnect(2, 25_000);
        assert_eq!(r.deadline_ms, 30_000, "never past the hard limit");
        assert!(!r.reconnect(9, 1), "a client not waited for");
        r.queue.insert(change(3, 2, 1), "evicted with its client");
        r.done(1);
        assert_eq!(r.close(29_999), (vec![], vec![]));
        let (mut late, dropped) = r.close(30_000);
        late.sort();
        assert_eq!(late, vec![2, 3], "3 never came back, 2 is not done at the hard limit");
        assert_eq!(dropped, vec!["evicted with its client"]);
        assert!(r.finished());
        assert_eq!(r.stats.evicted, 2);
    }

    #[test]
    fn an_open_runs_after_the_change_of_its_transno() {
        let mut r = rec(&[1, 2], 10);
        r.reconnect(1, 0);
        r.reconnect(2, 0);
        // Client 1 opened a file client 2 made at transno 11.
        r.queue.insert(Turn { transno: 11, open: true, client: 1, xid: 3 }, "c1-open");
        assert_eq!(r.next_ready(), None, "transno 11 may still come");
        r.queue.insert(change(11, 2, 7), "c2-11");
        assert_eq!(r.next_ready(), Some("c2-11"), "the create first");
        r.running = false;
        assert_eq!(r.next_ready(), Some("c1-open"), "then the open");
        r.running = false;
        // An open after a committed change runs at once.
        r.queue.insert(Turn { transno: 9, open: true, client: 2, xid: 8 }, "c2-open");
        assert_eq!(r.next_ready(), Some("c2-open"));
    }

    #[test]
    fn a_new_window_counts_from_the_start_of_recovery() {
        let mut r = rec(&[1, 2], 0);
        r.reconnect(1, 5_000);
        assert_eq!(r.deadline_ms, 15_000);
        r.set_window(Duration::from_secs(2), Duration::from_secs(4));
        assert_eq!((r.deadline_ms, r.hard_ms), (2_000, 4_000));
        assert_eq!(r.close(3_000), (vec![2], vec![]), "past the new soft limit: 2 is evicted at once");
        assert_eq!(r.close(4_000), (vec![1], vec![]), "at the new hard limit: 1 is not done");
        r.set_window(Duration::from_secs(50), Duration::from_secs(20));
        assert_eq!((r.deadline_ms, r.hard_ms), (50_000, 50_000), "the hard limit is never before the soft one");
    }
}
