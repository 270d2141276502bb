//! `nacre bench failover`: a failover pair on this machine (`nacre up --ha`) under a
//! mixed load through its mount, while an operator moves the MDT to the other node and
//! back (`nacre failover`, `nacre failback`), then the network of the node serving the MDT
//! fails (its process lives on), then that node is killed (SIGKILL), comes back as a
//! standby, and then its partner is stopped (SIGSTOP, a hung node) and resumed.
//! It reports the longest pause a program saw, checks every byte that was acknowledged
//! (fsync returned), and races two takers for the same drives many times.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nacre_raid::lease::{Held, LeaseError, LeaseOptions};
use nacre_raid::{BlockDevice, FileDrive, Provision};

pub struct FailoverOptions {
    /// Where the bench makes its folder (removed afterwards).
    pub dir: PathBuf,
    /// Programs writing through the mount.
    pub writers: usize,
    /// How long the load runs between events.
    pub settle: Duration,
    /// Races of two takers for one set of drives.
    pub races: usize,
}

/// A file as a writer last finished it: fsync returned, so it must read back.
struct Acked {
    len: usize,
    seed: u64,
}

/// Files each writer cycles through (overwriting them), so the load fits the targets
/// however long it runs.
const FILES_PER_WRITER: u64 = 24;

/// What the writers saw: each operation's start and duration, the files acknowledged
/// (the last write of each path), how many writes were, the errors.
#[derive(Default)]
struct Load {
    ops: Vec<(Instant, Duration)>,
    acked: std::collections::BTreeMap<PathBuf, Acked>,
    writes_acked: usize,
    errors: Vec<String>,
}

/// The bytes of a file written with `seed` (IO500's verification pattern).
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0; len];
    nacre_bench::io500::pattern::fill(&mut b, seed, 0);
    b
}

/// Sizes the writers cycle through: on the MDT (DoM), across it, one and several stripes.
const SIZES: [usize; 4] = [4096, 100_000, 1 << 20, 3 << 20];

fn writer(dir: PathBuf, w: usize, stop: Arc<AtomicBool>, load: Arc<Mutex<Load>>) {
    let mut k = 0u64;
    while !stop.load(Ordering::Acquire) {
        let (len, seed) = (SIZES[k as usize % SIZES.len()], (w as u64) << 32 | k);
        let path = dir.join(format!("f{}", k % FILES_PER_WRITER));
        let started = Instant::now();
        let r = (|| -> Result<(), String> {
            let mut f = std::fs::File::create(&path).map_err(|e| format!("create: {e}"))?;
            f.write_all(&content(seed, len)).map_err(|e| format!("write: {e}"))?;
            f.sync_all().map_err(|e| format!("fsync: {e}"))
        })();
        let took = started.elapsed();
        let mut l = load.lock().unwrap_or_else(|e| e.into_inner());
        l.ops.push((started, took));
        match r {
            Ok(()) => {
                l.acked.insert(path, Acked { len, seed });
                l.writes_acked += 1;
            }
            Err(e) => {
                // What the failed write left there is not known.
                l.acked.remove(&path);
                l.errors.push(format!("{}: {e}", path.display()));
            }
        }
        k += 1;
    }
}

/// A bench's file system (`nacre up`, here `--ha`) in a folder of its own, its data in
/// `data` and its mount, if any, on `mnt`: taken down, unmounted and removed on drop
/// whatever happened (unless `NACRE_BENCH_KEEP` is set).
pub(crate) struct BenchFs {
    pub(crate) root: PathBuf,
    pub(crate) data: PathBuf,
    pub(crate) mnt: PathBuf,
}

impl BenchFs {
    pub(crate) fn nacre() -> Result<Command, Box<dyn std::error::Error>> {
        Ok(Command::new(std::env::current_exe()?))
    }

    /// The pid of the serving process of `node` (`""`: `up`'s own process).
    pub(crate) fn pid(&self, node: &str) -> Result<i32, Box<dyn std::error::Error>> {
        let name = if node.is_empty() { "nacre.pid".to_string() } else { format!("nacre-{node}.pid") };
        let p = self.data.join(name);
        Ok(std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?.trim().parse()?)
    }

