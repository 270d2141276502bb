//! The file system from a client: `nacre mount` / `umount`, and the layout commands
//! Lustre users know from `lfs` (`setstripe`, `getstripe`, `setdirstripe`,
//! `getdirstripe`, `mkdir -i`, `df`, `find`). The layout commands take a path on a
//! mounted Nacre file system; they find its MGS from the mount table and talk to the
//! servers directly through `nacre-client`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use clap::Args;
use nacre_client::{Attr, Fid, FileSystem, MountOptions, process_creds};
use nacre_net::nid::{Nid, NidList};
use nacre_proto::dne::DirDefault;
use nacre_proto::layout::Layout;
use nacre_proto::mdt::mode;
use nacre_proto::mgs::TargetKind;

use crate::service::CliResult;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A Nacre mount's source in the mount table: this, then its MGS's NID.
const SOURCE_PREFIX: &str = "nacre:";

/// Options of a mount.
#[derive(Args, Clone, Debug, Default)]
pub struct MountOpts {
    /// Let the kernel gather writes in its page cache before sending them.
    #[arg(long)]
    pub writeback_cache: bool,
    /// Requests from root act as nobody (65534).
    #[arg(long)]
    pub root_squash: bool,
    /// Seconds the kernel trusts entries and attributes the MDS gave no lease on (0: it
    /// asks again each time; what is leased is trusted until another mount changes it).
    #[arg(long, default_value_t = 0.0)]
    pub attr_timeout: f64,
    /// Take no leases from the MDS: every entry and attribute is trusted for
    /// `--attr-timeout` only (as NFS's `actimeo`), and no callbacks are heard.
    #[arg(long)]
    pub no_leases: bool,
}

impl MountOpts {
    /// The same options on a command line.
    fn argv(&self) -> Vec<String> {
        let mut v = vec!["--attr-timeout".to_string(), self.attr_timeout.to_string()];
        if self.writeback_cache {
            v.push("--writeback-cache".into());
        }
        if self.root_squash {
            v.push("--root-squash".into());
        }
        if self.no_leases {
            v.push("--no-leases".into());
        }
        v
    }
}

/// A mount served by this process, and its control endpoint (the client tunables, for
/// `nacre get-param` / `set-param`).
pub struct Mounted {
    mount: nacre_fuse::Mount,
    _ctl: nacre_net::server::Server,
    fs: FileSystem,
}

impl Mounted {
    /// Unmount, then leave the servers.
    pub async fn unmount(self) -> std::io::Result<()> {
        self.end(nacre_fuse::Mount::unmount).await
    }

    /// Wait until unmounted from outside, then leave the servers.
    pub async fn join(self) -> std::io::Result<()> {
        self.end(nacre_fuse::Mount::join).await
    }

    /// End the FUSE session as `how` does, then tell every server this mount is gone
    /// (what they kept for it is committed and forgotten, so none of them waits for it
    /// after a restart); servers that do not answer within a few seconds are left as
    /// they are.
    async fn end(self, how: fn(nacre_fuse::Mount) -> std::io::Result<()>) -> std::io::Result<()> {
        let (mount, fs) = (self.mount, self.fs);
        let r = tokio::task::spawn_blocking(move || how(mount)).await.map_err(std::io::Error::other)?;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), fs.unmount()).await;
        r
    }
}

/// Mount the file system of the MGS at `mgs` on `mnt` in this process. The mount's
/// source in the mount table is `nacre:MGS,ctl=NID`, NID its control endpoint (loopback).
pub async fn mount_here(mgs: &NidList, mnt: &Path, o: &MountOpts) -> Res<Mounted> {
    mount_checked(mgs, None, mnt, o, MOUNT_TIMEOUT).await
}

