//! `nacre bench mds`'s lock phase as a mount takes locks: through the client library,
//! which keeps what its owners let go of at the MDS under the file's `Locks` lease (see
//! `nacre_client`'s `locks` module). Several mounts, each its own client listening for
//! lease callbacks, of a file system served from this process (an MGS and one MDT over
//! loopback TCP); every mount takes and drops a write lock on a byte of its own of one
//! shared file, against pings from the same mounts just before and just after.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nacre_client::{Creds, Fid, File, FileSystem, MountOptions, OpenFlags};
use nacre_net::nid::Nid;
use nacre_net::transport::TcpTransport;
use nacre_proto::mdt::lock;
use nacre_raid::Level;
use nacre_server::cluster::{Listen, Local, MgsAt, Registration};
use nacre_server::mdt::{Namespace, NamespaceOptions};
use nacre_server::mgs::Mgs;

use crate::mds::{bad, mdt_volume};
use crate::raid::{BenchError, create, make_drives};

/// The file system and its mounts, each with the shared file open.
pub(crate) struct MountedLocks {
    local: Local,
    mounts: Vec<FileSystem>,
    files: Vec<Arc<File>>,
}

/// One round: lock and unlock pairs per second, the pings beside them per second, and
/// lock RPCs the MDS answered per pair.
pub(crate) struct Round {
    pub pairs: f64,
    pub ping_near: f64,
    pub rpcs_per_pair: f64,
}

impl MountedLocks {
    /// Serve the file system from drives in `dir` and mount it `clients` times.
    pub async fn start(dir: &Path, clients: usize) -> Result<MountedLocks, BenchError> {
        std::fs::create_dir_all(dir.join("mgs"))?;
        let mgs_vol = create(&make_drives(&dir.join("mgs"), 2, 16 << 20)?, Level::Raid1, 64 << 10)?;
        let mgs = Arc::new(Mgs::format(Arc::new(mgs_vol), "locks").map_err(bad)?);
        let volume = mdt_volume(&dir.join("mdt0"), 64 << 20)?;
        let ns =
            tokio::task::block_in_place(|| Namespace::format(volume, 0, NamespaceOptions::default())).map_err(bad)?;
        let listen = |_: &str| -> Listen {
            "127.0.0.1@tcp:0".parse::<Nid>().unwrap_or_else(|_| unreachable!("a fixed NID")).into()
        };
        let local = Local::start(
            Arc::new(TcpTransport),
            listen,
            MgsAt::Here(mgs),
            vec![Arc::new(ns)],
            Vec::new(),
            Registration::Wait(Duration::ZERO),
            false,
            Default::default(),
        )
        .await
        .map_err(bad)?;
        let mut mounts = Vec::new();
        for _ in 0..clients.max(1) {
            let opts = MountOptions { transport: Arc::new(TcpTransport), ..MountOptions::default() };
            let fs = FileSystem::mount(local.mgs(), opts).await.map_err(bad)?;
            fs.start_leases(Arc::new(|_| {}));
            mounts.push(fs);
        }
        let c = Creds::default();
        let shared = mounts[0].create(&c, Fid::ROOT, "locks", 0o644, None).await.map_err(bad)?.fid;
        let mut files = Vec::new();
        for fs in &mounts {
            files.push(Arc::new(fs.open(&c, shared, OpenFlags::READ_WRITE).await.map_err(bad)?));
        }
        let m = MountedLocks { local, mounts, files };
        // Until a mount's callback channel is up, its locks are not kept: pairs before
        // the clock starts, until a batch of them asks the MDS nothing (or 10 s).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let before = m.lock_rpcs();
            m.pairs(16).await?;
            if m.lock_rpcs() == before || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(m)
    }

    /// Lock requests the MDS has answered so far.
    fn lock_rpcs(&self) -> u64 {
        let stats = self.local.mdses()[0].get_param("mdt.*.md_stats");
        let count = |name: &str| -> u64 {
            let lines = stats.first().map(|(_, s)| s.as_str()).unwrap_or_default();
            lines.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
        };
        count("lock ") + count("unlock ")
    }

    /// Seconds for every mount `i` to take and drop a write lock on byte `i`, `per`
    /// times in turn.
    async fn pairs(&self, per: u64) -> Result<f64, BenchError> {
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for (i, f) in self.files.iter().enumerate() {
            let f = f.clone();
            set.spawn(async move {
                let (owner, at) = (i as u64 + 1, i as u64);
                for _ in 0..per {
                    f.lock(owner, 0, lock::WRITE, at, at, false).await.map_err(bad)?;
                    f.lock(owner, 0, lock::UNLOCK, at, at, false).await.map_err(bad)?;
                }
                Ok::<(), BenchError>(())
            });
        }
        while let Some(r) = set.join_next().await {
            r.map_err(bad)??;
        }
        Ok(started.elapsed().as_secs_f64())
    }

    /// Pings per second, every mount sending `per` in turn to the MDT.
    async fn pings(&self, per: u64) -> Result<f64, BenchError> {
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for fs in &self.mounts {
            let fs = fs.clone();
            set.spawn(async move {
                for _ in 0..per {
                    fs.ping_mdt(0).await.map_err(bad)?;
                }
                Ok::<(), BenchError>(())
            });
        }
        while let Some(r) = set.join_next().await {
            r.map_err(bad)??;
        }
        Ok((per * self.mounts.len() as u64) as f64 / started.elapsed().as_secs_f64())
    }

    /// One round of `per` pairs per mount, between two bursts of `burst` pings per mount.
    pub async fn round(&self, per: u64, burst: u64) -> Result<Round, BenchError> {
        let before = self.pings(burst).await?;
        let rpcs = self.lock_rpcs();
        let secs = self.pairs(per).await?;
        let rpcs = self.lock_rpcs().saturating_sub(rpcs);
        let after = self.pings(burst).await?;
        let total = (per * self.files.len() as u64) as f64;
        Ok(Round { pairs: total / secs, ping_near: (before + after) / 2.0, rpcs_per_pair: rpcs as f64 / total })
    }

    /// Close the files and unmount, so the servers stop with nothing open.
    pub async fn stop(self) {
        for f in &self.files {
            let _ = f.close().await;
        }
        drop(self.files);
        drop(self.mounts);
        drop(self.local);
    }
}
