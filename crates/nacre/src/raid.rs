//! `nacre raid …`: create, inspect and repair volumes, and benchmark them.
//!
//! Every command finds its drives from `--drives a,b,c` or `--dir DIR` (every file in the
//! folder is a candidate; superblocks say which volume each belongs to). Nothing is kept
//! anywhere else: the drives describe themselves.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use nacre_bench::raid::{VolumeBenchOptions, run_volume_bench};
use nacre_raid::{BlockDevice, CreateOptions, FileDrive, Level, Provision, RaidError, Volume, VolumeOptions};

use crate::size::parse_size;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Subcommand)]
pub enum RaidCommand {
    /// Create a volume over existing drives (--drives) or new drive files (--dir --count --size).
    Create(CreateArgs),
    /// Print a volume's geometry, state, drives and rebuild/scrub progress.
    Show(FindArgs),
    /// Find a volume's drives, resync it if it was not shut down cleanly, and report.
    Assemble(FindArgs),
    /// Mark a drive failed: the volume goes on degraded.
    Fail {
        #[command(flatten)]
        find: FindArgs,
        /// Drive slot, as `show` numbers them.
        #[arg(long)]
        slot: usize,
    },
    /// Put a new drive in a failed slot and rebuild it (shows progress until done).
    Replace {
        #[command(flatten)]
        find: FindArgs,
        #[arg(long)]
        slot: usize,
        /// The new drive: an existing file or block device, or a file to create with --size.
        #[arg(long)]
        new: PathBuf,
        /// Create the new drive file with this size.
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Share of bandwidth (1-100) the rebuild takes while other IO runs.
        #[arg(long)]
        recon_prio: Option<u8>,
    },
    /// Check every stripe's parity and repair mismatches.
    Scrub {
        #[command(flatten)]
        find: FindArgs,
        /// Report mismatches without repairing them.
        #[arg(long)]
        check_only: bool,
    },
    /// Sequential throughput with 1..32 jobs (healthy, unaligned, degraded, rebuilding),
    /// against RAID0 over the same drives; or, with --kernel, the parity kernels alone.
    Bench(BenchArgs),
    /// Write a seeded pattern forever, printing an acknowledgment after each write (crash tests).
    #[command(hide = true)]
    Torture {
        #[command(flatten)]
        find: FindArgs,
        #[arg(long)]
        seed: u64,
        #[arg(long, default_value_t = 2)]
        threads: u64,
    },
}

