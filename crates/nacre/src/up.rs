//! `nacre up` / `nacre down`: a whole file system on this machine — the MGS, MDTs on
//! RAID10 and OSTs on RAID6 over drive files in one data folder, served by one process
//! (or one per service) that returns to the shell once everything serves (and is
//! mounted, if asked); and `nacre server`, one node's share of a file system spread over
//! machines by a cluster file.
//!
//! The data folder holds `nacre.conf` (the layout chosen at the first `up`), a folder of
//! drive files per target, and per serving process a lock (held while it serves: a second
//! `up` finds it taken), a pid file and a log (what the process says after it has
//! detached): `nacre.lock`, `nacre.pid`, `nacre.log` for `up`'s process,
//! `nacre-NODE.*` for node NODE.

use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nacre_net::nid::{Nid, NidList};
use nacre_net::transport::Shortcut;
use nacre_server::cluster::{Listen, Local, MgsAt, Registration, ServeWith};

use crate::ha::Role;
use crate::service::CliResult;
use crate::size::parse_size;

#[derive(clap::Args, Clone)]
pub struct UpArgs {
    /// Folder of the file system's drive files and state (made at the first `up`).
    #[arg(long, default_value = "nacre-data")]
    pub data: PathBuf,
    /// Mount the file system here once it serves.
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// The file system's name (first `up` only, as every layout option below).
    #[arg(long, default_value = "nacre")]
    pub fsname: String,
    /// Metadata targets, each a RAID10 of four drive files.
    #[arg(long, default_value_t = 1)]
    pub mdts: u32,
    /// Object storage targets.
    #[arg(long, default_value_t = 4)]
    pub osts: u32,
    /// Drives of each OST's RAID6 data volume (10 make 8+2).
    #[arg(long, default_value_t = 10)]
    pub ost_drives: usize,
    /// Object data each OST holds.
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    pub ost_size: u64,
    /// Bytes of each drive of an MDT.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub mdt_size: u64,
    /// Bytes of each of an OST's four index drives (its object index and small-write
    /// journal); default: an eighth of --ost-size, at least 64M.
    #[arg(long, value_parser = parse_size)]
    pub ost_index_size: Option<u64>,
    #[command(flatten)]
    pub alloc: crate::service::ProvisionArg,
    /// The file system's default layout, `setstripe` options (first `up` only): by
    /// default a file's first 64 KiB on the MDT (DoM, as Helma's), the rest in one stripe
    /// on an OST; "" for one stripe from the start.
    #[arg(long, default_value = DEFAULT_LAYOUT, allow_hyphen_values = true)]
    pub default_layout: String,
    /// Address the services listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port of the MGS, which clients mount from (HOST@tcp:PORT); the other services
    /// take free ports and register them with it.
    #[arg(long, default_value_t = 9400)]
    pub port: u16,
    #[command(flatten)]
    pub mount_opts: crate::fsys::MountOpts,
    /// Serve in the foreground until stopped (Ctrl-C), instead of returning once serving.
    #[arg(long)]
    pub foreground: bool,
    /// One process per service (the MGS, each MDT, each OST, the mount) instead of one
    /// for all.
    #[arg(long, conflicts_with = "foreground")]
    pub per_service: bool,
    /// A failover pair on this machine: two server nodes (`a` with the MDTs and the first
    /// half of the OSTs, `b` with the rest) that share every drive file and each take the
    /// other's targets when its lease on them expires, the MGS in a process of its own
    /// (node `mgs`, for which b stands by too), and the mount in another. Kill one node
    /// and the other serves its targets. The nodes serve at fixed ports after the MGS's
    /// (`--port`): one per target each, then b's for the MGS.
    #[arg(long, conflicts_with_all = ["foreground", "per_service"])]
    pub ha: bool,
    /// Started by `up` to serve in the background (its stdout goes when ready).
    #[arg(long, hide = true)]
    pub detached: bool,
}

/// The layout stored at the first `up`.
struct Conf {
    fsname: String,
    mdts: u32,
    osts: u32,
    host: String,
    port: u16,
}

impl Conf {
    fn load(path: &Path) -> Result<Conf, Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let get = |key: &str| -> Result<String, String> {
            text.lines()
                .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
                .map(|v| v.trim().to_string())
                .ok_or_else(|| format!("{}: no {key}=", path.display()))
        };
        let num = |key: &str| -> Result<u64, String> {
            get(key)?.parse().map_err(|_| format!("{}: {key} is not a number", path.display()))
        };
        Ok(Conf {
            fsname: get("fsname")?,
            mdts: num("mdts")? as u32,
            osts: num("osts")? as u32,
            host: get("host")?,
            port: num("port")? as u16,
        })
    }

    fn save(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(
            path,
            format!(
                "# Made by `nacre up`; the layout of this file system.\nfsname={}\nmdts={}\nosts={}\nhost={}\nport={}\n",
                self.fsname, self.mdts, self.osts, self.host, self.port
            ),
        )
    }

    fn mgs(&self) -> Result<Nid, String> {
        format!("{}@tcp:{}", self.host, self.port).parse().map_err(|e| format!("MGS address: {e}"))
    }
}

fn conf_path(data: &Path) -> PathBuf {
    data.join("nacre.conf")
}

/// The files of one serving process in a data folder: `nacre.lock`, `nacre.pid`,
/// `nacre.log` for `up`'s process, `nacre-NODE.*` for node NODE of a cluster file.
fn proc_file(data: &Path, tag: &str, ext: &str) -> PathBuf {
    if tag.is_empty() { data.join(format!("nacre.{ext}")) } else { data.join(format!("nacre-{tag}.{ext}")) }
}

/// Take a serving process's lock in `data` (held while it serves), or say who has it.
fn take_lock(data: &Path, tag: &str) -> Result<std::fs::File, Box<dyn std::error::Error>> {
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(proc_file(data, tag, "lock"))?;
    // SAFETY: flock on an open descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let pid = std::fs::read_to_string(proc_file(data, tag, "pid")).unwrap_or_default();
        return Err(format!(
            "a file system is already up in {} (process {}); `nacre down --data {}` stops it",
            data.display(),
            pid.trim(),
            data.display()
        )
        .into());
    }
    Ok(f)
}

