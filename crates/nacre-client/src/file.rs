//! An open file: reads and writes split by its layout into RPCs to its objects (and its
//! MDT, for a DoM component), run in parallel within each OST's `max_rpcs_in_flight`;
//! write-behind within the mount's `max_dirty_mb`; read-ahead on sequential reads within
//! `max_read_ahead_mb`.
//!
//! Consistency is close-to-open: what a handle wrote is on its objects when `fsync` or
//! `close` returns, and the MDT then holds the file's size and mtime; another client that
//! opens the file afterwards sees all of it. While a file is open for writing here, its
//! size comes from its objects (a glimpse).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use bytes::Bytes;
use nacre_proto::fid::Fid;
use nacre_proto::mdt::lease::Key as LeaseKey;
use nacre_proto::mdt::{Attr, Creds, Reply, Request, SetAttr, lock, mode, now_ns, set};
use nacre_proto::ost;

use crate::behind::{self, Rope, Taken};
use crate::cache::{self, Pattern, fetched, spawn_fetch};
use crate::error::{Error, Result, errno};
use crate::fs::{FileSystem, all, lock, mdt_of};
use crate::striping::{FileLayout, Piece, Place};

/// Largest DoM read or write in one RPC (the MDS's `DOM_IO_MAX`).
const DOM_RPC_MAX: u64 = 1 << 20;
/// Largest file an open for reading asks the MDT to send whole with its answer, when all
/// of it is there (DoM read-on-open).
const READ_ON_OPEN_MAX: u32 = 64 << 10;
/// Largest offset a file may reach (`i64::MAX`, as `off_t`).
const FILE_SIZE_MAX: u64 = i64::MAX as u64;
/// What a file opened with no request opened with: its attributes and bytes, and the
/// count of this mount's changes to it (its image's) they stand for. The bytes answer the
/// reads until a change here.
struct Local {
    attr: Attr,
    bytes: Bytes,
    changes: u64,
}

/// Numbers for the files opened with no request.
static LOCAL_HANDLES: AtomicU64 = AtomicU64::new(0);

/// A file's size, mtime and ctime at one moment, as its MDT had them. Every change of a
/// file sets its ctime, so two equal stamps mean no change between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Stamp {
    pub fn of(a: &Attr) -> Stamp {
        Stamp { size: a.size, mtime_ns: a.mtime_ns, ctime_ns: a.ctime_ns }
    }
}

/// How a file is opened: open(2)'s access mode and the flags the client acts on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    /// Every write goes to the end of the file (`O_APPEND`).
    pub append: bool,
    /// Cut the file to nothing at open (`O_TRUNC`).
    pub truncate: bool,
    /// No write-behind or read-ahead: each call goes to the servers (`O_DIRECT`), and a
    /// write returns once it is on the drives.
    pub direct: bool,
    /// Each write returns once it is on the drives (`O_SYNC`, `O_DSYNC`).
    pub sync: bool,
}

impl OpenFlags {
    pub const READ: OpenFlags =
        OpenFlags { read: true, write: false, append: false, truncate: false, direct: false, sync: false };
    pub const WRITE: OpenFlags =
        OpenFlags { read: false, write: true, append: false, truncate: false, direct: false, sync: false };
    pub const READ_WRITE: OpenFlags =
        OpenFlags { read: true, write: true, append: false, truncate: false, direct: false, sync: false };

    /// From open(2) flags (Linux values).
    pub fn from_posix(flags: i32) -> OpenFlags {
        use libc::{O_ACCMODE, O_APPEND, O_DIRECT, O_DSYNC, O_RDWR, O_SYNC, O_TRUNC, O_WRONLY};
        let acc = flags & O_ACCMODE;
        OpenFlags {
            read: acc != O_WRONLY,
            write: acc == O_WRONLY || acc == O_RDWR,
            append: flags & O_APPEND != 0,
            truncate: flags & O_TRUNC != 0,
            direct: flags & O_DIRECT != 0,
            sync: flags & (O_SYNC | O_DSYNC) != 0,
        }
    }
}

/// This handle's access pattern, as Lustre's read-ahead state: reads that follow one
/// another (sequential) or repeat one forward step no longer than a chunk (strided, as
/// ior-hard's tasks read) make a stream. Read-ahead starts on a stream's second read (its
/// first at the start of the file) and its window doubles with each read that goes past
/// the stream's head, up to `max_read_ahead_per_file_mb`; any other read (random,
/// backward, a stride wider than a chunk) ends the stream and fetches what it asked,
/// nothing more. The chunks read ahead are the file's, shared by its handles.
#[derive(Default)]
struct ReadAhead {
    /// Where the last read started, and the furthest end of the stream's reads.
    last: u64,
    next: u64,
    /// The last read's length.
    len: u64,
    /// The step from the start of the read before the last to the last's (0: none).
    step: u64,
    /// Reads in a row that kept the pattern (0: no stream).
    run: u32,
    window: u64,
}

/// Reads in a row a pattern needs before read-ahead starts.
const STREAM_READS: u32 = 2;

impl ReadAhead {
    /// Note a read of `len` bytes at `offset` (chunks of `chunk` bytes); what it continues.
    fn note(&mut self, offset: u64, len: u64, chunk: u64) -> Pattern {
        // The kernel sends a stream's reads several at once, so they may come out of
        // order: once a stream runs, a read that starts within a few reads of its head
        // (or within the window, once reading ahead) continues it. Before, only a read at
        // or a little past the last one's end does: reads going backward are no stream.
        let window = if self.run >= STREAM_READS { self.window } else { 0 };
        let slack = len.max(self.len).saturating_mul(4).max(window);
        let behind = if self.run > 0 { slack } else { 0 };
        let step = offset.wrapping_sub(self.last);
        // A read past the head by the step the last one took (a gap each time).
        let strided = offset > self.next && offset > self.last && step == self.step && step <= chunk;
        let sequential =
            !strided && offset.saturating_add(behind) >= self.next && offset <= self.next.saturating_add(slack);
        self.step = if offset > self.last { step } else { 0 };
        self.last = offset;
        self.len = len;
        let pattern = if sequential {
            Pattern::Sequential
        } else if strided {
            Pattern::Strided
        } else {
            Pattern::Random
        };
        if pattern == Pattern::Random {
            self.run = 0;
            self.window = 0;
            self.next = offset + len;
        } else {
            self.run = self.run.saturating_add(1);
            self.next = self.next.max(offset + len);
        }
        pattern
    }
}

#[derive(Default)]
struct State {
    /// Write-back failures of the file this handle has reported (or that came before it
    /// was opened): a later one is reported by its next write, fsync or close.
    errors_seen: u64,
    /// The file's write-backs that had landed at this handle's last OST sync.
    landed_synced: u64,
    written: bool,
    /// The file is at least this long (its size at open, or after our writes); a read
    /// past it asks the servers.
    size: u64,
    ra: ReadAhead,
}

