//! A mounted file system: the links to its MGS, MDTs and OSTs, and every metadata
//! operation, routed to the MDT that owns the FID (or, in a striped directory, the shard
//! that owns the name).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::nid::{Nid, NidList};
use nacre_net::rpc::SplitMix;
use nacre_net::transport::{TcpTransport, Transport};
use nacre_proto::dne::{DirDefault, DirStripe};
use nacre_proto::fid::Fid;
use nacre_proto::layout::Layout;
use nacre_proto::mdt::{
    Attr, Creds, DirEntry, LOOKUP_MANY_MAX, Looked, READDIR_MAX, Reply, Request, SetAttr, lock, mode, set,
};
use nacre_proto::mgs::{Config, TargetKind};
use nacre_proto::{mgs, ost};

use crate::cache::Caches;
use crate::error::{Error, Result, errno};
use crate::file::{File, OpenFlags};
use crate::leases::Leases;
use crate::params::{Budget, Params, Tunables};
use crate::statahead::{Fetch, Probe, Statahead, WAIT_MAX};
use crate::striping::FileLayout;
use crate::whole::WholeFiles;
use nacre_proto::mdt::lease::Key as LeaseKey;

/// Resends of one request of a mount before the program's call fails (see
/// [`MountOptions::default`]).
pub const RECOVERABLE_RESENDS: u32 = 60;

/// How to mount.
#[derive(Clone)]
pub struct MountOptions {
    /// The network (TCP unless a test gives an in-memory one).
    pub transport: Arc<dyn Transport>,
    /// The transport's settings of this client.
    pub net: ClientConfig,
    pub tunables: Tunables,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        // The client gates RPCs per OST itself (`max_rpcs_in_flight`, changeable while
        // mounted); the transport's own gate is only a ceiling. A target may fail over
        // to its partner: a request waits that out (each try of an unreachable server
        // waits a deadline, `at_min` at least, so about five minutes in all), as
        // Lustre's recoverable imports do, instead of failing the program's call.
        let net = ClientConfig {
            max_rpcs_in_flight: 256,
            peer_credits: 256,
            max_resends: RECOVERABLE_RESENDS,
            ..ClientConfig::default()
        };
        MountOptions { transport: Arc::new(TcpTransport), net, tunables: Tunables::default() }
    }
}

/// One target as the MGS described it, and the link to it once made.
struct Link {
    /// Every NID it may be served at, never empty, the one the MGS says it is served at
    /// now first: the import walks them when it cannot reach the target (a failover the
    /// MGS has not told of, or with the MGS gone too).
    nids: Vec<Nid>,
    import: Option<Arc<Import>>,
    /// RPCs in flight to it (`max_rpcs_in_flight`).
    gate: Arc<Budget>,
}

#[derive(Default)]
struct Targets {
    version: u64,
    mdts: BTreeMap<u32, Link>,
    osts: BTreeMap<u32, Link>,
}

/// Entries a cache of directory stripes or file layouts keeps before it starts over.
const CACHE_MAX: usize = 65_536;
/// How long a request refused with EINPROGRESS (an MDT busy finishing operations over
/// several MDTs) is retried.
const INPROGRESS_RETRY: Duration = Duration::from_secs(60);
/// How long a revocation waits for the caches it voids to be invalidated before it is
/// acknowledged anyway: an invalidation of the kernel's entries waits for the
/// directory's lock, which a change of this mount may hold while the MDT waits for
/// another mount, whose own change waits for this one.
const INVALIDATE_WAIT: Duration = Duration::from_millis(100);

/// Told of leases given up (revoked, or voided by an eviction or an MDT restart), to
/// drop what was cached under them: a FUSE mount invalidates the kernel's entries and
/// attributes. Runs on a blocking thread.
pub type Revoker = Arc<dyn Fn(Vec<LeaseKey>) + Send + Sync>;

pub(crate) struct Inner {
    pub(crate) client: Client,
    fsname: String,
    /// The MGS's NIDs, tried in turn (a failover pair's).
    mgs: NidList,
    targets: RwLock<Targets>,
    pub(crate) params: Params,
    stripes: Mutex<HashMap<Fid, Option<Arc<DirStripe>>>>,
    layouts: Mutex<HashMap<Fid, Arc<FileLayout>>>,
    /// Directories' attributes as this mount's last unlink in each left them, each
    /// answered once (see [`FileSystem::fresh_dir_attr`]).
    dir_attrs: Mutex<HashMap<Fid, Attr>>,
    /// Files open for writing through this mount, with their handles' count: their size
    /// is glimpsed from the objects.
    writers: Mutex<HashMap<Fid, usize>>,
    /// The byte-range locks this mount's owners hold, and those the MDS holds for them,
    /// by file (see [`crate::locks`]).
    pub(crate) locks: Mutex<HashMap<Fid, crate::locks::FileLocks>>,
    /// Per file, held while its size changes (a truncate, or a close publishing the size
    /// the objects give), so a close cannot publish a size read before a truncate.
    sizing: Mutex<HashMap<Fid, Arc<tokio::sync::Mutex<()>>>>,
    /// Read-ahead chunks of the files open here, shared by each file's handles.
    pub(crate) caches: Caches,
    /// Small files known whole, whose opens for reading need no request.
    pub(crate) whole: WholeFiles,
    /// Attributes fetched ahead of numbered lookups.
    statahead: Statahead,
    /// Changes this mount sent to the MDTs, counted as each goes out and as it comes
    /// back: a statahead answer fetched across a change is not used.
    changes: AtomicU64,
    follower: Mutex<Option<tokio::task::AbortHandle>>,
    /// The next key of lock state kept for replay (and of lock requests in flight).
    pub(crate) lock_keys: AtomicU64,
    /// The leases held, once [`FileSystem::start_leases`] listens for callbacks.
    pub(crate) leases: Leases,
    pub(crate) revoker: std::sync::OnceLock<Revoker>,
    /// The append locks this mount keeps (see `lock::CACHE`), per file: the handle that
    /// took it, while kept. Its appends go one at a time under the slot.
    appends: Mutex<HashMap<Fid, Arc<tokio::sync::Mutex<Option<u64>>>>>,
    lease_pollers: Mutex<Vec<tokio::task::AbortHandle>>,
}

/// A mounted Nacre file system. Cheap to clone; all clones share the links and caches.
#[derive(Clone)]
pub struct FileSystem {
    pub(crate) inner: Arc<Inner>,
}

/// Space and inodes of the file system, and of each target (`lfs df`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatFs {
    pub bytes_total: u64,
    pub bytes_free: u64,
    pub inodes: u64,
    pub targets: Vec<TargetUsage>,
}

/// One target's line of `nacre df`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetUsage {
    /// `fsname-MDT0000`, `fsname-OST0001`.
    pub name: String,
    pub kind: TargetKind,
    pub index: u32,
    pub bytes_total: u64,
    pub bytes_used: u64,
    pub bytes_free: u64,
    /// Inodes (MDT) or objects (OST) in use.
    pub inodes: u64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Names of one request to a lookup-many, at most: a request body holds 64 KiB.
const LOOKUP_MANY_BYTES: usize = 32 << 10;

/// `idx` (indices into `names`) cut into requests of at most [`LOOKUP_MANY_MAX`] names
/// and [`LOOKUP_MANY_BYTES`] of them.
fn lookup_parts<'i>(idx: &'i [usize], names: &[String]) -> Vec<&'i [usize]> {
    let mut parts = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (k, &i) in idx.iter().enumerate() {
        let b = names[i].len() + 4;
        if k > start && (k - start == LOOKUP_MANY_MAX || bytes + b > LOOKUP_MANY_BYTES) {
            parts.push(&idx[start..k]);
            (start, bytes) = (k, 0);
        }
        bytes += b;
    }
    if start < idx.len() {
        parts.push(&idx[start..]);
    }
    parts
}

/// Counts a change as it goes out and again when it is done (or abandoned), so that
/// anything read while it was in flight can tell.
struct ChangeCount<'a>(&'a AtomicU64);

impl<'a> ChangeCount<'a> {
    fn new(n: &'a AtomicU64) -> ChangeCount<'a> {
        n.fetch_add(1, Ordering::AcqRel);
        ChangeCount(n)
    }
}

impl Drop for ChangeCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// `f` of reply `r` to a `what`, or an error naming the kind of reply that came instead.
/// (Only its kind: describing the whole reply on every call cost more than many a call.)
fn expect<T>(what: &str, r: Reply, f: impl FnOnce(Reply) -> Option<T>) -> Result<T> {
    let kind = reply_kind(&r);
    f(r).ok_or_else(|| Error::protocol(what, format!("unexpected reply: {kind}")))
}

fn reply_kind(r: &Reply) -> &'static str {
    match r {
        Reply::Attr(_) => "attributes",
        Reply::Writing(_) => "attributes of a file being written",
        Reply::Entries { .. } => "directory entries",
        Reply::Bytes(_) => "bytes",
        Reply::Names(_) => "names",
        Reply::Opened { .. } => "an open handle",
        Reply::StatFs { .. } => "file system usage",
        Reply::Done => "done",
        Reply::Layout { .. } => "a layout",
        Reply::DirStripe { .. } => "directory stripes",
        Reply::Looked(_) => "lookup answers",
        Reply::Lock { .. } => "a lock",
        Reply::Revoked(_) => "lease revocations",
        Reply::Created { .. } => "a new file and its objects",
    }
}

