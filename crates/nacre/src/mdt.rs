//! `nacre mdt …`: metadata targets on file drives — make one, show it, serve it (the MDS).
//!
//! A metadata target in `--dir` is one RAID10 volume (RAID1 with two drives) over drive
//! files; it holds the namespace database and its redo log.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Subcommand;
use nacre_bench::torture::{MdtModel, MdtOp};
use nacre_proto::fid::Fid;
use nacre_raid::{CreateOptions, Level, Provision, Volume, VolumeOptions};
use nacre_server::mdt::{Cred, Namespace, NamespaceOptions, RenameMode, SetAttr};

use crate::service::Access;
use crate::size::parse_size;

#[derive(Subcommand)]
pub enum MdtCommand {
    /// Make a new metadata target: drive files, a RAID10 volume and an empty namespace.
    Format {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "mdt0")]
        name: String,
        /// The MDT's index in its file system (MDT 0 holds the root).
        #[arg(long, default_value_t = 0)]
        index: u32,
        /// Bytes of each drive.
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        /// Drives: 2 make a RAID1, 4 or more (even) a RAID10.
        #[arg(long, default_value_t = 4)]
        drives: usize,
        #[command(flatten)]
        alloc: crate::service::ProvisionArg,
    },
    /// Inodes, space and counters of a metadata target.
    Stat {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "mdt0")]
        name: String,
    },
    /// Serve the target over the network (the MDS) until stopped.
    Serve {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "mdt0")]
        name: String,
        /// Where to listen, e.g. 0.0.0.0@tcp:9200 (port 0: any free one, printed).
        #[arg(long)]
        listen: nacre_net::nid::Nid,
        #[command(flatten)]
        join: crate::mgs::JoinArgs,
    },
    /// Run seeded namespace operations forever, printing each acknowledged one (crash
    /// tests).
    #[command(hide = true)]
    Torture {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "mdt0")]
        name: String,
        #[arg(long)]
        seed: u64,
        #[arg(long, default_value_t = 4)]
        threads: u64,
        /// Each thread works in its directory `PREFIX-tN` under the root.
        #[arg(long)]
        prefix: String,
        /// Checkpoint at least this often (milliseconds): short, a kill often lands
        /// inside one.
        #[arg(long, default_value_t = 500)]
        checkpoint_ms: u64,
    },
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

/// Assemble a metadata target's volume and open its namespace.
pub fn open(dir: &Path, name: &str) -> Result<Namespace, Box<dyn std::error::Error>> {
    open_with(dir, name, NamespaceOptions::default(), &Access::Exclusive)
}

/// The same, its drives opened as `access` says (shared and fenced by a lease).
pub fn open_as(dir: &Path, name: &str, access: &Access) -> Result<Namespace, Box<dyn std::error::Error>> {
    open_with(dir, name, NamespaceOptions::default(), access)
}

fn open_with(
    dir: &Path,
    name: &str,
    opts: NamespaceOptions,
    access: &Access,
) -> Result<Namespace, Box<dyn std::error::Error>> {
    Ok(Namespace::open(crate::service::assemble_with(dir, name, access)?, opts)?)
}

/// Run one torture operation on the namespace.
fn run_op(ns: &Namespace, dir: Fid, op: &MdtOp) -> Result<(), nacre_server::mdt::MdError> {
    let c = Cred::root();
    match op {
        MdtOp::Create(n) => ns.create(&c, dir, n, 0o644, None).map(|_| ()),
        MdtOp::Mkdir(n) => ns.mkdir(&c, dir, n, 0o755, None).map(|_| ()),
        MdtOp::Rename(a, b) => ns.rename(&c, dir, a, dir, b, RenameMode::Replace, None),
        MdtOp::Unlink(n) => ns.remove(&c, dir, n, false, None),
        MdtOp::Rmdir(n) => ns.remove(&c, dir, n, true, None),
        MdtOp::Truncate(n, size) => {
            let a = ns.lookup(&c, dir, n)?;
            ns.setattr(&c, a.fid, SetAttr { size: Some(*size), ..SetAttr::default() }, None).map(|_| ())
        }
    }
}

