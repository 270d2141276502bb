//! Replies before commit and recovery, end to end over the in-memory network, with a
//! toy service whose state is a list of changes: each change gets a transno, a commit
//! makes a prefix durable, and a crash keeps only that prefix. After a restart the
//! clients' replays must rebuild exactly the list they were answered, in transno order
//! over all clients; a client that does not come back is evicted and the others finish;
//! new requests wait for the end; a client's replay list stays bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nacre_net::at::AtConfig;
use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::nid::Nid;
use nacre_net::rpc::RpcError;
use nacre_net::server::{Commits, Handler, Recovering, Reply, Server, ServerConfig, Service};
use nacre_net::transport::{BoxFuture, MemNetwork};

const OP_PUT: u16 = 30;
const OP_LIST: u16 = 31;

/// The service's state: the changes in transno order, the answers kept per request (as
/// a metadata server keeps reply records), and how far it is durable.
#[derive(Default)]
struct State {
    /// (transno, value).
    changes: Vec<(u64, Vec<u8>)>,
    /// (client, xid) → transno, for every change.
    answers: HashMap<(u64, u64), u64>,
    last: u64,
    committed: u64,
}

#[derive(Default, Clone)]
struct Toy(Arc<Mutex<State>>);

impl Toy {
    /// The crash: what was not committed is gone.
    fn crash(&self) {
        let mut s = self.0.lock().unwrap();
        let c = s.committed;
        s.changes.retain(|(t, _)| *t <= c);
        s.answers.retain(|_, t| *t <= c);
        s.last = c;
    }

    fn values(&self) -> Vec<Vec<u8>> {
        self.0.lock().unwrap().changes.iter().map(|(_, v)| v.clone()).collect()
    }

    fn clients(&self) -> Vec<u64> {
        let mut c: Vec<u64> = self.0.lock().unwrap().answers.keys().map(|k| k.0).collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    fn handler(&self) -> Handler {
        let toy = self.clone();
        Arc::new(move |req| {
            let toy = toy.clone();
            Box::pin(async move {
                let mut s = toy.0.lock().unwrap();
                if req.header.opcode == OP_LIST {
                    let n = s.changes.len() as u64;
                    return Reply { body: n.to_le_bytes().to_vec(), ..Reply::default() };
                }
                if let Some(&t) = s.answers.get(&(req.client, req.header.xid)) {
                    // Its answer is kept: it already ran.
                    return Reply { transno: t, ..Reply::default() };
                }
                if req.replayed.is_some() {
                    assert!(req.header.transno > s.committed, "a committed change is answered from its record");
                }
                s.last += 1;
                let t = s.last;
                s.changes.push((t, req.body.clone()));
                s.answers.insert((req.client, req.header.xid), t);
                Reply { transno: t, ..Reply::default() }
            })
        })
    }
}

impl Commits for Toy {
    fn last_committed(&self) -> u64 {
        self.0.lock().unwrap().committed
    }

    fn commit(&self) -> BoxFuture<'static, u64> {
        let s = self.0.clone();
        Box::pin(async move {
            let mut s = s.lock().unwrap();
            s.committed = s.last;
            s.committed
        })
    }
}

fn nid() -> Nid {
    "mds0@mem".parse().unwrap()
}

fn server_cfg(soft_ms: u64) -> ServerConfig {
    ServerConfig {
        at: AtConfig { at_min: Duration::from_millis(200), ..AtConfig::default() },
        at_extra: Duration::from_millis(300),
        at_early_margin: Duration::from_millis(100),
        recovery_time_soft: Duration::from_millis(soft_ms),
        recovery_time_hard: Duration::from_millis(soft_ms * 3),
        ..ServerConfig::default()
    }
}

fn client_cfg() -> ClientConfig {
    ClientConfig {
        at: AtConfig { at_min: Duration::from_millis(200), ..AtConfig::default() },
        ping: false,
        max_resends: 20,
        ..ClientConfig::default()
    }
}

