//! `nacre bench client`: the client library with no kernel in the way. A whole file
//! system (MGS, one MDT on RAID10, OSTs on RAID6, drive files in `dir`) served over
//! loopback TCP from this process; `clients` tasks of one mount create, stat and remove
//! empty files (each in its own directory), then write and read back one file each in
//! 1 MiB calls, then write one file each in 47,008-byte blocks, every other one (what one
//! of two nodes writes of an ior-hard file: no block touches the next, so they reach the
//! OSTs as many extents per RPC). The reference is the local file system doing the same
//! with as many threads, in the same run; rounds interleave and keep the best of each.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nacre_client::{Creds, Fid, FileSystem, MountOptions, OpenFlags};
use nacre_net::nid::Nid;
use nacre_net::transport::TcpTransport;
use nacre_osd::{Target, TargetOptions};
use nacre_raid::Level;
use nacre_server::cluster::{Listen, Local, MgsAt, Registration};
use nacre_server::mdt::{Namespace, NamespaceOptions};
use nacre_server::mgs::Mgs;
use serde_json::{Value, json};

use crate::mds::{MdsBenchOptions, local_round, local_unlink};
use crate::raid::{BenchError, create, make_drives, peak, ratio};

#[derive(Debug, Clone)]
pub struct ClientBenchOptions {
    /// Folder of the drive files.
    pub dir: PathBuf,
    /// The local file system the reference runs on.
    pub local_dir: PathBuf,
    /// Files per phase, over all clients.
    pub files: u64,
    pub clients: usize,
    pub rounds: usize,
    /// Bytes each client writes and reads back.
    pub io_bytes: u64,
}

fn bad<E: std::fmt::Display>(e: E) -> BenchError {
    BenchError::Bad(e.to_string())
}

/// `n` drive files of `size` bytes in `dir` (made).
fn drives(dir: &Path, n: usize, size: u64) -> Result<Vec<Arc<dyn nacre_raid::BlockDevice>>, BenchError> {
    std::fs::create_dir_all(dir)?;
    make_drives(dir, n, size)
}

/// The file system: its drives under `dir`, served from this process.
pub async fn serve(dir: &Path, o: &ClientBenchOptions) -> Result<Local, BenchError> {
    std::fs::create_dir_all(dir)?;
    let mgs_vol = create(&drives(&dir.join("mgs"), 2, 16 << 20)?, Level::Raid1, 64 << 10)?;
    let mgs = Arc::new(Mgs::format(Arc::new(mgs_vol), "bench").map_err(bad)?);
    let mdt_bytes = ((o.files * o.rounds.max(1) as u64 * 8) << 10).clamp(64 << 20, 4 << 30).div_ceil(1 << 20) << 20;
    let mdt_vol = create(&drives(&dir.join("mdt0"), 4, mdt_bytes)?, Level::Raid10, 256 << 10)?;
    let ns = tokio::task::block_in_place(|| Namespace::format(Arc::new(mdt_vol), 0, NamespaceOptions::default()))
        .map_err(bad)?;
    // Room for every client's file, in each of two OSTs (RAID6 4+2), with slack.
    let per_drive = ((o.io_bytes * o.clients as u64) / 4 + (64 << 20)).div_ceil(1 << 20) << 20;
    let mut osts = Vec::new();
    for i in 0..2 {
        let d = dir.join(format!("ost{i}"));
        let data = create(&drives(&d.join("data"), 6, per_drive)?, Level::Raid6, 128 << 10)?;
        let index = create(&drives(&d.join("index"), 2, 64 << 20)?, Level::Raid1, 1 << 20)?;
        let t =
            tokio::task::block_in_place(|| Target::format(Arc::new(data), Arc::new(index), TargetOptions::default()))
                .map_err(bad)?;
        osts.push((i, Arc::new(t)));
    }
    let listen =
        |_: &str| -> Listen { "127.0.0.1@tcp:0".parse::<Nid>().unwrap_or_else(|_| unreachable!("a fixed NID")).into() };
    let n_osts = osts.len();
    let local = Local::start(
        Arc::new(TcpTransport),
        listen,
        MgsAt::Here(mgs),
        vec![Arc::new(ns)],
        osts,
        Registration::Wait(Duration::ZERO),
        false,
        Default::default(),
    )
    .await
    .map_err(bad)?;
    if !local.wait_ready(n_osts, Duration::from_secs(60)).await {
        return Err(BenchError::Bad("the MDT got no objects from the OSTs within 60 s".into()));
    }
    Ok(local)
}