#[derive(Args, Clone)]
pub struct DriveArgs {
    /// Drives, comma separated.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    drives: Vec<PathBuf>,
    /// A folder whose files are the candidate drives.
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct FindArgs {
    #[command(flatten)]
    drives: DriveArgs,
    /// Volume name (needed when the drives hold several volumes).
    #[arg(long)]
    name: Option<String>,
}

#[derive(Args)]
pub struct CreateArgs {
    #[arg(long)]
    name: String,
    /// 0, 1, 10, 5, 6, 50, 60, or N+M (e.g. 8+3).
    #[arg(long)]
    level: String,
    /// Drives per group for levels 10, 50 and 60.
    #[arg(long)]
    group_size: Option<usize>,
    /// Strip size, a power of two from 4K to 1M.
    #[arg(long, default_value = "128K", value_parser = parse_size)]
    strip: u64,
    /// Existing drives (files or block devices), in slot order.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    drives: Vec<PathBuf>,
    /// Folder in which to create new drive files NAME-d0, NAME-d1, …
    #[arg(long, requires_all = ["count", "size"], conflicts_with = "drives")]
    dir: Option<PathBuf>,
    /// Number of drive files to create in --dir.
    #[arg(long)]
    count: Option<usize>,
    /// Size of each new drive file.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Share of bandwidth (1-100) a rebuild takes while other IO runs.
    #[arg(long, default_value_t = nacre_raid::volume::RECON_PRIO_DEFAULT)]
    recon_prio: u8,
    /// Overwrite drives that belong to another volume.
    #[arg(long)]
    force: bool,
    /// Skip parity initialization (the drives hold zeros). Implied for new files.
    #[arg(long)]
    assume_clean: bool,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Folder for the drive files (use /dev/shm for the CPU-bound case).
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// Bytes written and read in each phase.
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    size: u64,
    /// Job counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16,32")]
    jobs: Vec<usize>,
    /// Strip size.
    #[arg(long, default_value = "128K", value_parser = parse_size)]
    strip: u64,
    /// Run every phase this many times, interleaved, and keep the best of each.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Measure the parity and reconstruction kernels instead of volumes.
    #[arg(long)]
    kernel: bool,
}

pub fn run(cmd: RaidCommand) -> CliResult {
    match cmd {
        RaidCommand::Create(a) => create(a),
        RaidCommand::Show(f) => {
            // Read-only: superblocks and bitmaps, nothing opened or written.
            let (status, refused) = Volume::inspect(candidates(&f.drives)?, f.name.as_deref())?;
            for r in &refused {
                eprintln!("nacre: refused: {r}");
            }
            print!("{}", nacre_raid::volume::render_status(&status));
            Ok(())
        }
        RaidCommand::Assemble(f) => {
            let v = assemble(&f)?;
            let st = v.status();
            println!("volume '{}' assembled: {} drives, state {}", st.name, st.drives.len(), st.state.name());
            v.close()?;
            Ok(())
        }
        RaidCommand::Fail { find, slot } => {
            check_slot(&find, slot)?;
            let v = assemble(&find)?;
            v.fail_drive(slot)?;
            println!("slot {slot} of '{}' failed; volume is {}", v.name(), v.status().state.name());
            v.close()?;
            Ok(())
        }
        RaidCommand::Replace { find, slot, new, size, recon_prio } => replace(&find, slot, &new, size, recon_prio),
        RaidCommand::Scrub { find, check_only } => scrub(&find, check_only),
        RaidCommand::Bench(b) => bench(b),
        RaidCommand::Torture { find, seed, threads } => torture(&find, seed, threads),
    }
}

fn open_drive(p: &Path) -> Result<Arc<dyn BlockDevice>, RaidError> {
    Ok(Arc::new(FileDrive::open(p)?) as Arc<dyn BlockDevice>)
}

/// Open drives named on the command line, refusing one named twice (by any path).
fn open_drives(paths: &[PathBuf]) -> Result<Vec<Arc<dyn BlockDevice>>, RaidError> {
    let mut seen: Vec<PathBuf> = Vec::new();
    for p in paths {
        let canon = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        if seen.contains(&canon) {
            return Err(RaidError::DuplicateDrive { path: p.clone() });
        }
        seen.push(canon);
    }
    paths.iter().map(|p| open_drive(p)).collect()
}

/// The candidate drives named by `--drives` or found in `--dir`.
fn candidates(d: &DriveArgs) -> Result<Vec<Arc<dyn BlockDevice>>, Box<dyn std::error::Error>> {
    let mut paths = d.drives.clone();
    if let Some(dir) = &d.dir {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read folder {}: {e}", dir.display()))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.path())
            .collect();
        found.sort();
        paths.extend(found);
    }
    if paths.is_empty() {
        return Err("no drives: give --drives a,b,c or --dir DIR".into());
    }
    Ok(open_drives(&paths)?)
}

fn assemble(f: &FindArgs) -> Result<Volume, Box<dyn std::error::Error>> {
    let asm = Volume::assemble(candidates(&f.drives)?, f.name.as_deref(), &VolumeOptions::default())?;
    for r in &asm.refused {
        eprintln!("nacre: refused: {r}");
    }
    if asm.resynced_stripes > 0 {
        eprintln!(
            "nacre: volume '{}' was not shut down cleanly; resynced {} stripes named by the write-intent log",
            asm.volume.name(),
            asm.resynced_stripes
        );
    }
    Ok(asm.volume)
}

/// Refuse a slot number the volume does not have before anything is opened for writing.
fn check_slot(f: &FindArgs, slot: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (status, _) = Volume::inspect(candidates(&f.drives)?, f.name.as_deref())?;
    if slot >= status.drives.len() {
        return Err(RaidError::NoSuchSlot { slot, count: status.drives.len() }.into());
    }
    Ok(())
}

fn create(a: CreateArgs) -> CliResult {
    let level: Level = a.level.parse()?;
    let mut o = CreateOptions::new(&a.name, level);
    o.group_size = a.group_size;
    o.strip_bytes = a.strip;
    o.recon_prio = a.recon_prio;
    o.force = a.force;
    o.assume_clean = a.assume_clean;
    let drives: Vec<Arc<dyn BlockDevice>> = if let Some(dir) = &a.dir {
        let (Some(count), Some(size)) = (a.count, a.size) else {
            return Err("--dir needs --count and --size for the new drive files".into());
        };
        // Validate before the first file exists, so a refusal leaves nothing behind.
        o.validate(count)?;
        let paths: Vec<PathBuf> = (0..count).map(|i| dir.join(format!("{}-d{i}", a.name))).collect();
        if let Some(p) = paths.iter().find(|p| p.exists()) {
            return Err(format!("{} already exists; pass existing drives with --drives", p.display()).into());
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create folder {}: {e}", dir.display()))?;
        let mut made = Vec::new();
        for p in &paths {
            match FileDrive::create_file(p, size, Provision::Thick) {
                Ok(d) => made.push(Arc::new(d) as Arc<dyn BlockDevice>),
                Err(e) => {
                    paths.iter().for_each(|p| {
                        let _ = std::fs::remove_file(p);
                    });
                    return Err(e.into());
                }
            }
        }
        o.assume_clean = true; // new files read as zeros, and zeros have zero parity
        made
    } else {
        if a.drives.is_empty() {
            return Err("no drives: give --drives a,b,c or --dir DIR --count N --size SIZE".into());
        }
        o.validate(a.drives.len())?;
        open_drives(&a.drives)?
    };
    let paths: Vec<PathBuf> = drives.iter().map(|d| d.path().to_path_buf()).collect();
    let v = match Volume::create(drives, &o, &VolumeOptions::default()) {
        Ok(v) => v,
        Err(e) => {
            if a.dir.is_some() {
                paths.iter().for_each(|p| {
                    let _ = std::fs::remove_file(p);
                });
            }
            return Err(e.into());
        }
    };
    print!("{}", v.render_status());
    v.close()?;
    Ok(())
}

fn replace(find: &FindArgs, slot: usize, new: &Path, size: Option<u64>, prio: Option<u8>) -> CliResult {
    if let Some(p) = prio
        && !(1..=100).contains(&p)
    {
        return Err(format!("--recon-prio {p} is not within 1..=100").into());
    }
    check_slot(find, slot)?;
    let v = assemble(find)?;
    if let Some(p) = prio {
        v.set_recon_prio(p)?;
    }
    let created = size.is_some() && !new.exists();
    let drive = match size {
        Some(size) if created => Arc::new(FileDrive::create_file(new, size, Provision::Thick)?) as Arc<dyn BlockDevice>,
        _ => open_drive(new)?,
    };
    if let Err(e) = v.replace_drive(slot, drive) {
        if created {
            let _ = std::fs::remove_file(new);
        }
        return Err(e.into());
    }
    let mut err = std::io::stderr();
    while v.rebuild_running() {
        if let Some((_, done, total)) = v.status().rebuild {
            let _ = write!(err, "\rrebuilding slot {slot}: {:5.1}%", done as f64 * 100.0 / total.max(1) as f64);
            let _ = err.flush();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if v.status().drives.get(slot).is_some_and(|d| d.state != nacre_raid::SlotState::Online) {
        let st = v.status();
        return Err(format!("rebuild of slot {slot} stopped: volume is {}", st.state.name()).into());
    }
    let _ = writeln!(err, "\rrebuilding slot {slot}: done  ");
    print!("{}", v.render_status());
    v.close()?;
    Ok(())
}

fn scrub(find: &FindArgs, check_only: bool) -> CliResult {
    let v = assemble(find)?;
    let mut err = std::io::stderr();
    let report = v.scrub(!check_only, |done, total| {
        let _ = write!(err, "\rscrub: {:5.1}%", done as f64 * 100.0 / total.max(1) as f64);
        let _ = err.flush();
    })?;
    let _ = writeln!(err);
    println!(
        "scrub of '{}': {} stripes checked, {} with mismatched parity ({} traced to one bad strip), {} repaired, {} not checkable (too many drives missing)",
        v.name(),
        report.stripes_checked,
        report.mismatches,
        report.located,
        report.repaired,
        report.unchecked
    );
    v.close()?;
    if check_only && report.mismatches > 0 {
        return Err(format!(
            "{} stripes have mismatched parity (run without --check-only to repair)",
            report.mismatches
        )
        .into());
    }
    Ok(())
}

fn bench(b: BenchArgs) -> CliResult {
    let mut out = std::io::stdout();
    let figures = if b.kernel {
        nacre_bench::kernel::run_kernel_bench(&mut out)?
    } else {
        let mut o = VolumeBenchOptions::new(&b.dir);
        o.size = b.size;
        o.jobs = b.jobs;
        o.strip_bytes = b.strip;
        o.rounds = b.rounds;
        run_volume_bench(&o, &mut out)?
    };
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

fn torture(find: &FindArgs, seed: u64, threads: u64) -> CliResult {
    let v = assemble(find)?;
    let cap = v.capacity();
    let stripe = v.geometry().stripe_data_bytes();
    let out = std::sync::Mutex::new(std::io::stdout());
    println!("ready {cap} {stripe}");
    std::thread::scope(|s| {
        for t in 0..threads {
            let (v, out) = (&v, &out);
            s.spawn(move || {
                for seq in 0.. {
                    let (off, data) = nacre_bench::torture::op(seed, cap, threads, t, seq, stripe);
                    if v.write(off, &data).is_err() {
                        return;
                    }
                    let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = writeln!(o, "ack {t} {seq}");
                    let _ = o.flush();
                }
            });
        }
    });
    Ok(())
}
