//! `nacre bench mds`: Nacre's mds-survey. One MDT on a RAID10 volume of file drives,
//! served over loopback TCP to `clients` clients (each its own connection and identity),
//! against the local file system doing the same work with as many threads, in the same
//! run:
//!
//! - create: each client makes `files / clients` empty files in its own directory
//!   (mdtest-easy's pattern); the local reference creates them with as many threads;
//! - stat: each client asks the attributes of each of its files, one RPC each (nothing is
//!   cached on the client), against the transport's own ping RPC at the same concurrency;
//! - setattr: each client changes the mode of each of its files (chmod);
//! - rename: each client renames each of its files within its directory;
//! - unlink: each client removes its files;
//! - mkdir and rmdir: each client makes as many directories, then removes them;
//! - durable create (with `--durable-dir`): drives on that disk and every commit flushed
//!   to the drives, against the local file system creating each file and fsyncing its
//!   directory.
//!
//! Rounds interleave Nacre and the reference and keep the best of each, because these
//! machines are shared and noisy. For the same reason each phase is set against pings
//! measured beside it (a short burst just before and one just after, at the same
//! concurrency), not against one ping phase earlier in the round: the ping rate alone
//! moved from 46K to 80K/s between runs, and every `*_vs_ping_ratio` with it. The
//! bursts' spread is printed and kept (`ping_beside_min_per_s`, `_max_per_s`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::nid::Nid;
use nacre_net::server::{Server, ServerConfig};
use nacre_net::transport::TcpTransport;
use nacre_osd::SyncMode;
use nacre_proto::fid::Fid;
use nacre_proto::layout::Layout;
use nacre_proto::mdt::{self, Creds, Reply, Request, mode};
use nacre_raid::{Level, Volume};
use nacre_server::mds::Mds;
use nacre_server::mdt::{Namespace, NamespaceOptions};
use serde_json::{Value, json};

use crate::raid::{BenchError, create, make_drives, peak, ratio};

#[derive(Debug, Clone)]
pub struct MdsBenchOptions {
    /// Folder of the MDT's drive files (/dev/shm: the CPU-bound case).
    pub dir: PathBuf,
    /// The local file system the reference runs on.
    pub local_dir: PathBuf,
    /// Files per phase, over all clients.
    pub files: u64,
    pub clients: usize,
    pub rounds: usize,
    /// Drives on disk for the durable create phase.
    pub durable_dir: Option<PathBuf>,
    /// The MDT answers a change once it is on the drives (the MDS's default until
    /// clients replay); off, once applied and staged in its log (durable creates always
    /// wait).
    pub sync_on_reply: bool,
}

impl MdsBenchOptions {
    pub fn new(dir: PathBuf) -> MdsBenchOptions {
        MdsBenchOptions {
            dir,
            local_dir: PathBuf::from("/tmp"),
            files: 40_000,
            clients: 8,
            rounds: 3,
            durable_dir: None,
            sync_on_reply: false,
        }
    }
}

pub(crate) fn bad<E: std::fmt::Display>(e: E) -> BenchError {
    BenchError::Bad(e.to_string())
}

/// An MDT served over TCP on loopback.
struct Served {
    server: Server,
    volume: Arc<Volume>,
}

/// Room a file takes on an MDT's drives through one round of a bench (made, used,
/// removed, with a directory and a 3,901-byte DoM file beside it): about 8 KiB of image
/// and log, mirrored over two pairs. A checkpoint writes thousands of changes in one
/// transaction, whose pages redb frees only after it commits, so the image grows past
/// what it holds at rest. A round removes what it made and the image reuses its pages,
/// so the room is one round's whatever the number of rounds (measured: 3 rounds of
/// 40,000 files fit).
pub(crate) const ROUND_BYTES_PER_FILE: u64 = 16 << 10;

/// The changes measured, with their column among the figures of a round.
const CHANGES: [(&str, usize); 8] = [
    ("create", 0),
    ("unlink", 2),
    ("mkdir", 13),
    ("rmdir", 14),
    ("rename", 12),
    ("setattr", 11),
    ("dom_files", 9),
    ("lock_unlock_pairs", 15),
];

/// Bytes of each of the MDT's four drives for `room` bytes of files (at least 64 MiB).
/// The database's file doubles as it grows, so the room is rounded up to a power of two
/// and a quarter more (the log's region and the volume's own): a database of 2^k bytes
/// must still fit its next growth. The drives are written whole when the volume is made:
/// under /dev/shm they take memory.
pub(crate) fn drive_bytes(room: u64) -> u64 {
    (room.next_power_of_two() / 4 * 5).clamp(64 << 20, 4 << 30).div_ceil(1 << 20) << 20
}

/// An MDT's volume: RAID10 over four new drive files of `drive` bytes in `dir`.
pub(crate) fn mdt_volume(dir: &Path, drive: u64) -> Result<Arc<Volume>, BenchError> {
    std::fs::create_dir_all(dir)?;
    Ok(Arc::new(create(&make_drives(dir, 4, drive)?, Level::Raid10, 256 << 10)?))
}

async fn serve(dir: &Path, sync: SyncMode, drive: u64, sync_on_reply: bool) -> Result<Served, BenchError> {
    Ok(serve_mdt(dir, sync, drive, 0, sync_on_reply).await?.0)
}

/// MDT `index` served over loopback TCP.
async fn serve_mdt(
    dir: &Path,
    sync: SyncMode,
    drive: u64,
    index: u32,
    sync_on_reply: bool,
) -> Result<(Served, Arc<Mds>), BenchError> {
    let volume = mdt_volume(dir, drive)?;
    let opts = NamespaceOptions { sync, sync_on_reply, ..NamespaceOptions::default() };
    let ns = tokio::task::block_in_place(|| Namespace::format(volume.clone(), index, opts)).map_err(bad)?;
    let mds = Mds::new(&format!("mdt{index}"), Arc::new(ns));
    let nid: Nid = "127.0.0.1@tcp:0".parse().map_err(bad)?;
    let server =
        Server::start_service(Arc::new(TcpTransport), &nid, mds.handler(), ServerConfig::default(), mds.service())
            .await
            .map_err(bad)?;
    Ok((Served { server, volume }, mds))
}

