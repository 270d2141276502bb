//! Drives: the block devices a volume is made of.
//!
//! A drive is anything that reads and writes sectors at offsets: a file or a block device
//! opened with O_DIRECT ([`FileDrive`]) or memory with fault injection ([`MemDrive`], for
//! tests that need a drive to fail at a chosen moment). The engine only sees the
//! [`BlockDevice`] trait, so a simulator can supply its own.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};

use crate::error::{RaidError, Result};

/// A device of fixed size that reads and writes whole sectors.
pub trait BlockDevice: Send + Sync + 'static {
    /// Fill `buf` from `offset`. Short reads are errors.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Make every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Where the drive is, for messages (`/dev/nvme0n1`, `drives/d3`, `mem:2`).
    fn path(&self) -> &Path;
    /// Identity of the underlying device or file (device and inode numbers), so that one
    /// drive named by two paths is recognised; `None` where there is no such thing.
    fn identity(&self) -> Option<(u64, u64)> {
        None
    }
}

/// A file or block device opened with O_DIRECT.
pub struct FileDrive {
    file: File,
    path: PathBuf,
    size: u64,
    direct: bool,
    identity: (u64, u64),
}

impl FileDrive {
    /// Open an existing drive, for this process alone. Falls back to buffered IO only
    /// where the file system refuses O_DIRECT (EINVAL), and says so through
    /// [`FileDrive::is_direct`].
    pub fn open(path: &Path) -> Result<FileDrive> {
        FileDrive::open_locked(path, libc::LOCK_EX)
    }

    /// Open an existing drive that a failover partner may open too: who writes is the
    /// lease's business ([`crate::lease`]). Only an exclusive open is refused meanwhile.
    pub fn open_shared(path: &Path) -> Result<FileDrive> {
        FileDrive::open_locked(path, libc::LOCK_SH)
    }

    fn open_locked(path: &Path, how: libc::c_int) -> Result<FileDrive> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(RaidError::MissingDrive { path: path.to_path_buf() });
            }
            Err(e) => return Err(RaidError::io(path, e)),
        };
        if !(meta.is_file() || meta.file_type().is_block_device()) {
            return Err(RaidError::io(
                path,
                io::Error::new(io::ErrorKind::InvalidInput, "not a regular file or block device"),
            ));
        }
        let open = |flags| OpenOptions::new().read(true).write(true).custom_flags(flags).open(path);
        let (file, direct) = match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(0).map_err(|e| RaidError::io(path, e))?, false),
            Err(e) => return Err(RaidError::io(path, e)),
        };
        // One owner per drive: a second process (or a second path to the same drive)
        // writing superblocks and parity behind the first one's back corrupts both.
        // SAFETY: plain syscall on an owned, open descriptor.
        let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), how | libc::LOCK_NB) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(RaidError::DriveBusy { path: path.to_path_buf() });
            }
            return Err(RaidError::io(path, e));
        }
        // Block devices report length 0 in metadata; seeking to the end works for both.
        let size = {
            use std::io::Seek;
            let mut f = &file;
            f.seek(io::SeekFrom::End(0)).map_err(|e| RaidError::io(path, e))?
        };
        use std::os::unix::fs::MetadataExt;
        let identity = (meta.dev(), meta.ino());
        Ok(FileDrive { file, path: path.to_path_buf(), size, direct, identity })
    }

    /// Create a file drive of `size` bytes. `Provision::Thick` allocates its space now, so
    /// that later O_DIRECT writes never allocate and a full host shows at creation;
    /// `Provision::Thin` makes a sparse file that takes host space only as it is written
    /// (the caller checks that the host can hold it all). Either reads as zeros.
    pub fn create_file(path: &Path, size: u64, provision: Provision) -> Result<FileDrive> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| RaidError::io(path, e))?;
        let len = libc::off_t::try_from(size)
            .map_err(|_| RaidError::io(path, io::Error::new(io::ErrorKind::InvalidInput, "size too large")))?;
        // SAFETY: plain syscall on an owned, open descriptor.
        let thick = provision == Provision::Thick
            && unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, len) } == 0;
        if !thick {
            // Thin, or a file system without fallocate: a sparse file still works.
            f.set_len(size).map_err(|e| RaidError::io(path, e))?;
        }
        drop(f);
        FileDrive::open(path)
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

