//! IO500, built in: the phases of the ISC25 standard list with IO500's rules, on any
//! [`Storage`] — a directory of any mounted file system (`Posix`), or Nacre through its
//! client library (`Native`) — so that one binary measures Nacre and its reference in the
//! same run.
//!
//! The phases, in IO500's order:
//! - `ior-easy-write`: a file per task, large transfers, for the stonewall time, then
//!   every task wears out to the busiest one's count, then fsync;
//! - `mdtest-easy-write`: empty files, a directory per task;
//! - `timestamp`: the file `find` compares with;
//! - `ior-hard-write`: one shared file, 47,008-byte transfers interleaved over the tasks;
//! - `mdtest-hard-write`: 3,901-byte files in one shared directory;
//! - `find`: every entry of the run's tree, matching `-newer timestamp -size 3901c -name
//!   *01*`; the count found is checked;
//! - the reads, stats and deletes of all that, each task on its neighbour's files (as
//!   ior `-C` and mdtest `-N 1` shift tasks so no task reads its own cache); every byte
//!   read is checked against what was written;
//! - `ior-rnd4K-easy-read`: random 4 KiB reads of the ior-easy files for the stonewall
//!   time, listed but not scored (as in ISC25's standard list).
//!
//! The score is IO500's: BW the geometric mean of the four ior phases in GiB/s, MD that
//! of the eight mdtest and find phases in kIOPS, TOTAL = √(BW · MD).

pub mod native;
pub mod pattern;
pub mod report;
pub mod storage;
pub mod team;

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub use report::{PhaseResult, Score, Unit};
use storage::{Entry, Open};
pub use storage::{Layouts, Posix, Storage, WithLayouts};
use team::Team;

/// ior-hard's transfer, as IO500 fixes it.
pub const IOR_HARD_TRANSFER: usize = 47_008;
/// mdtest-hard's file size, as IO500 fixes it.
pub const MDTEST_HARD_BYTES: usize = 3_901;
/// ior-rnd4K's read size.
const RND_READ: usize = 4096;

