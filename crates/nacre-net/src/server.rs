//! The server side of RPC: a [`Server`] listens on a NID and runs one service's handler.
//!
//! A connection begins with the connect handshake, which ties it to the client's
//! **export** (Lustre's word): the client's identity, its reply cache and its peer credits,
//! shared by all its connections and kept across reconnects. Then, per request:
//!
//! 1. The header is read (80 bytes on the stack; nothing is allocated for a peer that has
//!    not yet proven it speaks the protocol). Pings are answered right there.
//! 2. A request buffer (`req_buffers_max` in all) and the bulk's bytes (`req_bulk_bytes_max`
//!    in all) are taken; with none free the connection stops reading, so TCP pushes back on
//!    its client instead of the server running out of memory (CEA's OOM at 20,000 clients).
//! 3. The reply cache decides: a new xid goes on; a resend of a request still running only
//!    redirects its reply to the new connection; a resend of a finished one gets the cached
//!    reply; an xid the client has already acknowledged is dropped.
//! 4. The request waits in the policy queue (FIFO or TBF, switchable at run time) until
//!    the policy lets it start and one of `threads_max` service slots is free.
//! 5. The reply goes back under peer and interface credits, carrying the server's
//!    service-time estimate, and is kept for resends until the client acknowledges it.
//!
//! A service that answers before its changes are on its drives gives each reply a
//! transno and tells the server its `last_committed` ([`Commits`]), which every reply
//! carries; after a restart it starts the server in recovery ([`Recovering`], see
//! [`crate::recovery`]).
//!
//! A watchdog sends early replies for requests (queued or running) whose client deadline
//! is within `at_early_margin`, asking for `at_extra` more, up to `at_max`; and it evicts
//! clients silent for 1.5 × `obd_timeout` (6 missed pings), closing their connections and
//! dropping their state.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use crate::at::{AtConfig, AtEstimate};
use crate::bulk::{Bulk, BulkPool};
use crate::credits::{CreditPool, CreditStats, acquire_send};
use crate::fault::{self, FaultInjector};
use crate::frame::{BODY_BYTES_LIMIT, BULK_BYTES_LIMIT, FrameHeader, FrameLimits, flags};
use crate::nid::Nid;
pub use crate::recovery::{Commits, Recovering, RecoveryStats};
use crate::recovery::{Recovery, Stand, Turn};
use crate::rpc::{
    CONNECT_REQUEST_BYTES, ConnectReply, ConnectRequest, FIRST_SERVICE_OPCODE, OP_COMMIT, OP_CONNECT, OP_DISCONNECT,
    OP_PING, OP_REPLAY_DONE, Replay, RpcError, fresh_seed, lock, read_header, read_rest, status, write_frame,
};
use crate::tbf::{Classify, Rule, RuleCommand, Tbf, TbfError};
use crate::transport::{BoxFuture, Stream, Transport, WriteHalf};

/// Settings of a server, named after Lustre's tunables.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Requests held at once, read but not yet answered (`req_buffers_max`).
    pub req_buffers_max: usize,
    /// Bulk bytes those requests may hold together.
    pub req_bulk_bytes_max: usize,
    /// Requests running in the handler at once (`threads_max`); the rest wait in the
    /// policy queue.
    pub threads_max: usize,
    /// Messages being sent to one client at once (`peer_credits`).
    pub peer_credits: u32,
    /// Messages being sent through this endpoint at once (`credits`).
    pub credits: u32,
    pub limits: FrameLimits,
    pub at: AtConfig,
    /// What an early reply asks for (Lustre's `at_extra`, 30 s); zero turns early
    /// replies off.
    pub at_extra: Duration,
    /// How long before a client's deadline the early reply goes (`at_early_margin`, 5 s).
    pub at_early_margin: Duration,
    /// The base of health intervals: clients silent for 1.5× this are evicted.
    pub obd_timeout: Duration,
    /// Clients (exports) the server takes; a connect beyond is refused with `EUSERS`.
    pub exports_max: usize,
    /// Connections open at once; more are closed as they are accepted.
    pub connections_max: usize,
    /// Finished replies kept per client for resends, beyond those it acknowledged. Past
    /// it the oldest go first: a resend of one of those (its reply lost, and over this
    /// many newer requests finished since) runs again.
    pub reply_cache_max: usize,
    /// Bytes of reply bodies kept for resends, all clients together.
    pub reply_cache_bytes_max: usize,
    /// After a restart, how long to wait for the clients from before it; each reconnect
    /// pushes the end out by this much again (`recovery_time_soft`)...
    pub recovery_time_soft: Duration,
    /// ...but never past this (`recovery_time_hard`).
    pub recovery_time_hard: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            req_buffers_max: 512,
            req_bulk_bytes_max: 256 << 20,
            threads_max: 64,
            peer_credits: 16,
            credits: 512,
            limits: FrameLimits::default(),
            at: AtConfig::default(),
            at_extra: Duration::from_secs(30),
            at_early_margin: Duration::from_secs(5),
            obd_timeout: Duration::from_secs(100),
            exports_max: 100_000,
            connections_max: 50_000,
            reply_cache_max: 256,
            reply_cache_bytes_max: 64 << 20,
            // An idle client notices a restart at its next ping (every obd_timeout/4) plus
            // a request deadline; three quarters of obd_timeout covers both.
            recovery_time_soft: Duration::from_secs(75),
            recovery_time_hard: Duration::from_secs(225),
        }
    }
}

/// A request as the handler sees it.
pub struct Incoming {
    pub header: crate::frame::FrameHeader,
    pub body: Vec<u8>,
    pub bulk: Bulk,
    pub peer: Nid,
    /// The client's identity (stable across its connections).
    pub client: u64,
    /// A replay after a restart (the header's `transno` is the first reply's): the body
    /// of the reply it got then.
    pub replayed: Option<Vec<u8>>,
}

/// What the handler answers.
#[derive(Debug, Default)]
pub struct Reply {
    /// 0 or a negative errno.
    pub status: i32,
    pub body: Vec<u8>,
    /// Shared, so a server can answer reads from its own buffers without a copy.
    pub bulk: bytes::Bytes,
    /// The transaction number of the change the request made, if the client must keep it
    /// for replay until `last_committed` covers it (0: nothing to replay).
    pub transno: u64,
    /// The request opened state the client replays for as long as it holds it
    /// (`flags::OPEN_STATE`).
    pub open_state: bool,
    /// For open state of a request that changed nothing (`transno` 0): the last transno
    /// the service had given when it opened it; its replay waits for that change
    /// (`flags::AFTER`).
    pub after: u64,
    /// The reply grants a lease on what it answered (`flags::LEASED`), success or not (a
    /// name found missing).
    pub leased: bool,
}

/// A service's request handler.
pub type Handler = Arc<dyn Fn(Incoming) -> BoxFuture<'static, Reply> + Send + Sync>;

/// A service's answer to a request it can give at once, from memory, with no wait (see
/// [`Service::at_once`]); the request back when it cannot.
pub type AtOnce = Arc<dyn Fn(Incoming) -> Result<Reply, Incoming> + Send + Sync>;

/// The request policy of a service (Lustre's NRS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Fifo,
    Tbf,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s.trim() {
            "fifo" => Ok(Policy::Fifo),
            "tbf" => Ok(Policy::Tbf),
            other => Err(format!("unknown request policy {other:?} (use fifo or tbf)")),
        }
    }
}

/// Counters of a server, as `get-param` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerStats {
    pub connections: usize,
    pub exports: usize,
    pub connects: u64,
    pub requests: u64,
    pub replies: u64,
    pub pings: u64,
    /// Requests flagged as resends.
    pub resends: u64,
    /// Resends answered from the reply cache.
    pub replayed: u64,
    /// Resends of a request still running (its reply was redirected).
    pub joined: u64,
    /// Requests the client had already acknowledged (dropped).
    pub stale: u64,
    pub early_replies: u64,
    pub evictions: u64,
    /// Connections closed for a malformed frame or a protocol violation.
    pub malformed: u64,
    /// Connects refused because `exports_max` clients are connected.
    pub refused: u64,
    pub req_buffers_max: usize,
    pub req_buffers_in_use: usize,
    pub req_buffers_peak: usize,
    /// Most bulk bytes held by requests at once (bounded by `req_bulk_bytes_max`).
    pub req_bulk_bytes_peak: usize,
    pub queued: usize,
    pub reply_cache_bytes: usize,
    pub credits: CreditStats,
    /// The lowest peer-credit low-water mark over connected clients.
    pub peer_credits_min: i64,
    /// The service-time estimate replies carry.
    pub service_estimate: Duration,
    /// The recovery after a restart: under way, or how the last one went.
    pub recovery: RecoveryStats,
}

