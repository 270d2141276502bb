//! The client side of RPC. A [`Client`] is one endpoint with its identity, its interface
//! credits and its fault rules; an [`Import`] (Lustre's word) is its link to one server:
//! `conns_per_peer` connections, `max_rpcs_in_flight` requests outstanding, peer credits,
//! adaptive timeouts, resends and a pinger.
//!
//! A call takes an in-flight slot, then for each attempt a peer credit and an interface
//! credit while its frame goes onto the wire (LNet's tx credits: a negative low-water mark
//! says senders queued). It waits until the deadline — learned from past replies, never
//! under `at_min` — which an early reply from a busy server pushes out. When the deadline
//! passes or the connection drops, the same xid is sent again, flagged as a resend, over a
//! live connection (reconnecting if need be), up to `max_resends` times; the server answers
//! a resend from its reply cache instead of running the request twice. If on reconnecting
//! the server no longer knows the client (evicted, or restarted), requests in flight fail
//! with [`RpcError::Evicted`] rather than being resent into a state that is gone.
//!
//! A reply with a transno is a change the server answered before committing it: the
//! import keeps the request and its reply until a reply's `last_committed` covers it
//! (at most `replay_max` of them and `replay_bytes_max` bytes; past either it asks the
//! server to commit, `OP_COMMIT`, and waits). Open state (`flags::OPEN_STATE`, an open
//! file) is kept as long as its holder says ([`Import::keep_open`], `forget_open`).
//! When the server restarts and says it is recovering, the import replays what it kept,
//! in transno order (an open after the changes this client made before it), before
//! anything else; in-flight requests are then resent. A server that lost the client instead (evicted)
//! makes what it kept lost too.
//!
//! The pinger sends a ping to an idle server every `obd_timeout/4` with ±10% jitter (so
//! 10,000 clients that connected together do not ping together), and after a failed ping
//! waits at least the request deadline before the next: a dead server costs one ping per
//! deadline, not a storm.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::AbortHandle;

use crate::at::{AtConfig, AtEstimate};
use crate::bulk::BulkPool;
use crate::credits::{CreditPool, CreditStats, acquire_send};
use crate::fault::{self, FaultInjector};
use crate::frame::{BODY_BYTES_LIMIT, BULK_BYTES_LIMIT, Frame, FrameHeader, FrameLimits, flags};
use crate::nid::Nid;
use crate::rpc::{
    ConnectReply, ConnectRequest, OP_COMMIT, OP_CONNECT, OP_DISCONNECT, OP_PING, OP_REPLAY_DONE, Replay, RpcError,
    SplitMix, fresh_seed, lock, read_frame, status, target_id, write_frame,
};
use crate::transport::{Transport, WriteHalf};

/// Settings of a client, named after Lustre's and LNet's tunables.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Requests outstanding to one server (`osc.*.max_rpcs_in_flight`).
    pub max_rpcs_in_flight: usize,
    /// Connections to each server; requests go round-robin over them (`conns_per_peer`).
    pub conns_per_peer: usize,
    /// Messages being sent to one peer at once (`peer_credits`).
    pub peer_credits: u32,
    /// Messages being sent through this endpoint at once, all peers together (`credits`).
    pub credits: u32,
    pub limits: FrameLimits,
    pub at: AtConfig,
    /// The base of every health interval (Lustre's `timeout`, 100 s by default).
    pub obd_timeout: Duration,
    /// Ping idle servers every `obd_timeout/4`.
    pub ping: bool,
    /// Resends of one request before it fails.
    pub max_resends: u32,
    /// Answered but uncommitted changes kept for replay, per server, by count and bytes;
    /// past either the client asks for a commit.
    pub replay_max: usize,
    pub replay_bytes_max: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_rpcs_in_flight: 8,
            conns_per_peer: 1,
            peer_credits: 16,
            credits: 512,
            limits: FrameLimits::default(),
            at: AtConfig::default(),
            obd_timeout: Duration::from_secs(100),
            ping: true,
            max_resends: 3,
            replay_max: 4096,
            replay_bytes_max: 64 << 20,
        }
    }
}

/// One RPC to send.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    pub opcode: u16,
    pub body: &'a [u8],
    pub bulk: &'a [u8],
    /// The job that issues it (jobstats, TBF rules); 0 if none.
    pub job_id: u64,
    /// Fail at the first deadline or lost connection instead of resending (pings).
    pub no_resend: bool,
}

impl<'a> Request<'a> {
    pub fn new(opcode: u16, body: &'a [u8], bulk: &'a [u8]) -> Request<'a> {
        Request { opcode, body, bulk, ..Request::default() }
    }
}

struct Shared {
    /// One import per server: imports share the client's identity, so two would take
    /// each other's export.
    imports: Mutex<HashMap<Nid, Weak<Import>>>,
    /// Held while an import is being made.
    making: tokio::sync::Mutex<()>,
    transport: Arc<dyn Transport>,
    cfg: ClientConfig,
    id: u64,
    ni: Arc<CreditPool>,
    faults: Arc<FaultInjector>,
    epoch: Instant,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// A client endpoint. Cheap to clone; imports keep what they need.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl Client {
    pub fn new(transport: Arc<dyn Transport>, cfg: ClientConfig) -> Client {
        Client::with_faults(transport, cfg, None)
    }

    /// A client whose fault rules are `faults` when given (the node's network, shared
    /// with its servers), else its own.
    pub fn with_faults(transport: Arc<dyn Transport>, cfg: ClientConfig, faults: Option<Arc<FaultInjector>>) -> Client {
        let mut ids = SplitMix(fresh_seed());
        let id = ids.next_u64().max(1);
        let faults = faults.unwrap_or_else(|| Arc::new(FaultInjector::new(ids.next_u64())));
        Client {
            shared: Arc::new(Shared {
                imports: Mutex::new(HashMap::new()),
                making: tokio::sync::Mutex::new(()),
                transport,
                ni: CreditPool::new(cfg.credits),
                faults,
                cfg,
                id,
                epoch: Instant::now(),
            }),
        }
    }

    /// Leave every server this client is connected to, cleanly (what a server kept for
    /// it is committed and forgotten, so a restart of the server does not wait for it).
    pub async fn disconnect_all(&self) {
        let imports: Vec<Arc<Import>> = lock(&self.shared.imports).values().filter_map(Weak::upgrade).collect();
        for i in imports {
            let _ = i.disconnect().await;
        }
    }