/// Layouts io500.sh gives the phase directories on Lustre (the Helma run), as `lfs
/// setstripe` and `lfs setdirstripe -D` options; each `None` takes the Helma choice, an
/// empty string leaves the file system's default.
#[derive(Debug, Clone, Default)]
pub struct NacreLayouts {
    /// Default `-c 1 -S 16M`.
    pub ior_easy: Option<String>,
    /// Default `-C <5 × OSTs> -S 16M` (overstriping).
    pub ior_hard: Option<String>,
    /// Default `-E 1M -L mdt` (the first MiB on the MDT).
    pub mdtest_easy: Option<String>,
    /// Default `-E 1M -L mdt`.
    pub mdtest_hard: Option<String>,
    /// Subdirectories of mdtest-easy, `setdirstripe -D` options. Default `-c 1 -i -1
    /// --max-inherit-rr 2`: each task's directory on the next MDT (DNE round-robin).
    pub mdtest_easy_dir: Option<String>,
    /// Default `-c -1`: mdtest-hard's shared directory striped over every MDT.
    pub mdtest_hard_dir: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Io500Options {
    pub tasks: usize,
    /// How long each write phase (and ior-rnd4K-easy-read) runs; IO500's rules: 300 s.
    pub stonewall: Duration,
    /// ior-easy's transfer (IO500: 2 MiB).
    pub ior_easy_transfer: usize,
    /// Most bytes a task writes in ior-easy (ior `-b`; IO500 sets no real limit).
    pub ior_easy_bytes: u64,
    /// Most segments of ior-hard (ior `-s`).
    pub ior_hard_segments: u64,
    /// Most files a task makes in mdtest-easy and mdtest-hard (mdtest `-n`).
    pub mdtest_easy_files: u64,
    pub mdtest_hard_files: u64,
    /// Drop the kernel's page cache between phases (io500.sh's `clean_cache`; root).
    pub drop_caches: bool,
    /// The layouts to set when the storage is Nacre.
    pub layouts: NacreLayouts,
    /// The run's directory under the storage's root (made; removed at the end).
    pub run_dir: String,
    /// Name each phase on stderr as it starts.
    pub progress: bool,
    /// Leave the run's files (to look at after a failure); IO500 removes them.
    pub keep: bool,
    /// Phases not to run, as io500.ini's `run = FALSE`; the phases that read what a
    /// skipped write phase makes are skipped with it (see [`PHASE_NEEDS`]). The score is
    /// then over the phases run.
    pub skip: Vec<String>,
}

/// The phases in IO500's order (`timestamp` is not one a run reports).
pub const PHASES: [&str; 13] = [
    "ior-easy-write",
    "mdtest-easy-write",
    "ior-hard-write",
    "mdtest-hard-write",
    "find",
    "ior-easy-read",
    "mdtest-easy-stat",
    "ior-hard-read",
    "mdtest-hard-stat",
    "mdtest-easy-delete",
    "mdtest-hard-read",
    "mdtest-hard-delete",
    "ior-rnd4K-easy-read",
];

/// Phases that read what another makes: (phase, the write phase it needs).
pub const PHASE_NEEDS: [(&str, &str); 8] = [
    ("ior-easy-read", "ior-easy-write"),
    ("ior-rnd4K-easy-read", "ior-easy-write"),
    ("ior-hard-read", "ior-hard-write"),
    ("mdtest-easy-stat", "mdtest-easy-write"),
    ("mdtest-easy-delete", "mdtest-easy-write"),
    ("mdtest-hard-stat", "mdtest-hard-write"),
    ("mdtest-hard-read", "mdtest-hard-write"),
    ("mdtest-hard-delete", "mdtest-hard-write"),
];

impl Io500Options {
    /// IO500's settings: 300 s stonewall, 2 MiB ior-easy transfers, no size caps.
    pub fn new(tasks: usize) -> Io500Options {
        Io500Options {
            tasks,
            stonewall: Duration::from_secs(300),
            ior_easy_transfer: 2 << 20,
            ior_easy_bytes: 9_920_000 << 20,
            ior_hard_segments: 10_000_000,
            mdtest_easy_files: 1_000_000,
            mdtest_hard_files: 1_000_000,
            drop_caches: false,
            layouts: NacreLayouts::default(),
            skip: Vec::new(),
            run_dir: format!(
                "io500-{}",
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
            ),
            progress: false,
            keep: false,
        }
    }

    /// Problems with the settings, named.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=1024).contains(&self.tasks) {
            return Err(format!("{} tasks: 1 to 1024", self.tasks));
        }
        if !(4096..=64 << 20).contains(&self.ior_easy_transfer) || !self.ior_easy_transfer.is_multiple_of(4096) {
            return Err(format!("ior-easy transfer {}: a multiple of 4 KiB up to 64 MiB", self.ior_easy_transfer));
        }
        if self.ior_easy_bytes < self.ior_easy_transfer as u64 {
            return Err(format!(
                "ior-easy size {} is less than one transfer of {}",
                self.ior_easy_bytes, self.ior_easy_transfer
            ));
        }
        for (what, n) in [
            ("ior-hard segments", self.ior_hard_segments),
            ("mdtest-easy files", self.mdtest_easy_files),
            ("mdtest-hard files", self.mdtest_hard_files),
        ] {
            if n == 0 {
                return Err(format!("{what}: at least 1"));
            }
        }
        if let Some(bad) = self.skip.iter().find(|s| !PHASES.contains(&s.as_str())) {
            return Err(format!("no phase {bad:?} to skip (phases: {})", PHASES.join(", ")));
        }
        if self.stonewall > Duration::from_secs(24 * 3600) {
            return Err("stonewall: at most a day".into());
        }
        if self.run_dir.is_empty() || self.run_dir.starts_with('/') || self.run_dir.split('/').any(|c| c == "..") {
            return Err(format!("run directory {:?}: a relative path without ..", self.run_dir));
        }
        Ok(())
    }
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct Io500Report {
    pub api: &'static str,
    pub results: Vec<PhaseResult>,
    pub score: Score,
    /// Layouts set on the phase directories (Nacre), as applied.
    pub layouts: Vec<(String, String)>,
    pub settings: Value,
}

