//! The one error type of the RAID engine. Every refusal names the thing that is wrong
//! (the drive, the level, the value) so that the CLI can print it as it is.

use std::io;
use std::path::PathBuf;

use crate::geometry::Level;

/// Errors of volume creation, assembly, IO and repair.
#[derive(Debug, thiserror::Error)]
pub enum RaidError {
    #[error("level {level} needs {needed}, got {got} drive(s)")]
    NotEnoughDrives { level: Level, needed: String, got: usize },
    #[error("bad geometry: {0}")]
    BadGeometry(String),
    #[error("strip size {0} bytes is not a power of two between 4 KiB and 1 MiB")]
    BadStripSize(u64),
    #[error("bad volume name {0:?}: use 1 to 63 characters of A-Z a-z 0-9 . _ -")]
    BadName(String),
    #[error("drive {path} does not exist")]
    MissingDrive { path: PathBuf },
    #[error("drive {path}: {source}")]
    DriveIo { path: PathBuf, source: io::Error },
    #[error("drive {path} is in use: another process (or another path in this command) has it open")]
    DriveBusy { path: PathBuf },
    #[error("drive {path} is listed twice")]
    DuplicateDrive { path: PathBuf },
    #[error("drive {path} already belongs to volume '{volume}' (use --force to overwrite it)")]
    DriveInUse { path: PathBuf, volume: String },
    #[error("drives differ in size: {small} is {small_size} bytes, {large} is {large_size} bytes")]
    UnequalDrives { small: PathBuf, small_size: u64, large: PathBuf, large_size: u64 },
    #[error("drive {path} is too small: {size} bytes, at least {needed} needed")]
    DriveTooSmall { path: PathBuf, size: u64, needed: u64 },
    #[error("drive {path} has no Nacre superblock")]
    NoSuperblock { path: PathBuf },
    #[error("drive {path}: superblock is corrupt ({reason})")]
    CorruptSuperblock { path: PathBuf, reason: String },
    #[error("drive {path} belongs to volume '{found}', not '{wanted}'")]
    ForeignDrive { path: PathBuf, found: String, wanted: String },
    #[error("drive {path} is stale: {reason}")]
    StaleDrive { path: PathBuf, reason: String },
    #[error("no volume named '{0}' among the given drives")]
    NoSuchVolume(String),
    #[error("several volumes found ({0}); name the one you want")]
    AmbiguousVolume(String),
    #[error("volume '{volume}' is offline: {reason}")]
    Offline { volume: String, reason: String },
    #[error("IO range {offset}+{len} is outside the volume ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("IO range {offset}+{len} is not {what} (a reconstruction or a repair works on one drive's bytes)")]
    NotOneStrip { offset: u64, len: u64, what: &'static str },
    #[error("drive slot {slot} does not exist (the volume has {count} drives)")]
    NoSuchSlot { slot: usize, count: usize },
    #[error("drive slot {slot} is {state}; {action} needs {needed}")]
    WrongDriveState { slot: usize, state: String, action: &'static str, needed: &'static str },
    #[error("failing drive slot {slot} would take volume '{volume}' offline ({reason})")]
    WouldGoOffline { slot: usize, volume: String, reason: String },
    #[error("a rebuild is already running on volume '{0}'")]
    RebuildRunning(String),
    #[error("{0}")]
    Codec(#[from] crate::ec::CodecError),
}

impl RaidError {
    pub(crate) fn io(path: &std::path::Path, source: io::Error) -> Self {
        RaidError::DriveIo { path: path.to_path_buf(), source }
    }
}

pub type Result<T, E = RaidError> = std::result::Result<T, E>;
