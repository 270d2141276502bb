//! `nacre net selftest`: Nacre's lnet_selftest. Bulk write and read RPCs of 1, 4 and 16 MiB
//! and small RPCs from 8 clients over loopback, each against the same pattern over plain
//! TCP sockets in the same run (the raw reference): a header of a frame's size and the payload one
//! way, such a header (and the payload, for reads) back. Figures are GB/s of payload and
//! RPC/s, latency percentiles, and the credit low-water marks of both ends; every ratio is
//! Nacre over raw.
//!
//! With `clients > 0` it also runs the 20,000-client lesson at this machine's scale: that
//! many simulated clients (each its own identity and connection, in a child process so
//! that each process stays within its descriptor limit) connect to one server, ping and
//! send small RPCs for the phase, and the server's memory, credits and unanswered requests
//! are reported.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::credits::CreditStats;
use nacre_net::frame::HEADER_BYTES;
use nacre_net::nid::Nid;
use nacre_net::rpc::{FIRST_SERVICE_OPCODE, RpcError};
use nacre_net::server::{Handler, Reply, Server, ServerConfig};
use nacre_net::transport::TcpTransport;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::raid::BenchError;

/// What to run.
#[derive(Debug, Clone)]
pub struct SelftestOptions {
    /// Seconds per phase and round.
    pub seconds: f64,
    /// Rounds: each phase runs Nacre then raw this many times, interleaved, and the best
    /// of each side is kept (the machine's noise moves single runs by 20–30%).
    pub rounds: usize,
    /// Concurrent clients in the bulk phases.
    pub bulk_clients: usize,
    /// Bulk RPC sizes in bytes (figures are named by size: `bulk_ratio_1m`, `_64k`).
    pub bulk_sizes: Vec<usize>,
    /// Concurrent clients in the small-RPC phase.
    pub ping_clients: usize,
    /// Run the plain-socket reference (ratios need it).
    pub raw: bool,
    /// Simulated clients for the scale phase (0: skip it).
    pub clients: usize,
    /// The program that runs `net sim-clients` (the `nacre` binary).
    pub sim_program: Option<PathBuf>,
    /// A running `nacre net serve` to test instead of a server started here; its
    /// plain-socket reference listens on the next port.
    pub target: Option<Nid>,
}

impl Default for SelftestOptions {
    fn default() -> Self {
        SelftestOptions {
            seconds: 1.0,
            rounds: 3,
            bulk_clients: 4,
            bulk_sizes: vec![1 << 20, 4 << 20, 16 << 20],
            ping_clients: 8,
            raw: true,
            clients: 0,
            sim_program: None,
            target: None,
        }
    }
}

/// The selftest service: sink (bulk write), source (bulk read), noop (small RPC).
const OP_SINK: u16 = FIRST_SERVICE_OPCODE;
const OP_SOURCE: u16 = FIRST_SERVICE_OPCODE + 1;
const OP_NOOP: u16 = FIRST_SERVICE_OPCODE + 2;
const BULK_MAX: usize = 16 << 20;