/// Make the file system's targets in `data` (first `up`), once the host is known to hold
/// them.
fn format(a: &UpArgs) -> Result<Conf, Box<dyn std::error::Error>> {
    if a.mdts == 0 || a.mdts > 16 {
        return Err(format!("--mdts {}: 1 to 16", a.mdts).into());
    }
    if a.osts > 64 {
        return Err(format!("--osts {}: at most 64", a.osts).into());
    }
    if let Some(problem) = nacre_proto::mgs::fsname_problem(&a.fsname) {
        return Err(format!("--fsname: {problem}").into());
    }
    let conf = Conf { fsname: a.fsname.clone(), mdts: a.mdts, osts: a.osts, host: a.host.clone(), port: a.port };
    conf.mgs()?;
    let mut sizes = Sizes::new(a.ost_size, a.mdt_size, a.ost_index_size, a.ost_drives, a.alloc.provision());
    sizes.root_layout = default_layout(&a.default_layout)?;
    let (mdts, osts): (Vec<u32>, Vec<u32>) = ((0..a.mdts).collect(), (0..a.osts).collect());
    sizes.check_host(&a.data, true, &mdts, &osts)?;
    make_targets(&a.data, &a.fsname, true, &mdts, &osts, &sizes, false)?;
    conf.save(&conf_path(&a.data))?;
    Ok(conf)
}

/// The default layout of a new file system: small files (and the heads of large ones) on
/// the MDT, as Helma's DoM for the first 64 KiB; an MDT short of room leaves it out.
pub const DEFAULT_LAYOUT: &str = "-E 64K -L mdt -E -1";

/// The default layout from `setstripe` options ("": none, the built-in one stripe).
fn default_layout(opts: &str) -> Result<Option<nacre_proto::layout::Layout>, String> {
    let args: Vec<&str> = opts.split_whitespace().collect();
    if args.is_empty() {
        return Ok(None);
    }
    nacre_proto::layout::Layout::from_lfs_args(&args).map(Some).map_err(|e| format!("--default-layout {opts:?}: {e}"))
}

/// What new targets are made with.
struct Sizes {
    /// Object data per OST.
    ost: u64,
    /// Bytes of each of an MDT's four drives.
    mdt: u64,
    /// Bytes of each of an OST's four index drives.
    ost_index: u64,
    /// Drives of an OST's RAID6 data volume.
    ost_drives: usize,
    provision: nacre_raid::Provision,
    /// The root's default layout, set on MDT 0 when it is made.
    root_layout: Option<nacre_proto::layout::Layout>,
}

/// The smallest index drive of an OST: room for redb's first growth steps and a journal
/// that holds a few hundred 47,008-byte records.
const OST_INDEX_DRIVE_MIN: u64 = 64 << 20;

impl Sizes {
    fn new(ost: u64, mdt: u64, ost_index: Option<u64>, ost_drives: usize, provision: nacre_raid::Provision) -> Sizes {
        // An eighth of the data per index drive: the RAID10 of four holds a quarter of it,
        // a sixteenth of the data as journal and the rest for the object index.
        let ost_index = ost_index.unwrap_or_else(|| (ost / 8).div_ceil(1 << 20).max(OST_INDEX_DRIVE_MIN >> 20) << 20);
        Sizes { ost, mdt, ost_index, ost_drives, provision, root_layout: None }
    }

    fn ost_format(&self) -> crate::ost::OstFormat {
        crate::ost::OstFormat {
            size: self.ost,
            data_drives: self.ost_drives,
            strip: 128 << 10,
            index_size: self.ost_index,
            index_drives: 4,
            provision: self.provision,
        }
    }

    /// Bytes of the drive files of the targets to make (MDTs are RAID10 of four).
    fn drive_bytes(&self, mgs: bool, mdts: usize, osts: usize) -> u64 {
        let mgs = if mgs { 2 * crate::mgs::MGS_DRIVE_BYTES } else { 0 };
        mgs + mdts as u64 * 4 * self.mdt + osts as u64 * self.ost_format().drive_bytes()
    }

    /// Refuse, before anything is made, targets whose drive files the host could not hold
    /// once full (thin files grow as data is written; a host that fills fails them).
    fn check_host(&self, data: &Path, mgs: bool, mdts: &[u32], osts: &[u32]) -> Result<(), String> {
        let want = self.drive_bytes(mgs, mdts.len(), osts.len());
        let free = crate::fsys::host_free(data).map_err(|e| format!("{}: {e}", data.display()))?;
        if want > free {
            return Err(format!(
                "the drive files would take up to {} and the file system holding {} has {} free: \
                 make room, or ask for less (--osts, --ost-size, --mdt-size)",
                human(want),
                data.display(),
                human(free)
            ));
        }
        Ok(())
    }
}

/// Bytes as people read them: `512 MiB`, `7.8 GiB`.
pub fn human(b: u64) -> String {
    match b {
        b if b >= 10 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b.div_ceil(1 << 10)),
    }
}

/// Say how much host space the drive files in `data` take now and may take when full,
/// and warn when the host could no longer hold them full.
fn report_space(data: &Path) {
    let (size, taken) = crate::fsys::tree_usage(data);
    let free = crate::fsys::host_free(data).unwrap_or(u64::MAX);
    println!(
        "drive files in {}: {} of host space taken now, up to {} as data is written ({} free on the host)",
        data.display(),
        human(taken),
        human(size.max(taken)),
        human(free)
    );
    let growth = size.saturating_sub(taken);
    if growth > free {
        println!(
            "warning: the drive files may still grow by {} but the host has {} free; a host that fills \
             fails their writes: make room",
            human(growth),
            human(free)
        );
    }
}