fn attr_of(what: &str, r: Reply) -> Result<Attr> {
    attr_writing(what, r).map(|(a, _)| a)
}

/// Attributes, and whether the MDT says some client has the file open for writing.
fn attr_writing(what: &str, r: Reply) -> Result<(Attr, bool)> {
    expect(what, r, |r| match r {
        Reply::Attr(a) | Reply::Created { attr: a, .. } => Some((a, false)),
        Reply::Writing(a) => Some((a, true)),
        _ => None,
    })
}

impl FileSystem {
    /// Mount the file system whose MGS is at `mgs` (one NID, or the list of a failover
    /// pair's, tried in turn): fetch its configuration, check that MDT 0 answers, and
    /// follow the configuration from then on (new targets, `set-param -P` values for the
    /// client).
    pub async fn mount(mgs: impl Into<NidList>, opts: MountOptions) -> Result<FileSystem> {
        let mgs = &mgs.into();
        let client = Client::new(opts.transport.clone(), opts.net.clone());
        let cfg = fetch_config(&client, mgs, 0, 0).await?;
        let inner = Arc::new(Inner {
            client,
            fsname: cfg.fsname.clone(),
            mgs: mgs.clone(),
            targets: RwLock::new(Targets::default()),
            params: Params::new(&opts.tunables),
            stripes: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
            dir_attrs: Mutex::new(HashMap::new()),
            writers: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            sizing: Mutex::new(HashMap::new()),
            caches: Caches::default(),
            whole: WholeFiles::default(),
            statahead: Statahead::default(),
            changes: AtomicU64::new(0),
            lock_keys: AtomicU64::new(0),
            follower: Mutex::new(None),
            leases: Leases::default(),
            revoker: std::sync::OnceLock::new(),
            appends: Mutex::new(HashMap::new()),
            lease_pollers: Mutex::new(Vec::new()),
        });
        let fs = FileSystem { inner };
        fs.apply_config(&cfg);
        if !fs.inner.targets.read().unwrap_or_else(|e| e.into_inner()).mdts.contains_key(&0) {
            return Err(Error::new(
                errno::ENODEV,
                format!("file system {} has no MDT 0 registered with the MGS at {mgs}", cfg.fsname),
            ));
        }
        fs.getattr(&Creds::default(), Fid::ROOT).await?;
        let weak = Arc::downgrade(&fs.inner);
        let task = tokio::spawn(follow_config(weak, cfg.version));
        *lock(&fs.inner.follower) = Some(task.abort_handle());
        Ok(fs)
    }

    /// The file system's name.
    pub fn fsname(&self) -> &str {
        &self.inner.fsname
    }

    /// Leave: write back what is dirty is the caller's job (close every file first);
    /// this tells every server the client is gone.
    pub async fn unmount(&self) {
        if let Some(t) = lock(&self.inner.follower).take() {
            t.abort();
        }
        for t in lock(&self.inner.lease_pollers).drain(..) {
            t.abort();
        }
        let imports: Vec<Arc<Import>> = {
            let t = self.inner.targets.read().unwrap_or_else(|e| e.into_inner());
            t.mdts.values().chain(t.osts.values()).filter_map(|l| l.import.clone()).collect()
        };
        for i in imports {
            let _ = i.disconnect().await;
        }
    }

    fn apply_config(&self, cfg: &Config) {
        let rpcs = self.inner.params.rpcs_in_flight.load(Ordering::Relaxed);
        {
            let mut t = self.inner.targets.write().unwrap_or_else(|e| e.into_inner());
            t.version = cfg.version;
            for e in &cfg.targets {
                let nids: Vec<Nid> = e.nids.iter().filter_map(|n| n.parse::<Nid>().ok()).collect();
                let Some(nid) = nids.first() else { continue };
                let map = match e.kind {
                    TargetKind::Mdt => &mut t.mdts,
                    TargetKind::Ost => &mut t.osts,
                };
                match map.get_mut(&e.index) {
                    Some(l) => {
                        if let Some(i) = &l.import {
                            i.set_nids(nids.clone());
                            // Restarted elsewhere: the same import follows it, with what
                            // it kept for replay (a target recovering there waits for it).
                            if l.nids.first() != Some(nid) {
                                i.retarget(nid);
                            }
                        }
                        l.nids = nids;
                    }
                    None => {
                        map.insert(e.index, Link { nids, import: None, gate: Arc::new(Budget::new(rpcs)) });
                    }
                }
            }
        }
        for (name, value) in &cfg.params {
            // `set-param -P osc.*.max_rpcs_in_flight=16`: the client's knobs.
            if let Some((scope, knob)) = client_knob(name) {
                let _ = self.set_knob(scope, knob, value);
            }
        }
    }

    /// The link to target `index` of `kind`, and its RPC gate; made at first use.
    pub(crate) async fn target_link(&self, kind: TargetKind, index: u32) -> Result<(Arc<Import>, Arc<Budget>)> {
        let nids = {
            let t = self.inner.targets.read().unwrap_or_else(|e| e.into_inner());
            let map = if kind == TargetKind::Mdt { &t.mdts } else { &t.osts };
            let Some(l) = map.get(&index) else {
                return Err(Error::new(
                    errno::ENODEV,
                    format!("{} is not in the file system's configuration", kind.name(&self.inner.fsname, index)),
                ));
            };
            if let Some(i) = &l.import {
                return Ok((i.clone(), l.gate.clone()));
            }
            l.nids.clone()
        };
        let name = kind.name(&self.inner.fsname, index);
        let import = self.inner.client.connect_any(&name, &nids).await.map_err(|e| Error::rpc(&name, e))?;
        let mut t = self.inner.targets.write().unwrap_or_else(|e| e.into_inner());
        let map = if kind == TargetKind::Mdt { &mut t.mdts } else { &mut t.osts };
        match map.get_mut(&index) {
            // The first NID is where the MGS said it was when we began.
            Some(l) if l.nids.first() == nids.first() => {
                l.import = Some(import.clone());
                Ok((import, l.gate.clone()))
            }
            _ => Err(Error::new(errno::ENOTCONN, format!("{name} moved while connecting; try again"))),
        }
    }

    /// Indices of the MDTs and OSTs the configuration lists.
    pub fn targets(&self) -> (Vec<u32>, Vec<u32>) {
        let t = self.inner.targets.read().unwrap_or_else(|e| e.into_inner());
        (t.mdts.keys().copied().collect(), t.osts.keys().copied().collect())
    }