/// The handler of the selftest service. Reads are answered from one shared 16 MiB buffer
/// (a slice of it per reply, no copy), as a server answers from its cache.
pub fn selftest_handler() -> Handler {
    let source = Bytes::from(vec![0xa5u8; BULK_MAX]);
    Arc::new(move |req| {
        let source = source.clone();
        Box::pin(async move {
            match req.header.opcode {
                OP_SINK | OP_NOOP => Reply::default(),
                OP_SOURCE => {
                    let len = req.body.get(..4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
                    if len > BULK_MAX {
                        return Reply { status: -22, ..Reply::default() };
                    }
                    Reply { bulk: source.slice(..len), ..Reply::default() }
                }
                _ => Reply { status: -95, ..Reply::default() },
            }
        })
    })
}

/// Start the selftest service on `nid` (port 0: any free one).
pub async fn start_server(nid: &Nid) -> Result<Server, BenchError> {
    let cfg = ServerConfig::default();
    Server::start(Arc::new(TcpTransport), nid, selftest_handler(), cfg)
        .await
        .map_err(|e| BenchError::Bad(e.to_string()))
}

/// What one phase measured.
struct Phase {
    ops: u64,
    secs: f64,
    /// Latency of every call, microseconds.
    lat: Vec<u32>,
}

impl Phase {
    fn rate(&self) -> f64 {
        if self.secs > 0.0 { self.ops as f64 / self.secs } else { 0.0 }
    }

    fn percentile(&mut self, p: f64) -> f64 {
        if self.lat.is_empty() {
            return 0.0;
        }
        self.lat.sort_unstable();
        let i = ((self.lat.len() as f64 - 1.0) * p).round() as usize;
        self.lat[i.min(self.lat.len() - 1)] as f64
    }
}

/// Run `n` client loops until `secs` have passed; each returns its call latencies.
async fn clients<F, Fut, E>(n: usize, secs: f64, client: F) -> Result<Phase, BenchError>
where
    F: Fn(Instant) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<u32>, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    for _ in 0..n {
        set.spawn(client(deadline));
    }
    let mut lat = Vec::new();
    while let Some(r) = set.join_next().await {
        lat.extend(r.map_err(|e| BenchError::Bad(e.to_string()))?.map_err(|e| BenchError::Bad(e.to_string()))?);
    }
    Ok(Phase { ops: lat.len() as u64, secs: start.elapsed().as_secs_f64(), lat })
}

/// What a client loop sends.
#[derive(Clone, Copy)]
enum Pattern {
    Write(usize),
    Read(usize),
    Small,
}

/// Nacre RPC phase: `n` clients, each its own endpoint, sending back to back.
async fn rpc_phase(target: &Nid, n: usize, pattern: Pattern, secs: f64, lows: &Lows) -> Result<Phase, BenchError> {
    let mut imports = Vec::new();
    for _ in 0..n {
        let c = Client::new(Arc::new(TcpTransport), ClientConfig::default());
        let imp = c.connect(target).await.map_err(|e| BenchError::Bad(format!("connect to {target}: {e}")))?;
        imports.push((c, imp));
    }
    let payload = Arc::new(match pattern {
        Pattern::Write(b) => vec![0x5au8; b],
        _ => Vec::new(),
    });
    let queue = Arc::new(std::sync::Mutex::new(imports.iter().map(|(_, i)| i.clone()).collect::<Vec<Arc<Import>>>()));
    let phase = clients(n, secs, move |deadline| {
        let (payload, queue) = (payload.clone(), queue.clone());
        async move {
            let imp = queue.lock().unwrap_or_else(|e| e.into_inner()).pop().ok_or(RpcError::Closed)?;
            let (op, body) = match pattern {
                Pattern::Write(_) => (OP_SINK, Vec::new()),
                Pattern::Read(b) => (OP_SOURCE, (b as u32).to_le_bytes().to_vec()),
                Pattern::Small => (OP_NOOP, Vec::new()),
            };
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let r = imp.call(op, &body, &payload).await?;
                if let Pattern::Read(b) = pattern
                    && r.bulk.len() != b
                {
                    return Err(RpcError::Protocol(format!("read {} bytes of {b}", r.bulk.len())));
                }
                lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
            Ok::<Vec<u32>, RpcError>(lat)
        }
    })
    .await?;
    for (c, imp) in &imports {
        lows.client_ni.merge(c.credit_stats());
        lows.client_peer.merge(imp.stats().peer_credits);
    }
    Ok(phase)
}

/// Lowest credit counters seen.
struct Lows {
    client_ni: Low,
    client_peer: Low,
}

/// The pool with the lowest low-water mark seen.
struct Low(std::sync::Mutex<Option<CreditStats>>);

impl Low {
    fn new() -> Low {
        Low(std::sync::Mutex::new(None))
    }
    fn merge(&self, s: CreditStats) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if m.is_none_or(|o| s.min_available < o.min_available) {
            *m = Some(s);
        }
    }
    fn get(&self) -> Option<CreditStats> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The raw reference server: a header, the `bulk_len` payload it announces, then a header
