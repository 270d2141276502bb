//! RPC over loopback TCP: bulk payloads come back byte for byte, in-flight requests stay
//! under `max_rpcs_in_flight`, a flood stays under `req_buffers_max` on the server and
//! still completes, and a peer sending garbage is cut off without harming the others.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use nacre_net::rpc::{ClientOptions, Handler, RpcClient, RpcError, RpcServer, ServerOptions};
use tokio::io::AsyncWriteExt;

fn echo(active: Arc<AtomicI64>, peak: Arc<AtomicI64>, delay: Duration) -> Handler {
    Arc::new(move |frame| {
        let (active, peak) = (active.clone(), peak.clone());
        Box::pin(async move {
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            active.fetch_sub(1, Ordering::SeqCst);
            (0, frame.body, frame.bulk.into_vec())
        })
    })
}

fn loopback() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_payloads_round_trip_exactly() {
    let (a, p) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let server = RpcServer::bind(loopback(), echo(a, p, Duration::ZERO), ServerOptions::default()).await.unwrap();
    let client = RpcClient::connect(server.local_addr(), ClientOptions::default()).await.unwrap();
    for size in [0usize, 1, 4096, 1 << 20, 16 << 20] {
        let bulk: Vec<u8> = (0..size).map(|i| (i * 131 + size) as u8).collect();
        let reply = client.call(7, b"hello", &bulk).await.unwrap();
        assert_eq!(reply.header.opcode, 7);
        assert_eq!(reply.body, b"hello");
        assert!(*reply.bulk == bulk, "{size}-byte bulk came back different");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_and_request_buffers_stay_bounded_under_a_flood() {
    let (active, peak) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let opts = ServerOptions { req_buffers_max: 4, ..ServerOptions::default() };
    let server =
        RpcServer::bind(loopback(), echo(active.clone(), peak.clone(), Duration::from_millis(2)), opts).await.unwrap();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let o = ClientOptions { max_rpcs_in_flight: 8, ..ClientOptions::default() };
        clients.push(Arc::new(RpcClient::connect(server.local_addr(), o).await.unwrap()));
    }
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..400u32 {
        let c = clients[i as usize % 4].clone();
        calls.spawn(async move { c.call(1, &i.to_le_bytes(), &[]).await.map(|r| (i, r)) });
    }
    let mut answered = 0;
    while let Some(r) = calls.join_next().await {
        let (i, reply) = r.unwrap().unwrap();
        assert_eq!(reply.body, i.to_le_bytes(), "reply matched to the wrong request");
        answered += 1;
    }
    assert_eq!(answered, 400, "every request answered");
    assert!(peak.load(Ordering::SeqCst) <= 4, "handled {} at once with 4 buffers", peak.load(Ordering::SeqCst));
    // A handler gives its buffer back just after its reply is written; idle connections
    // hold none.
    for _ in 0..100 {
        if server.buffers_in_use() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.buffers_in_use(), 0, "idle connections hold no request buffer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_sending_garbage_is_cut_off_and_others_go_on() {
    let (a, p) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let server = RpcServer::bind(loopback(), echo(a, p, Duration::ZERO), ServerOptions::default()).await.unwrap();
    let good = RpcClient::connect(server.local_addr(), ClientOptions::default()).await.unwrap();
    let mut bad = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    bad.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n---------------------------").await.unwrap();
    // The server closes the garbage connection: reading it ends.
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut bad, &mut buf))
        .await
        .expect("server closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert_eq!(good.call(3, b"still here", &[]).await.unwrap().body, b"still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_times_out_and_a_dead_one_closes() {
    let (a, p) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let server =
        RpcServer::bind(loopback(), echo(a, p, Duration::from_secs(5)), ServerOptions::default()).await.unwrap();
    let o = ClientOptions { timeout: Duration::from_millis(100), ..ClientOptions::default() };
    let client = RpcClient::connect(server.local_addr(), o).await.unwrap();
    assert!(matches!(client.call(1, b"x", &[]).await, Err(RpcError::Timeout { .. })));
    drop(server);
    let err = client.call(1, b"x", &[]).await.unwrap_err();
    assert!(matches!(err, RpcError::Closed | RpcError::Io(_) | RpcError::Timeout { .. }), "{err}");
}