/// The longest a mount waits for its MGS and MDT 0 by default.
pub const MOUNT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// [`mount_here`], refusing a file system not named `fsname` (when given), and giving up
/// after `timeout` if the MGS or MDT 0 does not answer.
async fn mount_checked(
    mgs: &NidList,
    fsname: Option<&str>,
    mnt: &Path,
    o: &MountOpts,
    timeout: std::time::Duration,
) -> Res<Mounted> {
    if !mnt.is_dir() {
        return Err(format!("mount point {} is not a directory", mnt.display()).into());
    }
    // Services of this same process (`nacre up --mount`) are reached in memory.
    let opts = MountOptions { transport: Arc::new(nacre_net::transport::Shortcut), ..MountOptions::default() };
    let fs = tokio::time::timeout(timeout, FileSystem::mount(mgs, opts))
        .await
        .map_err(|_| format!("mounting from {mgs}: no answer within {} s", timeout.as_secs_f64()))?
        .map_err(|e| format!("mounting from {mgs}: {e}"))?;
    if let Some(want) = fsname
        && fs.fsname() != want
    {
        let have = fs.fsname().to_string();
        fs.unmount().await;
        return Err(format!("the MGS at {mgs} serves file system {have:?}, not {want:?}").into());
    }
    let ctl = nacre_net::server::Server::start(
        Arc::new(nacre_net::transport::TcpTransport),
        &"127.0.0.1@tcp:0".parse()?,
        nacre_client::fs::param_handler(fs.clone()),
        nacre_net::server::ServerConfig::default(),
    )
    .await?;
    let cfg = nacre_fuse::MountConfig {
        attr_timeout: std::time::Duration::from_secs_f64(o.attr_timeout.clamp(0.0, 3600.0)),
        writeback_cache: o.writeback_cache,
        root_squash: o.root_squash,
        leases: !o.no_leases,
        source: format!("{SOURCE_PREFIX}{mgs}{CTL_MARK}{}", ctl.nid()),
        ..nacre_fuse::MountConfig::default()
    };
    let (rt, mnt2) = (tokio::runtime::Handle::current(), mnt.to_path_buf());
    let served = fs.clone();
    let m = tokio::task::spawn_blocking(move || nacre_fuse::mount(served, rt, &mnt2, cfg))
        .await?
        .map_err(|e| format!("mounting on {}: {e}", mnt.display()))?;
    Ok(Mounted { mount: m, _ctl: ctl, fs })
}

/// Between the MGS and the control endpoint in a mount's source.
const CTL_MARK: &str = ",ctl=";

/// The mount table: each mount's point, file system type and source.
fn mount_table() -> Res<Vec<(PathBuf, String, String)>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut out = Vec::new();
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else { continue };
        if let (Some(point), Some(fstype), Some(source)) = (fields.get(4), fields.get(dash + 1), fields.get(dash + 2)) {
            out.push((PathBuf::from(unescape(point)), fstype.to_string(), unescape(source)));
        }
    }
    Ok(out)
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `path` is a mount point now.
pub fn is_mounted(path: &Path) -> bool {
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    mount_table().is_ok_and(|t| t.iter().any(|(p, _, _)| *p == canon))
}

/// Every Nacre mount of this machine: (mount point, MGS, control endpoint).
pub fn local_mounts() -> Res<Vec<(PathBuf, NidList, Option<Nid>)>> {
    let mut out = Vec::new();
    for (point, fstype, source) in mount_table()? {
        let Some(source) = source.strip_prefix(SOURCE_PREFIX).filter(|_| fstype.starts_with("fuse")) else {
            continue;
        };
        let (mgs, ctl) = match source.split_once(CTL_MARK) {
            Some((m, c)) => (m, c.parse().ok()),
            None => (source, None),
        };
        let Ok(mgs) = mgs.parse() else { continue };
        out.push((point, mgs, ctl));
    }
    Ok(out)
}

