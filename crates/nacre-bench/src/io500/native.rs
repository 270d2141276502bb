//! The phases on Nacre through `nacre-client`, no kernel in between: each task is a
//! thread that drives the async client with `block_on`. Directories the run makes are
//! remembered by FID, so a create or a stat is one RPC, as the client's own callers do.

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use nacre_client::error::errno;
use nacre_client::{Creds, Fid, File, FileSystem, OpenFlags};
use nacre_proto::dne::DirDefault;
use nacre_proto::layout::Layout;
use nacre_proto::mdt::mode;
use tokio::runtime::Handle as Runtime;

use super::storage::{Entry, Handle, Layouts, Meta, Open, Storage};

/// Entries a readdir call asks for.
const READDIR_BATCH: u32 = 1024;

pub struct Native {
    fs: FileSystem,
    rt: Runtime,
    creds: Creds,
    root: Fid,
    /// Directories by path (relative to the root), as made or looked up.
    dirs: Mutex<HashMap<String, Fid>>,
    /// Whether a create may carry a small file's data (the directory's layout keeps the
    /// first bytes on the MDT); off after the first create told otherwise.
    data_with_create: AtomicBool,
}

fn io_err(what: &str, e: nacre_client::Error) -> io::Error {
    io::Error::new(io::Error::from_raw_os_error(e.errno).kind(), format!("{what}: {e}"))
}

fn meta_of(a: &nacre_client::Attr) -> Meta {
    Meta { is_dir: mode::is_dir(a.mode), size: a.size, mtime_ns: a.mtime_ns }
}

impl Native {
    /// The phases under `root` (a path inside the file system, `/` or `/a/b`), which
    /// must exist. `rt` runs the client's tasks; the phases' threads block on it.
    pub fn new(fs: FileSystem, rt: Runtime, root: &str) -> io::Result<Native> {
        let creds = nacre_client::process_creds();
        let a = rt.block_on(fs.resolve(&creds, root)).map_err(|e| io_err(root, e))?;
        if !mode::is_dir(a.mode) {
            return Err(io::Error::new(io::ErrorKind::NotADirectory, format!("{root} is not a directory")));
        }
        Ok(Native {
            fs,
            rt,
            creds,
            root: a.fid,
            dirs: Mutex::new(HashMap::new()),
            data_with_create: AtomicBool::new(true),
        })
    }

    fn dirs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Fid>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The FID of directory `path`.
    fn dir(&self, path: &str) -> io::Result<Fid> {
        if path.is_empty() {
            return Ok(self.root);
        }
        if let Some(f) = self.dirs().get(path) {
            return Ok(*f);
        }
        let (parent, name) = split(path);
        let p = self.dir(parent)?;
        let a = self.rt.block_on(self.fs.lookup(&self.creds, p, name)).map_err(|e| io_err(path, e))?;
        if !mode::is_dir(a.mode) {
            return Err(io::Error::new(io::ErrorKind::NotADirectory, format!("{path} is not a directory")));
        }
        self.dirs().insert(path.to_string(), a.fid);
        Ok(a.fid)
    }

    /// The parent directory's FID and the last name of `path`.
    fn parent<'p>(&self, path: &'p str) -> io::Result<(Fid, &'p str)> {
        let (parent, name) = split(path);
        Ok((self.dir(parent)?, name))
    }

    fn create_open(&self, path: &str, flags: OpenFlags) -> io::Result<File> {
        let (dir, name) = self.parent(path)?;
        let (_, f) = self
            .rt
            .block_on(self.fs.create_open(&self.creds, dir, name, 0o644, None, flags))
            .map_err(|e| io_err(path, e))?;
        Ok(f)
    }
}

/// (`a/b`, `c`) from `a/b/c`; (``, `c`) from `c`.
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