/// back followed by `timeout_ms` bytes (the read length) from a shared buffer.
pub async fn raw_server(listener: TcpListener) {
    let source = Arc::new(vec![0xa5u8; BULK_MAX]);
    let mut conns = tokio::task::JoinSet::new();
    while let Ok((mut s, _)) = listener.accept().await {
        let _ = s.set_nodelay(true);
        let source = source.clone();
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
                let read = u32::from_le_bytes([hdr[40], hdr[41], hdr[42], hdr[43]]) as usize;
                if len > BULK_MAX || read > BULK_MAX {
                    return;
                }
                buf.resize(len, 0);
                if s.read_exact(&mut buf).await.is_err() || s.write_all(&hdr).await.is_err() {
                    return;
                }
                if read > 0 && s.write_all(&source[..read]).await.is_err() {
                    return;
                }
            }
        });
        while conns.try_join_next().is_some() {}
    }
}

async fn raw_phase(addr: SocketAddr, n: usize, pattern: Pattern, secs: f64) -> Result<Phase, BenchError> {
    let (write, read) = match pattern {
        Pattern::Write(b) => (b, 0),
        Pattern::Read(b) => (0, b),
        Pattern::Small => (0, 0),
    };
    let payload = Arc::new(vec![0x5au8; write]);
    clients(n, secs, move |deadline| {
        let payload = payload.clone();
        async move {
            let mut s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            let mut hdr = [0u8; HEADER_BYTES];
            hdr[28..32].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            hdr[40..44].copy_from_slice(&(read as u32).to_le_bytes());
            let mut answer = [0u8; HEADER_BYTES];
            let mut data = vec![0u8; read];
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                s.write_all(&hdr).await?;
                s.write_all(&payload).await?;
                s.read_exact(&mut answer).await?;
                s.read_exact(&mut data).await?;
                lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
            Ok::<Vec<u32>, std::io::Error>(lat)
        }
    })
    .await
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { (a / b * 1000.0).round() / 1000.0 } else { 0.0 }
}

/// A size as the table shows it and as figure names carry it: (`1 MiB`, `1m`),
/// (`64 KiB`, `64k`), (`100000 B`, `100000b`).
fn size_label(b: usize) -> (String, String) {
    if b.is_multiple_of(1 << 20) {
        (format!("{} MiB", b >> 20), format!("{}m", b >> 20))
    } else if b.is_multiple_of(1024) {
        (format!("{} KiB", b >> 10), format!("{}k", b >> 10))
    } else {
        (format!("{b} B"), format!("{b}b"))
    }
}

/// `bulk_1m` → `bulk_ratio_1m`, `ping` → `ping_ratio`.
fn ratio_key(key: &str) -> String {
    match key.split_once('_') {
        Some((a, b)) => format!("{a}_ratio_{b}"),
        None => format!("{key}_ratio"),
    }
}

fn low_text(s: Option<CreditStats>) -> String {
    s.map_or("-".into(), |s| format!("{} of {}", s.min_available, s.max))
}