#[derive(Default)]
struct Counters {
    connections: AtomicUsize,
    connects: AtomicU64,
    requests: AtomicU64,
    replies: AtomicU64,
    pings: AtomicU64,
    resends: AtomicU64,
    replayed: AtomicU64,
    joined: AtomicU64,
    stale: AtomicU64,
    early_replies: AtomicU64,
    evictions: AtomicU64,
    malformed: AtomicU64,
    refused: AtomicU64,
    buffers_peak: AtomicUsize,
    bulk_bytes_peak: AtomicUsize,
}

/// A running server. Dropping it stops it and closes every connection.
pub struct Server {
    shared: Arc<Shared>,
    _tasks: JoinSet<()>,
}

/// Evictions a slow listener may fall behind by before it is told it lagged.
const EVICTED_QUEUE: usize = 1024;

struct Shared {
    nid: Nid,
    cfg: ServerConfig,
    handler: Handler,
    /// Clients evicted (or replaced by a new incarnation): services drop what they keep
    /// for them.
    evicted: tokio::sync::broadcast::Sender<u64>,
    faults: Arc<FaultInjector>,
    ni: Arc<CreditPool>,
    buffers: Arc<Semaphore>,
    bulk_bytes: Arc<Semaphore>,
    threads: Arc<Semaphore>,
    pool: Arc<BulkPool>,
    exports: Mutex<HashMap<u64, Arc<Export>>>,
    /// Clients whose export this server dropped (evicted, or gone), the newest
    /// `exports_max`: one coming back is told it was evicted, where a client this server
    /// never knew is told the server restarted.
    dropped: Mutex<Dropped>,
    next_cookie: AtomicU64,
    queue: Mutex<Queue>,
    queue_changed: Notify,
    early: Mutex<BTreeMap<(u64, u64), Early>>,
    early_seq: AtomicU64,
    service_at: Mutex<AtEstimate>,
    cache_bytes: AtomicUsize,
    counters: Counters,
    epoch: Instant,
    stop: watch::Sender<bool>,
    commits: Option<Arc<dyn Commits>>,
    /// `Service::quick`.
    quick: Vec<u16>,
    /// `Service::waits`.
    waits: Vec<u16>,
    /// `Service::at_once`.
    at_once: Option<AtOnce>,
    /// `Service::target`, and its id.
    target: Option<(String, u64)>,
    /// Set while recovering (checked on every request without taking the lock).
    recovering: std::sync::atomic::AtomicBool,
    recovery: Mutex<Option<Recovery<Queued>>>,
    /// The last recovery's figures, once it is over.
    recovered: Mutex<RecoveryStats>,
    /// `recovery_time_soft` and `recovery_time_hard`, from the configuration until set.
    window: Mutex<(Duration, Duration)>,
}

/// What a service adds to its server: its commits, and the recovery to start in.
#[derive(Default, Clone)]
pub struct Service {
    pub commits: Option<Arc<dyn Commits>>,
    /// Start in recovery for these clients (ignored without `commits`, or with no client).
    pub recovering: Option<Recovering>,
    /// Opcodes the service usually answers without waiting, from memory (lookups,
    /// getattrs, and an MDS's changes, which it answers before their commit): when
    /// nothing waits before one, it runs on its connection's task, with no task spawned
    /// for it, as a ping does. Polled once there, and should it wait after all, it goes
    /// on in a task of its own.
    pub quick: Vec<u16>,
    /// Opcodes whose handler may wait for other clients (a lock request waiting for a
    /// conflicting lock to go): each runs at once, holding no service slot, polled once
    /// on its connection's task and, if it must wait, in a task of its own, so waiters
    /// never hold up the service. The service bounds how many may wait.
    pub waits: Vec<u16>,
    /// Answers a request of a `quick` or `waits` opcode on its connection's task, before
    /// anything is set up to run it (an early reply, a queue entry, a task, a future):
    /// as cheap as a ping for a lock that conflicts with nothing or a getattr. What it
    /// hands back goes the usual way, so it must have changed nothing then. Neither a
    /// replay nor a request during recovery is offered to it.
    pub at_once: Option<AtOnce>,
    /// The target this serves (`nacre-OST0003`): a connect naming another
    /// ([`crate::rpc::target_id`]) is refused with ENODEV. `None` answers any connect.
    pub target: Option<String>,
    /// Fault rules shared with the other services of the node (its network, as LNet's
    /// drop rules are the node's); `None` gives the server rules of its own.
    pub faults: Option<Arc<FaultInjector>>,
}

/// A client as the server knows it.
struct Export {
    client: u64,
    cookie: u64,
    peer: Nid,
    credits: Arc<CreditPool>,
    last_heard_ms: AtomicU64,
    slots: Mutex<Slots>,
    /// Set when the export is evicted, replaced or disconnected: its connections close.
    gone: watch::Sender<bool>,
    /// Connections of this client waiting for a request buffer (it is not silent, only
    /// held back).
    waiting: AtomicUsize,
}

impl Export {
    fn is_gone(&self) -> bool {
        *self.gone.borrow()
    }

    /// The server owes this client something: requests queued or running, or read and
    /// waiting for a buffer. A busy client is never evicted for silence (its pings may be
    /// stuck behind its own requests in a socket the server stopped reading).
    fn busy(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
            || lock(&self.slots).map.values().any(|s| matches!(s, Slot::Running { .. }))
    }
}

#[derive(Default)]
struct Slots {
    map: BTreeMap<u64, Slot>,
    /// Every xid below this has had its reply (the highest `acked_xid` seen).
    acked: u64,
    done: usize,
}

enum Slot {
    /// In the queue or the handler; the reply goes to `route`.
    Running { route: Arc<Route> },
    /// Finished; a resend gets this reply again.
    Done { header: FrameHeader, body: Arc<Vec<u8>> },
    /// Finished with bulk (or over the cache budget): a resend runs again, which is right
    /// for reads and the only thing possible for replies not kept.
    Rerun,
}

/// The sending side of one connection.
struct Route {
    writer: tokio::sync::Mutex<WriteHalf>,
    peer: Nid,
    /// Set by a `cut` fault rule: this connection closes.
    cut: watch::Sender<bool>,
}

struct Early {
    export: Weak<Export>,
    xid: u64,
    opcode: u16,
    arrival_ms: u64,
}

/// A request waiting in the policy queue.
struct Queued {
    header: FrameHeader,
    body: Vec<u8>,
    bulk: Bulk,
    replayed: Option<Vec<u8>>,
    peer: Nid,
    job: String,
    export: Arc<Export>,
    arrival: Instant,
    early_key: Option<(u64, u64)>,
    _buffer: OwnedSemaphorePermit,
    _bulk_bytes: Option<OwnedSemaphorePermit>,
}

impl Classify for Queued {
    fn nid(&self) -> &Nid {
        &self.peer
    }
    fn job_id(&self) -> &str {
        &self.job
    }
    fn opcode(&self) -> u16 {
        self.header.opcode
    }
}

enum Queue {
    Fifo(VecDeque<Queued>),
    Tbf(Tbf<Queued>),
}

impl Queue {
    fn len(&self) -> usize {
        match self {
            Queue::Fifo(q) => q.len(),
            Queue::Tbf(t) => t.len(),
        }
    }

    /// Queue a request; gives it back if the queue is full (it cannot be: every queued
    /// request holds one of `req_buffers_max` buffers, the queue's capacity).
    fn push(&mut self, q: Queued, now_us: u64) -> Result<(), Box<Queued>> {
        match self {
            Queue::Fifo(f) => f.push_back(q),
            Queue::Tbf(t) if t.len() >= t.capacity() => return Err(Box::new(q)),
            Queue::Tbf(t) => {
                let _ = t.enqueue(q, now_us);
            }
        }
        Ok(())
    }

    fn drain(&mut self) -> Vec<Queued> {
        match self {
            Queue::Fifo(f) => f.drain(..).collect(),
            Queue::Tbf(t) => t.drain_all(),
        }
    }

    fn pop(&mut self, now_us: u64) -> Option<Queued> {
        match self {
            Queue::Fifo(f) => f.pop_front(),
            Queue::Tbf(t) => t.dequeue(now_us),
        }
    }

    fn next_ready_us(&mut self, now_us: u64) -> Option<u64> {
        match self {
            Queue::Fifo(f) => (!f.is_empty()).then_some(now_us),
            Queue::Tbf(t) => t.next_ready_us(now_us),
        }
    }
}

impl Server {
    /// Listen on `nid` (port 0 picks a free one) and serve every request with `handler`.
    pub async fn start(
        transport: Arc<dyn Transport>,
        nid: &Nid,
        handler: Handler,
        cfg: ServerConfig,
    ) -> Result<Server, RpcError> {
        Server::start_service(transport, nid, handler, cfg, Service::default()).await
    }

