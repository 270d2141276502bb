//! What the target commands share: finding a volume's drive files in a folder, and
//! serving a handler over TCP until stopped.

use std::future::Future;
use std::io::{BufRead as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nacre_net::nid::Nid;
use nacre_net::server::{Handler, Server, ServerConfig, ServerHandle, Service};
use nacre_net::transport::TcpTransport;
use nacre_raid::lease::Fence;
use nacre_raid::{BlockDevice, FencedDrive, FileDrive, Provision, Volume, VolumeOptions};

pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// How a serving process opens a target's drives.
#[derive(Clone, Default)]
pub enum Access {
    /// For itself alone (a lock on each drive file).
    #[default]
    Exclusive,
    /// Shared with a failover partner, each write checked against the lease this node
    /// holds on them.
    Fenced(Arc<Fence>),
    /// Shared, for reading their leases only.
    Watch,
}

/// Every file in `dir`, in name order, opened as a drive as `access` says.
pub fn drives_with(dir: &Path, access: &Access) -> Result<Vec<Arc<dyn BlockDevice>>, Box<dyn std::error::Error>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    let open = |p: &PathBuf| match access {
        Access::Exclusive => FileDrive::open(p),
        Access::Fenced(_) | Access::Watch => FileDrive::open_shared(p),
    };
    let drives: Vec<Arc<dyn BlockDevice>> =
        paths.iter().map(|p| open(p).map(|d| Arc::new(d) as Arc<dyn BlockDevice>)).collect::<Result<_, _>>()?;
    Ok(match access {
        Access::Fenced(fence) => FencedDrive::wrap(drives, fence),
        Access::Exclusive | Access::Watch => drives,
    })
}

/// How new drive files take host space (`--preallocate`).
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct ProvisionArg {
    /// Allocate the drive files' whole size on the host now, instead of thin (sparse)
    /// files that take host space as data is written.
    #[arg(long)]
    pub preallocate: bool,
}

impl ProvisionArg {
    pub fn provision(self) -> Provision {
        if self.preallocate { Provision::Thick } else { Provision::Thin }
    }
}

/// `n` new drive files `DIR/PREFIX-00`, `-01`, … of `bytes` each, for a new volume. New
/// files read as zeros, and zeros have zero parity: the volume is made with
/// `assume_clean`, so a thin drive takes host space only where data lands.
pub fn new_drives(
    dir: &Path,
    prefix: &str,
    n: usize,
    bytes: u64,
    provision: Provision,
) -> Result<Vec<Arc<dyn BlockDevice>>, nacre_raid::RaidError> {
    (0..n)
        .map(|i| {
            FileDrive::create_file(&dir.join(format!("{prefix}-{i:02}")), bytes, provision)
                .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
        })
        .collect()
}

/// The volume `name` assembled from the drive files in `dir`, opened as `access` says.
pub fn assemble_with(dir: &Path, name: &str, access: &Access) -> Result<Arc<Volume>, Box<dyn std::error::Error>> {
    Ok(Arc::new(Volume::assemble(drives_with(dir, access)?, Some(name), &VolumeOptions::default())?.volume))
}

/// Serve `handler` on `listen` until the process is stopped. Once listening, `ready` runs
/// with the server's handle and NID (attach statistics, register with the MGS); then
/// `serving WHAT on NID` is printed, the line scripts and tests wait for.
pub fn serve_forever<F, Fut>(listen: &Nid, handler: Handler, service: Service, what: &str, ready: F) -> CliResult
where
    F: FnOnce(ServerHandle, Nid) -> Fut,
    Fut: Future<Output = CliResult>,
{
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let server =
            Server::start_service(Arc::new(TcpTransport), listen, handler, ServerConfig::default(), service).await?;
        ready(server.handle(), server.nid()).await?;
        println!("serving {what} on {}", server.nid());
        let _ = std::io::stdout().flush();
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// Run this command again (or with `args`) plus `--foreground --detached`, as a process of
/// its own session (the shell's hangup or Ctrl-C does not reach it), and return once it
/// prints a line starting with `ready`; the lines before are printed here. Its standard
/// error goes to `log` if given; otherwise to a pipe whose text is the error should the
/// process stop before it is ready.
pub fn detach(args: Option<Vec<String>>, ready: &str, log: Option<&Path>) -> CliResult {
    let mut args: Vec<String> = args.unwrap_or_else(|| std::env::args().skip(1).collect());
    args.push("--foreground".into());
    args.push("--detached".into());
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(&args).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped());
    match log {
        Some(p) => cmd.stderr(std::fs::OpenOptions::new().create(true).append(true).open(p)?),
        None => cmd.stderr(std::process::Stdio::piped()),
    };
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    // What the process logs from here on is this start's: shown if it fails.
    let log_from = log.and_then(|p| std::fs::metadata(p).ok()).map_or(0, |m| m.len());
    let mut child = cmd.spawn()?;
    let out = child.stdout.take().ok_or("no pipe to the new process")?;
    for line in std::io::BufReader::new(out).lines() {
        let line = line?;
        println!("{line}");
        if line.starts_with(ready) {
            return Ok(());
        }
    }
    let out = child.wait_with_output()?;
    Err(match log {
        Some(p) => {
            let said = log_tail(p, log_from, LOG_LINES_SHOWN);
            format!("the process stopped before it was ready ({}); {} says:\n{said}", out.status, p.display())
        }
        // Its own `nacre: ` prefix goes: the caller adds the one it is run as.
        None => {
            let err = String::from_utf8_lossy(&out.stderr);
            err.trim().strip_prefix("nacre: ").unwrap_or(err.trim()).to_string()
        }
    }
    .into())
}

/// Lines of a failed start's log shown on the terminal: the error and what led to it.
const LOG_LINES_SHOWN: usize = 20;

/// The last `n` lines of `path` from byte `from` on, indented; or why there are none.
fn log_tail(path: &Path, from: u64, n: usize) -> String {
    let text = match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(b.get(from as usize..).unwrap_or_default()).into_owned(),
        Err(e) => return format!("  (cannot read it: {e})"),
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return "  (nothing: it was killed before it could say)".into();
    }
    lines[lines.len().saturating_sub(n)..].iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}