/// Run every phase; prints a table, returns the figures.
pub async fn run_selftest(o: &SelftestOptions, out: &mut (dyn std::io::Write + Send)) -> Result<Value, BenchError> {
    let loopback: SocketAddr = "127.0.0.1:0".parse().map_err(|_| BenchError::Bad("loopback address".into()))?;
    // The server: ours, or the one named by --target (then only its client-side figures).
    let (server, target, raw_addr, raw_task) = match &o.target {
        Some(t @ Nid::Tcp(addr)) => {
            let raw = SocketAddr::new(addr.ip(), addr.port().wrapping_add(1));
            (None, t.clone(), raw, None)
        }
        Some(other) => return Err(BenchError::Bad(format!("selftest targets tcp NIDs, not {other}"))),
        None => {
            let server = start_server(&Nid::Tcp(loopback)).await?;
            let target = server.nid();
            let raw = TcpListener::bind(loopback).await?;
            let raw_addr = raw.local_addr()?;
            (Some(server), target, raw_addr, Some(tokio::spawn(raw_server(raw))))
        }
    };
    let _ = writeln!(
        out,
        "nacre net selftest: server {target}, {} rounds of {} s per phase (best kept), {} bulk clients, {} small-RPC clients{}",
        o.rounds,
        o.seconds,
        o.bulk_clients,
        o.ping_clients,
        if o.raw { ", each against plain sockets" } else { "" }
    );
    let lows = Lows { client_ni: Low::new(), client_peer: Low::new() };
    let mut table = String::from(
        "\n| test | nacre | raw sockets | ratio | nacre p50 / p99 µs | raw p50 / p99 µs |\n|---|---:|---:|---:|---:|---:|\n",
    );
    let mut figures = serde_json::Map::new();
    let mut phases: Vec<(String, String, Pattern, usize, f64)> = Vec::new();
    for read in [false, true] {
        for &b in &o.bulk_sizes {
            let (kind, key, pattern) =
                if read { ("read", "read", Pattern::Read(b)) } else { ("write", "bulk", Pattern::Write(b)) };
            let (title, label) = size_label(b);
            phases.push((
                format!("bulk {kind} {title} (GB/s)"),
                format!("{key}_{label}"),
                pattern,
                o.bulk_clients,
                b as f64,
            ));
        }
    }
    phases.push((
        format!("small RPC, {} clients (RPC/s)", o.ping_clients),
        "ping".into(),
        Pattern::Small,
        o.ping_clients,
        0.0,
    ));
    for (title, key, pattern, n, bytes) in phases {
        let (mut best, mut best_raw): (Option<Phase>, Option<Phase>) = (None, None);
        for _ in 0..o.rounds.max(1) {
            let p = rpc_phase(&target, n, pattern, o.seconds, &lows).await?;
            if best.as_ref().is_none_or(|b| p.rate() > b.rate()) {
                best = Some(p);
            }
            if o.raw {
                let r = raw_phase(raw_addr, n, pattern, o.seconds).await?;
                if best_raw.as_ref().is_none_or(|b| r.rate() > b.rate()) {
                    best_raw = Some(r);
                }
            }
        }
        let mut p = best.ok_or_else(|| BenchError::Bad("no round ran".into()))?;
        let scale = |r: f64| if bytes > 0.0 { r * bytes / 1e9 } else { r };
        let v = scale(p.rate());
        let (p50, p99) = (p.percentile(0.5), p.percentile(0.99));
        let (rv, rp50, rp99) = match best_raw {
            Some(mut r) => (scale(r.rate()), r.percentile(0.5), r.percentile(0.99)),
            None => (0.0, 0.0, 0.0),
        };
        let fmt = |x: f64| if bytes > 0.0 { format!("{x:.2}") } else { format!("{x:.0}") };
        let _ = writeln!(
            table,
            "| {title} | {} | {} | {:.3} | {p50:.0} / {p99:.0} | {rp50:.0} / {rp99:.0} |",
            fmt(v),
            if o.raw { fmt(rv) } else { "-".into() },
            ratio(v, rv)
        );
        let unit = if bytes > 0.0 { "gbps" } else { "rpcs" };
        figures.insert(format!("{key}_{unit}"), json!(v));
        figures.insert(format!("{key}_p50_us"), json!(p50));
        figures.insert(format!("{key}_p99_us"), json!(p99));
        if o.raw {
            figures.insert(format!("raw_{key}_{unit}"), json!(rv));
            figures.insert(ratio_key(&key), json!(ratio(v, rv)));
        }
    }
    if let Some(t) = raw_task {
        t.abort();
    }
    let _ = write!(out, "{table}");
    let (cni, cpeer) = (lows.client_ni.get(), lows.client_peer.get());
    let server_lows = match &server {
        Some(server) => {
            let s = server.stats();
            figures.insert("server_credits_min".into(), json!(s.credits.min_available));
            figures.insert("server_peer_credits_min".into(), json!(s.peer_credits_min));
            figures.insert("req_buffers_peak".into(), json!(s.req_buffers_peak));
            format!(
                "server interface {}, server peer {} of {}, ",
                low_text(Some(s.credits)),
                s.peer_credits_min,
                ServerConfig::default().peer_credits
            )
        }
        None => String::new(),
    };
    let _ = writeln!(
        out,
        "\ncredit low-water marks (negative: senders queued): {server_lows}client interface {}, client peer {}",
        low_text(cni),
        low_text(cpeer)
    );
    figures.insert("client_credits_min".into(), json!(cni.map(|c| c.min_available)));
    figures.insert("client_peer_credits_min".into(), json!(cpeer.map(|c| c.min_available)));
    drop(server);
    if o.clients > 0 {
        let sim = run_scale(o, out).await?;
        if let Value::Object(m) = sim {
            figures.extend(m);
        }
    }
    figures.insert("bench".into(), json!("net-selftest"));
    figures.insert("seconds_per_phase".into(), json!(o.seconds));
    figures.insert("rounds".into(), json!(o.rounds));
    Ok(Value::Object(figures))
}

