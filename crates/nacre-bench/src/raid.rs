//! `nacre raid bench`: the xiRAID white paper's table for Nacre's engine.
//!
//! Sequential writes and reads of whole stripes with 1..32 jobs over file-backed drives:
//! RAID0 over the drives first (the raw reference of this run), then RAID6 8+2 over the
//! same files healthy, with unaligned writes (read-modify-write), with one failed drive,
//! and while a replaced drive rebuilds. Every figure is GB/s of user data (10^9 bytes/s)
//! and every ratio compares two figures of this one run, because absolute numbers on a
//! shared machine move 2-3× between runs.
//!
//! Data read back is checked: every 4 KiB sector carries its own offset, so a misplaced
//! or stale block fails the run instead of inflating it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use nacre_raid::align::AlignedBuf;
use nacre_raid::{BlockDevice, CreateOptions, FileDrive, Level, RaidError, Volume, VolumeOptions};
use serde_json::{Value, json};

/// What to run.
#[derive(Debug, Clone)]
pub struct VolumeBenchOptions {
    /// Folder for the drive files (a fresh subfolder is made and removed).
    pub dir: PathBuf,
    /// Bytes written (and read) per phase.
    pub size: u64,
    pub jobs: Vec<usize>,
    pub drives: usize,
    pub strip_bytes: u64,
    pub parity: usize,
    /// Every phase runs this many times (interleaved); the best of each is kept.
    pub rounds: usize,
}

impl VolumeBenchOptions {
    pub fn new(dir: &Path) -> Self {
        VolumeBenchOptions {
            dir: dir.to_path_buf(),
            size: 512 << 20,
            jobs: vec![1, 4, 8, 16, 32],
            drives: 10,
            strip_bytes: 128 << 10,
            parity: 2,
            rounds: 1,
        }
    }
}

