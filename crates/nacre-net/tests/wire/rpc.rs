//! RPC end to end: bulk comes back byte for byte over TCP with several connections per
//! peer, in-flight requests and request buffers stay bounded under a flood, a peer sending
//! garbage is cut off alone, and — under injected loss, delay, duplication and cuts —
//! resends run a request once, early replies keep a slow request alive, silent clients are
//! evicted, a dead server is not pinged in a storm, and TBF rules hold a client to its rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nacre_net::at::AtConfig;
use nacre_net::client::{Client, ClientConfig, Import, Request};
use nacre_net::frame::FrameLimits;
use nacre_net::nid::Nid;
use nacre_net::rpc::RpcError;
use nacre_net::server::{AtOnce, Handler, Incoming, Policy, Reply, Server, ServerConfig, Service};
use nacre_net::transport::{MemNetwork, TcpTransport, Transport};
use tokio::io::AsyncWriteExt;

const OP_ECHO: u16 = 20;
const OP_SLOW: u16 = 21;

/// Echoes body and bulk; counts runs per xid-free request and the peak concurrency.
#[derive(Default)]
struct Probe {
    runs: AtomicU64,
    active: AtomicI64,
    peak: AtomicI64,
    /// Requests of each client held by the server (queued or running), and the peak.
    per_client: std::sync::Mutex<std::collections::HashMap<u64, (i64, i64)>>,
}

impl Probe {
    fn client_peak(&self) -> i64 {
        self.per_client.lock().unwrap().values().map(|v| v.1).max().unwrap_or(0)
    }
}

fn echo(probe: Arc<Probe>, slow: Duration) -> Handler {
    Arc::new(move |req| {
        let probe = probe.clone();
        Box::pin(async move {
            probe.runs.fetch_add(1, Ordering::SeqCst);
            let now = probe.active.fetch_add(1, Ordering::SeqCst) + 1;
            probe.peak.fetch_max(now, Ordering::SeqCst);
            {
                let mut m = probe.per_client.lock().unwrap();
                let e = m.entry(req.client).or_default();
                e.0 += 1;
                e.1 = e.1.max(e.0);
            }
            if req.header.opcode == OP_SLOW {
                tokio::time::sleep(slow).await;
            }
            probe.per_client.lock().unwrap().entry(req.client).or_default().0 -= 1;
            probe.active.fetch_sub(1, Ordering::SeqCst);
            Reply { body: req.body, bulk: req.bulk.into_vec().into(), ..Reply::default() }
        })
    })
}

fn fast_at(ms: u64) -> AtConfig {
    AtConfig { at_min: Duration::from_millis(ms), ..AtConfig::default() }
}

