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
    let service = Service {
        commits: Some(Arc::new(toy.clone())),
        recovering: recovering
            .then(|| Recovering { clients: toy.clients(), last_committed: toy.0.lock().unwrap().committed }),
    };
    // The stopped server's listener goes when its task is next polled.
    for _ in 0..100 {
        let t = Arc::new(net.transport("mds0"));
        match Server::start_service(t, &nid(), toy.handler(), server_cfg(soft_ms), service.clone()).await {
            Ok(s) => return s,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    panic!("the stopped server still listens");
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
    drop(server);
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
    drop(server);
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
    drop(server);
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