/// Resident and peak resident memory of this process, MiB.
pub(crate) fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The scale phase: a fresh server (or the --target one, then with client-side figures
/// only), `clients` simulated clients in a child process.
async fn run_scale(o: &SelftestOptions, out: &mut (dyn std::io::Write + Send)) -> Result<Value, BenchError> {
    let program = o.sim_program.clone().ok_or_else(|| BenchError::Bad("no program to run simulated clients".into()))?;
    let cfg = ServerConfig { obd_timeout: SIM_OBD_TIMEOUT, ..ServerConfig::default() };
    let (req_buffers_max, peer_credits) = (cfg.req_buffers_max, cfg.peer_credits);
    let server = match &o.target {
        Some(_) => None,
        None => {
            let nid = Nid::Tcp(SocketAddr::from(([127, 0, 0, 1], 0)));
            let s = Server::start(Arc::new(TcpTransport), &nid, selftest_handler(), cfg);
            Some(s.await.map_err(|e| BenchError::Bad(e.to_string()))?)
        }
    };
    let target = match (&server, &o.target) {
        (Some(s), _) => s.nid(),
        (None, Some(t)) => t.clone(),
        (None, None) => return Err(BenchError::Bad("no server to test".into())),
    };
    let (rss_before, _) = rss_mib();
    let secs = o.seconds.max(SIM_MIN_SECONDS);
    let _ = writeln!(
        out,
        "\nscale: {} simulated clients against {target} for {secs:.0} s (clients in a child process)",
        o.clients
    );
    let mut child = std::process::Command::new(&program)
        .args(["net", "sim-clients", "--target", &target.to_string(), "--clients", &o.clients.to_string()])
        .args(["--seconds", &secs.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| BenchError::Bad(format!("cannot start {}: {e}", program.display())))?;
    let stdout = child.stdout.take();
    let reader = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        if let Some(mut s) = stdout {
            let _ = std::io::Read::read_to_string(&mut s, &mut text);
        }
        let status = child.wait();
        (text, status)
    });
    let (mut rss_peak, mut exports_peak, mut conns_peak) = (rss_before, 0usize, 0usize);
    let mut credits_ok = true;
    while !reader.is_finished() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(server) = &server {
            let s = server.stats();
            rss_peak = rss_peak.max(rss_mib().0);
            exports_peak = exports_peak.max(s.exports);
            conns_peak = conns_peak.max(s.connections);
            credits_ok &= s.credits.available <= s.credits.max as i64
                && s.req_buffers_in_use <= req_buffers_max
                && s.req_buffers_peak <= req_buffers_max;
        }
    }
    let (text, status) = reader.await.map_err(|e| BenchError::Bad(e.to_string()))?;
    let status = status?;
    let line = text.lines().last().unwrap_or("");
    let sim: Value = serde_json::from_str(line)
        .map_err(|e| BenchError::Bad(format!("simulated clients ({status}) printed no result: {e}: {line:?}")))?;
    let requests = sim["requests"].as_u64().unwrap_or(0);
    let answered = sim["answered"].as_u64().unwrap_or(0);
    let connected = sim["connected"].as_u64().unwrap_or(0);
    let unanswered = requests.saturating_sub(answered) + (o.clients as u64).saturating_sub(connected);
    let _ = writeln!(
        out,
        "scale: {connected} of {} clients connected, {requests} requests, {answered} answered",
        o.clients
    );
    let mut figures = json!({
        "clients": o.clients,
        "clients_connected": connected,
        "sim_requests": requests,
        "sim_answered": answered,
        "sim_rpcs": sim["rpcs"],
        "sim_p99_us": sim["p99_us"],
        "sim_resends": sim["resends"],
        "sim_first_errors": sim["first_errors"],
        "unanswered": unanswered,
    });
    if let (Some(server), Value::Object(m)) = (&server, &mut figures) {
        let s = server.stats();
        let _ = writeln!(
            out,
            "scale: server peak {conns_peak} connections and {exports_peak} clients, {} pings, RSS {rss_peak:.0} MiB at most (before {rss_before:.0} MiB), request buffers peak {} of {req_buffers_max}, lowest peer credit {} of {peer_credits}, evictions {}",
            s.pings, s.req_buffers_peak, s.peer_credits_min, s.evictions
        );
        m.insert("connections_peak".into(), json!(conns_peak));
        m.insert("server_pings".into(), json!(s.pings));
        m.insert("server_rss_mib".into(), json!((rss_peak * 10.0).round() / 10.0));
        m.insert("server_rss_before_mib".into(), json!((rss_before * 10.0).round() / 10.0));
        m.insert("credits_within_bounds".into(), json!(credits_ok));
        m.insert("scale_req_buffers_peak".into(), json!(s.req_buffers_peak));
        m.insert("server_evictions".into(), json!(s.evictions));
    }
    Ok(figures)
}