/// Make a new metadata target in `dir`: drive files, a RAID10 volume (RAID1 with two
/// drives) and an empty namespace; returns the line that describes it.
pub fn format(
    dir: &Path,
    name: &str,
    index: u32,
    size: u64,
    drives: usize,
    provision: Provision,
    root_layout: Option<&nacre_proto::layout::Layout>,
) -> Result<String, Box<dyn std::error::Error>> {
    let dir = dir.to_path_buf();
    if !(2..=16).contains(&drives) || !drives.is_multiple_of(2) {
        return Err(format!("--drives {drives}: 2 (RAID1) or an even number up to 16 (RAID10)").into());
    }
    if size < 16 << 20 {
        return Err(format!("--size {size}: at least 16M per drive").into());
    }
    if dir.exists() && std::fs::read_dir(&dir)?.next().is_some() {
        return Err(format!("{} is not empty: a target is there already", dir.display()).into());
    }
    std::fs::create_dir_all(&dir)?;
    let devs = crate::service::new_drives(&dir, name, drives, size, provision)?;
    let level = if drives == 2 { Level::Raid1 } else { Level::Raid10 };
    let mut o = CreateOptions::new(name, level);
    o.strip_bytes = 256 << 10;
    o.assume_clean = true;
    let vol = Volume::create(devs, &o, &VolumeOptions::default())?;
    let ns = Namespace::format(Arc::new(vol), index, NamespaceOptions::default())?;
    if let Some(l) = root_layout {
        // The file system's default layout: the root's, which new directories pass on.
        let root = Cred::root();
        ns.set_dir_layout(&root, Fid::ROOT, Some(l.clone()), None)?;
    }
    let s = ns.statfs()?;
    Ok(format!(
        "metadata target {name} (MDT {index}): {} MiB for the namespace on {}, in {}",
        s.bytes_total >> 20,
        if drives == 2 { "RAID1".to_string() } else { format!("RAID10 of {drives}") },
        dir.display()
    ))
}

pub fn run(cmd: MdtCommand) -> CliResult {
    match cmd {
        MdtCommand::Format { dir, name, index, size, drives, alloc } => {
            println!("{}", format(&dir, &name, index, size, drives, alloc.provision(), None)?);
            Ok(())
        }
        MdtCommand::Stat { dir, name } => {
            let ns = open(&dir, &name)?;
            let s = ns.statfs()?;
            println!(
                "metadata target {name} (MDT {}): {} inodes, database {} of {} MiB",
                ns.index(),
                s.inodes,
                s.bytes_used >> 20,
                s.bytes_total >> 20
            );
            Ok(())
        }
        MdtCommand::Serve { dir, name, listen, join } => {
            let ns = Arc::new(open(&dir, &name)?);
            let index = ns.index();
            let mds = nacre_server::mds::Mds::new(&name, ns.clone());
            let label = name.clone();
            crate::service::serve_forever(&listen, mds.handler(), mds.service(), &name, |server, nid| async move {
                mds.follow_evictions(server);
                // Operations over several MDTs a stop cut short are finished first (their
                // steps wait for the other MDTs, known from the MGS).
                let open = mds.recover()?;
                if open > 0 {
                    eprintln!("{label}: finishing {open} operations over several MDTs");
                }
                if let Some(mgs) = &join.mgs {
                    crate::mgs::register(mgs, &join.fsname, nacre_proto::mgs::TargetKind::Mdt, index, &nid).await?;
                    let client = nacre_net::client::Client::new(
                        Arc::new(nacre_net::transport::TcpTransport),
                        nacre_net::client::ClientConfig::default(),
                    );
                    let fsname = join.fsname.clone();
                    tokio::spawn(nacre_server::cluster::follow_config(client, mgs.into(), fsname, Vec::new(), mds));
                }
                Ok(())
            })
        }
        MdtCommand::Torture { dir, name, seed, threads, prefix, checkpoint_ms } => {
            let interval = std::time::Duration::from_millis(checkpoint_ms.max(1));
            let ns = open_with(
                &dir,
                &name,
                NamespaceOptions { checkpoint_interval: interval, ..Default::default() },
                &Access::Exclusive,
            )?;
            let c = Cred::root();
            let dirs: Vec<Fid> = (0..threads)
                .map(|t| ns.mkdir(&c, Fid::ROOT, &format!("{prefix}-t{t}"), 0o755, None).map(|a| a.fid))
                .collect::<Result<_, _>>()?;
            let out = std::sync::Mutex::new(std::io::stdout());
            println!("ready");
            let _ = std::io::stdout().flush();
            std::thread::scope(|s| {
                for (t, &d) in dirs.iter().enumerate() {
                    let (ns, out) = (&ns, &out);
                    s.spawn(move || {
                        let mut m = MdtModel::default();
                        for k in 0.. {
                            let op = m.next_op(seed, t as u64, k);
                            if let Err(e) = run_op(ns, d, &op) {
                                let _ = writeln!(
                                    out.lock().unwrap_or_else(|e| e.into_inner()),
                                    "failed {t} {k} {op:?}: {e}"
                                );
                                return;
                            }
                            m.apply(&op);
                            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                            let _ = writeln!(o, "ack {t} {k}");
                            let _ = o.flush();
                        }
                    });
                }
            });
            Ok(())
        }
    }
}