    /// [`Server::start`] for a service that replies before commit, in recovery if
    /// `service.recovering` names clients.
    pub async fn start_service(
        transport: Arc<dyn Transport>,
        nid: &Nid,
        handler: Handler,
        cfg: ServerConfig,
        service: Service,
    ) -> Result<Server, RpcError> {
        let mut listener = transport.listen(nid).await?;
        let now = Instant::now();
        let recovery = match (&service.commits, service.recovering) {
            (Some(_), Some(r)) if !r.clients.is_empty() => {
                eprintln!(
                    "nacre-net: {}: recovering: waiting up to {:?} for {} clients to replay past transno {}",
                    listener.nid(),
                    cfg.recovery_time_soft,
                    r.clients.len(),
                    r.last_committed
                );
                Some(Recovery::new(&r, 0, cfg.recovery_time_soft, cfg.recovery_time_hard))
            }
            _ => None,
        };
        let (stop, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            nid: listener.nid(),
            handler,
            evicted: tokio::sync::broadcast::channel(EVICTED_QUEUE).0,
            faults: service.faults.clone().unwrap_or_else(|| Arc::new(FaultInjector::new(fresh_seed()))),
            ni: CreditPool::new(cfg.credits),
            buffers: Arc::new(Semaphore::new(cfg.req_buffers_max.max(1))),
            bulk_bytes: Arc::new(Semaphore::new(bulk_budget(&cfg))),
            threads: Arc::new(Semaphore::new(cfg.threads_max.max(1))),
            // Keep enough free bulk buffers for the bulk budget, at most 256 MiB.
            pool: BulkPool::new(cfg.req_bulk_bytes_max.min(256 << 20)),
            exports: Mutex::new(HashMap::new()),
            dropped: Mutex::default(),
            next_cookie: AtomicU64::new(fresh_seed() | 1),
            queue: Mutex::new(Queue::Fifo(VecDeque::new())),
            queue_changed: Notify::new(),
            early: Mutex::new(BTreeMap::new()),
            early_seq: AtomicU64::new(0),
            service_at: Mutex::new(AtEstimate::new(cfg.at.at_history, 0)),
            cache_bytes: AtomicUsize::new(0),
            counters: Counters::default(),
            epoch: now,
            stop,
            commits: service.commits,
            quick: service.quick,
            waits: service.waits,
            at_once: service.at_once,
            target: service.target.map(|t| {
                let id = crate::rpc::target_id(&t);
                (t, id)
            }),
            recovering: std::sync::atomic::AtomicBool::new(recovery.is_some()),
            recovery: Mutex::new(recovery),
            recovered: Mutex::new(RecoveryStats::default()),
            window: Mutex::new((cfg.recovery_time_soft, cfg.recovery_time_hard)),
            cfg,
        });
        let mut tasks = JoinSet::new();
        let s = shared.clone();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                match listener.accept().await {
                    Ok(stream) if s.counters.connections.load(Ordering::Relaxed) >= s.cfg.connections_max => {
                        s.counters.refused.fetch_add(1, Ordering::Relaxed);
                        drop(stream);
                    }
                    Ok(mut stream) => {
                        let task = stream.read_task();
                        conns.spawn(task.run(s.clone().serve(stream)));
                    }
                    // Out of descriptors or memory: back off instead of spinning. Errors
                    // of one connection (a peer that reset at once) need no pause.
                    Err(e) if is_resource_error(&e) => tokio::time::sleep(Duration::from_millis(10)).await,
                    Err(_) => {}
                }
                // Reap finished connections so the set does not grow with churn.
                while conns.try_join_next().is_some() {}
            }
        });
        tasks.spawn(shared.clone().watchdog());
        tasks.spawn(shared.clone().timed_dispatch());
        Ok(Server { shared, _tasks: tasks })
    }

    pub fn nid(&self) -> Nid {
        self.shared.nid.clone()
    }

    /// Fault rules applied to everything this server sends.
    pub fn faults(&self) -> &Arc<FaultInjector> {
        &self.shared.faults
    }

    /// Switch the request policy; queued requests move to the new one.
    pub fn set_policy(&self, policy: Policy) {
        self.shared.set_policy(policy)
    }

    pub fn policy(&self) -> Policy {
        self.shared.policy()
    }

    /// Apply a TBF rule command (`start NAME nid={…} rate=N`, `change NAME rate=N`,
    /// `stop NAME`); it applies to queued requests too. The policy must be TBF.
    pub fn tbf_rule(&self, text: &str) -> Result<(), TbfError> {
        self.shared.tbf_rule(text)
    }

    /// Evict a client now (as `lctl evict_client`); false if it is not connected.
    pub fn evict(&self, client: u64) -> bool {
        self.shared.evict(client)
    }

    pub fn stats(&self) -> ServerStats {
        self.shared.stats()
    }

    /// A handle for the service this server runs: its statistics and policy, held weakly
    /// (the handler may keep it without keeping the server alive).
    pub fn handle(&self) -> ServerHandle {
        ServerHandle { shared: Arc::downgrade(&self.shared) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shared.stop.send(true);
    }
}

/// Poll `run` once on the calling task; if it must wait, it goes on in a task of its own.
/// `run` is boxed before anything awaits, so the caller's future (a connection's, alive
/// as long as the connection) holds a pointer to it, not the request's whole state.
fn run_or_spawn(run: impl std::future::Future<Output = ()> + Send + 'static) -> impl std::future::Future<Output = ()> {
    let mut run = Box::pin(run);
    async move {
        let done = std::future::poll_fn(|cx| std::task::Poll::Ready(run.as_mut().poll(cx).is_ready())).await;
        if !done {
            tokio::spawn(run);
        }
    }
}

/// A weak handle on a running server (see [`Server::handle`]); every call on a stopped
/// server answers `None` or an error.
#[derive(Clone)]
pub struct ServerHandle {
    shared: Weak<Shared>,
}

impl ServerHandle {
    /// The clients this server lets go from now on (evicted, disconnected, or replaced
    /// by a restarted incarnation), for services that keep state per client. `None` if
    /// the server has stopped.
    pub fn evictions(&self) -> Option<tokio::sync::broadcast::Receiver<u64>> {
        self.shared.upgrade().map(|s| s.evicted.subscribe())
    }

    pub fn stats(&self) -> Option<ServerStats> {
        self.shared.upgrade().map(|s| s.stats())
    }

    /// Is `client` connected (it has an export here)?
    pub fn connected(&self, client: u64) -> bool {
        self.shared.upgrade().is_some_and(|s| lock(&s.exports).contains_key(&client))
    }

    /// The connected clients and the NID each came from, by client.
    pub fn clients(&self) -> Vec<(u64, Nid)> {
        let Some(s) = self.shared.upgrade() else { return vec![] };
        let mut v: Vec<(u64, Nid)> = lock(&s.exports).values().map(|e| (e.client, e.peer.clone())).collect();
        v.sort_by_key(|(c, _)| *c);
        v
    }

    /// Evict a client now (as `lctl evict_client`); false if it is not connected.
    pub fn evict(&self, client: u64) -> bool {
        self.shared.upgrade().is_some_and(|s| s.evict(client))
    }

    pub fn policy(&self) -> Option<Policy> {
        self.shared.upgrade().map(|s| s.policy())
    }

    /// False if the server has stopped.
    pub fn set_policy(&self, policy: Policy) -> bool {
        self.shared.upgrade().map(|s| s.set_policy(policy)).is_some()
    }

    pub fn tbf_rule(&self, text: &str) -> Result<(), TbfError> {
        match self.shared.upgrade() {
            Some(s) => s.tbf_rule(text),
            None => Err(TbfError::Syntax("the server has stopped".into())),
        }
    }

    /// The TBF rules in force (none under FIFO).
    pub fn tbf_rules(&self) -> Vec<Rule> {
        self.shared.upgrade().map(|s| s.tbf_rules()).unwrap_or_default()
    }

    /// The recovery under way, or how the last one went.
    pub fn recovery(&self) -> Option<RecoveryStats> {
        self.shared.upgrade().map(|s| s.recovery_stats())
    }

    /// `recovery_time_soft` and `recovery_time_hard` of this server.
    pub fn recovery_window(&self) -> Option<(Duration, Duration)> {
        self.shared.upgrade().map(|s| *lock(&s.window))
    }