/// Make targets in `data` (`mgs/`, `mdtN/`, `ostN/`), printing a line for each; with
/// `keep`, a target already there is kept (a node's later starts), else it is an error.
fn make_targets(
    data: &Path,
    fsname: &str,
    mgs: bool,
    mdts: &[u32],
    osts: &[u32],
    s: &Sizes,
    keep: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let new = |dir: &Path| !keep || !dir.exists();
    if mgs && new(&data.join("mgs")) {
        println!("{}", crate::mgs::format(&data.join("mgs"), fsname, s.provision)?);
    }
    for &i in mdts {
        let dir = data.join(format!("mdt{i}"));
        if new(&dir) {
            let root = if i == 0 { s.root_layout.as_ref() } else { None };
            println!("{}", crate::mdt::format(&dir, &format!("mdt{i}"), i, s.mdt, 4, s.provision, root)?);
        }
    }
    let f = s.ost_format();
    for &i in osts {
        let dir = data.join(format!("ost{i}"));
        if new(&dir) {
            println!("{}", crate::ost::format(&dir, &format!("ost{i}"), &f)?);
        }
    }
    Ok(())
}

/// `nacre up`: serve in this process (`--foreground`), or start a process that does and
/// return once it serves.
pub fn up(a: UpArgs) -> CliResult {
    if let Some(m) = &a.mount {
        mount_point(m)?;
    }
    if !a.detached {
        // Made here, so that what goes wrong is said on this terminal, not in the log.
        if !conf_path(&a.data).exists() {
            let fresh_dir = !a.data.exists();
            std::fs::create_dir_all(&a.data).map_err(|e| format!("{}: {e}", a.data.display()))?;
            let before = entries(&a.data);
            let made = take_lock(&a.data, "")
                .and_then(|_lock| if conf_path(&a.data).exists() { Ok(()) } else { format(&a).map(drop) });
            if let Err(e) = made {
                // A refusal, or a format cut short, leaves nothing behind.
                if fresh_dir {
                    let _ = std::fs::remove_dir_all(&a.data);
                } else {
                    for name in entries(&a.data).difference(&before) {
                        let p = a.data.join(name);
                        let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
                    }
                }
                return Err(e);
            }
        }
        report_space(&a.data);
    }
    if (a.per_service || a.ha) && !a.foreground {
        return up_per_service(&a);
    }
    if a.foreground {
        let _lock = take_lock(&a.data, "")?;
        let conf = if conf_path(&a.data).exists() {
            let c = Conf::load(&conf_path(&a.data))?;
            println!("file system {} in {}: {} MDT(s), {} OST(s)", c.fsname, a.data.display(), c.mdts, c.osts);
            c
        } else {
            format(&a)?
        };
        let plan = Plan {
            fsname: conf.fsname.clone(),
            data: a.data.clone(),
            mgs: conf.mgs()?.into(),
            mgs_here: true,
            known: Vec::new(),
            host: conf.host.clone(),
            fixed: Vec::new(),
            mdts: (0..conf.mdts).collect(),
            osts: (0..conf.osts).collect(),
            total_osts: conf.osts as usize,
            mount: a.mount.clone(),
            mount_opts: a.mount_opts.clone(),
            detached: a.detached,
            tag: String::new(),
            recover: false,
            ha: Vec::new(),
        };
        return serve(&plan);
    }
    detach(&a.data, "", None)
}

/// The names in a folder.
fn entries(dir: &Path) -> std::collections::BTreeSet<std::ffi::OsString> {
    std::fs::read_dir(dir).map(|d| d.filter_map(|e| Some(e.ok()?.file_name())).collect()).unwrap_or_default()
}

/// Make the mount point `m` if it is missing; refuse one that is not a directory.
fn mount_point(m: &Path) -> CliResult {
    match std::fs::metadata(m) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(format!("mount point {} is not a directory", m.display()).into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(m).map_err(|e| format!("making mount point {}: {e}", m.display()))?;
            println!("made the mount point {}", m.display());
            Ok(())
        }
        // A dead FUSE mount (its process killed) answers ENOTCONN: `serve` takes it off.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(()),
        Err(e) => Err(format!("mount point {}: {e}", m.display()).into()),
    }
}

/// Start the process that serves (`args`, or this command again) in the background,
/// logging to its log file in `data`; return once it is ready.
fn detach(data: &Path, tag: &str, args: Option<Vec<String>>) -> CliResult {
    // Fail here, not in the child, when it is already up.
    drop(take_lock(data, tag)?);
    crate::service::detach(args, "ready", Some(&proc_file(data, tag, "log")))
}

/// Take a dead mount (its process was killed) off `path`.
fn clear_stale_mount(path: &Path) {
    if crate::fsys::is_mounted(path) && std::fs::metadata(path).is_err() {
        let _ = crate::fsys::unmount(path, true);
    }
}

/// What one serving process serves: targets kept in `data` (`mgs/`, `mdtN/`, `ostN/`).
struct Plan {
    fsname: String,
    data: PathBuf,
    /// Where the MGS listens, and whether this process serves it.
    mgs: NidList,
    mgs_here: bool,
    /// The file system's targets as the cluster file places them (see
    /// `ClusterFile::known`).
    known: Vec<nacre_proto::mgs::TargetEntry>,
    /// The address this process's services listen on.
    host: String,
    /// Where each target served here listens, by service name (`mdt0`, `ost3`), when the
    /// node has fixed ports; else on any free port of `host`.
    fixed: Vec<(String, Listen)>,
    mdts: Vec<u32>,
    osts: Vec<u32>,
    /// OSTs of the whole file system: the MDTs here wait for objects on all of them.
    total_osts: usize,
    mount: Option<PathBuf>,
    mount_opts: crate::fsys::MountOpts,
    detached: bool,
    /// Names this process's files in `data` (see [`proc_file`]).
    tag: String,
    /// The MDTs here wait for their clients from before a restart to replay (a node of a
    /// cluster); else they forget them (`nacre up`: the whole file system restarts, and
    /// its own mount is new).
    recover: bool,
    /// Targets on drives shared with a failover partner: served under a lease, by a
    /// monitor each (node `tag`).
    ha: Vec<crate::ha::Duty>,
}

/// How long a serving process waits for the MGS to take its targets' registrations.
const WAIT_MGS: Registration = Registration::Wait(Duration::from_secs(300));