    /// Send `r` to MDT `mdt`: the reply, and the bulk that came with it. A request the MDT
    /// refuses with EINPROGRESS (busy with operations over several MDTs) is sent again.
    pub(crate) async fn md(
        &self,
        mdt: u32,
        c: &Creds,
        r: &Request,
        bulk: &[u8],
    ) -> Result<(Reply, nacre_net::bulk::Bulk)> {
        let (import, _) = self.target_link(TargetKind::Mdt, mdt).await?;
        let (op, body) = r.encode(c);
        // A close changes no attributes a lookup answers (statahead keeps no file open
        // for writing), so it is not counted.
        let counted = r.is_change() && !matches!(r, Request::Close { .. });
        let _change = counted.then(|| ChangeCount::new(&self.inner.changes));
        let started = tokio::time::Instant::now();
        let mut wait = Duration::from_millis(5);
        loop {
            let asked = self.inner.revoker.get().map(|_| self.inner.leases.ask(import.restarts()));
            let f = import
                .call(op, &body, bulk)
                .await
                .map_err(|e| Error::rpc(&TargetKind::Mdt.name(&self.inner.fsname, mdt), e))?;
            // Keep the leases the reply granted (see `nacre_proto::mdt::lease::granted`).
            let leased = f.header.flags & nacre_net::frame::flags::LEASED != 0;
            let keep = |answer: std::result::Result<&Reply, i32>| {
                if let (Some(asked), true) = (asked, leased) {
                    let keys = nacre_proto::mdt::lease::granted(r, answer);
                    if !keys.is_empty() {
                        self.inner.leases.granted(mdt, asked, import.restarts(), keys);
                    }
                }
            };
            if f.header.status == -errno::EINPROGRESS && started.elapsed() < INPROGRESS_RETRY {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(500));
                continue;
            }
            if let Request::Close { handle } = r {
                // Closed (or refused): no more replay of its open.
                import.forget_open(*handle);
            }
            if f.header.status != 0 {
                keep(Err(-f.header.status));
                return Err(Error::from_reply(f.header.status, &f.body));
            }
            let reply = Reply::decode(&f.body).map_err(|e| Error::protocol("MDS reply", e))?;
            keep(Ok(&reply));
            if let Reply::Opened { handle, .. } = &reply {
                // Replayed after an MDS restart for as long as the file is open.
                import.keep_open(*handle, op, &body, &f);
            }
            return Ok((reply, f.bulk));
        }
    }

    /// Listen for the MDTs' lease callbacks: from now on reads are granted leases, and
    /// `revoker` is told of each one given up. Once; a second call changes nothing.
    pub fn start_leases(&self, revoker: Revoker) {
        if self.inner.revoker.set(revoker).is_err() {
            return;
        }
        let (mdts, _) = self.targets();
        let mut pollers = lock(&self.inner.lease_pollers);
        for mdt in mdts {
            let weak = Arc::downgrade(&self.inner);
            pollers.push(tokio::spawn(poll_leases(weak, mdt)).abort_handle());
        }
    }

    /// Does this mount hold a lease on `fid`'s attributes (so may answer them from a
    /// cache until told otherwise)?
    pub fn attr_leased(&self, fid: Fid) -> bool {
        self.inner.leases.holds(&LeaseKey::Attr(fid))
    }

    /// Does this mount hold a lease on what `name` of `dir` leads to (or that it leads
    /// nowhere)? In a striped directory the name's shard holds it.
    pub fn name_leased(&self, dir: Fid, name: &str) -> bool {
        let at = match lock(&self.inner.stripes).get(&dir) {
            Some(Some(s)) => s.shards[s.shard_of(name)],
            _ => dir,
        };
        self.inner.leases.holds(&LeaseKey::Name(at, name.to_string()))
    }

    /// Held (shared) from a lease check to the answer made under it, so no such answer
    /// reaches the kernel after the lease's revocation was acted on.
    pub fn lease_gate(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.inner.leases.gate()
    }

    /// Give up what this mount cached under `keys`: its own caches at once, then the
    /// revoker's (a FUSE mount's kernel), waiting for those at most [`INVALIDATE_WAIT`].
    async fn given_up(&self, keys: Vec<LeaseKey>) {
        if keys.is_empty() {
            return;
        }
        // Statahead answers fetched before this are not used.
        self.inner.changes.fetch_add(2, Ordering::AcqRel);
        for k in &keys {
            match k {
                LeaseKey::Append(f) => self.release_append(*f, None).await,
                LeaseKey::Locks(f) => self.locks_called_back(*f).await,
                _ => {}
            }
        }
        {
            let (mut dirs, mut layouts, mut stripes) =
                (lock(&self.inner.dir_attrs), lock(&self.inner.layouts), lock(&self.inner.stripes));
            for k in &keys {
                if let LeaseKey::Attr(f) = k {
                    dirs.remove(f);
                    layouts.remove(f);
                    stripes.remove(f);
                    self.inner.whole.forget(*f);
                    self.inner.caches.changed_elsewhere(*f);
                }
            }
        }
        let Some(r) = self.inner.revoker.get().cloned() else { return };
        let job = tokio::task::spawn_blocking(move || r(keys));
        let _ = tokio::time::timeout(INVALIDATE_WAIT, job).await;
    }

    /// Make this client's changes on MDT `mdt` durable: the MDT answers changes before
    /// they are on its drives, so `fsync` of a file or a directory waits for its commit.
    /// Nothing is sent when the MDT has committed all of them already.
    pub async fn commit_mdt(&self, mdt: u32) -> Result<()> {
        let (import, _) = self.target_link(TargetKind::Mdt, mdt).await?;
        if import.uncommitted() > 0 {
            import.commit().await.map_err(|e| Error::rpc(&TargetKind::Mdt.name(&self.inner.fsname, mdt), e))?;
        }
        Ok(())
    }

    /// One ping RPC to MDT `mdt` (a bench's reference for the cost of a request).
    pub async fn ping_mdt(&self, mdt: u32) -> Result<()> {
        let (import, _) = self.target_link(TargetKind::Mdt, mdt).await?;
        import.ping().await.map_err(|e| Error::rpc(&TargetKind::Mdt.name(&self.inner.fsname, mdt), e))
    }

    /// [`Fs::commit_mdt`] for the MDT that owns `fid`.
    pub async fn commit_fid(&self, fid: Fid) -> Result<()> {
        self.commit_mdt(mdt_of(fid)?).await
    }

    /// Send `r` to the MDT that owns `fid`.
    async fn md_at(&self, fid: Fid, c: &Creds, r: &Request) -> Result<Reply> {
        Ok(self.md(mdt_of(fid)?, c, r, &[]).await?.0)
    }

    /// The directory (or, in a striped directory, the shard) that holds `name` of `dir`.
    async fn place(&self, c: &Creds, dir: Fid, name: &str) -> Result<Fid> {
        match self.stripe(c, dir, false).await? {
            Some(s) => Ok(s.shards[s.shard_of(name)]),
            None => Ok(dir),
        }
    }

    /// The stripes of `dir` as cached, or fetched when `fetch` (after an MDT said
    /// EREMOTE: the directory is striped).
    async fn stripe(&self, c: &Creds, dir: Fid, fetch: bool) -> Result<Option<Arc<DirStripe>>> {
        if let Some(s) = lock(&self.inner.stripes).get(&dir) {
            return Ok(s.clone());
        }
        if !fetch {
            return Ok(None);
        }
        let (stripe, _) = self.getdirstripe(c, dir).await?;
        let s = stripe.map(Arc::new);
        let mut m = lock(&self.inner.stripes);
        if m.len() >= CACHE_MAX {
            m.clear();
        }
        m.insert(dir, s.clone());
        Ok(s)
    }

    /// Run `f(directory)` on the directory that holds `name`, learning the directory's
    /// stripes if its MDT says it is striped.
    async fn by_name<T, F, Fut>(&self, c: &Creds, dir: Fid, name: &str, f: F) -> Result<T>
    where
        F: Fn(Fid) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let at = self.place(c, dir, name).await?;
        match f(at).await {
            Err(e) if e.errno == errno::EREMOTE && at == dir => {
                let Some(s) = self.stripe(c, dir, true).await? else { return Err(e) };
                f(s.shards[s.shard_of(name)]).await
            }
            r => r,
        }
    }

    // ---- metadata operations ----

    /// Attributes of `fid`. A regular file open for writing (through any mount: the MDT
    /// says so) gets its size from its objects (a glimpse); otherwise the MDT's size is
    /// the one its last writer left at close.
    pub async fn getattr(&self, c: &Creds, fid: Fid) -> Result<Attr> {
        let (a, writing) = attr_writing("getattr", self.md_at(fid, c, &Request::Getattr { fid }).await?)?;
        self.sized(c, a, writing).await
    }

    /// `a`, glimpsed if it is a regular file open for writing (per the MDT, or here).
    async fn sized(&self, c: &Creds, a: Attr, writing: bool) -> Result<Attr> {
        if mode::is_reg(a.mode) && (writing || lock(&self.inner.writers).contains_key(&a.fid)) {
            return self.glimpse(c, a).await;
        }
        Ok(a)
    }

    /// `a` with the size and blocks its OST objects give, when they hold more.
    pub(crate) async fn glimpse(&self, c: &Creds, a: Attr) -> Result<Attr> {
        Ok(self.glimpse_space(c, a).await?.0)
    }

    /// As [`FileSystem::glimpse`], with the bytes of space the OST objects hold.
    pub(crate) async fn glimpse_space(&self, c: &Creds, a: Attr) -> Result<(Attr, u64)> {
        let l = self.current_layout(c, a.fid).await?;
        self.glimpse_objects(&l, a).await
    }

    /// [`FileSystem::glimpse_space`] over the objects of layout `l`.
    async fn glimpse_objects(&self, l: &FileLayout, mut a: Attr) -> Result<(Attr, u64)> {
        let mut sizes = Vec::with_capacity(l.objects.len());
        let mut space = 0;
        for comp in &l.objects {
            let mut set = tokio::task::JoinSet::new();
            for (i, &(ost, oid)) in comp.iter().enumerate() {
                let fs = self.clone();
                set.spawn(async move {
                    let (body, _) = fs.ost_call(ost, &ost::Request::Getattr { target: 0, oid }, &[]).await?;
                    Ok((i, ost::decode_attr(&body).map_err(|e| Error::protocol("OST getattr", e))?))
                });
            }
            let mut got = vec![0u64; comp.len()];
            for (i, oa) in all(set, "glimpse").await? {
                got[i] = oa.size;
                space += oa.space;
            }
            sizes.push(got);
        }
        a.size = a.size.max(l.size_from_objects(&sizes));
        a.blocks = a.blocks.max(space / 512);
        Ok((a, space))
    }

    /// Send an OST request to OST `ost` (target 0 of its server), within its
    /// `max_rpcs_in_flight`: the reply body and bulk.
    pub(crate) async fn ost_call(
        &self,
        index: u32,
        r: &ost::Request,
        bulk: &[u8],
    ) -> Result<(Vec<u8>, nacre_net::bulk::Bulk)> {
        let (import, gate) = self.target_link(TargetKind::Ost, index).await?;
        let _slot = gate.take(1).await;
        let (op, body) = r.encode();
        let f = import
            .call(op, &body, bulk)
            .await
            .map_err(|e| Error::rpc(&TargetKind::Ost.name(&self.inner.fsname, index), e))?;
        if f.header.status != 0 {
            return Err(Error::from_reply(f.header.status, &f.body));
        }
        Ok((f.body, f.bulk))
    }

    pub async fn lookup(&self, c: &Creds, dir: Fid, name: &str) -> Result<Attr> {
        // At most one wait: a fetch that landed without the name leaves it to the MDT.
        for _ in 0..2 {
            match self.probe_ahead(c, dir, name) {
                Probe::Hit(a) => {
                    self.stat_ahead(c, dir, name);
                    return self.sized(c, a, false).await;
                }
                Probe::Wait(mut landed) => {
                    let _ = tokio::time::timeout(WAIT_MAX, landed.wait_for(|done| *done)).await;
                }
                Probe::Miss => break,
            }
        }
        let a = self.lookup_here(c, dir, name).await?;
        self.stat_ahead(c, dir, name);
        Ok(a)
    }

    /// What statahead has for `name` of `dir` (a miss while it is off).
    fn probe_ahead(&self, c: &Creds, dir: Fid, name: &str) -> Probe {
        if self.inner.params.statahead_max.load(Ordering::Relaxed) == 0 {
            return Probe::Miss;
        }
        self.inner.statahead.probe(dir, c, name, self.inner.changes.load(Ordering::Acquire))
    }

    /// `name` of `dir` as statahead has it ready, without waiting for anything: `None`
    /// when it has not (then [`FileSystem::lookup`] asks), or when the file is open for
    /// writing here (its size needs a glimpse). For a caller on a thread of its own (the
    /// mount's kernel readers), which answers a hit without a hop to the runtime; call it
    /// inside the runtime's context (`Handle::enter`): a hit may start the next fetch.
    pub fn lookup_ready(&self, c: &Creds, dir: Fid, name: &str) -> Option<Attr> {
        let Probe::Hit(a) = self.probe_ahead(c, dir, name) else { return None };
        self.stat_ahead(c, dir, name);
        if mode::is_reg(a.mode) && lock(&self.inner.writers).contains_key(&a.fid) {
            // Used up by the probe; the lookup asks the MDT and glimpses.
            return None;
        }
        Some(a)
    }

    /// Follow a lookup for statahead, and start the fetch it makes due.
    fn stat_ahead(&self, c: &Creds, dir: Fid, name: &str) {
        let max = self.inner.params.statahead_max.load(Ordering::Relaxed);
        let changes = self.inner.changes.load(Ordering::Acquire);
        if let Some(f) = self.inner.statahead.note(dir, c, name, max, changes) {
            let (fs, c) = (self.clone(), c.clone());
            tokio::spawn(async move { fs.fetch_ahead(&c, f).await });
        }
    }

    /// Fetch a statahead window. Only plain answers are kept: not a file some client is
    /// writing (its size comes from a glimpse at the time; one open for writing here is
    /// glimpsed when its answer is used), nor a remote entry.
    async fn fetch_ahead(&self, c: &Creds, f: Fetch) {
        // Listening for callbacks, only leased answers are kept: a revocation throws the
        // rest away (it counts as a change), so none shows another mount's change late.
        let exact = self.inner.revoker.get().is_some();
        let leased = |name: &str, a: &Attr| !exact || (self.name_leased(f.dir, name) && self.attr_leased(a.fid));
        let found = self.looked(c, f.dir, &f.names).await.ok().map(|v| {
            (f.first..)
                .zip(f.names.iter().zip(v))
                .filter_map(|(i, (name, l))| match l {
                    Looked::Attr(a) if a.nlink > 0 && leased(name, &a) => Some((i, a)),
                    _ => None,
                })
                .collect()
        });
        self.inner.statahead.landed(&f, found, self.inner.changes.load(Ordering::Acquire));
        let _ = f.done.send(true);
    }

    /// Each of `names` in `dir`, in as few requests as the directory's stripes allow (at
    /// most [`LOOKUP_MANY_MAX`] names each): one answer per name, in order. The
    /// directory's own errors fail the call; a missing name is its own answer.
    pub async fn lookup_many(&self, c: &Creds, dir: Fid, names: &[String]) -> Result<Vec<Result<Attr>>> {
        let looked = self.looked(c, dir, names).await?;
        let mut out = Vec::with_capacity(looked.len());
        for (name, l) in names.iter().zip(looked) {
            out.push(match l {
                // A remote entry: its MDT has the rest.
                Looked::Attr(a) if a.nlink == 0 => self.getattr(c, a.fid).await,
                Looked::Attr(a) => self.sized(c, a, false).await,
                Looked::Writing(a) => self.sized(c, a, true).await,
                Looked::Error(e) => Err(Error::new(e, format!("lookup of {name:?} in {dir}"))),
            });
        }
        Ok(out)
    }

    /// The MDTs' answers for `names` of `dir`, in order, each name asked of the shard
    /// that holds it.
    async fn looked(&self, c: &Creds, dir: Fid, names: &[String]) -> Result<Vec<Looked>> {
        let mut out = vec![Looked::Error(errno::EIO); names.len()];
        // A second pass once an MDT said the directory is striped.
        for fetch in [false, true] {
            let stripe = self.stripe(c, dir, fetch).await?;
            let mut groups: BTreeMap<Fid, Vec<usize>> = BTreeMap::new();
            for (i, n) in names.iter().enumerate() {
                groups.entry(stripe.as_ref().map_or(dir, |s| s.shards[s.shard_of(n)])).or_default().push(i);
            }
            let mut striped = false;
            'groups: for (at, idx) in groups {
                for part in lookup_parts(&idx, names) {
                    let req = Request::LookupMany { dir: at, names: part.iter().map(|&i| names[i].clone()).collect() };
                    let v = match self.md_at(at, c, &req).await {
                        Err(e) if e.errno == errno::EREMOTE && at == dir && !fetch => {
                            striped = true;
                            break 'groups;
                        }
                        r => expect("lookup-many", r?, |r| match r {
                            Reply::Looked(v) if v.len() == part.len() => Some(v),
                            _ => None,
                        })?,
                    };
                    for (&i, l) in part.iter().zip(v) {
                        out[i] = l;
                    }
                }
            }
            if !striped {
                break;
            }
        }
        Ok(out)
    }

    /// One name asked of its MDT.
    async fn lookup_here(&self, c: &Creds, dir: Fid, name: &str) -> Result<Attr> {
        let (a, writing) = self
            .by_name(c, dir, name, |at| async move {
                attr_writing("lookup", self.md_at(at, c, &Request::Lookup { dir: at, name: name.to_string() }).await?)
            })
            .await?;
        // A remote entry is answered with its FID and type alone (no links): its MDT
        // has the rest.
        if a.nlink == 0 {
            return self.getattr(c, a.fid).await;
        }
        self.sized(c, a, writing).await
    }

    /// Look up a `/`-separated path from the root.
    pub async fn resolve(&self, c: &Creds, path: &str) -> Result<Attr> {
        let mut a = self.getattr(c, Fid::ROOT).await?;
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            a = self.lookup(c, a.fid, part).await?;
        }
        Ok(a)
    }

    /// The parent directory's attributes and the last name of `path`.
    pub async fn parent_of<'p>(&self, c: &Creds, path: &'p str) -> Result<(Attr, &'p str)> {
        let path = path.trim_end_matches('/');
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        if name.is_empty() || name == "." || name == ".." {
            return Err(Error::new(errno::EINVAL, format!("{path:?} does not end in a name")));
        }
        Ok((self.resolve(c, dir).await?, name))
    }

    /// Up to `max` entries of `dir` after `cookie` (0 starts), with attributes, and
    /// whether the listing is done. A striped directory's shards are merged in cookie
    /// (name hash) order, so one cookie resumes the whole listing.
    pub async fn readdir(&self, c: &Creds, dir: Fid, cookie: u64, max: u32) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        let max = max.clamp(1, READDIR_MAX);
        let shards = match self.stripe(c, dir, false).await? {
            Some(s) => s.shards.clone(),
            None => match self.readdir_one(c, dir, cookie, max).await {
                Err(e) if e.errno == errno::EREMOTE => match self.stripe(c, dir, true).await? {
                    Some(s) => s.shards.clone(),
                    None => return Err(e),
                },
                r => return r,
            },
        };
        let mut all = Vec::new();
        let mut eof = true;
        let mut limit = u64::MAX;
        for s in shards {
            let (entries, done) = self.readdir_one(c, s, cookie, max).await?;
            if !done {
                eof = false;
                // This shard has more past its last entry: nothing after that cookie may
                // be returned yet.
                if let Some((e, _)) = entries.last() {
                    limit = limit.min(e.cookie);
                }
            }
            all.extend(entries);
        }
        all.retain(|(e, _)| e.cookie <= limit);
        all.sort_by_key(|(e, _)| e.cookie);
        if all.len() > max as usize {
            // A page never ends inside a run of equal cookies (two names of one hash in
            // different shards): the listing resumes after the cookie, so the rest of the
            // run would be skipped.
            let next = all[max as usize].0.cookie;
            all.truncate(max as usize);
            let whole = all.iter().rposition(|(e, _)| e.cookie != next).map_or(0, |i| i + 1);
            if whole > 0 {
                all.truncate(whole);
            }
            eof = false;
        }
        Ok((all, eof))
    }

    async fn readdir_one(&self, c: &Creds, dir: Fid, cookie: u64, max: u32) -> Result<(Vec<(DirEntry, Attr)>, bool)> {
        let r = self.md_at(dir, c, &Request::Readdir { dir, cookie, max }).await?;
        expect("readdir", r, |r| match r {
            Reply::Entries { entries, eof } => Some((entries, eof)),
            _ => None,
        })
    }

    /// A regular file (`mode` holds its permission bits) with the given layout, or the
    /// directory's default; `data`, if any, is its first bytes (the layout must keep them
    /// on the MDT).
    pub async fn create(&self, c: &Creds, dir: Fid, name: &str, perms: u32, layout: Option<&Layout>) -> Result<Attr> {
        self.make(c, dir, name, mode::S_IFREG | (perms & mode::PERMS), Vec::new(), layout, &[], 0).await
    }

    /// A regular file made and opened in one request (the creator opens it whatever its
    /// mode, as open(2) with O_CREAT); `layout` or the directory's default.
    pub async fn create_open(
        &self,
        c: &Creds,
        dir: Fid,
        name: &str,
        perms: u32,
        layout: Option<&Layout>,
        flags: OpenFlags,
    ) -> Result<(Attr, File)> {
        let layout = layout.map(Layout::encode).unwrap_or_default();
        let (handle, attr, layout, objects, left) = self
            .by_name(c, dir, name, |at| {
                let r = Request::CreateOpen {
                    dir: at,
                    name: name.to_string(),
                    perms: perms & mode::PERMS,
                    layout: layout.clone(),
                    read: flags.read,
                    write: flags.write,
                };
                async move {
                    expect("create-open", self.md_at(at, c, &r).await?, |r| match r {
                        Reply::Opened { handle, attr, layout, objects, dir } => {
                            Some((handle, attr, layout, objects, dir))
                        }
                        _ => None,
                    })
                }
            })
            .await?;
        // The MDT answers with the directory as the create left it.
        if let Some(a) = left {
            self.left_dir(dir, a);
        }
        let layout = self.sent_layout(attr.fid, &layout, objects)?;
        Ok((attr, File::opened(self.clone(), c, handle, attr, layout, flags)))
    }

    /// A small file made and written in one request (its layout keeps it on the MDT).
    pub async fn create_with_data(&self, c: &Creds, dir: Fid, name: &str, perms: u32, data: &[u8]) -> Result<Attr> {
        self.make(c, dir, name, mode::S_IFREG | (perms & mode::PERMS), Vec::new(), None, data, 0).await
    }

    pub async fn symlink(&self, c: &Creds, dir: Fid, name: &str, target: &[u8]) -> Result<Attr> {
        self.make(c, dir, name, mode::S_IFLNK | 0o777, target.to_vec(), None, &[], 0).await
    }

    /// A FIFO, socket or device node (`mknod`), by the type bits of `mode_bits`; a device
    /// node's number is `rdev`, as the kernel encodes it.
    pub async fn mknod(&self, c: &Creds, dir: Fid, name: &str, mode_bits: u32, rdev: u32) -> Result<Attr> {
        let m = mode_bits & (mode::S_IFMT | mode::PERMS);
        self.make(c, dir, name, m, Vec::new(), None, &[], rdev).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn make(
        &self,
        c: &Creds,
        dir: Fid,
        name: &str,
        mode_bits: u32,
        target: Vec<u8>,
        layout: Option<&Layout>,
        data: &[u8],
        rdev: u32,
    ) -> Result<Attr> {
        let layout = layout.map(Layout::encode).unwrap_or_default();
        self.by_name(c, dir, name, |at| {
            let r = Request::Create {
                dir: at,
                name: name.to_string(),
                mode: mode_bits,
                target: target.clone(),
                layout: layout.clone(),
                rdev,
            };
            async move { attr_of("create", self.md(mdt_of(at)?, c, &r, data).await?.0) }
        })
        .await
    }

    /// A directory: on MDT `mdt` (-1: by the parent's default), striped over `count`
    /// MDTs (0: by the default, -1: all), as `lfs mkdir -i -c`.
    pub async fn mkdir(&self, c: &Creds, dir: Fid, name: &str, perms: u32, mdt: i32, count: i32) -> Result<Attr> {
        self.by_name(c, dir, name, |at| {
            let r = Request::Mkdir { dir: at, name: name.to_string(), mode: perms & mode::PERMS, mdt, count };
            async move { attr_of("mkdir", self.md_at(at, c, &r).await?) }
        })
        .await
    }

    pub async fn unlink(&self, c: &Creds, dir: Fid, name: &str) -> Result<()> {
        self.remove(c, dir, name, false).await
    }

    pub async fn rmdir(&self, c: &Creds, dir: Fid, name: &str) -> Result<()> {
        self.remove(c, dir, name, true).await?;
        Ok(())
    }

    async fn remove(&self, c: &Creds, dir: Fid, name: &str, rmdir: bool) -> Result<()> {
        let left = self
            .by_name(c, dir, name, |at| {
                let r = Request::Unlink { dir: at, name: name.to_string(), rmdir };
                async move { self.md_at(at, c, &r).await }
            })
            .await?;
        // The MDT answers with the directory as the unlink left it.
        if let Reply::Attr(a) = left {
            self.left_dir(dir, a);
        }
        Ok(())
    }

    /// Keep `a`, the attributes of directory `dir` a change of this mount left (for
    /// [`FileSystem::fresh_dir_attr`]).
    fn left_dir(&self, dir: Fid, a: Attr) {
        if a.fid != dir {
            // A shard of a striped directory: not what the kernel asks about.
            return;
        }
        let mut m = lock(&self.inner.dir_attrs);
        if m.len() >= CACHE_MAX {
            m.clear();
        }
        if m.get(&dir).is_none_or(|old| old.ctime_ns <= a.ctime_ns) {
            m.insert(dir, a);
        }
    }

    /// The attributes of directory `dir` as this mount's last unlink or create-open in it
    /// left them, once: the kernel drops a directory's attributes at each of those and
    /// asks for them at the next operation's permission check, which this answers without
    /// a round trip. Any later ask goes to the MDT.
    pub fn fresh_dir_attr(&self, dir: Fid) -> Option<Attr> {
        lock(&self.inner.dir_attrs).remove(&dir)
    }

    pub async fn link(&self, c: &Creds, fid: Fid, dir: Fid, name: &str) -> Result<Attr> {
        self.by_name(c, dir, name, |at| {
            let r = Request::Link { fid, dir: at, name: name.to_string() };
            async move { attr_of("link", self.md_at(at, c, &r).await?) }
        })
        .await
    }

    /// Rename; `noreplace` fails with EEXIST instead of replacing an existing target.
    pub async fn rename(
        &self,
        c: &Creds,
        src_dir: Fid,
        src_name: &str,
        dst_dir: Fid,
        dst_name: &str,
        noreplace: bool,
    ) -> Result<()> {
        for _ in 0..3 {
            let src = self.place(c, src_dir, src_name).await?;
            let dst = self.place(c, dst_dir, dst_name).await?;
            let r = Request::Rename {
                src_dir: src,
                src_name: src_name.to_string(),
                dst_dir: dst,
                dst_name: dst_name.to_string(),
                noreplace,
            };
            match self.md_at(src, c, &r).await {
                Err(e) if e.errno == errno::EREMOTE => {
                    // One of the directories is striped: learn both and route again.
                    let a = self.stripe(c, src_dir, true).await?;
                    let b = self.stripe(c, dst_dir, true).await?;
                    if a.is_none() && b.is_none() {
                        return Err(e);
                    }
                }
                r => return r.map(|_| ()),
            }
        }
        Err(Error::new(errno::EIO, "rename: the MDTs kept answering EREMOTE"))
    }

    /// Change attributes. A size change truncates (or extends) the file's OST objects
    /// too, after the MDT has checked and recorded it.
    pub async fn setattr(&self, c: &Creds, fid: Fid, s: SetAttr) -> Result<Attr> {
        self.inner.whole.forget(fid);
        if s.mask & set::SIZE == 0 {
            return attr_of("setattr", self.md_at(fid, c, &Request::Setattr { fid, set: s }).await?);
        }
        let _still = self.size_guard(fid).await;
        let a = attr_of("setattr", self.md_at(fid, c, &Request::Setattr { fid, set: s }).await?)?;
        self.inner.caches.resized(fid, s.size);
        // What an open that read the file before the truncate kept meanwhile.
        self.inner.whole.forget(fid);
        if !mode::is_reg(a.mode) {
            return Ok(a);
        }
        let l = self.truncate_objects(c, fid, s.size).await?;
        if l.no_objects() {
            return Ok(a);
        }
        // What the objects hold now, for st_blocks (a truncate gives space back).
        let (_, space) = self.glimpse_objects(&l, a).await?;
        // Through the same handle as the truncate, if it came through one.
        let blocks = SetAttr {
            mask: set::OST_BLOCKS | (s.mask & set::BY_HANDLE),
            ost_blocks: space / 512,
            handle: s.handle,
            ..SetAttr::default()
        };
        attr_of("setattr", self.md_at(fid, c, &Request::Setattr { fid, set: blocks }).await?)
    }

    /// Cut or extend every object of `fid` to what a file of `size` bytes holds in it;
    /// the layout it went by.
    async fn truncate_objects(&self, c: &Creds, fid: Fid, size: u64) -> Result<Arc<FileLayout>> {
        // Every object another mount's write may have made too.
        let l = self.current_layout(c, fid).await?;
        let sizes = l.object_sizes(size);
        let mut set = tokio::task::JoinSet::new();
        for (comp, objects) in l.objects.iter().enumerate() {
            for (i, &(ost, oid)) in objects.iter().enumerate() {
                let size = sizes[comp][i];
                let fs = self.clone();
                set.spawn(async move { fs.ost_call(ost, &ost::Request::Truncate { target: 0, oid, size }, &[]).await });
            }
        }
        all(set, "truncate").await.map(|_| l)
    }

    pub async fn readlink(&self, c: &Creds, fid: Fid) -> Result<Vec<u8>> {
        expect("readlink", self.md_at(fid, c, &Request::Readlink { fid }).await?, |r| match r {
            Reply::Bytes(b) => Some(b),
            _ => None,
        })
    }

    pub async fn getxattr(&self, c: &Creds, fid: Fid, name: &str) -> Result<Vec<u8>> {
        let r = self.md_at(fid, c, &Request::Getxattr { fid, name: name.to_string() }).await?;
        expect("getxattr", r, |r| match r {
            Reply::Bytes(b) => Some(b),
            _ => None,
        })
    }

    /// `flags`: [`nacre_proto::mdt::xattr`] bits (create-only, replace-only).
    pub async fn setxattr(&self, c: &Creds, fid: Fid, name: &str, value: &[u8], flags: u32) -> Result<()> {
        let r = Request::Setxattr { fid, name: name.to_string(), value: value.to_vec(), flags };
        self.md_at(fid, c, &r).await.map(|_| ())
    }

    pub async fn listxattr(&self, c: &Creds, fid: Fid) -> Result<Vec<String>> {
        expect("listxattr", self.md_at(fid, c, &Request::Listxattr { fid }).await?, |r| match r {
            Reply::Names(n) => Some(n),
            _ => None,
        })
    }

    pub async fn removexattr(&self, c: &Creds, fid: Fid, name: &str) -> Result<()> {
        self.md_at(fid, c, &Request::Removexattr { fid, name: name.to_string() }).await.map(|_| ())
    }

    /// A file's layout and objects, or a directory's default layout (no objects).
    pub async fn getlayout(&self, c: &Creds, fid: Fid) -> Result<Option<FileLayout>> {
        let r = self.md_at(fid, c, &Request::Getlayout { fid }).await?;
        let (layout, objects) = expect("getlayout", r, |r| match r {
            Reply::Layout { layout, objects } => Some((layout, objects)),
            _ => None,
        })?;
        if layout.is_empty() {
            return Ok(None);
        }
        let layout = Layout::decode(&layout).map_err(|e| Error::protocol("layout", e))?;
        Ok(Some(FileLayout { layout, objects }))
    }

    /// A file's layout, cached (components only gain objects: see
    /// [`FileSystem::current_layout`] for where that matters).
    pub(crate) async fn file_layout(&self, c: &Creds, fid: Fid) -> Result<Arc<FileLayout>> {
        if let Some(l) = lock(&self.inner.layouts).get(&fid) {
            return Ok(l.clone());
        }
        let l = self
            .getlayout(c, fid)
            .await?
            .ok_or_else(|| Error::new(errno::ENODATA, format!("{fid} has no layout (not a regular file?)")))?;
        Ok(self.cache_layout(fid, l))
    }

    /// A file's layout as it is now. The cached one while it cannot have changed: each
    /// striped component has its objects, or this mount holds a lease on the file's
    /// attributes (a layout intent from another mount would have called it back).
    /// Otherwise fetched again: another mount's write may have given a component its
    /// objects since.
    pub(crate) async fn current_layout(&self, c: &Creds, fid: Fid) -> Result<Arc<FileLayout>> {
        if let Some(l) = self.cached_layout(fid)
            && (!l.incomplete() || self.attr_leased(fid))
        {
            return Ok(l);
        }
        let l = self
            .getlayout(c, fid)
            .await?
            .ok_or_else(|| Error::new(errno::ENODATA, format!("{fid} has no layout (not a regular file?)")))?;
        Ok(self.cache_layout(fid, l))
    }

    /// The layout this mount last saw of `fid`, if it keeps one.
    pub(crate) fn cached_layout(&self, fid: Fid) -> Option<Arc<FileLayout>> {
        lock(&self.inner.layouts).get(&fid).cloned()
    }

    /// Give the striped components of `fid`'s layout that begin before byte `end` their
    /// OST objects (a layout intent, for a write through `handle`): the layout after.
    pub(crate) async fn layout_intent(&self, c: &Creds, fid: Fid, handle: u64, end: u64) -> Result<Arc<FileLayout>> {
        let r = self.md_at(fid, c, &Request::LayoutIntent { fid, handle, end }).await?;
        let (layout, objects) = expect("layout intent", r, |r| match r {
            Reply::Layout { layout, objects } => Some((layout, objects)),
            _ => None,
        })?;
        let layout = Layout::decode(&layout).map_err(|e| Error::protocol("layout", e))?;
        let l = FileLayout { layout, objects };
        if l.lacks_objects_before(end) {
            return Err(Error::new(
                errno::ENOSPC,
                format!("the MDS gave {fid} no OST objects for its bytes before {end} (no OST has objects to give)"),
            ));
        }
        Ok(self.cache_layout(fid, l))
    }

    fn cache_layout(&self, fid: Fid, l: FileLayout) -> Arc<FileLayout> {
        let l = Arc::new(l);
        let mut m = lock(&self.inner.layouts);
        if m.len() >= CACHE_MAX {
            m.clear();
        }
        m.insert(fid, l.clone());
        l
    }

    /// The layout an open's reply carried (`None`: it carried none), cached as a fetched
    /// one is.
    pub(crate) fn sent_layout(
        &self,
        fid: Fid,
        layout: &[u8],
        objects: Vec<Vec<(u32, u64)>>,
    ) -> Result<Option<Arc<FileLayout>>> {
        if layout.is_empty() {
            return Ok(None);
        }
        let layout = Layout::decode(layout).map_err(|e| Error::protocol("layout", e))?;
        Ok(Some(self.cache_layout(fid, FileLayout { layout, objects })))
    }

    /// Set (or with `None` remove) a directory's default layout, as `lfs setstripe DIR`.
    pub async fn set_dir_layout(&self, c: &Creds, dir: Fid, layout: Option<&Layout>) -> Result<()> {
        let layout = layout.map(Layout::encode).unwrap_or_default();
        // A striped directory's default lives on its master and every shard.
        let mut dirs = vec![dir];
        if let Some(s) = self.stripe(c, dir, true).await? {
            dirs.extend(s.shards.iter().copied());
        }
        for d in dirs {
            self.md_at(d, c, &Request::Setdirlayout { dir: d, layout: layout.clone() }).await?;
        }
        Ok(())
    }

    /// A directory's stripes (if striped) and default for new subdirectories (if set).
    pub async fn getdirstripe(&self, c: &Creds, dir: Fid) -> Result<(Option<DirStripe>, Option<DirDefault>)> {
        let r = self.md_at(dir, c, &Request::Getdirstripe { dir }).await?;
        let (stripe, default) = expect("getdirstripe", r, |r| match r {
            Reply::DirStripe { stripe, default } => Some((stripe, default)),
            _ => None,
        })?;
        let stripe = if stripe.is_empty() {
            None
        } else {
            Some(DirStripe::decode(&stripe).map_err(|e| Error::protocol("stripe", e))?)
        };
        let default = if default.is_empty() {
            None
        } else {
            Some(DirDefault::decode(&default).map_err(|e| Error::protocol("default", e))?)
        };
        Ok((stripe, default))
    }

    /// Set (or remove) the default of `dir`'s new subdirectories (`setdirstripe -D`).
    pub async fn set_dir_default(&self, c: &Creds, dir: Fid, default: Option<&DirDefault>) -> Result<()> {
        let default = default.map(DirDefault::encode).unwrap_or_default();
        self.md_at(dir, c, &Request::Setdirdefault { dir, default }).await.map(|_| ())
    }

    /// Space and inodes over every target, with each target's line.
    pub async fn statfs(&self, c: &Creds) -> Result<StatFs> {
        let (mdts, osts) = self.targets();
        let mut out = StatFs::default();
        for i in mdts {
            let r = self.md(i, c, &Request::Statfs, &[]).await?.0;
            let (inodes, used, total) = expect("statfs", r, |r| match r {
                Reply::StatFs { inodes, bytes_used, bytes_total } => Some((inodes, bytes_used, bytes_total)),
                _ => None,
            })?;
            out.inodes += inodes;
            out.targets.push(TargetUsage {
                name: TargetKind::Mdt.name(&self.inner.fsname, i),
                kind: TargetKind::Mdt,
                index: i,
                bytes_total: total,
                bytes_used: used,
                bytes_free: total.saturating_sub(used),
                inodes,
            });
        }
        for i in osts {
            let (body, _) = self.ost_call(i, &ost::Request::Statfs { target: 0 }, &[]).await?;
            let s = ost::decode_statfs(&body).map_err(|e| Error::protocol("OST statfs", e))?;
            out.bytes_total += s.total_bytes;
            out.bytes_free += s.free_bytes;
            out.targets.push(TargetUsage {
                name: TargetKind::Ost.name(&self.inner.fsname, i),
                kind: TargetKind::Ost,
                index: i,
                bytes_total: s.total_bytes,
                bytes_used: s.total_bytes.saturating_sub(s.free_bytes),
                bytes_free: s.free_bytes,
                inodes: s.objects,
            });
        }
        // Files with only DoM data count against the MDTs; with OSTs the data lives there.
        if out.bytes_total == 0 {
            for t in &out.targets {
                out.bytes_total += t.bytes_total;
                out.bytes_free += t.bytes_free;
            }
        }
        Ok(out)
    }

    /// Changes this mount has sent and had answered, counted at each (see
    /// `Inner::changes`): equal before and after a read, none went out or came back
    /// meanwhile.
    pub(crate) fn change_count(&self) -> u64 {
        self.inner.changes.load(Ordering::Acquire)
    }

    /// Open `fid`; `flags` as open(2)'s access mode, O_APPEND and O_TRUNC.
    pub async fn open(&self, c: &Creds, fid: Fid, flags: OpenFlags) -> Result<File> {
        File::open(self.clone(), c, fid, flags).await
    }

    /// [`FileSystem::open`] for a caller that has checked, itself, that `c` may open
    /// `fid` so, against attributes this mount holds a lease on (a kernel mounting with
    /// `default_permissions`): an open for reading of a small file this mount knows whole
    /// is then answered here, with no request (see `whole`).
    pub async fn open_permitted(&self, c: &Creds, fid: Fid, flags: OpenFlags) -> Result<File> {
        match File::known_whole(self, c, fid, flags) {
            Some(f) => Ok(f),
            None => self.open(c, fid, flags).await,
        }
    }

    /// Open `name` in `dir`: the lookup and the open in one request (Lustre's open
    /// intent). A small file whose bytes are all on the MDT comes with them (DoM
    /// read-on-open), so reading it costs no further RPC.
    pub async fn open_at(&self, c: &Creds, dir: Fid, name: &str, flags: OpenFlags) -> Result<File> {
        let dom_read = crate::file::read_on_open(self, flags);
        let changes = self.change_count();
        let (reply, first) = self
            .by_name(c, dir, name, |at| {
                let r =
                    Request::OpenAt { dir: at, name: name.to_string(), read: flags.read, write: flags.write, dom_read };
                async move { self.md(mdt_of(at)?, c, &r, &[]).await }
            })
            .await?;
        match reply {
            Reply::Opened { handle, attr, layout, objects, .. } => {
                let layout = self.sent_layout(attr.fid, &layout, objects)?;
                File::answered(self.clone(), c, handle, attr, layout, flags, &first, changes).await
            }
            // The inode is on another MDT: open it there.
            Reply::Attr(a) => self.open(c, a.fid, flags).await,
            r => Err(Error::protocol("open-at", format!("unexpected reply {r:?}"))),
        }
    }

    /// Hold `fid`'s size still on this mount (see `Inner::sizing`).
    pub(crate) async fn size_guard(&self, fid: Fid) -> tokio::sync::OwnedMutexGuard<()> {
        let m = {
            let mut map = lock(&self.inner.sizing);
            if map.len() >= 1024 {
                map.retain(|_, m| Arc::strong_count(m) > 1);
            }
            map.entry(fid).or_default().clone()
        };
        m.lock_owned().await
    }

    pub(crate) fn add_writer(&self, fid: Fid) {
        *lock(&self.inner.writers).entry(fid).or_default() += 1;
    }

    /// Handles of this mount open for writing `fid`.
    pub(crate) fn writers_of(&self, fid: Fid) -> usize {
        lock(&self.inner.writers).get(&fid).copied().unwrap_or(0)
    }

    /// The slot of `fid`'s kept append lock (see `Inner::appends`).
    pub(crate) fn append_slot(&self, fid: Fid) -> Arc<tokio::sync::Mutex<Option<u64>>> {
        lock(&self.inner.appends).entry(fid).or_default().clone()
    }

    /// Drop the append lock that `handle` (its owner) holds on `fid`.
    pub(crate) async fn unlock_append(&self, fid: Fid, handle: u64, c: &Creds) -> Result<()> {
        let (kind, flags, end) = (lock::UNLOCK, lock::APPEND, lock::EOF);
        let r = Request::Lock { fid, handle, owner: handle, pid: 0, kind, flags, start: 0, end };
        self.md(mdt_of(fid)?, c, &r, &[]).await.map(|_| ())
    }

    /// Let go of the append lock this mount keeps on `fid` (only if `handle` took it,
    /// when given), once the append under way is done.
    pub(crate) async fn release_append(&self, fid: Fid, handle: Option<u64>) {
        let Some(slot) = lock(&self.inner.appends).get(&fid).cloned() else { return };
        let mut held = slot.lock().await;
        if let Some(h) = *held
            && handle.is_none_or(|want| want == h)
        {
            *held = None;
            // Lost with the lock if it fails: the MDS drops it with the handle's client.
            let _ = self.unlock_append(fid, h, &Creds::default()).await;
        }
        drop(held);
        let mut all = lock(&self.inner.appends);
        // Ours and the table's: nobody else is appending.
        if all.get(&fid).is_some_and(|s| Arc::ptr_eq(s, &slot) && Arc::strong_count(s) == 2) {
            all.remove(&fid);
        }
    }

    pub(crate) fn drop_writer(&self, fid: Fid) {
        let mut w = lock(&self.inner.writers);
        if let Some(n) = w.get_mut(&fid) {
            *n -= 1;
            if *n == 0 {
                w.remove(&fid);
            }
        }
    }

    // ---- tunables ----

    /// Client tunables matching `pattern` (`osc.*.max_rpcs_in_flight`, `llite.*.*`):
    /// `osc.FSNAME-OSTxxxx-osc.KNOB` per OST, `llite.FSNAME.KNOB` for the mount.
    pub fn get_param(&self, pattern: &str) -> Vec<(String, String)> {
        let (_, osts) = self.targets();
        let mut out = Vec::new();
        for (scope, knob, value) in self.inner.params.list() {
            let names: Vec<String> = match scope {
                "osc" => osts
                    .iter()
                    .map(|&i| format!("osc.{}-osc.{knob}", TargetKind::Ost.name(&self.inner.fsname, i)))
                    .collect(),
                _ => vec![format!("llite.{}.{knob}", self.inner.fsname)],
            };
            for n in names {
                if nacre_net::glob::glob(pattern, &n) {
                    out.push((n, value.clone()));
                }
            }
        }
        let ra = format!("llite.{}.read_ahead_stats", self.inner.fsname);
        if nacre_net::glob::glob(pattern, &ra) {
            out.push((ra, self.inner.caches.stats.render()));
        }
        let whole = format!("llite.{}.whole_files", self.inner.fsname);
        if nacre_net::glob::glob(pattern, &whole) {
            out.push((whole, self.inner.whole.render()));
        }
        let t = self.inner.targets.read().unwrap_or_else(|e| e.into_inner());
        for (scope, kind, map) in [("mdc", TargetKind::Mdt, &t.mdts), ("osc", TargetKind::Ost, &t.osts)] {
            for (&i, l) in map {
                let target = kind.name(&self.inner.fsname, i);
                let n = format!("{scope}.{target}-{scope}.import");
                if nacre_net::glob::glob(pattern, &n) {
                    out.push((n, render_import(&target, l)));
                }
            }
        }
        out
    }

    /// Set the client tunables that `name` (which may hold globs) matches.
    pub fn set_param(&self, name: &str, value: &str) -> Result<()> {
        let matched: Vec<String> = self.get_param(name).into_iter().map(|(n, _)| n).collect();
        if matched.is_empty() {
            return Err(Error::new(errno::ENOENT, format!("no client parameter matches {name:?}")));
        }
        for n in matched {
            let (scope, knob) = client_knob(&n).ok_or_else(|| Error::new(errno::EINVAL, n.clone()))?;
            self.set_knob(scope, knob, value)?;
        }
        Ok(())
    }

    fn set_knob(&self, _scope: &str, knob: &str, value: &str) -> Result<()> {
        if knob == "read_ahead_stats" {
            // As Lustre's: any write clears the counters.
            self.inner.caches.stats.clear();
            return Ok(());
        }
        if knob == "whole_files" {
            return Err(Error::new(errno::EINVAL, "llite.*.whole_files counts what the mount keeps; it is not set"));
        }
        if knob == "import" {
            return Err(Error::new(errno::EINVAL, "{mdc,osc}.*.import shows a target's link; it is not set"));
        }
        self.inner.params.set(knob, value).map_err(|m| Error::new(errno::EINVAL, m))?;
        if knob == "max_rpcs_in_flight" {
            let n = self.inner.params.rpcs_in_flight.load(Ordering::Relaxed);
            let t = self.inner.targets.read().unwrap_or_else(|e| e.into_inner());
            for l in t.osts.values().chain(t.mdts.values()) {
                l.gate.set(n);
            }
        }
        Ok(())
    }
}

