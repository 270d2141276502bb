//! `nacre-raid`: Nacre's software RAID engine.
//!
//! Volumes of levels 0, 1, 10, 5, 6, 50, 60 and generic N+M (M ≤ 4) over drives that are
//! files or block devices opened with O_DIRECT. Full-stripe writes compute parity from new
//! data only; partial writes choose read-modify-write or reconstruct-write by the number of
//! reads; a write-intent bitmap closes the write hole; failed drives are reconstructed on
//! read and rebuilt in the background; scrub finds and repairs parity mismatches; every
//! drive carries a superblock so that volumes assemble again without a config file.
//!
//! The layers, bottom up: [`ec`] (Galois-field kernels and the code), [`drive`] (the
//! `BlockDevice` trait, O_DIRECT files, faulty memory drives), [`ioq`] (per-drive IO
//! threads), [`geometry`] (where a byte lives), [`superblock`] and [`wil`] (on-drive
//! metadata), [`volume`] (the IO paths, repair and assembly).

pub mod align;
pub mod drive;
pub mod ec;
pub mod error;
pub mod geometry;
pub mod ioq;
pub mod lease;
pub mod lock;
pub mod superblock;
pub mod volume;
pub mod wil;

pub use drive::{BlockDevice, FileDrive, MemDrive, Provision};
pub use error::{RaidError, Result};
pub use geometry::{Geometry, Level};
pub use lease::{FencedDrive, Held, LeaseError, LeaseOptions};
pub use superblock::SlotState;
pub use volume::{Assembled, CreateOptions, ScrubReport, Stats, Status, Volume, VolumeOptions, VolumeState};
