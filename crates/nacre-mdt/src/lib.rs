//! `nacre-mdt`: a metadata target, the namespace of one MDT, in memory, with a
//! write-ahead log and an image on a RAID10 volume. The MDS (`nacre-server`) serves it.
//!
//! [`Namespace`] holds inodes, directory entries, symlink targets and xattrs, and enforces
//! the POSIX rules (permission bits, sticky directories, `ENOTEMPTY`, name limits, rename
//! cases). A change is applied in memory and its redo record logged; it returns once on
//! the drives, or (`sync_on_reply` off, for a client's request) once staged, and
//! concurrent changes share each log write (see [`namespace`]). A change may carry a
//! reply key (client, xid): its answer is stored with it, so a resent request gets the
//! first answer back instead of running twice.

pub mod namespace;

pub use namespace::{
    Cred, FirstAnswer, MdError, MdtStatFs, Namespace, NamespaceOptions, Numbered, OpenAnswer, Recaller, RenameMode,
    ReplyKey, SetAttr,
};
