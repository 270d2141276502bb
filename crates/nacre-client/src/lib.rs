//! Nacre's client library: mount a file system from its MGS, run every metadata
//! operation against the MDT that owns it, and read and write files through their
//! layouts — split into per-object RPCs of up to `max_pages_per_rpc`, with at most
//! `max_rpcs_in_flight` per OST, write-behind within `max_dirty_mb`, read-ahead within
//! `max_read_ahead_mb`, and CRC-32C checksums when `checksums` is on.
//!
//! ```ignore
//! let fs = FileSystem::mount(&"10.0.0.5@tcp:9000".parse()?, MountOptions::default()).await?;
//! let c = Creds::default();
//! let a = fs.create(&c, Fid::ROOT, "hello", 0o644, None).await?;
//! let f = fs.open(&c, a.fid, OpenFlags::WRITE).await?;
//! f.write(0, b"hello").await?;
//! f.close().await?;
//! ```

mod behind;
mod cache;
pub mod error;
pub mod file;
pub mod fs;
mod leases;
mod locks;
pub mod params;
mod statahead;
pub mod striping;
mod whole;

pub use error::{Error, Result};
pub use file::{File, OpenFlags, Stamp};
pub use fs::{FileSystem, MountOptions, Revoker, StatFs, TargetUsage};
pub use nacre_proto::fid::Fid;
pub use nacre_proto::mdt::lease::Key as LeaseKey;
pub use nacre_proto::mdt::{Attr, Creds, DirEntry, SetAttr};
pub use params::Tunables;
/// How long an attribute fetched ahead may answer a lookup (see `llite.*.statahead_max`).
pub const STATAHEAD_AGE: std::time::Duration = statahead::AGE;
pub use striping::FileLayout;

/// The credentials of this process (its user and group, no supplementary groups): what a
/// tool acting for the user who ran it sends.
pub fn process_creds() -> Creds {
    // SAFETY: getuid/getgid take nothing and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    Creds { uid, gid, groups: Vec::new(), umask: 0 }
}