    fn log(&self, node: &str) -> String {
        std::fs::read_to_string(self.data.join(format!("nacre-{node}.log"))).unwrap_or_default()
    }

    /// Wait until `node`'s log has grown past `from` bytes with every line in `lines`.
    fn wait_log(&self, node: &str, from: usize, lines: &[String], limit: Duration) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let log = self.log(node);
            let new = log.get(from..).unwrap_or("");
            if lines.iter().all(|l| new.contains(l.as_str())) {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(format!("node {node} did not say {lines:?} within {limit:?}:\n{new}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for BenchFs {
    fn drop(&mut self) {
        if std::env::var_os("NACRE_BENCH_KEEP").is_some() {
            return;
        }
        if let Ok(mut c) = BenchFs::nacre() {
            let _ = c.arg("down").arg("--data").arg(&self.data).output();
        }
        if crate::fsys::is_mounted(&self.mnt) {
            let _ = crate::fsys::unmount(&self.mnt, true);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A free port for the MGS below the kernel's ephemeral range (32768 and up), from which
/// connections take theirs, with the 15 after it free too (the nodes' fixed ports).
pub(crate) fn spare_port() -> Option<u16> {
    let start = std::process::id() % 750;
    (0..750)
        .map(|i| (20_000 + 16 * ((start + i) % 750)) as u16)
        .find(|&p| (p..p + 16).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()))
}

fn signal(pid: i32, sig: libc::c_int) -> Result<(), String> {
    // SAFETY: kill(2) on a process of the bench's own file system.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(format!("signal {sig} to {pid}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn alive(pid: i32) -> bool {
    !u32::try_from(pid).is_ok_and(nacre_raid::lease::process_gone)
}

/// The longest operation that ended in `[from, to)`: the pause an event caused is seen by
/// the operations in flight at it, which end after it.
fn longest(ops: &[(Instant, Duration)], from: Instant, to: Instant) -> Duration {
    ops.iter().filter(|(s, d)| (from..to).contains(&(*s + *d))).map(|(_, d)| *d).max().unwrap_or_default()
}

pub fn run(o: &FailoverOptions, out: &mut dyn Write) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let root = o.dir.join(format!("nacre-bench-failover-{}", std::process::id()));
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let pair = BenchFs { data: root.join("data"), mnt: root.join("mnt"), root };
    std::fs::create_dir_all(&pair.mnt)?;
    let port = spare_port().ok_or("no free TCP port for the MGS between 20000 and 32000")?;
    let up = BenchFs::nacre()?
        .args(["up", "--ha", "--osts", "2", "--ost-size", "256M", "--mdt-size", "128M", "--port", &port.to_string()])
        .arg("--data")
        .arg(&pair.data)
        .arg("--mount")
        .arg(&pair.mnt)
        .output()?;
    if !up.status.success() {
        return Err(format!("nacre up --ha: {}", String::from_utf8_lossy(&up.stderr)).into());
    }
    if std::env::var_os("NACRE_BENCH_KEEP").is_some() {
        writeln!(out, "(NACRE_BENCH_KEEP: {} stays)", pair.root.display())?;
    }
    writeln!(out, "failover pair up in {}: node a serves MDT0 and OST0, node b OST1", pair.data.display())?;

    let (stop, load) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Load::default())));
    let mut threads = Vec::new();
    for w in 0..o.writers {
        let dir = pair.mnt.join(format!("w{w}"));
        std::fs::create_dir(&dir)?;
        // Every file over both OSTs, the first 64 KiB on the MDT (the default layout's DoM).
        let s = BenchFs::nacre()?
            .args(["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", "-c", "-1", "-S", "1M"])
            .arg(&dir)
            .output()?;
        if !s.status.success() {
            return Err(format!("setstripe: {}", String::from_utf8_lossy(&s.stderr)).into());
        }
        let (stop, load) = (stop.clone(), load.clone());
        threads.push(std::thread::spawn(move || writer(dir, w, stop, load)));
    }
    let result = events(o, &pair, out);
    stop.store(true, Ordering::Release);
    for t in threads {
        let _ = t.join();
    }
    let Events { move_at, net_at, kill_at, stop_at, stepped_down } = result?;
    let load = std::mem::take(&mut *load.lock().unwrap_or_else(|e| e.into_inner()));

    // Every acknowledged file, read back.
    let mut lost = Vec::new();
    for (path, a) in &load.acked {
        let mut back = Vec::new();
        let read = std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut back));
        let differs = nacre_bench::io500::pattern::first_difference(&back, a.seed, 0).is_some();
        if read.is_err() || back.len() != a.len || differs {
            lost.push(path.display().to_string());
        }
    }
    let end = Instant::now() + Duration::from_secs(3600);
    let max = load.ops.iter().map(|(_, d)| *d).max().unwrap_or_default();
    let (move_pause, net_pause) = (longest(&load.ops, move_at, net_at), longest(&load.ops, net_at, kill_at));
    let (kill_pause, stop_pause) = (longest(&load.ops, kill_at, stop_at), longest(&load.ops, stop_at, end));
    writeln!(
        out,
        "writes {}, acknowledged {} (the last of each of {} files read back), errors {}",
        load.ops.len(),
        load.writes_acked,
        load.acked.len(),
        load.errors.len()
    )?;
    for e in load.errors.iter().take(5) {
        writeln!(out, "  error: {e}")?;
    }
    writeln!(
        out,
        "longest pause: {:.1} s over the moves, {:.1} s after the network failed, {:.1} s after the kill, {:.1} s \
         after the stop",
        move_pause.as_secs_f64(),
        net_pause.as_secs_f64(),
        kill_pause.as_secs_f64(),
        stop_pause.as_secs_f64()
    )?;
    writeln!(
        out,
        "acknowledged files lost or different: {}{}",
        lost.len(),
        lost.first().map(|l| format!(" (first {l})")).unwrap_or_default()
    )?;

    let (races, two, none) = race(&pair.root.join("race"), o.races)?;
    writeln!(out, "lease races: {races}; ended with two writers: {two}; with no holder: {none}")?;
    Ok(serde_json::json!({
        "max_pause_s": max.as_secs_f64(),
        "pause_over_moves_s": move_pause.as_secs_f64(),
        "pause_after_network_failure_s": net_pause.as_secs_f64(),
        "pause_after_kill_s": kill_pause.as_secs_f64(),
        "pause_after_stop_s": stop_pause.as_secs_f64(),
        "verified": lost.is_empty() && load.errors.is_empty() && !load.acked.is_empty(),
        "lost_acknowledged": lost.len(),
        "files_acknowledged": load.writes_acked,
        "files_checked": load.acked.len(),
        "errors": load.errors.len(),
        "stepped_down": stepped_down,
        "double_serve_races": races,
        "double_serve_failures": two,
        "no_holder_races": none,
    }))
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> &str {
    let cut = text.trim_end().rmatch_indices('\n').nth(n.saturating_sub(1)).map_or(0, |(i, _)| i + 1);
    &text[cut..]
}