/// Bytes free to users on the file system holding `path` (its nearest existing folder).
pub fn host_free(path: &Path) -> std::io::Result<u64> {
    let mut at = path;
    while !at.exists() {
        at = at.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    }
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes())?;
    // SAFETY: statvfs is plain old data, for which all zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs with a valid C string and a struct of ours to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// The files under `dir`: (bytes of their sizes, bytes of host space they take).
pub fn tree_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut size, mut taken) = (0, 0);
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => todo.push(e.path()),
                Ok(m) => {
                    size += m.len();
                    taken += m.blocks() * 512;
                }
                Err(_) => {}
            }
        }
    }
    (size, taken)
}

/// Unmount `mnt` (lazily with `lazy`: a dead mount whose process is gone).
pub fn unmount(mnt: &Path, lazy: bool) -> Res<()> {
    let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: umount2 with a valid C string.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    // Not root: the setuid helper can.
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    match cmd.arg(mnt).status() {
        Ok(s) if s.success() => Ok(()),
        _ => Err(format!("unmounting {}: {err}", mnt.display()).into()),
    }
}

#[derive(Args)]
pub struct MountArgs {
    /// The MGS, e.g. 10.0.0.5@tcp:9400; a failover pair's NIDs separated by commas
    /// (10.0.0.5@tcp:9400,10.0.0.6@tcp:9400), tried in turn.
    #[arg(long)]
    pub mgs: NidList,
    /// Refuse to mount unless the MGS serves the file system of this name.
    #[arg(long)]
    pub fsname: Option<String>,
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub opts: MountOpts,
    /// Seconds to wait for the MGS and MDT 0 to answer before giving up.
    #[arg(long, default_value_t = MOUNT_TIMEOUT.as_secs_f64())]
    pub timeout: f64,
    /// Serve the mount in the foreground until it is unmounted.
    #[arg(long)]
    pub foreground: bool,
    /// Where the process serving the mount writes what it says once detached (its
    /// reconnections, evictions, failures); by default nowhere.
    #[arg(long)]
    pub log: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub detached: bool,
}

impl MountArgs {
    /// `nacre mount` with these arguments, for the process that serves the mount.
    fn argv(&self) -> Vec<String> {
        let mut v = vec!["mount".to_string(), "--mgs".into(), self.mgs.to_string()];
        if let Some(f) = &self.fsname {
            v.extend(["--fsname".into(), f.clone()]);
        }
        v.extend(["--timeout".into(), self.timeout.to_string()]);
        v.extend(self.opts.argv());
        v.push(self.mountpoint.display().to_string());
        v
    }
}

/// `nacre mount`: returns once mounted, leaving a process that serves the mount until
/// it is unmounted.
pub fn mount(a: MountArgs) -> CliResult {
    if !(0.0..=3600.0).contains(&a.timeout) {
        return Err(format!("--timeout {}: 0 to 3600 seconds", a.timeout).into());
    }
    let timeout = std::time::Duration::from_secs_f64(a.timeout);
    if !a.detached {
        // Said here, on the terminal, rather than by the process that serves the mount.
        if !a.mountpoint.is_dir() {
            return Err(format!("mount point {} is not a directory", a.mountpoint.display()).into());
        }
        if is_mounted(&a.mountpoint) {
            return Err(format!("{} is already a mount point", a.mountpoint.display()).into());
        }
    }
    if !a.foreground {
        return crate::service::detach(Some(a.argv()), "mounted", a.log.as_deref());
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let m = mount_checked(&a.mgs, a.fsname.as_deref(), &a.mountpoint, &a.opts, timeout).await?;
        println!("mounted {} on {}", a.mgs, a.mountpoint.display());
        if a.detached {
            silence_stdio();
        }
        m.join().await?;
        Ok(())
    })
}

