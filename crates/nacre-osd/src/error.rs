//! Errors of the object store, each naming the object, range or limit at fault, and the
//! errno a service answers with.

use std::fmt;

use nacre_raid::RaidError;

#[derive(Debug)]
pub enum OsdError {
    NoSuchObject(u64),
    /// Not enough free space for the write; nothing was changed.
    NoSpace {
        need: u64,
        free: u64,
    },
    /// A range past the maximum object size (or overflowing a u64).
    TooLarge {
        offset: u64,
        len: u64,
        max: u64,
    },
    /// An argument that makes no sense (a batch of 0, a range that ends before it starts).
    Invalid(String),
    /// The volumes do not hold this target, or hold one of another shape.
    NotATarget(String),
    /// The index or the data disagree with themselves (found by a check or a read).
    Corrupt(String),
    /// Bytes read from the data volume do not match their checksum (and no copy that does
    /// could be rebuilt from parity).
    Checksum(String),
    Raid(RaidError),
    Index(String),
}

impl fmt::Display for OsdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OsdError::NoSuchObject(o) => write!(f, "no object {o:#x}"),
            OsdError::NoSpace { need, free } => write!(f, "no space: {need} bytes needed, {free} free"),
            OsdError::TooLarge { offset, len, max } => {
                write!(f, "{len} bytes at {offset} pass the maximum object size {max}")
            }
            OsdError::Invalid(m) => write!(f, "invalid request: {m}"),
            OsdError::NotATarget(m) => write!(f, "not a target: {m}"),
            OsdError::Corrupt(m) => write!(f, "target corrupt: {m}"),
            OsdError::Checksum(m) => write!(f, "data checksum: {m}"),
            OsdError::Raid(e) => write!(f, "volume: {e}"),
            OsdError::Index(m) => write!(f, "index: {m}"),
        }
    }
}

impl std::error::Error for OsdError {}

impl OsdError {
    /// The negative errno a service sends for this error.
    pub fn errno(&self) -> i32 {
        match self {
            OsdError::NoSuchObject(_) => -2,                                      // ENOENT
            OsdError::NoSpace { .. } => -28,                                      // ENOSPC
            OsdError::TooLarge { .. } => -27,                                     // EFBIG
            OsdError::Invalid(_) => -22,                                          // EINVAL
            OsdError::NotATarget(_) => -19,                                       // ENODEV
            OsdError::Corrupt(_) => -117,                                         // EUCLEAN
            OsdError::Checksum(_) | OsdError::Raid(_) | OsdError::Index(_) => -5, // EIO
        }
    }
}

impl From<RaidError> for OsdError {
    fn from(e: RaidError) -> Self {
        OsdError::Raid(e)
    }
}

macro_rules! index_error {
    ($($t:ty),*) => {$(
        impl From<$t> for OsdError {
            fn from(e: $t) -> Self {
                OsdError::Index(e.to_string())
            }
        }
    )*};
}

index_error!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    std::io::Error
);

pub type Result<T> = std::result::Result<T, OsdError>;