    /// The identity this client presents to servers.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Fault rules applied to everything this client sends.
    pub fn faults(&self) -> &Arc<FaultInjector> {
        &self.shared.faults
    }

    /// Interface credit counters.
    pub fn credit_stats(&self) -> CreditStats {
        self.shared.ni.stats()
    }

    /// Connect to a server: the first connection is opened (and its errors returned)
    /// now, the others of `conns_per_peer` as requests need them.
    pub async fn connect(&self, target: &Nid) -> Result<Arc<Import>, RpcError> {
        self.connect_named(target, 0).await
    }

    /// [`Client::connect`], naming the service meant (its [`target_id`]; 0: any).
    async fn connect_named(&self, target: &Nid, target_id: u64) -> Result<Arc<Import>, RpcError> {
        self.connect_named_with(target, target_id, true).await
    }

    /// Connect to the service named `name` at `nid`, taking a refusal as the answer: a
    /// server in recovery says EBUSY at once, where [`Client::connect_any`] would wait for
    /// it to end (a health probe wants to know that the server answers, not to get in).
    pub async fn connect_once(&self, name: &str, nid: &Nid) -> Result<Arc<Import>, RpcError> {
        let import = self.connect_named_with(nid, target_id(name), false).await?;
        import.set_nids(vec![nid.clone()]);
        Ok(import)
    }

    async fn connect_named_with(&self, target: &Nid, target_id: u64, wait_busy: bool) -> Result<Arc<Import>, RpcError> {
        let connected = |import: Arc<Import>| async move {
            if wait_busy { import.connection_waiting().await } else { import.connection().await }
        };
        let existing = lock(&self.shared.imports).get(target).and_then(Weak::upgrade);
        if let Some(import) = existing {
            connected(import.clone()).await?;
            return Ok(import);
        }
        // One import per server: callers racing to make the first wait for the one that
        // does (two would each claim the export, and the loser's requests be lost).
        let _making = self.shared.making.lock().await;
        let existing = lock(&self.shared.imports).get(target).and_then(Weak::upgrade);
        if let Some(import) = existing {
            connected(import.clone()).await?;
            return Ok(import);
        }
        let cfg = &self.shared.cfg;
        let now = self.shared.now_ms();
        let import = Arc::new(Import {
            target: Mutex::new(target.clone()),
            target_id,
            nids: Mutex::new(Vec::new()),
            shared: self.shared.clone(),
            peer: CreditPool::new(cfg.peer_credits),
            in_flight: Semaphore::new(cfg.max_rpcs_in_flight.max(1)),
            next_xid: AtomicU64::new(1),
            pending: Arc::default(),
            link: tokio::sync::Mutex::new(Link { cookie: 0, generation: 0 }),
            conns: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            rr: AtomicUsize::new(0),
            at: Mutex::new(AtState {
                service: AtEstimate::new(cfg.at.at_history, now),
                network: AtEstimate::new(cfg.at.at_history, now),
            }),
            last_sent_ms: AtomicU64::new(now),
            server_obd_timeout_ms: AtomicU64::new(0),
            counters: Arc::default(),
            pinger: Mutex::new(None),
            moves: watch::channel(0).0,
            closed: std::sync::atomic::AtomicBool::new(false),
            kept: Mutex::new(Kept::default()),
        });
        connected(import.clone()).await?;
        {
            let mut imports = lock(&self.shared.imports);
            imports.retain(|_, w| w.strong_count() > 0);
            imports.insert(target.clone(), Arc::downgrade(&import));
        }
        if cfg.ping {
            let moves = import.moves.subscribe();
            let handle = tokio::spawn(pinger(Arc::downgrade(&import), moves, self.shared.id ^ import_seed(target)));
            *lock(&import.pinger) = Some(handle.abort_handle());
        }
        Ok(import)
    }