/// Health intervals of the scale phase: pings every 2 s when idle.
const SIM_OBD_TIMEOUT: Duration = Duration::from_secs(8);
const SIM_MIN_SECONDS: f64 = 10.0;
/// Connects in progress at once (the listen backlog is 1024).
const SIM_CONNECTS_AT_ONCE: usize = 256;

/// `nacre net sim-clients`: `n` clients, each its own identity and connection, each
/// sending one small RPC at a random moment of every 2 s for `secs` (pings fill the idle
/// gaps). Prints one JSON line.
pub async fn run_client_sim(target: &Nid, n: usize, secs: f64) -> Result<Value, BenchError> {
    let cfg = ClientConfig { obd_timeout: SIM_OBD_TIMEOUT, max_rpcs_in_flight: 1, ..ClientConfig::default() };
    let gate = Arc::new(tokio::sync::Semaphore::new(SIM_CONNECTS_AT_ONCE));
    let (requests, answered, connected) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let resends = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (cfg, gate, target) = (cfg.clone(), gate.clone(), target.clone());
        let (requests, answered, connected, resends) =
            (requests.clone(), answered.clone(), connected.clone(), resends.clone());
        let errors = errors.clone();
        set.spawn(async move {
            let client = Client::new(Arc::new(TcpTransport), cfg);
            let import = {
                let _g = gate.acquire().await.ok()?;
                client.connect(&target).await.ok()?
            };
            connected.fetch_add(1, Ordering::Relaxed);
            let mut lat = Vec::new();
            let mut rng = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            while Instant::now() < end {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                tokio::time::sleep(Duration::from_millis(rng % 2000)).await;
                if Instant::now() >= end {
                    break;
                }
                requests.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                match import.call(OP_NOOP, &[], &[]).await {
                    Ok(_) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                        lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    }
                    Err(e) => {
                        let mut errs = errors.lock().unwrap_or_else(|e| e.into_inner());
                        if errs.len() < 5 {
                            errs.push(e.to_string());
                        }
                    }
                }
            }
            resends.fetch_add(import.stats().resends, Ordering::Relaxed);
            Some((lat, client, import))
        });
    }
    let mut lat = Vec::new();
    let mut keep = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(Some((l, c, i))) = r {
            lat.extend(l);
            keep.push((c, i));
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut p = Phase { ops: answered.load(Ordering::Relaxed), secs: elapsed, lat };
    let p99 = p.percentile(0.99);
    for (_, i) in &keep {
        let _ = i.disconnect().await;
    }
    Ok(json!({
        "connected": connected.load(Ordering::Relaxed),
        "requests": requests.load(Ordering::Relaxed),
        "answered": answered.load(Ordering::Relaxed),
        "resends": resends.load(Ordering::Relaxed),
        "rpcs": p.rate(),
        "p99_us": p99,
        "first_errors": *errors.lock().unwrap_or_else(|e| e.into_inner()),
    }))
}