/// A file system of `n` MDTs over loopback TCP, each knowing the others.
async fn serve_mdts(dir: &Path, drive: u64, n: u32) -> Result<Vec<Served>, BenchError> {
    let mut out = Vec::new();
    let mut mds = Vec::new();
    for i in 0..n {
        let (s, m) = serve_mdt(&dir.join(format!("mdt{i}")), SyncMode::Ordered, drive, i, true).await?;
        out.push(s);
        mds.push(m);
    }
    let nids: std::collections::HashMap<u32, Vec<Nid>> =
        out.iter().enumerate().map(|(i, s)| (i as u32, vec![s.server.nid()])).collect();
    for m in &mds {
        let client = Client::new(Arc::new(TcpTransport), ClientConfig::default());
        m.coordinator().set_peers(n, client, "nacre", nids.clone());
    }
    Ok(out)
}

/// Rates (per second) in one directory shared by every client.
#[derive(Debug, Clone, Copy, Default)]
struct SharedRates {
    create: f64,
    stat: f64,
    /// Entries listed per second, every client listing the whole directory.
    readdir: f64,
    unlink: f64,
    /// 3,901-byte files with their data on the MDT: one create carrying its data each.
    dom: f64,
}

/// One round in a directory shared by every client: striped over every MDT of `mdts`
/// (each name sent to its shard's MDT), or a plain one when there is one MDT. Each
/// client makes `files / clients` names, stats them, lists the whole directory, removes
/// them, then makes as many 3,901-byte DoM files.
async fn shared_dir_round(mdts: &[Served], o: &MdsBenchOptions, round: usize) -> Result<SharedRates, BenchError> {
    let per = (o.files / o.clients as u64).max(1);
    let total = (per * o.clients as u64) as f64;
    let mut conns: Vec<Arc<Vec<Arc<Import>>>> = Vec::new();
    for _ in 0..o.clients {
        let c = Client::new(Arc::new(TcpTransport), ClientConfig::default());
        let mut v = Vec::new();
        for m in mdts {
            v.push(c.connect(&m.server.nid()).await.map_err(bad)?);
        }
        conns.push(Arc::new(v));
    }
    let n = mdts.len() as i32;
    let mut stripes = Vec::new();
    for what in ["shared", "dom"] {
        let mkdir = Request::Mkdir { dir: Fid::ROOT, name: format!("{what}-r{round}"), mode: 0o755, mdt: 0, count: n };
        let dir = match call(&conns[0][0], &mkdir).await? {
            Reply::Attr(a) => a.fid,
            other => return Err(BenchError::Bad(format!("mkdir answered {other:?}"))),
        };
        let stripe = match call(&conns[0][0], &Request::Getdirstripe { dir }).await? {
            Reply::DirStripe { stripe, .. } if !stripe.is_empty() => {
                nacre_proto::dne::DirStripe::decode(&stripe).map_err(bad)?
            }
            _ => nacre_proto::dne::DirStripe { hash: nacre_proto::dne::HASH_FNV_1A_64, shards: vec![dir] },
        };
        stripes.push(Arc::new(stripe));
    }
    let (names, dom) = (stripes[0].clone(), stripes[1].clone());
    let dom_shards = dom.clone();
    let dom_layout = Layout::from_lfs_args(&["-E", "64K", "-L", "mdt", "-E", "eof", "-c", "1"]).map_err(bad)?.encode();
    for &shard in &dom.shards {
        let imp = &conns[0][shard.mdt().unwrap_or(0) as usize % mdts.len()];
        call(imp, &Request::Setdirlayout { dir: shard, layout: dom_layout.clone() }).await?;
    }
    // The import of the MDT that holds `fid`.
    fn at(imps: &[Arc<Import>], fid: Fid) -> &Arc<Import> {
        &imps[fid.mdt().unwrap_or(0) as usize % imps.len()]
    }
    let fids: Arc<std::sync::Mutex<Vec<Vec<Fid>>>> = Arc::new(std::sync::Mutex::new(vec![Vec::new(); o.clients]));
    let create = {
        let (names, fids) = (names.clone(), fids.clone());
        each(&conns, move |i, imps| {
            let (names, fids) = (names.clone(), fids.clone());
            async move {
                let mut mine = Vec::with_capacity(per as usize);
                for j in 0..per {
                    let name = format!("c{i}-f{j}");
                    let shard = names.shards[names.shard_of(&name)];
                    let r = Request::Create {
                        dir: shard,
                        name,
                        mode: mode::S_IFREG | 0o644,
                        target: vec![],
                        layout: vec![],
                        rdev: 0,
                    };
                    match call(at(&imps, shard), &r).await? {
                        Reply::Attr(a) => mine.push(a.fid),
                        other => return Err(BenchError::Bad(format!("create answered {other:?}"))),
                    }
                }
                fids.lock().unwrap_or_else(|e| e.into_inner())[i] = mine;
                Ok(())
            }
        })
        .await?
    };
    let stat = each(&conns, move |i, imps| {
        let mine = fids.lock().unwrap_or_else(|e| e.into_inner())[i].clone();
        async move {
            for fid in mine {
                match call(at(&imps, fid), &Request::Getattr { fid }).await? {
                    Reply::Attr(a) if a.fid == fid => {}
                    other => return Err(BenchError::Bad(format!("getattr of {fid} answered {other:?}"))),
                }
            }
            Ok(())
        }
    })
    .await?;
    let clients = o.clients as u64;
    let readdir = {
        let names = names.clone();
        each(&conns, move |i, imps| {
            let names = names.clone();
            async move {
                let mut seen = 0u64;
                for &shard in &names.shards {
                    let mut cookie = 0;
                    loop {
                        let r = Request::Readdir { dir: shard, cookie, max: 1024 };
                        let Reply::Entries { entries, eof } = call(at(&imps, shard), &r).await? else {
                            return Err(BenchError::Bad("readdir answered something else".into()));
                        };
                        seen += entries.len() as u64;
                        cookie = entries.last().map_or(cookie, |(e, _)| e.cookie);
                        if eof {
                            break;
                        }
                    }
                }
                if seen != per * clients {
                    return Err(BenchError::Verify(format!("client {i} listed {seen} entries")));
                }
                Ok(())
            }
        })
        .await?
    };
    let unlink = {
        let names = names.clone();
        each(&conns, move |i, imps| {
            let names = names.clone();
            async move {
                for j in 0..per {
                    let name = format!("c{i}-f{j}");
                    let shard = names.shards[names.shard_of(&name)];
                    call(at(&imps, shard), &Request::Unlink { dir: shard, name, rmdir: false }).await?;
                }
                Ok(())
            }
        })
        .await?
    };
    let body = Arc::new(vec![0x5au8; DOM_FILE_BYTES]);
    let dom_secs = each(&conns, move |i, imps| {
        let (dom, body) = (dom.clone(), body.clone());
        async move {
            for j in 0..per {
                let name = format!("c{i}-s{j}");
                let shard = dom.shards[dom.shard_of(&name)];
                let r = Request::Create {
                    dir: shard,
                    name,
                    mode: mode::S_IFREG | 0o644,
                    target: vec![],
                    layout: vec![],
                    rdev: 0,
                };
                create_with_data(at(&imps, shard), &r, &body).await?;
            }
            Ok(())
        }
    })
    .await?;
    // The DoM files go (untimed), so that every round starts from the same fill.
    let dom_names: Vec<(Fid, String)> = (0..o.clients)
        .flat_map(|i| (0..per).map(move |j| format!("c{i}-s{j}")))
        .map(|n| (dom_shards.shards[dom_shards.shard_of(&n)], n))
        .collect();
    for (shard, name) in dom_names {
        call(at(&conns[0], shard), &Request::Unlink { dir: shard, name, rmdir: false }).await?;
    }
    Ok(SharedRates {
        create: total / create,
        stat: total / stat,
        readdir: total * o.clients as f64 / readdir,
        unlink: total / unlink,
        dom: total / dom_secs,
    })
}

