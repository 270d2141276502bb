//! The services' integration tests (MGS, MDS, OSS, DNE, object pools), one binary: each
//! module was a test binary of its own, and building six of them (each with its own copy
//! of the services, the runtime and the client) cost CI more than running them.

mod dne;
mod mds;
mod mds_recovery;
mod mgs;
mod objects;
mod oss;

use std::sync::Arc;

use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, Volume, VolumeOptions};

/// A volume for a test: RAID1 over two memory drives of `drive_bytes`, named after it.
pub fn raid1_volume(name: &str, drive_bytes: u64) -> Arc<Volume> {
    let run = VolumeOptions { threads_per_drive: 1, ..VolumeOptions::default() };
    let devs: Vec<Arc<dyn BlockDevice>> =
        (0..2).map(|i| MemDrive::new(&format!("{name}-{i}"), drive_bytes) as Arc<dyn BlockDevice>).collect();
    let mut o = CreateOptions::new(name, Level::Raid1);
    o.strip_bytes = 64 << 10;
    o.assume_clean = true;
    Arc::new(Volume::create(devs, &o, &run).unwrap())
}

/// An MDT's volume for a test: RAID1 over two 64 MiB memory drives.
pub fn mdt_volume() -> Arc<Volume> {
    raid1_volume("mdt0", 64 << 20)
}
