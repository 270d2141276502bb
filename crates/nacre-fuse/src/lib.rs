//! Nacre through the kernel: a FUSE file system served by [`nacre_client`].
//!
//! Several threads (eight) read requests from the kernel, and each request is served on the
//! thread that read it (no thread wakeup to reach the runtime and none to come back), but
//! on all of them but one at most: past that, and for a lock that waits for its holder, a
//! request runs in a task on the client's runtime, so slow ones (a create waiting on an
//! MDT that stopped) never hold up the others. Writes of up to 1 MiB come in one request;
//! directory listings come with attributes (readdirplus). The kernel also checks
//! permission bits against cached attributes (`default_permissions`); the MDS checks them
//! again.
//!
//! Entries and attributes the MDS leased to this mount are cached by the kernel for
//! `lease_timeout`; when the MDS revokes a lease (another mount changed what it covers)
//! the kernel is told to drop them (FUSE's invalidate notifications) before the change
//! is answered, so every mount sees a change on its next call. What comes without a lease
//! is cached for `attr_timeout` (0 by default: asked again each time).
//!
//! Locks (`flock`, `fcntl`) go to the MDS, which holds them between all mounts.

mod inodes;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, MountOption,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};
use nacre_client::error::errno;
use nacre_client::{Attr, Creds, Error, Fid, File, FileSystem, LeaseKey, OpenFlags, SetAttr, Stamp};
use nacre_proto::layout::Layout;
use nacre_proto::mdt::{lock, mode, set, xattr};

use inodes::Inodes;

/// The name of the virtual xattr holding a file's layout (or a directory's default), as
/// Lustre's `lustre.lov`: its encoding is [`Layout::encode`].
pub const LAYOUT_XATTR: &str = "lustre.lov";
/// Largest write the kernel sends in one request.
pub const MAX_WRITE: u32 = 1 << 20;
/// How long the kernel trusts what is leased, by default: a lease lasts until revoked,
/// this bounds the harm should a revocation ever go unheard.
pub const LEASE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an xattr found missing is remembered (a revocation of its inode's lease
/// forgets it sooner).
const ABSENT_TTL: Duration = Duration::from_secs(1);

/// How the mount behaves.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// How long the kernel trusts entries and attributes the MDS gave no lease on.
    pub attr_timeout: Duration,
    /// How long the kernel trusts entries and attributes under a lease (a revocation
    /// ends it sooner).
    pub lease_timeout: Duration,
    /// Take leases from the MDS (listen for its callbacks).
    pub leases: bool,
    /// Let the kernel gather writes in its page cache (`writeback_cache`).
    pub writeback_cache: bool,
    /// Requests from uid 0 act as `nobody` (65534), as NFS's root squash.
    pub root_squash: bool,
    /// Threads reading requests from the kernel.
    pub threads: usize,
    /// Let users other than the one who mounted use the mount (`allow_other`).
    pub allow_other: bool,
    /// The name `mount` shows as the source.
    pub source: String,
}

impl Default for MountConfig {
    fn default() -> MountConfig {
        MountConfig {
            attr_timeout: Duration::ZERO,
            lease_timeout: LEASE_TIMEOUT,
            leases: true,
            writeback_cache: false,
            root_squash: false,
            // Each request is served on the thread that read it, at most threads - 1
            // at once (see `Nacre::here`): eight let seven callers at a time go without
            // a hop to the runtime (with four, one request in four of four busy
            // processes took it).
            threads: 8,
            allow_other: true,
            source: "nacre".into(),
        }
    }
}

/// A mounted file system; unmounted when dropped (or by `umount`/`fusermount3 -u`).
pub struct Mount {
    session: fuser::BackgroundSession,
}

impl Mount {
    /// Wait until the mount goes away (unmounted from outside).
    pub fn join(self) -> std::io::Result<()> {
        self.session.join()
    }

    /// Unmount and wait for the session to end.
    pub fn unmount(self) -> std::io::Result<()> {
        self.session.umount_and_join()
    }
}

