//! `nacre ost …`: object storage targets on file drives — make one, check it (an fsck for
//! a target), show its space and counters.
//!
//! A target in `--dir` is two RAID volumes over drive files: `DIR/data/` (RAID6 8+2 by
//! default) holds the objects, `DIR/index/` (RAID10, or RAID1 with two drives) the index
//! and the small-write journal.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Subcommand;
use nacre_osd::{Target, TargetOptions};
use nacre_raid::{CreateOptions, Level, Provision, Volume, VolumeOptions};

use crate::service::Access;
use crate::size::parse_size;

#[derive(Subcommand)]
pub enum OstCommand {
    /// Make a new target: drive files, its two volumes and an empty object store.
    Format {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "ost0")]
        name: String,
        /// Bytes of object data the target holds.
        #[arg(long, default_value = "4G", value_parser = parse_size)]
        size: u64,
        /// Data drives (RAID6: 2 of them parity).
        #[arg(long, default_value_t = 10)]
        data_drives: usize,
        #[arg(long, default_value = "128K", value_parser = parse_size)]
        strip: u64,
        /// Bytes of each index drive (a quarter of the index volume, at most 4 GiB, is
        /// the small-write journal).
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        index_size: u64,
        /// Index drives: 2 make a RAID1, 4 or more (even) a RAID10 (faster small writes).
        #[arg(long, default_value_t = 4)]
        index_drives: usize,
        #[command(flatten)]
        alloc: crate::service::ProvisionArg,
    },
    /// Check a target's index against itself and its data (exit status 1 if not clean).
    Check {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "ost0")]
        name: String,
    },
    /// Read every data block against its checksum, mending from parity what a drive
    /// returned wrong (exit status 1 if blocks are lost).
    Scrub {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "ost0")]
        name: String,
    },
    /// Space, objects and counters of a target.
    Stat {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "ost0")]
        name: String,
    },
    /// Serve the target over the network (the OSS) until stopped.
    Serve {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "ost0")]
        name: String,
        /// Where to listen, e.g. 0.0.0.0@tcp:9100 (port 0: any free one, printed).
        #[arg(long)]
        listen: nacre_net::nid::Nid,
        #[command(flatten)]
        join: crate::mgs::JoinArgs,
        /// The OST's index in its file system.
        #[arg(long, default_value_t = 0)]
        index: u32,
    },
    /// Write a seeded pattern forever, printing each acknowledged write (crash tests).
    #[command(hide = true)]
    Torture {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "ost0")]
        name: String,
        #[arg(long)]
        seed: u64,
        #[arg(long, default_value_t = 3)]
        threads: u64,
    },
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

pub fn volume_dirs(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("data"), dir.join("index"))
}

/// Assemble a target's volumes and open it.
pub fn open(dir: &Path, name: &str) -> Result<Target, Box<dyn std::error::Error>> {
    open_as(dir, name, &Access::Exclusive)
}

/// Assemble a target's volumes, their drives opened as `access` says, and open it.
pub fn open_as(dir: &Path, name: &str, access: &Access) -> Result<Target, Box<dyn std::error::Error>> {
    let (data_dir, index_dir) = volume_dirs(dir);
    let data = crate::service::assemble_with(&data_dir, name, access)?;
    let meta = crate::service::assemble_with(&index_dir, &format!("{name}-index"), access)?;
    Ok(Target::open(data, meta, TargetOptions::default())?)
}

/// The layout of a new object storage target.
pub struct OstFormat {
    pub size: u64,
    pub data_drives: usize,
    pub strip: u64,
    pub index_size: u64,
    pub index_drives: usize,
    pub provision: Provision,
}

impl OstFormat {
    /// Bytes of each drive of the RAID6 data volume: its share of the data in whole
    /// strips, plus the superblock area.
    fn data_drive_bytes(&self) -> u64 {
        (self.size / (self.data_drives as u64 - 2)).div_ceil(self.strip) * self.strip + (2 << 20)
    }

    /// Bytes of all the target's drive files.
    pub fn drive_bytes(&self) -> u64 {
        self.data_drives as u64 * self.data_drive_bytes() + self.index_drives as u64 * self.index_size
    }
}

/// Make a new target in `dir`: drive files, its two volumes and an empty object store;
/// returns the line that describes it.
pub fn format(dir: &Path, name: &str, f: &OstFormat) -> Result<String, Box<dyn std::error::Error>> {
    let OstFormat { data_drives, strip, index_size, index_drives, provision, .. } = *f;
    let dir = dir.to_path_buf();
    if !(4..=64).contains(&data_drives) {
        return Err(format!("--data-drives {data_drives}: RAID6 takes 4 to 64").into());
    }
    if !(2..=16).contains(&index_drives) || index_drives % 2 != 0 {
        return Err(format!("--index-drives {index_drives}: 2 (RAID1) or an even number up to 16 (RAID10)").into());
    }
    let (data_dir, index_dir) = volume_dirs(&dir);
    for d in [&data_dir, &index_dir] {
        if d.exists() && std::fs::read_dir(d)?.next().is_some() {
            return Err(format!("{} is not empty: a target is there already", d.display()).into());
        }
        std::fs::create_dir_all(d)?;
    }
    let k = data_drives as u64 - 2;
    let mk = crate::service::new_drives;
    let mut d = CreateOptions::new(name, Level::Raid6);
    d.strip_bytes = strip;
    d.assume_clean = true;
    let data = Volume::create(
        mk(&data_dir, name, data_drives, f.data_drive_bytes(), provision)?,
        &d,
        &VolumeOptions::default(),
    )?;
    // RAID10 takes 47,008-byte journal records faster than RAID1 (see the OST
    // bench); two drives make a RAID1.
    let level = if index_drives == 2 { Level::Raid1 } else { Level::Raid10 };
    let mut m = CreateOptions::new(&format!("{name}-index"), level);
    m.strip_bytes = if index_drives == 2 { 1 << 20 } else { 256 << 10 };
    m.assume_clean = true;
    let meta = Volume::create(
        mk(&index_dir, &format!("{name}-index"), index_drives, index_size, provision)?,
        &m,
        &VolumeOptions::default(),
    )?;
    let t = Target::format(Arc::new(data), Arc::new(meta), TargetOptions::default())?;
    let s = t.statfs()?;
    Ok(format!(
        "target {name}: {} MiB of objects in {} KiB chunks (RAID6 {}+2), index and journal on {}, in {}",
        s.total_bytes >> 20,
        s.chunk_bytes >> 10,
        k,
        if index_drives == 2 { "RAID1".to_string() } else { format!("RAID10 of {index_drives}") },
        dir.display()
    ))
}

