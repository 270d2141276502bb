//! `nacre-osd`: the object store of an OST, after Lustre's OSD.
//!
//! A [`Target`] keeps objects on two RAID volumes: their bytes on a parity volume (RAID6
//! 8+2 by default) in chunks of one full stripe, and the index — objects, chunk maps, free
//! space — in redb on a mirrored volume (RAID1/10) through [`backend::VolumeBackend`], so
//! small index IO never disturbs large data writes and everything the target owns is on
//! its drives. See [`target`] for the layout, crash consistency and memory bounds.

pub mod backend;
pub mod error;
mod journal;
mod locks;
pub mod object;
pub mod target;
pub mod writeback;

pub use backend::SyncMode;
pub use error::{OsdError, Result};
pub use object::{ObjectAttr, SetAttr};
pub use target::{CheckReport, ScrubReport, StatFs, Target, TargetOptions, TargetStats};
pub use writeback::{WriteBack, WriteBackOptions, WriteBackStats};

/// CRC-32C (Castagnoli), the checksum of every record, header and data block the store
/// writes.
pub(crate) fn crc32c(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b) as u32
}