impl Io500Report {
    pub fn json(&self) -> Value {
        json!({
            "io500": "Nacre IO500 (ISC25 standard phases)",
            "api": self.api,
            "settings": self.settings,
            "layouts": self.layouts.iter().map(|(d, l)| json!({"dir": d, "layout": l})).collect::<Vec<_>>(),
            "phases": self.results.iter().map(PhaseResult::json).collect::<Vec<_>>(),
            "score": self.score.json(),
        })
    }

    /// The result of the phase `name`.
    pub fn phase(&self, name: &str) -> Option<&PhaseResult> {
        self.results.iter().find(|r| r.name == name)
    }
}

/// Run every phase on `storage` and remove what they made; the `[RESULT]` lines and the
/// `[SCORE ]` line go to `out` as the phases end. A phase that fails (an IO error, data
/// read back that differs from what was written, a `find` that counts wrong) ends the
/// run with an error naming it, after the run's files are removed.
pub fn run(storage: &dyn Storage, o: &Io500Options, out: &mut dyn Write) -> io::Result<Io500Report> {
    o.check().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    if o.drop_caches {
        drop_caches().map_err(|e| io::Error::new(e.kind(), format!("drop caches: {e} (it needs root)")))?;
    }
    let mut r = Run::new(storage, o);
    storage.mkdir(&o.run_dir)?;
    let result = r.all(out);
    let cleaned = if o.keep { Ok(()) } else { r.remove_tree(&o.run_dir) };
    let results = result?;
    cleaned.map_err(|e| io::Error::new(e.kind(), format!("removing the run's files: {e}")))?;
    let score = Score::of(&results);
    writeln!(out, "{}", score.line())?;
    let settings = json!({
        "tasks": o.tasks,
        "stonewall_s": o.stonewall.as_secs_f64(),
        "ior_easy_transfer": o.ior_easy_transfer,
        "ior_easy_bytes_per_task": o.ior_easy_bytes,
        "ior_hard_transfer": IOR_HARD_TRANSFER,
        "ior_hard_segments": o.ior_hard_segments,
        "mdtest_easy_files_per_task": o.mdtest_easy_files,
        "mdtest_hard_files_per_task": o.mdtest_hard_files,
        "mdtest_hard_bytes": MDTEST_HARD_BYTES,
        "drop_caches": o.drop_caches,
        "skipped": r.skipped(),
        "run_dir": o.run_dir,
        "seed": r.seed,
    });
    Ok(Io500Report { api: storage.api(), results, score, layouts: r.layouts_set, settings })
}

/// `sync`, then drop the page cache, dentries and inodes.
fn drop_caches() -> io::Result<()> {
    // SAFETY: sync() takes nothing and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
}

/// One run's state: what each task made, for the phases that read it back.
struct Run<'a> {
    s: &'a dyn Storage,
    o: &'a Io500Options,
    team: Team,
    seed: u64,
    /// Per task: ior-easy transfers, ior-hard segments, mdtest-easy and -hard files.
    easy_xfers: Vec<u64>,
    hard_segments: Vec<u64>,
    md_easy: Vec<u64>,
    md_hard: Vec<u64>,
    timestamp_ns: i64,
    layouts_set: Vec<(String, String)>,
}

/// Where an ior phase's transfers go: task `rank`'s file, the offset of its `i`-th
/// transfer, and the pattern's seed.
struct IorPlan<'r> {
    xfer: usize,
    file: Box<dyn Fn(usize) -> String + Sync + 'r>,
    offset: Box<dyn Fn(usize, u64) -> u64 + Sync + 'r>,
    seed: Box<dyn Fn(usize) -> u64 + Sync + 'r>,
}

/// Error `kind` naming a phase.
fn in_phase(phase: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{phase}: {e}"))
}