    /// Connect to the target named `name` (`nacre-MDT0000`), which may be at any of
    /// `nids` (its NID and its failover partners', in the order to try them): the first
    /// that serves it. Every connect of the import names it, so a server serving
    /// something else at one of those NIDs (a port a moved target left, taken since)
    /// refuses it. The import keeps the list and walks it when it loses the server
    /// ([`Import::set_nids`]).
    pub async fn connect_any(&self, name: &str, nids: &[Nid]) -> Result<Arc<Import>, RpcError> {
        let mut last = RpcError::Closed;
        for nid in nids {
            match self.connect_named(nid, target_id(name)).await {
                Ok(import) => {
                    import.set_nids(nids.to_vec());
                    return Ok(import);
                }
                Err(e @ RpcError::Evicted { .. }) => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

fn import_seed(nid: &Nid) -> u64 {
    crate::rpc::fnv1a(&nid.to_string())
}

/// A caller waiting for its reply.
struct Waiter {
    tx: Option<oneshot::Sender<Frame>>,
    /// Milliseconds (of the client's clock) after which the caller gives up on this
    /// attempt; early replies move it out.
    deadline_ms: Arc<AtomicU64>,
}

type Pending = Arc<Mutex<BTreeMap<u64, Waiter>>>;

struct Link {
    cookie: u64,
    generation: u64,
}

struct AtState {
    service: AtEstimate,
    network: AtEstimate,
}

/// One live connection of an import.
struct Conn {
    /// A frame was left half written: nothing more goes on this connection.
    broken: std::sync::atomic::AtomicBool,
    writer: tokio::sync::Mutex<WriteHalf>,
    local: Nid,
    closed: watch::Receiver<bool>,
    reader: AbortHandle,
    generation: u64,
}

impl Conn {
    fn is_closed(&self) -> bool {
        self.broken.load(Ordering::Acquire) || *self.closed.borrow() || self.closed.has_changed().is_err()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

#[derive(Default)]
struct ImportCounters {
    requests: AtomicU64,
    replies: AtomicU64,
    resends: AtomicU64,
    timeouts: AtomicU64,
    early_replies: AtomicU64,
    connects: AtomicU64,
    evictions: AtomicU64,
    pings: AtomicU64,
    ping_failures: AtomicU64,
    replays: AtomicU64,
    replay_failures: AtomicU64,
    replays_lost: AtomicU64,
    commits: AtomicU64,
    walks: AtomicU64,
}

/// Counters of an import, as `get-param` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportStats {
    pub requests: u64,
    pub replies: u64,
    pub resends: u64,
    pub timeouts: u64,
    pub early_replies: u64,
    pub connects: u64,
    pub evictions: u64,
    pub pings: u64,
    pub ping_failures: u64,
    /// Changes replayed after a server restart, those the server refused or failed, and
    /// those lost with an eviction.
    pub replays: u64,
    pub replay_failures: u64,
    pub replays_lost: u64,
    /// Commits asked for (`fsync`, a full replay list).
    pub commits: u64,
    /// Moves to the next of the server's NIDs after a failed connect (see
    /// [`Import::set_nids`]).
    pub walks: u64,
    /// Changes kept for replay now, their bytes, and the server's `last_committed`.
    pub uncommitted: usize,
    pub uncommitted_bytes: usize,
    pub last_committed: u64,
    pub in_flight: usize,
    pub peer_credits: CreditStats,
    /// The deadline a request sent now would get.
    pub timeout: Duration,
}

/// A client's link to one server.
pub struct Import {
    /// Where the server is: moved by [`Import::retarget`] when it restarts elsewhere, and
    /// along `nids` when it cannot be reached.
    target: Mutex<Nid>,
    /// The service every connect names (its [`target_id`]; 0: whatever listens there).
    target_id: u64,
    /// Every NID the server may be at (a failover pair's, as the MGS lists them), in
    /// order; empty or one: only `target`. See [`Import::set_nids`].
    nids: Mutex<Vec<Nid>>,
    /// How many times `target` moved: a request waiting out an unreachable server, and
    /// the pinger, try the new address at once.
    moves: watch::Sender<u64>,
    shared: Arc<Shared>,
    peer: Arc<CreditPool>,
    in_flight: Semaphore,
    next_xid: AtomicU64,
    pending: Pending,
    /// Held while (re)connecting, so one caller reconnects and the others wait for it.
    link: tokio::sync::Mutex<Link>,
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Bumped when the server hands out a new export in place of one it lost.
    generation: AtomicU64,
    /// Connections made to a server that had lost this client's state (see
    /// [`Import::restarts`]).
    restarts: AtomicU64,
    rr: AtomicUsize,
    at: Mutex<AtState>,
    last_sent_ms: AtomicU64,
    /// The server's `obd_timeout` as its connect reply gave it (0: not known yet).
    server_obd_timeout_ms: AtomicU64,
    counters: Arc<ImportCounters>,
    pinger: Mutex<Option<AbortHandle>>,
    /// Set by `disconnect`: the import sends nothing more.
    closed: std::sync::atomic::AtomicBool,
    /// Changes answered but not yet committed, for replay.
    kept: Mutex<Kept>,
}

/// A change kept for replay.
struct KeptRequest {
    xid: u64,
    opcode: u16,
    job_id: u64,
    body: Vec<u8>,
    bulk: Vec<u8>,
    reply: Vec<u8>,
}

impl KeptRequest {
    fn bytes(&self) -> usize {
        self.body.len() + self.bulk.len() + self.reply.len() + 64
    }
}

/// The replay list: changes by transno, open state by its holder's key with the
/// transno it follows.
#[derive(Default)]
struct Kept {
    requests: BTreeMap<u64, KeptRequest>,
    bytes: usize,
    last_committed: u64,
    /// Open state by its holder's key: the transno it follows, and the request.
    opens: BTreeMap<u64, (u64, KeptRequest)>,
    /// State taken through open handles (locks), by its holder's key, as `opens`:
    /// replayed after the opens.
    states: BTreeMap<u64, (u64, KeptRequest)>,
}

impl Kept {
    /// The server committed up to `last`: forget what that covers.
    fn committed(&mut self, last: u64) {
        if last <= self.last_committed {
            return;
        }
        self.last_committed = last;
        let later = self.requests.split_off(&(last + 1));
        let gone = std::mem::replace(&mut self.requests, later);
        self.bytes -= gone.values().map(KeptRequest::bytes).sum::<usize>();
    }

    fn keep(&mut self, mut transno: u64, r: KeptRequest) {
        if transno <= self.last_committed {
            return;
        }
        // A change answered from the server's stored reply gets the last transno it
        // gave, which another kept change may have: kept just above it (it is only
        // forgotten a little later).
        while self.requests.contains_key(&transno) {
            transno += 1;
        }
        self.bytes += r.bytes();
        self.requests.insert(transno, r);
    }

    fn clear(&mut self) -> usize {
        self.bytes = 0;
        std::mem::take(&mut self.opens).len()
            + std::mem::take(&mut self.states).len()
            + std::mem::take(&mut self.requests).len()
    }

    /// What to replay, in order: (transno, is open state, follows the opens, key in its
    /// map, xid). Open state goes after the change it follows, and state taken through
    /// an open (a lock) after the opens; an open whose request is also a change kept (a
    /// create-open) is replayed by that change.
    fn replay_order(&self) -> Vec<(u64, bool, bool, u64, u64)> {
        let mut order: Vec<_> = self.requests.iter().map(|(t, r)| (*t, false, false, *t, r.xid)).collect();
        let changes: std::collections::HashSet<u64> = self.requests.values().map(|r| r.xid).collect();
        order.extend(
            self.opens
                .iter()
                .filter(|(_, (_, r))| !changes.contains(&r.xid))
                .map(|(k, (p, r))| (*p, true, false, *k, r.xid)),
        );
        order.extend(self.states.iter().map(|(k, (p, r))| (*p, true, true, *k, r.xid)));
        order.sort_unstable();
        order
    }
}

impl Drop for Import {
    fn drop(&mut self) {
        if let Some(p) = lock(&self.pinger).take() {
            p.abort();
        }
    }
}

impl Import {
    /// How many times this import connected to a server that had lost what it held in
    /// memory for this client: evicted it, or restarted. What the client holds on the
    /// server's word alone (leases) is void once it changes.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Acquire)
    }

    pub fn target(&self) -> Nid {
        lock(&self.target).clone()
    }

    /// The server moved to `nid` (restarted on another port or node, as the MGS's
    /// configuration says): the links to the old address are cut, and the next request
    /// connects to the new one. What this import kept for replay (uncommitted changes,
    /// open files) stays, so a server recovering there gets it back; requests in flight
    /// are resent there.
    pub fn retarget(&self, nid: &Nid) {
        self.move_to(nid, None);
    }

    /// Every NID the server may be at, in the order to try them (the MGS lists a
    /// target's active NID first, then its failover partners'). When the server cannot
    /// be reached where the import points, it tries the next NID of the list at once,
    /// each once per round; after a whole round it waits a request deadline before the
    /// next (as after any failed connect: a dead pair costs a connect per NID per
    /// deadline, never a storm). So a client finds a target that failed over with no word
    /// from the MGS (which may have gone down with it), as Lustre's imports walk their
    /// failover NIDs. The list does not move the import: [`Import::retarget`] does.
    pub fn set_nids(&self, nids: Vec<Nid>) {
        *lock(&self.nids) = nids;
    }

    /// The NID after `failed` in the list, if the import still points at `failed` (a
    /// caller that failed at the same moment may have moved it already), has no live
    /// connection there, and the list has another; the import moves there. Whether it
    /// moved.
    fn walk_from(&self, failed: &Nid) -> bool {
        if lock(&self.conns).iter().any(|c| !c.is_closed()) {
            return false;
        }
        let next = {
            let nids = lock(&self.nids);
            if nids.len() < 2 {
                return false;
            }
            let at = nids.iter().position(|n| n == failed);
            nids[at.map_or(0, |i| (i + 1) % nids.len())].clone()
        };
        let moved = self.move_to(&next, Some(failed));
        if moved {
            self.counters.walks.fetch_add(1, Ordering::Relaxed);
        }
        moved
    }

    /// How many NIDs a round of walking tries.
    fn nid_count(&self) -> usize {
        lock(&self.nids).len().max(1)
    }

    /// Point the import at `nid` (only if it points at `from`, when given); whether it
    /// moved.
    fn move_to(&self, nid: &Nid, from: Option<&Nid>) -> bool {
        let old = {
            let mut t = lock(&self.target);
            if *t == *nid || from.is_some_and(|f| *t != *f) {
                return false;
            }
            std::mem::replace(&mut *t, nid.clone())
        };
        for conn in std::mem::take(&mut *lock(&self.conns)) {
            conn.broken.store(true, Ordering::Release);
            conn.reader.abort();
        }
        let mut imports = lock(&self.shared.imports);
        if let Some(me) = imports.remove(&old) {
            imports.insert(nid.clone(), me);
        }
        drop(imports);
        // A walk tells no one: requests waiting out a dead server keep their pause (each
        // failed connect would otherwise wake them all to fail again, a storm).
        if from.is_none() {
            self.moves.send_modify(|m| *m += 1);
        }
        true
    }

    /// Wait `d` before trying an unreachable server again, or less: not past a move of
    /// the server that came after `seen` moves.
    async fn pause(&self, d: Duration, seen: u64) {
        let mut moves = self.moves.subscribe();
        let _ = tokio::time::timeout(d, moves.wait_for(|m| *m != seen)).await;
    }

    /// Send a request and wait for its reply.
    pub async fn call(&self, opcode: u16, body: &[u8], bulk: &[u8]) -> Result<Frame, RpcError> {
        self.send(Request::new(opcode, body, bulk)).await
    }

    /// Ping the server once (no resend).
    pub async fn ping(&self) -> Result<(), RpcError> {
        self.counters.pings.fetch_add(1, Ordering::Relaxed);
        let r = self.send(Request { opcode: OP_PING, no_resend: true, ..Request::default() }).await;
        if r.is_err() {
            self.counters.ping_failures.fetch_add(1, Ordering::Relaxed);
        }
        r.map(|_| ())
    }

    /// Tell the server this client is leaving, so it drops the export now instead of
    /// evicting it later.
    pub async fn disconnect(&self) -> Result<(), RpcError> {
        if let Some(p) = lock(&self.pinger).take() {
            p.abort();
        }
        let r = self.send(Request { opcode: OP_DISCONNECT, no_resend: true, ..Request::default() }).await;
        self.closed.store(true, Ordering::Release);
        self.in_flight.close();
        lock(&self.conns).clear();
        r.map(|_| ())
    }

    /// The deadline a request sent now gets: service plus network estimate, 125% of it
    /// as Lustre's `at_est2timeout` does, within `[at_min, at_max]`.
    pub fn timeout(&self) -> Duration {
        let now = self.shared.now_ms();
        let mut at = lock(&self.at);
        let est = at.service.estimate(now).saturating_add(at.network.estimate(now));
        let cfg = &self.shared.cfg.at;
        (est + est / 4).clamp(cfg.at_min, cfg.at_max.max(cfg.at_min))
    }

    pub fn stats(&self) -> ImportStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let kept = lock(&self.kept);
        ImportStats {
            requests: get(&c.requests),
            replies: get(&c.replies),
            resends: get(&c.resends),
            timeouts: get(&c.timeouts),
            early_replies: get(&c.early_replies),
            connects: get(&c.connects),
            evictions: get(&c.evictions),
            pings: get(&c.pings),
            ping_failures: get(&c.ping_failures),
            replays: get(&c.replays),
            replay_failures: get(&c.replay_failures),
            replays_lost: get(&c.replays_lost),
            commits: get(&c.commits),
            walks: get(&c.walks),
            uncommitted: kept.requests.len(),
            uncommitted_bytes: kept.bytes,
            last_committed: kept.last_committed,
            in_flight: self.shared.cfg.max_rpcs_in_flight.max(1) - self.in_flight.available_permits(),
            peer_credits: self.peer.stats(),
            timeout: self.timeout(),
        }
    }

    /// Send a request and wait for its reply, resending as the module docs say.
    pub async fn send(&self, req: Request<'_>) -> Result<Frame, RpcError> {
        let (frame, over) = self.round_trip(req).await?;
        if over {
            // Too much kept for replay: wait for the server to commit it.
            self.counters.commits.fetch_add(1, Ordering::Relaxed);
            self.round_trip(Request { opcode: OP_COMMIT, ..Request::default() }).await?;
        }
        Ok(frame)
    }

    /// One request and its reply, with its resends; true with the reply if the replay
    /// list is over its bounds now.
    async fn round_trip(&self, req: Request<'_>) -> Result<(Frame, bool), RpcError> {
        let cfg = &self.shared.cfg;
        let (body_max, bulk_max) =
            (cfg.limits.body_max.min(BODY_BYTES_LIMIT), cfg.limits.bulk_max.min(BULK_BYTES_LIMIT));
        if req.body.len() > body_max as usize {
            return Err(RpcError::TooLarge { what: "body", len: req.body.len(), max: body_max });
        }
        if req.bulk.len() > bulk_max as usize {
            return Err(RpcError::TooLarge { what: "bulk", len: req.bulk.len(), max: bulk_max });
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(RpcError::Closed);
        }
        // Pings do not wait behind requests for a slot: a client whose slots are all
        // held by slow requests must still be heard, or it would be evicted.
        let _slot = match req.opcode {
            OP_PING => None,
            _ => Some(self.in_flight.acquire().await.map_err(|_| RpcError::Closed)?),
        };
        let generation = self.generation.load(Ordering::Acquire);
        let (tx, mut rx) = oneshot::channel();
        let deadline_ms = Arc::new(AtomicU64::new(u64::MAX));
        let xid = {
            // The xid is taken and registered together, so a request sent meanwhile never
            // acknowledges an xid that is not yet waiting.
            let mut p = self.lock_pending();
            let xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
            p.insert(xid, Waiter { tx: Some(tx), deadline_ms: deadline_ms.clone() });
            xid
        };
        let _forget = Forget { pending: &self.pending, xid };
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let mut attempts = 0u32;
        // NIDs tried since the last pause (see `set_nids`), and whether this pass is the
        // same attempt at the next of them.
        let (mut walked, mut hop) = (0, false);
        loop {
            if !std::mem::take(&mut hop) {
                attempts += 1;
            }
            let last_try = req.no_resend || attempts > cfg.max_resends;
            let seen = *self.moves.borrow();
            let tried = self.target();
            let conn = match self.connection_waiting().await {
                Ok(c) => {
                    walked = 0;
                    c
                }
                Err(e @ RpcError::Evicted { .. }) => return Err(e),
                Err(e) => {
                    // The server is unreachable there. The next of its NIDs is tried at
                    // once, as part of the same attempt; after a whole round (or with one
                    // NID), a deadline is waited before the next attempt, so a dead server
                    // is not hammered with connects, unless it moves.
                    // A server that answered "full" or "recovering" is there: no walk.
                    let there = matches!(&e, RpcError::Refused { status: status::EUSERS | status::EBUSY, .. });
                    let moved = !there && self.walk_from(&tried);
                    if moved {
                        walked += 1;
                        if walked < self.nid_count() {
                            hop = true;
                            continue;
                        }
                        walked = 0;
                    }
                    if last_try {
                        return Err(e);
                    }
                    self.pause(self.timeout(), seen).await;
                    continue;
                }
            };
            if conn.generation != generation {
                return Err(RpcError::Evicted { target: self.target() });
            }
            let timeout = self.timeout();
            let sent_ms = self.shared.now_ms();
            deadline_ms.store(sent_ms + timeout.as_millis() as u64, Ordering::Release);
            let header = FrameHeader {
                opcode: req.opcode,
                flags: if attempts > 1 { flags::RESEND } else { 0 },
                xid,
                body_len: req.body.len() as u32,
                bulk_len: req.bulk.len() as u32,
                job_id: req.job_id,
                timeout_ms: timeout.as_millis().min(u32::MAX as u128) as u32,
                acked_xid: self.lock_pending().keys().next().copied().unwrap_or(xid),
                ..FrameHeader::default()
            };
            if attempts > 1 {
                self.counters.resends.fetch_add(1, Ordering::Relaxed);
            }
            self.last_sent_ms.store(sent_ms, Ordering::Relaxed);
            let sent_at = Instant::now();
            if self.transmit(&conn, &header, req.body, req.bulk).await.is_err() {
                self.drop_connection(&conn);
                if last_try {
                    return Err(RpcError::Closed);
                }
                continue;
            }
            match self.wait(&conn, &mut rx, &deadline_ms).await {
                Some(frame) => {
                    self.learn(sent_at.elapsed(), &frame.header);
                    self.counters.replies.fetch_add(1, Ordering::Relaxed);
                    lock(&self.kept).committed(frame.header.last_committed);
                    // Open state is kept by its holder (`keep_open`); a create-open is
                    // a change too.
                    let change = frame.header.transno != 0 && frame.header.flags & flags::AFTER == 0;
                    let over = change && self.keep(&req, xid, &frame);
                    return Ok((frame, over));
                }
                None if last_try => {
                    self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                    return Err(if conn.is_closed() {
                        RpcError::Closed
                    } else {
                        RpcError::Timeout { xid, after: started.elapsed(), attempts }
                    });
                }
                None => {}
            }
        }
    }

    /// Keep an answered change for replay; true if the list is now over its bounds.
    fn keep(&self, req: &Request<'_>, xid: u64, reply: &Frame) -> bool {
        let mut k = lock(&self.kept);
        let r = KeptRequest {
            xid,
            opcode: req.opcode,
            job_id: req.job_id,
            body: req.body.to_vec(),
            bulk: req.bulk.to_vec(),
            reply: reply.body.clone(),
        };
        k.keep(reply.header.transno, r);
        let cfg = &self.shared.cfg;
        k.requests.len() > cfg.replay_max || k.bytes > cfg.replay_bytes_max
    }

    /// Ask the server to commit everything it answered this client (and everyone else),
    /// and wait for it; the server's `last_committed` after. What `fsync` waits for.
    pub async fn commit(&self) -> Result<u64, RpcError> {
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        let (r, _) = self.round_trip(Request { opcode: OP_COMMIT, ..Request::default() }).await?;
        Ok(r.header.last_committed)
    }

    /// Changes kept for replay (answered, not known to be committed).
    pub fn uncommitted(&self) -> usize {
        lock(&self.kept).requests.len()
    }

    /// Keep the request that opened state `key` (its reply flagged
    /// `flags::OPEN_STATE`) for replay after a server restart, until
    /// [`Import::forget_open`]. It is replayed after the changes this client made before
    /// it, and after the change its reply names (`flags::AFTER`: a file another client
    /// made). Nothing is kept for a reply without the flag.
    pub fn keep_open(&self, key: u64, opcode: u16, body: &[u8], reply: &Frame) {
        if reply.header.flags & flags::OPEN_STATE == 0 {
            return;
        }
        let mut k = lock(&self.kept);
        let after = k.requests.keys().next_back().copied().unwrap_or(0).max(k.last_committed).max(reply.header.transno);
        let r = KeptRequest {
            xid: reply.header.xid,
            opcode,
            job_id: 0,
            body: body.to_vec(),
            bulk: Vec::new(),
            reply: reply.body.clone(),
        };
        k.opens.insert(key, (after, r));
    }

    /// Keep state this client holds that no reply stands for (a lock it took), as
    /// [`Import::keep_open`] keeps an open: the request `body` of `opcode` that takes it
    /// again is replayed after a server restart, after the changes kept now and after
    /// every open, until [`Import::forget_state`] with `key` (keys of their own, apart
    /// from the opens').
    pub fn keep_state(&self, key: u64, opcode: u16, body: &[u8]) {
        let mut k = lock(&self.kept);
        let after = k.requests.keys().next_back().copied().unwrap_or(0).max(k.last_committed);
        let xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
        let r = KeptRequest { xid, opcode, job_id: 0, body: body.to_vec(), bulk: Vec::new(), reply: Vec::new() };
        k.states.insert(key, (after, r));
    }

    /// The state kept as `key` by [`Import::keep_state`] was let go.
    pub fn forget_state(&self, key: u64) {
        lock(&self.kept).states.remove(&key);
    }

    /// The state `key` was let go (the file closed): no more replay of its open.
    pub fn forget_open(&self, key: u64) {
        lock(&self.kept).opens.remove(&key);
    }

    /// Open state kept for replay.
    pub fn open_states(&self) -> usize {
        lock(&self.kept).opens.len()
    }

    /// Replay what was kept to a server that restarted and waits for it (see the module
    /// docs), on `conn`, one request at a time; then say it is done.
    async fn replay(&self, conn: &Conn) -> Result<(), RpcError> {
        // Replayed changes are kept again under the transno the replay gave once the
        // replay ends, well or not (a new transno may be the old one of a change not yet
        // replayed; a replay cut short is sent again whole at the next reconnect).
        let mut renewed: Vec<(u64, KeptRequest)> = Vec::new();
        let r = self.replay_each(conn, &mut renewed).await;
        if !matches!(r, Err(RpcError::Evicted { .. })) {
            let mut k = lock(&self.kept);
            for (t, r) in renewed {
                k.keep(t, r);
            }
        }
        r?;
        let done = FrameHeader {
            opcode: OP_REPLAY_DONE,
            xid: self.next_xid.fetch_add(1, Ordering::Relaxed),
            ..Default::default()
        };
        self.exchange(conn, done, &[], &[]).await.map(|_| ())
    }

    /// Replay each change and open kept, in order; the changes replayed go to `renewed`.
    async fn replay_each(&self, conn: &Conn, renewed: &mut Vec<(u64, KeptRequest)>) -> Result<(), RpcError> {
        let order = lock(&self.kept).replay_order();
        for (transno, open, late, key, xid) in order {
            let (header, body, bulk, open, key) = {
                let k = lock(&self.kept);
                let (open, key, r) = match (open, late) {
                    (true, false) => (true, key, k.opens.get(&key).map(|(_, r)| r)),
                    (true, true) => (true, key, k.states.get(&key).map(|(_, r)| r)),
                    (false, _) => match k.requests.get(&key) {
                        Some(r) => (false, key, Some(r)),
                        // Known committed since the order was made (an earlier replay's
                        // reply said so): not replayed as a change, but the open it made
                        // (a create-open's) still is, as open state.
                        None => match k.opens.iter().find(|(_, (_, r))| r.xid == xid) {
                            Some((handle, (_, r))) => (true, *handle, Some(r)),
                            None => (false, key, None),
                        },
                    },
                };
                let Some(r) = r else { continue };
                let body = Replay::encode(&r.body, &r.reply);
                let header = FrameHeader {
                    opcode: r.opcode,
                    flags: if open { flags::REPLAY | flags::OPEN_STATE } else { flags::REPLAY },
                    xid: r.xid,
                    body_len: body.len() as u32,
                    bulk_len: r.bulk.len() as u32,
                    job_id: r.job_id,
                    transno,
                    ..FrameHeader::default()
                };
                (header, body, r.bulk.clone(), open, key)
            };
            self.counters.replays.fetch_add(1, Ordering::Relaxed);
            let reply = self.exchange(conn, header, &body, &bulk).await?;
            let mut k = lock(&self.kept);
            k.committed(reply.header.last_committed);
            if open {
                // Held on: it stays kept, under its first reply (the same handle).
                if reply.header.status != 0 {
                    self.counters.replay_failures.fetch_add(1, Ordering::Relaxed);
                    if late {
                        k.states.remove(&key);
                    } else {
                        k.opens.remove(&key);
                    }
                }
                continue;
            }
            match reply.header.status {
                0 => {
                    // Kept under the transno the replay got, until that is committed.
                    if let Some(mut r) = k.requests.remove(&transno) {
                        k.bytes -= r.bytes();
                        if reply.header.transno != 0 {
                            r.reply = reply.body.clone();
                            renewed.push((reply.header.transno, r));
                        }
                    }
                }
                status::ESTALE => {
                    // The server does not take our replays after all: what was kept is lost.
                    let lost = k.clear();
                    self.counters.replays_lost.fetch_add(lost as u64, Ordering::Relaxed);
                    return Err(RpcError::Evicted { target: self.target() });
                }
                _ => {
                    // It ran and failed (a change it depended on was lost): it stays
                    // failed; the server said why in its log.
                    self.counters.replay_failures.fetch_add(1, Ordering::Relaxed);
                    if let Some(r) = k.requests.remove(&transno) {
                        k.bytes -= r.bytes();
                    }
                }
            }
        }
        Ok(())
    }

    /// Send one frame on `conn` and wait for its reply (early replies extend the wait),
    /// without resends: for replays, where a lost connection fails the reconnect.
    async fn exchange(
        &self,
        conn: &Conn,
        mut header: FrameHeader,
        body: &[u8],
        bulk: &[u8],
    ) -> Result<Frame, RpcError> {
        let (tx, mut rx) = oneshot::channel();
        let deadline_ms = Arc::new(AtomicU64::new(u64::MAX));
        self.lock_pending().insert(header.xid, Waiter { tx: Some(tx), deadline_ms: deadline_ms.clone() });
        let _forget = Forget { pending: &self.pending, xid: header.xid };
        let timeout = self.timeout();
        header.timeout_ms = timeout.as_millis().min(u32::MAX as u128) as u32;
        deadline_ms.store(self.shared.now_ms() + timeout.as_millis() as u64, Ordering::Release);
        self.transmit(conn, &header, body, bulk).await?;
        self.wait(conn, &mut rx, &deadline_ms).await.ok_or(RpcError::Timeout {
            xid: header.xid,
            after: timeout,
            attempts: 1,
        })
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Waiter>> {
        lock(&self.pending)
    }

    /// Wait for the reply, the deadline (as early replies move it) or the connection's end.
    async fn wait(&self, conn: &Conn, rx: &mut oneshot::Receiver<Frame>, deadline_ms: &AtomicU64) -> Option<Frame> {
        let mut closed = conn.closed.clone();
        loop {
            let due = deadline_ms.load(Ordering::Acquire);
            let at = self.shared.epoch + Duration::from_millis(due);
            tokio::select! {
                r = &mut *rx => return r.ok(),
                _ = tokio::time::sleep_until(at.into()) => {
                    if deadline_ms.load(Ordering::Acquire) <= due {
                        return None;
                    }
                }
                _ = closed.wait_for(|c| *c) => {
                    // A reply may have raced the close.
                    return rx.try_recv().ok();
                }
            }
        }
    }

    /// Put one frame on the wire under peer and interface credits, through the fault rules.
    async fn transmit(&self, conn: &Conn, header: &FrameHeader, body: &[u8], bulk: &[u8]) -> std::io::Result<()> {
        let _credits = acquire_send(&self.peer, &self.shared.ni).await;
        let action = self.shared.faults.decide(&conn.local, &lock(&self.target), header.opcode);
        let Some(copies) = fault::copies(action).await else {
            let mut w = conn.writer.lock().await;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut *w).await;
            return Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "cut by a fault rule"));
        };
        crate::inline::unlocked(async {
            let mut w = conn.writer.lock().await;
            // A call cancelled in the middle of a frame must not leave half of it on a
            // connection others go on using: the server would read the next frame's bytes
            // as this one's rest. Until the frame is whole, dropping this guard breaks the
            // link.
            let guard = BreakOnDrop(conn);
            for _ in 0..copies {
                write_frame(&mut *w, header, body, bulk).await?;
            }
            std::mem::forget(guard);
            Ok(())
        })
        .await
    }

    /// Learn from a reply: the server's service estimate, and the round trip less the
    /// time the server held the request as network time.
    fn learn(&self, rtt: Duration, h: &FrameHeader) {
        let now = self.shared.now_ms();
        let mut at = lock(&self.at);
        at.service.observe(now, Duration::from_millis(h.timeout_ms as u64));
        at.network.observe(now, rtt.saturating_sub(Duration::from_micros(h.service_us as u64)));
    }

    /// [`Import::connection`], waiting while the server is recovering and not taking
    /// new clients yet: it ends its recovery within its window, after which it does.
    async fn connection_waiting(&self) -> Result<Arc<Conn>, RpcError> {
        loop {
            match self.connection().await {
                Err(RpcError::Refused { status: status::EBUSY, .. }) => tokio::time::sleep(self.timeout()).await,
                r => return r,
            }
        }
    }

    /// A live connection, round-robin over `conns_per_peer`; opens what is missing.
    async fn connection(&self) -> Result<Arc<Conn>, RpcError> {
        let want = self.shared.cfg.conns_per_peer.max(1);
        {
            let conns = lock(&self.conns);
            if conns.len() == want && conns.iter().all(|c| !c.is_closed()) {
                let i = self.rr.fetch_add(1, Ordering::Relaxed) % want;
                return Ok(conns[i].clone());
            }
        }
        let mut link = self.link.lock().await;
        lock(&self.conns).retain(|c| !c.is_closed());
        loop {
            let have = lock(&self.conns).len();
            if have >= want {
                break;
            }
            let conn = self.open(&mut link).await?;
            let mut conns = lock(&self.conns);
            // Links to an export the server lost are dropped; callers that sent on them
            // learn it from the generation.
            conns.retain(|c| c.generation == conn.generation);
            conns.push(conn);
        }
        let conns = lock(&self.conns);
        let i = self.rr.fetch_add(1, Ordering::Relaxed) % conns.len().max(1);
        conns.get(i).cloned().ok_or(RpcError::Closed)
    }

    /// Open one connection and run the connect handshake on it.
    async fn open(&self, link: &mut Link) -> Result<Arc<Conn>, RpcError> {
        let s = &self.shared;
        let target = self.target();
        let mut stream = tokio::time::timeout(self.timeout(), s.transport.connect(&target))
            .await
            .map_err(|_| RpcError::Timeout { xid: 0, after: self.timeout(), attempts: 1 })??;
        let req = ConnectRequest { client: s.id, cookie: link.cookie, target: self.target_id }.encode();
        let header = FrameHeader {
            opcode: OP_CONNECT,
            xid: 0,
            body_len: req.len() as u32,
            timeout_ms: self.timeout().as_millis() as u32,
            ..FrameHeader::default()
        };
        write_frame(&mut *stream.write, &header, &req, &[]).await?;
        let pool = BulkPool::new(0);
        let reply = tokio::time::timeout(self.timeout(), read_frame(&mut *stream.read, &s.cfg.limits, &pool))
            .await
            .map_err(|_| RpcError::Timeout { xid: 0, after: self.timeout(), attempts: 1 })??
            .ok_or(RpcError::Closed)?;
        if reply.header.status != 0 {
            let reason = String::from_utf8_lossy(&reply.body).into_owned();
            return Err(RpcError::Refused { target, status: reply.header.status, reason });
        }
        let r = ConnectReply::decode(&reply.body).map_err(RpcError::Protocol)?;
        self.counters.connects.fetch_add(1, Ordering::Relaxed);
        if r.export_lost || r.recovering {
            // The server has none of what it held for this client in memory (leases).
            self.restarts.fetch_add(1, Ordering::Release);
        }
        if r.export_lost && !r.recovering {
            let lost = lock(&self.kept).clear();
            self.counters.replays_lost.fetch_add(lost as u64, Ordering::Relaxed);
            // Evicted, or the server restarted without waiting for what we kept: what is
            // in flight is lost too. A server that restarted (or took the target over)
            // with nothing of ours to wait for never answered what is in flight: it goes
            // again.
            if r.evicted || lost > 0 {
                link.generation += 1;
                self.generation.store(link.generation, Ordering::Release);
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        link.cookie = r.cookie;
        self.server_obd_timeout_ms.store(r.obd_timeout_ms as u64, Ordering::Relaxed);
        let (closed_tx, closed) = watch::channel(false);
        let task = stream.read_task();
        let reader = tokio::spawn(task.run(read_replies(
            stream.read,
            self.pending.clone(),
            s.cfg.limits,
            s.epoch,
            closed_tx,
            self.counters.clone(),
        )));
        let conn = Conn {
            broken: std::sync::atomic::AtomicBool::new(false),
            writer: tokio::sync::Mutex::new(stream.write),
            local: stream.local,
            closed,
            reader: reader.abort_handle(),
            generation: link.generation,
        };
        if r.recovering {
            // Before anything else goes on this link (callers wait on `link`).
            if let Err(e) = self.replay(&conn).await {
                if matches!(e, RpcError::Evicted { .. }) {
                    link.generation += 1;
                    self.generation.store(link.generation, Ordering::Release);
                    self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                }
                return Err(e);
            }
        }
        Ok(Arc::new(conn))
    }

    fn drop_connection(&self, conn: &Arc<Conn>) {
        conn.reader.abort();
        lock(&self.conns).retain(|c| !Arc::ptr_eq(c, conn));
    }

    /// How often the pinger pings when idle: a quarter of the shorter of this client's
    /// and the server's `obd_timeout`, so a client is never evicted for following its own.
    pub fn ping_interval(&self) -> Duration {
        let ours = self.shared.cfg.obd_timeout;
        let theirs = Duration::from_millis(self.server_obd_timeout_ms.load(Ordering::Relaxed));
        (if theirs.is_zero() { ours } else { ours.min(theirs) }) / 4
    }

    /// Time since this import last sent anything.
    pub fn last_sent(&self) -> Duration {
        Duration::from_millis(self.shared.now_ms().saturating_sub(self.last_sent_ms.load(Ordering::Relaxed)))
    }
}

/// Breaks a connection if dropped (see [`Import::transmit`]).
struct BreakOnDrop<'a>(&'a Conn);

impl Drop for BreakOnDrop<'_> {
    fn drop(&mut self) {
        self.0.broken.store(true, Ordering::Release);
        self.0.reader.abort();
    }
}

/// Removes a caller's waiter however its call ends (reply, error or cancellation).
struct Forget<'a> {
    pending: &'a Pending,
    xid: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.pending).remove(&self.xid);
    }
}