/// `mount.nacre SOURCE DIR [-sfnv] [-o OPTIONS]`, as mount(8) runs it for `mount -t nacre`
/// and fstab lines of type `nacre`. SOURCE is `MGS_NID:/FSNAME`
/// (`10.0.0.1@tcp:9400:/nacre`); OPTIONS are mount(8)'s generic ones (taken as given:
/// Nacre mounts are read-write, `_netdev` and `nofail` are for the boot's ordering) and
/// Nacre's: `writeback_cache`, `root_squash`, `noleases`, `attr_timeout=SECONDS`,
/// `timeout=SECONDS`.
pub fn mount_helper(args: Vec<String>) -> CliResult {
    const USAGE: &str = "usage: mount.nacre MGS_NID:/FSNAME DIR [-sfnv] [-o OPTIONS]";
    let (mut positional, mut options, mut fake) = (Vec::new(), Vec::new(), false);
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.push(it.next().ok_or("-o without options")?),
            // mount(8) passes the type with -t for type.subtype; ours is plain `nacre`.
            "-t" => drop(it.next()),
            o if o.starts_with("-o") => options.push(o[2..].to_string()),
            f if f.starts_with('-') && f.len() > 1 => {
                for c in f[1..].chars() {
                    match c {
                        'f' => fake = true,
                        's' | 'n' | 'v' => {}
                        _ => return Err(format!("unknown flag -{c}; {USAGE}").into()),
                    }
                }
            }
            _ => positional.push(a),
        }
    }
    let [source, dir] = <[String; 2]>::try_from(positional).map_err(|_| USAGE.to_string())?;
    let (mgs, fsname) = parse_source(&source)?;
    let mut opts = MountOpts { attr_timeout: 0.0, ..MountOpts::default() };
    let mut timeout = MOUNT_TIMEOUT.as_secs_f64();
    for o in options.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()) {
        let (key, value) = o.split_once('=').map_or((o, None), |(k, v)| (k, Some(v)));
        let seconds = |v: Option<&str>| -> Res<f64> {
            v.and_then(|v| v.parse::<f64>().ok())
                .filter(|s| (0.0..=3600.0).contains(s))
                .ok_or_else(|| format!("option {o}: a number of seconds, 0 to 3600").into())
        };
        match key {
            "writeback_cache" => opts.writeback_cache = true,
            "root_squash" => opts.root_squash = true,
            "noleases" => opts.no_leases = true,
            "attr_timeout" => opts.attr_timeout = seconds(value)?,
            "timeout" => timeout = seconds(value)?,
            "ro" => return Err("option ro: Nacre mounts are read-write".into()),
            "defaults" | "rw" | "auto" | "noauto" | "user" | "nouser" | "users" | "owner" | "nofail" | "_netdev"
            | "dev" | "nodev" | "suid" | "nosuid" | "exec" | "noexec" | "atime" | "noatime" | "relatime" | "async"
            | "loop" => {}
            k if k.starts_with("x-") || k == "comment" => {}
            _ => {
                return Err(format!(
                    "unknown option {o:?} (Nacre's: writeback_cache, root_squash, noleases, attr_timeout=S, timeout=S)"
                )
                .into());
            }
        }
    }
    if fake {
        return Ok(());
    }
    let a = MountArgs {
        mgs,
        fsname: Some(fsname),
        mountpoint: PathBuf::from(dir),
        opts,
        timeout,
        foreground: false,
        log: None,
        detached: false,
    };
    mount(a)
}

/// `MGS_NID[,MGS_NID…]:/FSNAME` (mount(8)'s source for Nacre) as the MGS's NIDs and the
/// file system's name.
pub fn parse_source(source: &str) -> Res<(NidList, String)> {
    let bad = |why: &str| format!("source {source:?}: {why}; expected MGS_NID:/FSNAME, e.g. 10.0.0.1@tcp:9400:/nacre");
    let (nid, fsname) = source.rsplit_once(":/").ok_or_else(|| bad("no :/ before the file system's name"))?;
    let mgs: NidList = nid.parse().map_err(|e| bad(&format!("{e}")))?;
    if let Some(problem) = nacre_proto::mgs::fsname_problem(fsname) {
        return Err(bad(&problem).into());
    }
    Ok((mgs, fsname.to_string()))
}