/// Run `f(client index, its imports)` for every client at once; the seconds it took all.
async fn each<F, Fut>(conns: &[Arc<Vec<Arc<Import>>>], f: F) -> Result<f64, BenchError>
where
    F: Fn(usize, Arc<Vec<Arc<Import>>>) -> Fut,
    Fut: std::future::Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in conns.iter().enumerate() {
        set.spawn(f(i, c.clone()));
    }
    while let Some(r) = set.join_next().await {
        r.map_err(bad)??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// A create that carries the file's data (kept on the MDT by the directory's DoM
/// default), checked to have made a file of that size.
async fn create_with_data(imp: &Import, r: &Request, data: &[u8]) -> Result<(), BenchError> {
    let (op, body) = r.encode(&Creds::default());
    let f = imp.call(op, &body, data).await.map_err(bad)?;
    if f.header.status != 0 {
        return Err(BenchError::Bad(format!("create with data: {}", String::from_utf8_lossy(&f.body))));
    }
    match Reply::decode(&f.body).map_err(bad)? {
        Reply::Attr(a) if a.size == data.len() as u64 => Ok(()),
        other => Err(BenchError::Verify(format!("create with {} bytes answered {other:?}", data.len()))),
    }
}

async fn call(imp: &Import, r: &Request) -> Result<Reply, BenchError> {
    let (op, body) = r.encode(&Creds::default());
    let f = imp.call(op, &body, &[]).await.map_err(bad)?;
    if f.header.status != 0 {
        return Err(BenchError::Bad(format!("{r:?}: {}", String::from_utf8_lossy(&f.body))));
    }
    Reply::decode(&f.body).map_err(bad)
}

/// Rates (per second) of one round against Nacre: create, stat, unlink, ping.
struct NacreRates {
    create: f64,
    stat: f64,
    unlink: f64,
    ping: f64,
    /// Entries listed per second (readdir with attributes, pages of 1,024).
    readdir: f64,
    /// 3,901-byte files made per second: one create carrying its data each.
    dom: f64,
    /// A chmod of each file, a rename of each within its directory, and a mkdir and
    /// rmdir of as many directories.
    setattr: f64,
    rename: f64,
    mkdir: f64,
    rmdir: f64,
    /// Byte-range lock and unlock pairs: every client its own byte of one shared file.
    lock: f64,
    /// The ping rate beside each phase (by its name in [`CHANGES`], and `stat`): the
    /// mean of a short burst of pings just before it and one just after. A phase is
    /// measured against these, not against the one long ping phase: the rate this
    /// machine gives moves by half from one second to the next.
    ping_near: std::collections::HashMap<&'static str, f64>,
    /// Microseconds of this process's CPU (the clients' and the server's, user and
    /// system) per RPC of a phase: `ping`, `stat` and `lock_unlock_pairs` (two RPCs a
    /// pair). Unlike the rates, these hardly move with the machine's other load.
    cpu_us: std::collections::HashMap<&'static str, f64>,
}

/// CPU time this process has used, user and system.
fn process_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given and nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// The small file of the DoM phase: 3,901 bytes, as the IO500's mdtest-hard writes.
pub const DOM_FILE_BYTES: usize = 3901;

/// Run `f(client index, import)` on every client at once; the seconds it took all.
async fn all<F, Fut>(imports: &[Arc<Import>], f: F) -> Result<f64, BenchError>
where
    F: Fn(usize, Arc<Import>) -> Fut,
    Fut: std::future::Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (i, imp) in imports.iter().enumerate() {
        set.spawn(f(i, imp.clone()));
    }
    while let Some(r) = set.join_next().await {
        r.map_err(bad)??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Pings per second with every client sending `per` pings in turn.
async fn ping_rate(imports: &[Arc<Import>], per: u64) -> Result<f64, BenchError> {
    let secs = all(imports, move |_, imp| async move {
        for _ in 0..per {
            imp.ping().await.map_err(bad)?;
        }
        Ok(())
    })
    .await?;
    Ok((per * imports.len() as u64) as f64 / secs)
}

/// Seconds for every client `i` to send `per` requests in turn, the `j`-th being
/// `req(dirs[i], j)`; each must succeed.
async fn each_in_dir(
    imports: &[Arc<Import>],
    dirs: &Arc<Vec<Fid>>,
    per: u64,
    req: fn(Fid, u64) -> Request,
) -> Result<f64, BenchError> {
    all(imports, move |i, imp| {
        let dir = dirs[i];
        async move {
            for j in 0..per {
                call(&imp, &req(dir, j)).await?;
            }
            Ok(())
        }
    })
    .await
}

async fn nacre_round(
    s: &Served,
    o: &MdsBenchOptions,
    round: usize,
    durable_only: bool,
) -> Result<NacreRates, BenchError> {
    let per = (o.files / o.clients as u64).max(1);
    let mut clients = Vec::new();
    let mut imports = Vec::new();
    for _ in 0..o.clients {
        let c = Client::new(Arc::new(TcpTransport), ClientConfig::default());
        imports.push(c.connect(&s.server.nid()).await.map_err(bad)?);
        clients.push(c);
    }
    // Each client's directory, made before the clock starts.
    let mut dirs = Vec::new();
    for (i, imp) in imports.iter().enumerate() {
        let r = Request::Create {
            dir: Fid::ROOT,
            name: format!("r{round}-c{i}"),
            mode: mode::S_IFDIR | 0o755,
            target: vec![],
            layout: vec![],
            rdev: 0,
        };
        match call(imp, &r).await? {
            Reply::Attr(a) => dirs.push(a.fid),
            other => return Err(BenchError::Bad(format!("mkdir answered {other:?}"))),
        }
    }
    let dirs = Arc::new(dirs);
    let fids: Arc<std::sync::Mutex<Vec<Vec<Fid>>>> = Arc::new(std::sync::Mutex::new(vec![Vec::new(); o.clients]));
    // Short bursts of pings between the phases (see `NacreRates::ping_near`).
    let burst = (per / 4).max(50);
    let mut bursts = Vec::new();
    if !durable_only {
        bursts.push(ping_rate(&imports, burst).await?);
    }
    let mut cpu_us = std::collections::HashMap::new();
    let us_per = |since: Duration, rpcs: f64| (process_cpu().saturating_sub(since)).as_secs_f64() * 1e6 / rpcs;
    let cpu_at = process_cpu();
    let create_secs = {
        let (dirs, fids) = (dirs.clone(), fids.clone());
        all(&imports, move |i, imp| {
            let (dirs, fids) = (dirs.clone(), fids.clone());
            async move {
                let mut mine = Vec::with_capacity(per as usize);
                for j in 0..per {
                    let r = Request::Create {
                        dir: dirs[i],
                        name: format!("f{j}"),
                        mode: mode::S_IFREG | 0o644,
                        target: vec![],
                        layout: vec![],
                        rdev: 0,
                    };
                    match call(&imp, &r).await? {
                        Reply::Attr(a) => mine.push(a.fid),
                        other => return Err(BenchError::Bad(format!("create answered {other:?}"))),
                    }
                }
                fids.lock().unwrap_or_else(|e| e.into_inner())[i] = mine;
                Ok(())
            }
        })
        .await?
    };
    let total = (per * o.clients as u64) as f64;
    cpu_us.insert("create", us_per(cpu_at, total));
    if durable_only {
        return Ok(NacreRates {
            create: total / create_secs,
            stat: 0.0,
            unlink: 0.0,
            ping: 0.0,
            readdir: 0.0,
            dom: 0.0,
            setattr: 0.0,
            rename: 0.0,
            mkdir: 0.0,
            rmdir: 0.0,
            lock: 0.0,
            ping_near: Default::default(),
            cpu_us: Default::default(),
        });
    }
    bursts.push(ping_rate(&imports, burst).await?);
    let cpu_at = process_cpu();
    let stat_secs = {
        let fids = fids.clone();
        all(&imports, move |i, imp| {
            let mine = fids.lock().unwrap_or_else(|e| e.into_inner())[i].clone();
            async move {
                for fid in mine {
                    match call(&imp, &Request::Getattr { fid }).await? {
                        Reply::Attr(a) if a.fid == fid && mode::is_reg(a.mode) => {}
                        other => return Err(BenchError::Bad(format!("getattr of {fid} answered {other:?}"))),
                    }
                }
                Ok(())
            }
        })
        .await?
    };
    cpu_us.insert("stat", us_per(cpu_at, total));
    bursts.push(ping_rate(&imports, burst).await?);
    let cpu_at = process_cpu();
    let ping = ping_rate(&imports, per).await?;
    cpu_us.insert("ping", us_per(cpu_at, total));
    // Locks: every client opens client 0's first file (untimed), then takes and drops a
    // write lock on a byte of its own, `per` times.
    let shared = fids.lock().unwrap_or_else(|e| e.into_inner())[0][0];
    let mut handles = Vec::new();
    for imp in &imports {
        match call(imp, &Request::Open { fid: shared, read: true, write: true, dom_read: 0 }).await? {
            Reply::Opened { handle, .. } => handles.push(handle),
            other => return Err(BenchError::Bad(format!("open answered {other:?}"))),
        }
    }
    bursts.push(ping_rate(&imports, burst).await?);
    let cpu_at = process_cpu();
    let lock_secs = {
        let handles = Arc::new(handles.clone());
        all(&imports, move |i, imp| {
            let handle = handles[i];
            async move {
                let at = i as u64;
                for _ in 0..per {
                    for kind in [mdt::lock::WRITE, mdt::lock::UNLOCK] {
                        let (owner, pid, flags) = (at + 1, 0, 0);
                        let r = Request::Lock { fid: shared, handle, owner, pid, kind, flags, start: at, end: at };
                        call(&imp, &r).await?;
                    }
                }
                Ok(())
            }
        })
        .await?
    };
    cpu_us.insert("lock_unlock_pairs", us_per(cpu_at, 2.0 * total));
    for (imp, handle) in imports.iter().zip(handles) {
        call(imp, &Request::Close { handle }).await?;
    }
    bursts.push(ping_rate(&imports, burst).await?);
    let setattr_secs = {
        let fids = fids.clone();
        all(&imports, move |i, imp| {
            let mine = fids.lock().unwrap_or_else(|e| e.into_inner())[i].clone();
            async move {
                for fid in mine {
                    let set = mdt::SetAttr { mask: mdt::set::MODE, mode: 0o600, ..mdt::SetAttr::default() };
                    match call(&imp, &Request::Setattr { fid, set }).await? {
                        Reply::Attr(a) if a.mode & 0o7777 == 0o600 => {}
                        other => return Err(BenchError::Bad(format!("chmod of {fid} answered {other:?}"))),
                    }
                }
                Ok(())
            }
        })
        .await?
    };
    bursts.push(ping_rate(&imports, burst).await?);
    let rename_secs = each_in_dir(&imports, &dirs, per, |dir, j| Request::Rename {
        src_dir: dir,
        src_name: format!("f{j}"),
        dst_dir: dir,
        dst_name: format!("g{j}"),
        noreplace: false,
    })
    .await?;
    bursts.push(ping_rate(&imports, burst).await?);
    let readdir_secs = {
        let dirs = dirs.clone();
        all(&imports, move |i, imp| {
            let dirs = dirs.clone();
            async move {
                let (mut cookie, mut seen) = (0, 0u64);
                loop {
                    let r = Request::Readdir { dir: dirs[i], cookie, max: 1024 };
                    let Reply::Entries { entries, eof } = call(&imp, &r).await? else {
                        return Err(BenchError::Bad("readdir answered something else".into()));
                    };
                    seen += entries.len() as u64;
                    cookie = entries.last().map_or(cookie, |(e, _)| e.cookie);
                    if eof {
                        break;
                    }
                }
                if seen != per {
                    return Err(BenchError::Verify(format!("client {i} listed {seen} of its {per} files")));
                }
                Ok(())
            }
        })
        .await?
    };
    bursts.push(ping_rate(&imports, burst).await?);
    let unlink_secs =
        each_in_dir(&imports, &dirs, per, |dir, j| Request::Unlink { dir, name: format!("g{j}"), rmdir: false })
            .await?;
    bursts.push(ping_rate(&imports, burst).await?);
    let mkdir_secs = each_in_dir(&imports, &dirs, per, |dir, j| Request::Create {
        dir,
        name: format!("d{j}"),
        mode: mode::S_IFDIR | 0o755,
        target: vec![],
        layout: vec![],
        rdev: 0,
    })
    .await?;
    bursts.push(ping_rate(&imports, burst).await?);
    let rmdir_secs =
        each_in_dir(&imports, &dirs, per, |dir, j| Request::Unlink { dir, name: format!("d{j}"), rmdir: true }).await?;
    bursts.push(ping_rate(&imports, burst).await?);
    // Small files with their data on the MDT, in directories whose default layout starts
    // with a 64 KiB DoM component.
    let dom_layout = Layout::from_lfs_args(&["-E", "64K", "-L", "mdt", "-E", "eof", "-c", "1"]).map_err(bad)?.encode();
    let mut dom_dirs = Vec::new();
    for (i, imp) in imports.iter().enumerate() {
        let r = Request::Create {
            dir: Fid::ROOT,
            name: format!("r{round}-dom{i}"),
            mode: mode::S_IFDIR | 0o755,
            target: vec![],
            layout: vec![],
            rdev: 0,
        };
        let Reply::Attr(a) = call(imp, &r).await? else {
            return Err(BenchError::Bad("mkdir answered something else".into()));
        };
        call(imp, &Request::Setdirlayout { dir: a.fid, layout: dom_layout.clone() }).await?;
        dom_dirs.push(a.fid);
    }
    let dom_dirs = Arc::new(dom_dirs);
    let dom_dirs_left = dom_dirs.clone();
    let body = Arc::new(vec![0x5au8; DOM_FILE_BYTES]);
    bursts.push(ping_rate(&imports, burst).await?);
    let cpu_at = process_cpu();
    let dom_secs = all(&imports, move |i, imp| {
        let (dirs, body) = (dom_dirs.clone(), body.clone());
        async move {
            for j in 0..per {
                let r = Request::Create {
                    dir: dirs[i],
                    name: format!("s{j}"),
                    mode: mode::S_IFREG | 0o644,
                    target: vec![],
                    layout: vec![],
                    rdev: 0,
                };
                create_with_data(&imp, &r, &body).await?;
            }
            Ok(())
        }
    })
    .await?;
    bursts.push(ping_rate(&imports, burst).await?);
    cpu_us.insert("dom_files", us_per(cpu_at, total));
    // The DoM files go (untimed): every round starts from the same fill, and the MDT
    // needs no room for the rounds before.
    each_in_dir(&imports, &dom_dirs_left, per, |dir, j| Request::Unlink { dir, name: format!("s{j}"), rmdir: false })
        .await?;
    for imp in &imports {
        let _ = imp.disconnect().await;
    }
    // Each phase between the bursts just before and just after it (their indices).
    let beside = [
        ("create", 0, 1),
        ("stat", 1, 2),
        ("lock_unlock_pairs", 3, 4),
        ("setattr", 4, 5),
        ("rename", 5, 6),
        ("unlink", 7, 8),
        ("mkdir", 8, 9),
        ("rmdir", 9, 10),
        ("dom_files", 11, 12),
    ];
    let ping_near = beside.iter().map(|&(name, a, b)| (name, (bursts[a] + bursts[b]) / 2.0)).collect();
    Ok(NacreRates {
        ping_near,
        cpu_us,
        create: total / create_secs,
        stat: total / stat_secs,
        unlink: total / unlink_secs,
        ping,
        readdir: total / readdir_secs,
        dom: total / dom_secs,
        setattr: total / setattr_secs,
        rename: total / rename_secs,
        mkdir: total / mkdir_secs,
        rmdir: total / rmdir_secs,
        lock: total / lock_secs,
    })
}

/// Rates of the local file system doing the same work (per second).
#[derive(Default)]
pub(crate) struct LocalRates {
    pub(crate) create: f64,
    pub(crate) stat: f64,
    readdir: f64,
    /// Files made and written with 3,901 bytes.
    small: f64,
}

/// The local file system doing the same: `threads` threads, each in its own fresh
/// directory. `fsync_dir` syncs the directory after each create (and measures creates
/// only). Returns the rates and the folder the files are in: they are removed (and the
/// unlinks timed, [`local_unlink`]) only after every round, because a journal-less ext4
/// crawls on creates for minutes after many deletes (it avoids recently freed inodes).
pub(crate) fn local_round(
    root: &Path,
    o: &MdsBenchOptions,
    fsync_dir: bool,
) -> Result<(LocalRates, PathBuf), BenchError> {
    let per = (o.files / o.clients as u64).max(1);
    let base = root.join(format!("nacre-bench-mds-local-{}-{}", std::process::id(), fastrand_suffix()));
    let dirs: Vec<PathBuf> = (0..o.clients).map(|i| base.join(format!("t{i}"))).collect();
    for d in &dirs {
        std::fs::create_dir_all(d)?;
    }
    let run = |f: &(dyn Fn(&Path, u64) -> std::io::Result<()> + Sync)| -> Result<f64, BenchError> {
        let started = Instant::now();
        std::thread::scope(|s| {
            let hs: Vec<_> = dirs
                .iter()
                .map(|d| {
                    s.spawn(move || -> std::io::Result<()> {
                        for j in 0..per {
                            f(d, j)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter().try_for_each(|h| h.join().map_err(|_| std::io::Error::other("a thread panicked"))?)
        })?;
        Ok(started.elapsed().as_secs_f64())
    };
    let total = (per * o.clients as u64) as f64;
    let create = run(&|d, j| {
        std::fs::File::create(d.join(format!("f{j}")))?;
        if fsync_dir {
            std::fs::File::open(d)?.sync_all()?;
        }
        Ok(())
    })?;
    let mut r = LocalRates { create: total / create, ..LocalRates::default() };
    if !fsync_dir {
        r.stat = total / run(&|d, j| std::fs::metadata(d.join(format!("f{j}"))).map(|_| ()))?;
        // One thread per directory lists it whole, with each entry's type (as readdir's
        // d_type); `run` calls it once per file, so only the first call lists.
        r.readdir = total
            / run(&|d, j| {
                if j == 0 {
                    let n = std::fs::read_dir(d)?
                        .map(|e| e.and_then(|e| e.file_type()))
                        .collect::<std::io::Result<Vec<_>>>()?
                        .len();
                    if n as u64 != per {
                        return Err(std::io::Error::other(format!("listed {n} of {per} files")));
                    }
                }
                Ok(())
            })?;
        let body = vec![0x5au8; DOM_FILE_BYTES];
        r.small = total
            / run(&|d, j| {
                use std::io::Write as _;
                std::fs::File::create(d.join(format!("s{j}")))?.write_all(&body)
            })?;
    }
    Ok((r, base))
}

/// Threads removing one round's empty files (`f{j}` in `t{i}`), then the whole folder;
/// returns the unlink rate.
pub(crate) fn local_unlink(base: &Path, o: &MdsBenchOptions) -> Result<f64, BenchError> {
    let per = (o.files / o.clients as u64).max(1);
    let started = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..o.clients)
            .map(|i| {
                let d = base.join(format!("t{i}"));
                s.spawn(move || -> std::io::Result<()> {
                    for j in 0..per {
                        std::fs::remove_file(d.join(format!("f{j}")))?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().map_err(|_| std::io::Error::other("a thread panicked"))?)
    })?;
    let rate = (per * o.clients as u64) as f64 / started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(base);
    Ok(rate)
}

fn fastrand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64)
}

/// Run the bench; prints progress and a table, returns the figures.
pub fn run_mds_bench(o: &MdsBenchOptions, out: &mut dyn std::io::Write) -> Result<Value, BenchError> {
    if o.clients == 0 || o.files < o.clients as u64 {
        return Err(BenchError::Bad(format!("--files {} must be at least --clients {}", o.files, o.clients)));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let work = o.dir.join(format!("nacre-bench-mds-{}", std::process::id()));
    let durable_work =
        o.durable_dir.as_ref().map(|d| d.join(format!("nacre-bench-mds-durable-{}", std::process::id())));
    let result = rt.block_on(run_in(o, &work, durable_work.as_deref(), out));
    let _ = std::fs::remove_dir_all(&work);
    if let Some(d) = &durable_work {
        let _ = std::fs::remove_dir_all(d);
    }
    result
}

async fn run_in(
    o: &MdsBenchOptions,
    work: &Path,
    durable_work: Option<&Path>,
    out: &mut dyn std::io::Write,
) -> Result<Value, BenchError> {
    let _ = writeln!(
        out,
        "nacre bench mds: one MDT on RAID10 (4 drives in {}), {} clients over loopback TCP, {} files per phase, {} rounds; reference: {} threads on {}",
        o.dir.display(),
        o.clients,
        o.files,
        o.rounds,
        o.clients,
        o.local_dir.display()
    );
    let drive = drive_bytes(o.files * ROUND_BYTES_PER_FILE);
    let served = serve(work, SyncMode::Ordered, drive, o.sync_on_reply).await?;
    let mut f: [Vec<f64>; 16] = Default::default();
    // Per phase (its name in `CHANGES`, and `stat`), each round's (ratio to the pings
    // beside it, its rate, those pings' rate).
    let mut beside: std::collections::HashMap<&str, Vec<(f64, f64, f64)>> = Default::default();
    let (mut near_min, mut near_max) = (f64::MAX, 0.0f64);
    // Each measured phase's least CPU per RPC over the rounds.
    let mut cpu_us: std::collections::HashMap<&str, f64> = Default::default();
    let mut local_dirs = Vec::new();
    for round in 0..o.rounds.max(1) {
        let n = nacre_round(&served, o, round, false).await?;
        let (l, base) = tokio::task::block_in_place(|| local_round(&o.local_dir, o, false))?;
        local_dirs.push(base);
        let _ = writeln!(
            out,
            "round {}: nacre create {:.0}/s stat {:.0}/s readdir {:.0}/s unlink {:.0}/s 3,901-byte DoM files {:.0}/s ping {:.0}/s | local create {:.0}/s stat {:.0}/s readdir {:.0}/s 3,901-byte files {:.0}/s",
            round + 1,
            n.create,
            n.stat,
            n.readdir,
            n.unlink,
            n.dom,
            n.ping,
            l.create,
            l.stat,
            l.readdir,
            l.small
        );
        let _ = writeln!(
            out,
            "round {}: nacre setattr {:.0}/s rename {:.0}/s mkdir {:.0}/s rmdir {:.0}/s lock+unlock {:.0}/s",
            round + 1,
            n.setattr,
            n.rename,
            n.mkdir,
            n.rmdir,
            n.lock
        );
        let row = [
            n.create, n.stat, n.unlink, n.ping, l.create, l.stat, 0.0, n.readdir, l.readdir, n.dom, l.small, n.setattr,
            n.rename, n.mkdir, n.rmdir, n.lock,
        ];
        let (mut lo, mut hi) = (f64::MAX, 0.0f64);
        for (name, k) in CHANGES.into_iter().chain([("stat", 1)]) {
            let near = n.ping_near.get(name).copied().unwrap_or(0.0);
            beside.entry(name).or_default().push((ratio(row[k], near), row[k], near));
            (lo, hi) = (lo.min(near), hi.max(near));
        }
        (near_min, near_max) = (near_min.min(lo), near_max.max(hi));
        let _ = writeln!(
            out,
            "round {}: pings beside the phases {lo:.0}/s to {hi:.0}/s (the long ping phase {:.0}/s)",
            round + 1,
            n.ping
        );
        for (i, v) in row.into_iter().enumerate() {
            f[i].push(v);
        }
        for (name, us) in &n.cpu_us {
            let least = cpu_us.entry(name).or_insert(f64::MAX);
            *least = least.min(*us);
        }
    }
    // Locks as a mount takes them (kept under the file's lease), rounds of their own.
    let mounted = crate::mounted_locks::MountedLocks::start(&work.join("locks"), o.clients).await?;
    let per = (o.files / o.clients as u64).max(1);
    let mut mounted_best: Option<crate::mounted_locks::Round> = None;
    for round in 0..o.rounds.max(1) {
        let r = mounted.round(per, (per / 4).max(50)).await?;
        let _ = writeln!(
            out,
            "round {}: lock+unlock pairs through the client library's mounts {:.0}/s, pings from them beside it {:.0}/s ({:.3} of ping, {:.4} lock RPCs a pair)",
            round + 1,
            r.pairs,
            r.ping_near,
            ratio(r.pairs, r.ping_near),
            r.rpcs_per_pair
        );
        if mounted_best.as_ref().is_none_or(|b| ratio(r.pairs, r.ping_near) > ratio(b.pairs, b.ping_near)) {
            mounted_best = Some(r);
        }
    }
    mounted.stop().await;
    let mounted =
        mounted_best.unwrap_or(crate::mounted_locks::Round { pairs: 0.0, ping_near: 0.0, rpcs_per_pair: 0.0 });
    let cpu = |name: &str| cpu_us.get(name).copied().unwrap_or(0.0);
    let _ = writeln!(
        out,
        "CPU of this process (clients and server) per RPC, least of the rounds: ping {:.1} µs, stat {:.1} µs, lock or unlock {:.1} µs ({:.2} of a ping's), create {:.1} µs, 3,901-byte DoM file {:.1} µs (a ping's CPU over it: {:.3})",
        cpu("ping"),
        cpu("stat"),
        cpu("lock_unlock_pairs"),
        ratio(cpu("lock_unlock_pairs"), cpu("ping")),
        cpu("create"),
        cpu("dom_files"),
        ratio(cpu("ping"), cpu("dom_files"))
    );
    // Each phase's best round against the pings beside it: (ratio, rate, pings' rate).
    let best = |name: &str| -> (f64, f64, f64) {
        beside.get(name).into_iter().flatten().copied().fold((0.0, 0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a })
    };
    // The local unlinks, after every round's creates.
    f[6].clear();
    for base in &local_dirs {
        let rate = tokio::task::block_in_place(|| local_unlink(base, o))?;
        let _ = writeln!(out, "local unlink {rate:.0}/s");
        f[6].push(rate);
    }
    // DNE: one directory shared by every client, striped over two MDTs, against the
    // same on one MDT, rounds interleaved.
    // Each of the two holds half of a round's files.
    let two = serve_mdts(&work.join("dne"), drive_bytes(o.files * ROUND_BYTES_PER_FILE / 2), 2).await?;
    let mut dne: [Vec<f64>; 10] = Default::default();
    for round in 0..o.rounds.max(1) {
        let one = shared_dir_round(std::slice::from_ref(&served), o, round).await?;
        let two = shared_dir_round(&two, o, round).await?;
        for (what, r) in [("one MDT", one), ("striped over two MDTs", two)] {
            let _ = writeln!(
                out,
                "shared directory round {}, {what}: create {:.0}/s stat {:.0}/s readdir {:.0}/s unlink {:.0}/s 3,901-byte DoM files {:.0}/s",
                round + 1,
                r.create,
                r.stat,
                r.readdir,
                r.unlink,
                r.dom
            );
        }
        let row = [
            one.create,
            one.stat,
            one.readdir,
            one.unlink,
            one.dom,
            two.create,
            two.stat,
            two.readdir,
            two.unlink,
            two.dom,
        ];
        for (i, v) in row.into_iter().enumerate() {
            dne[i].push(v);
        }
    }
    drop(two);
    let d: Vec<f64> = dne.iter().map(|v| peak(v)).collect();
    let _ = served.volume.name();
    drop(served);
    let b: Vec<f64> = f.iter().map(|v| peak(v)).collect();
    let (create_ratio, unlink_ratio, stat_vs_ping) = (ratio(b[0], b[4]), ratio(b[2], b[6]), best("stat").0);
    let mut durable = (0.0, 0.0);
    if let (Some(dir), Some(dd)) = (durable_work, o.durable_dir.as_ref()) {
        let served = serve(dir, SyncMode::Drives, drive, true).await?;
        let (mut nb, mut lb) = (Vec::new(), Vec::new());
        let mut durable_dirs = Vec::new();
        for round in 0..o.rounds.max(1) {
            let n = nacre_round(&served, o, 100 + round, true).await?;
            let (l, base) = tokio::task::block_in_place(|| local_round(dd, o, true))?;
            durable_dirs.push(base);
            let lc = l.create;
            let _ = writeln!(
                out,
                "durable round {}: nacre create {:.0}/s | local create+fsync {lc:.0}/s",
                round + 1,
                n.create
            );
            nb.push(n.create);
            lb.push(lc);
        }
        durable = (peak(&nb), peak(&lb));
        for d in durable_dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    let durable_ratio = ratio(durable.0, durable.1);
    let _ = writeln!(out, "\n| operation | Nacre /s | reference /s | ratio | target |\n|---|---:|---:|---:|---:|");
    let _ = writeln!(out, "| create | {:.0} | {:.0} (local) | {create_ratio:.3} | ≥ 0.3 |", b[0], b[4]);
    let _ = writeln!(
        out,
        "| stat (one RPC) | {:.0} | {:.0} (ping RPC beside it) | {stat_vs_ping:.3} | ≥ 0.5 |",
        best("stat").1,
        best("stat").2
    );
    let _ = writeln!(out, "| unlink | {:.0} | {:.0} (local) | {unlink_ratio:.3} | ≥ 0.3 |", b[2], b[6]);
    let _ = writeln!(
        out,
        "| readdir (entries, with attributes) | {:.0} | {:.0} (local, with types) | {:.3} | |",
        b[7],
        b[8],
        ratio(b[7], b[8])
    );
    let _ =
        writeln!(out, "| 3,901-byte files (DoM) | {:.0} | {:.0} (local) | {:.3} | |", b[9], b[10], ratio(b[9], b[10]));
    let _ = writeln!(out, "| local stat | | {:.0} | | |", b[5]);
    let _ = writeln!(
        out,
        "\n| change, against the ping RPC beside it | Nacre /s | ping /s | of ping | target |\n|---|---:|---:|---:|---:|"
    );
    for (name, _) in CHANGES {
        let (r, rate, near) = best(name);
        let what = if name == "lock_unlock_pairs" { "lock_unlock_pairs (two RPCs each)" } else { name };
        let _ = writeln!(out, "| {what} | {rate:.0} | {near:.0} | {r:.3} | ≥ 0.5 |");
    }
    let _ = writeln!(
        out,
        "| lock_unlock_pairs through the client library ({:.4} RPCs each) | {:.0} | {:.0} | {:.3} | ≥ 0.5 |",
        mounted.rpcs_per_pair,
        mounted.pairs,
        mounted.ping_near,
        ratio(mounted.pairs, mounted.ping_near)
    );
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(
        out,
        "\n| shared directory | striped over 2 MDTs /s | 1 MDT /s | ratio | target |\n|---|---:|---:|---:|---:|"
    );
    for (k, what) in ["create", "stat", "readdir (entries)", "unlink", "3,901-byte DoM files"].iter().enumerate() {
        let target = if k == 0 { format!("≥ 1.5 with enough cores ({cores} here)") } else { String::new() };
        let _ = writeln!(out, "| {what} | {:.0} | {:.0} | {:.3} | {target} |", d[5 + k], d[k], ratio(d[5 + k], d[k]));
    }
    if o.durable_dir.is_some() {
        let _ = writeln!(
            out,
            "| durable create | {:.0} | {:.0} (local + fsync dir) | {durable_ratio:.3} | ≥ 0.5 |",
            durable.0, durable.1
        );
    }
    let mut v = json!({
        "bench": "mds",
        "dir": o.dir.display().to_string(),
        "local_dir": o.local_dir.display().to_string(),
        "files": o.files,
        "clients": o.clients,
        "rounds": o.rounds,
        "cores": cores,
        "one_mdt_shared_create_per_s": d[0],
        "one_mdt_shared_stat_per_s": d[1],
        "one_mdt_shared_readdir_per_s": d[2],
        "one_mdt_shared_unlink_per_s": d[3],
        "one_mdt_shared_dom_files_per_s": d[4],
        "two_mdt_striped_create_per_s": d[5],
        "two_mdt_striped_stat_per_s": d[6],
        "two_mdt_striped_readdir_per_s": d[7],
        "two_mdt_striped_unlink_per_s": d[8],
        "two_mdt_striped_dom_files_per_s": d[9],
        "two_mdt_create_ratio": ratio(d[5], d[0]),
        "two_mdt_stat_ratio": ratio(d[6], d[1]),
        "two_mdt_readdir_ratio": ratio(d[7], d[2]),
        "two_mdt_unlink_ratio": ratio(d[8], d[3]),
        "two_mdt_dom_files_ratio": ratio(d[9], d[4]),
        "create_per_s": b[0],
        "stat_per_s": b[1],
        "unlink_per_s": b[2],
        "ping_per_s": b[3],
        "local_create_per_s": b[4],
        "local_stat_per_s": b[5],
        "local_unlink_per_s": b[6],
        "readdir_per_s": b[7],
        "local_readdir_per_s": b[8],
        "dom_files_per_s": b[9],
        "local_small_files_per_s": b[10],
        "readdir_ratio": ratio(b[7], b[8]),
        "dom_files_ratio": ratio(b[9], b[10]),
        "create_ratio": create_ratio,
        "unlink_ratio": unlink_ratio,
        "stat_vs_ping_ratio": stat_vs_ping,
    });
    // Every change against the pings beside it, its best round (the json! macro is at
    // its depth).
    for (name, k) in CHANGES {
        if !matches!(name, "create" | "unlink" | "dom_files") {
            v[format!("{name}_per_s")] = json!(b[k]);
        }
        v[format!("{name}_vs_ping_ratio")] = json!(best(name).0);
    }
    for name in ["ping", "stat", "lock_unlock_pairs", "create", "dom_files"] {
        v[format!("{name}_cpu_us_per_rpc")] = json!(cpu(name));
    }
    // A ping's CPU over a DoM file's: the rate ratio this machine would give with its
    // cores to the bench alone (steadier than the rates, which move with other load).
    v["dom_files_cpu_vs_ping_ratio"] = json!(ratio(cpu("ping"), cpu("dom_files")));
    v["lock_cpu_vs_ping_ratio"] = json!(ratio(cpu("lock_unlock_pairs"), cpu("ping")));
    v["mounted_lock_unlock_pairs_per_s"] = json!(mounted.pairs);
    v["mounted_lock_ping_per_s"] = json!(mounted.ping_near);
    v["mounted_lock_unlock_pairs_vs_ping_ratio"] = json!(ratio(mounted.pairs, mounted.ping_near));
    v["mounted_lock_rpcs_per_pair"] = json!(mounted.rpcs_per_pair);
    v["ping_beside_min_per_s"] = json!(near_min);
    v["ping_beside_max_per_s"] = json!(near_max);
    v["sync_on_reply"] = json!(o.sync_on_reply);
    if o.durable_dir.is_some() {
        v["durable_create_per_s"] = json!(durable.0);
        v["local_durable_create_per_s"] = json!(durable.1);
        v["durable_create_ratio"] = json!(durable_ratio);
    }
    Ok(v)
}
