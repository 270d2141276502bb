//! What the target commands share: finding a volume's drive files in a folder, and
//! serving a handler over TCP until stopped.

use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nacre_net::nid::Nid;
use nacre_net::server::{Handler, Server, ServerConfig, ServerHandle};
use nacre_net::transport::TcpTransport;
use nacre_raid::{BlockDevice, FileDrive, Volume, VolumeOptions};

pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// Every file in `dir`, in name order, opened as a drive.
pub fn drives_in(dir: &Path) -> Result<Vec<Arc<dyn BlockDevice>>, Box<dyn std::error::Error>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    Ok(paths
        .iter()
        .map(|p| FileDrive::open(p).map(|d| Arc::new(d) as Arc<dyn BlockDevice>))
        .collect::<Result<_, _>>()?)
}

/// The volume `name` assembled from the drive files in `dir`.
pub fn assemble(dir: &Path, name: &str) -> Result<Arc<Volume>, Box<dyn std::error::Error>> {
    Ok(Arc::new(Volume::assemble(drives_in(dir)?, Some(name), &VolumeOptions::default())?.volume))
}

/// Serve `handler` on `listen` until the process is stopped. Once listening, `ready` runs
/// with the server's handle and NID (attach statistics, register with the MGS); then
/// `serving WHAT on NID` is printed, the line scripts and tests wait for.
pub fn serve_forever<F, Fut>(listen: &Nid, handler: Handler, what: &str, ready: F) -> CliResult
where
    F: FnOnce(ServerHandle, Nid) -> Fut,
    Fut: Future<Output = CliResult>,
{
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let server = Server::start(Arc::new(TcpTransport), listen, handler, ServerConfig::default()).await?;
        ready(server.handle(), server.nid()).await?;
        println!("serving {what} on {}", server.nid());
        let _ = std::io::stdout().flush();
        std::future::pending::<()>().await;
        Ok(())
    })
}