/// The reading side of a connection: replies to their callers, early replies to their
/// deadlines; anything else from the server is dropped.
async fn read_replies(
    mut read: crate::transport::ReadHalf,
    pending: Pending,
    limits: FrameLimits,
    epoch: Instant,
    closed: watch::Sender<bool>,
    counters: Arc<ImportCounters>,
) {
    // Replies go to their callers, so their buffers are not pooled here.
    let pool = BulkPool::new(0);
    while let Ok(Some(frame)) = read_frame(&mut *read, &limits, &pool).await {
        let h = frame.header;
        if h.flags & flags::REPLY == 0 {
            continue;
        }
        let tx = {
            let mut p = lock(&pending);
            let Some(w) = p.get_mut(&h.xid) else { continue };
            if h.flags & flags::EARLY != 0 {
                let now = epoch.elapsed().as_millis() as u64;
                w.deadline_ms.fetch_max(now + h.timeout_ms as u64, Ordering::AcqRel);
                counters.early_replies.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            w.tx.take()
        };
        // Sent with the map let go: the send wakes the caller, and callers of other
        // threads take the map to send and to forget their requests.
        if let Some(tx) = tx {
            let _ = tx.send(frame);
        }
    }
    let _ = closed.send(true);
}

/// Ping the import's server whenever it has been idle for `obd_timeout/4`, and at once
/// when it moves: a server that restarted elsewhere waits in recovery for its clients
/// from before, an idle one too, and should not wait a ping interval for it (Lustre's
/// pinger likewise wakes for an import that needs to reconnect).
async fn pinger(import: Weak<Import>, mut moves: watch::Receiver<u64>, seed: u64) {
    let mut rng = SplitMix(seed);
    loop {
        let Some(interval) = import.upgrade().map(|i| i.ping_interval()) else { return };
        // ±10% jitter.
        let tenth = interval.as_micros() as u64 / 10;
        let jitter = if tenth > 0 { rng.next_u64() % (2 * tenth) } else { 0 };
        let sleep = interval.saturating_sub(Duration::from_micros(tenth)) + Duration::from_micros(jitter);
        let moved = tokio::select! {
            _ = tokio::time::sleep(sleep) => false,
            changed = moves.changed() => changed.is_ok(),
        };
        let Some(imp) = import.upgrade() else { return };
        if !moved && imp.last_sent() < interval {
            continue;
        }
        let started = Instant::now();
        if imp.ping().await.is_err() {
            // Never sooner than the transport's own timeout.
            let rest = imp.timeout().saturating_sub(started.elapsed());
            drop(imp);
            tokio::time::sleep(rest).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(xid: u64) -> KeptRequest {
        KeptRequest { xid, opcode: 20, job_id: 0, body: vec![1; 10], bulk: vec![], reply: vec![] }
    }

    #[test]
    fn the_replay_list_keeps_what_is_not_committed_and_never_loses_a_change() {
        let mut k = Kept::default();
        k.keep(5, req(1));
        k.keep(7, req(2));
        // A resend answered from the server's stored reply gets the last transno given,
        // which a kept change may have: both stay.
        k.keep(7, req(3));
        assert_eq!(k.requests.keys().copied().collect::<Vec<_>>(), vec![5, 7, 8]);
        assert_eq!(k.bytes, 3 * req(0).bytes());
        k.committed(7);
        assert_eq!(k.requests.keys().copied().collect::<Vec<_>>(), vec![8]);
        assert_eq!(k.bytes, req(0).bytes());
        k.keep(6, req(4));
        assert_eq!(k.requests.len(), 1, "at or below last_committed: nothing to keep");
        assert_eq!(k.clear(), 1);
        assert_eq!((k.requests.len(), k.bytes), (0, 0));
    }

    #[test]
    fn opens_replay_after_the_changes_before_them_and_a_create_open_once() {
        let mut k = Kept::default();
        k.keep(10, req(1));
        k.keep(12, req(3));
        // An open made after change 10; a create-open that is change 12 too.
        k.opens.insert(0xa, (10, req(2)));
        k.opens.insert(0xb, (12, req(3)));
        // A lock taken through the open, kept under a smaller key: after it all the same.
        k.states.insert(0x1, (10, req(5)));
        let order: Vec<(u64, bool, u64)> = k.replay_order().into_iter().map(|(t, o, _, key, _)| (t, o, key)).collect();
        assert_eq!(order, vec![(10, false, 10), (10, true, 0xa), (10, true, 0x1), (12, false, 12)]);
    }
}
