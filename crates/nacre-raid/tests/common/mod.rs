//! Shared helpers for the RAID tests: a seeded PRNG, memory drives, volume shortcuts.
#![allow(dead_code)]

use std::sync::Arc;

use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, Volume, VolumeOptions};

/// SplitMix64: tiny, seedable, good enough to drive tests reproducibly.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
}

/// The seed of a randomized test: `NACRE_SEED` if set, else the clock. Always printed.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("NACRE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    eprintln!("{test}: seed {seed} (rerun with NACRE_SEED={seed})");
    seed
}

pub fn mem_drives(prefix: &str, n: usize, size: u64) -> Vec<Arc<MemDrive>> {
    (0..n).map(|i| MemDrive::new(&format!("{prefix}{i}"), size)).collect()
}

pub fn as_devices(d: &[Arc<MemDrive>]) -> Vec<Arc<dyn BlockDevice>> {
    d.iter().map(|x| x.clone() as Arc<dyn BlockDevice>).collect()
}

pub fn small_opts() -> VolumeOptions {
    VolumeOptions { threads_per_drive: 1, wil_clean_interval: std::time::Duration::from_millis(20) }
}

/// A volume over fresh memory drives.
pub fn mem_volume(
    level: Level,
    n: usize,
    group: Option<usize>,
    strip: u64,
    drive_size: u64,
) -> (Volume, Vec<Arc<MemDrive>>) {
    let drives = mem_drives("d", n, drive_size);
    let mut o = CreateOptions::new("t", level);
    o.group_size = group;
    o.strip_bytes = strip;
    o.assume_clean = true;
    o.wil_region_bytes = 4 * strip * n as u64;
    let v = Volume::create(as_devices(&drives), &o, &small_opts()).expect("create volume");
    (v, drives)
}