/// Mount `fs` on `mountpoint`, serving requests on `rt`.
pub fn mount(
    fs: FileSystem,
    rt: tokio::runtime::Handle,
    mountpoint: &Path,
    cfg: MountConfig,
) -> std::io::Result<Mount> {
    let mut options = vec![
        MountOption::FSName(cfg.source.clone()),
        MountOption::Subtype("nacre".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        MountOption::RW,
    ];
    let mut c = fuser::Config::default();
    if cfg.allow_other {
        c.acl = fuser::SessionACL::All;
    }
    options.dedup();
    c.mount_options = options;
    c.n_threads = Some(cfg.threads.max(1));
    c.clone_fd = true;
    let leases = cfg.leases;
    let shared = Arc::new(Shared {
        fs,
        inodes: Inodes::new(),
        open: Mutex::new(OpenFiles::default()),
        cfg,
        absent: AbsentXattrs::default(),
        pages: KeptPages::default(),
        notifier: std::sync::OnceLock::new(),
    });
    let nacre = Nacre { shared: shared.clone(), rt: rt.clone(), serving_here: AtomicUsize::new(0) };
    let session = fuser::spawn_mount(nacre, mountpoint, &c)?;
    let _ = shared.notifier.set(session.notifier());
    if leases {
        let (weak, notifier) = (Arc::downgrade(&shared), session.notifier());
        let _rt = rt.enter();
        shared.fs.start_leases(Arc::new(move |keys: Vec<LeaseKey>| {
            if let Some(s) = weak.upgrade() {
                s.invalidate(&notifier, &keys);
            }
        }));
    }
    Ok(Mount { session })
}

/// The open files of the mount, by FUSE handle; and by FID, so that a read through one
/// handle sees what another handle of this mount wrote.
#[derive(Default)]
struct OpenFiles {
    next: u64,
    handles: std::collections::HashMap<u64, Arc<File>>,
    by_fid: std::collections::HashMap<Fid, Vec<Weak<File>>>,
}

struct Shared {
    fs: FileSystem,
    inodes: Inodes,
    open: Mutex<OpenFiles>,
    cfg: MountConfig,
    absent: AbsentXattrs,
    pages: KeptPages,
    /// The session's, to hand the kernel a small file's last page (see `release`).
    notifier: std::sync::OnceLock<fuser::Notifier>,
}

/// Files whose pages the kernel may keep from one open to the next (`FOPEN_KEEP_CACHE`),
/// so that reading an unchanged file again costs no request. A file's entry is its
/// [`Stamp`] (size, mtime, ctime) while this mount holds a lease on its attributes: as an
/// open for reading found it, or as the close of a handle that wrote it through the
/// kernel's pages left it (the pages then hold what was written). The lease's revocation
/// (another mount changed the file, or will write it) drops the entry. An open keeps the
/// pages only if it finds the entry, the same stamp, and the lease still held; any other
/// open lets the kernel drop them (and, leased and not for writing, makes the entry
/// afresh). Without leases no open keeps them.
#[derive(Default)]
struct KeptPages {
    files: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    stamps: std::collections::HashMap<Fid, Stamp>,
    /// Files with a handle open here that wrote, or may write, around the kernel's
    /// pages (O_DIRECT, appends without the write-back cache): until the last handle of
    /// the file here closes, no close vouches for the pages.
    around: std::collections::HashSet<Fid>,
}

/// Files whose kept pages are remembered at most (then the memory starts over: the next
/// open of each drops its pages once).
const KEPT_PAGES_MAX: usize = 65_536;

impl KeptPages {
    /// Whether an open of `fid` that found it as `stamp` keeps its pages. `around`: the
    /// open writes around the kernel's pages. Call under the lease gate, with `leased`
    /// read under it.
    fn open(&self, fid: Fid, stamp: Stamp, leased: bool, write: bool, around: bool) -> bool {
        let mut k = lock(&self.files);
        let keep = leased && k.stamps.get(&fid) == Some(&stamp);
        if write && around {
            k.around.insert(fid);
        }
        if leased && !write {
            k.remember(fid, stamp);
        } else {
            // Written through this open: its size and mtime change.
            k.stamps.remove(&fid);
        }
        keep
    }

    /// A handle that wrote `fid` through the kernel's pages closed, leaving the file as
    /// `stamp` (`None`: the MDS did not say). Call under the lease gate, with `leased`
    /// read under it. Returns whether the pages are vouched for.
    fn written(&self, fid: Fid, stamp: Option<Stamp>, leased: bool) -> bool {
        let mut k = lock(&self.files);
        match stamp {
            Some(stamp) if leased && !k.around.contains(&fid) => {
                k.remember(fid, stamp);
                true
            }
            _ => {
                k.stamps.remove(&fid);
                false
            }
        }
    }

    /// The last handle of `fid` here closed.
    fn closed_all(&self, fid: Fid) {
        lock(&self.files).around.remove(&fid);
    }

    /// `fid` may have changed: the next open drops its pages.
    fn forget(&self, fid: Fid) {
        lock(&self.files).stamps.remove(&fid);
    }
}

impl Kept {
    fn remember(&mut self, fid: Fid, stamp: Stamp) {
        if self.stamps.len() >= KEPT_PAGES_MAX {
            self.stamps.clear();
        }
        self.stamps.insert(fid, stamp);
    }
}

/// Xattrs known missing, by inode and name, until the attribute timeout: the kernel asks
/// for `security.capability` before every write(2) (to drop file capabilities), which
/// would otherwise be an MDT request per write. A file made here has none; a missing
/// one an MDT answered stays known for the timeout; this mount's set or remove forgets
/// it at once (another mount's shows after the timeout, as attributes do).
#[derive(Default)]
struct AbsentXattrs {
    /// By inode: each missing name and until when it is known missing (a check before
    /// every write finds its inode without allocating a key).
    until: Mutex<std::collections::HashMap<u64, Vec<(String, std::time::Instant)>>>,
}

/// Inodes with missing xattrs remembered at most (then the memory starts over).
const ABSENT_XATTRS_MAX: usize = 65_536;

impl AbsentXattrs {
    fn is_absent(&self, ino: u64, name: &str) -> bool {
        let m = lock(&self.until);
        let now = std::time::Instant::now();
        m.get(&ino).is_some_and(|v| v.iter().any(|(n, t)| n == name && *t > now))
    }

    fn absent(&self, ino: u64, name: &str, ttl: Duration) {
        let mut m = lock(&self.until);
        if m.len() >= ABSENT_XATTRS_MAX {
            m.clear();
        }
        let until = std::time::Instant::now() + ttl;
        let names = m.entry(ino).or_default();
        match names.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 = until,
            None => names.push((name.to_string(), until)),
        }
    }

    /// Forget what is known missing of `ino` (its lease was revoked).
    fn forget(&self, ino: u64) {
        lock(&self.until).remove(&ino);
    }

    fn changed(&self, ino: u64, name: &str) {
        let mut m = lock(&self.until);
        if let Some(names) = m.get_mut(&ino) {
            names.retain(|(n, _)| n != name);
            if names.is_empty() {
                m.remove(&ino);
            }
        }
    }
}

/// The kernel's page size (what a write in part of a page leaves it unable to use).
const PAGE_BYTES: usize = 4096;

/// What the kernel asks of every file before each write.
const CAPS_XATTR: &str = "security.capability";

struct Nacre {
    shared: Arc<Shared>,
    rt: tokio::runtime::Handle,
    /// Requests being served on kernel reader threads now (see [`Nacre::here`]).
    serving_here: AtomicUsize,
}

/// A request being served on a kernel reader thread; the count goes down when it ends.
struct ServingHere<'a>(&'a AtomicUsize);

impl Drop for ServingHere<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Nacre {
    /// Run `answer`, which serves a request: on this kernel reader thread if `here` and
    /// [`Nacre::here`] gives a slot, else in a task on the runtime (what may wait without
    /// bound, a lock that waits for its holder, must not hold a reader thread).
    fn run(&self, answer: impl std::future::Future<Output = ()> + Send + 'static, here: bool) {
        match here.then(|| self.here()).flatten() {
            Some(_slot) => self.rt.block_on(answer),
            None => drop(self.rt.spawn(answer)),
        }
    }