    /// Set `recovery_time_soft` and `recovery_time_hard` (each 1 s to 1 h, the soft one
    /// at most the hard one). A recovery under way takes them at once, counted from its
    /// start (see `Recovery::set_window`). Nothing changes on an error.
    pub fn set_recovery_window(&self, soft: Duration, hard: Duration) -> Result<(), String> {
        let range = Duration::from_secs(1)..=Duration::from_secs(3600);
        for (name, v) in [("recovery_time_soft", soft), ("recovery_time_hard", hard)] {
            if !range.contains(&v) {
                return Err(format!("{name} {} s: from 1 to 3600 s", v.as_secs_f64()));
            }
        }
        if soft > hard {
            return Err(format!(
                "recovery_time_soft {} s is past recovery_time_hard {} s",
                soft.as_secs_f64(),
                hard.as_secs_f64()
            ));
        }
        let Some(s) = self.shared.upgrade() else { return Err("the server has stopped".into()) };
        *lock(&s.window) = (soft, hard);
        if let Some(r) = lock(&s.recovery).as_mut() {
            r.set_window(soft, hard);
        }
        Ok(())
    }
}

impl Shared {
    /// Switch the request policy; queued requests move to the new one.
    fn set_policy(self: &Arc<Self>, policy: Policy) {
        let now = self.now_us();
        let mut q = lock(&self.queue);
        let old = q.drain();
        *q = match policy {
            Policy::Fifo => Queue::Fifo(VecDeque::new()),
            Policy::Tbf => Queue::Tbf(Tbf::new(self.cfg.req_buffers_max.max(1))),
        };
        let mut refused = Vec::new();
        for r in old {
            if let Err(r) = q.push(r, now) {
                refused.push(r);
            }
        }
        drop(q);
        for r in refused {
            self.abandon(r);
        }
        self.dispatch();
        self.queue_changed.notify_one();
    }

    fn policy(&self) -> Policy {
        match &*lock(&self.queue) {
            Queue::Fifo(_) => Policy::Fifo,
            Queue::Tbf(_) => Policy::Tbf,
        }
    }

    /// Apply a TBF rule command (`start NAME nid={…} rate=N`, `change NAME rate=N`,
    /// `stop NAME`); it applies to queued requests too. The policy must be TBF.
    fn tbf_rule(self: &Arc<Self>, text: &str) -> Result<(), TbfError> {
        let cmd: RuleCommand = text.parse()?;
        let now = self.now_us();
        {
            let mut q = lock(&self.queue);
            match &mut *q {
                Queue::Tbf(t) => t.command(cmd, now)?,
                Queue::Fifo(_) => {
                    return Err(TbfError::Syntax("the request policy is fifo; set it to tbf first".into()));
                }
            }
        }
        self.dispatch();
        self.queue_changed.notify_one();
        Ok(())
    }

    /// Evict a client now (as `lctl evict_client`); false if it is not connected.
    fn evict(&self, client: u64) -> bool {
        let export = lock(&self.exports).get(&client).cloned();
        match export {
            Some(e) => {
                self.drop_export(&e, "evicted by request");
                true
            }
            None => false,
        }
    }

    fn stats(&self) -> ServerStats {
        let s = self;
        let c = &s.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (exports, peer_min) = {
            let ex = lock(&s.exports);
            let min = ex.values().map(|e| e.credits.stats().min_available).min();
            (ex.len(), min.unwrap_or(s.cfg.peer_credits as i64))
        };
        let max = s.cfg.req_buffers_max.max(1);
        ServerStats {
            connections: c.connections.load(Ordering::Relaxed),
            exports,
            connects: get(&c.connects),
            requests: get(&c.requests),
            replies: get(&c.replies),
            pings: get(&c.pings),
            resends: get(&c.resends),
            replayed: get(&c.replayed),
            joined: get(&c.joined),
            stale: get(&c.stale),
            early_replies: get(&c.early_replies),
            evictions: get(&c.evictions),
            malformed: get(&c.malformed),
            refused: get(&c.refused),
            req_buffers_max: max,
            req_buffers_in_use: max - s.buffers.available_permits(),
            req_buffers_peak: c.buffers_peak.load(Ordering::Relaxed),
            req_bulk_bytes_peak: c.bulk_bytes_peak.load(Ordering::Relaxed),
            queued: lock(&s.queue).len(),
            reply_cache_bytes: s.cache_bytes.load(Ordering::Relaxed),
            credits: s.ni.stats(),
            peer_credits_min: peer_min,
            service_estimate: lock(&s.service_at).estimate(s.now_ms()),
            recovery: s.recovery_stats(),
        }
    }

    fn recovery_stats(&self) -> RecoveryStats {
        match &*lock(&self.recovery) {
            Some(r) => RecoveryStats {
                held: r.held.len(),
                duration_ms: self.now_ms().saturating_sub(r.started_ms),
                remaining_ms: r.deadline_ms.saturating_sub(self.now_ms()),
                ..r.stats
            },
            None => *lock(&self.recovered),
        }
    }

    fn tbf_rules(&self) -> Vec<Rule> {
        match &*lock(&self.queue) {
            Queue::Tbf(t) => t.rules().to_vec(),
            Queue::Fifo(_) => Vec::new(),
        }
    }
}

/// Why a connection ended, for the log.
enum End {
    Quiet,
    Malformed(String),
}

/// Out of descriptors (ENFILE, EMFILE), buffers (ENOBUFS) or memory (ENOMEM).
fn is_resource_error(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(23 | 24 | 105 | 12))
}

/// Longest a new connection may take to send its connect request.
const HANDSHAKE_WAIT_MAX: Duration = Duration::from_secs(20);

/// Bulk bytes requests may hold: the configured budget, and at least one largest bulk so
/// that any valid request can be taken.
fn bulk_budget(cfg: &ServerConfig) -> usize {
    cfg.req_bulk_bytes_max.max(cfg.limits.bulk_max.min(BULK_BYTES_LIMIT) as usize)
}