impl BlockDevice for FileDrive {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        debug_assert!(!self.direct || crate::align::is_aligned(buf), "O_DIRECT read with unaligned buffer");
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        debug_assert!(!self.direct || crate::align::is_aligned(buf), "O_DIRECT write with unaligned buffer");
        self.file.write_all_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn identity(&self) -> Option<(u64, u64)> {
        Some(self.identity)
    }
}

/// How a new file drive takes host space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provision {
    /// All of it at creation (`posix_fallocate`).
    Thick,
    /// Only as blocks are written (a sparse file).
    Thin,
}

/// A drive in memory that can be told to fail: now, or after a number of writes.
pub struct MemDrive {
    data: RwLock<Vec<u8>>,
    path: PathBuf,
    failed: AtomicBool,
    /// Writes left before the drive fails; negative means never.
    writes_before_failure: AtomicI64,
}

impl MemDrive {
    pub fn new(name: &str, size: u64) -> Arc<MemDrive> {
        Arc::new(MemDrive {
            data: RwLock::new(vec![0; size as usize]),
            path: PathBuf::from(format!("mem:{name}")),
            failed: AtomicBool::new(false),
            writes_before_failure: AtomicI64::new(-1),
        })
    }

    /// Make every later IO fail with EIO (or work again).
    pub fn set_failed(&self, failed: bool) {
        self.failed.store(failed, Ordering::SeqCst);
    }

    /// Fail after `n` more successful writes.
    pub fn fail_after_writes(&self, n: i64) {
        self.writes_before_failure.store(n, Ordering::SeqCst);
    }

    /// Flip bits at `offset` behind the engine's back (silent corruption, for scrub tests).
    pub fn corrupt(&self, offset: u64, len: usize) {
        let mut d = self.data.write().unwrap_or_else(|e| e.into_inner());
        for b in &mut d[offset as usize..offset as usize + len] {
            *b ^= 0x5a;
        }
    }

    fn check(&self, write: bool) -> io::Result<()> {
        if write {
            let left = self.writes_before_failure.load(Ordering::SeqCst);
            if left == 0 {
                self.failed.store(true, Ordering::SeqCst);
            } else if left > 0 {
                self.writes_before_failure.fetch_sub(1, Ordering::SeqCst);
            }
        }
        if self.failed.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    fn range(&self, offset: u64, len: usize) -> io::Result<std::ops::Range<usize>> {
        let size = self.size();
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "IO beyond the end of the drive"));
        }
        Ok(offset as usize..offset as usize + len)
    }
}

impl BlockDevice for MemDrive {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(false)?;
        let r = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.data.read().unwrap_or_else(|e| e.into_inner())[r]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(true)?;
        let r = self.range(offset, buf.len())?;
        self.data.write().unwrap_or_else(|e| e.into_inner())[r].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.check(false)
    }

    fn size(&self) -> u64 {
        self.data.read().unwrap_or_else(|e| e.into_inner()).len() as u64
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drive_has_one_owner() {
        let p = std::env::temp_dir().join(format!("nacre-flock-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let first = FileDrive::create_file(&p, 1 << 20, Provision::Thick).unwrap();
        assert!(matches!(FileDrive::open(&p), Err(RaidError::DriveBusy { .. })));
        drop(first);
        let again = FileDrive::open(&p).unwrap();
        assert_eq!(again.size(), 1 << 20);
        drop(again);
        // Shared opens (a failover pair) go together, and keep an exclusive one out.
        let (a, b) = (FileDrive::open_shared(&p).unwrap(), FileDrive::open_shared(&p).unwrap());
        assert!(matches!(FileDrive::open(&p), Err(RaidError::DriveBusy { .. })));
        drop((a, b));
        let _ = std::fs::remove_file(&p);
        assert!(matches!(FileDrive::open(&p), Err(RaidError::MissingDrive { .. })));
    }
}
