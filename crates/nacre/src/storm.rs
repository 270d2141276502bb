//! `nacre bench storm`: many clients mounting one file system at once, as the mount storms
//! of CEA's 20,000-client Lustre (seed 002). The file system is a `nacre up` in a folder of
//! the bench's own, served by its own process; the clients are simulated in this process,
//! each a whole mount of the client library (`FileSystem::mount`: the configuration from
//! the MGS, the root's attributes from MDT 0, then the configuration followed by a long
//! poll and both servers pinged when idle), all started at the same instant. A mount that
//! fails is tried again after a jittered backoff, as a node's mount would be, until
//! `MOUNT_DEADLINE`.
//!
//! It reports how long until every client was mounted and the slowest single mount, the
//! tries that failed, and what the serving process's memory grew by per mounted client
//! (its resident set, read from /proc). The clients then idle for a while, and the
//! server's growth and the CPU it used meanwhile are read (idle mounts cost pings, a
//! mount that polls in a loop shows here); then they all unmount at once.
//!
//! Each client holds a connection to the MGS and one to MDT 0, so this process and the
//! server's hold two descriptors per client: without routers (not built yet), the
//! descriptor limit bounds the number of clients.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nacre_client::{FileSystem, MountOptions};
use nacre_net::nid::Nid;
use nacre_net::rpc::SplitMix;
use serde_json::json;

use crate::failover::BenchFs;

pub struct StormOptions {
    /// Where the bench makes its folder (removed afterwards).
    pub dir: PathBuf,
    /// Simulated clients.
    pub clients: usize,
    /// How long the mounted clients idle before they unmount.
    pub idle: Duration,
}

/// How long one client keeps trying to mount.
const MOUNT_DEADLINE: Duration = Duration::from_secs(300);
/// Descriptors this process keeps for itself beside its clients' connections.
const SPARE_FDS: u64 = 256;

/// The resident set of process `pid`, in bytes.
fn rss(pid: i32) -> Result<u64, Box<dyn std::error::Error>> {
    let p = format!("/proc/{pid}/status");
    let s = std::fs::read_to_string(&p).map_err(|e| format!("{p}: {e}"))?;
    let kib = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| format!("{p} has no VmRSS line"))?;
    Ok(kib << 10)
}

/// CPU time process `pid` has used (user and system), in seconds.
fn cpu_s(pid: i32) -> Result<f64, Box<dyn std::error::Error>> {
    let p = format!("/proc/{pid}/stat");
    let s = std::fs::read_to_string(&p).map_err(|e| format!("{p}: {e}"))?;
    // After the command name (in parentheses, which may hold spaces): utime and stime
    // are the 12th and 13th fields.
    let rest = s.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| format!("{p}: no command name"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or_else(|| format!("{p}: field {i}"));
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((ticks(11)? + ticks(12)?) as f64 / hz)
}

/// This process's descriptor limit, raised to its hard limit.
fn fd_limit() -> u64 {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit on this process with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 1024;
        }
        if l.rlim_cur < l.rlim_max {
            let raised = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                l.rlim_cur = l.rlim_max;
            }
        }
    }
    l.rlim_cur
}

/// What one client's mount took: the tries that failed, how long it took in all, and the
/// mount (`None`: it never mounted; the last error).
struct Mounted {
    failed_tries: u32,
    took: Duration,
    fs: Result<FileSystem, String>,
}

/// Mount as a node would: on failure wait a jittered backoff (growing from 0.1 s to 5 s)
/// and try again, until [`MOUNT_DEADLINE`].
async fn mount_one(mgs: Nid, seed: u64, started: Instant) -> Mounted {
    let mut failed_tries = 0;
    let mut jitter = SplitMix(seed);
    loop {
        match FileSystem::mount(&mgs, MountOptions::default()).await {
            Ok(fs) => return Mounted { failed_tries, took: started.elapsed(), fs: Ok(fs) },
            Err(e) if started.elapsed() >= MOUNT_DEADLINE => {
                return Mounted { failed_tries: failed_tries + 1, took: started.elapsed(), fs: Err(e.to_string()) };
            }
            Err(_) => {
                failed_tries += 1;
                let ceiling_ms = (100u64 << failed_tries.min(6)).min(5_000);
                let wait = Duration::from_millis(ceiling_ms / 2 + jitter.next_u64() % (ceiling_ms / 2 + 1));
                tokio::time::sleep(wait).await;
            }
        }
    }
}