pub fn run(cmd: OstCommand) -> CliResult {
    match cmd {
        OstCommand::Format { dir, name, size, data_drives, strip, index_size, index_drives, alloc } => {
            let f = OstFormat { size, data_drives, strip, index_size, index_drives, provision: alloc.provision() };
            println!("{}", format(&dir, &name, &f)?);
            Ok(())
        }
        OstCommand::Scrub { dir, name } => {
            let t = open(&dir, &name)?;
            let r = t.scrub(|_, _| true)?;
            t.sync()?;
            println!(
                "target {name}: {} chunks, {} blocks read, {} mended from parity, {} lost",
                r.chunks, r.blocks, r.mended, r.lost_blocks
            );
            for off in &r.lost {
                println!("  lost: the 4 KiB block at data volume offset {off}");
            }
            if r.lost_blocks > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
        OstCommand::Check { dir, name } => {
            let t = open(&dir, &name)?;
            let r = t.check()?;
            println!(
                "target {name}: {} objects, {} chunks mapped, {} free, {} data blocks checked, {}",
                r.objects,
                r.mapped_chunks,
                r.free_chunks,
                r.checked_blocks,
                if r.is_clean() { "clean".to_string() } else { format!("{} problems:", r.problems.len()) }
            );
            for p in &r.problems {
                println!("  {p}");
            }
            if !r.is_clean() {
                std::process::exit(1);
            }
            Ok(())
        }
        OstCommand::Stat { dir, name } => {
            let t = open(&dir, &name)?;
            let s = t.statfs()?;
            let c = t.stats();
            println!(
                "target {name}: {} objects, {} of {} MiB free, index {} of {} MiB, journal {} of {} MiB in use, \
                 {} regions' checksums computed again at open",
                s.objects,
                s.free_bytes >> 20,
                s.total_bytes >> 20,
                s.index_bytes >> 20,
                s.index_capacity >> 20,
                c.journal_used >> 20,
                c.journal_bytes >> 20,
                c.checksum_regions_recomputed
            );
            Ok(())
        }
        OstCommand::Serve { dir, name, listen, join, index } => {
            let t = Arc::new(open(&dir, &name)?);
            let oss = nacre_server::oss::Oss::named(vec![(name.clone(), t)], nacre_server::oss::OssConfig::default())?;
            let service = oss.service();
            crate::service::serve_forever(&listen, oss.handler(), service, &name, |handle, nid| async move {
                oss.attach(handle);
                if let Some(mgs) = &join.mgs {
                    crate::mgs::register(mgs, &join.fsname, nacre_proto::mgs::TargetKind::Ost, index, &nid).await?;
                }
                Ok(())
            })
        }
        OstCommand::Torture { dir, name, seed, threads } => {
            let t = open(&dir, &name)?;
            let oids: Vec<u64> = t.create(threads as u32)?.collect();
            let chunk = t.chunk_bytes();
            let out = std::sync::Mutex::new(std::io::stdout());
            println!("ready {}", oids.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(","));
            let _ = std::io::stdout().flush();
            std::thread::scope(|s| {
                for (ti, &oid) in oids.iter().enumerate() {
                    let (t, out) = (&t, &out);
                    s.spawn(move || {
                        // Every other write grows a small object (its fragment, made and
                        // moved as it grows) by appending to it; a new one once it passes
                        // a fragment's size.
                        let mut small: Option<(u64, u64)> = None;
                        for seq in 0.. {
                            let (mut oid, (mut off, mut len)) =
                                (oid, nacre_bench::torture::ost_op(seed, ti as u64, seq, chunk));
                            if seq % 2 == 1 {
                                let (o, end) = match small {
                                    Some((o, end)) if end <= t.fragment_max() => (o, end),
                                    _ => match t.create(1) {
                                        Ok(r) => (r.start, 0),
                                        Err(_) => return,
                                    },
                                };
                                (oid, off, len) = (o, end, 1 + len % 20_000);
                                small = Some((o, end + len as u64));
                            }
                            let data = nacre_bench::torture::ost_bytes(seed, oid, off, len);
                            if t.write(oid, off, &data).is_err() {
                                return;
                            }
                            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                            let _ = writeln!(o, "ack {oid} {off} {len}");
                            let _ = o.flush();
                        }
                    });
                }
            });
            Ok(())
        }
    }
}