impl Storage for Native {
    fn api(&self) -> &'static str {
        "native"
    }

    fn mkdir(&self, path: &str) -> io::Result<()> {
        let (dir, name) = self.parent(path)?;
        // -1, 0: where and how the parent's default says (round-robin over MDTs, stripes).
        let a = self.rt.block_on(self.fs.mkdir(&self.creds, dir, name, 0o755, -1, 0)).map_err(|e| io_err(path, e))?;
        self.dirs().insert(path.to_string(), a.fid);
        Ok(())
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        let (dir, name) = self.parent(path)?;
        self.rt.block_on(self.fs.rmdir(&self.creds, dir, name)).map_err(|e| io_err(path, e))?;
        self.dirs().remove(path);
        Ok(())
    }

    fn create_empty(&self, path: &str) -> io::Result<()> {
        let (dir, name) = self.parent(path)?;
        self.rt.block_on(self.fs.create(&self.creds, dir, name, 0o644, None)).map(drop).map_err(|e| io_err(path, e))
    }

    fn create_with(&self, path: &str, data: &[u8]) -> io::Result<()> {
        let (dir, name) = self.parent(path)?;
        if self.data_with_create.load(Ordering::Relaxed) {
            match self.rt.block_on(self.fs.create_with_data(&self.creds, dir, name, 0o644, data)) {
                Ok(_) => return Ok(()),
                // No DoM in this directory's layout: nothing was made; create, then write.
                Err(e) if e.errno == errno::EINVAL => self.data_with_create.store(false, Ordering::Relaxed),
                Err(e) => return Err(io_err(path, e)),
            }
        }
        let f = self.create_open(path, OpenFlags::WRITE)?;
        let r = self.rt.block_on(async {
            f.write(0, data).await?;
            f.close().await
        });
        r.map_err(|e| io_err(path, e))
    }

    fn stat(&self, path: &str) -> io::Result<Meta> {
        let (dir, name) = self.parent(path)?;
        self.rt.block_on(self.fs.lookup(&self.creds, dir, name)).map(|a| meta_of(&a)).map_err(|e| io_err(path, e))
    }

    fn read_file(&self, path: &str, max: usize, buf: &mut Vec<u8>) -> io::Result<()> {
        let (dir, name) = self.parent(path)?;
        // One request opens it and, when it is small and on the MDT, brings its bytes.
        let r = self.rt.block_on(async {
            let f = self.fs.open_at(&self.creds, dir, name, OpenFlags::READ).await?;
            let data = f.read(0, max.min(f.size_hint() as usize)).await;
            let closed = f.close().await;
            let data = data?;
            closed?;
            Ok::<_, nacre_client::Error>(data)
        });
        *buf = r.map_err(|e| io_err(path, e))?;
        Ok(())
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let (dir, name) = self.parent(path)?;
        self.rt.block_on(self.fs.unlink(&self.creds, dir, name)).map_err(|e| io_err(path, e))
    }

    fn list(&self, path: &str, out: &mut Vec<Entry>) -> io::Result<()> {
        let dir = self.dir(path)?;
        let mut cookie = 0;
        loop {
            let (batch, eof) = self
                .rt
                .block_on(self.fs.readdir(&self.creds, dir, cookie, READDIR_BATCH))
                .map_err(|e| io_err(path, e))?;
            for (e, a) in &batch {
                cookie = cookie.max(e.cookie);
                if e.name == "." || e.name == ".." {
                    continue;
                }
                out.push(Entry { name: e.name.clone(), meta: meta_of(a) });
            }
            if eof || batch.is_empty() {
                return Ok(());
            }
        }
    }

    fn open(&self, path: &str, how: Open) -> io::Result<Box<dyn Handle>> {
        let f = match how {
            Open::Write => {
                let (dir, name) = self.parent(path)?;
                match self.rt.block_on(self.fs.open_at(&self.creds, dir, name, OpenFlags::WRITE)) {
                    Err(e) if e.errno == errno::ENOENT => return self.open_new(path),
                    r => r,
                }
            }
            Open::Read => {
                let (dir, name) = self.parent(path)?;
                self.rt.block_on(self.fs.open_at(&self.creds, dir, name, OpenFlags::READ))
            }
        }
        .map_err(|e| io_err(path, e))?;
        Ok(Box::new(NativeFile { f, rt: self.rt.clone(), path: path.to_string() }))
    }

    fn layouts(&self) -> Option<&dyn Layouts> {
        Some(self)
    }
}

impl Native {
    /// A new file open for writing; made by another task meanwhile: opened.
    fn open_new(&self, path: &str) -> io::Result<Box<dyn Handle>> {
        let f = match self.create_open(path, OpenFlags::WRITE) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let (dir, name) = self.parent(path)?;
                self.rt
                    .block_on(self.fs.open_at(&self.creds, dir, name, OpenFlags::WRITE))
                    .map_err(|e| io_err(path, e))?
            }
            Err(e) => return Err(e),
        };
        Ok(Box::new(NativeFile { f, rt: self.rt.clone(), path: path.to_string() }))
    }
}

impl Layouts for Native {
    fn setstripe(&self, dir: &str, args: &[&str]) -> io::Result<()> {
        let layout = Layout::from_lfs_args(args)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("setstripe {}: {e}", args.join(" "))))?;
        let fid = self.dir(dir)?;
        self.rt.block_on(self.fs.set_dir_layout(&self.creds, fid, Some(&layout))).map_err(|e| io_err(dir, e))
    }

    fn set_dir_default(&self, dir: &str, count: i32, index: i32, max_inherit_rr: i32) -> io::Result<()> {
        let fid = self.dir(dir)?;
        let d = DirDefault { count, offset: index, max_inherit: 3, max_inherit_rr };
        self.rt.block_on(self.fs.set_dir_default(&self.creds, fid, Some(&d))).map_err(|e| io_err(dir, e))
    }

    fn ost_count(&self) -> usize {
        self.fs.targets().1.len()
    }
}

struct NativeFile {
    f: File,
    rt: Runtime,
    path: String,
}

impl Handle for NativeFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let n = self.rt.block_on(self.f.write(offset, data)).map_err(|e| io_err(&self.path, e))?;
        if n != data.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("{}: wrote {n} of {} bytes at {offset}", self.path, data.len()),
            ));
        }
        Ok(())
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let data = self.rt.block_on(self.f.read(offset, buf.len())).map_err(|e| io_err(&self.path, e))?;
        if data.len() != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: read {} of {} bytes at {offset}", self.path, data.len(), buf.len()),
            ));
        }
        buf.copy_from_slice(&data);
        Ok(())
    }

    fn close(self: Box<Self>, fsync: bool) -> io::Result<()> {
        let r = self.rt.block_on(async {
            if fsync {
                self.f.fsync().await?;
            }
            self.f.close().await
        });
        r.map_err(|e| io_err(&self.path, e))
    }
}