pub fn run(o: &StormOptions, out: &mut dyn Write) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let limit = fd_limit();
    let needed = 2 * o.clients as u64 + SPARE_FDS;
    if needed > limit {
        return Err(format!(
            "--clients {}: each client holds a connection to the MGS and one to MDT 0, so this process and the \
             server's need {needed} descriptors, past the limit of {limit} here; more clients need routers to \
             share connections, which Nacre does not have yet",
            o.clients
        )
        .into());
    }
    let root = o.dir.join(format!("nacre-bench-storm-{}", std::process::id()));
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let served = BenchFs { data: root.join("data"), mnt: root.join("mnt"), root };
    let port = crate::failover::spare_port().ok_or("no free TCP port for the MGS between 20000 and 32000")?;
    // The server inherits the raised limit.
    let up = BenchFs::nacre()?
        .args(["up", "--osts", "1", "--ost-size", "64M", "--mdt-size", "64M", "--port", &port.to_string()])
        .arg("--data")
        .arg(&served.data)
        .output()?;
    if !up.status.success() {
        return Err(format!("nacre up: {}", String::from_utf8_lossy(&up.stderr)).into());
    }
    let pid = served.pid("")?;
    let mgs: Nid = format!("127.0.0.1@tcp:{port}").parse()?;
    writeln!(out, "file system up in {} (process {pid}), MGS at {mgs}", served.data.display())?;

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let rss_before = rss(pid)?;
    let own_before = rss(std::process::id() as i32)?;
    writeln!(out, "{} clients mount at once", o.clients)?;
    let started = Instant::now();
    let mounted: Vec<Mounted> = rt.block_on(async {
        let tasks: Vec<_> = (0..o.clients)
            .map(|i| tokio::spawn(mount_one(mgs.clone(), (i as u64) << 20 | u64::from(port), started)))
            .collect();
        let mut all = Vec::with_capacity(tasks.len());
        for t in tasks {
            all.push(t.await.unwrap_or_else(|e| Mounted {
                failed_tries: 1,
                took: started.elapsed(),
                fs: Err(format!("the mount task failed: {e}")),
            }));
        }
        all
    });
    let mount_s = started.elapsed().as_secs_f64();
    let failed_tries: u64 = mounted.iter().map(|m| u64::from(m.failed_tries)).sum();
    let slowest = mounted.iter().map(|m| m.took).max().unwrap_or_default().as_secs_f64();
    let (mut fss, mut errors) = (Vec::new(), Vec::new());
    for m in mounted {
        match m.fs {
            Ok(fs) => fss.push(fs),
            Err(e) => errors.push(e),
        }
    }
    // Let what the mounts started (config polls, first pings) settle before measuring.
    std::thread::sleep(Duration::from_secs(1));
    let rss_mounted = rss(pid)?;
    let own_mounted = rss(std::process::id() as i32)?;
    let per_client = |grown: u64| grown / fss.len().max(1) as u64;
    let bytes_per_client = per_client(rss_mounted.saturating_sub(rss_before));
    writeln!(
        out,
        "mounted: {} of {} in {mount_s:.2} s (slowest {slowest:.2} s), {failed_tries} tries failed; server \
         {} MiB -> {} MiB, {bytes_per_client} bytes per client; this process {} bytes per client",
        fss.len(),
        o.clients,
        rss_before >> 20,
        rss_mounted >> 20,
        per_client(own_mounted.saturating_sub(own_before)),
    )?;
    if let Some(e) = errors.first() {
        writeln!(out, "{} clients never mounted; the first said: {e}", errors.len())?;
    }
    let (cpu_before, idle_started) = (cpu_s(pid)?, Instant::now());
    std::thread::sleep(o.idle);
    let idle_cpu = (cpu_s(pid)? - cpu_before) / idle_started.elapsed().as_secs_f64();
    let rss_idle = rss(pid)?;
    let idle_bytes_per_client = per_client(rss_idle.saturating_sub(rss_before));
    writeln!(
        out,
        "after {} s idle: server {} MiB, {idle_bytes_per_client} bytes per client, {:.1}% of a core busy",
        o.idle.as_secs(),
        rss_idle >> 20,
        idle_cpu * 100.0
    )?;
    let started = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = fss.into_iter().map(|fs| tokio::spawn(async move { fs.unmount().await })).collect();
        for t in tasks {
            let _ = t.await;
        }
    });
    let unmount_s = started.elapsed().as_secs_f64();
    writeln!(out, "unmounted in {unmount_s:.2} s")?;
    rt.shutdown_timeout(Duration::from_secs(5));
    Ok(json!({
        "bench": "storm",
        "clients": o.clients,
        "mounted": o.clients - errors.len(),
        "mount_failures": errors.len(),
        "failed_tries": failed_tries,
        "mount_s": mount_s,
        "slowest_mount_s": slowest,
        "bytes_per_client": bytes_per_client,
        "idle_bytes_per_client": idle_bytes_per_client,
        "idle_server_cpu_cores": idle_cpu,
        "server_rss_before_bytes": rss_before,
        "server_rss_mounted_bytes": rss_mounted,
        "unmount_s": unmount_s,
    }))
}