/// Point stdout and stderr at /dev/null: the process that read them has gone.
fn silence_stdio() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 over our own standard descriptors.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
            libc::dup2(null.as_raw_fd(), 2);
        }
    }
}

/// The Nacre mount holding `path`: its mount point and MGS (the mount's source). Only
/// the parent is resolved through the kernel: a lookup of a name that does not exist yet
/// would leave a negative entry in the mount, hiding for the attribute timeout the file
/// a command is about to make through a client of its own.
pub(crate) fn mount_of(path: &Path) -> Res<(PathBuf, NidList)> {
    let abs = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir()?.join(path) };
    let canon = match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)?.join(name),
        _ => std::fs::canonicalize(&abs)?,
    };
    let best = local_mounts()?
        .into_iter()
        .filter(|(point, _, _)| canon.starts_with(point))
        .max_by_key(|(point, _, _)| point.as_os_str().len());
    let (point, mgs, _) = best.ok_or_else(|| format!("{} is not on a mounted Nacre file system", path.display()))?;
    Ok((point, mgs))
}

/// The path of `path` inside its mount, as `/a/b`.
pub(crate) fn inside(path: &Path, point: &Path) -> Res<String> {
    let abs = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir()?.join(path) };
    // Canonicalize what exists (the last name may not yet).
    let (parent, name) = (abs.parent().unwrap_or(Path::new("/")), abs.file_name());
    let parent = std::fs::canonicalize(parent)?;
    let full = match name {
        Some(n) => parent.join(n),
        None => parent,
    };
    let rel = full.strip_prefix(point).map_err(|_| format!("{} is not under {}", path.display(), point.display()))?;
    Ok(format!("/{}", rel.to_string_lossy()))
}

/// Run `f` with a client of the file system holding `path`, and the path inside it.
fn with_fs<T>(path: &Path, f: impl AsyncFnOnce(FileSystem, String) -> Res<T>) -> Res<T> {
    let (point, mgs) = mount_of(path)?;
    let rel = inside(path, &point)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let fs = FileSystem::mount(&mgs, MountOptions::default()).await?;
        let r = f(fs.clone(), rel).await;
        fs.unmount().await;
        r
    })
}

#[derive(Args)]
pub struct SetstripeArgs {
    /// `lfs setstripe` options (`-c N -S SIZE -i IDX -p POOL -C N -E END -L mdt`), then the
    /// path: a directory gets a default layout, a new name a file with this layout.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub args: Vec<String>,
}

pub fn setstripe(a: SetstripeArgs) -> CliResult {
    let (path, opts) = a.args.split_last().ok_or("setstripe: no path")?;
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let delete = opts == ["-d"];
    let layout = if delete { None } else { Some(Layout::from_lfs_args(&opts).map_err(|e| format!("setstripe: {e}"))?) };
    let path = PathBuf::from(path);
    with_fs(&path, async |fs, rel| {
        let c = process_creds();
        match fs.resolve(&c, &rel).await {
            Ok(a) if mode::is_dir(a.mode) => {
                fs.set_dir_layout(&c, a.fid, layout.as_ref()).await?;
                match &layout {
                    Some(_) => println!("{}: the default layout of new files in this directory", path.display()),
                    None => println!("{}: default layout removed (the file system's applies)", path.display()),
                }
            }
            Ok(_) => {
                return Err(format!(
                    "setstripe: {} exists; a file's layout is set when it is made (use a new name)",
                    path.display()
                )
                .into());
            }
            Err(e) if e.errno == nacre_client::error::errno::ENOENT => {
                let (dir, name) = fs.parent_of(&c, &rel).await?;
                let layout = layout.ok_or("setstripe -d: no such directory")?;
                fs.create(&c, dir.fid, name, 0o644, Some(&layout)).await?;
                // As `lfs setstripe` on a new name; said, since a directory default may
                // have been meant.
                println!(
                    "{}: made an empty file with this layout (for a directory default, make the directory first)",
                    path.display()
                );
            }
            Err(e) => return Err(e.into()),
        }
        Ok(())
    })
}