/// An open file.
pub struct File {
    fs: FileSystem,
    creds: Creds,
    fid: Fid,
    /// Its handle on the MDT, or, for a file opened here from what the mount knows of
    /// it ([`File::known_whole`]), a number of this mount's (which only tells its
    /// read-ahead stream apart from those of the file's other handles).
    handle: u64,
    /// Opened with no request ([`File::known_whole`]).
    local: Option<Local>,
    /// The MDT handle such a file opened when it needed one (to take a lock).
    mds_handle: tokio::sync::OnceCell<u64>,
    flags: OpenFlags,
    /// Sent with the open, or fetched at the first IO; replaced by a later one when a
    /// write gives a component its objects (see [`File::layout`]).
    layout: std::sync::Mutex<Option<Arc<FileLayout>>>,
    st: tokio::sync::Mutex<State>,
    /// The file's read-ahead chunks and write-behind, shared with its other handles on
    /// this mount.
    shared: Arc<cache::Shared>,
    /// `State::size`, readable without the lock (for `stat` while writes are dirty).
    size_hint: AtomicU64,
    /// When the last write through this handle was made (ns since the epoch; 0: none).
    written_at: AtomicI64,
    closed: AtomicBool,
    /// See [`File::opened_as`].
    opened_as: Stamp,
    /// See [`File::closed_as`].
    closed_as: std::sync::OnceLock<Stamp>,
    /// See [`File::closed_whole`].
    closed_whole: std::sync::OnceLock<Bytes>,
}

impl File {
    pub(crate) async fn open(fs: FileSystem, c: &Creds, fid: Fid, flags: OpenFlags) -> Result<File> {
        let mdt = mdt_of(fid)?;
        let r = Request::Open { fid, read: flags.read, write: flags.write, dom_read: read_on_open(&fs, flags) };
        let changes = fs.change_count();
        let (reply, first) = fs.md(mdt, c, &r, &[]).await?;
        let Reply::Opened { handle, attr, layout, objects, .. } = reply else {
            return Err(Error::protocol("open", "the MDS did not answer with a handle"));
        };
        let layout = fs.sent_layout(attr.fid, &layout, objects)?;
        File::answered(fs, c, handle, attr, layout, flags, &first, changes).await
    }