/// Errors of a bench run.
#[derive(Debug)]
pub enum BenchError {
    Raid(RaidError),
    Io(std::io::Error),
    /// Data read back differs from what was written.
    Verify(String),
    Bad(String),
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::Raid(e) => write!(f, "{e}"),
            BenchError::Io(e) => write!(f, "{e}"),
            BenchError::Verify(s) => write!(f, "verification failed: {s}"),
            BenchError::Bad(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for BenchError {}

impl From<RaidError> for BenchError {
    fn from(e: RaidError) -> Self {
        BenchError::Raid(e)
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> Self {
        BenchError::Io(e)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Write,
    Read,
}

/// Stamp each 4 KiB sector of `buf` (which will land at volume offset `off`) with its
/// offset and a per-run salt.
pub(crate) fn stamp(buf: &mut [u8], off: u64, salt: u64) {
    for (i, sector) in buf.chunks_mut(4096).enumerate() {
        let at = off + (i as u64) * 4096;
        sector[..8].copy_from_slice(&at.to_le_bytes());
        sector[8..16].copy_from_slice(&salt.to_le_bytes());
    }
}

pub(crate) fn check(buf: &[u8], off: u64, salt: u64) -> Result<(), BenchError> {
    for (i, sector) in buf.chunks(4096).enumerate() {
        let at = off + (i as u64) * 4096;
        if sector[..8] != at.to_le_bytes() || sector[8..16] != salt.to_le_bytes() {
            return Err(BenchError::Verify(format!("sector at volume offset {at} holds other data")));
        }
    }
    Ok(())
}

/// Run `jobs` threads: each first builds its state with `setup` (buffers, outside the
/// clock), waits for the others at a barrier, then runs `job`. Returns the seconds from
/// the first job's start to the last one's end. Each job reads the clock itself: a clock
/// read by this thread after the barrier missed whatever the jobs did before it was
/// scheduled again, which on 2 cores could be a whole short phase.
pub(crate) fn timed<S, F, G>(jobs: usize, setup: G, job: F) -> Result<f64, BenchError>
where
    G: Fn(usize) -> S + Sync,
    F: Fn(usize, &mut S) -> Result<(), BenchError> + Sync,
{
    let barrier = Barrier::new(jobs);
    let spans: Vec<Result<(Instant, Instant), BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..jobs)
            .map(|j| {
                let (barrier, setup, job) = (&barrier, &setup, &job);
                s.spawn(move || {
                    let mut state = setup(j);
                    barrier.wait();
                    let start = Instant::now();
                    job(j, &mut state)?;
                    Ok((start, Instant::now()))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(BenchError::Bad("job panicked".into())))).collect()
    });
    let mut first_start: Option<Instant> = None;
    let mut last_end: Option<Instant> = None;
    for span in spans {
        let (start, end) = span?;
        first_start = Some(first_start.map_or(start, |t| t.min(start)));
        last_end = Some(last_end.map_or(end, |t| t.max(end)));
    }
    Ok(first_start.zip(last_end).map_or(0.0, |(start, end)| (end - start).as_secs_f64()))
}

/// Run `jobs` threads over `[base, base + size)`, each streaming its own slice in IOs of
/// `io` bytes starting `shift` bytes into it. Returns GB/s.
fn phase(v: &Volume, phase: Phase, jobs: usize, size: u64, io: u64, shift: u64, salt: u64) -> Result<f64, BenchError> {
    let per_job = (size / jobs as u64) / io * io;
    if per_job == 0 {
        return Err(BenchError::Bad(format!("--size {size} is too small for {jobs} jobs of {io}-byte IOs")));
    }
    let secs = timed(
        jobs,
        |_| AlignedBuf::zeroed(io as usize),
        |j, buf| {
            let start = j as u64 * per_job + shift;
            for n in 0..per_job / io {
                let off = start + n * io;
                match phase {
                    Phase::Write => {
                        stamp(buf, off, salt);
                        v.write(off, buf)?;
                    }
                    Phase::Read => {
                        v.read(off, buf)?;
                        check(buf, off, salt)?;
                    }
                }
            }
            Ok(())
        },
    )?;
    Ok((per_job * jobs as u64) as f64 / secs / 1e9)
}

/// A drive file, written through once: the first touch of a page (on tmpfs, and of a
/// VM's memory) costs several times the steady state, and would otherwise be charged to
/// whichever phase touches it first (the rebuild phase writes to a brand-new spare).
fn make_drive(path: &Path, size: u64) -> Result<Arc<dyn BlockDevice>, BenchError> {
    let d = FileDrive::create_file(path, size, nacre_raid::Provision::Thick)?;
    let chunk = AlignedBuf::zeroed(4 << 20);
    let mut off = 0;
    while off < size {
        let n = (size - off).min(chunk.len() as u64) as usize;
        d.write_at(&chunk[..n], off)?;
        off += n as u64;
    }
    Ok(Arc::new(d))
}

pub(crate) fn make_drives(dir: &Path, n: usize, size: u64) -> Result<Vec<Arc<dyn BlockDevice>>, BenchError> {
    (0..n).map(|i| make_drive(&dir.join(format!("drive{i}")), size)).collect()
}

pub(crate) fn create(drives: &[Arc<dyn BlockDevice>], level: Level, strip: u64) -> Result<Volume, BenchError> {
    let mut o = CreateOptions::new("bench", level);
    o.strip_bytes = strip;
    o.force = true;
    // The phases write every stripe they later read in whole stripes first, which sets
    // parity; initializing the whole volume would only time the initialization.
    o.assume_clean = true;
    Ok(Volume::create(drives.to_vec(), &o, &VolumeOptions::default())?)
}

pub(crate) fn peak(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// The ratio of two same-run series, job count by job count, and the median of those:
/// one outlier sample (the virtio disk sometimes serves a read phase from the host's
/// cache) moves a peak-over-peak ratio a lot and this one little.
fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| if *y > 0.0 { x / y } else { 0.0 }).collect();
    r.sort_by(|x, y| x.total_cmp(y));
    let mid = match r.len() {
        0 => 0.0,
        n if n % 2 == 1 => r[n / 2],
        n => (r[n / 2 - 1] + r[n / 2]) / 2.0,
    };
    (mid * 1000.0).round() / 1000.0
}

pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { (a / b * 1000.0).round() / 1000.0 } else { 0.0 }
}

/// Run the bench; prints progress and the table to `out`, returns the JSON figures.
pub fn run_volume_bench(o: &VolumeBenchOptions, out: &mut dyn std::io::Write) -> Result<Value, BenchError> {
    if o.jobs.is_empty() || o.jobs.contains(&0) {
        return Err(BenchError::Bad("--jobs needs positive job counts".into()));
    }
    let k = o.drives - o.parity;
    let stripe6 = k as u64 * o.strip_bytes;
    let stripe0 = o.drives as u64 * o.strip_bytes;
    let max_jobs = *o.jobs.iter().max().unwrap_or(&1) as u64;
    if o.size < stripe0 * max_jobs {
        return Err(BenchError::Bad(format!(
            "--size {} is too small: at least {} bytes (one {}-byte stripe per job)",
            o.size,
            stripe0 * max_jobs,
            stripe0
        )));
    }
    let work = o.dir.join(format!("nacre-raid-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let result = run_in(o, &work, stripe0, stripe6, out);
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// Figures of one round: every phase once.
#[derive(Default)]
struct Round {
    w0: Vec<f64>,
    r0: Vec<f64>,
    w6: Vec<f64>,
    r6: Vec<f64>,
    wu: Vec<f64>,
    wd: Vec<f64>,
    rd: Vec<f64>,
    wr: f64,
    rebuild_active: bool,
    rebuild_secs: f64,
    full_stripe_reads: u64,
    rmw_reads: u64,
}

impl Round {
    /// Keep the best of each figure over rounds: interference on a shared machine only
    /// ever slows a phase down.
    fn merge(&mut self, o: Round) {
        let best = |a: &mut Vec<f64>, b: Vec<f64>| {
            if a.is_empty() {
                *a = b;
            } else {
                a.iter_mut().zip(b).for_each(|(x, y)| *x = x.max(y));
            }
        };
        best(&mut self.w0, o.w0);
        best(&mut self.r0, o.r0);
        best(&mut self.w6, o.w6);
        best(&mut self.r6, o.r6);
        best(&mut self.wu, o.wu);
        best(&mut self.wd, o.wd);
        best(&mut self.rd, o.rd);
        self.wr = self.wr.max(o.wr);
        self.rebuild_active |= o.rebuild_active;
        self.rebuild_secs = o.rebuild_secs;
        self.full_stripe_reads += o.full_stripe_reads;
        self.rmw_reads = o.rmw_reads;
    }
}

#[allow(clippy::too_many_arguments)]
fn round(
    o: &VolumeBenchOptions,
    work: &Path,
    drives: &[Arc<dyn BlockDevice>],
    drive_size: u64,
    level6: Level,
    stripe0: u64,
    stripe6: u64,
    jr: usize,
    salt0: u64,
    out: &mut dyn std::io::Write,
) -> Result<Round, BenchError> {
    let salt = std::cell::Cell::new(salt0);
    let next_salt = || {
        salt.set(salt.get() + 1);
        salt.get()
    };
    let run_jobs = |v: &Volume, io: u64, shift: u64, label: &str, read: bool, out: &mut dyn std::io::Write| {
        let mut w = Vec::new();
        let mut r = Vec::new();
        for &j in &o.jobs {
            let salt = next_salt();
            w.push(phase(v, Phase::Write, j, o.size, io, shift, salt)?);
            if read {
                r.push(phase(v, Phase::Read, j, o.size, io, shift, salt)?);
            }
            let _ = writeln!(
                out,
                "  {label:<22} jobs {j:>2}: write {:>6.2} GB/s{}",
                w[w.len() - 1],
                r.last().map(|x| format!("  read {x:>6.2} GB/s")).unwrap_or_default()
            );
        }
        Ok::<_, BenchError>((w, r))
    };

    // 1. The reference: RAID0 over the same drives.
    let v0 = create(drives, Level::Raid0, o.strip_bytes)?;
    // Untimed warm-up: the first touch of fresh file (or tmpfs) pages is much slower than
    // the steady state, and would be charged to whichever phase came first.
    phase(&v0, Phase::Write, 4, o.size, stripe0, 0, next_salt())?;
    let (w0, r0) = run_jobs(&v0, stripe0, 0, "raid0 (reference)", true, out)?;
    v0.close()?;

    // 2. RAID6 healthy, then unaligned writes.
    let v6 = create(drives, level6, o.strip_bytes)?;
    let (w6, r6) = run_jobs(&v6, stripe6, 0, &format!("raid{level6} healthy"), true, out)?;
    let before = v6.stats();
    let (wu, _) = run_jobs(&v6, stripe6, o.strip_bytes / 2, &format!("raid{level6} unaligned"), false, out)?;
    let after = v6.stats();
    let s_full = v6.stats();
    // Full-stripe phases read nothing from drives: checked on a fresh write.
    let reads_before = s_full.drive_reads;
    phase(&v6, Phase::Write, 1, stripe6 * 4, stripe6, 0, next_salt())?;
    let full_stripe_reads = v6.stats().drive_reads - reads_before;

    // 3. One failed drive.
    v6.fail_drive(3)?;
    let (wd, rd) = run_jobs(&v6, stripe6, 0, &format!("raid{level6} 1 failed"), true, out)?;

    // 4. Replace it and write while it rebuilds, at the default priority.
    let spare_path = work.join("spare");
    let _ = std::fs::remove_file(&spare_path);
    let spare = make_drive(&spare_path, drive_size)?;
    let t = Instant::now();
    v6.replace_drive(3, spare)?;
    let wr = phase(&v6, Phase::Write, jr, o.size, stripe6, 0, next_salt())?;
    let rebuild_active = v6.status().rebuild.is_some();
    v6.wait_rebuild();
    let rebuild_secs = t.elapsed().as_secs_f64();
    let rebuilt_bytes = (drive_size - (1 << 20)) as f64;
    let _ = writeln!(
        out,
        "  {:<22} jobs {jr:>2}: write {wr:>6.2} GB/s (rebuild {} through the phase; done in {rebuild_secs:.1} s, {:.2} GB/s)",
        "write during rebuild",
        if rebuild_active { "active" } else { "finished before the end" },
        rebuilt_bytes / rebuild_secs / 1e9
    );
    let scrub = v6.scrub(false, |_, _| {})?;
    if scrub.mismatches != 0 {
        return Err(BenchError::Verify(format!("scrub found {} stripes with bad parity", scrub.mismatches)));
    }
    v6.close()?;

    Ok(Round {
        w0,
        r0,
        w6,
        r6,
        wu,
        wd,
        rd,
        wr,
        rebuild_active,
        rebuild_secs,
        full_stripe_reads,
        rmw_reads: after.drive_reads - before.drive_reads,
    })
}

fn run_in(
    o: &VolumeBenchOptions,
    work: &Path,
    stripe0: u64,
    stripe6: u64,
    out: &mut dyn std::io::Write,
) -> Result<Value, BenchError> {
    let k = o.drives - o.parity;
    // Room for the phase data on RAID6 plus one stripe for the shifted (unaligned) phase.
    let rows = o.size.div_ceil(stripe6) + 2;
    let drive_size = (1 << 20) + rows * o.strip_bytes;
    let drives = make_drives(work, o.drives, drive_size)?;
    let level6 = if o.parity == 2 { Level::Raid6 } else { Level::Ec { n: k as u8, m: o.parity as u8 } };
    let _ = writeln!(
        out,
        "nacre raid bench: {} file drives of {} MiB in {}, strip {} KiB, {} MiB per phase, jobs {:?}, kernel {}",
        o.drives,
        drive_size >> 20,
        o.dir.display(),
        o.strip_bytes >> 10,
        o.size >> 20,
        o.jobs,
        nacre_raid::ec::kernel_name(),
    );
    let jr = o.jobs.iter().copied().filter(|&j| j <= 8).max().unwrap_or(o.jobs[0]);
    let mut best = Round::default();
    for r in 0..o.rounds.max(1) {
        if o.rounds > 1 {
            let _ = writeln!(out, "round {} of {}", r + 1, o.rounds);
        }
        let this = round(o, work, &drives, drive_size, level6, stripe0, stripe6, jr, 1 + r as u64 * 1000, out)?;
        best.merge(this);
    }
    let Round { w0, r0, w6, r6, wu, wd, rd, wr, rebuild_active, rebuild_secs, full_stripe_reads, rmw_reads } = best;
    let healthy_at_jr = w6[o.jobs.iter().position(|&j| j == jr).unwrap_or(0)];
    let (pw0, pr0, pw6, pr6, pwd, prd, pwu) =
        (peak(&w0), peak(&r0), peak(&w6), peak(&r6), peak(&wd), peak(&rd), peak(&wu));
    let mut table = String::new();
    let _ = writeln!(
        table,
        "\n| jobs | raid0 write | raid0 read | raid6 write | raid6 read | unaligned write | degraded write | degraded read |"
    );
    let _ = writeln!(table, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, j) in o.jobs.iter().enumerate() {
        let _ = writeln!(
            table,
            "| {j} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            w0[i], r0[i], w6[i], r6[i], wu[i], wd[i], rd[i]
        );
    }
    let _ = writeln!(
        table,
        "\nratios (median over job counts of same-jobs ratios; best of the rounds): write {:.3}  read {:.3}  degraded read {:.3}  degraded write {:.3}  unaligned write {:.3}  write during rebuild (jobs {jr}) {:.3}\npeak over peak:                                                 write {:.3}  read {:.3}  degraded read {:.3}  degraded write {:.3}",
        median_ratio(&w6, &w0),
        median_ratio(&r6, &r0),
        median_ratio(&rd, &r6),
        median_ratio(&wd, &w6),
        median_ratio(&wu, &w6),
        ratio(wr, healthy_at_jr),
        ratio(pw6, pw0),
        ratio(pr6, pr0),
        ratio(prd, pr6),
        ratio(pwd, pw6),
    );
    let _ = write!(out, "{table}");
    Ok(json!({
        "bench": "raid",
        "dir": o.dir.display().to_string(),
        "kernel": nacre_raid::ec::kernel_name(),
        "drives": o.drives,
        "level": level6.to_string(),
        "strip_bytes": o.strip_bytes,
        "phase_bytes": o.size,
        "rounds": o.rounds.max(1),
        "jobs": o.jobs,
        "gbps": {
            "raid0_write": w0, "raid0_read": r0,
            "raid6_write": w6, "raid6_read": r6,
            "unaligned_write": wu,
            "degraded_write": wd, "degraded_read": rd,
            "rebuild_write": wr, "rebuild_write_jobs": jr,
        },
        "full_stripe_drive_reads": full_stripe_reads,
        "unaligned_drive_reads": rmw_reads,
        "rebuild_active_through_phase": rebuild_active,
        "rebuild_seconds": rebuild_secs,
        "write_ratio": median_ratio(&w6, &w0),
        "read_ratio": median_ratio(&r6, &r0),
        "degraded_read_ratio": median_ratio(&rd, &r6),
        "degraded_write_ratio": median_ratio(&wd, &w6),
        "unaligned_write_ratio": median_ratio(&wu, &w6),
        "peak_ratios": {
            "write": ratio(pw6, pw0),
            "read": ratio(pr6, pr0),
            "degraded_read": ratio(prd, pr6),
            "degraded_write": ratio(pwd, pw6),
            "unaligned_write": ratio(pwu, pw6),
        },
        "rebuild_write_ratio": ratio(wr, healthy_at_jr),
    }))
}