#[derive(Default)]
struct Rates {
    create: f64,
    stat: f64,
    unlink: f64,
    write: f64,
    read: f64,
    strided: f64,
}

/// ior-hard's block.
const BLOCK: usize = 47_008;

/// Blocks each client writes in the strided phase: about `io_bytes`.
fn strided_blocks(o: &ClientBenchOptions) -> usize {
    (o.io_bytes as usize / BLOCK).max(1)
}

/// Run `f(client)` for every client at once; the seconds it took all.
async fn each<F, Fut>(clients: usize, f: F) -> Result<f64, BenchError>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..clients {
        set.spawn(f(i));
    }
    let mut first = Ok(());
    while let Some(r) = set.join_next().await {
        let r = r.map_err(bad).and_then(|r| r);
        if first.is_ok() {
            first = r;
        }
    }
    first.map(|_| started.elapsed().as_secs_f64())
}

async fn nacre_round(fs: &FileSystem, o: &ClientBenchOptions, round: usize) -> Result<Rates, BenchError> {
    let c = Creds::default();
    let per = (o.files / o.clients as u64).max(1);
    let total = (per * o.clients as u64) as f64;
    let mut dirs = Vec::new();
    for i in 0..o.clients {
        dirs.push(fs.mkdir(&c, Fid::ROOT, &format!("r{round}-c{i}"), 0o755, -1, 0).await.map_err(bad)?.fid);
    }
    let dirs = Arc::new(dirs);
    let run = |what: &'static str| {
        let (fs, dirs) = (fs.clone(), dirs.clone());
        each(o.clients, move |i| {
            let (fs, dir, c) = (fs.clone(), dirs[i], Creds::default());
            async move {
                for j in 0..per {
                    let name = format!("f{j}");
                    match what {
                        "create" => fs.create(&c, dir, &name, 0o644, None).await.map(|_| ()),
                        "stat" => fs.lookup(&c, dir, &name).await.map(|_| ()),
                        _ => fs.unlink(&c, dir, &name).await,
                    }
                    .map_err(bad)?;
                }
                Ok(())
            }
        })
    };
    let create = total / run("create").await?;
    let stat = total / run("stat").await?;
    let unlink = total / run("unlink").await?;
    // Sequential IO: a file per client, 1 MiB calls.
    let chunk = 1usize << 20;
    let calls = (o.io_bytes as usize).div_ceil(chunk).max(1);
    let bytes = (calls * chunk * o.clients) as f64;
    let body = Arc::new((0..chunk).map(|i| (i * 7 + round) as u8).collect::<Vec<u8>>());
    let files = {
        let mut v = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            v.push(fs.create(&c, *d, &format!("io{i}"), 0o644, None).await.map_err(bad)?.fid);
        }
        Arc::new(v)
    };
    let (fs2, files2, body2) = (fs.clone(), files.clone(), body.clone());
    let write = bytes
        / each(o.clients, move |i| {
            let (fs, fid, body) = (fs2.clone(), files2[i], body2.clone());
            async move {
                let f = fs.open(&Creds::default(), fid, OpenFlags::WRITE).await.map_err(bad)?;
                for k in 0..calls {
                    f.write((k * chunk) as u64, &body).await.map_err(bad)?;
                }
                f.fsync().await.map_err(bad)?;
                f.close().await.map_err(bad)
            }
        })
        .await?;
    let (fs2, files2, body2) = (fs.clone(), files.clone(), body.clone());
    let read = bytes
        / each(o.clients, move |i| {
            let (fs, fid, body) = (fs2.clone(), files2[i], body2.clone());
            async move {
                let f = fs.open(&Creds::default(), fid, OpenFlags::READ).await.map_err(bad)?;
                for k in 0..calls {
                    let got = f.read((k * chunk) as u64, chunk).await.map_err(bad)?;
                    if got != *body {
                        return Err(BenchError::Verify(format!("client {i} read back other bytes at {}", k * chunk)));
                    }
                }
                f.close().await.map_err(bad)
            }
        })
        .await?;
    for (i, d) in dirs.iter().enumerate() {
        fs.unlink(&c, *d, &format!("io{i}")).await.map_err(bad)?;
    }
    // Every other 47,008-byte block of a file per client, then fsync.
    let blocks = strided_blocks(o);
    let (fs2, dirs2, body2) = (fs.clone(), dirs.clone(), body.clone());
    let strided = (blocks * BLOCK * o.clients) as f64
        / each(o.clients, move |i| {
            let (fs, dir, body) = (fs2.clone(), dirs2[i], body2.clone());
            async move {
                let c = Creds::default();
                let fid = fs.create(&c, dir, "hard", 0o644, None).await.map_err(bad)?.fid;
                let f = fs.open(&c, fid, OpenFlags::WRITE).await.map_err(bad)?;
                for k in 0..blocks {
                    f.write((2 * k * BLOCK) as u64, &body[..BLOCK]).await.map_err(bad)?;
                }
                f.fsync().await.map_err(bad)?;
                f.close().await.map_err(bad)?;
                fs.unlink(&c, dir, "hard").await.map_err(bad)
            }
        })
        .await?;
    Ok(Rates { create, stat, unlink, write, read, strided })
}