/// Serve `p` until SIGTERM or Ctrl-C; the caller holds the data folder's lock.
fn serve(p: &Plan) -> CliResult {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let data = p.data.clone();
    // The node's network: one set of fault rules for every service it serves.
    let net = Arc::new(nacre_net::fault::FaultInjector::fresh());
    let ha = crate::ha::Node::new(&p.tag, p.mgs.clone(), &p.fsname, p.known.clone(), net.clone());
    let result: CliResult = rt.block_on(async {
        let mgs = if p.mgs_here {
            MgsAt::Here(Arc::new(crate::mgs::open(&data.join("mgs"))?))
        } else {
            MgsAt::Remote { nids: p.mgs.clone(), fsname: p.fsname.clone(), known: p.known.clone() }
        };
        let mut mdts = Vec::new();
        for &i in &p.mdts {
            mdts.push(Arc::new(crate::mdt::open(&data.join(format!("mdt{i}")), &format!("mdt{i}"))?));
        }
        let mut osts = Vec::new();
        for &i in &p.osts {
            osts.push((i, Arc::new(crate::ost::open(&data.join(format!("ost{i}")), &format!("ost{i}"))?)));
        }
        let (host, m, fixed) = (p.host.clone(), p.mgs.first().clone(), p.fixed.clone());
        let listen = move |name: &str| -> Listen {
            if name == "mgs" {
                return m.clone().into();
            }
            match fixed.iter().find(|(n, _)| n == name) {
                Some((_, at)) => at.clone(),
                None => format!("{host}@tcp:0").parse::<Nid>().unwrap_or_else(|_| m.clone()).into(),
            }
        };
        if !p.mgs_here {
            println!("registering with the MGS at {}", p.mgs);
        }
        // Other processes and machines reach these services over TCP; this process's own
        // mount and the targets among themselves go through memory.
        let with = ServeWith { gate: None, faults: Some(net), node_param: None };
        let local = Local::start(Arc::new(Shortcut), listen, mgs, mdts, osts, WAIT_MGS, p.recover, with).await?;
        if !local.wait_ready(p.total_osts, Duration::from_secs(300)).await {
            return Err(format!("the MDTs here got no objects from the {} OSTs within 300 s", p.total_osts).into());
        }
        // Shared targets: this node's own are tried before it says it is ready; a partner
        // serving one is not an error (this node stands by for it).
        let mut standby = Vec::new();
        let mut taken = Vec::new();
        let mut monitors = Vec::new();
        for duty in &p.ha {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let drives = duty.lease_drives()?;
            monitors.push(tokio::spawn(ha.clone().monitor(duty.clone(), drives, p.total_osts, Some(tx))));
            if duty.primary {
                taken.push((duty.label(), rx));
            } else {
                standby.push(duty.label());
            }
        }
        let mut served_ha = Vec::new();
        for (label, rx) in taken {
            match rx.await {
                Ok(Ok(())) => served_ha.push(label),
                Ok(Err(why)) => standby.push(format!("{label} ({why})")),
                Err(_) => standby.push(label),
            }
        }
        std::fs::write(proc_file(&data, &p.tag, "pid"), format!("{}\n", std::process::id()))?;
        let mounted = match &p.mount {
            Some(mnt) => {
                clear_stale_mount(mnt);
                Some(crate::fsys::mount_here(local.mgs(), mnt, &p.mount_opts).await?)
            }
            None => None,
        };
        let what: Vec<String> = p
            .mgs_here
            .then(|| "MGS".to_string())
            .into_iter()
            .chain(p.mdts.iter().map(|i| format!("MDT{i}")))
            .chain(p.osts.iter().map(|i| format!("OST{i}")))
            .chain(served_ha)
            .collect();
        let what = if what.is_empty() { vec!["no target".to_string()] } else { what };
        let standby =
            if standby.is_empty() { String::new() } else { format!(", standing by for {}", standby.join(", ")) };
        println!(
            "ready: file system {} ({}) served{standby}, MGS at {}{}",
            p.fsname,
            what.join(" "),
            local.mgs(),
            p.mount.as_ref().map(|m| format!(", mounted on {}", m.display())).unwrap_or_default()
        );
        let _ = std::io::stdout().flush();
        notify_ready();
        if p.detached {
            // The parent has what it waited for; stdout is gone with it.
            if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
                // SAFETY: dup2 of /dev/null over stdout, our own descriptor.
                unsafe { libc::dup2(null.as_raw_fd(), 1) };
            }
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        eprintln!("stopping");
        if let (Some(m), Some(mnt)) = (mounted, &p.mount) {
            // Files still open are written back by their closes; then the kernel lets go.
            if let Err(e) = m.unmount().await {
                eprintln!("unmounting {}: {e}", mnt.display());
                let _ = crate::fsys::unmount(mnt, true);
            }
        }
        // Targets taken under a lease first: their MDTs' links to the targets below go
        // cleanly while those still serve.
        ha.stop(monitors, Duration::from_secs(30)).await;
        local.stop().await;
        Ok(())
    });
    // Targets close (redb makes its commits durable) as the runtime's tasks drop; then
    // the leases they were written under are released.
    drop(rt);
    ha.release();
    let _ = std::fs::remove_file(proc_file(&p.data, &p.tag, "pid"));
    result
}

/// Tell systemd the service is ready (`Type=notify` units), when it started us: a
/// `READY=1` datagram to `$NOTIFY_SOCKET` (sd_notify(3)'s protocol).
fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        // An abstract socket: its name follows the '@'.
        Some(name) => <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name)
            .and_then(|addr| sock.send_to_addr(b"READY=1", &addr)),
        None => sock.send_to(b"READY=1", Path::new(&path)),
    };
    if let Err(e) = sent {
        eprintln!("telling systemd we are ready ({}): {e}", path.to_string_lossy());
    }
}

