//! `nacre bench mdt`: the MDT's engine alone, in process, with no transport. `threads`
//! threads call [`Namespace`] directly, each in its own directory, against the local file
//! system doing the same work with as many threads, in the same run:
//!
//! - create: each thread makes `files / threads` empty files;
//! - stat: each looks up each of its names and gets its attributes (as stat(2) of a
//!   path does);
//! - rename: each renames each of its files within its directory;
//! - unlink: each removes them.
//!
//! Each thread is a client: its changes carry reply keys as the MDS's do. By default
//! they answer once applied in memory and staged in the log (replies before commit, the
//! MDT's design); `sync_on_reply` makes each wait for its log write instead.
//!
//! Rounds interleave Nacre and the reference and keep the best of each, because these
//! machines are shared and noisy. Each round of the reference works in a fresh folder,
//! and its unlinks are timed only after every round: a journal-less ext4 crawls on
//! creates after many deletes, even in a new directory (it avoids recently freed
//! inodes; with the unlinks in each round, creates went 34K → 12K → 4.8K/s over three
//! rounds of 20,000 files).
//!
//! Then an MDT holding many files (`startup_files`, the million by default): the
//! memory it holds per file (the heap's growth while the files are made, once a
//! checkpoint took the log's records that waited for it; read from a counting allocator
//! the program installed, as the `nacre` binary does, else the resident set's growth),
//! and the seconds [`Namespace::open`] takes to start it again.
//!
//! The drive files and the reference's folders are removed at the end, on error too.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use nacre_proto::fid::Fid;
use nacre_proto::mdt::mode;
use nacre_server::mdt::{Cred, Namespace, NamespaceOptions, RenameMode, ReplyKey};
use serde_json::{Value, json};

use crate::mds::{bad, drive_bytes, mdt_volume};
use crate::raid::{BenchError, peak, ratio, timed};

/// A counting global allocator the program installed. Counting is off until
/// `counting(true)`, so that the services of the same binary do not pay an atomic add on
/// every allocation; while on, `net_bytes` reads the bytes allocated less the bytes freed
/// since it started. The difference of two readings is the heap's growth between them
/// (a block freed meanwhile counts whenever it was allocated).
#[derive(Debug, Clone, Copy)]
pub struct HeapCounter {
    pub counting: fn(bool),
    pub net_bytes: fn() -> i64,
}

#[derive(Debug, Clone)]
pub struct MdtBenchOptions {
    /// Folder of the MDT's drive files (/dev/shm: the CPU-bound case).
    pub dir: PathBuf,
    /// The local file system the reference runs on.
    pub local_dir: PathBuf,
    /// Files per phase, over all threads.
    pub files: u64,
    pub threads: usize,
    pub rounds: usize,
    /// Files of the MDT whose memory and start-up are measured.
    pub startup_files: u64,
    /// Changes answer once on the drives (`mdt.*.sync_on_reply=1`) rather than once
    /// applied and staged in the log.
    pub sync_on_reply: bool,
    /// The program's counting allocator; without one, memory is the resident set's
    /// growth (coarser: pages, and memory the allocator keeps after frees).
    pub heap: Option<HeapCounter>,
}

impl MdtBenchOptions {
    pub fn new(dir: PathBuf) -> MdtBenchOptions {
        MdtBenchOptions {
            dir,
            local_dir: PathBuf::from("/tmp"),
            files: 40_000,
            threads: 8,
            rounds: 3,
            startup_files: 1_000_000,
            sync_on_reply: false,
            heap: None,
        }
    }
}

/// Threads that fill the start-up MDT: enough concurrent changes that each log write
/// carries many.
const FILL_THREADS: usize = 64;

/// Room a file takes in the start-up MDT's database (its inode and entry in redb's
/// pages), with a margin: 200,000 files made a database file of 506-674 bytes a file,
/// 1,000,000 one of 793 ([`drive_bytes`] leaves room for its growth by doubling).
const STARTUP_BYTES_PER_FILE: u64 = 1024;

