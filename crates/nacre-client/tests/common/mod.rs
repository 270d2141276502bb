//! A whole file system in the test's process, on in-memory drives and network.

use std::sync::Arc;
use std::time::Duration;

use nacre_client::{FileSystem, MountOptions};
use nacre_net::nid::Nid;
use nacre_net::transport::MemNetwork;
use nacre_osd::{Target, TargetOptions};
use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, Volume, VolumeOptions};
use nacre_server::cluster::{Local, MgsAt, Registration};
use nacre_server::mdt::{Namespace, NamespaceOptions};
use nacre_server::mgs::Mgs;

fn vol(name: &str, level: Level, n: usize, bytes: u64, strip: u64) -> Arc<Volume> {
    let run = VolumeOptions { threads_per_drive: 1, ..VolumeOptions::default() };
    let devs: Vec<Arc<dyn BlockDevice>> =
        (0..n).map(|i| MemDrive::new(&format!("{name}{i}"), bytes) as Arc<dyn BlockDevice>).collect();
    let mut o = CreateOptions::new(name, level);
    o.strip_bytes = strip;
    o.assume_clean = true;
    Arc::new(Volume::create(devs, &o, &run).unwrap())
}

pub struct TestFs {
    pub net: MemNetwork,
    pub local: Local,
    /// The OSTs, by index (for their counters).
    pub osts: Vec<Arc<Target>>,
}

impl TestFs {
    /// `mdts` MDTs and `osts` OSTs (RAID6 4+2 of 8 MiB drives each).
    pub async fn start(mdts: u32, osts: usize) -> TestFs {
        let net = MemNetwork::new();
        let mgs = Arc::new(Mgs::format(vol("mgs", Level::Raid1, 2, 16 << 20, 64 << 10), "testfs").unwrap());
        let mdts = (0..mdts)
            .map(|i| {
                let v = vol(&format!("mdt{i}-"), Level::Raid10, 4, 48 << 20, 64 << 10);
                Arc::new(Namespace::format(v, i, NamespaceOptions::default()).unwrap())
            })
            .collect();
        let n_osts = osts;
        let osts = (0..osts)
            .map(|i| {
                let data = vol(&format!("d{i}-"), Level::Raid6, 6, 16 << 20, 16 << 10);
                let meta = vol(&format!("m{i}-"), Level::Raid1, 2, 32 << 20, 64 << 10);
                (i as u32, Arc::new(Target::format(data, meta, TargetOptions::default()).unwrap()))
            })
            .collect::<Vec<_>>();
        let targets = osts.iter().map(|(_, t)| t.clone()).collect();
        let t = Arc::new(net.transport("servers"));
        let listen = |name: &str| format!("{name}@mem").parse::<Nid>().unwrap().into();
        let wait = Registration::Wait(Duration::ZERO);
        let local =
            Local::start(t, listen, MgsAt::Here(mgs), mdts, osts, wait, false, Default::default()).await.unwrap();
        assert!(local.wait_ready(n_osts, Duration::from_secs(30)).await, "the MDTs never got objects");
        TestFs { net, local, osts: targets }
    }

    /// Bytes the OSTs have read from their objects so far.
    pub fn ost_read_bytes(&self) -> u64 {
        self.osts.iter().map(|t| t.stats().read_bytes).sum()
    }

    pub async fn mount(&self, name: &str) -> FileSystem {
        let opts = MountOptions { transport: Arc::new(self.net.transport(name)), ..MountOptions::default() };
        FileSystem::mount(self.local.mgs(), opts).await.unwrap()
    }
}

/// Seeded bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