/// A file system spread over machines: which node serves what (`nacre server --config`).
///
/// ```toml
/// fsname = "nacre"
/// mgs = "10.0.0.1@tcp:9400"       # the MGS's NID; the node with `mgs = true` serves it
///                                 # (a failover pair's: "NID,NID", see below)
///
/// [[node]]
/// name = "meta1"
/// host = "10.0.0.1"               # its services listen here
/// data = "/srv/nacre"             # its targets' drive files
/// mgs = true
/// mdts = [0]
///
/// [[node]]
/// name = "oss1"
/// host = "10.0.0.2"
/// port = 9410                     # its targets' first TCP port (default: any free ones)
/// data = "/srv/nacre"
/// osts = [0, 1]
/// ost_size = "4G"                 # made at the first start, as `nacre up`'s options
///
/// [[node]]
/// name = "oss2"                   # oss1's failover partner: it sees the same drives
/// host = "10.0.0.3"
/// port = 9410
/// data = "/srv/nacre"
/// osts = [2]
/// failover_osts = [0, 1]          # served here when oss1's lease on them expires
/// ```
///
/// A target with a failover node is served under a lease on its drives (see `ha`): its
/// nodes open the drives shared, and only the lease's holder writes. The MGS too: a node
/// with `failover_mgs = true` stands by for it, and `mgs` then lists one NID per MGS
/// node, the `mgs = true` node's first, then the failover nodes' in the file's order.
///
/// A node with a `port` serves each target of the file system it may serve at a port of
/// its own: MDT `i` at `port + i`, OST `i` at `port + MDTs + i`. A target whose nodes all
/// have ports is registered with the MGS with all their NIDs at once, so that its
/// clients know where it may go before it first moves (and find it there when the MGS
/// is down); without, a failover node's NID is known once it first serves the target.
#[derive(serde::Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    fsname: String,
    mgs: String,
    node: Vec<NodeFile>,
}

#[derive(serde::Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    name: String,
    host: String,
    /// The first TCP port of its targets (see [`ClusterFile`]).
    port: Option<u16>,
    data: PathBuf,
    #[serde(default)]
    mgs: bool,
    /// Stands by for the MGS: serves it when its node's lease on it expires.
    #[serde(default)]
    failover_mgs: bool,
    #[serde(default)]
    mdts: Vec<u32>,
    #[serde(default)]
    osts: Vec<u32>,
    /// Other nodes' targets this node takes over when their lease expires.
    #[serde(default)]
    failover_mdts: Vec<u32>,
    #[serde(default)]
    failover_osts: Vec<u32>,
    ost_size: Option<String>,
    mdt_size: Option<String>,
    ost_index_size: Option<String>,
    ost_drives: Option<usize>,
    /// The file system's default layout (`setstripe` options), on the node that makes
    /// MDT 0; default as `nacre up`'s.
    default_layout: Option<String>,
    /// Allocate the drive files' whole size at the first start (default: thin).
    #[serde(default)]
    preallocate: bool,
    mount: Option<PathBuf>,
}

impl ClusterFile {
    /// The MGS's NIDs (checked by [`load_cluster`]).
    fn mgs(&self) -> Result<NidList, String> {
        self.mgs.parse().map_err(|e| format!("mgs = {:?}: {e}", self.mgs))
    }

    /// The nodes that may serve the MGS, in the order of its NIDs: the `mgs = true` one,
    /// then each `failover_mgs = true` one.
    fn mgs_nodes(&self) -> Vec<&NodeFile> {
        let first = self.node.iter().filter(|n| n.mgs);
        first.chain(self.node.iter().filter(|n| n.failover_mgs)).collect()
    }

    /// Where node `n` serves the MGS, and where its other nodes do; `None` if it does not.
    fn mgs_listen(&self, n: &NodeFile) -> Result<Option<Listen>, String> {
        let (nodes, nids) = (self.mgs_nodes(), self.mgs()?);
        let Some(i) = nodes.iter().position(|m| m.name == n.name) else { return Ok(None) };
        let failover = nids.all().iter().enumerate().filter(|&(j, _)| j != i).map(|(_, nid)| nid.clone()).collect();
        Ok(nids.all().get(i).map(|nid| Listen { nid: nid.clone(), failover }))
    }

    /// How many MDTs and OSTs the file system has.
    fn counts(&self) -> (u32, u32) {
        let count = |f: &dyn Fn(&NodeFile) -> usize| self.node.iter().map(f).sum::<usize>() as u32;
        (count(&|n| n.mdts.len()), count(&|n| n.osts.len()))
    }

    /// Where node `n` serves target `index` of `kind`: its fixed port for it, or any free
    /// one.
    fn nid(&self, n: &NodeFile, kind: nacre_proto::mgs::TargetKind, index: u32) -> Result<Nid, String> {
        let port = match (n.port, kind) {
            (None, _) => 0,
            (Some(p), nacre_proto::mgs::TargetKind::Mdt) => u32::from(p) + index,
            (Some(p), nacre_proto::mgs::TargetKind::Ost) => u32::from(p) + self.counts().0 + index,
        };
        format!("{}@tcp:{port}", n.host).parse().map_err(|e| format!("node {}: host {:?}: {e}", n.name, n.host))
    }

    /// Where node `n` listens for target `index` of `kind`, and the NIDs of the target's
    /// other nodes that have fixed ports (its primary first).
    fn listen(&self, n: &NodeFile, kind: nacre_proto::mgs::TargetKind, index: u32) -> Result<Listen, String> {
        let nodes = self.node.iter().filter(|m| m.targets(kind).0.contains(&index));
        let nodes = nodes.chain(self.node.iter().filter(|m| m.targets(kind).1.contains(&index)));
        let mut failover = Vec::new();
        for m in nodes.filter(|m| m.name != n.name && m.port.is_some()) {
            failover.push(self.nid(m, kind, index)?);
        }
        Ok(Listen { nid: self.nid(n, kind, index)?, failover })
    }

    /// Every target whose nodes have fixed ports, at all their NIDs (its primary's
    /// first): what a node knows of the file system without its MGS.
    fn known(&self) -> Vec<nacre_proto::mgs::TargetEntry> {
        use nacre_proto::mgs::TargetKind;
        let mut known = Vec::new();
        for kind in [TargetKind::Mdt, TargetKind::Ost] {
            for primary in self.node.iter().filter(|n| n.port.is_some()) {
                for &index in primary.targets(kind).0 {
                    let Ok(at) = self.listen(primary, kind, index) else { continue };
                    let nids = std::iter::once(at.nid).chain(at.failover).map(|n| n.to_string()).collect();
                    known.push(nacre_proto::mgs::TargetEntry { kind, index, nids });
                }
            }
        }
        known
    }
}

/// `mdt0`, `ost3`: a target's folder in a node's data, and its service's name.
fn short_name(kind: nacre_proto::mgs::TargetKind, index: u32) -> String {
    match kind {
        nacre_proto::mgs::TargetKind::Mdt => format!("mdt{index}"),
        nacre_proto::mgs::TargetKind::Ost => format!("ost{index}"),
    }
}