/// Room a file takes on the MDT's drives through one round (made, stated, renamed,
/// removed): about 4 KiB of image and log, mirrored over two pairs.
const ROUND_BYTES_PER_FILE: u64 = 8 << 10;

/// A round's phases, in order, and the ratio over the reference each should reach (the
/// issue's targets).
const PHASES: [(&str, &str); 4] = [("create", "≥ 1.0"), ("stat", ""), ("rename", ""), ("unlink", "≥ 1.0")];

/// Rates (per second) of one round's phases, in the order of [`PHASES`].
type Rates = [f64; 4];
/// The unlink phase's place in [`PHASES`].
const UNLINK: usize = 3;

/// Seconds for every thread `i` of `threads` to run `op(i, j)` for each `j` below `per`.
fn phase(
    threads: usize,
    per: u64,
    op: impl Fn(usize, u64) -> Result<(), BenchError> + Sync,
) -> Result<f64, BenchError> {
    timed(threads, |_| (), |i, _| (0..per).try_for_each(|j| op(i, j)))
}

/// One round on the MDT: each thread in its own new directory of the root, removed
/// (empty, which checks every unlink) at the end.
fn nacre_round(ns: &Namespace, o: &MdtBenchOptions, round: usize) -> Result<Rates, BenchError> {
    let per = o.files / o.threads as u64;
    let cred = Cred::root();
    let dir_name = |i: usize| format!("r{round}-t{i}");
    let dirs = (0..o.threads)
        .map(|i| ns.mkdir(&cred, Fid::ROOT, &dir_name(i), 0o755, None).map(|a| a.fid))
        .collect::<Result<Vec<Fid>, _>>()
        .map_err(bad)?;
    // Each thread is a client, and each change carries its reply key as the MDS's do
    // (its answer is stored, the one before it acknowledged and dropped).
    let key = |i: usize, phase: u64, j: u64| {
        let xid = ((round as u64 * 4 + phase) * per + j) + 1;
        Some(ReplyKey { client: 1000 + i as u64, xid, acked_below: xid, digest: phase as u32 })
    };
    let create = phase(o.threads, per, |i, j| {
        ns.create(&cred, dirs[i], &format!("f{j}"), 0o644, key(i, 0, j)).map(drop).map_err(bad)
    })?;
    let stat = phase(o.threads, per, |i, j| {
        let a = ns.lookup(&cred, dirs[i], &format!("f{j}")).map_err(bad)?;
        if a.mode & mode::S_IFMT != mode::S_IFREG {
            return Err(BenchError::Verify(format!("f{j} of thread {i} has mode {:o}", a.mode)));
        }
        Ok(())
    })?;
    let rename = phase(o.threads, per, |i, j| {
        let (from, to) = (format!("f{j}"), format!("g{j}"));
        ns.rename(&cred, dirs[i], &from, dirs[i], &to, RenameMode::Replace, key(i, 1, j)).map_err(bad)
    })?;
    let unlink =
        phase(o.threads, per, |i, j| ns.remove(&cred, dirs[i], &format!("g{j}"), false, key(i, 2, j)).map_err(bad))?;
    for i in 0..o.threads {
        ns.remove(&cred, Fid::ROOT, &dir_name(i), true, None).map_err(bad)?;
    }
    let total = (per * o.threads as u64) as f64;
    Ok([create, stat, rename, unlink].map(|secs| total / secs))
}