#[derive(Args)]
pub struct PathArg {
    pub path: PathBuf,
}

pub fn getstripe(a: PathArg) -> CliResult {
    with_fs(&a.path, async |fs, rel| {
        let c = process_creds();
        let at = fs.resolve(&c, &rel).await?;
        println!("{}", a.path.display());
        match fs.getlayout(&c, at.fid).await? {
            None if mode::is_dir(at.mode) => {
                println!("stripe_count:  1 stripe_size:   1048576 stripe_offset: -1 (the file system default)")
            }
            None => println!("(no layout)"),
            Some(l) => {
                print!("{}", l.layout);
                for (i, c) in l.layout.components.iter().enumerate() {
                    let objs = l.objects.get(i).map(Vec::as_slice).unwrap_or_default();
                    if objs.is_empty() {
                        if matches!(c.kind, nacre_proto::layout::Kind::Stripes(_)) {
                            // As Lustre's PFL components without `lcme_flags: init`.
                            println!(
                                "component {}: no objects yet (the first write that reaches it gives them)",
                                i + 1
                            );
                        }
                        continue;
                    }
                    println!("component {}:\n\tobdidx\t\t objid\t\t objid\t\t group", i + 1);
                    for &(ost, oid) in objs {
                        println!("\t{ost:6}\t{:14}\t{:#14x}\t{:#8x}", oid & ((1 << 48) - 1), oid, oid >> 48);
                    }
                }
            }
        }
        Ok(())
    })
}

#[derive(Args)]
pub struct SetdirstripeArgs {
    /// MDTs to stripe over (-1: all).
    #[arg(short = 'c', long = "mdt-count", default_value_t = 1, allow_hyphen_values = true)]
    pub count: i32,
    /// The MDT of the first stripe (-1: the file system chooses).
    #[arg(short = 'i', long = "mdt-index", default_value_t = -1, allow_hyphen_values = true)]
    pub index: i32,
    /// Set the default of new subdirectories of an existing directory instead.
    #[arg(short = 'D', long = "default")]
    pub default: bool,
    /// Levels the default passes down (-1: without end).
    #[arg(long, default_value_t = 3, allow_hyphen_values = true)]
    pub max_inherit: i32,
    /// Levels round-robin placement of new subdirectories lasts.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub max_inherit_rr: i32,
    pub path: PathBuf,
}

pub fn setdirstripe(a: SetdirstripeArgs) -> CliResult {
    let path = a.path.clone();
    with_fs(&path, async |fs, rel| {
        let c = process_creds();
        if a.default {
            let dir = fs.resolve(&c, &rel).await?;
            let d = DirDefault {
                count: a.count,
                offset: a.index,
                max_inherit: a.max_inherit,
                max_inherit_rr: a.max_inherit_rr,
            };
            fs.set_dir_default(&c, dir.fid, Some(&d)).await?;
        } else {
            let (dir, name) = fs.parent_of(&c, &rel).await?;
            fs.mkdir(&c, dir.fid, name, 0o755, a.index, a.count).await?;
        }
        Ok(())
    })
}