    /// The file an MDT opened as `handle` for an open by FID or by name, with its bytes
    /// if it sent them (DoM read-on-open): a regular file, cut if O_TRUNC asked.
    /// `changes`: [`FileSystem::change_count`] before the open was sent.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn answered(
        fs: FileSystem,
        c: &Creds,
        handle: u64,
        attr: Attr,
        layout: Option<Arc<FileLayout>>,
        flags: OpenFlags,
        first: &[u8],
        changes: u64,
    ) -> Result<File> {
        if !mode::is_reg(attr.mode) {
            let _ = fs.md(mdt_of(attr.fid)?, c, &Request::Close { handle }, &[]).await;
            let errno = if mode::is_dir(attr.mode) { errno::EISDIR } else { errno::EINVAL };
            return Err(Error::new(errno, format!("{} is not a regular file", attr.fid)));
        }
        let f = File::opened(fs, c, handle, attr, layout, flags);
        if flags.write && f.fs.writers_of(f.fid) > 1 {
            // Another handle here may keep the file's append lock, knowing the end.
            f.fs.release_append(f.fid, None).await;
        }
        if flags.truncate && flags.write {
            f.set_len(0).await?;
        } else if !first.is_empty() {
            let bytes = Bytes::copy_from_slice(first);
            // Known whole unless a change of this mount's went out or came back meanwhile
            // (a truncate here may have come after the bytes the MDT read).
            if !flags.write && bytes.len() as u64 == attr.size && f.fs.change_count() == changes {
                f.keep_whole(&attr, &bytes);
            }
            f.prime(bytes);
        }
        Ok(f)
    }

    /// A file opened for reading with no request: `fid` is a small file this mount knows
    /// whole and holds the lease on (see `whole`). The caller checked the permission.
    /// `None`: it must be opened on its MDT.
    pub(crate) fn known_whole(fs: &FileSystem, c: &Creds, fid: Fid, flags: OpenFlags) -> Option<File> {
        if flags.write || flags.truncate || read_on_open(fs, flags) == 0 || fs.writers_of(fid) > 0 {
            return None;
        }
        let w = {
            let _gate = fs.lease_gate();
            if !fs.attr_leased(fid) {
                return None;
            }
            fs.inner.whole.get(fid)?
        };
        let handle = LOCAL_HANDLES.fetch_add(1, Ordering::Relaxed);
        let mut f = File::opened(fs.clone(), c, handle, w.attr, Some(w.layout), flags);
        // Its reads are answered from `local`, not from the file's chunks.
        let changes = lock(&f.shared.image).changes;
        f.local = Some(Local { attr: w.attr, bytes: w.bytes, changes });
        Some(f)
    }

    /// Keep `bytes` as all of the file, `attr` as its MDT has it, if it lives on its MDT
    /// alone and the mount holds the lease on it.
    /// Returns whether it did.
    fn keep_whole(&self, attr: &Attr, bytes: &Bytes) -> bool {
        let Some(layout) = self.known_layout().filter(|l| l.no_objects()) else { return false };
        let _gate = self.fs.lease_gate();
        let leased = self.fs.attr_leased(self.fid);
        if leased {
            let w = crate::whole::Whole { attr: *attr, layout, bytes: bytes.clone() };
            self.fs.inner.whole.keep(w);
        }
        leased
    }

    /// The file's handle on its MDT: for one opened with no request, one opened for
    /// reading now (the first time it is needed).
    async fn mds_handle(&self) -> Result<u64> {
        if self.local.is_none() {
            return Ok(self.handle);
        }
        let open = || async {
            let r = Request::Open { fid: self.fid, read: true, write: false, dom_read: 0 };
            match self.fs.md(mdt_of(self.fid)?, &self.creds, &r, &[]).await?.0 {
                Reply::Opened { handle, .. } => Ok(handle),
                _ => Err(Error::protocol("open", "the MDS did not answer with a handle")),
            }
        };
        self.mds_handle.get_or_try_init(open).await.copied()
    }

    /// The whole file as the MDT sent it with the open: its only chunk, ready for the
    /// first read (which then costs no RPC).
    fn prime(&self, data: Bytes) {
        let size = self.size_hint();
        if data.len() as u64 != size || size > self.fs.inner.params.rpc_bytes() {
            return;
        }
        lock(&self.shared.chunks).insert(0, cache::ready(data), None, true);
    }

    /// A file the MDT has opened as `handle` (by an open, or a create-open), with its
    /// layout if the reply carried it.
    pub(crate) fn opened(
        fs: FileSystem,
        c: &Creds,
        handle: u64,
        attr: Attr,
        layout: Option<Arc<FileLayout>>,
        flags: OpenFlags,
    ) -> File {
        if flags.write {
            fs.add_writer(attr.fid);
            fs.inner.whole.forget(attr.fid);
        }
        let shared = fs.inner.caches.open(&attr);
        let errors_seen = lock(&shared.behind).errors();
        if flags.write && fs.writers_of(attr.fid) == 1 && attr.size == 0 && lock(&shared.behind).is_idle() {
            // The one writer here of a file empty on its MDT, with the lease on it: from
            // here on its bytes are what this mount writes (see `whole`).
            let _gate = fs.lease_gate();
            if fs.attr_leased(attr.fid) {
                lock(&shared.image).empty();
            }
        }
        File {
            fs,
            creds: c.clone(),
            fid: attr.fid,
            handle,
            local: None,
            mds_handle: tokio::sync::OnceCell::new(),
            flags,
            layout: std::sync::Mutex::new(layout),
            st: tokio::sync::Mutex::new(State { size: attr.size, errors_seen, ..State::default() }),
            shared,
            size_hint: AtomicU64::new(attr.size),
            written_at: AtomicI64::new(0),
            closed: AtomicBool::new(false),
            opened_as: Stamp::of(&attr),
            closed_as: std::sync::OnceLock::new(),
            closed_whole: std::sync::OnceLock::new(),
        }
    }

    /// The attributes of a file opened with no request that its MDT no longer has
    /// (another mount removed it meanwhile), as the open found them, with no link left:
    /// what `fstat` of it shows, as of a file open elsewhere when it was unlinked.
    pub fn removed_attr(&self) -> Option<Attr> {
        self.local.as_ref().map(|l| Attr { nlink: 0, ..l.attr })
    }

    /// All of the file's bytes as this handle's close left it, if the close made the
    /// mount know it whole (see `whole`).
    pub fn closed_whole(&self) -> Option<Bytes> {
        self.closed_whole.get().cloned()
    }

    /// The file's size, mtime and ctime as its open found them on the MDT.
    pub fn opened_as(&self) -> Stamp {
        self.opened_as
    }

    /// The file's size, mtime and ctime as this handle's close left them on the MDT, if
    /// it was open for writing and the MDS said (`None` before the close).
    pub fn closed_as(&self) -> Option<Stamp> {
        self.closed_as.get().copied()
    }

    pub fn fid(&self) -> Fid {
        self.fid
    }

    pub fn flags(&self) -> OpenFlags {
        self.flags
    }

    /// The file's layout and objects (fetched at the first IO if the open did not send
    /// them), or a later one this mount has seen: components only ever gain objects.
    pub async fn layout(&self) -> Result<Arc<FileLayout>> {
        if let Some(l) = self.known_layout() {
            return Ok(l);
        }
        let l = self.fs.file_layout(&self.creds, self.fid).await?;
        Ok(self.keep_layout(l))
    }

    /// [`File::layout`] if it needs no RPC.
    fn known_layout(&self) -> Option<Arc<FileLayout>> {
        let mut own = lock(&self.layout);
        let l = own.as_ref()?;
        // A write through another handle here may have given a component its objects.
        if l.incomplete()
            && let Some(later) = self.fs.cached_layout(self.fid)
            && later.instantiated() > l.instantiated()
        {
            *own = Some(later);
        }
        own.clone()
    }

    /// Keep `l` as the file's layout unless the one kept has as many objects.
    fn keep_layout(&self, l: Arc<FileLayout>) -> Arc<FileLayout> {
        let mut own = lock(&self.layout);
        match &*own {
            Some(kept) if kept.instantiated() >= l.instantiated() => kept.clone(),
            _ => own.insert(l).clone(),
        }
    }

    /// The layout with objects for every striped component a write up to byte `end`
    /// reaches: those that have none get them first (a layout intent to the MDS, once
    /// per component, as Lustre instantiates PFL components at the first write).
    async fn layout_to_write(&self, end: u64) -> Result<Arc<FileLayout>> {
        let l = self.layout().await?;
        if !l.lacks_objects_before(end) {
            return Ok(l);
        }
        let l = self.fs.layout_intent(&self.creds, self.fid, self.handle, end).await?;
        Ok(self.keep_layout(l))
    }

    /// Whether the file's bytes can only be on the MDT, so that its MDT size is exact
    /// (each DoM write sets it): no component has OST objects, and none can get them
    /// unseen by this mount: the layout has no striped component, or this mount holds a
    /// lease on the file's attributes (a writer elsewhere opens the file for writing
    /// first, which calls the lease back). Otherwise a writer elsewhere may have written
    /// past the MDT's size without publishing it yet.
    fn all_on_mdt(&self) -> bool {
        self.known_layout().is_some_and(|l| l.no_objects() && (!l.incomplete() || self.fs.attr_leased(self.fid)))
    }

    /// The size as this handle knows it, dirty writes included (no RPC).
    pub fn size_hint(&self) -> u64 {
        self.size_hint.load(Ordering::Relaxed)
    }

    /// When the last write through this handle was made (ns since the epoch; 0: none):
    /// its mtime and ctime while the MDT has not heard of it (no RPC).
    pub fn written_at(&self) -> i64 {
        self.written_at.load(Ordering::Relaxed)
    }

    fn set_size(&self, st: &mut State, size: u64) {
        st.size = size;
        self.size_hint.store(size, Ordering::Relaxed);
    }

    /// This handle wrote `data` at `offset`: the file is at least that long, and written
    /// now.
    fn wrote(&self, st: &mut State, offset: u64, data: &[u8]) {
        lock(&self.shared.image).wrote(offset, data);
        let end = offset + data.len() as u64;
        self.set_size(st, st.size.max(end));
        st.written = true;
        self.written_at.fetch_max(now_ns(), Ordering::Relaxed);
    }

    /// Write `data` at `offset` (at the end with O_APPEND); returns the bytes written.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<usize> {
        if !self.flags.write {
            return Err(Error::new(errno::EBADF, format!("{} is not open for writing", self.fid)));
        }
        let mut st = self.st.lock().await;
        self.reported(&mut st)?;
        if data.is_empty() {
            return Ok(0);
        }
        let r = if self.flags.append {
            self.append(&mut st, data).await
        } else {
            self.write_at(&mut st, offset, data).await
        };
        if r.is_err() {
            // Whatever of it reached the servers, this mount no longer knows the file's bytes.
            lock(&self.shared.image).unknown();
        }
        r
    }

    /// [`File::write`] of a write that is not an append.
    async fn write_at(&self, st: &mut State, offset: u64, data: &[u8]) -> Result<usize> {
        let len = data.len() as u64;
        let end = offset.checked_add(len).filter(|&e| e <= FILE_SIZE_MAX).ok_or_else(|| {
            Error::new(errno::EFBIG, format!("a write of {len} bytes at {offset} passes the largest file size"))
        })?;
        // A write past the layout's end fails now, not at write-back; the components it
        // reaches get their objects now.
        let layout = self.layout_to_write(end).await?;
        layout.plan(offset, len, u64::MAX)?;
        self.forget_chunks();
        self.wrote(st, offset, data);
        let through =
            || write_range(&self.fs, &self.creds, self.handle, self.fid, &layout, offset, Bytes::copy_from_slice(data));
        if self.flags.direct || self.flags.sync {
            self.flush(st).await?;
            through().await?;
            // The OSTs answer small writes before they commit them.
            self.commit_osts(&layout, offset, len).await?;
            return Ok(data.len());
        }
        let budget = &self.fs.inner.params.dirty;
        let unit = self.flush_unit(&layout);
        // What is one RPC long or more goes; what is shorter may still grow.
        let long = unit.min(self.fs.inner.params.rpc_bytes());
        // When the mount's dirty budget is spent, this file's long extents go first (their
        // room comes back when they land); then all of its dirty bytes; and if other, idle
        // files hold the rest, this write goes through rather than wait for files nobody
        // may touch again.
        let mut permit = budget.try_take(len);
        if permit.is_none() {
            self.launch(long).await;
            self.landed().await;
            permit = budget.try_take(len);
        }
        if permit.is_none() {
            self.flush(st).await?;
            permit = budget.try_take(len);
        }
        if permit.is_none() {
            return through().await.map(|_| data.len());
        }
        loop {
            let full = {
                let mut wb = lock(&self.shared.behind);
                (!wb.overlaps(offset, end)).then(|| wb.add(offset, data, permit.take()) >= unit)
            };
            match full {
                Some(full) => {
                    if full {
                        self.launch(long).await;
                    }
                    return Ok(data.len());
                }
                // It overwrites bytes still dirty (this handle's or another's): send
                // those first, so the order holds.
                None => self.flush(st).await?,
            }
        }
    }

    /// A write taken into the file's write-behind with no wait (no lock held elsewhere,
    /// room in the dirty budget, nothing dirty under it, the layout known, and the
    /// file's dirty bytes still short of a write-back): what the mount answers on the
    /// kernel reader's thread, without a hop to the runtime and back. `None`: it needs
    /// [`File::write`] (which the caller then runs; this one changed nothing).
    pub fn write_ready(&self, offset: u64, data: &[u8]) -> Option<usize> {
        let f = self.flags;
        if !f.write || f.append || f.direct || f.sync || data.is_empty() {
            return None;
        }
        let mut st = self.st.try_lock().ok()?;
        let len = data.len() as u64;
        let end = offset.checked_add(len).filter(|&e| e <= FILE_SIZE_MAX)?;
        let layout = self.known_layout()?;
        layout.plan(offset, len, u64::MAX).ok()?;
        let unit = self.flush_unit(&layout);
        {
            let mut wb = lock(&self.shared.behind);
            if wb.error_since(st.errors_seen).is_some() || wb.overlaps(offset, end) || wb.bytes() + len >= unit {
                return None;
            }
            let permit = self.fs.inner.params.dirty.try_take(len)?;
            wb.add(offset, data, Some(permit));
        }
        self.forget_chunks();
        self.wrote(&mut st, offset, data);
        Some(data.len())
    }

    /// An O_APPEND write: at the end of the file as every mount sees it, never over
    /// another's append. Appends from all mounts go one at a time under the file's append
    /// lock (a lock space of its own on the MDS, apart from the users' locks): the holder
    /// learns the end (the MDS's size, or the objects' while the file is open for writing
    /// anywhere), writes through, and lets go, so the next one finds its bytes.
    ///
    /// The one handle writing a file anywhere keeps the lock (`lock::CACHE`, a lease) on a
    /// mount that takes leases: its next appends go at the end it knows, with no request
    /// to the MDS, until the MDS calls the lock back (another mount appends, opens the
    /// file for writing, or changes its attributes) or the handle closes.
    async fn append(&self, st: &mut State, data: &[u8]) -> Result<usize> {
        let slot = self.fs.append_slot(self.fid);
        let mut held = slot.lock().await;
        let kept = *held == Some(self.handle) && self.fs.inner.leases.holds(&LeaseKey::Append(self.fid));
        if !kept {
            if let Some(h) = held.take() {
                // Called back meanwhile: let go of it before asking again.
                self.fs.unlock_append(self.fid, h, &self.creds).await?;
            }
            let keep = self.fs.inner.revoker.get().is_some() && self.fs.writers_of(self.fid) == 1;
            let flags = lock::APPEND | lock::WAIT | if keep { lock::CACHE } else { 0 };
            self.lock_as(self.handle, 0, lock::WRITE, flags, 0, lock::EOF).await?;
        }
        let written = async {
            self.flush(st).await?;
            let end = if kept { st.size } else { self.fs.getattr(&self.creds, self.fid).await?.size };
            let len = data.len() as u64;
            let to = end.checked_add(len).filter(|&e| e <= FILE_SIZE_MAX).ok_or_else(|| {
                Error::new(errno::EFBIG, format!("an append of {len} bytes at {end} passes the largest file size"))
            })?;
            let layout = self.layout_to_write(to).await?;
            layout.plan(end, len, u64::MAX)?;
            self.forget_chunks();
            write_range(&self.fs, &self.creds, self.handle, self.fid, &layout, end, Bytes::copy_from_slice(data))
                .await?;
            self.wrote(st, end, data);
            Ok(data.len())
        }
        .await;
        if written.is_ok() && self.fs.inner.leases.holds(&LeaseKey::Append(self.fid)) {
            *held = Some(self.handle);
            return written;
        }
        *held = None;
        let unlocked = self.fs.unlock_append(self.fid, self.handle, &self.creds).await;
        let n = written?;
        unlocked?;
        Ok(n)
    }

    /// Dirty bytes that make a write-back: a full RPC to every object of the widest
    /// component, within a quarter of the mount's dirty budget.
    fn flush_unit(&self, layout: &FileLayout) -> u64 {
        let p = &self.fs.inner.params;
        let width = layout.objects.iter().map(Vec::len).max().unwrap_or(1).max(1) as u64;
        (p.rpc_bytes() * width).min(p.dirty.size() / 4).max(1)
    }

    /// Start sending the file's dirty extents of at least `min_len` bytes (0: all), after
    /// any write-back in flight that overlaps them.
    async fn launch(&self, min_len: u64) {
        let Some(taken) = lock(&self.shared.behind).take(min_len) else { return };
        match self.layout().await {
            Ok(layout) => {
                send(self.fs.clone(), self.creds.clone(), self.handle, self.fid, layout, self.shared.clone(), taken)
            }
            Err(e) => {
                lock(&self.shared.behind).failed(e);
                let _ = taken.done.send(true);
            }
        }
    }

    /// Send every dirty byte of the file and wait for all its write-back; a failure since
    /// this handle last reported one is returned.
    async fn flush(&self, st: &mut State) -> Result<()> {
        self.settle().await;
        self.reported(st)
    }

    /// A write-back failure of the file this handle has not reported yet.
    fn reported(&self, st: &mut State) -> Result<()> {
        match lock(&self.shared.behind).error_since(st.errors_seen) {
            Some((n, e)) => {
                st.errors_seen = n;
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Send every dirty byte of the file and wait for all its write-back, leaving a
    /// failure for each handle's next write, fsync or close to report.
    async fn settle(&self) {
        self.launch(0).await;
        self.landed().await;
    }

    /// Wait for the file's write-backs in flight now.
    async fn landed(&self) {
        let waits = lock(&self.shared.behind).in_flight();
        for w in waits {
            behind::ended(w).await;
        }
    }

    /// Send every dirty byte and wait for it, without the OST sync and MDT update of
    /// `fsync`: what a `close(2)` of one descriptor needs. Returns the first write-back
    /// failure since the last call.
    pub async fn write_back(&self) -> Result<()> {
        let mut st = self.st.lock().await;
        self.flush(&mut st).await
    }

    /// Write back the file's dirty bytes (before another handle of the mount reads,
    /// writes or truncates). A failure stays for the handles to report.
    pub async fn share(&self) {
        self.settle().await;
    }

    /// Drop the file's read-ahead chunks (it changed on this mount).
    fn forget_chunks(&self) {
        lock(&self.shared.chunks).clear();
    }

    /// The file is `size` bytes now (another handle of the mount truncated it): what this
    /// handle knew of its size and read ahead no longer holds.
    pub async fn resized(&self, size: u64) {
        let mut st = self.st.lock().await;
        self.forget_chunks();
        self.set_size(&mut st, size);
    }

    /// The file is at least `size` bytes (another handle of the mount wrote up to it):
    /// appends go after it.
    pub async fn grown(&self, size: u64) {
        let mut st = self.st.lock().await;
        if size > st.size {
            self.set_size(&mut st, size);
        }
    }

    /// Whether writes wait in the file's write-behind (no RPC).
    pub fn may_be_dirty(&self) -> bool {
        !lock(&self.shared.behind).is_idle()
    }

    /// A read answered from bytes already here, with no wait and no RPC: a file of at
    /// most one chunk whose bytes came with its open (DoM read-on-open) or a read that
    /// has landed. `None`: it needs [`File::read`] (which the caller then runs; this one
    /// changes nothing).
    pub fn read_ready(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        if let Some(out) = self.read_local(offset, len) {
            return Some(out);
        }
        let read_ahead = self.fs.inner.params.read_ahead_per_file.load(Ordering::Relaxed) > 0;
        if !self.flags.read || self.flags.direct || !read_ahead || self.may_be_dirty() {
            return None;
        }
        let st = self.st.try_lock().ok()?;
        if offset >= st.size || st.size > self.fs.inner.params.rpc_bytes() || !self.all_on_mdt() {
            return None;
        }
        let end = offset.saturating_add(len as u64).min(st.size);
        let fetch = lock(&self.shared.chunks).get(0, true)?;
        let got = fetch.borrow();
        let Some(Ok(bytes)) = got.as_ref() else { return None };
        let out = (bytes.len() as u64 >= end).then(|| bytes[offset as usize..end as usize].to_vec());
        if out.is_some() {
            self.fs.inner.caches.stats.hits.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// Read up to `len` bytes at `offset`; fewer at the end of the file.
    pub async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        if !self.flags.read {
            return Err(Error::new(errno::EBADF, format!("{} is not open for reading", self.fid)));
        }
        if let Some(out) = self.read_local(offset, len) {
            return Ok(out);
        }
        match self.read_from_servers(offset, len).await {
            // Opened with no request, it has no handle keeping it: another mount may have
            // removed it since, and what it had was read.
            Err(e) if self.local.is_some() && (e.errno == errno::ENOENT || e.errno == errno::ESTALE) => Ok(Vec::new()),
            r => r,
        }
    }

    /// A read of a file opened with no request, answered from the bytes it opened with
    /// while no write or truncate here came since: within them, and past their end (none)
    /// while the mount holds the lease (no other mount can have made the file longer).
    fn read_local(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let Local { bytes, changes, .. } = self.local.as_ref()?;
        if lock(&self.shared.image).changes != *changes || self.may_be_dirty() {
            return None;
        }
        let n = bytes.len() as u64;
        if offset >= n && !self.fs.attr_leased(self.fid) {
            return None;
        }
        let (from, to) = (offset.min(n) as usize, offset.saturating_add(len as u64).min(n) as usize);
        Some(bytes[from..to].to_vec())
    }

    async fn read_from_servers(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut st = self.st.lock().await;
        if self.may_be_dirty() {
            self.settle().await;
        }
        let mut len = len as u64;
        if offset >= st.size || (offset.saturating_add(len) > st.size && !self.all_on_mdt()) {
            // Past what we know: the file may have grown (another client, since open).
            // A file whose bytes all live on the MDT has the size its open gave, exact
            // then (each DoM write sets it there): a read across that end gets what is
            // before it (a 3,901-byte file read a page at a time costs no getattr). A
            // file with OST data asks: its MDT size may lag its objects', and a short
            // read would make the kernel shrink the file.
            let a = self.fs.getattr(&self.creds, self.fid).await?;
            let a = self.fs.glimpse(&self.creds, a).await?;
            if a.size > st.size {
                // Chunks read ahead near the old end are short.
                self.forget_chunks();
                self.set_size(&mut st, a.size);
            }
        }
        len = len.min(st.size.saturating_sub(offset));
        if len == 0 {
            return Ok(Vec::new());
        }
        let per_file = self.fs.inner.params.read_ahead_per_file.load(Ordering::Relaxed);
        let layout = self.layout().await?;
        if self.flags.direct || per_file == 0 {
            return read_range(&self.fs, &self.creds, self.fid, &layout, offset, len).await;
        }
        self.read_ahead(&mut st, &layout, offset, len, per_file).await
    }

    async fn read_ahead(
        &self,
        st: &mut State,
        layout: &Arc<FileLayout>,
        offset: u64,
        len: u64,
        per_file: u64,
    ) -> Result<Vec<u8>> {
        let chunk = self.fs.inner.params.rpc_bytes();
        let end = offset + len;
        let head = st.ra.next;
        let pattern = st.ra.note(offset, len, chunk);
        let stats = &self.fs.inner.caches.stats;
        stats.count(pattern);
        let streaming = st.ra.run >= STREAM_READS;
        // Not (yet) a stream, and not in chunks already here (read ahead by another
        // handle, or sent with the open): what was asked, and nothing else.
        let alone = !streaming && {
            let mut chunks = lock(&self.shared.chunks);
            let alone = !chunks.covers(offset, end, chunk);
            if alone {
                chunks.stream(self.handle, None);
            }
            alone
        };
        if alone {
            stats.misses.fetch_add(1, Ordering::Relaxed);
            return read_range(&self.fs, &self.creds, self.fid, layout, offset, len).await;
        }
        if streaming && (end > head || st.ra.window == 0) {
            st.ra.window = (st.ra.window * 2).clamp(chunk, per_file.max(chunk));
        }
        let near = st.ra.window.max(chunk);
        // Start the chunks this read needs and, on a stream, those of the window after it
        // that no handle has asked for yet.
        let size = st.size;
        let ahead = if streaming { end.saturating_add(st.ra.window) } else { end }.min(size);
        let mut needed = Vec::new();
        let mut waited = false;
        {
            let mut chunks = lock(&self.shared.chunks);
            chunks.stream(self.handle, streaming.then_some(st.ra.next));
            let mut c = offset / chunk * chunk;
            while c < ahead {
                let is_needed = c < end;
                let fetch = match chunks.get(c, is_needed) {
                    Some(f) => f,
                    None => {
                        waited |= is_needed;
                        let n = chunk.min(size - c);
                        let budget = &self.fs.inner.params.read_ahead;
                        let permit = budget.try_take(n).or_else(|| {
                            // The budget is spent: what this stream has passed goes first.
                            chunks.drop_before(st.ra.next.saturating_sub(near), chunk);
                            budget.try_take(n)
                        });
                        if permit.is_none() && !is_needed {
                            break;
                        }
                        let (fs, creds, fid, layout) = (self.fs.clone(), self.creds.clone(), self.fid, layout.clone());
                        let f =
                            spawn_fetch(
                                async move { read_range(&fs, &creds, fid, &layout, c, n).await.map(Bytes::from) },
                            );
                        if !is_needed {
                            stats.chunks_ahead.fetch_add(1, Ordering::Relaxed);
                            stats.bytes_ahead.fetch_add(n, Ordering::Relaxed);
                        }
                        chunks.insert(c, f.clone(), permit, is_needed);
                        f
                    }
                };
                if is_needed {
                    needed.push((c, fetch));
                }
                c += chunk;
            }
        }
        if waited { &stats.misses } else { &stats.hits }.fetch_add(1, Ordering::Relaxed);
        let mut out = vec![0u8; len as usize];
        for (c, fetch) in needed {
            // A chunk holds `want` bytes, or it is short (read when the file was
            // shorter) and read again here; one that failed is dropped, so the next read
            // tries again.
            let want = chunk.min(size.saturating_sub(c));
            let data = match fetched(fetch.clone()).await {
                Ok(b) if b.len() as u64 >= want => {
                    lock(&self.shared.chunks).remove_unbudgeted(c);
                    b
                }
                Ok(_) => {
                    lock(&self.shared.chunks).remove_if(c, &fetch);
                    Bytes::from(read_range(&self.fs, &self.creds, self.fid, layout, c, want).await?)
                }
                Err(e) => {
                    lock(&self.shared.chunks).remove_if(c, &fetch);
                    return Err(e);
                }
            };
            let (from, to) = (offset.max(c), end.min(c + chunk));
            let have = (to - c).min(data.len() as u64);
            if from - c < have {
                let n = (have - (from - c)) as usize;
                let at = (from - offset) as usize;
                out[at..at + n].copy_from_slice(&data[(from - c) as usize..(from - c) as usize + n]);
            }
        }
        // Chunks every stream of the file has passed are done with (a late read among
        // them reads again).
        lock(&self.shared.chunks).drop_passed(near, chunk);
        Ok(out)
    }

    /// `s` sent through this handle when it is open for writing: a write permission lost
    /// since the open does not matter (the MDS checks the handle).
    fn through_handle(&self, mut s: SetAttr) -> SetAttr {
        if self.flags.write {
            s.mask |= set::BY_HANDLE;
            s.handle = self.handle;
        }
        s
    }

    /// A write by someone without CAP_FSETID drops setuid, and setgid where it means
    /// set-group-id (group execute), as Linux's `file_remove_privs`: what the kernel asks
    /// of a direct write (`FUSE_WRITE_KILL_SUIDGID`), where it does not do it itself.
    pub async fn kill_privs(&self) -> Result<()> {
        let a = self.fs.getattr(&self.creds, self.fid).await?;
        let sgid = mode::S_ISGID | 0o010;
        let kill = if a.mode & sgid == sgid { mode::S_ISUID | mode::S_ISGID } else { mode::S_ISUID };
        if a.mode & kill == 0 {
            return Ok(());
        }
        let s =
            self.through_handle(SetAttr { mask: set::MODE, mode: a.mode & mode::PERMS & !kill, ..SetAttr::default() });
        self.fs.setattr(&self.creds, self.fid, s).await.map(|_| ())
    }

    /// Truncate or extend the file to `size` (ftruncate(2): through this handle, so a
    /// write permission lost since the open does not matter).
    pub async fn set_len(&self, size: u64) -> Result<()> {
        let mut st = self.st.lock().await;
        self.flush(&mut st).await?;
        self.forget_chunks();
        let s = self.through_handle(SetAttr { mask: set::SIZE, size, ..SetAttr::default() });
        self.fs.setattr(&self.creds, self.fid, s).await?;
        self.set_size(&mut st, size);
        st.written = true;
        Ok(())
    }

    /// Make every write of this handle durable, and the file's size and mtime known to
    /// the MDT, and this client's changes there committed (its create, its DoM bytes).
    pub async fn fsync(&self) -> Result<()> {
        let mut st = self.st.lock().await;
        self.flush(&mut st).await?;
        // The file's write-back is shared: bytes another handle wrote may have gone out
        // just now, and they must be durable too.
        let landed = lock(&self.shared.behind).landed();
        if !st.written && landed == st.landed_synced {
            return self.fs.commit_fid(self.fid).await;
        }
        let osts = self.layout().await?.objects.iter().flatten().map(|(o, _)| *o).collect();
        self.sync_osts(osts).await?;
        st.landed_synced = landed;
        if st.written {
            self.publish_size(&mut st).await?;
        }
        self.fs.commit_fid(self.fid).await
    }

    /// Ask each of `osts` (once, all at the same time) to commit everything it answered,
    /// and wait for them all: a commit waits on its drives' flushes, and one OST's need
    /// not wait for another's (an fsync of a file striped over two OSTs took the sum).
    async fn sync_osts(&self, mut osts: Vec<u32>) -> Result<()> {
        osts.sort_unstable();
        osts.dedup();
        let mut set = tokio::task::JoinSet::new();
        for o in osts {
            let fs = self.fs.clone();
            set.spawn(async move { fs.ost_call(o, &ost::Request::Sync { target: 0 }, &[]).await });
        }
        all(set, "sync").await.map(|_| ())
    }

    /// Wait until the targets holding `[offset, offset + len)` (OSTs, and the MDT for
    /// DoM bytes) have committed everything they answered.
    async fn commit_osts(&self, layout: &FileLayout, offset: u64, len: u64) -> Result<()> {
        let pieces = layout.plan(offset, len, self.fs.inner.params.rpc_bytes())?;
        let osts = pieces
            .iter()
            .filter_map(|p| match p.place {
                Place::Object { ost, .. } => Some(ost),
                Place::Mdt | Place::Hole => None,
            })
            .collect();
        self.sync_osts(osts).await?;
        if pieces.iter().any(|p| matches!(p.place, Place::Mdt)) {
            self.fs.commit_fid(self.fid).await?;
        }
        Ok(())
    }

    /// Tell the MDT the size the objects give (it keeps the larger of that and its own)
    /// and a new mtime: one MDT request, no getattr before it. A file whose data all
    /// lives on the MDT (DoM only) has nothing to tell: each DoM write set its size and
    /// mtime there.
    async fn publish_size(&self, st: &mut State) -> Result<()> {
        if self.layout().await?.no_objects() {
            st.written = false;
            return Ok(());
        }
        let _still = self.fs.size_guard(self.fid).await;
        let (a, space) = self.fs.glimpse_space(&self.creds, Attr { fid: self.fid, ..Attr::default() }).await?;
        // The objects' space goes with the size, for st_blocks (Lustre's lazy size on MDT).
        let s = self.through_handle(SetAttr {
            mask: set::MTIME_NOW | set::OST_BLOCKS | set::SIZE_AT_LEAST,
            ost_blocks: space / 512,
            size: a.size,
            ..SetAttr::default()
        });
        self.fs.md(mdt_of(self.fid)?, &self.creds, &Request::Setattr { fid: self.fid, set: s }, &[]).await?;
        st.written = false;
        Ok(())
    }

    /// Take a byte-range lock of `kind` ([`lock`]: read, write or unlock) over bytes
    /// `start..=end` for `owner` (the kernel's lock owner: a process for `fcntl`, an open
    /// file for `flock`), held between all mounts by the MDS of the file. With `wait` it
    /// waits while another owner's lock conflicts (asking again whenever the MDS ends a
    /// long wait with ETIMEDOUT); without, a conflict is EAGAIN. A wait that would close
    /// a cycle of owners is EDEADLK.
    pub async fn lock(&self, owner: u64, pid: u32, kind: u8, start: u64, end: u64, wait: bool) -> Result<()> {
        self.lock_as(owner, pid, kind, if wait { lock::WAIT } else { 0 }, start, end).await
    }

    /// [`File::lock`] with the request's [`lock`] flags. A user's lock taken or dropped
    /// is kept for replay after an MDS restart (the mount's own append locks are not: a
    /// restart voids a kept one, and the next append takes it again).
    async fn lock_as(&self, owner: u64, pid: u32, kind: u8, flags: u8, start: u64, end: u64) -> Result<()> {
        let handle = self.mds_handle().await?;
        if flags & lock::APPEND == 0 {
            return self.fs.user_lock(&self.creds, self.fid, handle, owner, pid, kind, flags, start, end).await;
        }
        let r = Request::Lock { fid: self.fid, handle, owner, pid, kind, flags, start, end };
        loop {
            match self.fs.md(mdt_of(self.fid)?, &self.creds, &r, &[]).await {
                Err(e) if flags & lock::WAIT != 0 && e.errno == errno::ETIMEDOUT => continue,
                other => return other.map(|_| ()),
            }
        }
    }

    /// What would conflict with a lock of `kind` over `start..=end` for `owner`
    /// (`F_GETLK`): the kind, range and pid of such a lock, or `None`.
    pub async fn test_lock(&self, owner: u64, kind: u8, start: u64, end: u64) -> Result<Option<(u8, u64, u64, u32)>> {
        let handle = self.mds_handle().await?;
        self.fs.user_test(&self.creds, self.fid, handle, owner, kind, start, end).await
    }

    /// Let go of every lock `owner` holds on this file, and end its waits (a close).
    pub async fn unlock_all(&self, owner: u64) -> Result<()> {
        self.fs.user_unlock_all(&self.creds, self.fid, owner).await
    }

    /// Write back, publish the size, and release the handle on the MDT. The first error
    /// of any of it is returned; the handle is released either way.
    pub async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let mut st = self.st.lock().await;
        let mut r = self.flush(&mut st).await;
        if r.is_ok() && st.written {
            r = self.publish_size(&mut st).await;
        }
        lock(&self.shared.chunks).stream(self.handle, None);
        if self.flags.write {
            self.fs.drop_writer(self.fid);
            self.fs.release_append(self.fid, Some(self.handle)).await;
        }
        // A file opened with no request has no handle to give back, unless it took one.
        let handle = if self.local.is_some() { self.mds_handle.get().copied() } else { Some(self.handle) };
        let Some(handle) = handle else { return r };
        let closed = self.fs.md(mdt_of(self.fid)?, &self.creds, &Request::Close { handle }, &[]).await;
        if let Ok((Reply::Attr(a), _)) = &closed
            && a.fid == self.fid
        {
            let _ = self.closed_as.set(Stamp::of(a));
            // The last writer here leaves the file as this mount wrote it from empty.
            if r.is_ok()
                && self.flags.write
                && self.fs.writers_of(self.fid) == 0
                && lock(&self.shared.behind).errors() == 0
                && let Some(bytes) = lock(&self.shared.image).bytes(a.size)
                && self.keep_whole(a, &bytes)
            {
                let _ = self.closed_whole.set(bytes);
            }
        }
        r.and(closed.map(|_| ()))
    }
}

impl Drop for File {
    /// A file dropped without `close` still releases its MDT handle (the file's dirty
    /// data, if any, is written back first, on the runtime).
    fn drop(&mut self) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        lock(&self.shared.chunks).stream(self.handle, None);
        if self.flags.write {
            self.fs.drop_writer(self.fid);
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        if self.local.is_some() {
            // Opened for reading with no request: nothing dirty, and a handle only if it
            // took one.
            if let (Some(&handle), Ok(mdt)) = (self.mds_handle.get(), mdt_of(self.fid)) {
                let (fs, creds) = (self.fs.clone(), self.creds.clone());
                rt.spawn(async move {
                    let _ = fs.md(mdt, &creds, &Request::Close { handle }, &[]).await;
                });
            }
            return;
        }
        let (fs, creds, fid, handle, layout) =
            (self.fs.clone(), self.creds.clone(), self.fid, self.handle, lock(&self.layout).clone());
        let shared = self.shared.clone();
        let (taken, waits) = {
            let mut wb = lock(&shared.behind);
            let taken = wb.take(0);
            (taken, wb.in_flight())
        };
        rt.spawn(async move {
            if let Some(taken) = taken {
                let layout = match layout {
                    Some(l) => Ok(l),
                    None => fs.file_layout(&creds, fid).await,
                };
                match layout {
                    Ok(layout) => send(fs.clone(), creds.clone(), handle, fid, layout, shared.clone(), taken),
                    Err(e) => {
                        lock(&shared.behind).failed(e);
                        let _ = taken.done.send(true);
                    }
                }
            }
            for w in waits {
                behind::ended(w).await;
            }
            fs.release_append(fid, Some(handle)).await;
            if let Ok(mdt) = mdt_of(fid) {
                let _ = fs.md(mdt, &creds, &Request::Close { handle }, &[]).await;
            }
        });
    }
}

/// What an open with `flags` asks the MDT to send of a small file (0: nothing): only
/// opens for reading that go through read-ahead.
pub(crate) fn read_on_open(fs: &FileSystem, flags: OpenFlags) -> u32 {
    let p = &fs.inner.params;
    let reads_ahead = p.read_ahead_per_file.load(Ordering::Relaxed) > 0;
    if flags.read && !flags.direct && reads_ahead { READ_ON_OPEN_MAX } else { 0 }
}

/// Send a write-back's extents once the write-backs it follows have ended; a failure is
/// kept for the file's handles to report. `handle` is the writing handle on whose behalf
/// they go (for DoM writes' permission).
fn send(
    fs: FileSystem,
    creds: Creds,
    handle: u64,
    fid: Fid,
    layout: Arc<FileLayout>,
    shared: Arc<cache::Shared>,
    taken: Taken,
) {
    tokio::spawn(async move {
        for w in taken.after {
            behind::ended(w).await;
        }
        let mut extents = Vec::with_capacity(taken.extents.len());
        let mut permits = Vec::with_capacity(taken.extents.len());
        for (offset, x) in taken.extents {
            extents.push((offset, x.data));
            permits.push(x.permit);
        }
        match write_extents(&fs, &creds, handle, fid, &layout, &extents).await {
            Ok(()) => lock(&shared.behind).landed_one(),
            Err(e) => lock(&shared.behind).failed(e),
        }
        drop(permits);
        let _ = taken.done.send(true);
    });
}

/// The bytes of `data` (which starts at file offset `base`) that a piece carries.
fn gather(p: &Piece, base: u64, data: &Rope) -> Bytes {
    if let [(fo, n)] = p.spans[..] {
        return data.slice(fo - base, n);
    }
    let mut v = Vec::with_capacity(p.len as usize);
    for &(fo, n) in &p.spans {
        data.copy_to(fo - base, n, &mut v);
    }
    Bytes::from(v)
}

fn crc32c(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b) as u32
}

/// Write `data` at `offset` of the file through `handle`, every piece in parallel.
pub(crate) async fn write_range(
    fs: &FileSystem,
    c: &Creds,
    handle: u64,
    fid: Fid,
    layout: &FileLayout,
    offset: u64,
    data: Bytes,
) -> Result<()> {
    write_extents(fs, c, handle, fid, layout, &[(offset, Rope::from(data))]).await
}

/// Write `extents` (file offset and bytes; in offset order, none overlapping) of the file
/// through `handle`. The pieces each object gets, contiguous or not, are gathered into as
/// few RPCs as `max_pages_per_rpc` and [`ost::NIOBUFS_MAX`] allow, as Lustre's niobufs:
/// the scattered blocks of one ior-hard task, or random small writes, go to each object in
/// a few full RPCs rather than one each. Every RPC runs in parallel.
pub(crate) async fn write_extents(
    fs: &FileSystem,
    c: &Creds,
    handle: u64,
    fid: Fid,
    layout: &FileLayout,
    extents: &[(u64, Rope)],
) -> Result<()> {
    let rpc_bytes = fs.inner.params.rpc_bytes();
    // A write gets the objects it reaches before it is taken in (`File::write`), but the
    // layout a write-back goes by may predate that (another handle's, or one dropped
    // unclosed): ask again (for objects given already, the MDS answers them).
    let end = extents.iter().map(|(o, d)| o.saturating_add(d.len())).max().unwrap_or(0);
    let fresh;
    let layout = if layout.lacks_objects_before(end) {
        fresh = fs.layout_intent(c, fid, handle, end).await?;
        &*fresh
    } else {
        layout
    };
    let mut dom = Vec::new();
    let mut objects: BTreeMap<(u32, u64), Vec<(u64, Bytes)>> = BTreeMap::new();
    for (offset, data) in extents {
        for p in layout.plan(*offset, data.len(), rpc_bytes)? {
            let bytes = gather(&p, *offset, data);
            match p.place {
                Place::Mdt => dom.push((p.offset, bytes)),
                Place::Object { ost, oid } => objects.entry((ost, oid)).or_default().push((p.offset, bytes)),
                // `plan` gives none (a component without objects is an error).
                Place::Hole => {}
            }
        }
    }
    let checksums = fs.inner.params.checksums();
    let mut set = tokio::task::JoinSet::new();
    for (offset, bytes) in dom {
        let (fs, c) = (fs.clone(), c.clone());
        set.spawn(async move {
            let mdt = mdt_of(fid)?;
            let mut at = 0usize;
            while at < bytes.len() {
                let part = bytes.slice(at..bytes.len().min(at + DOM_RPC_MAX as usize));
                fs.md(mdt, &c, &Request::DomWrite { fid, offset: offset + at as u64, handle }, &part).await?;
                at += part.len();
            }
            Ok(())
        });
    }
    for ((ost, oid), mut pieces) in objects {
        // Extents in file order can reach an object out of its order (a later stripe of
        // a wide layout first).
        pieces.sort_unstable_by_key(|(offset, _)| *offset);
        for rpc in niobuf_rpcs(pieces, rpc_bytes) {
            let fs = fs.clone();
            set.spawn(async move {
                let niobufs = rpc
                    .iter()
                    .map(|(offset, b)| ost::Niobuf {
                        offset: *offset,
                        len: b.len() as u32,
                        crc: checksums.then(|| crc32c(b)),
                    })
                    .collect();
                let bulk = match &rpc[..] {
                    [(_, b)] => b.clone(),
                    _ => {
                        let mut v = Vec::with_capacity(rpc.iter().map(|(_, b)| b.len()).sum());
                        for (_, b) in &rpc {
                            v.extend_from_slice(b);
                        }
                        Bytes::from(v)
                    }
                };
                fs.ost_call(ost, &ost::Request::Write { target: 0, oid, niobufs }, &bulk).await.map(|_| ())
            });
        }
    }
    all(set, "write").await.map(|_| ())
}

/// One object's pieces (in offset order) cut into RPCs of at most `rpc_bytes` of data and
/// [`ost::NIOBUFS_MAX`] extents; a piece is never cut (the layout made it one RPC long
/// at most).
fn niobuf_rpcs(pieces: Vec<(u64, Bytes)>, rpc_bytes: u64) -> Vec<Vec<(u64, Bytes)>> {
    let mut rpcs: Vec<Vec<(u64, Bytes)>> = Vec::new();
    let mut bytes = 0u64;
    for (offset, b) in pieces {
        let len = b.len() as u64;
        match rpcs.last_mut() {
            Some(rpc) if rpc.len() < ost::NIOBUFS_MAX && bytes + len <= rpc_bytes => {
                rpc.push((offset, b));
                bytes += len;
            }
            _ => {
                rpcs.push(vec![(offset, b)]);
                bytes = len;
            }
        }
    }
    rpcs
}

/// Read `len` bytes at `offset` of the file, every piece in parallel; holes and bytes
/// past an object's end read as zeros.
pub(crate) async fn read_range(
    fs: &FileSystem,
    c: &Creds,
    fid: Fid,
    layout: &FileLayout,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>> {
    // A striped component without objects may have got them from another mount's
    // write since this layout was read: look again before reading it as a hole.
    let fresh;
    let layout = if layout.lacks_objects_before(offset.saturating_add(len)) {
        fresh = fs.current_layout(c, fid).await?;
        &*fresh
    } else {
        layout
    };
    let mut pieces = layout.plan_read(offset, len, fs.inner.params.rpc_bytes())?;
    // A hole's bytes are the zeros `out` starts with.
    pieces.retain(|p| p.place != Place::Hole);
    let checksums = fs.inner.params.checksums();
    let read = |p: Piece| {
        let (fs, c) = (fs.clone(), c.clone());
        async move {
            let mut data = Vec::with_capacity(p.len as usize);
            match p.place {
                Place::Mdt => {
                    let mdt = mdt_of(fid)?;
                    let mut at = 0u64;
                    while at < p.len {
                        let n = DOM_RPC_MAX.min(p.len - at);
                        let r = Request::DomRead { fid, offset: p.offset + at, len: n as u32 };
                        let (_, bulk) = fs.md(mdt, &c, &r, &[]).await?;
                        if bulk.len() as u64 > n {
                            return Err(Error::protocol("DoM read", format!("{} bytes for {n} asked", bulk.len())));
                        }
                        data.extend_from_slice(&bulk);
                        if (bulk.len() as u64) < n {
                            break;
                        }
                        at += n;
                    }
                }
                Place::Object { ost, oid } => {
                    let r =
                        ost::Request::Read { target: 0, oid, offset: p.offset, len: p.len as u32, checksum: checksums };
                    let (body, bulk) = fs.ost_call(ost, &r, &[]).await?;
                    let (n, crc) = ost::decode_read(&body).map_err(|e| Error::protocol("OST read", e))?;
                    if n as usize != bulk.len() || n as u64 > p.len {
                        return Err(Error::protocol("OST read", format!("{n} bytes announced, {} came", bulk.len())));
                    }
                    if let Some(want) = crc
                        && crc32c(&bulk) != want
                    {
                        return Err(Error::new(
                            errno::EIO,
                            format!("checksum mismatch reading object {oid:#x} on OST {ost} at {}", p.offset),
                        ));
                    }
                    data.extend_from_slice(&bulk);
                }
                Place::Hole => {}
            }
            Ok::<_, Error>((p, data))
        }
    };
    // One piece (a small read) runs here: a task of its own would cost a thread wakeup
    // each way. Several run as tasks, so that one failing cannot cut the others' RPCs
    // in the middle (see `all`).
    let got = if pieces.len() == 1
        && let Some(p) = pieces.pop()
    {
        vec![read(p).await?]
    } else {
        let mut set = tokio::task::JoinSet::new();
        for p in pieces {
            set.spawn(read(p));
        }
        all(set, "read").await?
    };
    let mut out = vec![0u8; len as usize];
    for (p, data) in got {
        let mut at = 0usize;
        for &(fo, n) in &p.spans {
            let dst = (fo - offset) as usize;
            let n = n as usize;
            // Past the object's end (a hole at the file's end) stays zeros.
            let have = data.len().saturating_sub(at).min(n);
            if have > 0 {
                out[dst..dst + have].copy_from_slice(&data[at..at + have]);
            }
            at += n;
        }
    }
    Ok(out)
}