impl NodeFile {
    /// The targets of `kind` this node serves, and those it stands by for.
    fn targets(&self, kind: nacre_proto::mgs::TargetKind) -> (&[u32], &[u32]) {
        match kind {
            nacre_proto::mgs::TargetKind::Mdt => (&self.mdts, &self.failover_mdts),
            nacre_proto::mgs::TargetKind::Ost => (&self.osts, &self.failover_osts),
        }
    }
}

#[derive(clap::Args)]
pub struct ServerArgs {
    /// The cluster file (TOML): the file system's nodes and what each serves.
    #[arg(long)]
    pub config: PathBuf,
    /// The node of the cluster file this process is.
    #[arg(long)]
    pub node: String,
    #[command(flatten)]
    pub mount_opts: crate::fsys::MountOpts,
    /// Serve in the foreground until stopped, instead of returning once serving.
    #[arg(long)]
    pub foreground: bool,
    #[arg(long, hide = true)]
    pub detached: bool,
}

/// Read and check a cluster file.
fn load_cluster(path: &Path) -> Result<ClusterFile, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let c: ClusterFile = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mgs = c.mgs().map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(problem) = nacre_proto::mgs::fsname_problem(&c.fsname) {
        return Err(format!("{}: fsname: {problem}", path.display()).into());
    }
    let count = |f: &dyn Fn(&NodeFile) -> usize| c.node.iter().map(f).sum::<usize>();
    if count(&|n| usize::from(n.mgs)) != 1 {
        return Err(format!("{}: exactly one node serves the MGS (mgs = true)", path.display()).into());
    }
    if let Some(n) = c.node.iter().find(|n| n.mgs && n.failover_mgs) {
        return Err(format!("{}: node {} serves the MGS and stands by for it too", path.display(), n.name).into());
    }
    let mgs_nodes = c.mgs_nodes();
    if mgs_nodes.len() != mgs.all().len() {
        return Err(format!(
            "{}: mgs = {:?} lists {} NID(s) for {} MGS node(s) ({}): one each, in that order",
            path.display(),
            c.mgs,
            mgs.all().len(),
            mgs_nodes.len(),
            mgs_nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", ")
        )
        .into());
    }
    for (n, nid) in mgs_nodes.iter().zip(mgs.all()) {
        let host: Option<std::net::IpAddr> = n.host.parse().ok();
        if let Nid::Tcp(at) = nid
            && host.is_some_and(|h| h != at.ip())
        {
            return Err(
                format!("{}: the MGS's NID {nid} is not on node {}'s host {}", path.display(), n.name, n.host).into()
            );
        }
    }
    for (what, all) in [
        ("MDT", c.node.iter().flat_map(|n| n.mdts.iter().copied()).collect::<Vec<_>>()),
        ("OST", c.node.iter().flat_map(|n| n.osts.iter().copied()).collect::<Vec<_>>()),
    ] {
        let mut sorted = all.clone();
        sorted.sort_unstable();
        if sorted != (0..all.len() as u32).collect::<Vec<_>>() {
            return Err(format!(
                "{}: the {what}s served are {sorted:?}; each index from 0 up must be served by one node",
                path.display()
            )
            .into());
        }
    }
    // Fixed ports: each node's span (one port per target of the file system) fits, and
    // spans on one address overlap neither each other nor the MGS's port.
    let (mdts, osts) = c.counts();
    let span = mdts + osts;
    let mut spans: Vec<(std::net::IpAddr, u32, u32, String)> = Vec::new();
    for nid in mgs.all() {
        if let Nid::Tcp(at) = nid {
            spans.push((at.ip(), u32::from(at.port()), 1, format!("the MGS's port {}", at.port())));
        }
    }
    for n in &c.node {
        let Some(port) = n.port else { continue };
        let (first, last) = (u32::from(port), u32::from(port) + span.max(1) - 1);
        if port == 0 || last > 65_535 {
            return Err(format!(
                "{}: node {}: port = {port}: the ports of its {span} targets must lie within 1 to 65535",
                path.display(),
                n.name
            )
            .into());
        }
        if let Ok(Nid::Tcp(at)) = c.nid(n, nacre_proto::mgs::TargetKind::Mdt, 0) {
            spans.push((at.ip(), first, last - first + 1, format!("node {}'s ports {first} to {last}", n.name)));
        }
    }
    for (i, a) in spans.iter().enumerate() {
        if let Some(b) = spans[i + 1..].iter().find(|b| a.0 == b.0 && a.1 < b.1 + b.2 && b.1 < a.1 + a.2) {
            return Err(format!("{}: on {}, {} and {} overlap", path.display(), a.0, a.3, b.3).into());
        }
    }
    for n in &c.node {
        c.nid(n, nacre_proto::mgs::TargetKind::Mdt, 0).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let mut names: Vec<&str> = c.node.iter().map(|n| n.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("{}: two nodes have the same name", path.display()).into());
    }
    for n in &c.node {
        for (what, own, failover) in [("MDT", &n.mdts, &n.failover_mdts), ("OST", &n.osts, &n.failover_osts)] {
            let mut all: Vec<u32> = own.iter().chain(failover).copied().collect();
            all.sort_unstable();
            if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
                return Err(format!("{}: node {} lists {what} {} twice", path.display(), n.name, w[0]).into());
            }
            let served = if what == "MDT" {
                c.node.iter().map(|n| n.mdts.len()).sum::<usize>()
            } else {
                c.node.iter().map(|n| n.osts.len()).sum::<usize>()
            };
            if let Some(i) = failover.iter().find(|&&i| i as usize >= served) {
                return Err(format!(
                    "{}: node {} stands by for {what} {i}, which no node serves (a failover target needs its primary)",
                    path.display(),
                    n.name
                )
                .into());
            }
        }
    }
    Ok(c)
}