/// The local file system doing the same in the fresh folder `base`, but for the unlinks:
/// the files are left, renamed, for [`local_unlink`] after every round (the rate of
/// unlink is 0 here).
fn local_round(base: &Path, o: &MdtBenchOptions) -> Result<Rates, BenchError> {
    let per = o.files / o.threads as u64;
    let dirs = local_dirs(base, o);
    for d in &dirs {
        std::fs::create_dir_all(d)?;
    }
    let create = phase(o.threads, per, |i, j| Ok(std::fs::File::create(dirs[i].join(format!("f{j}"))).map(drop)?))?;
    let stat = phase(o.threads, per, |i, j| {
        if !std::fs::metadata(dirs[i].join(format!("f{j}")))?.is_file() {
            return Err(BenchError::Verify(format!("f{j} of thread {i} is not a file")));
        }
        Ok(())
    })?;
    let rename = phase(o.threads, per, |i, j| {
        Ok(std::fs::rename(dirs[i].join(format!("f{j}")), dirs[i].join(format!("g{j}")))?)
    })?;
    let total = (per * o.threads as u64) as f64;
    Ok([total / create, total / stat, total / rename, 0.0])
}

/// The threads' folders of a local round in `base`.
fn local_dirs(base: &Path, o: &MdtBenchOptions) -> Vec<PathBuf> {
    (0..o.threads).map(|i| base.join(format!("t{i}"))).collect()
}

/// The unlinks of a local round (its threads removing their renamed files), then its
/// folders, removed empty (which checks every unlink); returns the unlink rate.
fn local_unlink(base: &Path, o: &MdtBenchOptions) -> Result<f64, BenchError> {
    let per = o.files / o.threads as u64;
    let dirs = local_dirs(base, o);
    let secs = phase(o.threads, per, |i, j| Ok(std::fs::remove_file(dirs[i].join(format!("g{j}")))?))?;
    for d in &dirs {
        std::fs::remove_dir(d)?;
    }
    std::fs::remove_dir(base)?;
    Ok((per * o.threads as u64) as f64 / secs)
}

/// This process's resident set (`VmRSS` of /proc/self/status), in bytes.
fn rss_bytes() -> Result<i64, BenchError> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<i64>().ok())
        .map(|kb| kb << 10)
        .ok_or_else(|| BenchError::Bad("no VmRSS in /proc/self/status".into()))
}

/// What the start-up MDT showed.
struct Startup {
    /// Files made per second while filling it.
    fill_per_s: f64,
    /// The heap's growth while the files were made, if the program counts it.
    heap_bytes: Option<i64>,
    /// The resident set's growth meanwhile.
    rss_bytes: i64,
    /// Bytes of all the files' names.
    name_bytes: u64,
    /// Bytes the database took on its volume.
    db_bytes: u64,
    /// Seconds [`Namespace::open`] took.
    open_s: f64,
}