/// When each event began, and whether node b stepped down (and stood by) on waking.
struct Events {
    move_at: Instant,
    net_at: Instant,
    kill_at: Instant,
    stop_at: Instant,
    stepped_down: bool,
}

/// Run `nacre ARGS --data DATA` (a move); its lines saying what moved go to `out`.
fn operate(pair: &BenchFs, args: &[&str], out: &mut dyn Write) -> Result<(), Box<dyn std::error::Error>> {
    let m = BenchFs::nacre()?.args(args).arg("--data").arg(&pair.data).output()?;
    if !m.status.success() {
        // What each node did meanwhile is the why (the command only sees the drives and
        // the MGS).
        let tails: String =
            ["a", "b"].iter().map(|n| format!("\n--- node {n}'s log, its end:\n{}", tail(&pair.log(n), 40))).collect();
        return Err(format!("nacre {}: {}{tails}", args.join(" "), String::from_utf8_lossy(&m.stderr)).into());
    }
    for line in String::from_utf8_lossy(&m.stdout).lines().filter(|l| l.contains("moved")) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Node a started again from the cluster file (it stands by for what b serves).
fn restart_a(pair: &BenchFs, out: &mut dyn Write) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = pair.data.join("cluster.toml");
    let back = BenchFs::nacre()?.args(["server", "--config"]).arg(&cluster).args(["--node", "a"]).output()?;
    if !back.status.success() {
        return Err(format!("node a back: {}", String::from_utf8_lossy(&back.stderr)).into());
    }
    writeln!(out, "node a back: {}", String::from_utf8_lossy(&back.stdout).trim())?;
    Ok(())
}