    /// A slot to serve a request on the kernel reader thread that read it, if one more
    /// reader thread than that is left for everything else: a request stuck on a server
    /// that is down must not keep the mount from answering `stat` and `ls` and reads of
    /// other targets. Served here, a request costs no thread wakeup to reach the runtime
    /// and none to come back with its answer.
    fn here(&self) -> Option<ServingHere<'_>> {
        let most = self.shared.cfg.threads.saturating_sub(1);
        self.serving_here
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < most).then_some(n + 1))
            .ok()
            .map(|_| ServingHere(&self.serving_here))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The errno of a failure; failures of the servers or the network (not the caller's
/// mistakes) are also logged, since the errno alone says little.
fn err(e: &Error) -> Errno {
    if matches!(e.errno, errno::EIO | errno::EPROTO | errno::ENOTCONN | errno::ETIMEDOUT | errno::ESTALE) {
        eprintln!("nacre mount: {e}");
    }
    Errno::from_i32(e.errno)
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

fn kind(m: u32) -> FileType {
    match m & mode::S_IFMT {
        mode::S_IFDIR => FileType::Directory,
        mode::S_IFLNK => FileType::Symlink,
        mode::S_IFIFO => FileType::NamedPipe,
        mode::S_IFSOCK => FileType::Socket,
        mode::S_IFCHR => FileType::CharDevice,
        mode::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn name_of(name: &OsStr) -> Result<&str, Errno> {
    std::str::from_utf8(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

impl Shared {
    /// Tell the kernel to drop what it caches under `keys` (leases given up): an
    /// inode's attributes (its pages stay until the next open, which drops them: see
    /// [`KeptPages`]), a name's entry.
    /// What the kernel does not hold is nothing to drop.
    fn invalidate(&self, notifier: &fuser::Notifier, keys: &[LeaseKey]) {
        for k in keys {
            match k {
                LeaseKey::Attr(fid) => {
                    self.pages.forget(*fid);
                    if let Some(ino) = self.inodes.ino_of(*fid) {
                        self.absent.forget(ino);
                        let _ = notifier.inval_inode(INodeNo(ino), -1, 0);
                    }
                }
                LeaseKey::Name(dir, name) => {
                    if let Some(ino) = self.inodes.ino_of(*dir) {
                        let _ = notifier.inval_entry(INodeNo(ino), OsStr::new(name));
                    }
                }
                // The client library lets go of a kept append lock itself.
                LeaseKey::Append(_) | LeaseKey::Locks(_) => {}
            }
        }
    }

    /// How long the kernel may trust an answer: long under a lease, else `attr_timeout`.
    /// Call it, and send the answer, under [`FileSystem::lease_gate`].
    fn ttl(&self, leased: bool) -> Duration {
        if leased { self.cfg.lease_timeout } else { self.cfg.attr_timeout }
    }

    /// [`Shared::ttl`] of `fid`'s attributes.
    fn attr_ttl(&self, fid: Fid) -> Duration {
        self.ttl(self.fs.attr_leased(fid))
    }

    /// [`Shared::ttl`] of an entry: `name` of `dir`, leading to `fid` (none: missing).
    /// The kernel takes one time for the entry and its attributes.
    fn entry_ttl(&self, dir: Fid, name: &str, fid: Option<Fid>) -> Duration {
        self.ttl(self.fs.name_leased(dir, name) && fid.is_none_or(|f| self.fs.attr_leased(f)))
    }

    /// The caller's credentials: its uid and gid, and its supplementary groups as
    /// /proc tells them (for group permission checks on the MDS).
    fn creds(&self, req: &Request) -> Creds {
        let (mut uid, mut gid) = (req.uid(), req.gid());
        if self.cfg.root_squash && uid == 0 {
            (uid, gid) = (65_534, 65_534);
        }
        let mut groups = Vec::new();
        if uid != 0
            && let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
            && let Some(line) = status.lines().find(|l| l.starts_with("Groups:"))
        {
            groups = line[7..].split_whitespace().filter_map(|g| g.parse().ok()).take(64).collect();
        }
        Creds { uid, gid, groups, umask: 0 }
    }

    fn fid(&self, ino: INodeNo) -> Result<Fid, Errno> {
        self.inodes.fid(ino.0).ok_or(Errno::ESTALE)
    }

    /// The kernel's view of `a`, under inode number `ino`, with the size and times dirty
    /// writes of this mount reach.
    fn file_attr(&self, ino: u64, a: &Attr) -> FileAttr {
        self.file_attr_after(ino, a, 0)
    }

    /// As [`Shared::file_attr`], with `before`: the size this mount's write handles gave
    /// `a.fid` before `a` was asked for. A handle closed meanwhile has published its size,
    /// but `a` may predate that: the larger of the two is right.
    fn file_attr_after(&self, ino: u64, a: &Attr, before: u64) -> FileAttr {
        let (dirty, written_at) = lock(&self.open).by_fid.get(&a.fid).and_then(|v| written(v)).unwrap_or((0, 0));
        let size = a.size.max(before).max(dirty);
        // A write changes mtime and ctime when it is made, as on a local file system, though
        // the MDT hears of it only when it is written back.
        let (mtime_ns, ctime_ns) = (a.mtime_ns.max(written_at), a.ctime_ns.max(written_at));
        FileAttr {
            ino: INodeNo(ino),
            size,
            // What the MDT counts: the DoM blocks, and the OST objects' blocks as their last
            // writer published them; bytes still in this mount's write-behind count whole.
            blocks: a.blocks.max(dirty.div_ceil(512)),
            atime: time(a.atime_ns),
            mtime: time(mtime_ns),
            ctime: time(ctime_ns),
            crtime: time(a.ctime_ns),
            kind: kind(a.mode),
            perm: (a.mode & mode::PERMS) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: 1 << 20,
            flags: 0,
        }
    }

    /// The largest size a handle of this mount open for writing knows for `fid` (its
    /// writes may not be on the servers yet).
    fn dirty_size(&self, fid: Fid) -> u64 {
        lock(&self.open).by_fid.get(&fid).and_then(|v| written(v)).map_or(0, |(size, _)| size)
    }

    /// [`Shared::dirty_size`] of every file with a write handle here: taken before asking
    /// an MDT for attributes (see [`Shared::file_attr_after`]).
    fn dirty_sizes(&self) -> std::collections::HashMap<Fid, u64> {
        let o = lock(&self.open);
        o.by_fid.iter().filter_map(|(fid, v)| written(v).map(|(n, _)| (*fid, n))).collect()
    }

    /// The other open handles of `fid` in this mount.
    fn handles_of(&self, fid: Fid) -> Vec<Arc<File>> {
        let o = lock(&self.open);
        o.by_fid.get(&fid).map(|v| v.iter().filter_map(Weak::upgrade).collect()).unwrap_or_default()
    }

    fn add_handle(&self, f: File) -> u64 {
        let f = Arc::new(f);
        let mut o = lock(&self.open);
        o.next += 1;
        let fh = o.next;
        let fid = f.fid();
        let list = o.by_fid.entry(fid).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&f));
        o.handles.insert(fh, f);
        fh
    }

    /// The flags a file is opened with here. With the kernel's writeback cache, the
    /// kernel reads pages to fill them (so a write-only open also reads) and places
    /// O_APPEND writes itself (so the client must not move them).
    fn kernel_flags(&self, f: OpenFlags) -> OpenFlags {
        if self.cfg.writeback_cache && f.write { OpenFlags { read: true, append: false, ..f } } else { f }
    }

    /// Open `fid` for the kernel: as [`Shared::kernel_flags`] says, falling back to the
    /// caller's own flags if reading is refused. The kernel checked the caller's
    /// permission (`default_permissions`) against attributes it holds under this mount's
    /// leases, so a small file the mount knows whole opens with no request.
    async fn open_file(&self, c: &Creds, fid: Fid, flags: OpenFlags) -> Result<File, Errno> {
        let k = self.kernel_flags(flags);
        match self.fs.open_permitted(c, fid, k).await {
            Err(e) if e.errno == errno::EACCES && k != flags => {
                self.fs.open(c, fid, OpenFlags { append: false, ..flags }).await.map_err(|e| err(&e))
            }
            r => r.map_err(|e| err(&e)),
        }
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<File>, Errno> {
        lock(&self.open).handles.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn entry(&self, a: &Attr) -> (FileAttr, Generation) {
        self.entry_after(a, 0)
    }

    /// The answer to a create, mkdir, symlink or link that made `name` of `dir` as `a`.
    fn made(self: &Arc<Self>, dir: Fid, name: &str, a: &Attr) -> impl FnOnce(ReplyEntry) + use<> {
        let (fa, g) = self.entry(a);
        self.entry_answer(dir, name, Some(a.fid), fa, g)
    }

    /// Answer with entry `name` of `dir` (leading to `fid`; none: missing), for as long as
    /// its leases say, decided under the lease gate.
    fn entry_answer(
        self: &Arc<Self>,
        dir: Fid,
        name: &str,
        fid: Option<Fid>,
        fa: FileAttr,
        g: Generation,
    ) -> impl FnOnce(ReplyEntry) + use<> {
        let (s, name) = (self.clone(), name.to_string());
        move |r: ReplyEntry| {
            let _gate = s.fs.lease_gate();
            r.entry(&s.entry_ttl(dir, &name, fid), &fa, g)
        }
    }

    /// Answer with `fid`'s attributes, for as long as its lease says, decided under the
    /// lease gate.
    fn attr_answer(self: &Arc<Self>, fid: Fid, fa: FileAttr) -> impl FnOnce(ReplyAttr) + use<> {
        let s = self.clone();
        move |r: ReplyAttr| {
            let _gate = s.fs.lease_gate();
            r.attr(&s.attr_ttl(fid), &fa)
        }
    }

    fn entry_after(&self, a: &Attr, before: u64) -> (FileAttr, Generation) {
        let ino = self.inodes.remember(a.fid);
        (self.file_attr_after(ino, a, before), Generation(u64::from(a.fid.ver)))
    }
}

/// The largest size the live write handles among `handles` know, and the time of the
/// last write through one of them (0: none), if there are any.
fn written(handles: &[Weak<File>]) -> Option<(u64, i64)> {
    let writers = handles.iter().filter_map(Weak::upgrade).filter(|f| f.flags().write);
    writers.map(|f| (f.size_hint(), f.written_at())).reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)))
}

/// The future that serves a request with `body` and answers it.
macro_rules! answering {
    ($self:ident, $reply:ident, |$s:ident| $body:expr) => {{
        let $s = $self.shared.clone();
        async move {
            let r: Result<_, Errno> = async { $body }.await;
            match r {
                Ok(answer) => answer($reply),
                Err(e) => $reply.error(e),
            }
        }
    }};
}

/// Serve a request and answer with its result: on the kernel reader thread that read it
/// when [`Nacre::here`] gives a slot, else in a task on the runtime.
macro_rules! serve {
    ($self:ident, $reply:ident, |$s:ident| $body:expr) => {{
        let answer = answering!($self, $reply, |$s| $body);
        $self.run(answer, true)
    }};
}

impl fuser::Filesystem for Nacre {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        let mut want = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            // fcntl and flock locks go to the MDS, which holds them between all mounts.
            | InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_FLOCK_LOCKS
            // POSIX ACLs: the kernel checks them (it reads them as xattrs); the MDT keeps
            // them, and applies a directory's default ACL or else the umask to what is
            // made (so the kernel leaves the umask to it).
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK;
        if self.shared.cfg.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        // Whatever the kernel lacks it goes without.
        for flag in want.iter() {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let c = self.shared.creds(req);
        // Fetched ahead: answered here, with no hop to the runtime.
        if let (Ok(dir), Ok(n)) = (self.shared.fid(parent), name_of(name)) {
            let _rt = self.rt.enter();
            if let Some(a) = self.shared.fs.lookup_ready(&c, dir, n) {
                let before = self.shared.dirty_size(a.fid);
                let (fa, g) = self.shared.entry_after(&a, before);
                let _gate = self.shared.fs.lease_gate();
                reply.entry(&self.shared.entry_ttl(dir, n, Some(a.fid)), &fa, g);
                return;
            }
        }
        let name = name.to_owned();
        serve!(self, reply, |s| {
            let dir = s.fid(parent)?;
            let before = s.dirty_sizes();
            let n = name_of(&name)?.to_string();
            let (fa, g, fid) = match s.fs.lookup(&c, dir, &n).await {
                Ok(a) => {
                    let (fa, g) = s.entry_after(&a, before.get(&a.fid).copied().unwrap_or(0));
                    (fa, g, Some(a.fid))
                }
                // A missing name is a negative entry: the kernel keeps it while leased, so a
                // create's lookup or a path search that misses asks once. This mount's own
                // create, link or rename over it replaces it at once; another mount's
                // revokes the lease.
                Err(e) if e.errno == errno::ENOENT => (negative_entry(), Generation(0), None),
                Err(e) => return Err(err(&e)),
            };
            Ok(s.entry_answer(dir, &n, fid, fa, g))
        })
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let c = self.shared.creds(req);
        serve!(self, reply, |s| {
            let fid = s.fid(ino)?;
            let before = s.dirty_size(fid);
            let a = match s.fs.fresh_dir_attr(fid) {
                Some(a) => a,
                None => match s.fs.getattr(&c, fid).await {
                    Ok(a) => a,
                    // A file another mount removed while open here with no request (the
                    // MDT keeps no orphan for a handle it never gave): as it was, with no
                    // link. (`fstat` names no handle.)
                    Err(e) if e.errno == libc::ENOENT || e.errno == libc::ESTALE => {
                        s.handles_of(fid).iter().find_map(|f| f.removed_attr()).ok_or_else(|| err(&e))?
                    }
                    Err(e) => return Err(err(&e)),
                },
            };
            let fa = s.file_attr_after(ino.0, &a, before);
            Ok(s.attr_answer(fid, fa))
        })
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode_bits: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let c = self.shared.creds(req);
        let mut sa = SetAttr::default();
        if let Some(m) = mode_bits {
            sa.mask |= set::MODE;
            sa.mode = m & mode::PERMS;
        }
        if let Some(u) = uid {
            sa.mask |= set::UID;
            sa.uid = u;
        }
        if let Some(g) = gid {
            sa.mask |= set::GID;
            sa.gid = g;
        }
        for (t, at, now, field) in [
            (atime, set::ATIME, set::ATIME_NOW, &mut sa.atime_ns),
            (mtime, set::MTIME, set::MTIME_NOW, &mut sa.mtime_ns),
        ] {
            match t {
                Some(TimeOrNow::Now) => sa.mask |= now,
                Some(TimeOrNow::SpecificTime(t)) => {
                    sa.mask |= at;
                    *field = nanos(t);
                }
                None => {}
            }
        }
        serve!(self, reply, |s| {
            let fid = s.fid(ino)?;
            if let Some(size) = size {
                // Dirty writes of any handle go first, so the cut is the last word.
                for h in s.handles_of(fid) {
                    h.share().await;
                }
                match fh.map(|fh| s.handle(fh)) {
                    Some(Ok(f)) if f.flags().write => f.set_len(size).await.map_err(|e| err(&e))?,
                    _ => {
                        let t = SetAttr { mask: set::SIZE, size, ..SetAttr::default() };
                        s.fs.setattr(&c, fid, t).await.map_err(|e| err(&e))?;
                    }
                }
                for h in s.handles_of(fid) {
                    h.resized(size).await;
                }
            }
            let mut sa = sa;
            if size.is_some() && sa.mask == set::MODE {
                // The kernel sends a truncate by someone without CAP_FSETID with the mode
                // less setuid and setgid (Linux's killpriv); the MDT's truncate did that
                // already, and a second change would be a chmod by a non-owner.
                let now = s.fs.getattr(&c, fid).await.map_err(|e| err(&e))?;
                if now.mode & mode::PERMS == sa.mode {
                    sa.mask = 0;
                }
            }
            let a = if sa.mask != 0 {
                s.fs.setattr(&c, fid, sa).await.map_err(|e| err(&e))?
            } else {
                s.fs.getattr(&c, fid).await.map_err(|e| err(&e))?
            };
            let mut fa = s.file_attr(ino.0, &a);
            if let Some(size) = size {
                fa.size = size;
            }
            Ok(s.attr_answer(fid, fa))
        })
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let c = self.shared.creds(req);
        serve!(self, reply, |s| {
            let target = s.fs.readlink(&c, s.fid(ino)?).await.map_err(|e| err(&e))?;
            Ok(move |r: ReplyData| r.data(&target))
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode_bits: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let c = Creds { umask: umask & 0o777, ..self.shared.creds(req) };
        let name = name.to_owned();
        serve!(self, reply, |s| {
            let (dir, name) = (s.fid(parent)?, name_of(&name)?);
            let a = match mode_bits & mode::S_IFMT {
                mode::S_IFREG => s.fs.create(&c, dir, name, mode_bits, None).await,
                // FIFOs, sockets and device nodes: the kernel serves their IO itself.
                _ => s.fs.mknod(&c, dir, name, mode_bits, rdev).await,
            }
            .map_err(|e| err(&e))?;
            Ok(s.made(dir, name, &a))
        })
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode_bits: u32, umask: u32, reply: ReplyEntry) {
        let c = Creds { umask: umask & 0o777, ..self.shared.creds(req) };
        let name = name.to_owned();
        serve!(self, reply, |s| {
            let (dir, name) = (s.fid(parent)?, name_of(&name)?);
            let a = s.fs.mkdir(&c, dir, name, mode_bits, -1, 0).await.map_err(|e| err(&e))?;
            Ok(s.made(dir, name, &a))
        })
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = self.shared.creds(req);
        let name = name.to_owned();
        serve!(self, reply, |s| {
            s.fs.unlink(&c, s.fid(parent)?, name_of(&name)?).await.map_err(|e| err(&e))?;
            Ok(|r: ReplyEmpty| r.ok())
        })
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = self.shared.creds(req);
        let name = name.to_owned();
        serve!(self, reply, |s| {
            s.fs.rmdir(&c, s.fid(parent)?, name_of(&name)?).await.map_err(|e| err(&e))?;
            Ok(|r: ReplyEmpty| r.ok())
        })
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let c = self.shared.creds(req);
        let (name, target) = (link_name.to_owned(), target.as_os_str().as_bytes().to_vec());
        serve!(self, reply, |s| {
            let (dir, name) = (s.fid(parent)?, name_of(&name)?);
            let a = s.fs.symlink(&c, dir, name, &target).await.map_err(|e| err(&e))?;
            Ok(s.made(dir, name, &a))
        })
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(!fuser::RenameFlags::RENAME_NOREPLACE) {
            // RENAME_EXCHANGE and RENAME_WHITEOUT are not supported.
            reply.error(Errno::EINVAL);
            return;
        }
        let noreplace = flags.contains(fuser::RenameFlags::RENAME_NOREPLACE);
        let c = self.shared.creds(req);
        let (name, newname) = (name.to_owned(), newname.to_owned());
        serve!(self, reply, |s| {
            let (src, dst) = (s.fid(parent)?, s.fid(newparent)?);
            s.fs.rename(&c, src, name_of(&name)?, dst, name_of(&newname)?, noreplace).await.map_err(|e| err(&e))?;
            Ok(|r: ReplyEmpty| r.ok())
        })
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let c = self.shared.creds(req);
        let name = newname.to_owned();
        serve!(self, reply, |s| {
            let (dir, name) = (s.fid(newparent)?, name_of(&name)?);
            let a = s.fs.link(&c, s.fid(ino)?, dir, name).await.map_err(|e| err(&e))?;
            Ok(s.made(dir, name, &a))
        })
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: fuser::OpenFlags, reply: ReplyOpen) {
        let c = self.shared.creds(req);
        let flags = OpenFlags::from_posix(flags.0);
        serve!(self, reply, |s| {
            let fid = s.fid(ino)?;
            for h in s.handles_of(fid) {
                // Close-to-open: what this mount wrote is on the servers first.
                h.share().await;
            }
            let f = s.open_file(&c, fid, flags).await?;
            if flags.truncate && flags.write {
                for h in s.handles_of(fid) {
                    h.resized(0).await;
                }
            }
            let mut how = fopen(flags, s.cfg.writeback_cache);
            let around = how.contains(FopenFlags::FOPEN_DIRECT_IO);
            let keep = s.cfg.leases && {
                let _gate = s.fs.lease_gate();
                s.pages.open(fid, f.opened_as(), s.fs.attr_leased(fid), flags.write, around)
            };
            let fh = s.add_handle(f);
            if keep {
                how |= FopenFlags::FOPEN_KEEP_CACHE;
            }
            Ok(move |r: ReplyOpen| r.opened(FileHandle(fh), how))
        })
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        // Bytes already here (a small file's, brought by its open): answered on the
        // kernel reader's thread, with no hop to the runtime.
        if let Ok(f) = self.shared.handle(fh)
            && let Some(data) = f.read_ready(offset, size as usize)
        {
            reply.data(&data);
            return;
        }
        serve!(self, reply, |s| {
            let f = s.handle(fh)?;
            // The file's write-behind is shared by its handles: the read sends what any of
            // them left dirty first.
            let data = f.read(offset, size as usize).await.map_err(|e| err(&e))?;
            Ok(move |r: ReplyData| r.data(&data))
        })
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: fuser::WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        // A direct write (O_DIRECT, O_APPEND) by someone without CAP_FSETID: the kernel
        // leaves dropping setuid and setgid to the file system.
        let kill_privs = write_flags.contains(fuser::WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        // A write the write-behind takes at once: answered on the kernel reader's thread,
        // with no hop to the runtime and back (ior-hard-write through the mount went from
        // 0.23-0.25 to 0.34-0.60 GiB/s, and from 0.35 to 0.98 of passthrough_hp's).
        if !kill_privs
            && let Ok(f) = self.shared.handle(fh)
            && let Some(n) = f.write_ready(offset, data)
        {
            reply.written(n as u32);
            return;
        }
        let data = data.to_vec();
        serve!(self, reply, |s| {
            let f = s.handle(fh)?;
            if kill_privs {
                f.kill_privs().await.map_err(|e| err(&e))?;
            }
            // The file's write-behind and read-ahead are shared by its handles: a write
            // over bytes another handle left dirty sends those first, and drops what any
            // handle read ahead. An append goes after all that the others wrote.
            let append = f.flags().append;
            let others: Vec<Arc<File>> = if append {
                let fid = s.fid(ino)?;
                s.handles_of(fid).into_iter().filter(|h| !Arc::ptr_eq(h, &f)).collect()
            } else {
                Vec::new()
            };
            if append {
                let end = others.iter().filter(|h| h.flags().write).map(|h| h.size_hint()).max().unwrap_or(0);
                f.grown(end).await;
            }
            let n = f.write(offset, &data).await.map_err(|e| err(&e))?;
            for h in &others {
                h.grown(f.size_hint()).await;
            }
            Ok(move |r: ReplyWrite| r.written(n as u32))
        })
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, lock_owner: fuser::LockOwner, reply: ReplyEmpty) {
        // Each close(2): the closing process's locks on the file go (POSIX: any close of
        // the file lets go of them all), and a descriptor open for writing is written
        // back, so the close reports a failed write. One open only for reading and without
        // locks has nothing to do (as NFS's flush): answered here, with no hop to the
        // runtime.
        let Ok(f) = self.shared.handle(fh) else {
            reply.error(Errno::EBADF);
            return;
        };
        let locked = self.shared.fs.holds_locks(f.fid(), lock_owner.0);
        if !f.flags().write && !locked {
            reply.ok();
            return;
        }
        serve!(self, reply, |s| {
            let f = s.handle(fh)?;
            if locked {
                f.unlock_all(lock_owner.0).await.map_err(|e| err(&e))?;
            }
            if f.flags().write {
                f.write_back().await.map_err(|e| err(&e))?;
            }
            Ok(|r: ReplyEmpty| r.ok())
        })
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: fuser::LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        serve!(self, reply, |s| {
            let f = s.handle(fh)?;
            let kind = lock_kind(typ)?;
            let found = f.test_lock(lock_owner.0, kind, start, end).await.map_err(|e| err(&e))?;
            let (typ, start, end, pid) = match found {
                Some((kind, start, end, pid)) => (i32::from(kind), start, end, pid),
                None => (libc::F_UNLCK, start, end, 0),
            };
            Ok(move |r: ReplyLock| r.locked(start, end, typ, pid))
        })
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: fuser::LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let answer = answering!(self, reply, |s| {
            let f = s.handle(fh)?;
            let kind = lock_kind(typ)?;
            f.lock(lock_owner.0, pid, kind, start, end, sleep).await.map_err(|e| err(&e))?;
            Ok(|r: ReplyEmpty| r.ok())
        });
        // A lock that waits for its holder may wait for as long as the holder keeps it.
        self.run(answer, !sleep)
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        serve!(self, reply, |s| {
            let f = lock(&s.open).handles.remove(&fh.0).ok_or(Errno::EBADF)?;
            // The last close of an open file: its flock locks go (the kernel names their
            // owner here).
            if let Some(owner) = lock_owner
                && s.fs.holds_locks(f.fid(), owner.0)
                && let Err(e) = f.unlock_all(owner.0).await
            {
                eprintln!("nacre-fuse: letting go of the locks of {}: {e}", f.fid());
            }
            let (fid, closed) = (f.fid(), f.close().await);
            if f.flags().write && s.cfg.leases {
                // What it wrote went through the kernel's pages (unless it wrote around
                // them): they hold the file as the close left it.
                let vouched = {
                    let _gate = s.fs.lease_gate();
                    s.pages.written(fid, f.closed_as(), s.fs.attr_leased(fid))
                };
                // All but a last page written in part: a small file the mount now knows
                // whole has it stored too, so the next open here reads nothing (a
                // 3,901-byte file is otherwise read once, for that page). Should the lease
                // go meanwhile, the next open drops the pages anyway.
                if vouched
                    && let (Some(bytes), Some(ino), Some(n)) =
                        (f.closed_whole(), s.inodes.ino_of(fid), s.notifier.get())
                    && bytes.len() % PAGE_BYTES != 0
                {
                    let last = bytes.len() / PAGE_BYTES * PAGE_BYTES;
                    let _ = n.store(INodeNo(ino), last as u64, &bytes[last..]);
                }
            }
            let this = Arc::as_ptr(&f);
            drop(f);
            // Only open files stay listed by FID (every attribute answer walks them): this
            // handle goes even if a request still holds it for a moment.
            {
                let mut o = lock(&s.open);
                if let Some(v) = o.by_fid.get_mut(&fid) {
                    v.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), this));
                    if v.is_empty() {
                        o.by_fid.remove(&fid);
                        s.pages.closed_all(fid);
                    }
                }
            }
            closed.map_err(|e| err(&e))?;
            Ok(|r: ReplyEmpty| r.ok())
        })
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        serve!(self, reply, |s| {
            s.handle(fh)?.fsync().await.map_err(|e| err(&e))?;
            Ok(|r: ReplyEmpty| r.ok())
        })
    }

    /// The directory's entries are made by its MDT, which answers before they are on its
    /// drives: wait for the commit. (`syncfs` does not reach a FUSE file system; the MDT
    /// commits every `commit_interval_ms` anyway.)
    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        serve!(self, reply, |s| {
            let dir = s.fid(ino)?;
            s.fs.commit_fid(dir).await.map_err(|e| err(&e))?;
            Ok(|r: ReplyEmpty| r.ok())
        })
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        let c = self.shared.creds(req);
        serve!(self, reply, |s| {
            let dir = s.fid(ino)?;
            let (dots, entries, _) = s.list(&c, dir, offset).await?;
            let mut out = Vec::new();
            for (name, off) in dots {
                out.push((INodeNo(ino.0), off, FileType::Directory, name.to_string()));
            }
            for (e, _) in entries {
                let i = s.inodes.peek_or_temp(e.fid);
                out.push((INodeNo(i), e.cookie, kind(e.kind), e.name));
            }
            Ok(move |mut r: ReplyDirectory| {
                for (i, off, k, name) in out {
                    if r.add(i, off, k, name) {
                        break;
                    }
                }
                r.ok()
            })
        })
    }

    fn readdirplus(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        let c = self.shared.creds(req);
        serve!(self, reply, |s| {
            let dir = s.fid(ino)?;
            let before = s.dirty_sizes();
            let (dots, entries, _) = s.list(&c, dir, offset).await?;
            let here = s.fs.getattr(&c, dir).await.map_err(|e| err(&e))?;
            let s2 = s.clone();
            Ok(move |mut r: ReplyDirectoryPlus| {
                let _gate = s2.fs.lease_gate();
                let dot = s2.file_attr(ino.0, &here);
                for (name, off) in dots {
                    // The dots carry no lookup reference: inode 0 tells the kernel so.
                    let mut a = dot;
                    a.ino = INodeNo(0);
                    if r.add(INodeNo(0), off, name, &Duration::ZERO, &a, Generation(0)) {
                        r.ok();
                        return;
                    }
                }
                for (e, a) in entries {
                    // A remote entry's attributes are on its own MDT: the kernel looks it up.
                    let ttl = if a.nlink == 0 { Duration::ZERO } else { s2.entry_ttl(dir, &e.name, Some(e.fid)) };
                    let i = s2.inodes.remember(e.fid);
                    let fa = s2.file_attr_after(i, &a, before.get(&a.fid).copied().unwrap_or(0));
                    if r.add(INodeNo(i), e.cookie, &e.name, &ttl, &fa, Generation(u64::from(e.fid.ver))) {
                        // Not sent: give the reference back.
                        s2.inodes.forget(i, 1);
                        break;
                    }
                }
                r.ok()
            })
        })
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let c = self.shared.creds(req);
        serve!(self, reply, |s| {
            let st = s.fs.statfs(&c).await.map_err(|e| err(&e))?;
            let bsize = 4096u64;
            let mdt_free: u64 =
                st.targets.iter().filter(|t| t.kind == nacre_proto::mgs::TargetKind::Mdt).map(|t| t.bytes_free).sum();
            // An inode costs the MDT about 1 KiB.
            let ffree = mdt_free / 1024;
            Ok(move |r: ReplyStatfs| {
                r.statfs(
                    st.bytes_total / bsize,
                    st.bytes_free / bsize,
                    st.bytes_free / bsize,
                    st.inodes + ffree,
                    ffree,
                    bsize as u32,
                    nacre_proto::mdt::NAME_MAX as u32,
                    bsize as u32,
                )
            })
        })
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let c = self.shared.creds(req);
        let (name, value) = (name.to_owned(), value.to_vec());
        if let Some(n) = name.to_str() {
            self.shared.absent.changed(ino.0, n);
        }
        let mut f = 0;
        if flags & libc::XATTR_CREATE != 0 {
            f |= xattr::CREATE;
        }
        if flags & libc::XATTR_REPLACE != 0 {
            f |= xattr::REPLACE;
        }
        serve!(self, reply, |s| {
            let fid = s.fid(ino)?;
            let name = name_of(&name)?;
            if name == LAYOUT_XATTR {
                // A directory's default layout; a file's layout is fixed at create.
                let a = s.fs.getattr(&c, fid).await.map_err(|e| err(&e))?;
                if !mode::is_dir(a.mode) {
                    return Err(Errno::EPERM);
                }
                let l = Layout::decode(&value).map_err(|_| Errno::EINVAL)?;
                s.fs.set_dir_layout(&c, fid, Some(&l)).await.map_err(|e| err(&e))?;
            } else {
                s.fs.setxattr(&c, fid, name, &value, f).await.map_err(|e| err(&e))?;
                // Again once set: a miss answered meanwhile must not stay.
                s.absent.changed(ino.0, name);
            }
            Ok(|r: ReplyEmpty| r.ok())
        })
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        // Known missing: answered here, with no request to the MDT.
        if name.to_str().is_some_and(|n| self.shared.absent.is_absent(ino.0, n)) {
            reply.error(Errno::ENODATA);
            return;
        }
        let c = self.shared.creds(req);
        let name = name.to_owned();
        serve!(self, reply, |s| {
            let fid = s.fid(ino)?;
            let name = name_of(&name)?;
            let value = if name == LAYOUT_XATTR {
                match s.fs.getlayout(&c, fid).await.map_err(|e| err(&e))? {
                    Some(l) => l.layout.encode(),
                    None => return Err(Errno::ENODATA),
                }
            } else {
                match s.fs.getxattr(&c, fid, name).await {
                    Ok(v) => v,
                    Err(e) if e.errno == errno::ENODATA => {
                        s.absent.absent(ino.0, name, ABSENT_TTL);
                        return Err(Errno::ENODATA);
                    }
                    Err(e) => return Err(err(&e)),
                }
            };
            xattr_answer(value, size)
        })
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let c = self.shared.creds(req);
        serve!(self, reply, |s| {
            let names = s.fs.listxattr(&c, s.fid(ino)?).await.map_err(|e| err(&e))?;
            let mut value = Vec::new();
            for n in names {
                value.extend_from_slice(n.as_bytes());
                value.push(0);
            }
            xattr_answer(value, size)
        })
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = self.shared.creds(req);
        let name = name.to_owned();
        if let Some(n) = name.to_str() {
            self.shared.absent.changed(ino.0, n);
        }
        serve!(self, reply, |s| {
            s.fs.removexattr(&c, s.fid(ino)?, name_of(&name)?).await.map_err(|e| err(&e))?;
            Ok(|r: ReplyEmpty| r.ok())
        })
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode_bits: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let c = Creds { umask: umask & 0o777, ..self.shared.creds(req) };
        let name = name.to_owned();
        let open = OpenFlags::from_posix(flags);
        serve!(self, reply, |s| {
            let dir = s.fid(parent)?;
            let name = name_of(&name)?;
            // Made and opened in one request.
            let (a, f, made) = match s.fs.create_open(&c, dir, name, mode_bits, None, s.kernel_flags(open)).await {
                Ok((a, f)) => (a, f, true),
                // Made meanwhile by someone else: without O_EXCL that is an open.
                Err(e) if e.errno == errno::EEXIST && flags & libc::O_EXCL == 0 => {
                    let a = s.fs.lookup(&c, dir, name).await.map_err(|e| err(&e))?;
                    (a, s.open_file(&c, a.fid, open).await?, false)
                }
                Err(e) => return Err(err(&e)),
            };
            let how = fopen(open, s.cfg.writeback_cache);
            if s.cfg.leases {
                // Never keeps pages: a new file has none, and a found one's entry goes
                // if this opens it for writing.
                let _gate = s.fs.lease_gate();
                let around = how.contains(FopenFlags::FOPEN_DIRECT_IO);
                s.pages.open(a.fid, f.opened_as(), false, open.write, around);
            }
            let fh = s.add_handle(f);
            let (fa, g) = s.entry(&a);
            if made {
                // Made with no xattrs: its writes need not ask for file capabilities.
                s.absent.absent(fa.ino.0, CAPS_XATTR, ABSENT_TTL);
            }
            let (s, name) = (s.clone(), name.to_string());
            Ok(move |r: ReplyCreate| {
                let _gate = s.fs.lease_gate();
                r.created(&s.entry_ttl(dir, &name, Some(a.fid)), &fa, g, FileHandle(fh), how)
            })
        })
    }
}

/// The answer to a lookup of a missing name that the kernel caches (inode 0).
fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// A lock kind of [`lock`] from the kernel's `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
fn lock_kind(typ: i32) -> Result<u8, Errno> {
    match typ {
        libc::F_RDLCK => Ok(lock::READ),
        libc::F_WRLCK => Ok(lock::WRITE),
        libc::F_UNLCK => Ok(lock::UNLOCK),
        _ => Err(Errno::EINVAL),
    }
}

/// How the kernel treats an open file: O_DIRECT bypasses its page cache too. So does
/// O_APPEND (unless the kernel places appends itself, `writeback_cache`): through the
/// page cache the kernel cuts a write that crosses a page into two requests, and each
/// would be appended on its own, so another mount's append could land between them;
/// direct, one write(2) of up to 1 MiB is one request, appended whole.
fn fopen(flags: OpenFlags, writeback_cache: bool) -> FopenFlags {
    if flags.direct || (flags.append && !writeback_cache) { FopenFlags::FOPEN_DIRECT_IO } else { FopenFlags::empty() }
}

/// A getxattr/listxattr answer: the size when asked with size 0, the value if it fits,
/// ERANGE if not.
#[allow(clippy::type_complexity)]
fn xattr_answer(value: Vec<u8>, size: u32) -> Result<Box<dyn FnOnce(ReplyXattr) + Send>, Errno> {
    if size == 0 {
        let n = value.len() as u32;
        return Ok(Box::new(move |r: ReplyXattr| r.size(n)));
    }
    if value.len() > size as usize {
        return Err(Errno::ERANGE);
    }
    Ok(Box::new(move |r: ReplyXattr| r.data(&value)))
}

/// Directory offsets the kernel resumes from: 1 after ".", 2 after "..", else an entry's
/// cookie (a 63-bit name hash).
const AFTER_DOT: u64 = 1;
const AFTER_DOTDOT: u64 = 2;

impl Shared {
    /// The dots still to list and a page of entries, from kernel offset `offset`.
    #[allow(clippy::type_complexity)]
    async fn list(
        &self,
        c: &Creds,
        dir: Fid,
        offset: u64,
    ) -> Result<(Vec<(&'static str, u64)>, Vec<(nacre_client::DirEntry, Attr)>, bool), Errno> {
        let mut dots = Vec::new();
        if offset < AFTER_DOT {
            dots.push((".", AFTER_DOT));
        }
        if offset < AFTER_DOTDOT {
            dots.push(("..", AFTER_DOTDOT));
        }
        let cookie = if offset <= AFTER_DOTDOT { 0 } else { offset };
        let (entries, eof) = self.fs.readdir(c, dir, cookie, 256).await.map_err(|e| err(&e))?;
        Ok((dots, entries, eof))
    }
}