impl Shared {
    fn bulk_budget(&self) -> usize {
        bulk_budget(&self.cfg)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// One connection, from the handshake to its end.
    async fn serve(self: Arc<Self>, stream: Stream) {
        self.counters.connections.fetch_add(1, Ordering::Relaxed);
        let Stream { mut read, write, peer, .. } = stream;
        let (cut, _) = watch::channel(false);
        let route = Arc::new(Route { writer: tokio::sync::Mutex::new(write), peer: peer.clone(), cut });
        let (mut stop, mut cut) = (self.stop.subscribe(), route.cut.subscribe());
        let end = tokio::select! {
            end = self.clone().converse(&mut read, &route) => end,
            _ = stop.wait_for(|s| *s) => End::Quiet,
            _ = cut.wait_for(|c| *c) => End::Quiet,
        };
        if let End::Malformed(why) = end {
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            eprintln!("nacre-net: {}: closing connection from {peer}: {why}", self.nid);
        }
        if let Ok(mut w) = tokio::time::timeout(Duration::from_secs(1), route.writer.lock()).await {
            let _ = tokio::time::timeout(Duration::from_secs(1), tokio::io::AsyncWriteExt::shutdown(&mut *w)).await;
        }
        self.counters.connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// A new connection's first frame, which must be a connect: the client's export, made
    /// or found again, once the connect is answered.
    async fn handshake(&self, read: &mut crate::transport::ReadHalf, route: &Arc<Route>) -> Result<Arc<Export>, End> {
        let limits = self.cfg.limits;
        // The handshake must come soon, or the connection is not worth a task and a
        // descriptor.
        let wait = self.cfg.obd_timeout.min(HANDSHAKE_WAIT_MAX);
        let first = match tokio::time::timeout(wait, read_header(&mut **read, &limits)).await {
            Ok(Ok(Some(h))) => h,
            Ok(Ok(None)) | Err(_) => return Err(End::Quiet),
            Ok(Err(e)) => return Err(End::Malformed(e.to_string())),
        };
        if first.opcode != OP_CONNECT || first.flags & flags::REPLY != 0 {
            let why = format!("opcode {} before the connect handshake", first.opcode);
            self.refuse(route, &first, status::ENOTCONN, &why).await;
            return Err(End::Malformed(why));
        }
        // Nothing is allocated for a peer before it has connected but the connect itself.
        if first.bulk_len != 0 || first.body_len as usize != CONNECT_REQUEST_BYTES {
            let why = format!("connect request of {} + {} bytes", first.body_len, first.bulk_len);
            self.refuse(route, &first, status::EPROTO, &why).await;
            return Err(End::Malformed(why));
        }
        let frame = match tokio::time::timeout(wait, read_rest(&mut **read, first, &self.pool)).await {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(End::Malformed(e.to_string())),
            Err(_) => return Err(End::Malformed("connect request not finished in time".into())),
        };
        let req = match ConnectRequest::decode(&frame.body) {
            Ok(r) => r,
            Err(why) => {
                self.refuse(route, &first, status::EPROTO, &why).await;
                return Err(End::Malformed(why));
            }
        };
        if let Some((name, id)) = &self.target
            && req.target != 0
            && req.target != *id
        {
            let why = format!("{name} is served here, not the target this connect names");
            self.refuse(route, &first, status::ENODEV, &why).await;
            return Err(End::Quiet);
        }
        if let Some(why) = self.busy_recovering(req.client) {
            self.refuse(route, &first, status::EBUSY, &why).await;
            return Err(End::Quiet);
        }
        let (export, lost) = match self.attach(&req, &route.peer) {
            Ok(x) => x,
            Err(why) => {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                self.refuse(route, &first, status::EUSERS, &why).await;
                return Err(End::Quiet);
            }
        };
        let body = ConnectReply {
            cookie: export.cookie,
            export_lost: lost.is_some(),
            evicted: lost == Some(Lost::Evicted),
            obd_timeout_ms: self.cfg.obd_timeout.as_millis().min(u32::MAX as u128) as u32,
            recovering: self.reconnected(req.client),
        }
        .encode();
        self.reply_now(&export, route, &first, 0, &body).await;
        Ok(export)
    }

    async fn converse(self: Arc<Self>, read: &mut crate::transport::ReadHalf, route: &Arc<Route>) -> End {
        let limits = self.cfg.limits;
        // Boxed: what the handshake holds is not kept for the connection's life.
        let export = match Box::pin(self.handshake(read, route)).await {
            Ok(export) => export,
            Err(end) => return end,
        };
        let mut gone = export.gone.subscribe();
        loop {
            let h = tokio::select! {
                h = read_header(&mut **read, &limits) => h,
                _ = gone.wait_for(|g| *g) => return End::Quiet,
            };
            let h = match h {
                Ok(Some(h)) => h,
                Ok(None) => return End::Quiet,
                Err(RpcError::Frame(e)) => return End::Malformed(e.to_string()),
                Err(_) => return End::Quiet,
            };
            export.last_heard_ms.store(self.now_ms(), Ordering::Relaxed);
            if h.flags & (flags::REPLY | flags::EARLY) != 0 {
                return End::Malformed(format!("a reply (xid {}) where a request was expected", h.xid));
            }
            if h.opcode < FIRST_SERVICE_OPCODE {
                // Transport opcodes carry no bulk and small bodies: read them whole.
                if h.bulk_len != 0 {
                    return End::Malformed(format!("transport opcode {} with bulk", h.opcode));
                }
                if let Err(e) = read_rest(&mut **read, h, &self.pool).await {
                    return End::Malformed(e.to_string());
                }
                match h.opcode {
                    OP_PING => {
                        self.counters.pings.fetch_add(1, Ordering::Relaxed);
                        Box::pin(self.reply_now(&export, route, &h, 0, &[])).await;
                    }
                    OP_DISCONNECT => {
                        if let Some(c) = &self.commits {
                            Box::pin(c.forget(export.client)).await;
                        }
                        Box::pin(self.reply_now(&export, route, &h, 0, &[])).await;
                        self.drop_export(&export, "");
                        return End::Quiet;
                    }
                    OP_COMMIT => {
                        // Off the reading task: a commit takes a log write.
                        let (s, e, r) = (self.clone(), export.clone(), route.clone());
                        tokio::spawn(async move {
                            if let Some(c) = &s.commits {
                                c.commit().await;
                            }
                            s.reply_now(&e, &r, &h, 0, &[]).await;
                        });
                    }
                    OP_REPLAY_DONE => {
                        self.replay_done(export.client);
                        Box::pin(self.reply_now(&export, route, &h, 0, &[])).await;
                    }
                    op => {
                        let why = format!("transport opcode {op} is not known here");
                        Box::pin(self.refuse(route, &h, status::EPROTO, &why)).await;
                        return End::Malformed(why);
                    }
                }
                continue;
            }
            // Request buffers and bulk bytes: waiting here stops reading this socket.
            export.waiting.fetch_add(1, Ordering::Relaxed);
            let held = self.hold_buffers(&h).await;
            export.waiting.fetch_sub(1, Ordering::Relaxed);
            let Some((buffer, bulk_bytes)) = held else { return End::Quiet };
            let frame = match read_rest(&mut **read, h, &self.pool).await {
                Ok(f) => f,
                Err(RpcError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return End::Malformed(format!("stream ended inside request {} (opcode {})", h.xid, h.opcode));
                }
                Err(RpcError::Frame(e)) => return End::Malformed(e.to_string()),
                Err(_) => return End::Quiet,
            };
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            if h.flags & flags::RESEND != 0 {
                self.counters.resends.fetch_add(1, Ordering::Relaxed);
            }
            let (body, replayed) = if h.flags & flags::REPLAY != 0 {
                match self.check_replay(export.client, frame.body) {
                    Ok(r) => (r.body, Some(r.reply)),
                    Err((status, why)) => {
                        Box::pin(self.refuse(route, &h, status, &why)).await;
                        continue;
                    }
                }
            } else {
                (frame.body, None)
            };
            let arrival = Instant::now();
            match self.admit(&export, &h, route) {
                Admit::New => {}
                Admit::Joined => {
                    self.counters.joined.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Admit::Stale => {
                    self.counters.stale.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Admit::Cached(header, body) => {
                    self.counters.replayed.fetch_add(1, Ordering::Relaxed);
                    let route = route.clone();
                    Box::pin(self.send(&export, &route, &header, &body, &[])).await;
                    continue;
                }
            }
            let incoming = Incoming {
                header: h,
                body,
                bulk: frame.bulk,
                peer: route.peer.clone(),
                client: export.client,
                replayed,
            };
            let (Incoming { body, bulk, replayed, peer, .. }, slot) = match self.try_at_once(incoming) {
                Ok(reply) => {
                    Box::pin(self.answer(&export, h, arrival, reply)).await;
                    continue;
                }
                Err(back) => back,
            };
            let early_key = self.arm_early(&export, &h);
            let job = if h.job_id == 0 { String::new() } else { h.job_id.to_string() };
            let queued = Queued {
                header: h,
                body,
                bulk,
                replayed,
                peer,
                job,
                export: export.clone(),
                arrival,
                early_key,
                _buffer: buffer,
                _bulk_bytes: bulk_bytes,
            };
            let Some(queued) = self.hold_for_recovery(queued) else { continue };
            if self.waits.contains(&queued.header.opcode) && queued.replayed.is_none() {
                // Polled once here; if it must wait (a lock behind another), it goes on
                // in a task of its own.
                run_or_spawn(self.clone().run(queued, None)).await;
                continue;
            }
            if let Some(thread) = slot.or_else(|| self.slot_here(&queued)) {
                run_or_spawn(self.clone().run(queued, Some(thread))).await;
                continue;
            }
            let (timed, refused) = {
                let mut q = lock(&self.queue);
                let r = q.push(queued, self.now_us()).err();
                (matches!(*q, Queue::Tbf(_)), r)
            };
            if let Some(r) = refused {
                self.abandon(r);
            }
            self.dispatch();
            // Only a rate-limited queue needs the timer task; FIFO starts requests here and
            // as others finish.
            if timed {
                self.queue_changed.notify_one();
            }
        }
    }

    /// A request buffer and the bulk's bytes for a request whose header was read.
    async fn hold_buffers(&self, h: &FrameHeader) -> Option<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)> {
        let buffer = self.buffers.clone().acquire_owned().await.ok()?;
        let in_use = self.cfg.req_buffers_max.max(1) - self.buffers.available_permits();
        self.counters.buffers_peak.fetch_max(in_use, Ordering::Relaxed);
        if h.bulk_len == 0 {
            return Some((buffer, None));
        }
        let bytes = self.bulk_bytes.clone().acquire_many_owned(h.bulk_len).await.ok()?;
        let held = self.bulk_budget() - self.bulk_bytes.available_permits();
        self.counters.bulk_bytes_peak.fetch_max(held, Ordering::Relaxed);
        Some((buffer, Some(bytes)))
    }

    /// Find or make the export a connect names. A known client with the right cookie
    /// gets its export back (another connection, or a reconnect); any other cookie
    /// replaces it: the client restarted, or asks for an export that was evicted.
    /// The client's export (made if new), and how what it had is lost: `None` if not.
    fn attach(&self, req: &ConnectRequest, peer: &Nid) -> Result<(Arc<Export>, Option<Lost>), String> {
        let mut exports = lock(&self.exports);
        let lost = match exports.get(&req.client).cloned() {
            Some(e) if e.cookie == req.cookie => {
                e.last_heard_ms.store(self.now_ms(), Ordering::Relaxed);
                return Ok((e, None));
            }
            // An export of this server, not the one the client had: it was dropped.
            Some(old) => {
                exports.remove(&req.client);
                self.retire(&old);
                Some(Lost::Evicted)
            }
            None if exports.len() >= self.cfg.exports_max => {
                return Err(format!("{} clients connected, the most this server takes", exports.len()));
            }
            None => (req.cookie != 0)
                .then(|| if lock(&self.dropped).contains(req.client) { Lost::Evicted } else { Lost::Restarted }),
        };
        let (gone, _) = watch::channel(false);
        let e = Arc::new(Export {
            client: req.client,
            cookie: self.next_cookie.fetch_add(2, Ordering::Relaxed),
            peer: peer.clone(),
            credits: CreditPool::new(self.cfg.peer_credits),
            last_heard_ms: AtomicU64::new(self.now_ms()),
            slots: Mutex::new(Slots::default()),
            gone,
            waiting: AtomicUsize::new(0),
        });
        exports.insert(req.client, e.clone());
        self.counters.connects.fetch_add(1, Ordering::Relaxed);
        Ok((e, lost))
    }

    fn drop_export(&self, export: &Arc<Export>, why: &str) {
        let removed = {
            let mut exports = lock(&self.exports);
            match exports.get(&export.client) {
                Some(e) if Arc::ptr_eq(e, export) => exports.remove(&export.client).is_some(),
                _ => false,
            }
        };
        self.retire(export);
        if removed {
            lock(&self.dropped).add(export.client, self.cfg.exports_max);
            // Nobody listening is fine; a listener that lags learns it (and may resync).
            let _ = self.evicted.send(export.client);
        }
        if removed && !why.is_empty() {
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            eprintln!("nacre-net: {}: client {:016x} at {}: {why}", self.nid, export.client, export.peer);
        }
    }

    /// An export leaves: its connections close and its reply cache is given back.
    fn retire(&self, export: &Export) {
        let mut slots = lock(&export.slots);
        let _ = export.gone.send(true);
        let freed: usize = slots.map.values().map(cached_bytes).sum();
        self.cache_bytes.fetch_sub(freed, Ordering::Relaxed);
        slots.map.clear();
        slots.done = 0;
    }

    /// The reply cache's verdict on a request.
    fn admit(&self, export: &Export, h: &FrameHeader, route: &Arc<Route>) -> Admit {
        let mut s = lock(&export.slots);
        // Checked under the slots lock, which retiring takes too: nothing is admitted to
        // an export after its slots were cleared.
        if export.is_gone() {
            return Admit::Stale;
        }
        if h.acked_xid > s.acked {
            s.acked = h.acked_xid;
            self.prune(&mut s, export);
        }
        let acked = s.acked;
        match s.map.get_mut(&h.xid) {
            Some(Slot::Running { route: r }) => {
                *r = route.clone();
                return Admit::Joined;
            }
            Some(Slot::Done { header, body }) => return Admit::Cached(*header, body.clone()),
            Some(Slot::Rerun) => {
                s.done -= 1;
            }
            None if h.xid < acked => return Admit::Stale,
            None => {}
        }
        s.map.insert(h.xid, Slot::Running { route: route.clone() });
        Admit::New
    }

    /// Forget acknowledged replies, and the oldest beyond `reply_cache_max`.
    fn prune(&self, s: &mut Slots, _export: &Export) {
        let acked = s.acked;
        let mut freed = 0;
        // Only what is below `acked` is looked at: a long request still running (a
        // callback poll) holds `acked` at its xid, so the replies after it stay, and
        // walking the whole map for every request would cost more each time.
        let gone: Vec<u64> =
            s.map.range(..acked).filter(|(_, slot)| !matches!(slot, Slot::Running { .. })).map(|(&x, _)| x).collect();
        for xid in gone {
            if let Some(slot) = s.map.remove(&xid) {
                freed += cached_bytes(&slot);
                s.done -= 1;
            }
        }
        while s.done > self.cfg.reply_cache_max {
            let oldest = s.map.iter().find(|(_, v)| !matches!(v, Slot::Running { .. })).map(|(k, _)| *k);
            let Some(k) = oldest else { break };
            if let Some(slot) = s.map.remove(&k) {
                freed += cached_bytes(&slot);
            }
            s.done -= 1;
        }
        self.cache_bytes.fetch_sub(freed, Ordering::Relaxed);
    }

    /// Forget a request that will not run: its slot (a resend runs it anew) and its early
    /// reply.
    fn abandon(&self, q: Box<Queued>) {
        if let Some(k) = q.early_key {
            lock(&self.early).remove(&k);
        }
        let mut s = lock(&q.export.slots);
        if matches!(s.map.get(&q.header.xid), Some(Slot::Running { .. })) {
            s.map.remove(&q.header.xid);
        }
        eprintln!("nacre-net: {}: request {} of {} dropped: queue full", self.nid, q.header.xid, q.peer);
    }

    /// Schedule the early reply of a request whose client will wait `timeout_ms`.
    fn arm_early(&self, export: &Arc<Export>, h: &FrameHeader) -> Option<(u64, u64)> {
        if h.timeout_ms == 0 || self.cfg.at_extra.is_zero() {
            return None;
        }
        let now = self.now_ms();
        let t = h.timeout_ms as u64;
        let margin = self.cfg.at_early_margin.as_millis() as u64;
        let key = (now + t.saturating_sub(margin).max(t / 2), self.early_seq.fetch_add(1, Ordering::Relaxed));
        let entry = Early { export: Arc::downgrade(export), xid: h.xid, opcode: h.opcode, arrival_ms: now };
        lock(&self.early).insert(key, entry);
        Some(key)
    }

    /// Start what the policy lets start, while service slots are free.
    fn dispatch(self: &Arc<Self>) {
        loop {
            let Ok(thread) = self.threads.clone().try_acquire_owned() else { return };
            let next = lock(&self.queue).pop(self.now_us());
            let Some(q) = next else { return };
            tokio::spawn(self.clone().run(q, Some(thread)));
        }
    }

    /// A service slot to run `q`, of a quick opcode (`Service::quick`), on the calling
    /// connection task, when nothing waits before it (the policy queue is FIFO and empty)
    /// and a slot is free; it is polled once there, and should it wait after all, it goes
    /// on in a task of its own. `None`: queue it.
    fn slot_here(&self, q: &Queued) -> Option<OwnedSemaphorePermit> {
        if !self.quick.contains(&q.header.opcode) || q.replayed.is_some() {
            return None;
        }
        self.free_slot()
    }

    /// A service slot, if nothing waits for one (the policy queue is FIFO and empty).
    fn free_slot(&self) -> Option<OwnedSemaphorePermit> {
        let queue = lock(&self.queue);
        if !matches!(&*queue, Queue::Fifo(f) if f.is_empty()) {
            return None;
        }
        self.threads.clone().try_acquire_owned().ok()
    }

    /// The service's answer at once ([`Service::at_once`]) to a request it may give one
    /// for: of a `waits` opcode, or of a `quick` one when it could take a service slot
    /// here (which it holds meanwhile). Otherwise the request back, with the slot it took
    /// (the one [`Shared::slot_here`] would give it, so a change the service gives back
    /// does not take the queue's lock twice).
    // The request comes back by value: boxing it would cost the allocation this path is
    // there to save.
    #[allow(clippy::result_large_err)]
    fn try_at_once(self: &Arc<Self>, req: Incoming) -> Result<Reply, (Incoming, Option<OwnedSemaphorePermit>)> {
        let Some(at_once) = &self.at_once else { return Err((req, None)) };
        if req.replayed.is_some() || self.recovering.load(Ordering::Acquire) {
            return Err((req, None));
        }
        let op = req.header.opcode;
        let slot = if self.waits.contains(&op) {
            None
        } else if self.quick.contains(&op) {
            match self.free_slot() {
                Some(slot) => Some(slot),
                None => return Err((req, None)),
            }
        } else {
            return Err((req, None));
        };
        match at_once(req) {
            Ok(reply) => {
                if slot.is_some() {
                    drop(slot);
                    // Requests queued meanwhile on other connections.
                    self.dispatch();
                }
                Ok(reply)
            }
            Err(req) => Err((req, slot)),
        }
    }

    /// Send a reply given at once ([`Shared::try_at_once`]): cached for resends first,
    /// as every reply.
    async fn answer(&self, export: &Export, h: FrameHeader, arrival: Instant, mut reply: Reply) {
        let header = self.reply_header(&h, &mut reply, arrival);
        let body = Arc::new(reply.body);
        if let Some(route) = self.complete(export, &header, &body, reply.bulk.is_empty()) {
            self.send(export, &route, &header, &body, &reply.bulk).await;
            self.counters.replies.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Wake when a rate-limited request may start.
    async fn timed_dispatch(self: Arc<Self>) {
        loop {
            let now = self.now_us();
            let next = lock(&self.queue).next_ready_us(now);
            match next {
                Some(t) if t <= now => {
                    self.dispatch();
                    // Busy threads will dispatch as they finish; wait for a change.
                    tokio::select! {
                        _ = self.queue_changed.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
                Some(t) => {
                    tokio::select! {
                        _ = self.queue_changed.notified() => {}
                        _ = tokio::time::sleep(Duration::from_micros(t - now)) => {}
                    }
                    self.dispatch();
                }
                None => self.queue_changed.notified().await,
            }
        }
    }

    /// Run one request and send its reply.
    /// Replays run without a service slot: they run one at a time, and must not wait
    /// behind requests that wait for them.
    async fn run(self: Arc<Self>, q: Queued, thread: Option<OwnedSemaphorePermit>) {
        let Queued { header: h, body, bulk, replayed, peer, export, arrival, early_key, _buffer, _bulk_bytes, .. } = q;
        let replay = replayed.is_some();
        let mut guard = Finish { shared: &self, export: &export, xid: h.xid, early_key, done: false, thread, replay };
        let incoming = Incoming { header: h, body, bulk, peer, client: export.client, replayed };
        let mut reply = (self.handler)(incoming).await;
        let header = self.reply_header(&h, &mut reply, arrival);
        if replay {
            self.replayed(h.transno, &reply);
        }
        let body = Arc::new(reply.body);
        let route = self.complete(&export, &header, &body, reply.bulk.is_empty());
        guard.done = true;
        // The service slot goes to the next request now, not after a slow client read
        // its reply.
        guard.release_thread();
        if let Some(route) = route {
            self.send(&export, &route, &header, &body, &reply.bulk).await;
            self.counters.replies.fetch_add(1, Ordering::Relaxed);
        }
        drop(guard);
        drop(_buffer);
        drop(_bulk_bytes);
    }

    /// The header of the reply `reply` to `h`, which arrived at `arrival`: a reply too
    /// large for the frame limits becomes EOVERFLOW, and the service time is learnt.
    fn reply_header(&self, h: &FrameHeader, reply: &mut Reply, arrival: Instant) -> FrameHeader {
        let (body_max, bulk_max) = (
            self.cfg.limits.body_max.min(BODY_BYTES_LIMIT) as usize,
            self.cfg.limits.bulk_max.min(BULK_BYTES_LIMIT) as usize,
        );
        if reply.body.len() > body_max || reply.bulk.len() > bulk_max {
            eprintln!(
                "nacre-net: {}: reply to opcode {} too large ({} + {} bytes), sent as EOVERFLOW",
                self.nid,
                h.opcode,
                reply.body.len(),
                reply.bulk.len()
            );
            *reply = Reply { status: status::EOVERFLOW, ..Reply::default() };
        }
        let service = arrival.elapsed();
        let estimate = {
            let mut at = lock(&self.service_at);
            at.observe(self.now_ms(), service);
            at.estimate(self.now_ms())
        };
        let header = FrameHeader {
            timeout_ms: estimate.as_millis().min(u32::MAX as u128) as u32,
            service_us: service.as_micros().min(u32::MAX as u128) as u32,
            // Without commits to follow, a client could never let go of what it kept.
            transno: if self.commits.is_some() { reply.transno } else { 0 },
            ..FrameHeader::reply(h.opcode, h.xid, reply.status, reply.body.len(), reply.bulk.len())
        };
        let header = match (reply.open_state && reply.status == 0, header.transno) {
            (false, _) => header,
            (true, 0) if self.commits.is_some() && reply.after != 0 => {
                FrameHeader { flags: header.flags | flags::OPEN_STATE | flags::AFTER, transno: reply.after, ..header }
            }
            (true, _) => FrameHeader { flags: header.flags | flags::OPEN_STATE, ..header },
        };
        if reply.leased { FrameHeader { flags: header.flags | flags::LEASED, ..header } } else { header }
    }

    /// Record a finished request in the reply cache; returns where its reply goes.
    fn complete(
        &self,
        export: &Export,
        header: &FrameHeader,
        body: &Arc<Vec<u8>>,
        cacheable: bool,
    ) -> Option<Arc<Route>> {
        let mut s = lock(&export.slots);
        if export.is_gone() {
            return None;
        }
        let slot = s.map.get_mut(&header.xid)?;
        let Slot::Running { route } = slot else { return None };
        let route = route.clone();
        let bytes = body.len() + crate::frame::HEADER_BYTES;
        let fits = self.cache_bytes.load(Ordering::Relaxed) + bytes <= self.cfg.reply_cache_bytes_max;
        *slot = if cacheable && fits {
            self.cache_bytes.fetch_add(bytes, Ordering::Relaxed);
            Slot::Done { header: *header, body: body.clone() }
        } else {
            Slot::Rerun
        };
        s.done += 1;
        if s.done > self.cfg.reply_cache_max {
            self.prune(&mut s, export);
        }
        Some(route)
    }

    /// Answer a transport request (connect, ping) on its own connection, uncached.
    async fn reply_now(&self, export: &Export, route: &Arc<Route>, h: &FrameHeader, status: i32, body: &[u8]) {
        let header = FrameHeader {
            timeout_ms: lock(&self.service_at).estimate(self.now_ms()).as_millis() as u32,
            ..FrameHeader::reply(h.opcode, h.xid, status, body.len(), 0)
        };
        self.send(export, route, &header, body, &[]).await;
    }

    /// Refuse a connection with a status and the reason, before it has an export.
    async fn refuse(&self, route: &Route, h: &FrameHeader, status: i32, why: &str) {
        let header = FrameHeader::reply(h.opcode, h.xid, status, why.len(), 0);
        let mut w = route.writer.lock().await;
        let _ = write_frame(&mut *w, &header, why.as_bytes(), &[]).await;
    }

    /// Put one frame on the wire under credits, through the fault rules. A write that does
    /// not finish within `obd_timeout` (a client that stopped reading) cuts the
    /// connection; so does a failed one. Either way the client's resend gets the reply
    /// from the cache over a new connection.
    async fn send(&self, export: &Export, route: &Route, header: &FrameHeader, body: &[u8], bulk: &[u8]) {
        let header =
            &FrameHeader { last_committed: self.commits.as_ref().map_or(0, |c| c.last_committed()), ..*header };
        let Some(copies) = fault::copies(self.faults.decide(&self.nid, &route.peer, header.opcode)).await else {
            let _ = route.cut.send(true);
            return;
        };
        let (mut cut, mut gone) = (route.cut.subscribe(), export.gone.subscribe());
        let write = crate::inline::unlocked(async {
            let _credits = acquire_send(&export.credits, &self.ni).await;
            let mut w = route.writer.lock().await;
            for _ in 0..copies {
                write_frame(&mut *w, header, body, bulk).await?;
            }
            Ok::<(), std::io::Error>(())
        });
        tokio::select! {
            r = tokio::time::timeout(self.cfg.obd_timeout, write) => {
                if !matches!(r, Ok(Ok(()))) {
                    let _ = route.cut.send(true);
                }
            }
            _ = cut.wait_for(|c| *c) => {}
            _ = gone.wait_for(|g| *g) => {}
        }
    }

    /// Early replies and evictions.
    async fn watchdog(self: Arc<Self>) {
        let evict_after = self.cfg.obd_timeout.as_millis() as u64 * 3 / 2;
        // Often enough for both early replies and evictions to be on time within 1/8.
        let tick = (self.cfg.at_early_margin / 4)
            .min(Duration::from_millis(evict_after / 8))
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut last_scan = 0;
        loop {
            tokio::time::sleep(tick).await;
            let now = self.now_ms();
            self.send_early_replies(now);
            self.close_recovery_window(now);
            if now.saturating_sub(last_scan) >= (evict_after / 8).clamp(10, 1000) {
                last_scan = now;
                let silent: Vec<Arc<Export>> = lock(&self.exports)
                    .values()
                    .filter(|e| now.saturating_sub(e.last_heard_ms.load(Ordering::Relaxed)) > evict_after)
                    .cloned()
                    .collect();
                let silent: Vec<Arc<Export>> = silent.into_iter().filter(|e| !e.busy()).collect();
                for e in silent {
                    let secs = now.saturating_sub(e.last_heard_ms.load(Ordering::Relaxed)) as f64 / 1000.0;
                    self.drop_export(&e, &format!("evicted, silent for {secs:.1} s"));
                }
            }
        }
    }

    fn send_early_replies(self: &Arc<Self>, now: u64) {
        let due: Vec<Early> = {
            let mut early = lock(&self.early);
            let later = early.split_off(&(now + 1, 0));
            std::mem::replace(&mut *early, later).into_values().collect()
        };
        let extra = self.cfg.at_extra.as_millis() as u64;
        let margin = self.cfg.at_early_margin.as_millis() as u64;
        let at_max = self.cfg.at.at_max.as_millis() as u64;
        for e in due {
            let Some(export) = e.export.upgrade() else { continue };
            let route = match lock(&export.slots).map.get(&e.xid) {
                Some(Slot::Running { route }) => route.clone(),
                _ => continue,
            };
            if now.saturating_sub(e.arrival_ms) + extra > at_max {
                // Past at_max the client may give up and resend; the resend joins.
                continue;
            }
            let header = FrameHeader {
                flags: flags::REPLY | flags::EARLY,
                timeout_ms: extra.min(u32::MAX as u64) as u32,
                ..FrameHeader::reply(e.opcode, e.xid, 0, 0, 0)
            };
            let key =
                (now + extra.saturating_sub(margin).max(extra / 2), self.early_seq.fetch_add(1, Ordering::Relaxed));
            lock(&self.early).insert(key, e);
            self.counters.early_replies.fetch_add(1, Ordering::Relaxed);
            let s = self.clone();
            tokio::spawn(async move { s.send(&export, &route, &header, &[], &[]).await });
        }
    }
}

/// Recovery after a restart (see [`crate::recovery`]).
impl Shared {
    /// Why a connect from `client` must wait: the server is recovering and the client is
    /// not one it waits for.
    fn busy_recovering(&self, client: u64) -> Option<String> {
        if !self.recovering.load(Ordering::Acquire) {
            return None;
        }
        let rec = lock(&self.recovery);
        let r = rec.as_ref()?;
        if r.clients.contains_key(&client) {
            return None;
        }
        let back = r.clients.values().filter(|s| **s != Stand::Absent).count();
        Some(format!(
            "recovering after a restart: {back} of {} clients back, the window closes in {:.1} s; try again",
            r.clients.len(),
            r.deadline_ms.saturating_sub(self.now_ms()) as f64 / 1000.0
        ))
    }

    /// `client` reconnected: must it replay?
    fn reconnected(&self, client: u64) -> bool {
        let now = self.now_ms();
        self.recovering.load(Ordering::Acquire)
            && lock(&self.recovery).as_mut().is_some_and(|r| r.reconnect(client, now))
    }

    /// A replay's envelope, if the server takes replays from `client` now.
    fn check_replay(&self, client: u64, body: Vec<u8>) -> Result<Replay, (i32, String)> {
        let replaying = lock(&self.recovery).as_ref().is_some_and(|r| r.is_replaying(client));
        if !replaying {
            return Err((status::ESTALE, format!("client {client:016x} replays, but no recovery waits for it")));
        }
        Replay::decode(body).map_err(|why| (status::EPROTO, why))
    }

    /// While recovering, a replay waits for its turn and anything else for the end;
    /// `Some`: the request goes to the policy queue now.
    fn hold_for_recovery(self: &Arc<Self>, q: Queued) -> Option<Queued> {
        if !self.recovering.load(Ordering::Acquire) {
            return Some(q);
        }
        {
            let mut rec = lock(&self.recovery);
            let Some(r) = rec.as_mut() else { return Some(q) };
            if q.replayed.is_some() {
                let open = q.header.flags & flags::OPEN_STATE != 0;
                r.queue.insert(Turn { transno: q.header.transno, open, client: q.export.client, xid: q.header.xid }, q);
            } else {
                r.held.push_back(q);
                return None;
            }
        }
        self.next_replays();
        None
    }

    /// A replay ended with `reply`.
    fn replayed(&self, transno: u64, reply: &Reply) {
        let mut rec = lock(&self.recovery);
        let Some(r) = rec.as_mut() else { return };
        r.stats.replayed += 1;
        if reply.status != 0 {
            r.stats.replay_failed += 1;
            eprintln!(
                "nacre-net: {}: replay of transno {transno} failed ({}): {}",
                self.nid,
                reply.status,
                String::from_utf8_lossy(&reply.body)
            );
        }
    }

    /// The replay running ended: start the next.
    fn next_replay(self: &Arc<Self>) {
        if let Some(r) = lock(&self.recovery).as_mut() {
            r.running = false;
        }
        self.next_replays();
    }

    fn replay_done(self: &Arc<Self>, client: u64) {
        if let Some(r) = lock(&self.recovery).as_mut() {
            r.done(client);
        }
        self.next_replays();
    }

    /// Start the next replay if it may run, or end recovery if all is done.
    fn next_replays(self: &Arc<Self>) {
        let next = {
            let mut rec = lock(&self.recovery);
            let Some(r) = rec.as_mut() else { return };
            if r.finished() {
                let r = rec.take();
                self.recovering.store(false, Ordering::Release);
                drop(rec);
                if let Some(r) = r {
                    self.end_recovery(r);
                }
                return;
            }
            r.next_ready()
        };
        if let Some(q) = next {
            tokio::spawn(self.clone().run(q, None));
        }
    }

    /// Recovery is over: what it held goes to the policy queue.
    fn end_recovery(self: &Arc<Self>, r: Recovery<Queued>) {
        let now = self.now_ms();
        let stats =
            RecoveryStats { recovering: false, held: 0, duration_ms: now - r.started_ms, remaining_ms: 0, ..r.stats };
        eprintln!(
            "nacre-net: {}: recovery over in {:.1} s: {} of {} clients back, {} evicted, {} replays ({} failed), {} held requests let in",
            self.nid,
            stats.duration_ms as f64 / 1000.0,
            stats.completed,
            stats.clients,
            stats.evicted,
            stats.replayed,
            stats.replay_failed,
            r.held.len()
        );
        *lock(&self.recovered) = stats;
        if let Some(c) = &self.commits {
            c.recovered();
        }
        let refused: Vec<Box<Queued>> = {
            let mut q = lock(&self.queue);
            let now_us = self.now_us();
            r.held.into_iter().filter_map(|h| q.push(h, now_us).err()).collect()
        };
        for q in refused {
            self.abandon(q);
        }
        self.dispatch();
        self.queue_changed.notify_one();
    }

    /// The window closed: evict who is not done, drop their replays, go on.
    fn close_recovery_window(self: &Arc<Self>, now: u64) {
        if !self.recovering.load(Ordering::Acquire) {
            return;
        }
        let (late, dropped) = {
            let mut rec = lock(&self.recovery);
            match rec.as_mut() {
                Some(r) if now >= r.deadline_ms => r.close(now),
                _ => return,
            }
        };
        for q in dropped {
            if let Some(k) = q.early_key {
                lock(&self.early).remove(&k);
            }
        }
        for client in late {
            let export = lock(&self.exports).get(&client).cloned();
            match export {
                Some(e) => self.drop_export(&e, "evicted: not done replaying at recovery_time_hard"),
                None => {
                    self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                    let _ = self.evicted.send(client);
                    eprintln!(
                        "nacre-net: {}: client {client:016x} evicted: not back when the recovery window closed",
                        self.nid
                    );
                }
            }
        }
        self.next_replays();
    }
}

enum Admit {
    New,
    Joined,
    Stale,
    Cached(FrameHeader, Arc<Vec<u8>>),
}

fn cached_bytes(slot: &Slot) -> usize {
    match slot {
        Slot::Done { body, .. } => body.len() + crate::frame::HEADER_BYTES,
        _ => 0,
    }
}

/// Ends a request however its handler ends (a panic included): the early reply is
/// disarmed, an unfinished slot is forgotten (a resend runs it again), the service slot
/// is released and the queue is served.
struct Finish<'a> {
    shared: &'a Arc<Shared>,
    export: &'a Export,
    xid: u64,
    early_key: Option<(u64, u64)>,
    done: bool,
    thread: Option<OwnedSemaphorePermit>,
    /// A replay: the next may start once this one ends.
    replay: bool,
}

impl Finish<'_> {
    /// Give the service slot back and start what waits for one.
    fn release_thread(&mut self) {
        if self.thread.take().is_some() {
            self.shared.dispatch();
        }
    }
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.early_key {
            lock(&self.shared.early).remove(&k);
        }
        if !self.done {
            lock(&self.export.slots).map.remove(&self.xid);
        }
        self.release_thread();
        if self.replay {
            self.shared.next_replay();
        }
    }
}

/// How a client's export was lost, as a connect finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lost {
    /// This server dropped it.
    Evicted,
    /// This server never had it: it restarted (or the target moved) since.
    Restarted,
}

/// Clients whose exports this server dropped, oldest first, bounded.
#[derive(Default)]
struct Dropped {
    order: VecDeque<u64>,
    set: std::collections::HashSet<u64>,
}

impl Dropped {
    fn add(&mut self, client: u64, max: usize) {
        if self.set.insert(client) {
            self.order.push_back(client);
        }
        while self.order.len() > max.max(1) {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    fn contains(&self, client: u64) -> bool {
        self.set.contains(&client)
    }
}