/// Every target of the cluster file at `path`: its nodes (the primary first) and the
/// folder of its drive files as its primary sees it; and the file system's name and MGS.
pub(crate) fn cluster_targets(
    path: &Path,
) -> Result<(String, NidList, Vec<crate::ha::Spot>), Box<dyn std::error::Error>> {
    use nacre_proto::mgs::TargetKind;
    let c = load_cluster(path)?;
    let mut spots = Vec::new();
    // The MGS, when a failover node stands by for it.
    let mgs_nodes = c.mgs_nodes();
    if let [primary, _, ..] = mgs_nodes[..]
        && let Some(listen) = c.mgs_listen(primary)?
    {
        let nodes = mgs_nodes.iter().map(|n| n.name.clone()).collect();
        let duty = crate::ha::Duty { role: Role::Mgs, index: 0, dir: primary.data.join("mgs"), primary: true, listen };
        spots.push(crate::ha::Spot { nodes, duty });
    }
    for kind in [TargetKind::Mdt, TargetKind::Ost] {
        for primary in &c.node {
            for &index in primary.targets(kind).0 {
                let mut nodes = vec![primary.name.clone()];
                nodes.extend(c.node.iter().filter(|n| n.targets(kind).1.contains(&index)).map(|n| n.name.clone()));
                let duty = crate::ha::Duty {
                    role: Role::of(kind),
                    index,
                    dir: primary.data.join(short_name(kind, index)),
                    primary: true,
                    listen: c.listen(primary, kind, index)?,
                };
                spots.push(crate::ha::Spot { nodes, duty });
            }
        }
    }
    spots.sort_by_key(|s| (s.duty.role, s.duty.index));
    Ok((c.fsname.clone(), c.mgs()?, spots))
}

/// The MGS and the targets `n` serves or stands by for that have a failover node: served
/// under a lease on their drives.
fn duties(c: &ClusterFile, n: &NodeFile) -> Result<Vec<crate::ha::Duty>, String> {
    use nacre_proto::mgs::TargetKind;
    let mut out = Vec::new();
    if c.mgs_nodes().len() > 1
        && let Some(listen) = c.mgs_listen(n)?
    {
        out.push(crate::ha::Duty { role: Role::Mgs, index: 0, dir: n.data.join("mgs"), primary: n.mgs, listen });
    }
    let shared = |kind: TargetKind, i: u32| c.node.iter().any(|m| m.targets(kind).1.contains(&i));
    let duty = |kind: TargetKind, index: u32, primary: bool| -> Result<crate::ha::Duty, String> {
        Ok(crate::ha::Duty {
            role: Role::of(kind),
            index,
            dir: n.data.join(short_name(kind, index)),
            primary,
            listen: c.listen(n, kind, index)?,
        })
    };
    for kind in [TargetKind::Mdt, TargetKind::Ost] {
        let (own, theirs) = n.targets(kind);
        for &i in own.iter().filter(|&&i| shared(kind, i)) {
            out.push(duty(kind, i, true)?);
        }
        for &i in theirs {
            out.push(duty(kind, i, false)?);
        }
    }
    Ok(out)
}

/// `nacre server --config FILE --node NAME`: make this node's targets at the first start,
/// then serve them (registering with the MGS wherever it runs).
pub fn server(a: ServerArgs) -> CliResult {
    let c = load_cluster(&a.config)?;
    let n = c.node.iter().find(|n| n.name == a.node).ok_or_else(|| {
        let names: Vec<&str> = c.node.iter().map(|n| n.name.as_str()).collect();
        format!("{}: no node {:?} (nodes: {})", a.config.display(), a.node, names.join(", "))
    })?;
    std::fs::create_dir_all(&n.data).map_err(|e| format!("{}: {e}", n.data.display()))?;
    let ha = duties(&c, n)?;
    // A partner's targets must be in sight before this node stands by for them.
    for d in ha.iter().filter(|d| !d.primary) {
        d.lease_drives().map_err(|e| format!("node {} cannot stand by for {e} (its primary makes them)", n.name))?;
    }
    if let Some(m) = &n.mount {
        mount_point(m)?;
    }
    if !a.foreground {
        return detach(&n.data, &n.name, None);
    }
    let _lock = take_lock(&n.data, &n.name)?;
    let size = |s: &Option<String>, default: &str| parse_size(s.as_deref().unwrap_or(default));
    let provision = crate::service::ProvisionArg { preallocate: n.preallocate }.provision();
    let index = n.ost_index_size.as_deref().map(parse_size).transpose()?;
    let mut sizes = Sizes::new(
        size(&n.ost_size, "512M")?,
        size(&n.mdt_size, "256M")?,
        index,
        n.ost_drives.unwrap_or(10),
        provision,
    );
    sizes.root_layout = default_layout(n.default_layout.as_deref().unwrap_or(DEFAULT_LAYOUT))?;
    let missing = |kind: &str, ids: &[u32]| -> Vec<u32> {
        ids.iter().copied().filter(|i| !n.data.join(format!("{kind}{i}")).exists()).collect()
    };
    sizes.check_host(
        &n.data,
        n.mgs && !n.data.join("mgs").exists(),
        &missing("mdt", &n.mdts),
        &missing("ost", &n.osts),
    )?;
    make_targets(&n.data, &c.fsname, n.mgs, &n.mdts, &n.osts, &sizes, true)?;
    let unshared = |kind, ids: &[u32]| -> Vec<u32> {
        ids.iter().copied().filter(|&i| !ha.iter().any(|d| d.role == Role::of(kind) && d.index == i)).collect()
    };
    let (mdts, osts) =
        (unshared(nacre_proto::mgs::TargetKind::Mdt, &n.mdts), unshared(nacre_proto::mgs::TargetKind::Ost, &n.osts));
    let mut fixed = Vec::new();
    if n.port.is_some() {
        for (kind, ids) in [(nacre_proto::mgs::TargetKind::Mdt, &mdts), (nacre_proto::mgs::TargetKind::Ost, &osts)] {
            for &i in ids {
                fixed.push((short_name(kind, i), c.listen(n, kind, i)?));
            }
        }
    }
    let plan = Plan {
        fsname: c.fsname.clone(),
        data: n.data.clone(),
        mgs: c.mgs()?,
        // Served here unshared; a failover MGS is one of the duties.
        mgs_here: n.mgs && !ha.iter().any(|d| d.role == Role::Mgs),
        known: c.known(),
        host: n.host.clone(),
        fixed,
        mdts,
        osts,
        total_osts: if n.mdts.is_empty() { 0 } else { c.node.iter().map(|n| n.osts.len()).sum() },
        mount: n.mount.clone(),
        mount_opts: a.mount_opts.clone(),
        detached: a.detached,
        tag: n.name.clone(),
        recover: true,
        ha,
    };
    serve(&plan)
}