/// `(scope, knob)` of a client parameter name: `osc.ANY.KNOB`, `mdc.ANY.KNOB` or
/// `llite.ANY.KNOB`.
fn client_knob(name: &str) -> Option<(&str, &str)> {
    let (scope, rest) = name.split_once('.')?;
    let (_, knob) = rest.rsplit_once('.')?;
    matches!(scope, "osc" | "mdc" | "llite").then_some((scope, knob))
}

/// `{mdc,osc}.*.import`: the link to a target, as Lustre's import file shows it: every
/// NID the target may be at, the one the import uses, and what its connections did.
fn render_import(target: &str, l: &Link) -> String {
    let nids: Vec<String> = l.nids.iter().map(|n| n.to_string()).collect();
    let mut out = format!("import:\n    target: {target}\n    failover_nids: [{}]\n", nids.join(", "));
    match &l.import {
        None => out.push_str("    current_connection: none (not used yet)\n"),
        Some(i) => {
            let s = i.stats();
            out.push_str(&format!(
                "    current_connection: {}\n    connects: {}\n    walks: {}\n    evictions: {}\n    replays: {}\n    uncommitted: {}\n",
                i.target(),
                s.connects,
                s.walks,
                s.evictions,
                s.replays,
                s.uncommitted
            ));
        }
    }
    out
}