/// Fill a new MDT in `dir` with `o.startup_files` empty files (`FILL_THREADS` threads, a
/// directory each), measuring memory meanwhile; close it, then time its start-up and
/// check it holds every file.
fn startup(dir: &Path, o: &MdtBenchOptions) -> Result<Startup, BenchError> {
    let files = o.startup_files;
    let volume = mdt_volume(dir, drive_bytes(files * STARTUP_BYTES_PER_FILE))?;
    let opts = NamespaceOptions::default();
    let ns = Namespace::format(volume.clone(), 0, opts).map_err(bad)?;
    let threads = FILL_THREADS.min(files as usize);
    let count = |i: usize| files / threads as u64 + u64::from((i as u64) < files % threads as u64);
    let cred = Cred::root();
    let dirs = (0..threads)
        .map(|i| ns.mkdir(&cred, Fid::ROOT, &format!("s{i}"), 0o755, None).map(|a| a.fid))
        .collect::<Result<Vec<Fid>, _>>()
        .map_err(bad)?;
    let name_bytes = AtomicU64::new(0);
    let heap_before = o.heap.map(|h| {
        (h.counting)(true);
        (h.net_bytes)()
    });
    let rss_before = rss_bytes()?;
    let filled = timed(
        threads,
        |_| (),
        |i, _| {
            let mut names = 0;
            for j in 0..count(i) {
                let name = format!("f{j}");
                names += name.len() as u64;
                ns.create(&cred, dirs[i], &name, 0o644, None).map_err(bad)?;
            }
            name_bytes.fetch_add(names, Ordering::Relaxed);
            Ok(())
        },
    );
    // What the namespace holds, without the log's records waiting for their checkpoint
    // (they are bounded by the log's size, not by the files).
    ns.checkpoint().map_err(bad)?;
    let heap_bytes = o.heap.zip(heap_before).map(|(h, before)| {
        let grown = (h.net_bytes)() - before;
        (h.counting)(false);
        grown
    });
    let fill_s = filled?;
    let rss_grown = rss_bytes()? - rss_before;
    // The root, a directory per thread, the files.
    let holds = |ns: &Namespace, when: &str| -> Result<(), BenchError> {
        let inodes = ns.statfs().map_err(bad)?.inodes;
        if inodes != 1 + threads as u64 + files {
            return Err(BenchError::Verify(format!("the MDT holds {inodes} inodes {when}, for {files} files")));
        }
        Ok(())
    };
    holds(&ns, "once filled")?;
    let db_bytes = ns.statfs().map_err(bad)?.bytes_used;
    drop(ns);
    let started = Instant::now();
    let ns = Namespace::open(volume.clone(), opts).map_err(bad)?;
    let open_s = started.elapsed().as_secs_f64();
    holds(&ns, "after start-up")?;
    for (i, &d) in dirs.iter().enumerate() {
        let last = format!("f{}", count(i) - 1);
        ns.lookup(&cred, d, &last).map_err(|e| BenchError::Verify(format!("{last} of s{i} after start-up: {e}")))?;
    }
    Ok(Startup {
        fill_per_s: files as f64 / fill_s,
        heap_bytes,
        rss_bytes: rss_grown,
        name_bytes: name_bytes.into_inner(),
        db_bytes,
        open_s,
    })
}

/// Run the bench; prints progress and a table, returns the figures.
pub fn run_mdt_bench(o: &MdtBenchOptions, out: &mut dyn std::io::Write) -> Result<Value, BenchError> {
    if o.threads == 0 || o.files < o.threads as u64 {
        return Err(BenchError::Bad(format!("--files {} must be at least --threads {}", o.files, o.threads)));
    }
    if o.startup_files == 0 {
        return Err(BenchError::Bad("--startup-files must be at least 1".into()));
    }
    let work = o.dir.join(format!("nacre-bench-mdt-{}", std::process::id()));
    let local = o.local_dir.join(format!("nacre-bench-mdt-local-{}", std::process::id()));
    let result = run_in(o, &work, &local, out);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&local);
    result
}