async fn start(net: &MemNetwork, toy: &Toy, recovering: bool, soft_ms: u64) -> Server {
    start_at(net, toy, recovering, soft_ms, &nid()).await
}

async fn start_at(net: &MemNetwork, toy: &Toy, recovering: bool, soft_ms: u64, at: &Nid) -> Server {
    start_named(net, toy, recovering, soft_ms, at, TOY).await
}

/// The name the toy service answers connects for.
const TOY: &str = "toy";

async fn start_named(net: &MemNetwork, toy: &Toy, recovering: bool, soft_ms: u64, at: &Nid, name: &str) -> Server {
    let service = Service {
        commits: Some(Arc::new(toy.clone())),
        recovering: recovering
            .then(|| Recovering { clients: toy.clients(), last_committed: toy.0.lock().unwrap().committed }),
        // Listing reads memory: served on the connection's task.
        quick: vec![OP_LIST],
        target: Some(name.to_string()),
        ..Service::default()
    };
    // The stopped server's listener goes when its task is next polled.
    for _ in 0..100 {
        let t = Arc::new(net.transport(&at.to_string()));
        match Server::start_service(t, at, toy.handler(), server_cfg(soft_ms), service.clone()).await {
            Ok(s) => return s,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    panic!("the stopped server still listens");
}

/// Stop a server as a crash does: it serves nothing more. Dropping it only asks its tasks
/// to stop; a connection task that has already read a request could still apply and
/// answer it, so wait until the last of them has ended.
async fn crash(server: Server) {
    let handle = server.handle();
    drop(server);
    for _ in 0..500 {
        if handle.stats().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the stopped server still runs after 5 s");
}

async fn put(i: &Import, v: &str) -> u64 {
    i.call(OP_PUT, v.as_bytes(), &[]).await.unwrap().header.transno
}

async fn connect(net: &MemNetwork, name: &str) -> Arc<Import> {
    Client::new(Arc::new(net.transport(name)), client_cfg()).connect(&nid()).await.unwrap()
}

fn strs(v: Vec<Vec<u8>>) -> Vec<String> {
    v.into_iter().map(|b| String::from_utf8(b).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_rebuild_every_answered_change_in_transno_order() {
    let net = MemNetwork::new();
    let toy = Toy::default();
    let server = start(&net, &toy, false, 5_000).await;
    let (a, b) = (connect(&net, "a").await, connect(&net, "b").await);
    // Committed (a metadata server commits each client's first change before its
    // reply: that is how it knows whom to wait for after a restart).
    put(&a, "a1").await;
    put(&b, "b0").await;
    a.commit().await.unwrap();
    assert_eq!(a.uncommitted(), 0, "a commit empties the replay list");
    // Interleaved, answered, not committed.
    for v in ["b1", "a2", "b2", "a3"] {
        put(if v.starts_with('a') { &a } else { &b }, v).await;
    }
    assert_eq!((a.uncommitted(), b.uncommitted()), (2, 2));
    let answered = toy.values();
    crash(server).await;
    toy.crash();
    assert_eq!(strs(toy.values()), ["a1", "b0"]);
    let server = start(&net, &toy, true, 5_000).await;
    assert!(server.stats().recovery.recovering);
    // Each client's next call reconnects, replays, and then runs (after recovery).
    let (ra, rb) = tokio::join!(put(&a, "a4"), put(&b, "b3"));
    assert!(ra > 0 && rb > 0);
    let after = strs(toy.values());
    assert_eq!(after[..6], strs(answered)[..], "the replays rebuilt what was answered, in order");
    assert_eq!(after.len(), 8);
    let r = server.stats().recovery;
    assert!(!r.recovering);
    assert_eq!((r.clients, r.completed, r.evicted, r.replayed, r.replay_failed), (2, 2, 0, 4, 0));
    assert_eq!((a.stats().replays, b.stats().replays), (2, 2));
}

/// A server that restarts at another address (a new port, the partner node): the
/// client's import follows it (`retarget`, as the mount does when the MGS says the
/// target moved) with what it kept, replays there, and a request sent while the server
/// was down is answered there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_follows_its_server_to_a_new_address_and_replays_there() {
    let net = MemNetwork::new();
    let toy = Toy::default();
    let server = start(&net, &toy, false, 5_000).await;
    let a = connect(&net, "a").await;
    put(&a, "a1").await;
    a.commit().await.unwrap();
    for v in ["a2", "a3"] {
        put(&a, v).await;
    }
    assert_eq!(a.uncommitted(), 2);
    crash(server).await;
    toy.crash();
    let in_flight = {
        let a = a.clone();
        tokio::spawn(async move { put(&a, "a4").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let moved: Nid = "mds1@mem".parse().unwrap();
    let server = start_at(&net, &toy, true, 5_000, &moved).await;
    a.retarget(&moved);
    assert_eq!(a.target(), moved);
    assert!(in_flight.await.unwrap() > 0);
    assert_eq!(strs(toy.values()), ["a1", "a2", "a3", "a4"]);
    let r = server.stats().recovery;
    assert_eq!((r.clients, r.completed, r.evicted, r.replayed), (1, 1, 0, 2));
    // Following it again to where it already is changes nothing.
    a.retarget(&moved);
    put(&a, "a5").await;
    assert_eq!(a.stats().replays, 2);
}

/// An idle client (nothing to send) whose server moves: its pinger reconnects and
/// replays at once, so the server recovering there, which waits for every client from
/// before, is not held up for a ping interval (25 s by default). This is what a
/// failover's pause hung on when the mount had nothing to send to a moved OST while a
/// create waited for that OST's precreates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_import_reconnects_and_replays_as_soon_as_its_server_moves() {
    let net = MemNetwork::new();
    let toy = Toy::default();
    let server = start(&net, &toy, false, 5_000).await;
    let cfg = ClientConfig { ping: true, obd_timeout: Duration::from_secs(100), ..client_cfg() };
    let a = Client::new(Arc::new(net.transport("a")), cfg).connect(&nid()).await.unwrap();
    put(&a, "a1").await;
    a.commit().await.unwrap();
    put(&a, "a2").await;
    crash(server).await;
    toy.crash();
    let moved: Nid = "mds1@mem".parse().unwrap();
    let server = start_at(&net, &toy, true, 60_000, &moved).await;
    assert!(server.stats().recovery.recovering);
    a.retarget(&moved);
    // No request from the client; its pinger alone brings it back. The bound is far
    // below the ping interval and the recovery window.
    let waited = std::time::Instant::now();
    while server.stats().recovery.recovering && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = server.stats().recovery;
    assert!(!r.recovering, "still recovering after {:?}: {r:?}", waited.elapsed());
    assert_eq!((r.clients, r.completed, r.evicted, r.replayed), (1, 1, 0, 1));
    assert_eq!(strs(toy.values()), ["a1", "a2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_come_back_is_evicted_and_the_others_finish() {
    let net = MemNetwork::new();
    let toy = Toy::default();
    let server = start(&net, &toy, false, 400).await;
    let (a, b) = (connect(&net, "a").await, connect(&net, "b").await);
    put(&a, "a1").await;
    put(&b, "b1").await;
    a.commit().await.unwrap();
    put(&b, "b2").await;
    put(&a, "a2").await;
    crash(server).await;
    toy.crash();
    let server = start(&net, &toy, true, 400).await;
    // Only a comes back: its replay waits for b (transno 3 may still come), then the
    // window closes, b is evicted and a's replay runs past the gap.
    put(&a, "a3").await;
    assert_eq!(strs(toy.values()), ["a1", "b1", "a2", "a3"]);
    let r = server.stats().recovery;
    assert_eq!((r.completed, r.evicted, r.replayed), (1, 1, 1));
    // b, evicted, loses what it kept and its next call finds a new export.
    let e = b.call(OP_PUT, b"b3", &[]).await;
    assert!(matches!(e, Err(RpcError::Evicted { .. })), "{e:?}");
    assert_eq!(b.stats().replays_lost, 1);
    assert_eq!(b.uncommitted(), 0);
    put(&b, "b4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_clients_wait_for_recovery_and_the_replay_list_stays_bounded() {
    let net = MemNetwork::new();
    let toy = Toy::default();
    let server = start(&net, &toy, false, 300).await;
    let cfg = ClientConfig { replay_max: 4, ..client_cfg() };
    let a = Client::new(Arc::new(net.transport("a")), cfg).connect(&nid()).await.unwrap();
    for i in 0..10 {
        put(&a, &format!("a{i}")).await;
        assert!(a.uncommitted() <= 4, "past replay_max the client asks for a commit");
    }
    assert!(a.stats().commits >= 2);
    crash(server).await;
    toy.crash();
    let durable = toy.values().len();
    assert!(durable >= 8, "{durable}: the commits made most of them durable");
    let server = start(&net, &toy, true, 300).await;
    // A new client is held off (EBUSY, retried) until recovery is over: a never comes
    // back here, so that is when the window closes.
    let t = std::time::Instant::now();
    let c = connect(&net, "c").await;
    put(&c, "c1").await;
    assert!(t.elapsed() >= Duration::from_millis(250), "the new client waited for the window");
    let r = server.stats().recovery;
    assert_eq!((r.recovering, r.evicted), (false, 1));
    assert_eq!(toy.values().len(), durable + 1);
}

/// One frame over a raw connection, and its reply (status and body).
async fn raw_call(
    s: &mut nacre_net::transport::Stream,
    h: nacre_net::frame::FrameHeader,
    body: &[u8],
) -> (i32, String) {
    use nacre_net::rpc::{read_frame, write_frame};
    let h = nacre_net::frame::FrameHeader { body_len: body.len() as u32, ..h };
    write_frame(&mut *s.write, &h, body, &[]).await.unwrap();
    let pool = nacre_net::bulk::BulkPool::new(0);
    let f = read_frame(&mut *s.read, &Default::default(), &pool).await.unwrap().unwrap();
    (f.header.status, String::from_utf8_lossy(&f.body).into_owned())
}

/// Replays the server cannot take are refused by name and change nothing: from a client
/// no recovery waits for, after recovery, or with a malformed envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_replays_are_refused_and_change_nothing() {
    use nacre_net::frame::{FrameHeader, flags};
    use nacre_net::rpc::{ConnectRequest, OP_CONNECT, Replay, status};
    let net = MemNetwork::new();
    let toy = Toy::default();
    // Client 42 made a change the MDS lost; the server waits for it.
    toy.0.lock().unwrap().answers.insert((42, 1), 0);
    let server = start(&net, &toy, true, 2_000).await;
    let t: Arc<dyn nacre_net::transport::Transport> = Arc::new(net.transport("raw"));
    let connect = |client: u64| {
        let t = t.clone();
        async move {
            let mut s = t.connect(&nid()).await.unwrap();
            let body = ConnectRequest { client, cookie: 7, target: 0 }.encode();
            let r = raw_call(&mut s, FrameHeader { opcode: OP_CONNECT, ..FrameHeader::default() }, &body).await;
            (s, r)
        }
    };
    // A client recovery does not wait for: refused until it ends.
    let (_, (st, why)) = connect(43).await;
    assert!(st == status::EBUSY && why.contains("recovering"), "{st} {why}");
    let (mut s, (st, _)) = connect(42).await;
    assert_eq!(st, 0);
    let replay = |xid: u64, transno: u64| FrameHeader {
        opcode: OP_PUT,
        flags: flags::REPLAY,
        xid,
        transno,
        ..FrameHeader::default()
    };
    let (st, why) = raw_call(&mut s, replay(5, 1), &[9, 0]).await;
    assert!(st == status::EPROTO && why.contains("shorter"), "{st} {why}");
    let (st, why) = raw_call(&mut s, replay(6, 1), &[200, 0, 0, 0, 1]).await;
    assert!(st == status::EPROTO && why.contains("200-byte"), "{st} {why}");
    assert!(toy.values().is_empty(), "nothing ran");
    // A good one runs; then the client is done and recovery ends.
    let (st, _) = raw_call(&mut s, replay(7, 1), &Replay::encode(b"v", b"")).await;
    assert_eq!(st, 0);
    let done = FrameHeader { opcode: nacre_net::rpc::OP_REPLAY_DONE, xid: 8, ..FrameHeader::default() };
    assert_eq!(raw_call(&mut s, done, &[]).await.0, 0);
    assert!(!server.stats().recovery.recovering);
    // After recovery, a replay is refused by name.
    let (st, why) = raw_call(&mut s, replay(9, 2), &Replay::encode(b"late", b"")).await;
    assert!(st == status::ESTALE && why.contains("no recovery"), "{st} {why}");
    assert_eq!(strs(toy.values()), ["v"]);
}

/// A server that restarts (or whose target another node takes over) knowing nothing of a
/// client whose changes were all committed never answered what the client had in flight:
/// it goes again there. A client the server itself evicted loses what was in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_requests_go_again_to_a_restarted_server_and_fail_after_an_eviction() {
    let net = MemNetwork::new();
    let toy = Toy::default();
    let server = start(&net, &toy, false, 5_000).await;
    let client = Client::new(Arc::new(net.transport("a")), client_cfg());
    let a = client.connect(&nid()).await.unwrap();
    put(&a, "a1").await;
    a.commit().await.unwrap();
    crash(server).await;
    let in_flight = {
        let a = a.clone();
        tokio::spawn(async move { a.call(OP_PUT, b"a2", &[]).await.map(|f| f.header.transno) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Elsewhere, with no recovery: nothing of a's was left uncommitted.
    let moved: Nid = "mds1@mem".parse().unwrap();
    let server = start_at(&net, &toy, false, 5_000, &moved).await;
    a.retarget(&moved);
    assert!(in_flight.await.unwrap().expect("resent, not lost") > 0);
    assert_eq!(strs(toy.values()), ["a1", "a2"]);
    assert_eq!(a.stats().evictions, 0);

    // Evicted by this very server: the connect says so, and the request in flight fails.
    assert!(server.handle().evict(client.id()));
    let e = a.call(OP_PUT, b"a3", &[]).await;
    assert!(matches!(e, Err(RpcError::Evicted { .. })), "{e:?}");
    assert_eq!(a.stats().evictions, 1);
    put(&a, "a4").await;
}

/// A client that knows every NID of its server (a failover pair's, as the MGS lists
/// them) finds it on its own when it moves: no one retargets the import, as when the MGS
/// went down with the node. It walks to the partner, replays there, and walks back when
/// the server moves back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_walks_its_servers_nids_to_where_it_serves_now_and_back() {
    let net = MemNetwork::new();
    let toy = Toy::default();
    let (first, partner): (Nid, Nid) = (nid(), "mds1@mem".parse().unwrap());
    let server = start(&net, &toy, false, 5_000).await;
    let client = Client::new(Arc::new(net.transport("a")), client_cfg());
    let a = client.connect_any(TOY, &[first.clone(), partner.clone()]).await.unwrap();
    assert_eq!(a.target(), first);
    put(&a, "a1").await;
    a.commit().await.unwrap();
    put(&a, "a2").await;
    crash(server).await;
    toy.crash();
    let server = start_at(&net, &toy, true, 5_000, &partner).await;
    // Sent to the first NID, where nothing listens now: it walks to the partner, replays
    // a2 there, and a3 runs after it.
    put(&a, "a3").await;
    assert_eq!(a.target(), partner);
    assert_eq!(strs(toy.values()), ["a1", "a2", "a3"]);
    let r = server.stats().recovery;
    assert_eq!((r.clients, r.completed, r.evicted, r.replayed), (1, 1, 0, 1));
    assert_eq!(a.stats().walks, 1);

    // Moved back: the second move is found the same way.
    crash(server).await;
    toy.crash();
    let server = start_at(&net, &toy, true, 5_000, &first).await;
    put(&a, "a4").await;
    assert_eq!(a.target(), first);
    assert_eq!(strs(toy.values()), ["a1", "a2", "a3", "a4"]);
    assert_eq!(server.stats().recovery.evicted, 0);
    assert_eq!((a.stats().walks, a.stats().evictions), (2, 0));
}

/// With every NID of its server dead or serving something else, an import tries each once
/// per attempt and then waits a request deadline (never under `at_min`): a dead pair costs
/// a connect per NID per deadline, not a storm, and walking spends none of the request's
/// resends. A NID where another service listens now (a
/// port the target left, taken since) refuses the connect, which names its target, and is
/// never used. A client that could reach none of them at first connects to the first that
/// serves its target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_walks_dead_nids_once_per_deadline_and_connects_to_the_first_that_answers() {
    let net = MemNetwork::new();
    let (toy, other) = (Toy::default(), Toy::default());
    let nids: Vec<Nid> = ["mds0@mem", "mds1@mem", "mds2@mem"].iter().map(|n| n.parse().unwrap()).collect();
    let _other = start_named(&net, &other, false, 5_000, &nids[0], "other").await;
    let server = start_at(&net, &toy, false, 5_000, &nids[2]).await;
    let client = Client::new(Arc::new(net.transport("a")), ClientConfig { max_resends: 12, ..client_cfg() });
    let e = client.connect_any(TOY, &nids[..1]).await.map(|_| ()).unwrap_err();
    assert!(
        matches!(&e, RpcError::Refused { status: nacre_net::rpc::status::ENODEV, reason, .. }
            if reason.contains("other is served here")),
        "{e:?}"
    );
    let a = client.connect_any(TOY, &nids).await.unwrap();
    assert_eq!(a.target(), nids[2]);
    put(&a, "a1").await;
    a.commit().await.unwrap();
    crash(server).await;

    let started = std::time::Instant::now();
    let e = a.call(OP_PUT, b"a2", &[]).await;
    let took = started.elapsed();
    assert!(matches!(e, Err(RpcError::Closed | RpcError::Timeout { .. } | RpcError::Io(_))), "{e:?}");
    let walks = a.stats().walks;
    // 13 attempts, each a round of the three NIDs (a walk after each failed connect; the
    // first attempt may instead have found the old connection not yet closed), with a
    // deadline waited between rounds.
    assert!((37..=39).contains(&walks), "{walks} walks in {took:?}");
    let at_min = client_cfg().at.at_min;
    assert!(took >= at_min * 12, "{walks} walks in {took:?}: no pause between rounds");
    assert_eq!(strs(toy.values()), ["a1"]);
    assert!(other.values().is_empty(), "a request went to the service at the first NID");

    // Eight requests at once: a walk made by one does not wake the others out of their
    // pause (each would fail again at once and walk on: a storm of connects).
    let (before, started) = (a.stats().walks, std::time::Instant::now());
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let a = a.clone();
            tokio::spawn(async move { a.call(OP_PUT, format!("c{i}").as_bytes(), &[]).await.is_err() })
        })
        .collect();
    for c in calls {
        assert!(c.await.unwrap());
    }
    let (walks, took) = (a.stats().walks - before, started.elapsed());
    assert!(walks <= 8 * 39, "{walks} walks for 8 requests of 13 attempts over 3 NIDs");
    assert!(took >= at_min * 12, "{walks} walks in {took:?}: the requests' pauses were cut short");

    // None of the three serves a new client either; once one does, it is the one.
    assert!(Client::new(Arc::new(net.transport("b")), client_cfg()).connect_any(TOY, &nids).await.is_err());
    let _server = start_at(&net, &toy, false, 5_000, &nids[1]).await;
    let b = Client::new(Arc::new(net.transport("b")), client_cfg()).connect_any(TOY, &nids).await.unwrap();
    assert_eq!(b.target(), nids[1]);
    put(&b, "b1").await;
    assert_eq!(strs(toy.values()), ["a1", "b1"]);
    assert!(other.values().is_empty());
}
