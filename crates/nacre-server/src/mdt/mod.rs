//! A metadata target: the namespace of one MDT, stored in redb on a RAID10 volume.
//!
//! [`Namespace`] holds inodes, directory entries, symlink targets and xattrs, and enforces
//! the POSIX rules (permission bits, sticky directories, `ENOTEMPTY`, name limits, rename
//! cases). Every change is durable before it returns, and concurrent changes share one
//! transaction (group commit, see [`namespace`]). A change may carry a reply key (client,
//! xid): its answer is stored in the same transaction, so a resent request gets the first
//! answer back instead of running twice.

pub mod log;
pub mod namespace;

pub use namespace::{
    Cred, MdError, MdtStatFs, Namespace, NamespaceOptions, OpenAnswer, RenameMode, ReplyKey, SetAttr, Wait,
};