fn run_in(o: &MdtBenchOptions, work: &Path, local: &Path, out: &mut dyn std::io::Write) -> Result<Value, BenchError> {
    let per = o.files / o.threads as u64;
    let _ = writeln!(
        out,
        "nacre bench mdt: one MDT on RAID10 (4 drives in {}) called in process, {} threads, {} files per phase, {} rounds, sync_on_reply={}; reference: {} threads on {}",
        o.dir.display(),
        o.threads,
        per * o.threads as u64,
        o.rounds,
        o.sync_on_reply as u8,
        o.threads,
        o.local_dir.display()
    );
    let rounds = o.rounds.max(1);
    let (mut nacre, mut reference) = (Vec::new(), Vec::new());
    {
        let volume = mdt_volume(&work.join("rounds"), drive_bytes(o.files * rounds as u64 * ROUND_BYTES_PER_FILE))?;
        let opts = NamespaceOptions { sync_on_reply: o.sync_on_reply, ..NamespaceOptions::default() };
        let ns = Namespace::format(volume, 0, opts).map_err(bad)?;
        for round in 0..rounds {
            let n = nacre_round(&ns, o, round)?;
            let l = local_round(&local.join(format!("r{round}")), o)?;
            // No unlinks in the local round: they come after every round.
            let line = |r: &Rates, phases: usize| {
                PHASES.iter().zip(r).take(phases).map(|((name, _), x)| format!(" {name} {x:.0}/s")).collect::<String>()
            };
            let _ = writeln!(out, "round {}: nacre{} | local{}", round + 1, line(&n, PHASES.len()), line(&l, UNLINK));
            nacre.push(n);
            reference.push(l);
        }
    }
    // The local unlinks, after every round's creates.
    for (round, l) in reference.iter_mut().enumerate() {
        l[UNLINK] = local_unlink(&local.join(format!("r{round}")), o)?;
        let _ = writeln!(out, "local unlink {:.0}/s", l[UNLINK]);
    }
    // The rounds' drives go before the start-up MDT's are made: under /dev/shm they
    // take memory.
    std::fs::remove_dir_all(work.join("rounds"))?;
    let best = |v: &[Rates], k: usize| peak(&v.iter().map(|r| r[k]).collect::<Vec<_>>());
    let _ = writeln!(
        out,
        "start-up: filling an MDT with {} files ({} threads), then timing its start-up",
        o.startup_files,
        FILL_THREADS.min(o.startup_files as usize)
    );
    let _ = out.flush();
    let s = startup(&work.join("startup"), o)?;
    let files = o.startup_files as f64;
    let (gauge, grown) = match s.heap_bytes {
        Some(b) => ("heap (counting allocator)", b),
        None => ("resident set (/proc/self/status VmRSS)", s.rss_bytes),
    };
    let bytes_per_file = grown as f64 / files;
    let name_bytes_avg = s.name_bytes as f64 / files;
    let startup_per_million = s.open_s * 1e6 / files;
    let _ = writeln!(out, "\n| operation | Nacre /s | local /s | ratio | target |\n|---|---:|---:|---:|---:|");
    let mut v = json!({
        "bench": "mdt",
        "dir": o.dir.display().to_string(),
        "local_dir": o.local_dir.display().to_string(),
        "files": per * o.threads as u64,
        "threads": o.threads,
        "rounds": rounds,
        "sync_on_reply": o.sync_on_reply,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
    });
    for (k, (name, target)) in PHASES.into_iter().enumerate() {
        let (n, l) = (best(&nacre, k), best(&reference, k));
        let r = ratio(n, l);
        let _ = writeln!(out, "| {name} | {n:.0} | {l:.0} | {r:.3} | {target} |");
        v[format!("{name}_per_s")] = json!(n);
        v[format!("local_{name}_per_s")] = json!(l);
        v[format!("{name}_ratio")] = json!(r);
    }
    let _ = writeln!(
        out,
        "\nmemory: {bytes_per_file:.0} bytes per file ({gauge}; resident set {:.0}), names of {name_bytes_avg:.1} bytes on average; target ≤ 256 plus the name",
        s.rss_bytes as f64 / files
    );
    let _ = writeln!(
        out,
        "start-up of an MDT of {} files (database {} MiB on its volume, {:.0} bytes a file): {:.3} s, {startup_per_million:.3} s per million files scaled linearly (made at {:.0}/s); target ≤ 5",
        o.startup_files,
        s.db_bytes >> 20,
        s.db_bytes as f64 / files,
        s.open_s,
        s.fill_per_s
    );
    v["startup_files"] = json!(o.startup_files);
    v["startup_fill_per_s"] = json!(s.fill_per_s);
    v["startup_db_bytes"] = json!(s.db_bytes);
    v["startup_db_bytes_per_file"] = json!(s.db_bytes as f64 / files);
    v["startup_s"] = json!(s.open_s);
    v["startup_s_per_million_files"] = json!(startup_per_million);
    v["bytes_per_file"] = json!(bytes_per_file);
    v["rss_bytes_per_file"] = json!(s.rss_bytes as f64 / files);
    v["name_bytes_avg"] = json!(name_bytes_avg);
    v["memory_gauge"] = json!(if s.heap_bytes.is_some() { "heap" } else { "rss" });
    Ok(v)
}