/// Wait for every task of `set` and give their results; a failure does not stop the
/// others (a task dropped mid-RPC would cut its frame and break the connection for every
/// request on it), the first one is returned once all are done.
pub(crate) async fn all<T: 'static>(mut set: tokio::task::JoinSet<Result<T>>, what: &str) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(set.len());
    let mut first = None;
    while let Some(r) = set.join_next().await {
        match r.map_err(|e| Error::new(errno::EIO, format!("{what} task: {e}"))).and_then(|r| r) {
            Ok(v) => out.push(v),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(out), Err)
}

/// The callback channel of MDT `mdt` (a long poll): carry out each revocation, then
/// acknowledge it with the next poll. When the MDT restarted or evicted this mount, or the
/// channel fails, every lease of that MDT is given up (it may have revoked some unheard).
async fn poll_leases(weak: std::sync::Weak<Inner>, mdt: u32) {
    let on_mdt = move |f: Fid| f.mdt() == Some(mdt);
    let mut acked = 0;
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let fs = FileSystem { inner };
        let import = match fs.target_link(TargetKind::Mdt, mdt).await {
            Ok((i, _)) => i,
            Err(_) => {
                drop(fs);
                back_off(&mut backoff).await;
                continue;
            }
        };
        let restarts = import.restarts();
        let void = fs.inner.leases.epoch(mdt, restarts, on_mdt);
        if !void.is_empty() {
            acked = 0;
            fs.given_up(void).await;
        }
        let r = fs.md(mdt, &Creds::default(), &Request::Leases { acked }, &[]).await;
        if import.restarts() != restarts {
            // Answered by a server that does not know the leases this poll acknowledged.
            acked = 0;
            continue;
        }
        match r {
            Ok((Reply::Revoked(v), _)) => {
                backoff = Duration::from_millis(100);
                let Some(&(last, _)) = v.last() else { continue };
                let keys: Vec<LeaseKey> = v.into_iter().map(|(_, k)| k).collect();
                fs.inner.leases.revoke(&keys);
                fs.given_up(keys).await;
                acked = last;
            }
            other => {
                if let Err(e) = other {
                    eprintln!("nacre: the lease callbacks of MDT {mdt} failed ({e}); its leases are given up");
                }
                let void = fs.inner.leases.drop_mdt(mdt, on_mdt);
                fs.given_up(void).await;
                acked = 0;
                drop(fs);
                back_off(&mut backoff).await;
            }
        }
    }
}