async fn mem_pair(
    ccfg: ClientConfig,
    scfg: ServerConfig,
    probe: Arc<Probe>,
    slow: Duration,
) -> (Server, Client, Arc<Import>) {
    let net = MemNetwork::new();
    let server_t: Arc<dyn Transport> = Arc::new(net.transport("oss0"));
    let server = Server::start(server_t, &"oss0@mem".parse().unwrap(), echo(probe, slow), scfg).await.unwrap();
    let client = Client::new(Arc::new(net.transport("client0")), ccfg);
    let import = client.connect(&server.nid()).await.unwrap();
    (server, client, import)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_round_trips_exactly_over_tcp_with_several_connections() {
    let probe = Arc::new(Probe::default());
    let nid: Nid = "127.0.0.1@tcp:0".parse().unwrap();
    let server = Server::start(Arc::new(TcpTransport), &nid, echo(probe, Duration::ZERO), ServerConfig::default())
        .await
        .unwrap();
    let cfg = ClientConfig { conns_per_peer: 3, ..ClientConfig::default() };
    let client = Client::new(Arc::new(TcpTransport), cfg);
    let import = client.connect(&server.nid()).await.unwrap();
    for size in [0usize, 1, 4096, 1 << 20, 16 << 20] {
        let bulk: Vec<u8> = (0..size).map(|i| (i * 131 + size) as u8).collect();
        let reply = import.call(OP_ECHO, b"hello", &bulk).await.unwrap();
        assert_eq!(reply.header.opcode, OP_ECHO);
        assert_eq!(reply.body, b"hello");
        assert!(*reply.bulk == bulk, "{size}-byte bulk came back different");
    }
    let s = server.stats();
    assert_eq!(s.connections, 3, "conns_per_peer connections, all used");
    assert_eq!(s.exports, 1, "one client however many connections");
    // Bulk over the maximum is refused before anything is sent.
    let too_big = vec![0u8; (16 << 20) + 1];
    let e = import.send(Request { no_resend: true, ..Request::new(OP_ECHO, b"", &too_big) }).await.unwrap_err();
    assert!(matches!(e, RpcError::TooLarge { what: "bulk", .. }), "{e}");
    assert_eq!(import.stats().requests, 5, "the oversized request was not counted as sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shortcut_serves_this_process_in_memory_and_others_over_tcp() {
    use nacre_net::transport::Shortcut;
    let probe = Arc::new(Probe::default());
    let nid: Nid = "127.0.0.1@tcp:0".parse().unwrap();
    let server =
        Server::start(Arc::new(Shortcut), &nid, echo(probe, Duration::ZERO), ServerConfig::default()).await.unwrap();
    assert!(Shortcut::serves(&server.nid()));
    let bulk: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
    for t in [Arc::new(Shortcut) as Arc<dyn Transport>, Arc::new(TcpTransport)] {
        let imp = Client::new(t, ClientConfig::default()).connect(&server.nid()).await.unwrap();
        let r = imp.call(OP_ECHO, b"hi", &bulk).await.unwrap();
        assert_eq!((&r.body[..], &r.bulk[..]), (&b"hi"[..], &bulk[..]));
    }
    assert_eq!(server.stats().exports, 2, "one client in memory, one over TCP");
    let gone = server.nid();
    drop(server);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!Shortcut::serves(&gone), "a stopped server is no longer a shortcut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_racing_to_connect_share_one_import_and_lose_nothing() {
    let probe = Arc::new(Probe::default());
    let nid: Nid = "127.0.0.1@tcp:0".parse().unwrap();
    let server = Server::start(Arc::new(TcpTransport), &nid, echo(probe, Duration::ZERO), ServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(Arc::new(TcpTransport), ClientConfig::default());
    // Tasks connect at once and call at once: each call answers, none of them is told its
    // export was lost (two imports would each claim the client's export).
    let mut set = tokio::task::JoinSet::new();
    for i in 0..32u8 {
        let (client, nid) = (client.clone(), server.nid());
        set.spawn(async move {
            let imp = client.connect(&nid).await.unwrap();
            let r = imp.call(OP_ECHO, &[i], &[]).await.unwrap();
            assert_eq!(r.body, [i]);
            imp
        });
    }
    let mut imports = Vec::new();
    while let Some(r) = set.join_next().await {
        imports.push(r.unwrap());
    }
    assert!(imports.iter().all(|i| Arc::ptr_eq(i, &imports[0])), "one import per server");
    assert_eq!(imports[0].stats().evictions, 0);
    assert_eq!(server.stats().exports, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_stays_within_request_buffers_threads_and_in_flight_bounds() {
    let probe = Arc::new(Probe::default());
    let scfg = ServerConfig {
        req_buffers_max: 6,
        threads_max: 3,
        req_bulk_bytes_max: 1 << 20,
        limits: FrameLimits { body_max: 4096, bulk_max: 512 << 10 },
        ..ServerConfig::default()
    };
    let net = MemNetwork::new();
    let server = Server::start(
        Arc::new(net.transport("oss0")),
        &"oss0@mem".parse().unwrap(),
        echo(probe.clone(), Duration::from_millis(2)),
        scfg,
    )
    .await
    .unwrap();
    let mut imports = Vec::new();
    for i in 0..8 {
        let c = Client::new(
            Arc::new(net.transport(&format!("c{i}"))),
            ClientConfig { max_rpcs_in_flight: 16, ..ClientConfig::default() },
        );
        imports.push(c.connect(&server.nid()).await.unwrap());
    }
    // 1,600 requests, a quarter of them with 256 KiB of bulk: far over every bound.
    let mut calls = tokio::task::JoinSet::new();
    let seed = 0x5eed_u64;
    for i in 0..1600u64 {
        let imp = imports[(i % 8) as usize].clone();
        let bulk = if (i ^ seed).is_multiple_of(4) { vec![i as u8; 256 << 10] } else { Vec::new() };
        calls.spawn(async move {
            let r = imp.call(OP_SLOW, &i.to_le_bytes(), &bulk).await?;
            Ok::<_, RpcError>((i, r, bulk))
        });
    }
    let mut answered = 0;
    while let Some(r) = calls.join_next().await {
        let (i, reply, bulk) = r.unwrap().unwrap();
        assert_eq!(reply.body, i.to_le_bytes(), "reply matched to the wrong request");
        assert!(*reply.bulk == bulk);
        answered += 1;
    }
    assert_eq!(answered, 1600, "every request answered");
    let s = server.stats();
    assert!(s.req_buffers_peak <= 6, "{} request buffers held with a maximum of 6", s.req_buffers_peak);
    assert!(s.req_bulk_bytes_peak <= 1 << 20, "{} bulk bytes held with a budget of 1 MiB", s.req_bulk_bytes_peak);
    assert!(s.req_bulk_bytes_peak >= 256 << 10, "the flood did carry bulk");
    assert!(
        probe.peak.load(Ordering::SeqCst) <= 3,
        "{} handlers at once with threads_max 3",
        probe.peak.load(Ordering::SeqCst)
    );
    assert_eq!(probe.runs.load(Ordering::SeqCst), 1600, "each request ran once");
    assert!(probe.client_peak() <= 3, "threads_max bounds each client too");
    assert!(s.credits.available <= s.credits.max as i64 && s.credits.max == 512);
    for imp in &imports {
        let st = imp.stats();
        assert!(st.peer_credits.available <= st.peer_credits.max as i64);
        assert_eq!(st.in_flight, 0);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(server.stats().req_buffers_in_use, 0, "every buffer returned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_sending_garbage_is_cut_off_and_others_go_on() {
    let probe = Arc::new(Probe::default());
    let nid: Nid = "127.0.0.1@tcp:0".parse().unwrap();
    let server = Server::start(Arc::new(TcpTransport), &nid, echo(probe, Duration::ZERO), ServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(Arc::new(TcpTransport), ClientConfig::default());
    let good = client.connect(&server.nid()).await.unwrap();
    let Nid::Tcp(addr) = server.nid() else { panic!("tcp server") };
    let mut bad = tokio::net::TcpStream::connect(addr).await.unwrap();
    bad.write_all(&[b'-'; 200]).await.unwrap();
    // The server closes the garbage connection: reading it ends.
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut bad, &mut buf))
        .await
        .expect("server closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert_eq!(good.call(OP_ECHO, b"still here", &[]).await.unwrap().body, b"still here");
    assert_eq!(server.stats().malformed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_request_is_resent_and_runs_once() {
    let probe = Arc::new(Probe::default());
    let ccfg = ClientConfig { at: fast_at(150), ..ClientConfig::default() };
    let (server, client, import) = mem_pair(ccfg, ServerConfig::default(), probe.clone(), Duration::ZERO).await;
    client.faults().add(&format!("drop opcode={OP_ECHO} count=1")).unwrap();
    let r = import.call(OP_ECHO, b"again", &[]).await.unwrap();
    assert_eq!(r.body, b"again");
    assert_eq!(probe.runs.load(Ordering::SeqCst), 1);
    assert_eq!(import.stats().resends, 1);
    assert_eq!(server.stats().resends, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_answered_from_the_reply_cache() {
    let probe = Arc::new(Probe::default());
    let ccfg = ClientConfig { at: fast_at(150), ..ClientConfig::default() };
    let (server, _client, import) = mem_pair(ccfg, ServerConfig::default(), probe.clone(), Duration::ZERO).await;
    server.faults().add(&format!("drop opcode={OP_ECHO} count=1")).unwrap();
    let r = import.call(OP_ECHO, b"once", &[]).await.unwrap();
    assert_eq!(r.body, b"once");
    assert_eq!(probe.runs.load(Ordering::SeqCst), 1, "the resend did not run the request again");
    assert_eq!(server.stats().replayed, 1);
    // Duplicated requests run once too.
    _client.faults().add(&format!("dup opcode={OP_ECHO} count=3")).unwrap();
    for i in 0..3u8 {
        assert_eq!(import.call(OP_ECHO, &[i], &[]).await.unwrap().body, [i]);
    }
    assert_eq!(probe.runs.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::result_large_err)] // the request comes back by value, as `AtOnce` has it
async fn a_request_answered_at_once_runs_once_and_its_lost_reply_comes_from_the_cache() {
    // The service answers at once an echo whose body starts with "now", and gives any
    // other back to its handler.
    let offered = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicU64::new(0));
    let (o, a) = (offered.clone(), answered.clone());
    let at_once: AtOnce = Arc::new(move |req: Incoming| {
        o.fetch_add(1, Ordering::SeqCst);
        if !req.body.starts_with(b"now") {
            return Err(req);
        }
        a.fetch_add(1, Ordering::SeqCst);
        Ok(Reply { body: req.body, ..Reply::default() })
    });
    let service = Service { waits: vec![OP_ECHO], at_once: Some(at_once), ..Service::default() };
    let probe = Arc::new(Probe::default());
    let net = MemNetwork::new();
    let server_t: Arc<dyn Transport> = Arc::new(net.transport("mds0"));
    let nid = "mds0@mem".parse().unwrap();
    let handler = echo(probe.clone(), Duration::ZERO);
    let server = Server::start_service(server_t, &nid, handler, ServerConfig::default(), service).await.unwrap();
    let client =
        Client::new(Arc::new(net.transport("c0")), ClientConfig { at: fast_at(150), ..ClientConfig::default() });
    let import = client.connect(&server.nid()).await.unwrap();

    assert_eq!(import.call(OP_ECHO, b"now 1", &[]).await.unwrap().body, b"now 1");
    assert_eq!(import.call(OP_ECHO, b"later", &[]).await.unwrap().body, b"later");
    let counts =
        || (offered.load(Ordering::SeqCst), answered.load(Ordering::SeqCst), probe.runs.load(Ordering::SeqCst));
    assert_eq!(counts(), (2, 1, 1), "one answered at once, one given back and run by the handler");
    // Another opcode is never offered.
    assert_eq!(import.call(OP_SLOW, b"now, but slow", &[]).await.unwrap().body, b"now, but slow");
    assert_eq!(counts(), (2, 1, 2));

    // Its reply lost, the resend gets the reply cached, and nothing runs again.
    server.faults().add(&format!("drop opcode={OP_ECHO} count=1")).unwrap();
    assert_eq!(import.call(OP_ECHO, b"now 2", &[]).await.unwrap().body, b"now 2");
    assert_eq!(counts(), (3, 2, 2));
    assert_eq!((server.stats().replayed, import.stats().resends), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_reconnects_to_the_same_export_and_resends() {
    let probe = Arc::new(Probe::default());
    let ccfg = ClientConfig { at: fast_at(2000), ..ClientConfig::default() };
    let (server, _client, import) = mem_pair(ccfg, ServerConfig::default(), probe.clone(), Duration::ZERO).await;
    // The server cuts the connection instead of sending the reply.
    server.faults().add(&format!("cut opcode={OP_ECHO} count=1")).unwrap();
    let t = Instant::now();
    let r = import.call(OP_ECHO, b"cut", &[]).await.unwrap();
    assert_eq!(r.body, b"cut");
    assert!(t.elapsed() < Duration::from_millis(1900), "a closed connection is noticed before the deadline");
    let (s, i) = (server.stats(), import.stats());
    assert_eq!(probe.runs.load(Ordering::SeqCst), 1);
    assert_eq!((s.replayed, s.exports, s.evictions), (1, 1, 0), "same export, reply from the cache");
    assert_eq!((i.connects, i.evictions), (2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_of_a_running_request_joins_it() {
    let probe = Arc::new(Probe::default());
    let ccfg = ClientConfig { at: fast_at(150), ..ClientConfig::default() };
    // No early replies: the client gives up on each attempt after 150 ms.
    let scfg = ServerConfig { at_extra: Duration::ZERO, ..ServerConfig::default() };
    let (server, _c, import) = mem_pair(ccfg, scfg, probe.clone(), Duration::from_millis(400)).await;
    let r = import.call(OP_SLOW, b"slow", &[]).await.unwrap();
    assert_eq!(r.body, b"slow");
    assert_eq!(probe.runs.load(Ordering::SeqCst), 1, "resends joined the running request");
    assert!(server.stats().joined >= 1);
    assert!(import.stats().resends >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_replies_keep_a_slow_request_alive_without_resends() {
    let probe = Arc::new(Probe::default());
    let ccfg = ClientConfig { at: fast_at(200), max_resends: 0, ..ClientConfig::default() };
    let scfg = ServerConfig {
        at_early_margin: Duration::from_millis(60),
        at_extra: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let (server, _c, import) = mem_pair(ccfg, scfg, probe.clone(), Duration::from_millis(900)).await;
    let r = import.call(OP_SLOW, b"patience", &[]).await.unwrap();
    assert_eq!(r.body, b"patience");
    let (s, i) = (server.stats(), import.stats());
    assert!(s.early_replies >= 2, "{} early replies for a 900 ms request with 200 ms deadlines", s.early_replies);
    assert_eq!(i.early_replies, s.early_replies);
    assert_eq!(i.resends, 0);
    // The service time is learned: the next deadline covers it.
    assert!(import.timeout() >= Duration::from_millis(900), "timeout {:?}", import.timeout());
    // Delayed replies (by a fault rule) within the deadline are simply waited for.
    server.faults().add(&format!("delay ms=100 opcode={OP_ECHO}")).unwrap();
    assert_eq!(import.call(OP_ECHO, b"late", &[]).await.unwrap().body, b"late");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_every_resend_times_out_with_the_reason() {
    let probe = Arc::new(Probe::default());
    let ccfg = ClientConfig { at: fast_at(100), max_resends: 2, ..ClientConfig::default() };
    let (_server, client, import) = mem_pair(ccfg, ServerConfig::default(), probe.clone(), Duration::ZERO).await;
    client.faults().add(&format!("drop opcode={OP_ECHO}")).unwrap();
    match import.call(OP_ECHO, b"void", &[]).await {
        Err(RpcError::Timeout { attempts, .. }) => assert_eq!(attempts, 3),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(probe.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_evicted_and_told_so_when_it_returns() {
    let probe = Arc::new(Probe::default());
    let ccfg = ClientConfig { at: fast_at(200), ping: false, ..ClientConfig::default() };
    let scfg = ServerConfig { obd_timeout: Duration::from_millis(300), ..ServerConfig::default() };
    let (server, _c, import) = mem_pair(ccfg, scfg, probe, Duration::ZERO).await;
    assert_eq!(import.call(OP_ECHO, b"hi", &[]).await.unwrap().body, b"hi");
    let t = Instant::now();
    while server.stats().evictions == 0 && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s = server.stats();
    assert_eq!((s.evictions, s.exports), (1, 0), "silent for 1.5 × obd_timeout: evicted");
    assert!(matches!(import.call(OP_ECHO, b"back", &[]).await, Err(RpcError::Evicted { .. })));
    assert_eq!(import.stats().evictions, 1);
    // The import goes on with a new export.
    assert_eq!(import.call(OP_ECHO, b"anew", &[]).await.unwrap().body, b"anew");
    assert_eq!(server.stats().exports, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pinger_keeps_a_client_and_never_storms_a_dead_server() {
    let probe = Arc::new(Probe::default());
    // Pings every 100 ms; eviction after 600 ms of silence.
    let ccfg = ClientConfig { at: fast_at(500), obd_timeout: Duration::from_millis(400), ..ClientConfig::default() };
    let scfg = ServerConfig { obd_timeout: Duration::from_millis(400), ..ServerConfig::default() };
    let (server, _c, import) = mem_pair(ccfg, scfg, probe, Duration::ZERO).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = server.stats();
    assert_eq!(s.evictions, 0, "an idle client that pings is not evicted");
    assert!(s.pings >= 5, "{} pings in 1.5 s at 100 ms", s.pings);
    // The server goes away: failed pings are spaced by at least the 500 ms deadline.
    drop(server);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = import.stats().pings;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let st = import.stats();
    let tried = st.pings - before;
    assert!(tried <= 5, "{tried} pings to a dead server in 2 s with a 500 ms deadline");
    assert!(st.ping_failures >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tbf_holds_a_client_to_its_rate_and_a_rule_change_reaches_queued_requests() {
    let probe = Arc::new(Probe::default());
    let net = MemNetwork::new();
    let server = Server::start(
        Arc::new(net.transport("mds0")),
        &"mds0@mem".parse().unwrap(),
        echo(probe, Duration::ZERO),
        ServerConfig::default(),
    )
    .await
    .unwrap();
    assert!(server.tbf_rule("start slow nid={greedy@mem} rate=20").is_err(), "rules need the tbf policy");
    server.set_policy(Policy::Tbf);
    server.tbf_rule("start slow nid={greedy@mem} rate=20").unwrap();
    let cfg = ClientConfig { max_rpcs_in_flight: 32, at: fast_at(10_000), ..ClientConfig::default() };
    let greedy = Client::new(Arc::new(net.transport("greedy")), cfg.clone()).connect(&server.nid()).await.unwrap();
    let polite = Client::new(Arc::new(net.transport("polite")), cfg).connect(&server.nid()).await.unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (g, d) = (greedy.clone(), done.clone());
        set.spawn(async move {
            while g.call(OP_ECHO, b"g", &[]).await.is_ok() {
                d.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    let t = Instant::now();
    let mut polite_done = 0;
    while t.elapsed() < Duration::from_millis(1000) {
        polite.call(OP_ECHO, b"p", &[]).await.unwrap();
        polite_done += 1;
    }
    let greedy_done = done.load(Ordering::SeqCst);
    let secs = t.elapsed().as_secs_f64();
    // 20/s plus the bucket's depth of 3.
    assert!(greedy_done as f64 <= 20.0 * secs + 4.0, "greedy got {greedy_done} in {secs:.2} s at 20/s");
    assert!(polite_done > greedy_done, "the unlimited client is not held back ({polite_done} vs {greedy_done})");
    assert!(server.stats().queued > 0, "greedy requests wait in the queue");
    // Raising the rate frees the queued requests at the new rate.
    server.tbf_rule("change slow rate=100000").unwrap();
    let before = done.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(done.load(Ordering::SeqCst) - before > 100, "the queue drained after the change");
    set.abort_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_beyond_exports_max_are_refused_with_the_reason() {
    let probe = Arc::new(Probe::default());
    let net = MemNetwork::new();
    let scfg = ServerConfig { exports_max: 2, ..ServerConfig::default() };
    let server =
        Server::start(Arc::new(net.transport("s")), &"s@mem".parse().unwrap(), echo(probe, Duration::ZERO), scfg)
            .await
            .unwrap();
    let mut kept = Vec::new();
    for i in 0..2 {
        kept.push(
            Client::new(Arc::new(net.transport(&format!("c{i}"))), ClientConfig::default())
                .connect(&server.nid())
                .await
                .unwrap(),
        );
    }
    let third = Client::new(Arc::new(net.transport("c2")), ClientConfig::default());
    match third.connect(&server.nid()).await {
        Err(RpcError::Refused { reason, .. }) => assert!(reason.contains("2 clients"), "{reason}"),
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("a third client was taken with exports_max 2"),
    }
    assert_eq!(server.stats().refused, 1);
    // One leaves cleanly: its place is free at once.
    kept[0].disconnect().await.unwrap();
    assert!(third.connect(&server.nid()).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_rpcs_in_flight_bounds_what_one_client_has_outstanding() {
    let probe = Arc::new(Probe::default());
    let ccfg = ClientConfig { max_rpcs_in_flight: 4, ..ClientConfig::default() };
    let (_s, _c, import) = mem_pair(ccfg, ServerConfig::default(), probe.clone(), Duration::from_millis(5)).await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..200u32 {
        let imp = import.clone();
        set.spawn(async move { imp.call(OP_SLOW, &i.to_le_bytes(), &[]).await.map(|r| r.body == i.to_le_bytes()) });
    }
    while let Some(r) = set.join_next().await {
        assert!(r.unwrap().unwrap());
    }
    assert_eq!(probe.client_peak(), 4, "the server held exactly max_rpcs_in_flight of this client at most");
    assert_eq!(import.stats().in_flight, 0);
}

/// A raw TCP connection to `server` that has done the connect handshake by hand.
async fn raw_connected(server: &Server, client: u64) -> tokio::net::TcpStream {
    use nacre_net::frame::{FrameHeader, encode_frame};
    use nacre_net::rpc::{ConnectRequest, OP_CONNECT};
    let Nid::Tcp(addr) = server.nid() else { panic!("tcp server") };
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = ConnectRequest { client, cookie: 0, target: 0 }.encode();
    let h = FrameHeader { opcode: OP_CONNECT, body_len: body.len() as u32, ..FrameHeader::default() };
    s.write_all(&encode_frame(&h, &body, &[])).await.unwrap();
    let mut reply = [0u8; nacre_net::frame::HEADER_BYTES + 16];
    tokio::io::AsyncReadExt::read_exact(&mut s, &mut reply).await.unwrap();
    s
}

/// Wait until the server closes `s`; returns what it sent first.
async fn closed_by_server(mut s: tokio::net::TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read_to_end(&mut s, &mut got))
        .await
        .expect("the server closes the connection")
        .ok();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_of_every_kind_closes_only_that_connection() {
    use nacre_net::frame::{BULK_BYTES_LIMIT, FrameHeader, HEADER_BYTES, encode_frame, flags};
    let probe = Arc::new(Probe::default());
    let nid: Nid = "127.0.0.1@tcp:0".parse().unwrap();
    let server =
        Server::start(Arc::new(TcpTransport), &nid, echo(probe.clone(), Duration::ZERO), ServerConfig::default())
            .await
            .unwrap();
    let good = Client::new(Arc::new(TcpTransport), ClientConfig::default()).connect(&server.nid()).await.unwrap();
    let Nid::Tcp(addr) = server.nid() else { panic!() };

    // A request before the handshake: refused with ENOTCONN and the reason, then closed.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let h = FrameHeader { opcode: OP_ECHO, xid: 5, ..FrameHeader::default() };
    s.write_all(&encode_frame(&h, &[], &[])).await.unwrap();
    let got = closed_by_server(s).await;
    let mut raw = [0u8; HEADER_BYTES];
    raw.copy_from_slice(&got[..HEADER_BYTES]);
    let reply = FrameHeader::decode(&raw, &Default::default()).unwrap();
    assert_eq!(reply.status, nacre_net::rpc::status::ENOTCONN);
    assert!(String::from_utf8_lossy(&got[HEADER_BYTES..]).contains("before the connect handshake"));

    // After the handshake: a bulk over the limit, a wrong version, a reply where a
    // request belongs, a transport opcode with bulk, and a stream cut inside a frame.
    // A connect that claims a bulk: refused before anything is read for it.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let h =
        FrameHeader { opcode: nacre_net::rpc::OP_CONNECT, body_len: 20, bulk_len: 16 << 20, ..FrameHeader::default() };
    s.write_all(&h.encode()).await.unwrap();
    assert!(String::from_utf8_lossy(&closed_by_server(s).await).contains("connect request of 20 + 16777216 bytes"));
    let over = FrameHeader { opcode: OP_ECHO, xid: 1, bulk_len: BULK_BYTES_LIMIT + 1, ..FrameHeader::default() };
    let mut wrong_version = FrameHeader { opcode: OP_ECHO, xid: 1, ..FrameHeader::default() }.encode();
    wrong_version[4] = 9;
    let reply_flag = FrameHeader { opcode: OP_ECHO, xid: 1, flags: flags::REPLY, ..FrameHeader::default() };
    let ping_bulk = FrameHeader { opcode: nacre_net::rpc::OP_PING, xid: 1, bulk_len: 8, ..FrameHeader::default() };
    let cut = FrameHeader { opcode: OP_ECHO, xid: 1, body_len: 1000, ..FrameHeader::default() };
    let cases: Vec<Vec<u8>> = vec![
        over.encode().to_vec(),
        wrong_version.to_vec(),
        reply_flag.encode().to_vec(),
        encode_frame(&ping_bulk, &[], &[0; 8]),
        [cut.encode().as_slice(), &[1u8; 10]].concat(),
    ];
    let n = cases.len() as u64;
    for (i, bytes) in cases.into_iter().enumerate() {
        let mut s = raw_connected(&server, 100 + i as u64).await;
        s.write_all(&bytes).await.unwrap();
        if i == 4 {
            s.shutdown().await.unwrap();
        }
        closed_by_server(s).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let st = server.stats();
    assert_eq!(st.malformed, n + 2, "each bad connection closed with a reason");
    assert_eq!(st.req_buffers_in_use, 0, "nothing held for the bad connections");
    assert_eq!(probe.runs.load(Ordering::SeqCst), 0, "no malformed request reached the handler");
    assert_eq!(good.call(OP_ECHO, b"unharmed", &[]).await.unwrap().body, b"unharmed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_by_nid_hit_only_the_named_peer_and_can_be_lifted() {
    let probe = Arc::new(Probe::default());
    let net = MemNetwork::new();
    let server = Server::start(
        Arc::new(net.transport("oss0")),
        &"oss0@mem".parse().unwrap(),
        echo(probe, Duration::ZERO),
        ServerConfig::default(),
    )
    .await
    .unwrap();
    let cfg = ClientConfig { at: fast_at(100), max_resends: 1, ..ClientConfig::default() };
    let c1 = Client::new(Arc::new(net.transport("c1")), cfg.clone()).connect(&server.nid()).await.unwrap();
    let c2 = Client::new(Arc::new(net.transport("c2")), cfg).connect(&server.nid()).await.unwrap();
    let rule = server.faults().add("drop from=oss0@mem to=c1@mem").unwrap();
    assert!(matches!(c1.call(OP_ECHO, b"1", &[]).await, Err(RpcError::Timeout { .. })), "replies to c1 dropped");
    assert_eq!(c2.call(OP_ECHO, b"2", &[]).await.unwrap().body, b"2", "c2 untouched");
    assert!(server.faults().remove(rule));
    assert_eq!(c1.call(OP_ECHO, b"1", &[]).await.unwrap().body, b"1", "lifted at run time");
    // A client learns the server's obd_timeout and pings at a quarter of the shorter one.
    assert_eq!(c1.ping_interval(), Duration::from_secs(25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_client_is_not_evicted_and_switching_policy_loses_no_queued_request() {
    let probe = Arc::new(Probe::default());
    let net = MemNetwork::new();
    // Evict after 450 ms of silence; the client does not ping.
    let scfg = ServerConfig { obd_timeout: Duration::from_millis(300), ..ServerConfig::default() };
    let server = Server::start(
        Arc::new(net.transport("ost0")),
        &"ost0@mem".parse().unwrap(),
        echo(probe.clone(), Duration::ZERO),
        scfg,
    )
    .await
    .unwrap();
    server.set_policy(Policy::Tbf);
    server.tbf_rule("start crawl nid={c@mem} rate=5").unwrap();
    let ccfg = ClientConfig { ping: false, max_rpcs_in_flight: 8, at: fast_at(10_000), ..ClientConfig::default() };
    let import = Client::new(Arc::new(net.transport("c")), ccfg).connect(&server.nid()).await.unwrap();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8u32 {
        let imp = import.clone();
        set.spawn(async move { imp.call(OP_ECHO, &i.to_le_bytes(), &[]).await.map(|r| r.body == i.to_le_bytes()) });
    }
    // 8 requests at 5/s (3 at once from the bucket): over a second in the queue, twice
    // the eviction time, and the client sends nothing meanwhile.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(server.stats().evictions, 0, "a client with queued requests is not silent");
    assert!(server.stats().queued > 0);
    // Back to FIFO: the queued requests move over and run at once.
    server.set_policy(Policy::Fifo);
    while let Some(r) = set.join_next().await {
        assert!(r.unwrap().unwrap());
    }
    assert_eq!(probe.runs.load(Ordering::SeqCst), 8);
    assert_eq!(server.stats().queued, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_does_not_strand_the_queue() {
    const OP_BOOM: u16 = 30;
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    let handler: Handler = Arc::new(move |req| {
        let r = r.clone();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(req.header.opcode != OP_BOOM, "handler bug on purpose");
            r.fetch_add(1, Ordering::SeqCst);
            Reply { body: req.body, ..Reply::default() }
        })
    });
    let net = MemNetwork::new();
    let scfg = ServerConfig { threads_max: 1, ..ServerConfig::default() };
    let server = Server::start(Arc::new(net.transport("s")), &"s@mem".parse().unwrap(), handler, scfg).await.unwrap();
    let ccfg = ClientConfig { at: fast_at(300), max_resends: 0, ..ClientConfig::default() };
    let import = Client::new(Arc::new(net.transport("c")), ccfg).connect(&server.nid()).await.unwrap();
    let boom = {
        let imp = import.clone();
        tokio::spawn(async move { imp.call(OP_BOOM, b"x", &[]).await })
    };
    // The request queued behind it waits through the panic (with RUST_BACKTRACE set, the
    // backtrace is printed first, which under a loaded test run took longer than the
    // panicked request's 300 ms), so it comes from a client that waits seconds.
    let patient = ClientConfig { at: fast_at(5_000), max_resends: 0, ..ClientConfig::default() };
    let after = Client::new(Arc::new(net.transport("c2")), patient).connect(&server.nid()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Queued behind the panicking request on the one service slot.
    assert_eq!(after.call(OP_ECHO, b"after", &[]).await.unwrap().body, b"after");
    assert!(boom.await.unwrap().is_err(), "the panicked request gets no reply");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_mid_frame_never_feeds_garbage_to_the_server() {
    let bad = Arc::new(AtomicU64::new(0));
    let b = bad.clone();
    // Every bulk is one repeated byte; anything else was stitched from two frames.
    let handler: Handler = Arc::new(move |req| {
        let b = b.clone();
        Box::pin(async move {
            if req.bulk.first().is_some_and(|&x| req.bulk.iter().any(|&y| y != x)) {
                b.fetch_add(1, Ordering::SeqCst);
            }
            Reply { body: req.body, ..Reply::default() }
        })
    });
    let net = MemNetwork::new();
    let server =
        Server::start(Arc::new(net.transport("s")), &"s@mem".parse().unwrap(), handler, ServerConfig::default())
            .await
            .unwrap();
    let import =
        Client::new(Arc::new(net.transport("c")), ClientConfig::default()).connect(&server.nid()).await.unwrap();
    for i in 0..20u8 {
        let big = vec![i; 8 << 20];
        let _ = tokio::time::timeout(Duration::from_micros(300), import.call(OP_ECHO, b"big", &big)).await;
        let small = vec![i.wrapping_add(100); 4096];
        assert_eq!(import.call(OP_ECHO, &[i], &small).await.unwrap().body, [i]);
    }
    assert_eq!(bad.load(Ordering::SeqCst), 0, "no request was stitched from two frames");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_is_final_and_the_pinger_stops() {
    let probe = Arc::new(Probe::default());
    let ccfg = ClientConfig { obd_timeout: Duration::from_millis(200), ..ClientConfig::default() };
    let (server, client, import) = mem_pair(ccfg, ServerConfig::default(), probe, Duration::ZERO).await;
    import.disconnect().await.unwrap();
    assert_eq!(server.stats().exports, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.stats().exports, 0, "no ping brought the export back");
    assert!(matches!(import.call(OP_ECHO, b"x", &[]).await, Err(RpcError::Closed)));
    // The same client can connect again: a new import.
    drop(import);
    let again = client.connect(&server.nid()).await.unwrap();
    assert_eq!(again.call(OP_ECHO, b"y", &[]).await.unwrap().body, b"y");
}
