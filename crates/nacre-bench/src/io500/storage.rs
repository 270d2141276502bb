//! What the phases run on: a directory tree reached by paths relative to a root
//! (`a/b/c`). `Posix` is any mounted file system through the kernel (a Nacre mount,
//! ext4, a FUSE passthrough); [`super::native::Native`] is Nacre through `nacre-client`.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

/// What a stat gives the phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub is_dir: bool,
    pub size: u64,
    pub mtime_ns: i64,
}

/// One directory entry with its attributes (readdir plus stat).
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub meta: Meta,
}

/// How a large file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Made if missing, for writing (ior's POSIX backend: `O_CREAT | O_RDWR`).
    Write,
    Read,
}

pub trait Storage: Send + Sync {
    /// What it is, for the report: `posix`, `native`.
    fn api(&self) -> &'static str;
    fn mkdir(&self, path: &str) -> io::Result<()>;
    fn rmdir(&self, path: &str) -> io::Result<()>;
    /// An empty regular file (mdtest's create).
    fn create_empty(&self, path: &str) -> io::Result<()>;
    /// A regular file holding `data` (mdtest's create, write, close).
    fn create_with(&self, path: &str, data: &[u8]) -> io::Result<()>;
    fn stat(&self, path: &str) -> io::Result<Meta>;
    /// Up to `max` bytes from the start of a file into `buf` (cleared first).
    fn read_file(&self, path: &str, max: usize, buf: &mut Vec<u8>) -> io::Result<()>;
    fn unlink(&self, path: &str) -> io::Result<()>;
    /// Every entry of a directory, with its attributes, appended to `out`.
    fn list(&self, path: &str, out: &mut Vec<Entry>) -> io::Result<()>;
    fn open(&self, path: &str, how: Open) -> io::Result<Box<dyn Handle>>;
    /// Layout control, when the storage is Nacre.
    fn layouts(&self) -> Option<&dyn Layouts> {
        None
    }
}

/// An open large file.
pub trait Handle: Send {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Exactly `buf.len()` bytes at `offset`; a short file is an error.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Close, after an fsync when asked (ior's `-e`).
    fn close(self: Box<Self>, fsync: bool) -> io::Result<()>;
}

/// Nacre's layout commands, for the preparation io500.sh does on Lustre.
pub trait Layouts: Send + Sync {
    /// The default layout of a directory, from `lfs setstripe` options.
    fn setstripe(&self, dir: &str, args: &[&str]) -> io::Result<()>;
    /// The default of a directory's new subdirectories (`lfs setdirstripe -D`): stripes
    /// over MDTs (-1 all), first MDT (-1 any), and the levels round-robin placement lasts.
    fn set_dir_default(&self, dir: &str, count: i32, index: i32, max_inherit_rr: i32) -> io::Result<()>;
    fn ost_count(&self) -> usize;
}

/// A path error naming the path.
pub fn at(path: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{path}: {e}"))
}

/// A directory of any mounted file system.
pub struct Posix {
    root: PathBuf,
}

impl Posix {
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Posix> {
        let root = root.into();
        if !std::fs::metadata(&root).map_err(|e| at(&root.to_string_lossy(), e))?.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotADirectory, format!("{} is not a directory", root.display())));
        }
        Ok(Posix { root })
    }

    fn full(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    /// open(2) with `O_CREAT | O_RDWR`, as IOR's and mdtest's POSIX backend do (a FUSE
    /// file system with the kernel's writeback cache, libfuse's passthrough_hp among
    /// them, reads pages through the descriptor a partial-page write came from, and a
    /// write-only one fails that with EBADF).
    fn create(&self, path: &str) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.full(path))
            .map_err(|e| at(path, e))
    }
}