/// Wait `backoff` before trying again, and twice as long the next time (up to 5 s).
async fn back_off(backoff: &mut Duration) {
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}

/// The MDT that owns `fid`.
pub(crate) fn mdt_of(fid: Fid) -> Result<u32> {
    fid.mdt().ok_or_else(|| Error::new(errno::ESTALE, format!("{fid} belongs to no MDT")))
}

async fn fetch_config(client: &Client, mgs: &NidList, have: u64, wait_ms: u32) -> Result<Config> {
    let imp = client.connect_any(mgs::MGS_NAME, mgs.all()).await.map_err(|e| Error::rpc(&format!("MGS {mgs}"), e))?;
    let (op, body) = mgs::Request::Config { have, wait_ms }.encode();
    let f = imp.call(op, &body, &[]).await.map_err(|e| Error::rpc(&format!("MGS {mgs}"), e))?;
    if f.header.status != 0 {
        return Err(Error::from_reply(f.header.status, &f.body));
    }
    Config::decode(&f.body).map_err(|e| Error::protocol("MGS configuration", e))
}

/// How long a mount asks the MGS to hold each configuration poll.
const CONFIG_WAIT: Duration = Duration::from_secs(30);
/// The longest pause between polls of an MGS that does not answer.
const CONFIG_RETRY_MAX: Duration = Duration::from_secs(8);