pub fn getdirstripe(a: PathArg) -> CliResult {
    with_fs(&a.path, async |fs, rel| {
        let c = process_creds();
        let dir = fs.resolve(&c, &rel).await?;
        let (stripe, default) = fs.getdirstripe(&c, dir.fid).await?;
        match stripe {
            Some(s) => {
                println!(
                    "lmv_stripe_count: {} lmv_stripe_offset: {} lmv_hash_type: fnv_1a_64",
                    s.shards.len(),
                    s.shards.first().and_then(|f| f.mdt()).unwrap_or(0)
                );
                println!("mdtidx\t\t FID[seq:oid:ver]");
                for f in &s.shards {
                    println!("{:6}\t\t {f}", f.mdt().unwrap_or(0));
                }
            }
            None => {
                println!("lmv_stripe_count: 0 lmv_stripe_offset: {} lmv_hash_type: none", dir.fid.mdt().unwrap_or(0))
            }
        }
        if let Some(d) = default {
            println!(
                "default: lmv_stripe_count: {} lmv_stripe_offset: {} lmv_max_inherit: {} lmv_max_inherit_rr: {}",
                d.count, d.offset, d.max_inherit, d.max_inherit_rr
            );
        }
        Ok(())
    })
}

#[derive(Args)]
pub struct MkdirArgs {
    /// The MDT to put it on.
    #[arg(short = 'i', long = "mdt-index", default_value_t = -1, allow_hyphen_values = true)]
    pub index: i32,
    /// MDTs to stripe it over (-1: all).
    #[arg(short = 'c', long = "mdt-count", default_value_t = 0, allow_hyphen_values = true)]
    pub count: i32,
    pub path: PathBuf,
}

pub fn mkdir(a: MkdirArgs) -> CliResult {
    let path = a.path.clone();
    with_fs(&path, async |fs, rel| {
        let c = process_creds();
        let (dir, name) = fs.parent_of(&c, &rel).await?;
        fs.mkdir(&c, dir.fid, name, 0o755, a.index, a.count).await?;
        Ok(())
    })
}

pub fn df(a: PathArg) -> CliResult {
    with_fs(&a.path, async |fs, _| {
        let s = fs.statfs(&process_creds()).await?;
        let (point, _) = mount_of(&a.path)?;
        println!("{:<24}{:>14}{:>14}{:>14}{:>6} Mounted on", "UUID", "1K-blocks", "Used", "Available", "Use%");
        let row = |name: &str, total: u64, used: u64, free: u64, at: String| {
            let pct = if total == 0 { 0 } else { (used * 100).div_ceil(total) };
            println!("{name:<24}{:>14}{:>14}{:>14}{:>5}% {at}", total >> 10, used >> 10, free >> 10, pct);
        };
        for t in &s.targets {
            let kind = if t.kind == TargetKind::Mdt { "MDT" } else { "OST" };
            row(
                &format!("{}_UUID", t.name),
                t.bytes_total,
                t.bytes_used,
                t.bytes_free,
                format!("{}[{kind}:{}]", point.display(), t.index),
            );
        }
        println!();
        let used = s.bytes_total.saturating_sub(s.bytes_free);
        row("filesystem_summary:", s.bytes_total, used, s.bytes_free, point.display().to_string());
        Ok(())
    })
}

#[derive(Args)]
pub struct FindArgs {
    pub path: PathBuf,
    /// Names matching this glob.
    #[arg(long)]
    pub name: Option<String>,
    /// f (file), d (directory) or l (symlink).
    #[arg(long = "type")]
    pub kind: Option<char>,
    /// Size: N, +N (more), -N (less), with k, M, G or T.
    #[arg(long, allow_hyphen_values = true)]
    pub size: Option<String>,
    /// Modified N days ago: N, +N (more), -N (less).
    #[arg(long, allow_hyphen_values = true)]
    pub mtime: Option<String>,
    /// Files with this many stripes in their first striped component.
    #[arg(long)]
    pub stripe_count: Option<usize>,
    /// Files with an object on this OST.
    #[arg(long)]
    pub ost: Option<u32>,
}

