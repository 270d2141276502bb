//! `nacre net selftest`: Nacre's lnet_selftest. Bulk write RPCs of 1, 4 and 16 MiB and small
//! ping RPCs over loopback, each against the same pattern over plain TCP sockets in the
//! same run (the raw reference): a 48-byte header and the payload one way, a 48-byte
//! answer back. Figures are GB/s of payload and RPC/s; every ratio is Nacre over raw.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nacre_net::frame::{FrameLimits, HEADER_BYTES};
use nacre_net::rpc::{ClientOptions, Handler, RpcClient, RpcServer, ServerOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::raid::BenchError;

/// What to run.
#[derive(Debug, Clone)]
pub struct SelftestOptions {
    /// Seconds per phase.
    pub seconds: f64,
    /// Concurrent clients (connections) in the bulk phases.
    pub bulk_clients: usize,
    /// Concurrent clients in the ping phase.
    pub ping_clients: usize,
}

impl Default for SelftestOptions {
    fn default() -> Self {
        SelftestOptions { seconds: 2.0, bulk_clients: 4, ping_clients: 8 }
    }
}

const OP_PING: u16 = 1;
const OP_WRITE: u16 = 2;

fn sink() -> Handler {
    // Bulk arrives in the request; the reply carries nothing back.
    Arc::new(|_frame| Box::pin(async move { (0, Vec::new(), Vec::new()) }))
}

/// Run `clients` client loops until `secs` have passed; each returns how many round trips
/// it made. Returns the total and the elapsed seconds.
async fn clients<F, Fut, E>(clients: usize, secs: f64, client: F) -> Result<(u64, f64), BenchError>
where
    F: Fn(Instant) -> Fut,
    Fut: std::future::Future<Output = Result<u64, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    for _ in 0..clients {
        set.spawn(client(deadline));
    }
    let mut total = 0;
    while let Some(r) = set.join_next().await {
        total += r.map_err(|e| BenchError::Bad(e.to_string()))?.map_err(|e| BenchError::Bad(e.to_string()))?;
    }
    Ok((total, start.elapsed().as_secs_f64()))
}

/// Nacre RPC phase: `clients` connections, each sending `bulk`-byte requests back to back.
async fn rpc_phase(addr: SocketAddr, n: usize, bulk: usize, secs: f64) -> Result<(u64, f64), BenchError> {
    let payload = Arc::new(vec![0x5au8; bulk]);
    clients(n, secs, move |deadline| {
        let payload = payload.clone();
        async move {
            let opts = ClientOptions { max_rpcs_in_flight: 1, ..ClientOptions::default() };
            let c = RpcClient::connect(addr, opts).await?;
            let op = if payload.is_empty() { OP_PING } else { OP_WRITE };
            let mut done = 0u64;
            while Instant::now() < deadline {
                c.call(op, &[], &payload).await?;
                done += 1;
            }
            Ok::<u64, nacre_net::rpc::RpcError>(done)
        }
    })
    .await
}

/// The raw reference: a 48-byte header plus the payload one way, a 48-byte answer back.
async fn raw_server(listener: TcpListener) {
    let mut conns = tokio::task::JoinSet::new();
    while let Ok((mut s, _)) = listener.accept().await {
        let _ = s.set_nodelay(true);
        conns.spawn(async move {
            let mut hdr = [0u8; HEADER_BYTES];
            // The payload lands in a buffer of its full size, as a server that keeps the
            // data must; it is reused, so the reference pays no allocation at all.
            let mut buf = Vec::new();
            loop {
                if s.read_exact(&mut hdr).await.is_err() {
                    return;
                }
                let len = u32::from_le_bytes([hdr[28], hdr[29], hdr[30], hdr[31]]) as usize;
                if len > 16 << 20 {
                    return;
                }
                buf.resize(len, 0);
                if s.read_exact(&mut buf).await.is_err() {
                    return;
                }
                if s.write_all(&hdr).await.is_err() {
                    return;
                }
            }
        });
        while conns.try_join_next().is_some() {}
    }
}