/// Wait on the MGS for configuration changes and apply them, while the mount lives.
///
/// The MGS holds a bounded number of polls and answers the others at once with what they
/// have. A mount answered early with nothing new pauses for about the wait it asked
/// (jittered, from half of it to all of it) before it asks again: asking again at once
/// made every mount past the MGS's bound spin on it (2,000 mounts kept both cores busy
/// with config RPCs, `nacre bench storm`). Such a mount hears of a change within that
/// pause; a held one, at once. An MGS that does not answer is asked again after a
/// jittered pause that doubles from 1 s to [`CONFIG_RETRY_MAX`], so the mounts of a
/// cluster do not all come back to it in step.
async fn follow_config(fs: std::sync::Weak<Inner>, mut have: u64) {
    let mut failures = 0u32;
    let mut jitter: Option<SplitMix> = None;
    loop {
        let Some(inner) = fs.upgrade() else { return };
        let (client, mgs) = (inner.client.clone(), inner.mgs.clone());
        drop(inner);
        let jitter = jitter.get_or_insert_with(|| SplitMix(client.id()));
        let asked = tokio::time::Instant::now();
        let pause = match fetch_config(&client, &mgs, have, CONFIG_WAIT.as_millis() as u32).await {
            Ok(cfg) if cfg.version > have => {
                failures = 0;
                let Some(inner) = fs.upgrade() else { return };
                have = cfg.version;
                FileSystem { inner }.apply_config(&cfg);
                None
            }
            Ok(_) => {
                failures = 0;
                (asked.elapsed() < CONFIG_WAIT / 2).then_some(CONFIG_WAIT)
            }
            Err(_) => {
                failures += 1;
                Some((Duration::from_secs(1) * 2u32.pow(failures.min(4) - 1)).min(CONFIG_RETRY_MAX))
            }
        };
        if let Some(p) = pause {
            // From half of `p` to all of it.
            let half = p.as_millis() as u64 / 2;
            tokio::time::sleep(Duration::from_millis(half + jitter.next_u64() % (half + 1))).await;
        }
    }
}