/// Where the MGS lists `target` first (its active NID), from `nacre status --json`.
fn active_nid(pair: &BenchFs, target: &str) -> Result<String, Box<dyn std::error::Error>> {
    let s = BenchFs::nacre()?.args(["status", "--json", "--data"]).arg(&pair.data).output()?;
    let v: serde_json::Value = serde_json::from_slice(&s.stdout)?;
    let rows = v["targets"].as_array().ok_or("nacre status --json: no targets")?;
    let nids = rows.iter().find(|r| r["target"] == target).and_then(|r| r["nids"].as_str()).unwrap_or_default();
    Ok(nids.split(',').next().filter(|n| !n.is_empty()).ok_or(format!("no NID listed for {target}"))?.to_string())
}

/// The events, under load: move MDT0 to node b and back; fail node a's network (b takes
/// its targets; a, restarted, takes them back); kill node a, bring it back as a standby,
/// stop node b, resume it.
fn events(o: &FailoverOptions, pair: &BenchFs, out: &mut dyn Write) -> Result<Events, Box<dyn std::error::Error>> {
    std::thread::sleep(o.settle);
    let move_at = Instant::now();
    for args in [&["failover", "MDT0"][..], &["failback"][..]] {
        operate(pair, args, out)?;
        std::thread::sleep(o.settle);
    }
    let moved = |node: &str, targets: &[&str]| -> Vec<String> {
        targets.iter().map(|t| format!("{t}: served by node {node}")).collect()
    };

    // Everything node a sends is dropped but connects and parameters; its process and
    // its leases live on.
    let (at, from_b) = (active_nid(pair, "MDT0")?, pair.log("b").len());
    let rule = "net.fault_rules=drop except=1,200,201";
    let set = BenchFs::nacre()?.args(["set-param", "--server", &at, rule]).output()?;
    if !set.status.success() {
        return Err(format!("set-param {rule}: {}", String::from_utf8_lossy(&set.stderr)).into());
    }
    let net_at = Instant::now();
    pair.wait_log("b", from_b, &moved("b", &["MDT0", "OST0"]), Duration::from_secs(120))?;
    writeln!(
        out,
        "node a's network failed: node b serves MDT0 and OST0 after {:.1} s",
        net_at.elapsed().as_secs_f64()
    )?;
    std::thread::sleep(o.settle);
    // Its network mended (a restart: it serves nothing there is to clear the rules on),
    // node a takes its targets back.
    let a = pair.pid("a")?;
    signal(a, libc::SIGKILL)?;
    let killed = Instant::now();
    while alive(a) && killed.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    restart_a(pair, out)?;
    operate(pair, &["failback"], out)?;
    std::thread::sleep(o.settle);

    let (a, from_b) = (pair.pid("a")?, pair.log("b").len());
    signal(a, libc::SIGKILL)?;
    let kill_at = Instant::now();
    pair.wait_log("b", from_b, &moved("b", &["MDT0", "OST0"]), Duration::from_secs(120))?;
    writeln!(out, "node a killed: node b serves MDT0 and OST0 after {:.1} s", kill_at.elapsed().as_secs_f64())?;
    std::thread::sleep(o.settle);
    restart_a(pair, out)?;
    std::thread::sleep(o.settle);

    let (b, from_a) = (pair.pid("b")?, pair.log("a").len());
    signal(b, libc::SIGSTOP)?;
    let stop_at = Instant::now();
    let taken = pair.wait_log("a", from_a, &moved("a", &["MDT0", "OST0", "OST1"]), Duration::from_secs(120));
    if let Err(e) = taken {
        let _ = signal(b, libc::SIGCONT);
        return Err(e.into());
    }
    writeln!(out, "node b stopped: node a serves every target after {:.1} s", stop_at.elapsed().as_secs_f64())?;
    std::thread::sleep(o.settle);
    // Woken, b finds its leases gone: it stops serving those targets and stands by for
    // them, alive.
    let from_b = pair.log("b").len();
    signal(b, libc::SIGCONT)?;
    let woke = Instant::now();
    let stood_by = || {
        let log = pair.log("b");
        let since = log.get(from_b..).unwrap_or_default();
        since.contains("stepping down") && since.contains("served by node a; standing by")
    };
    while !stood_by() && woke.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stepped_down = alive(b) && stood_by();
    writeln!(
        out,
        "node b resumed: {}",
        if stepped_down { "it stepped down and stands by" } else { "it did NOT step down and stand by" }
    )?;
    std::thread::sleep(o.settle / 2);
    Ok(Events { move_at, net_at, kill_at, stop_at, stepped_down })
}