async fn raw_phase(addr: SocketAddr, n: usize, bulk: usize, secs: f64) -> Result<(u64, f64), BenchError> {
    let payload = Arc::new(vec![0x5au8; bulk]);
    clients(n, secs, move |deadline| {
        let payload = payload.clone();
        async move {
            let mut s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            let mut hdr = [0u8; HEADER_BYTES];
            hdr[28..32].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            let mut answer = [0u8; HEADER_BYTES];
            let mut done = 0u64;
            while Instant::now() < deadline {
                s.write_all(&hdr).await?;
                s.write_all(&payload).await?;
                s.read_exact(&mut answer).await?;
                done += 1;
            }
            Ok::<u64, std::io::Error>(done)
        }
    })
    .await
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { (a / b * 1000.0).round() / 1000.0 } else { 0.0 }
}

/// Run every phase; prints a table, returns the figures.
pub async fn run_selftest(o: &SelftestOptions, out: &mut (dyn std::io::Write + Send)) -> Result<Value, BenchError> {
    let loopback: SocketAddr = "127.0.0.1:0".parse().map_err(|_| BenchError::Bad("loopback address".into()))?;
    let opts =
        ServerOptions { limits: FrameLimits { body_max: 64 << 10, bulk_max: 16 << 20 }, ..ServerOptions::default() };
    let server = RpcServer::bind(loopback, sink(), opts).await.map_err(|e| BenchError::Bad(e.to_string()))?;
    let raw = TcpListener::bind(loopback).await?;
    let raw_addr = raw.local_addr()?;
    let raw_task = tokio::spawn(raw_server(raw));
    let _ = writeln!(
        out,
        "nacre net selftest: loopback, {} s per phase, {} bulk clients, {} ping clients, each against plain sockets",
        o.seconds, o.bulk_clients, o.ping_clients
    );
    let mut table = String::from("\n| test | nacre | raw sockets | ratio |\n|---|---:|---:|---:|\n");
    let mut figures = serde_json::Map::new();
    for (label, mib) in [("1m", 1usize), ("4m", 4), ("16m", 16)] {
        let bytes = mib << 20;
        let (n, t) = rpc_phase(server.local_addr(), o.bulk_clients, bytes, o.seconds).await?;
        let (rn, rt) = raw_phase(raw_addr, o.bulk_clients, bytes, o.seconds).await?;
        let (gbps, raw_gbps) = ((n as f64 * bytes as f64) / t / 1e9, (rn as f64 * bytes as f64) / rt / 1e9);
        let _ = writeln!(
            table,
            "| bulk write {mib} MiB (GB/s) | {gbps:.2} | {raw_gbps:.2} | {:.3} |",
            ratio(gbps, raw_gbps)
        );
        figures.insert(format!("bulk_gbps_{label}"), json!(gbps));
        figures.insert(format!("raw_bulk_gbps_{label}"), json!(raw_gbps));
        figures.insert(format!("bulk_ratio_{label}"), json!(ratio(gbps, raw_gbps)));
    }
    let (n, t) = rpc_phase(server.local_addr(), o.ping_clients, 0, o.seconds).await?;
    let (rn, rt) = raw_phase(raw_addr, o.ping_clients, 0, o.seconds).await?;
    let (rate, raw_rate) = (n as f64 / t, rn as f64 / rt);
    let _ = writeln!(
        table,
        "| ping, {} clients (RPC/s) | {rate:.0} | {raw_rate:.0} | {:.3} |",
        o.ping_clients,
        ratio(rate, raw_rate)
    );
    figures.insert("ping_rpcs".into(), json!(rate));
    figures.insert("raw_ping_rpcs".into(), json!(raw_rate));
    figures.insert("ping_ratio".into(), json!(ratio(rate, raw_rate)));
    raw_task.abort();
    let _ = write!(out, "{table}");
    figures.insert("bench".into(), json!("net-selftest"));
    figures.insert("seconds_per_phase".into(), json!(o.seconds));
    Ok(Value::Object(figures))
}