/// A handler answering `get-param` and `set-param` for the client tunables of `fs`, for a
/// mount's control endpoint (`nacre get-param` without `--server` asks every local mount).
pub fn param_handler(fs: FileSystem) -> nacre_net::server::Handler {
    use nacre_proto::param;
    Arc::new(move |req: nacre_net::server::Incoming| {
        let fs = fs.clone();
        Box::pin(async move {
            let fail = |status: i32, m: String| nacre_net::server::Reply {
                status,
                body: m.into_bytes(),
                ..Default::default()
            };
            match req.header.opcode {
                param::OP_GET_PARAM => match param::decode_get(&req.body) {
                    Ok(p) => nacre_net::server::Reply {
                        status: 0,
                        body: param::render(&fs.get_param(&p)).into_bytes(),
                        ..Default::default()
                    },
                    Err(e) => fail(-errno::EPROTO, format!("bad get-param request: {e}")),
                },
                param::OP_SET_PARAM => match param::decode_set(&req.body) {
                    Ok((name, value)) => match fs.set_param(&name, &value) {
                        Ok(()) => nacre_net::server::Reply::default(),
                        Err(e) => fail(-e.errno, e.message),
                    },
                    Err(e) => fail(-errno::EPROTO, format!("bad set-param request: {e}")),
                },
                op => fail(
                    -errno::EINVAL,
                    format!("opcode {op}: a mount's control endpoint serves get-param and set-param"),
                ),
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_requests_are_cut_by_count_and_by_bytes() {
        let short: Vec<String> = (0..600).map(|i| format!("f{i}")).collect();
        let idx: Vec<usize> = (0..600).collect();
        let parts = lookup_parts(&idx, &short);
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [256, 256, 88]);
        assert_eq!(parts.concat(), idx, "every name once, in order");
        // 255-byte names: 32 KiB holds 126 of them.
        let long: Vec<String> = (0..300).map(|i| format!("{i:0>255}")).collect();
        let idx: Vec<usize> = (0..300).collect();
        let parts = lookup_parts(&idx, &long);
        assert!(parts.iter().all(|p| p.iter().map(|&i| long[i].len() + 4).sum::<usize>() <= LOOKUP_MANY_BYTES));
        assert_eq!(parts.concat(), idx);
        assert!(lookup_parts(&[], &long).is_empty());
    }
}