/// `n` races of two takers for four shared drive files: how many ended with two writers
/// (one's writes allowed after the other's began), and how many with no holder.
fn race(dir: &Path, n: usize) -> Result<(usize, usize, usize), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("d{i}"))).collect();
    for p in &paths {
        drop(FileDrive::create_file(p, 2 << 20, Provision::Thin)?);
    }
    let open = || -> Result<Vec<Arc<dyn BlockDevice>>, nacre_raid::RaidError> {
        paths.iter().map(|p| FileDrive::open_shared(p).map(|d| Arc::new(d) as Arc<dyn BlockDevice>)).collect()
    };
    // Times a loaded machine keeps to (a holder must renew within 100 ms), short enough
    // for a hundred races in half a minute.
    let opts = |node: &str| LeaseOptions {
        node: node.into(),
        interval: Duration::from_millis(20),
        expiry: Duration::from_millis(200),
    };
    let (mut two, mut none) = (0, 0);
    for _ in 0..n {
        let go = Arc::new(std::sync::Barrier::new(2));
        let takers: Vec<_> = [("x", 0u64), ("y", 7)]
            .into_iter()
            .map(|(node, pause)| {
                let (d, go, o) = (open(), go.clone(), opts(node));
                std::thread::spawn(move || -> Option<Held> {
                    let d = d.ok()?;
                    go.wait();
                    // A race lost is tried again, as a monitor does.
                    loop {
                        match Held::acquire(d.clone(), &o) {
                            Err(LeaseError::Raced { .. }) => std::thread::sleep(Duration::from_millis(1 + pause)),
                            r => return r.ok(),
                        }
                    }
                })
            })
            .collect();
        let held: Vec<Held> = takers.into_iter().filter_map(|t| t.join().ok().flatten()).collect();
        std::thread::sleep(Duration::from_millis(50));
        let serving = held.iter().filter(|h| h.fence().lost().is_none()).count();
        let overlap = match &held[..] {
            [x, y] => {
                let (first, second) = if x.fence().lost().is_some() { (x, y) } else { (y, x) };
                first.fence().window().1.is_none_or(|end| end > second.fence().window().0)
            }
            _ => false,
        };
        if serving > 1 || overlap {
            two += 1;
        } else if serving == 0 {
            none += 1;
        }
    }
    Ok((n, two, none))
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(tail("a\nb\nc", 5), "a\nb\nc");
        assert_eq!(tail("", 3), "");
        assert_eq!(tail("one line\n", 1), "one line\n");
    }
}