/// close(2), with its error: a file system may report a failed write only there (NFS,
/// Lustre, Nacre's mount with write-behind), and dropping a `File` ignores it.
fn close(f: File) -> io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` is ours alone (taken from the File), closed once.
    if unsafe { libc::close(fd) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn meta_of(m: &std::fs::Metadata) -> Meta {
    Meta { is_dir: m.is_dir(), size: m.len(), mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec() }
}

impl Storage for Posix {
    fn api(&self) -> &'static str {
        "posix"
    }

    fn mkdir(&self, path: &str) -> io::Result<()> {
        std::fs::create_dir(self.full(path)).map_err(|e| at(path, e))
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        std::fs::remove_dir(self.full(path)).map_err(|e| at(path, e))
    }

    fn create_empty(&self, path: &str) -> io::Result<()> {
        let f = self.create(path)?;
        close(f).map_err(|e| at(path, e))
    }

    fn create_with(&self, path: &str, data: &[u8]) -> io::Result<()> {
        let f = self.create(path)?;
        f.write_all_at(data, 0).map_err(|e| at(path, e))?;
        close(f).map_err(|e| at(path, e))
    }

    fn stat(&self, path: &str) -> io::Result<Meta> {
        std::fs::symlink_metadata(self.full(path)).map(|m| meta_of(&m)).map_err(|e| at(path, e))
    }

    fn read_file(&self, path: &str, max: usize, buf: &mut Vec<u8>) -> io::Result<()> {
        buf.clear();
        let f = File::open(self.full(path)).map_err(|e| at(path, e))?;
        f.take(max as u64).read_to_end(buf).map(drop).map_err(|e| at(path, e))
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        std::fs::remove_file(self.full(path)).map_err(|e| at(path, e))
    }

    fn list(&self, path: &str, out: &mut Vec<Entry>) -> io::Result<()> {
        for e in std::fs::read_dir(self.full(path)).map_err(|e| at(path, e))? {
            let e = e.map_err(|e| at(path, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            // lstat of the entry, as find does.
            let m = e.metadata().map_err(|err| at(&format!("{path}/{name}"), err))?;
            out.push(Entry { name, meta: meta_of(&m) });
        }
        Ok(())
    }

    fn open(&self, path: &str, how: Open) -> io::Result<Box<dyn Handle>> {
        let f = match how {
            Open::Write => self.create(path)?,
            Open::Read => File::open(self.full(path)).map_err(|e| at(path, e))?,
        };
        Ok(Box::new(PosixFile { f, path: path.to_string() }))
    }
}

struct PosixFile {
    f: File,
    path: String,
}

impl Handle for PosixFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.f.write_all_at(data, offset).map_err(|e| at(&self.path, e))
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.f.read_exact_at(buf, offset).map_err(|e| at(&format!("{} at {offset}", self.path), e))
    }

    fn close(self: Box<Self>, fsync: bool) -> io::Result<()> {
        if fsync {
            self.f.sync_all().map_err(|e| at(&self.path, e))?;
        }
        close(self.f).map_err(|e| at(&self.path, e))
    }
}

/// POSIX IO through a mount, with layout control through another way in (Nacre's
/// mount: files through FUSE, layouts through the client library).
pub struct WithLayouts<S, L> {
    pub io: S,
    pub layouts: L,
}

impl<S: Storage, L: Layouts> Storage for WithLayouts<S, L> {
    fn api(&self) -> &'static str {
        self.io.api()
    }
    fn mkdir(&self, path: &str) -> io::Result<()> {
        self.io.mkdir(path)
    }
    fn rmdir(&self, path: &str) -> io::Result<()> {
        self.io.rmdir(path)
    }
    fn create_empty(&self, path: &str) -> io::Result<()> {
        self.io.create_empty(path)
    }
    fn create_with(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.io.create_with(path, data)
    }
    fn stat(&self, path: &str) -> io::Result<Meta> {
        self.io.stat(path)
    }
    fn read_file(&self, path: &str, max: usize, buf: &mut Vec<u8>) -> io::Result<()> {
        self.io.read_file(path, max, buf)
    }
    fn unlink(&self, path: &str) -> io::Result<()> {
        self.io.unlink(path)
    }
    fn list(&self, path: &str, out: &mut Vec<Entry>) -> io::Result<()> {
        self.io.list(path, out)
    }
    fn open(&self, path: &str, how: Open) -> io::Result<Box<dyn Handle>> {
        self.io.open(path, how)
    }
    fn layouts(&self) -> Option<&dyn Layouts> {
        Some(&self.layouts)
    }
}