/// The local reference of sequential IO: a file per thread, 1 MiB writes then fsync,
/// then reads (from the page cache: the figure is the local ceiling, not a disk's), then
/// the strided 47,008-byte writes and fsync.
fn local_io(root: &Path, o: &ClientBenchOptions) -> Result<(f64, f64, f64), BenchError> {
    use std::io::{Read, Write};
    use std::os::unix::fs::FileExt;
    let base = root.join(format!("nacre-bench-client-io-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    let chunk = 1usize << 20;
    let calls = (o.io_bytes as usize).div_ceil(chunk).max(1);
    let bytes = (calls * chunk * o.clients) as f64;
    let body = vec![0xa5u8; chunk];
    let run = |f: &(dyn Fn(&Path) -> std::io::Result<()> + Sync)| -> Result<f64, BenchError> {
        let started = Instant::now();
        std::thread::scope(|s| {
            let base = &base;
            let hs: Vec<_> = (0..o.clients).map(|i| s.spawn(move || f(&base.join(format!("io{i}"))))).collect();
            hs.into_iter().try_for_each(|h| h.join().map_err(|_| std::io::Error::other("a thread panicked"))?)
        })?;
        Ok(bytes / started.elapsed().as_secs_f64())
    };
    let write = run(&|p| {
        let mut f = std::fs::File::create(p)?;
        for _ in 0..calls {
            f.write_all(&body)?;
        }
        f.sync_all()
    })?;
    let read = run(&|p| {
        let mut f = std::fs::File::open(p)?;
        let mut buf = vec![0u8; chunk];
        for _ in 0..calls {
            f.read_exact(&mut buf)?;
        }
        Ok(())
    })?;
    let blocks = strided_blocks(o);
    let strided = run(&|p| {
        let f = std::fs::File::create(p.with_extension("hard"))?;
        for k in 0..blocks {
            f.write_all_at(&body[..BLOCK], (2 * k * BLOCK) as u64)?;
        }
        f.sync_all()
    })? * (blocks * BLOCK) as f64
        / (calls * chunk) as f64;
    let _ = std::fs::remove_dir_all(&base);
    Ok((write, read, strided))
}

pub fn run_client_bench(o: &ClientBenchOptions, out: &mut dyn std::io::Write) -> Result<Value, BenchError> {
    if o.clients == 0 || o.files < o.clients as u64 {
        return Err(BenchError::Bad(format!("--files {} must be at least --clients {}", o.files, o.clients)));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let work = o.dir.join(format!("nacre-bench-client-{}", std::process::id()));
    let result = rt.block_on(run_in(o, &work, out));
    let _ = std::fs::remove_dir_all(&work);
    result
}

async fn run_in(o: &ClientBenchOptions, work: &Path, out: &mut dyn std::io::Write) -> Result<Value, BenchError> {
    let _ = writeln!(
        out,
        "nacre bench client: MGS, one MDT (RAID10) and two OSTs (RAID6 4+2) on drives in {}, over loopback TCP; {} tasks of one mount, {} files per phase, {} MiB of IO each, {} rounds; reference: {} threads on {}",
        o.dir.display(),
        o.clients,
        o.files,
        o.io_bytes >> 20,
        o.rounds,
        o.clients,
        o.local_dir.display()
    );
    let local = serve(work, o).await?;
    let opts = MountOptions { transport: Arc::new(TcpTransport), ..MountOptions::default() };
    let fs = FileSystem::mount(local.mgs(), opts).await.map_err(bad)?;
    let md = MdsBenchOptions { files: o.files, clients: o.clients, ..MdsBenchOptions::new(o.dir.clone()) };
    let mut f: [Vec<f64>; 12] = Default::default();
    let mut local_dirs = Vec::new();
    for round in 0..o.rounds.max(1) {
        let n = nacre_round(&fs, o, round).await?;
        let (l, base) = tokio::task::block_in_place(|| local_round(&o.local_dir, &md, false))?;
        local_dirs.push(base);
        let (lw, lr, ls) = tokio::task::block_in_place(|| local_io(&o.local_dir, o))?;
        let _ = writeln!(
            out,
            "round {}: nacre create {:.0}/s stat {:.0}/s unlink {:.0}/s write {:.0} MiB/s read {:.0} MiB/s strided {:.0} MiB/s | local create {:.0}/s stat {:.0}/s write {:.0} MiB/s read {:.0} MiB/s strided {:.0} MiB/s",
            round + 1,
            n.create,
            n.stat,
            n.unlink,
            n.write / 1048576.0,
            n.read / 1048576.0,
            n.strided / 1048576.0,
            l.create,
            l.stat,
            lw / 1048576.0,
            lr / 1048576.0,
            ls / 1048576.0
        );
        for (i, v) in [n.create, n.stat, n.unlink, n.write, n.read, l.create, l.stat, 0.0, lw, lr, n.strided, ls]
            .into_iter()
            .enumerate()
        {
            f[i].push(v);
        }
    }
    // Local unlinks after every round's creates (a journal-less ext4 slows on creates
    // after many deletes).
    f[7].clear();
    for base in &local_dirs {
        f[7].push(tokio::task::block_in_place(|| local_unlink(base, &md))?);
    }
    fs.unmount().await;
    drop(local);
    let b: Vec<f64> = f.iter().map(|v| peak(v)).collect();
    let mib = |x: f64| x / 1048576.0;
    let _ = writeln!(out, "\n| operation | Nacre (library) | local | ratio |\n|---|---:|---:|---:|");
    for (name, n, l) in [("create /s", b[0], b[5]), ("stat /s", b[1], b[6]), ("unlink /s", b[2], b[7])] {
        let _ = writeln!(out, "| {name} | {n:.0} | {l:.0} | {:.3} |", ratio(n, l));
    }
    for (name, n, l) in [
        ("write MiB/s (fsync)", b[3], b[8]),
        ("read MiB/s", b[4], b[9]),
        ("strided 47,008 B write MiB/s (fsync)", b[10], b[11]),
    ] {
        let _ = writeln!(out, "| {name} | {:.0} | {:.0} | {:.3} |", mib(n), mib(l), ratio(n, l));
    }
    Ok(json!({
        "bench": "client",
        "dir": o.dir.display().to_string(),
        "local_dir": o.local_dir.display().to_string(),
        "files": o.files,
        "clients": o.clients,
        "rounds": o.rounds,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "create_per_s": b[0],
        "stat_per_s": b[1],
        "unlink_per_s": b[2],
        "write_mib_s": mib(b[3]),
        "read_mib_s": mib(b[4]),
        "local_create_per_s": b[5],
        "local_stat_per_s": b[6],
        "local_unlink_per_s": b[7],
        "local_write_mib_s": mib(b[8]),
        "local_read_mib_s": mib(b[9]),
        "create_ratio": ratio(b[0], b[5]),
        "stat_ratio": ratio(b[1], b[6]),
        "unlink_ratio": ratio(b[2], b[7]),
        "write_ratio": ratio(b[3], b[8]),
        "read_ratio": ratio(b[4], b[9]),
        "strided_write_mib_s": mib(b[10]),
        "local_strided_write_mib_s": mib(b[11]),
        "strided_write_ratio": ratio(b[10], b[11]),
        // Strided small writes over 1 MiB sequential writes, both Nacre's.
        "strided_over_sequential": ratio(b[10], b[3]),
    }))
}