fn corrupt(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl<'a> Run<'a> {
    fn new(s: &'a dyn Storage, o: &'a Io500Options) -> Run<'a> {
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0x5eed, |d| d.as_nanos() as u64);
        Run {
            s,
            o,
            team: Team::new(o.tasks, o.stonewall),
            seed,
            easy_xfers: Vec::new(),
            hard_segments: Vec::new(),
            md_easy: Vec::new(),
            md_hard: Vec::new(),
            timestamp_ns: 0,
            layouts_set: Vec::new(),
        }
    }

    fn path(&self, rel: &str) -> String {
        format!("{}/{rel}", self.o.run_dir)
    }
    fn easy_file(&self, rank: usize) -> String {
        self.path(&format!("ior-easy/ior_file_easy.{rank:08}"))
    }
    fn hard_file(&self) -> String {
        self.path("ior-hard/IOR_file")
    }
    fn md_easy_dir(&self, rank: usize) -> String {
        self.path(&format!("mdtest-easy/test-dir/mdtest_tree.{rank}"))
    }
    fn md_easy_file(&self, rank: usize, i: u64) -> String {
        format!("{}/file.mdtest.{rank}.{i}", self.md_easy_dir(rank))
    }
    fn md_hard_file(&self, rank: usize, i: u64) -> String {
        self.path(&format!("mdtest-hard/test-dir/file.mdtest.{rank}.{i}"))
    }
    /// The task whose files `rank` reads back.
    fn neighbour(&self, rank: usize) -> usize {
        (rank + 1) % self.o.tasks
    }
    fn easy_seed(&self, rank: usize) -> u64 {
        pattern::seed(self.seed, &[1, rank as u64])
    }
    fn hard_seed(&self) -> u64 {
        pattern::seed(self.seed, &[2])
    }
    fn md_hard_seed(&self, rank: usize, i: u64) -> u64 {
        pattern::seed(self.seed, &[3, rank as u64, i])
    }

    /// The phases this run skips: those asked, and those that read what they make.
    fn skipped(&self) -> Vec<&'static str> {
        PHASES
            .into_iter()
            .filter(|p| {
                let asked = |p: &str| self.o.skip.iter().any(|s| s == p);
                asked(p) || PHASE_NEEDS.iter().any(|(reader, needs)| reader == p && asked(needs))
            })
            .collect()
    }

    /// Every phase in IO500's order, less those skipped; their results.
    fn all(&mut self, out: &mut dyn Write) -> io::Result<Vec<PhaseResult>> {
        self.prepare()?;
        type Phase<'a> = (&'static str, fn(&mut Run<'a>) -> io::Result<PhaseResult>);
        let phases: [Phase<'a>; 14] = [
            ("ior-easy-write", Run::ior_easy_write),
            ("mdtest-easy-write", Run::mdtest_easy_write),
            ("timestamp", Run::timestamp),
            ("ior-hard-write", Run::ior_hard_write),
            ("mdtest-hard-write", Run::mdtest_hard_write),
            ("find", Run::find),
            ("ior-easy-read", Run::ior_easy_read),
            ("mdtest-easy-stat", Run::mdtest_easy_stat),
            ("ior-hard-read", Run::ior_hard_read),
            ("mdtest-hard-stat", Run::mdtest_hard_stat),
            ("mdtest-easy-delete", Run::mdtest_easy_delete),
            ("mdtest-hard-read", Run::mdtest_hard_read),
            ("mdtest-hard-delete", Run::mdtest_hard_delete),
            ("ior-rnd4K-easy-read", Run::ior_rnd4k_easy_read),
        ];
        let skipped = self.skipped();
        let mut results = Vec::new();
        for (k, (name, phase)) in phases.into_iter().enumerate() {
            if skipped.contains(&name) {
                continue;
            }
            // Before the first phase, `run` has just dropped them (checking it may).
            if self.o.drop_caches && k > 0 {
                drop_caches().map_err(|e| in_phase(name, e))?;
            }
            if self.o.progress {
                eprintln!("           {name} …");
            }
            let r = phase(self).map_err(|e| in_phase(name, e))?;
            if name == "timestamp" {
                continue;
            }
            writeln!(out, "{}", r.line())?;
            out.flush()?;
            results.push(r);
        }
        Ok(results)
    }

    /// The phase directories, with io500.sh's layouts when the storage is Nacre.
    fn prepare(&mut self) -> io::Result<()> {
        for d in ["ior-easy", "ior-hard", "mdtest-easy", "mdtest-hard"] {
            self.s.mkdir(&self.path(d))?;
        }
        let Some(l) = self.s.layouts() else { return Ok(()) };
        let want = &self.o.layouts;
        let osts = l.ost_count().max(1);
        let pick = |v: &Option<String>, default: String| v.clone().unwrap_or(default);
        let files = [
            ("ior-easy", pick(&want.ior_easy, "-c 1 -S 16M".into())),
            ("ior-hard", pick(&want.ior_hard, format!("-C {} -S 16M", osts * 5))),
            ("mdtest-easy", pick(&want.mdtest_easy, "-E 1M -L mdt".into())),
            ("mdtest-hard", pick(&want.mdtest_hard, "-E 1M -L mdt".into())),
        ];
        for (d, args) in files {
            if args.trim().is_empty() {
                continue;
            }
            let words: Vec<&str> = args.split_whitespace().collect();
            l.setstripe(&self.path(d), &words).map_err(|e| in_phase("prepare", e))?;
            self.layouts_set.push((d.to_string(), format!("setstripe {args}")));
        }
        let dirs = [
            ("mdtest-easy", pick(&want.mdtest_easy_dir, "-c 1 -i -1 --max-inherit-rr 2".into())),
            ("mdtest-hard", pick(&want.mdtest_hard_dir, "-c -1".into())),
        ];
        for (d, args) in dirs {
            if args.trim().is_empty() {
                continue;
            }
            let (count, index, rr) = parse_dir_default(&args).map_err(|e| in_phase("prepare", e))?;
            l.set_dir_default(&self.path(d), count, index, rr).map_err(|e| in_phase("prepare", e))?;
            self.layouts_set.push((d.to_string(), format!("setdirstripe -D {args}")));
        }
        Ok(())
    }

    /// Where ior-easy puts task `rank`'s transfers: its own file, one after another.
    fn easy_plan(&self) -> IorPlan<'_> {
        let xfer = self.o.ior_easy_transfer;
        IorPlan {
            xfer,
            file: Box::new(|rank| self.easy_file(rank)),
            offset: Box::new(move |_, i| i * xfer as u64),
            seed: Box::new(|rank| self.easy_seed(rank)),
        }
    }

    /// Where ior-hard puts them: segment after segment of one file, each holding one
    /// transfer of every task in rank order.
    fn hard_plan(&self) -> IorPlan<'_> {
        let tasks = self.o.tasks as u64;
        IorPlan {
            xfer: IOR_HARD_TRANSFER,
            file: Box::new(|_| self.hard_file()),
            offset: Box::new(move |rank, seg| (seg * tasks + rank as u64) * IOR_HARD_TRANSFER as u64),
            seed: Box::new(|_| self.hard_seed()),
        }
    }

    /// An ior write phase: each task writes its transfers of `plan` until `cap` or the
    /// stonewall (then wears out), then fsyncs and closes. The transfers each task made.
    fn ior_write(&self, name: &'static str, plan: &IorPlan, cap: u64) -> io::Result<(Vec<u64>, PhaseResult)> {
        let (per, secs) = self.team.run(|rank| {
            let mut h = self.s.open(&(plan.file)(rank), Open::Write)?;
            let (mut buf, seed) = (vec![0u8; plan.xfer], (plan.seed)(rank));
            let done = self.team.wear_out(rank, cap, |i| {
                let off = (plan.offset)(rank, i);
                pattern::fill(&mut buf, seed, off);
                h.write_at(off, &buf)
            })?;
            h.close(true)?;
            Ok(done)
        })?;
        let counts: Vec<u64> = per.iter().map(|p| p.0).collect();
        let mut r = PhaseResult::bandwidth(name, counts.iter().sum::<u64>() * plan.xfer as u64, secs);
        r.stonewalled = Some(per.iter().any(|p| p.1));
        Ok((counts, r))
    }

    /// An ior read phase: each task reads back, and checks, its neighbour's `counts`
    /// transfers of `plan`.
    fn ior_read(&self, name: &'static str, plan: &IorPlan, counts: &[u64]) -> io::Result<PhaseResult> {
        let (_, secs) = self.team.run(|rank| {
            let from = self.neighbour(rank);
            let path = (plan.file)(from);
            let mut h = self.s.open(&path, Open::Read)?;
            let (mut buf, seed) = (vec![0u8; plan.xfer], (plan.seed)(from));
            for i in 0..counts[from] {
                let off = (plan.offset)(from, i);
                h.read_at(off, &mut buf)?;
                if let Some(p) = pattern::first_difference(&buf, seed, off) {
                    return Err(corrupt(format!("{path}: byte {} differs from what was written", off + p as u64)));
                }
            }
            h.close(false)
        })?;
        Ok(PhaseResult::bandwidth(name, counts.iter().sum::<u64>() * plan.xfer as u64, secs))
    }

    fn ior_easy_write(&mut self) -> io::Result<PhaseResult> {
        let cap = self.o.ior_easy_bytes / self.o.ior_easy_transfer as u64;
        let (counts, r) = self.ior_write("ior-easy-write", &self.easy_plan(), cap)?;
        self.easy_xfers = counts;
        Ok(r)
    }

    fn ior_easy_read(&mut self) -> io::Result<PhaseResult> {
        self.ior_read("ior-easy-read", &self.easy_plan(), &self.easy_xfers)
    }

    fn ior_hard_write(&mut self) -> io::Result<PhaseResult> {
        let (counts, r) = self.ior_write("ior-hard-write", &self.hard_plan(), self.o.ior_hard_segments)?;
        self.hard_segments = counts;
        Ok(r)
    }

    fn ior_hard_read(&mut self) -> io::Result<PhaseResult> {
        self.ior_read("ior-hard-read", &self.hard_plan(), &self.hard_segments)
    }

    fn ior_rnd4k_easy_read(&mut self) -> io::Result<PhaseResult> {
        let xfer = self.o.ior_easy_transfer as u64;
        let (per, secs) = self.team.run(|rank| {
            let from = self.neighbour(rank);
            let blocks = self.easy_xfers[from] * xfer / RND_READ as u64;
            if blocks == 0 {
                return Ok(0);
            }
            let path = self.easy_file(from);
            let mut h = self.s.open(&path, Open::Read)?;
            let (mut buf, seed) = (vec![0u8; RND_READ], self.easy_seed(from));
            let mut rng = pattern::seed(self.seed, &[4, rank as u64]) | 1;
            let deadline = self.team.deadline();
            let mut reads = 0u64;
            // At least one read, so a zero stonewall still checks something.
            while reads == 0 || Instant::now() < deadline {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let off = (rng % blocks) * RND_READ as u64;
                h.read_at(off, &mut buf)?;
                if let Some(p) = pattern::first_difference(&buf, seed, off) {
                    return Err(corrupt(format!("{path}: byte {} differs from what was written", off + p as u64)));
                }
                reads += 1;
            }
            h.close(false)?;
            Ok(reads)
        })?;
        let bytes = per.iter().sum::<u64>() * RND_READ as u64;
        let mut r = PhaseResult::bandwidth("ior-rnd4K-easy-read", bytes, secs);
        r.scored = false;
        Ok(r)
    }

    fn mdtest_easy_write(&mut self) -> io::Result<PhaseResult> {
        self.s.mkdir(&self.path("mdtest-easy/test-dir"))?;
        let (per, secs) = self.team.run(|rank| {
            self.s.mkdir(&self.md_easy_dir(rank))?;
            self.team.wear_out(rank, self.o.mdtest_easy_files, |i| self.s.create_empty(&self.md_easy_file(rank, i)))
        })?;
        self.md_easy = per.iter().map(|p| p.0).collect();
        let mut r = PhaseResult::rate("mdtest-easy-write", self.md_easy.iter().sum(), secs);
        r.stonewalled = Some(per.iter().any(|p| p.1));
        Ok(r)
    }

    /// An mdtest phase over what a write phase made: each task runs `op(from, i)` on
    /// each of its neighbour's `counts[from]` files, then `done(from)`.
    fn md_each(
        &self,
        name: &'static str,
        counts: &[u64],
        op: impl Fn(usize, u64) -> io::Result<()> + Sync,
        done: impl Fn(usize) -> io::Result<()> + Sync,
    ) -> io::Result<PhaseResult> {
        let (_, secs) = self.team.run(|rank| {
            let from = self.neighbour(rank);
            for i in 0..counts[from] {
                op(from, i)?;
            }
            done(from)
        })?;
        Ok(PhaseResult::rate(name, counts.iter().sum(), secs))
    }

    /// A stat that must find a regular file of `size` bytes.
    fn stat_file(&self, path: &str, size: u64) -> io::Result<()> {
        let m = self.s.stat(path)?;
        if m.is_dir || m.size != size {
            return Err(corrupt(format!("{path}: {m:?}, not a file of {size} bytes")));
        }
        Ok(())
    }

    fn mdtest_easy_stat(&mut self) -> io::Result<PhaseResult> {
        let stat = |from, i| self.stat_file(&self.md_easy_file(from, i), 0);
        self.md_each("mdtest-easy-stat", &self.md_easy, stat, |_| Ok(()))
    }

    fn mdtest_easy_delete(&mut self) -> io::Result<PhaseResult> {
        let unlink = |from, i| self.s.unlink(&self.md_easy_file(from, i));
        let r =
            self.md_each("mdtest-easy-delete", &self.md_easy, unlink, |from| self.s.rmdir(&self.md_easy_dir(from)))?;
        self.s.rmdir(&self.path("mdtest-easy/test-dir"))?;
        Ok(r)
    }

    /// The file `find` compares modification times with. Made between mdtest-easy-write
    /// and ior-hard-write, as IO500 does; a pause after it keeps coarse file system
    /// clocks (ext4 ticks in jiffies) from giving a later file the same time.
    fn timestamp(&mut self) -> io::Result<PhaseResult> {
        let started = Instant::now();
        let path = self.path("timestamp");
        self.s.create_empty(&path)?;
        self.timestamp_ns = self.s.stat(&path)?.mtime_ns;
        std::thread::sleep(Duration::from_millis(20));
        Ok(PhaseResult::rate("timestamp", 1, started.elapsed().as_secs_f64()))
    }

    fn mdtest_hard_write(&mut self) -> io::Result<PhaseResult> {
        self.s.mkdir(&self.path("mdtest-hard/test-dir"))?;
        let (per, secs) = self.team.run(|rank| {
            let mut data = vec![0u8; MDTEST_HARD_BYTES];
            self.team.wear_out(rank, self.o.mdtest_hard_files, |i| {
                pattern::fill(&mut data, self.md_hard_seed(rank, i), 0);
                self.s.create_with(&self.md_hard_file(rank, i), &data)
            })
        })?;
        self.md_hard = per.iter().map(|p| p.0).collect();
        let mut r = PhaseResult::rate("mdtest-hard-write", self.md_hard.iter().sum(), secs);
        r.stonewalled = Some(per.iter().any(|p| p.1));
        Ok(r)
    }

    fn mdtest_hard_read(&mut self) -> io::Result<PhaseResult> {
        let read = |from, i| {
            let path = self.md_hard_file(from, i);
            let mut buf = Vec::with_capacity(MDTEST_HARD_BYTES);
            self.s.read_file(&path, MDTEST_HARD_BYTES, &mut buf)?;
            if buf.len() != MDTEST_HARD_BYTES {
                return Err(corrupt(format!("{path}: read {} bytes of {MDTEST_HARD_BYTES}", buf.len())));
            }
            if let Some(p) = pattern::first_difference(&buf, self.md_hard_seed(from, i), 0) {
                return Err(corrupt(format!("{path}: byte {p} differs from what was written")));
            }
            Ok(())
        };
        self.md_each("mdtest-hard-read", &self.md_hard, read, |_| Ok(()))
    }

    fn mdtest_hard_stat(&mut self) -> io::Result<PhaseResult> {
        let stat = |from, i| self.stat_file(&self.md_hard_file(from, i), MDTEST_HARD_BYTES as u64);
        self.md_each("mdtest-hard-stat", &self.md_hard, stat, |_| Ok(()))
    }

    fn mdtest_hard_delete(&mut self) -> io::Result<PhaseResult> {
        let unlink = |from, i| self.s.unlink(&self.md_hard_file(from, i));
        let r = self.md_each("mdtest-hard-delete", &self.md_hard, unlink, |_| Ok(()))?;
        self.s.rmdir(&self.path("mdtest-hard/test-dir"))?;
        Ok(r)
    }

    /// IO500's find: `-newer timestamp -size 3901c -name *01*` over the whole run, the
    /// tasks sharing the directories to visit. The rate counts every entry looked at;
    /// the count found must be the mdtest-hard files whose names hold "01".
    fn find(&mut self) -> io::Result<PhaseResult> {
        struct Queue {
            dirs: VecDeque<String>,
            busy: usize,
            /// A task failed: the others stop taking and adding directories.
            failed: bool,
        }
        let q = Mutex::new(Queue { dirs: VecDeque::from([self.o.run_dir.clone()]), busy: 0, failed: false });
        let cv = Condvar::new();
        let lock = || q.lock().unwrap_or_else(|e| e.into_inner());
        let newer = self.timestamp_ns;
        let (per, secs) = self.team.run(|_| {
            let (mut seen, mut found, mut entries) = (0u64, 0u64, Vec::<Entry>::new());
            loop {
                let dir = {
                    let mut g = lock();
                    loop {
                        if g.failed {
                            break None;
                        }
                        if let Some(d) = g.dirs.pop_front() {
                            g.busy += 1;
                            break Some(d);
                        }
                        if g.busy == 0 {
                            break None;
                        }
                        g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                };
                let Some(dir) = dir else {
                    cv.notify_all();
                    return Ok((seen, found));
                };
                entries.clear();
                let listed = self.s.list(&dir, &mut entries);
                let mut g = lock();
                g.busy -= 1;
                if let Err(e) = listed {
                    g.failed = true;
                    g.dirs.clear();
                    cv.notify_all();
                    return Err(e);
                }
                if g.failed {
                    cv.notify_all();
                    return Err(io::Error::new(io::ErrorKind::Interrupted, "stopped: another task failed"));
                }
                for e in entries.drain(..) {
                    seen += 1;
                    if e.meta.is_dir {
                        g.dirs.push_back(format!("{dir}/{}", e.name));
                    } else if e.meta.size == MDTEST_HARD_BYTES as u64
                        && e.meta.mtime_ns > newer
                        && e.name.contains("01")
                    {
                        found += 1;
                    }
                }
                cv.notify_all();
            }
        })?;
        let (seen, found) = per.iter().fold((0, 0), |a, p| (a.0 + p.0, a.1 + p.1));
        let expected: u64 = (0..self.o.tasks)
            .map(|r| {
                (0..self.md_hard[r])
                    .filter(|&i| self.md_hard_file(r, i).rsplit('/').next().is_some_and(|n| n.contains("01")))
                    .count() as u64
            })
            .sum();
        if found != expected {
            return Err(corrupt(format!("found {found} files, expected {expected}")));
        }
        Ok(PhaseResult::rate("find", seen, secs))
    }

    /// Remove `path` and everything under it.
    fn remove_tree(&self, path: &str) -> io::Result<()> {
        let mut entries = Vec::new();
        match self.s.list(path, &mut entries) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            r => r?,
        }
        for e in entries {
            let p = format!("{path}/{}", e.name);
            if e.meta.is_dir { self.remove_tree(&p)? } else { self.s.unlink(&p)? }
        }
        self.s.rmdir(path)
    }
}

/// `setdirstripe -D` options: `-c COUNT`, `-i INDEX`, `--max-inherit-rr N` (defaults 1,
/// -1, 0).
pub fn parse_dir_default(args: &str) -> io::Result<(i32, i32, i32)> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, format!("setdirstripe -D {args}: {m}"));
    let (mut count, mut index, mut rr) = (1, -1, 0);
    let mut words = args.split_whitespace();
    while let Some(w) = words.next() {
        let slot = match w {
            "-c" | "--mdt-count" => &mut count,
            "-i" | "--mdt-index" => &mut index,
            "--max-inherit-rr" => &mut rr,
            _ => return Err(bad(format!("unknown option {w:?} (-c, -i, --max-inherit-rr)"))),
        };
        let v = words.next().ok_or_else(|| bad(format!("{w} needs a value")))?;
        *slot = v.parse().map_err(|_| bad(format!("{w} {v:?} is not a number")))?;
    }
    Ok((count, index, rr))
}