#[derive(clap::Args)]
pub struct DownArgs {
    #[arg(long, default_value = "nacre-data")]
    pub data: PathBuf,
    /// Seconds to wait for a clean stop before killing.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

/// `nacre down`: stop every process serving from `--data` (`up`'s, or the nodes of a
/// cluster file that keep their targets there), and return once they and their mounts
/// are gone.
pub fn down(a: DownArgs) -> CliResult {
    // A mount served by a process of its own (`up --per-service`) goes first.
    if let Ok(m) = std::fs::read_to_string(a.data.join("nacre.mount")) {
        let mnt = PathBuf::from(m.trim());
        if crate::fsys::is_mounted(&mnt) {
            crate::fsys::unmount(&mnt, false).or_else(|_| crate::fsys::unmount(&mnt, true))?;
        }
        let _ = std::fs::remove_file(a.data.join("nacre.mount"));
    }
    // Every process with a lock file here, the ones holding the MGS last.
    let mut tags: Vec<String> = std::fs::read_dir(&a.data)
        .map_err(|e| format!("{}: {e}", a.data.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| {
            let t = n.strip_prefix("nacre")?.strip_suffix(".lock")?;
            Some(t.strip_prefix('-').unwrap_or(t).to_string())
        })
        .collect();
    tags.sort_by_key(|t| (t == "mgs" || t.is_empty(), t.clone()));
    let mut stopped = 0;
    for tag in tags {
        let pid: Option<i32> =
            std::fs::read_to_string(proc_file(&a.data, &tag, "pid")).ok().and_then(|s| s.trim().parse().ok());
        let Some(pid) = pid.filter(|_| take_lock(&a.data, &tag).is_err()) else { continue };
        // SAFETY: kill(2) with a pid we read; a wrong one fails with ESRCH.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let started = Instant::now();
        while take_lock(&a.data, &tag).is_err() {
            if started.elapsed() > Duration::from_secs(a.timeout) {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                std::thread::sleep(Duration::from_millis(200));
                return Err(format!("process {pid} did not stop within {} s: killed", a.timeout).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        stopped += 1;
    }
    if stopped == 0 {
        println!("nothing is up in {}", a.data.display());
    } else {
        println!(
            "stopped the file system in {} ({stopped} process{})",
            a.data.display(),
            if stopped == 1 { "" } else { "es" }
        );
    }
    Ok(())
}

/// `nacre up --per-service`: the same file system, each target served by a process of its
/// own (a cluster file of one node per service, `DATA/cluster.toml`), and the mount by
/// another. `nacre up --ha`: the MGS, and a failover pair of nodes `a` and `b` (see
/// [`UpArgs::ha`]).
fn up_per_service(a: &UpArgs) -> CliResult {
    let conf = if conf_path(&a.data).exists() {
        Conf::load(&conf_path(&a.data))?
    } else {
        let _lock = take_lock(&a.data, "")?;
        format(a)?
    };
    let host = &conf.host;
    let data = a.data.canonicalize()?;
    // With --ha, node b stands by for the MGS too, at the port after its targets'.
    let slots = conf.mdts + conf.osts;
    let port = |node: u32| u32::from(conf.port) + 1 + node * slots;
    let mut mgs = conf.mgs()?.to_string();
    if a.ha {
        mgs = format!("{mgs},{host}@tcp:{}", port(2));
    }
    let mut toml = format!("fsname = \"{}\"\nmgs = \"{mgs}\"\n", conf.fsname);
    let node = |name: &str, what: &str| {
        format!("\n[[node]]\nname = \"{name}\"\nhost = \"{host}\"\ndata = \"{}\"\n{what}\n", data.display())
    };
    toml += &node("mgs", "mgs = true");
    let mut names = vec!["mgs".to_string()];
    if a.ha {
        let list = |r: std::ops::Range<u32>| r.map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
        let (half, mdts, osts) = (conf.osts.div_ceil(2), conf.mdts, conf.osts);
        // Fixed ports after the MGS's, a's then b's: clients know both NIDs of every
        // target from the start. b first: a's MDTs wait for objects on every OST.
        toml += &node(
            "b",
            &format!(
                "port = {}\nfailover_mgs = true\nosts = [{}]\nfailover_mdts = [{}]\nfailover_osts = [{}]",
                port(1),
                list(half..osts),
                list(0..mdts),
                list(0..half)
            ),
        );
        toml += &node(
            "a",
            &format!(
                "port = {}\nmdts = [{}]\nosts = [{}]\nfailover_osts = [{}]",
                port(0),
                list(0..mdts),
                list(0..half),
                list(half..osts)
            ),
        );
        names.extend(["b".to_string(), "a".to_string()]);
    } else {
        for i in 0..conf.osts {
            toml += &node(&format!("ost{i}"), &format!("osts = [{i}]"));
            names.push(format!("ost{i}"));
        }
        for i in 0..conf.mdts {
            toml += &node(&format!("mdt{i}"), &format!("mdts = [{i}]"));
            names.push(format!("mdt{i}"));
        }
    }
    let cluster = data.join("cluster.toml");
    std::fs::write(&cluster, toml)?;
    for n in &names {
        let args =
            vec!["server".to_string(), "--config".into(), cluster.display().to_string(), "--node".into(), n.clone()];
        detach(&data, n, Some(args))?;
    }
    if let Some(mnt) = &a.mount {
        clear_stale_mount(mnt);
        let out = Command::new(std::env::current_exe()?)
            .args(["mount", "--mgs", &mgs])
            .arg("--log")
            .arg(data.join("nacre-mount.log"))
            .arg(mnt)
            .output()?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string().into());
        }
        std::fs::write(data.join("nacre.mount"), format!("{}\n", mnt.canonicalize()?.display()))?;
        println!("ready: mounted on {}", mnt.display());
    }
    Ok(())
}