/// `+N`, `-N` or `N`: (ordering wanted, N).
fn compare(s: &str, unit: impl Fn(&str) -> Result<u64, String>) -> Res<(std::cmp::Ordering, u64)> {
    let (ord, rest) = match s.as_bytes().first() {
        Some(b'+') => (std::cmp::Ordering::Greater, &s[1..]),
        Some(b'-') => (std::cmp::Ordering::Less, &s[1..]),
        _ => (std::cmp::Ordering::Equal, s),
    };
    Ok((ord, unit(rest)?))
}

pub fn find(a: FindArgs) -> CliResult {
    let size = a.size.as_deref().map(|s| compare(s, crate::size::parse_size)).transpose()?;
    let mtime = a
        .mtime
        .as_deref()
        .map(|s| compare(s, |d| d.parse::<u64>().map_err(|_| format!("--mtime {d}: not a number of days"))))
        .transpose()?;
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
    let root = a.path.clone();
    let needs_layout = a.stripe_count.is_some() || a.ost.is_some();
    with_fs(&root, async |fs, rel| {
        let c = process_creds();
        let start = fs.resolve(&c, &rel).await?;
        let matches = async |path: &str, name: &str, at: &Attr| -> Res<bool> {
            if let Some(g) = &a.name
                && !nacre_net::glob::glob(g, name)
            {
                return Ok(false);
            }
            let k = match at.mode & mode::S_IFMT {
                mode::S_IFDIR => 'd',
                mode::S_IFLNK => 'l',
                _ => 'f',
            };
            if a.kind.is_some_and(|want| want != k) {
                return Ok(false);
            }
            if let Some((ord, n)) = size
                && at.size.cmp(&n) != ord
            {
                return Ok(false);
            }
            if let Some((ord, days)) = mtime {
                let age = ((now - at.mtime_ns).max(0) as u64) / (86_400 * 1_000_000_000);
                if age.cmp(&days) != ord {
                    return Ok(false);
                }
            }
            if needs_layout {
                if k != 'f' {
                    return Ok(false);
                }
                let Some(l) = fs.getlayout(&c, at.fid).await? else { return Ok(false) };
                if let Some(n) = a.stripe_count
                    && l.objects.iter().find(|o| !o.is_empty()).map_or(0, Vec::len) != n
                {
                    return Ok(false);
                }
                if let Some(o) = a.ost
                    && !l.objects.iter().flatten().any(|(x, _)| *x == o)
                {
                    return Ok(false);
                }
            }
            let _ = path;
            Ok(true)
        };
        // Breadth-first; each level's directories are listed concurrently, so the MDTs
        // holding them work in parallel.
        let shown = root.display().to_string();
        if matches(&shown, &shown, &start).await? {
            println!("{shown}");
        }
        let mut level: Vec<(String, Fid)> = if mode::is_dir(start.mode) { vec![(shown, start.fid)] } else { vec![] };
        while !level.is_empty() {
            let mut set = tokio::task::JoinSet::new();
            for (path, dir) in level.drain(..) {
                let (fs, c) = (fs.clone(), c.clone());
                set.spawn(async move {
                    let mut all = Vec::new();
                    let mut cookie = 0;
                    loop {
                        let (entries, eof) = fs.readdir(&c, dir, cookie, 1024).await?;
                        for (e, at) in entries {
                            cookie = e.cookie;
                            all.push((format!("{path}/{}", e.name), e.name, at));
                        }
                        if eof {
                            break;
                        }
                    }
                    Ok::<_, nacre_client::Error>(all)
                });
            }
            let mut next = Vec::new();
            while let Some(r) = set.join_next().await {
                for (path, name, mut at) in r?? {
                    if at.nlink == 0 {
                        // A remote entry: its attributes are on its own MDT.
                        at = fs.getattr(&c, at.fid).await?;
                    }
                    if matches(&path, &name, &at).await? {
                        println!("{path}");
                    }
                    if mode::is_dir(at.mode) {
                        next.push((path, at.fid));
                    }
                }
            }
            level = next;
        }
        Ok(())
    })
}
