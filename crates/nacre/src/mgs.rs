//! `nacre mgs …`: the management service of a file system — make one, serve it. Targets
//! served with `--mgs NID` register with it when they start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Subcommand;
use nacre_net::nid::Nid;
use nacre_proto::mgs::TargetKind;
use nacre_raid::{CreateOptions, Level, Provision, Volume, VolumeOptions};
use nacre_server::mgs::Mgs;

/// How a served target joins its file system: the MGS to register with, and the file
/// system's name.
#[derive(clap::Args)]
pub struct JoinArgs {
    /// The MGS to register with once listening (the NID it registers is the one it
    /// listens on: give a reachable address, not 0.0.0.0).
    #[arg(long)]
    pub mgs: Option<Nid>,
    /// The file system it belongs to.
    #[arg(long, default_value = "nacre")]
    pub fsname: String,
}

#[derive(Subcommand)]
pub enum MgsCommand {
    /// Make a new MGS for a file system: two drive files in a RAID1 and an empty
    /// configuration.
    Format {
        #[arg(long)]
        dir: PathBuf,
        /// The file system's name (1 to 16 letters, digits or _).
        #[arg(long, default_value = "nacre")]
        fsname: String,
        #[command(flatten)]
        alloc: crate::service::ProvisionArg,
    },
    /// Serve the MGS until stopped.
    Serve {
        #[arg(long)]
        dir: PathBuf,
        /// Where to listen, e.g. 0.0.0.0@tcp:9300 (port 0: any free one, printed).
        #[arg(long)]
        listen: Nid,
    },
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

pub fn open(dir: &Path) -> Result<Mgs, Box<dyn std::error::Error>> {
    open_as(dir, &crate::service::Access::Exclusive)
}

/// The MGS in `dir`, its drives opened as `access` says (under a lease when a failover
/// node may serve it).
pub fn open_as(dir: &Path, access: &crate::service::Access) -> Result<Mgs, Box<dyn std::error::Error>> {
    Ok(Mgs::open(crate::service::assemble_with(dir, "mgs", access)?)?)
}

/// Bytes of each of the MGS's two drive files.
pub const MGS_DRIVE_BYTES: u64 = 64 << 20;

/// Make a new MGS in `dir` for file system `fsname`: two drive files in a RAID1 and an
/// empty configuration; returns the line that describes it.
pub fn format(dir: &Path, fsname: &str, provision: Provision) -> Result<String, Box<dyn std::error::Error>> {
    let (dir, fsname) = (dir.to_path_buf(), fsname.to_string());
    if dir.exists() && std::fs::read_dir(&dir)?.next().is_some() {
        return Err(format!("{} is not empty: an MGS is there already", dir.display()).into());
    }
    std::fs::create_dir_all(&dir)?;
    let devs = crate::service::new_drives(&dir, "mgs", 2, MGS_DRIVE_BYTES, provision)?;
    let mut o = CreateOptions::new("mgs", Level::Raid1);
    o.strip_bytes = 64 << 10;
    o.assume_clean = true;
    let vol = Volume::create(devs, &o, &VolumeOptions::default())?;
    Mgs::format(Arc::new(vol), &fsname)?;
    Ok(format!("MGS of file system {fsname} in {}", dir.display()))
}

pub fn run(cmd: MgsCommand) -> CliResult {
    match cmd {
        MgsCommand::Format { dir, fsname, alloc } => {
            println!("{}", format(&dir, &fsname, alloc.provision())?);
            Ok(())
        }
        MgsCommand::Serve { dir, listen } => {
            let mgs = Arc::new(open(&dir)?);
            let what = format!("the MGS of {}", mgs.config().fsname);
            let service = nacre_net::server::Service {
                target: Some(nacre_proto::mgs::MGS_NAME.to_string()),
                ..Default::default()
            };
            crate::service::serve_forever(&listen, mgs.handler(), service, &what, |_, _| async { Ok(()) })
        }
    }
}

/// Register a target that now listens on `nid` with the MGS at `mgs`.
pub async fn register(mgs: &Nid, fsname: &str, kind: TargetKind, index: u32, nid: &Nid) -> CliResult {
    let cfg = nacre_net::client::ClientConfig { ping: false, ..Default::default() };
    let client = nacre_net::client::Client::new(Arc::new(nacre_net::transport::TcpTransport), cfg);
    let mgs = nacre_net::nid::NidList::from(mgs);
    Ok(nacre_server::cluster::register_remote(&client, &mgs, fsname, kind, index, std::slice::from_ref(nid)).await?)
}
