//! The MDS: serves one MDT's namespace over the transport.
//!
//! Every request carries the caller's credentials; changes carry a reply key made of the
//! client's identity, the request's xid and the client's `acked_xid`, so a request resent
//! after a lost reply, even across a restart of the MDS, gets its first answer back.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use nacre_net::server::{Commits, Handler, Incoming, Recovering, RecoveryStats, Reply, Service};
use nacre_net::transport::BoxFuture;
use nacre_proto::fid::Fid;
use nacre_proto::layout::Layout;
use nacre_proto::mdt::{self, Creds, READDIR_MAX, Request, errno, lock, mode, set, xattr};
use nacre_proto::param;

use crate::dne::{Coordinator, coordinator_client, update_digest};
use crate::leases::{Leases, Poll};
use crate::locks::{Lock, LockTable, Owner, Resource};
use crate::mdt::OpenAnswer;
use crate::mdt::namespace::RenameMode;
use crate::mdt::namespace::{Answer, NEEDS_COORDINATION};
use crate::mdt::{Cred, FirstAnswer, MdError, Namespace, Numbered, ReplyKey, SetAttr};
use crate::tunable::number;

/// Bytes of names and attributes one readdir reply carries at most.
const READDIR_REPLY_BYTES: usize = 60 << 10;

/// Linux's EPROTO: a request that is not a well-formed MDS message.
const EPROTO: i32 = 71;

/// Requests that read memory and answer at once: served where they arrive (see
/// `Mds::serve`), and on the connection's own task when nothing waits before them
/// (`Service::quick`).
const READS: [u16; 12] = [
    mdt::MDS_GETATTR,
    mdt::MDS_LOOKUP,
    mdt::MDS_LOOKUP_MANY,
    mdt::MDS_READDIR,
    mdt::MDS_READLINK,
    mdt::MDS_GETXATTR,
    mdt::MDS_LISTXATTR,
    mdt::MDS_STATFS,
    mdt::MDS_GETLAYOUT,
    mdt::MDS_DOM_READ,
    mdt::MDS_GETDIRSTRIPE,
    param::OP_GET_PARAM,
];

/// Requests that change the namespace: run in memory and answered before their commit
/// (see `Mds::serve_change`).
const CHANGES: [u16; 14] = [
    mdt::MDS_CREATE,
    mdt::MDS_CREATE_OPEN,
    mdt::MDS_UNLINK,
    mdt::MDS_DOM_WRITE,
    mdt::MDS_RENAME,
    mdt::MDS_SETATTR,
    mdt::MDS_MKDIR,
    mdt::MDS_SETDIRDEFAULT,
    mdt::MDS_UPDATE,
    mdt::MDS_LINK,
    mdt::MDS_SETXATTR,
    mdt::MDS_REMOVEXATTR,
    mdt::MDS_SETDIRLAYOUT,
    mdt::MDS_LAYOUT_INTENT,
];

/// Opens and closes, answered from memory (see `Mds::try_open`).
const OPENS: [u16; 3] = [mdt::MDS_OPEN, mdt::MDS_OPEN_AT, mdt::MDS_CLOSE];

/// A lock request taken as far as it goes without waiting ([`Mds::lock_step`]).
enum LockStep {
    Answer(Reply),
    /// A lock that another owner's conflicts with now: refused, or queued, by the caller.
    Conflict(LockAsk),
    /// A lock or a test that conflicts with a lock another client may no longer use (it
    /// holds the file's `Locks` lease): call the lease back, then look again.
    Recall,
}

/// A lock request past its checks, with what its grant needs.
struct LockAsk {
    res: Resource,
    want: Lock,
    handle: u64,
    flags: u8,
    /// The lease clock before the request's checks (see `Leases::grant`).
    since: u64,
}

/// How long a lock request waits for a conflicting lock before it is answered
/// ETIMEDOUT and its client asks again: well within the transport's `at_max`, so the
/// request never times out while it waits.
const LOCK_WAIT_SLICE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a callback poll waits for a revocation before it is answered with none and
/// its client polls again.
const LEASE_POLL_SLICE: std::time::Duration = std::time::Duration::from_secs(30);

/// Operations counted in `md_stats`, by opcode.
const OPS: [(u16, &str); 31] = [
    (mdt::MDS_GETATTR, "getattr"),
    (mdt::MDS_LOOKUP, "lookup"),
    (mdt::MDS_READDIR, "readdir"),
    (mdt::MDS_CREATE, "create"),
    (mdt::MDS_LINK, "link"),
    (mdt::MDS_UNLINK, "unlink"),
    (mdt::MDS_RENAME, "rename"),
    (mdt::MDS_SETATTR, "setattr"),
    (mdt::MDS_OPEN, "open"),
    (mdt::MDS_OPEN_AT, "open_at"),
    (mdt::MDS_CLOSE, "close"),
    (mdt::MDS_READLINK, "readlink"),
    (mdt::MDS_GETXATTR, "getxattr"),
    (mdt::MDS_SETXATTR, "setxattr"),
    (mdt::MDS_LISTXATTR, "listxattr"),
    (mdt::MDS_REMOVEXATTR, "removexattr"),
    (mdt::MDS_STATFS, "statfs"),
    (mdt::MDS_GETLAYOUT, "getlayout"),
    (mdt::MDS_SETDIRLAYOUT, "setdirlayout"),
    (mdt::MDS_DOM_READ, "dom_read"),
    (mdt::MDS_DOM_WRITE, "dom_write"),
    (mdt::MDS_MKDIR, "mkdir"),
    (mdt::MDS_GETDIRSTRIPE, "getdirstripe"),
    (mdt::MDS_SETDIRDEFAULT, "setdirdefault"),
    (mdt::MDS_UPDATE, "update"),
    (mdt::MDS_CREATE_OPEN, "create_open"),
    (mdt::MDS_LOOKUP_MANY, "lookup_many"),
    (mdt::MDS_LOCK, "lock"),
    (mdt::MDS_UNLOCK, "unlock"),
    (mdt::MDS_LEASES, "leases"),
    (mdt::MDS_LAYOUT_INTENT, "layout_intent"),
];

/// The parameters `set_param` changes.
const SETTABLE: &[&str] = &[
    "sync_on_reply",
    "memory_max",
    "commit_interval_ms",
    "recovery_time_soft",
    "recovery_time_hard",
    "lease_callback_timeout_ms",
    "lease_contended_ms",
    "lease_per_client_max",
    "lease_max",
    "evict_client",
];

pub struct Mds {
    name: String,
    ns: Arc<Namespace>,
    counts: [AtomicU64; OPS.len()],
    dne: Arc<Coordinator>,
    /// The server this MDS runs in (its recovery figures), once known.
    server: std::sync::OnceLock<nacre_net::server::ServerHandle>,
    /// During recovery, the changes replayed well, by their first transno: what a later
    /// replay may depend on (version-based recovery).
    replayed: Arc<std::sync::Mutex<HashSet<u64>>>,
    /// The stored parameters taken from the MGS, by leaf, as last applied.
    stored: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// `last_committed` when this MDS started: replays at or below it were committed.
    replay_from: AtomicU64,
    /// The byte-range locks of this MDT's files.
    locks: Arc<LockTable>,
    /// What clients cache of this MDT, and its recall.
    leases: Arc<Leases>,
}

/// A change's reply, and the lease recall it made: the clock then, and the revocations
/// the reply waits for.
struct Answered {
    reply: Reply,
    recall: u64,
    recalled: Vec<(u64, u64)>,
    /// The first answer kept for its client (see [`Numbered::first`]).
    first: bool,
}

/// Answer a change with `reply` alone (it recalled nothing, or failed).
fn done(reply: Reply) -> Option<Answered> {
    Some(Answered { reply, recall: 0, recalled: Vec::new(), first: false })
}

/// Answer a numbered change with `reply`.
fn answered(reply: Reply, n: Numbered) -> Option<Answered> {
    Some(Answered { reply, recall: n.recall, recalled: n.recalled, first: n.first })
}

/// What the transport needs of the namespace: `last_committed` for every reply, and a
/// commit on `OP_COMMIT`.
struct MdtCommits(Arc<Namespace>, Arc<std::sync::Mutex<HashSet<u64>>>, Arc<LockTable>);

impl Commits for MdtCommits {
    fn last_committed(&self) -> u64 {
        self.0.last_committed()
    }

    fn commit(&self) -> nacre_net::transport::BoxFuture<'static, u64> {
        let ns = self.0.clone();
        Box::pin(async move {
            if let Err(e) = ns.committed_all().await {
                eprintln!("mds: a commit asked for failed: {}", e.message);
            }
            ns.last_committed()
        })
    }

    fn recovered(&self) {
        self.1.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // Objects from before the restart that no replay claimed go.
        self.0.end_replays();
        // Files unlinked while open that no client reopened go now.
        let ns = self.0.clone();
        tokio::task::spawn_blocking(move || match ns.remove_orphans() {
            Ok(0) => {}
            Ok(n) => eprintln!("mds: {n} files unlinked while open and not reopened by recovery removed"),
            Err(e) => eprintln!("mds: removing files unlinked while open: {}", e.message),
        });
    }

    fn forget(&self, client: u64) -> nacre_net::transport::BoxFuture<'static, ()> {
        self.2.evict(client);
        let ns = self.0.clone();
        Box::pin(async move {
            let r = tokio::task::spawn_blocking(move || ns.forget_client(client)).await;
            if let Ok(Err(e)) = r {
                eprintln!("mds: letting go of client {client:016x}: {}", e.message);
            }
        })
    }
}

fn fail(status: i32, message: String) -> Reply {
    Reply { status, body: message.into_bytes(), ..Reply::default() }
}

fn ok(r: mdt::Reply) -> Reply {
    Reply { status: 0, body: r.encode(), ..Reply::default() }
}

fn answer<T>(r: Result<T, MdError>, f: impl FnOnce(T) -> mdt::Reply) -> Reply {
    match r {
        Ok(v) => ok(f(v)),
        Err(e) => fail(e.status(), e.message),
    }
}

/// An open's answer: the handle, attributes and layout, with the file's first bytes as
/// the bulk (DoM read-on-open), or the attributes of a file to open at its own MDT.
fn opened(ns: &Namespace, r: Result<OpenAnswer, MdError>) -> Reply {
    match r {
        Ok(OpenAnswer::Here((handle, attr, data))) => match handle_reply(ns, handle, attr, None) {
            Ok(body) => {
                Reply { open_state: true, status: 0, body: body.encode(), bulk: Bytes::from(data), ..Reply::default() }
            }
            Err(e) => fail(e.status(), e.message),
        },
        Ok(OpenAnswer::Elsewhere(attr)) => ok(mdt::Reply::Attr(attr)),
        Err(e) => fail(e.status(), e.message),
    }
}

/// The reply naming an open handle, with the file's layout and objects when it is a
/// regular file (its first IO then needs no layout fetch), and for a create-open the
/// directory as the create left it.
fn handle_reply(ns: &Namespace, handle: u64, attr: mdt::Attr, dir: Option<mdt::Attr>) -> Result<mdt::Reply, MdError> {
    let (layout, objects) = if mode::is_reg(attr.mode) { ns.layout_and_objects(attr.fid)? } else { Default::default() };
    Ok(mdt::Reply::Opened { handle, attr, layout, objects, dir })
}

/// What a replayed create's first reply gave: the new inode's FID, and for a create-open
/// the handle.
fn first_answer(replayed: &Option<Vec<u8>>) -> Option<(FirstAnswer, Option<u64>)> {
    let fid = |fid| FirstAnswer { fid, ..FirstAnswer::default() };
    match mdt::Reply::decode(replayed.as_deref()?).ok()? {
        mdt::Reply::Attr(a) | mdt::Reply::Writing(a) => Some((fid(a.fid), None)),
        mdt::Reply::Created { attr, layout, objects } => Some((FirstAnswer { fid: attr.fid, layout, objects }, None)),
        mdt::Reply::Opened { handle, attr, layout, objects, .. } => {
            Some((FirstAnswer { fid: attr.fid, layout, objects }, Some(handle)))
        }
        _ => None,
    }
}

/// A change's reply, with the transno the client keeps it under until it is committed
/// and, after its body, what the change depended on.
fn numbered(r: Result<Answer, MdError>, n: &Numbered) -> Reply {
    let reply = match r {
        Ok(Answer::Attr(a)) => ok(mdt::Reply::Attr(a)),
        // A resend of an operation over several MDTs: the coordinator answers it.
        Ok(Answer::Intent(_)) => return fail(-NEEDS_COORDINATION, "resent".into()),
        Ok(_) => ok(mdt::Reply::Done),
        Err(e) => fail(e.status(), e.message),
    };
    depending(Reply { transno: n.transno, ..reply }, &n.depends)
}

/// `reply`, a change's, with what the change depended on after its body (kept by the
/// client with the reply, and checked when it replays: see `Mds::lost_dependency`).
fn depending(mut reply: Reply, depends: &[u64]) -> Reply {
    if reply.status == 0 && reply.transno != 0 {
        reply.body = mdt::append_depends(std::mem::take(&mut reply.body), depends);
    }
    reply
}

/// The reply key of a change: the client, the xid, what the client has acknowledged, and
/// a digest of the request.
fn reply_key(h: &nacre_net::frame::FrameHeader, client: u64, body: &[u8], bulk: &[u8]) -> ReplyKey {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    digest.update(&h.opcode.to_le_bytes());
    digest.update(body);
    digest.update(bulk);
    ReplyKey { client, xid: h.xid, acked_below: h.acked_xid, digest: digest.finalize() as u32 }
}

fn cred(c: Creds) -> Cred {
    Cred { uid: c.uid, gid: c.gid, groups: c.groups, umask: c.umask }
}

/// The change that makes regular file `name` in `dir` with `layout` (empty: inherited).
fn create_change(
    c: &Cred,
    dir: Fid,
    name: &str,
    perms: u32,
    layout: &[u8],
) -> Result<crate::mdt::namespace::Change, MdError> {
    let perms = perms & mode::PERMS;
    if layout.is_empty() {
        return Ok(Namespace::create_change(c, dir, name, perms));
    }
    let l = Layout::decode(layout).map_err(|e| MdError::new(errno::EINVAL, format!("layout: {e}")))?;
    Ok(Namespace::create_with_layout_change(c, dir, name, perms, l))
}

/// The answer of a getattr or lookup: a regular file some client has open for writing
/// says so (its size is then taken from its objects).
fn attr_reply(ns: &Namespace, a: mdt::Attr) -> mdt::Reply {
    if mode::is_reg(a.mode) && ns.is_open_for_write(a.fid) { mdt::Reply::Writing(a) } else { mdt::Reply::Attr(a) }
}

fn set_attr(s: &mdt::SetAttr) -> SetAttr {
    let on = |bit: u32| s.mask & bit != 0;
    let time = |now: u32, at: u32, v: i64| {
        if on(now) {
            Some(None)
        } else if on(at) {
            Some(Some(v))
        } else {
            None
        }
    };
    SetAttr {
        mode: on(set::MODE).then_some(s.mode),
        uid: on(set::UID).then_some(s.uid),
        gid: on(set::GID).then_some(s.gid),
        size: (on(set::SIZE) && !on(set::SIZE_AT_LEAST)).then_some(s.size),
        size_at_least: on(set::SIZE_AT_LEAST).then_some(s.size),
        atime_ns: time(set::ATIME_NOW, set::ATIME, s.atime_ns),
        mtime_ns: time(set::MTIME_NOW, set::MTIME, s.mtime_ns),
        ost_blocks: on(set::OST_BLOCKS).then_some(s.ost_blocks),
        by_writer: false,
    }
}

/// [`set_attr`], with a change through a handle (`set::BY_HANDLE`) checked: the handle
/// must be `owner`'s, on `fid`, and open for writing — unless the change is a `replay`,
/// checked when it first ran (its handle may be closed since).
fn set_attr_by(ns: &Namespace, owner: u64, fid: Fid, wire: &mdt::SetAttr, replay: bool) -> Result<SetAttr, MdError> {
    let mut s = set_attr(wire);
    if wire.mask & set::BY_HANDLE != 0 {
        if !replay && !ns.writes_through(wire.handle, fid, owner) {
            return Err(MdError::new(
                errno::EBADF,
                format!("handle {:#x} is not open for writing {fid} by this client", wire.handle),
            ));
        }
        s.by_writer = true;
    }
    Ok(s)
}

impl Mds {
    /// Serve `ns` as target `name` (`mdt0`).
    pub fn new(name: &str, ns: Arc<Namespace>) -> Arc<Mds> {
        let dne = Arc::new(Coordinator::new(ns.clone()));
        let replay_from = AtomicU64::new(ns.last_committed());
        let leases = Arc::new(Leases::new());
        let recaller = leases.clone();
        ns.set_recaller(Arc::new(move |by, keys| recaller.recall(by, keys)));
        let mds = Arc::new(Mds {
            name: name.to_string(),
            ns,
            counts: Default::default(),
            dne,
            server: Default::default(),
            stored: Default::default(),
            replayed: Default::default(),
            replay_from,
            locks: Arc::new(LockTable::new()),
            leases,
        });
        let weak = Arc::downgrade(&mds);
        mds.dne.set_recall_wait(Arc::new(move |revoked| {
            let weak = weak.clone();
            Box::pin(async move {
                if let Some(mds) = weak.upgrade() {
                    mds.recalled(&revoked).await;
                }
            })
        }));
        mds
    }

    /// Forget the clients from before this start instead of waiting for them (Lustre's
    /// `abort_recov`): their answers kept here go, and what they did not see committed
    /// is lost. For a restart of a whole single-machine file system, whose own mount is
    /// new. Returns how many there were. Blocking.
    pub fn abort_recovery(&self) -> Result<usize, MdError> {
        let clients = self.ns.known_clients();
        for &c in &clients {
            self.ns.forget_client(c)?;
        }
        if !clients.is_empty() {
            eprintln!("{}: not waiting for {} clients from before the restart", self.name, clients.len());
        }
        self.ns.remove_orphans()?;
        Ok(clients.len())
    }

    /// What this MDS adds to its server: `last_committed` and commits, and, when the
    /// namespace keeps answers for clients from before this start, a recovery that waits
    /// for them to replay (see `nacre_net::recovery`).
    ///
    /// The OST objects the pools held before this start are kept for replayed creates
    /// and destroyed after (with no recovery, at once): a create the restart lost may have
    /// been given them, and written to them.
    pub fn service(self: &Arc<Self>) -> Service {
        let clients = self.ns.known_clients();
        self.ns.expect_replays();
        if clients.is_empty() {
            self.ns.end_replays();
        }
        Service {
            commits: Some(Arc::new(MdtCommits(self.ns.clone(), self.replayed.clone(), self.locks.clone()))),
            recovering: Some(Recovering { clients, last_committed: self.ns.last_committed() }),
            // A change waits only for room in the log or for another MDT, and so does
            // the last close of an unlinked file. Those few go on in a task of their own.
            quick: [&READS[..], &CHANGES, &OPENS].concat(),
            waits: vec![mdt::MDS_LOCK, mdt::MDS_UNLOCK, mdt::MDS_LEASES],
            at_once: Some(self.at_once()),
            ..Service::default()
        }
    }

    /// The coordinator of operations over several MDTs: tell it the other MDTs
    /// ([`Coordinator::set_peers`]).
    pub fn coordinator(&self) -> &Arc<Coordinator> {
        &self.dne
    }

    /// Let go of what this MDS keeps for the clients `server` lets go (evicted, or gone):
    /// their open files are closed (a file unlinked while open goes with its last close)
    /// and their reply records deleted. A client connected again by then keeps both.
    pub fn follow_evictions(self: &Arc<Self>, server: nacre_net::server::ServerHandle) {
        let _ = self.server.set(server.clone());
        let Some(mut rx) = server.evictions() else { return };
        let (ns, locks, leases) = (self.ns.clone(), self.locks.clone(), self.leases.clone());
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match rx.recv().await {
                    Ok(client) if !server.connected(client) => {
                        leases.evict(client);
                        let held = locks.evict(client);
                        if held > 0 {
                            eprintln!("mds: client {client:016x} evicted: its {held} locks dropped");
                        }
                        let ns = ns.clone();
                        let r = tokio::task::spawn_blocking(move || ns.forget_client(client)).await;
                        if let Ok(Err(e)) = r {
                            eprintln!("mds: letting go of client {client:016x}: {}", e.message);
                        }
                    }
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                }
            }
        });
    }

    /// Run again the operations over several MDTs that a stop left half done; call it
    /// once, from the runtime, when the MDS starts. Returns how many there were.
    pub fn recover(&self) -> Result<usize, MdError> {
        self.dne.recover()
    }

    pub fn namespace(&self) -> &Arc<Namespace> {
        &self.ns
    }

    /// The transport handler of this MDS: [`Mds::serve`].
    pub fn handler(self: &Arc<Self>) -> Handler {
        let mds = self.clone();
        Arc::new(move |req: Incoming| mds.serve(req))
    }

    /// What this MDS answers at once (`Service::at_once`): reads, and locks that wait
    /// for nothing. Everything else, and what these give back, goes through
    /// [`Mds::serve`].
    // Requests come back by value, as `AtOnce` hands them: a box would cost the
    // allocation the at-once path saves.
    #[allow(clippy::result_large_err)]
    fn at_once(self: &Arc<Self>) -> nacre_net::server::AtOnce {
        let mds = self.clone();
        Arc::new(move |req: Incoming| match req.header.opcode {
            op if READS.contains(&op) => Ok(mds.handle(req)),
            mdt::MDS_LOCK | mdt::MDS_UNLOCK => mds.lock_at_once(req),
            _ => Err(req),
        })
    }

    /// Serve one request: the one dispatch of this MDS. Lookups, getattrs and listings
    /// run where they arrive: they read memory, and a hop to another thread would cost
    /// more than they do (≈ 25 µs to wake a thread here). Changes run in memory on the
    /// transport's task and are answered there before their commit (see `serve_change`).
    /// Opens and closes run where they arrive too, but for a last close that removes a
    /// file (see `try_open`); that close, and everything else, runs on blocking threads.
    ///
    /// Each kind of request gets a future of its own size. The transport boxes every
    /// request's future; one future for all kinds measured 6 KiB, allocated and copied
    /// for every lock, lookup or create.
    pub fn serve(self: &Arc<Self>, req: Incoming) -> BoxFuture<'static, Reply> {
        if READS.contains(&req.header.opcode) {
            return Box::pin(std::future::ready(self.handle(req)));
        }
        // State only a replay can bring back (an open, a lock) makes its client one this
        // MDS waits for after a restart, though it made no change: recorded (and on the
        // drives) before the state is granted, once per client.
        if req.replayed.is_none()
            && matches!(req.header.opcode, mdt::MDS_OPEN | mdt::MDS_OPEN_AT | mdt::MDS_LOCK)
            && !self.ns.knows_client(req.client)
        {
            let mds = self.clone();
            return Box::pin(async move {
                let (ns, client) = (mds.ns.clone(), req.client);
                match tokio::task::spawn_blocking(move || ns.remember_client(client)).await {
                    Ok(Ok(())) => mds.serve_known(req).await,
                    Ok(Err(e)) => fail(e.status(), e.message),
                    Err(e) => fail(-errno::EIO, format!("recording client {client:016x}: {e}")),
                }
            });
        }
        self.serve_known(req)
    }

    /// [`Mds::serve`] for a request whose client is known (or need not be).
    fn serve_known(self: &Arc<Self>, req: Incoming) -> BoxFuture<'static, Reply> {
        let mds = self.clone();
        match req.header.opcode {
            mdt::MDS_LOCK | mdt::MDS_UNLOCK => Box::pin(async move { mds.serve_lock(&req).await }),
            mdt::MDS_LEASES => Box::pin(async move { mds.serve_leases(&req).await }),
            mdt::MDS_OPEN | mdt::MDS_OPEN_AT if req.replayed.is_some() => {
                Box::pin(async move { mds.reopen(&req).await })
            }
            _ => match self.try_open(&req) {
                Some(reply) => {
                    Box::pin(async move { mds.opened_for_write(req.client, req.header.opcode, &req.body, reply).await })
                }
                None => Box::pin(async move { mds.serve_other(req).await }),
            },
        }
    }

    /// A change, or what runs on a blocking thread (see [`Mds::serve`]). The rare waits
    /// (a commit before the reply, callbacks, coordination with other MDTs) are boxed, so
    /// the common change's future stays small.
    async fn serve_other(self: Arc<Self>, req: Incoming) -> Reply {
        let (header, client) = (req.header, req.client);
        if let Some(first) = &req.replayed
            && let Some(why) = self.lost_dependency(first)
        {
            return fail(-errno::EOVERFLOW, why);
        }
        let replay = req.replayed.is_some();
        let (reply, body) = match self.serve_change(&req).await {
            Some(Answered { mut reply, recall, recalled, first }) => {
                // A client's first change is committed before its reply: the answers kept
                // for it are what tells a restarted MDS to wait for it in recovery.
                if (reply.transno == 0 || first) && !self.ns.sync_on_reply() {
                    // Not numbered (an operation over several MDTs), or the client's first:
                    // durable before it is answered, so never replayed.
                    if let Err(e) = Box::pin(self.ns.committed_all()).await {
                        reply = fail(e.status(), e.message);
                    }
                }
                if !recalled.is_empty() {
                    Box::pin(self.recalled(&recalled)).await;
                }
                if recall != 0 {
                    reply = self.lease_reply(client, recall, header.opcode, &req.body, reply);
                }
                (reply, req.body)
            }
            None => {
                let (m, body) = (self.clone(), req.body.clone());
                let reply = match tokio::task::spawn_blocking(move || m.handle(req)).await {
                    Ok(r) => r,
                    Err(e) => fail(-errno::EIO, format!("the request failed inside the server: {e}")),
                };
                (Box::pin(self.opened_for_write(client, header.opcode, &body, reply)).await, body)
            }
        };
        if reply.status == -NEEDS_COORDINATION {
            return Box::pin(self.coordinate(header, client, &body)).await;
        }
        if replay && reply.status == 0 {
            self.replayed.lock().unwrap_or_else(|e| e.into_inner()).insert(header.transno);
        }
        reply
    }

    /// The callback channel of a client (see [`crate::leases`]): its acknowledgement is
    /// taken, and the revocations after it answered, once there are any or after
    /// [`LEASE_POLL_SLICE`] with none. It runs apart from the service slots
    /// (`Service::waits`).
    async fn serve_leases(&self, req: &Incoming) -> Reply {
        let acked = match Request::decode(req.header.opcode, &req.body) {
            Ok((_, Request::Leases { acked })) => acked,
            Ok(_) => return fail(-errno::EIO, "not a lease poll".into()),
            Err(e) => return fail(-EPROTO, format!("bad MDS request: {e}")),
        };
        self.count(req.header.opcode);
        let deadline = tokio::time::Instant::now() + LEASE_POLL_SLICE;
        loop {
            match self.leases.poll(req.client, acked) {
                Err(why) => return fail(-errno::EINVAL, why),
                Ok(Poll::Revoked(v)) => return ok(mdt::Reply::Revoked(v)),
                Ok(Poll::Wait(wake)) => {
                    if tokio::time::timeout_at(deadline, wake.notified()).await.is_err() {
                        return ok(mdt::Reply::Revoked(Vec::new()));
                    }
                }
            }
        }
    }

    /// Wait until the clients whose leases a change revoked have given them up; evict
    /// those that do not answer within `lease_callback_timeout_ms` (their caches can no
    /// longer be trusted, nor their locks kept), so the others are not held up longer.
    async fn recalled(&self, revoked: &[(u64, u64)]) {
        if revoked.is_empty() {
            return;
        }
        for client in self.leases.acknowledged(revoked).await {
            eprintln!(
                "{}: client {client:016x} did not give up a lease within {:?}: evicted",
                self.name,
                self.leases.callback_timeout()
            );
            self.leases.evict(client);
            if let Some(server) = self.server.get() {
                server.evict(client);
            }
        }
    }

    /// `reply` to a request from `client` read after recall clock `since`, with the
    /// leases it grants if the client listens for callbacks (see
    /// [`mdt::lease::granted`]). A listing with a file some client writes is not leased
    /// (its entries do not say so).
    fn lease_reply(&self, client: u64, since: u64, opcode: u16, body: &[u8], mut reply: Reply) -> Reply {
        if !self.leases.listens(client) || (reply.status != 0 && reply.status != -errno::ENOENT) {
            return reply;
        }
        let Ok((_, r)) = Request::decode(opcode, body) else { return reply };
        let answer = if reply.status == 0 {
            match mdt::Reply::decode(&reply.body) {
                Ok(a) => Ok(a),
                Err(_) => return reply,
            }
        } else {
            Err(-reply.status)
        };
        let keys = mdt::lease::granted(&r, answer.as_ref().map_err(|e| *e));
        if let Ok(mdt::Reply::Entries { entries, .. }) = &answer
            && !self.ns.open_for_write(entries.iter().map(|(e, _)| e.fid)).is_empty()
        {
            return reply;
        }
        reply.leased = self.leases.grant(client, &keys, since);
        reply
    }

    /// An open for writing takes back the attribute leases other clients hold on the
    /// file (its size will change on the OSTs) and waits for them; no one is granted one
    /// until it closes (its reads answer `Writing`).
    async fn opened_for_write(&self, client: u64, opcode: u16, body: &[u8], reply: Reply) -> Reply {
        if reply.status != 0 || !matches!(opcode, mdt::MDS_OPEN | mdt::MDS_OPEN_AT) {
            return reply;
        }
        let write = matches!(
            Request::decode(opcode, body),
            Ok((_, Request::Open { write: true, .. } | Request::OpenAt { write: true, .. }))
        );
        if let (true, Ok(mdt::Reply::Opened { attr, .. })) = (write, mdt::Reply::decode(&reply.body)) {
            // An append lock kept by another mount goes too (Leases::recall).
            let (_, revoked) = self.leases.recall(Some(client), &[mdt::lease::Key::Attr(attr.fid)]);
            self.recalled(&revoked).await;
        }
        reply
    }

    /// Why a replayed change must not run, if it must not: it depended on a change (by the
    /// transnos its first reply named) that is neither on the drives from before the
    /// restart nor replayed since, so lost with its client; it would apply to a state
    /// its own client never saw (version-based recovery).
    fn lost_dependency(&self, first: &[u8]) -> Option<String> {
        let (_, depends) = mdt::Reply::decode_depending(first).ok()?;
        let committed = self.replay_from.load(Ordering::Relaxed);
        let replayed = self.replayed.lock().unwrap_or_else(|e| e.into_inner());
        let lost = depends.into_iter().find(|d| *d > committed && !replayed.contains(d))?;
        Some(format!(
            "version-based recovery: this change depended on transno {lost}, which was lost with its client \
             (not on the drives, not replayed)"
        ))
    }

    /// An open replayed after a restart: the file its first reply named (by FID: a name
    /// may have moved since) is opened again under the same handle, even if it was
    /// unlinked meanwhile (it lives until its last close).
    async fn reopen(&self, req: &Incoming) -> Reply {
        let (read, write) = match Request::decode(req.header.opcode, &req.body) {
            Ok((_, Request::Open { read, write, .. } | Request::OpenAt { read, write, .. })) => (read, write),
            _ => return fail(-EPROTO, "bad replayed open".into()),
        };
        let Some((FirstAnswer { fid, .. }, Some(handle))) = first_answer(&req.replayed) else {
            return fail(-EPROTO, "a replayed open without the handle it got".into());
        };
        self.count(req.header.opcode);
        self.open_for(req.client, fid, read, write, Some(handle), None)
    }

    /// Open `fid` for `owner`: a new handle for a file just created, or `handle` again for
    /// a replay; the reply carries `dir`, the directory as the create left it, if given.
    /// Served where it arrives: the handle table is held only for moments, by changes
    /// run in memory and other opens.
    fn open_for(
        &self,
        owner: u64,
        fid: Fid,
        read: bool,
        write: bool,
        handle: Option<u64>,
        dir: Option<mdt::Attr>,
    ) -> Reply {
        let ns = &self.ns;
        let opened = match handle {
            Some(h) => ns.reopen(owner, fid, read, write, h),
            None => ns.open_created(owner, fid, read, write),
        };
        let r = opened.and_then(|(handle, attr)| handle_reply(ns, handle, attr, dir));
        Reply { open_state: true, ..answer(r, |r| r) }
    }

    /// An open, open-by-name or close served on the transport's task, unless it is a
    /// close that must remove a file unlinked meanwhile (a change, which may wait for room
    /// in the log). `None`: not one of those, or such a close (then `handle` serves it).
    fn try_open(&self, req: &Incoming) -> Option<Reply> {
        if !OPENS.contains(&req.header.opcode) {
            return None;
        }
        // A malformed body goes to `handle`, which answers it.
        let (creds, r) = Request::decode(req.header.opcode, &req.body).ok()?;
        let reply = self.serve_open(req.client, &cred(creds), r, false)?;
        self.count(req.header.opcode);
        Some(reply)
    }

    /// An open, open-by-name or close for client `owner`. `None`: not one of those, or,
    /// unless `may_change`, a last close of a file unlinked meanwhile, which removes it (a
    /// change, which may wait for room in the log).
    fn serve_open(&self, owner: u64, c: &Cred, r: Request, may_change: bool) -> Option<Reply> {
        let ns = &self.ns;
        let mut reply = match r {
            Request::Open { fid, read, write, dom_read } => {
                opened(ns, ns.open_reading(owner, c, fid, read, write, dom_read).map(OpenAnswer::Here))
            }
            Request::OpenAt { dir, name, read, write, dom_read } => {
                opened(ns, ns.open_at(owner, c, dir, &name, read, write, dom_read))
            }
            Request::Close { handle } => {
                let written = ns.handle_of(owner, handle).filter(|&(_, write)| write).map(|(fid, _)| fid);
                let closed = match may_change {
                    false => ns.try_close_file(owner, handle)?,
                    true => ns.close_file(owner, handle),
                };
                // A writer's close answers the file's attributes as it leaves them: the
                // mount that wrote it knows, by them, that a later open finds the file
                // unchanged since (and keeps the kernel's pages of it).
                answer(closed, |_| match written.and_then(|fid| ns.getattr(fid).ok()) {
                    Some(a) if a.nlink > 0 => mdt::Reply::Attr(a),
                    _ => mdt::Reply::Done,
                })
            }
            _ => return None,
        };
        if reply.open_state {
            // Read after the open: every change it saw has a transno up to this one (a
            // change gets its transno before others see it), so its replay goes after.
            reply.after = ns.transnos().0;
        }
        Some(reply)
    }

    /// Parameters whose names match `pattern`: `mdt.NAME.md_stats` (operations served),
    /// `mdt.NAME.commits` (log writes, the changes they carried, checkpoints, transnos),
    /// `memory` (bytes held, per inode), `memory_max`, `sync_on_reply`, `log` (bytes in
    /// use of the log), `inodes`, `kbytestotal` and `kbytesfree` (the image's room on its
    /// volume).
    pub fn get_param(&self, pattern: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut add = |leaf: &str, value: &dyn Fn() -> String| {
            let full = format!("mdt.{}.{leaf}", self.name);
            if nacre_net::glob::glob(pattern, &full) {
                out.push((full, value()));
            }
        };
        add("md_stats", &|| {
            OPS.iter()
                .zip(&self.counts)
                .filter(|(_, c)| c.load(Ordering::Relaxed) > 0)
                .map(|((_, n), c)| format!("{n} {}", c.load(Ordering::Relaxed)))
                .collect::<Vec<_>>()
                .join("\n")
        });
        add("commits", &|| {
            let s = &self.ns.stats;
            let (last, committed) = self.ns.transnos();
            format!(
                "commits {}\nchanges {}\nreplayed {}\ncheckpoints {}\nrecovered {}\nlast_transno {last}\nlast_committed {committed}",
                s.commits.load(Ordering::Relaxed),
                s.changes.load(Ordering::Relaxed),
                s.replayed.load(Ordering::Relaxed),
                s.checkpoints.load(Ordering::Relaxed),
                s.recovered.load(Ordering::Relaxed),
            )
        });
        add("locks", &|| {
            let s = self.locks.stats();
            format!(
                "held {}\nwaiting {}\ngranted {}\nwaited {}\nconflicts {}\ndeadlocks {}\nevicted {}",
                s.held, s.waiting, s.granted, s.waited, s.conflicts, s.deadlocks, s.evicted
            )
        });
        add("exports", &|| {
            let locks = self.locks.by_client();
            let clients = self.server.get().map(|s| s.clients()).unwrap_or_default();
            let line = |(c, nid): &(u64, nacre_net::nid::Nid)| {
                let (held, waiting) = locks.get(c).copied().unwrap_or_default();
                format!("{c:016x} peer={nid} locks={held} waiting={waiting}")
            };
            clients.iter().map(line).collect::<Vec<_>>().join("\n")
        });
        add("recovery_status", &|| RecoveryStats::render(self.server.get().and_then(|s| s.recovery())));
        add("memory", &|| {
            let (bytes, inodes) = self.ns.memory_used();
            format!("bytes {bytes}\ninodes {inodes}\nbytes_per_inode {}", bytes / inodes.max(1))
        });
        add("leases", &|| {
            let (held, clients) = self.leases.counts();
            let st = &self.leases.stats;
            let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
            format!(
                "held {held}\nclients {clients}\ngranted {}\nrefused {}\nrevoked {}\nreclaimed {}\ncallback_timeouts {}",
                n(&st.granted),
                n(&st.refused),
                n(&st.revoked),
                n(&st.reclaimed),
                n(&st.timeouts)
            )
        });
        add("lease_callback_timeout_ms", &|| self.leases.callback_timeout().as_millis().to_string());
        add("lease_contended_ms", &|| self.leases.contended().as_millis().to_string());
        add("lease_per_client_max", &|| self.leases.per_client_max().to_string());
        add("lease_max", &|| self.leases.total_max().to_string());
        add("memory_max", &|| self.ns.memory_max().to_string());
        add("sync_on_reply", &|| u8::from(self.ns.sync_on_reply()).to_string());
        add("commit_interval_ms", &|| self.ns.commit_interval().as_millis().to_string());
        add("recovery_time_soft", &|| {
            self.server.get().and_then(|s| s.recovery_window()).map_or("-".into(), |w| w.0.as_secs().to_string())
        });
        add("recovery_time_hard", &|| {
            self.server.get().and_then(|s| s.recovery_window()).map_or("-".into(), |w| w.1.as_secs().to_string())
        });
        add("log", &|| {
            let (used, size) = self.ns.log_usage();
            format!("bytes_used {used}\nbytes_total {size}")
        });
        let statfs = std::cell::OnceCell::new();
        let statfs = || statfs.get_or_init(|| self.ns.statfs().ok()).as_ref();
        add("inodes", &|| statfs().map_or("-".into(), |s| s.inodes.to_string()));
        add("kbytestotal", &|| statfs().map_or("-".into(), |s| (s.bytes_total >> 10).to_string()));
        add("kbytesfree", &|| {
            statfs().map_or("-".into(), |s| ((s.bytes_total - s.bytes_used.min(s.bytes_total)) >> 10).to_string())
        });
        out
    }

    /// Set a parameter while running (`mdt.NAME.sync_on_reply`, `mdt.NAME.memory_max`);
    /// an error names what is wrong and changes nothing.
    pub fn set_param(&self, name: &str, value: &str) -> Result<(), String> {
        let value = value.trim();
        let leaf = name
            .strip_prefix("mdt.")
            .and_then(|r| r.strip_prefix(self.name.as_str()))
            .and_then(|r| r.strip_prefix('.'))
            .ok_or_else(|| format!("no settable parameter {name:?} on mdt.{}", self.name))?;
        match leaf {
            "evict_client" => {
                let client = u64::from_str_radix(value, 16)
                    .map_err(|_| format!("evict_client {value:?}: a client id in hex, as mdt.*.exports lists"))?;
                match self.server.get() {
                    Some(s) if s.evict(client) => Ok(()),
                    _ => Err(format!("evict_client {value}: no such client connected")),
                }
            }
            "sync_on_reply" => match value {
                "0" | "1" => {
                    self.ns.set_sync_on_reply(value == "1");
                    Ok(())
                }
                _ => Err(format!("sync_on_reply {value:?}: 0 or 1")),
            },
            "memory_max" => {
                let v: u64 = value.parse().map_err(|_| format!("memory_max {value:?} is not a number of bytes"))?;
                if v < 1 << 20 {
                    return Err(format!("memory_max {v}: at least 1 MiB"));
                }
                self.ns.set_memory_max(v);
                Ok(())
            }
            "commit_interval_ms" => {
                let v = number(leaf, value, "milliseconds", 1..=10_000u64)?;
                self.ns.set_commit_interval(std::time::Duration::from_millis(v));
                Ok(())
            }
            "lease_callback_timeout_ms" | "lease_contended_ms" => {
                if leaf == "lease_contended_ms" {
                    let v = number(leaf, value, "milliseconds", 0..=60_000u64)?;
                    self.leases.set_contended(std::time::Duration::from_millis(v));
                } else {
                    // Within the transport's timeout, or the waiting change's client resends.
                    let v = number(leaf, value, "milliseconds", 10..=60_000u64)?;
                    self.leases.set_callback_timeout(std::time::Duration::from_millis(v));
                }
                Ok(())
            }
            "lease_per_client_max" | "lease_max" => {
                let v = number(leaf, value, "leases", 1..=1usize << 30)?;
                if leaf == "lease_max" {
                    self.leases.set_total_max(v);
                } else {
                    self.leases.set_per_client_max(v);
                }
                Ok(())
            }
            "recovery_time_soft" | "recovery_time_hard" => {
                let v: u64 = value.parse().map_err(|_| format!("{leaf} {value:?} is not a number of seconds"))?;
                let server = self.server.get().ok_or("the MDS is not serving yet")?;
                let (mut soft, mut hard) = server.recovery_window().ok_or("the MDS has stopped")?;
                let v = std::time::Duration::from_secs(v);
                if leaf == "recovery_time_soft" {
                    soft = v;
                } else {
                    hard = v;
                }
                server.set_recovery_window(soft, hard)
            }
            _ => Err(format!("no settable parameter {name:?} (mdt.{}: {})", self.name, SETTABLE.join(", "))),
        }
    }

    /// Take the parameters stored in the MGS (`set-param -P mdt.*.recovery_time_soft=300`)
    /// that name a settable one of this MDT, each when its stored value is new to it (a
    /// value set here since stays until the stored one changes). A stored value this MDT
    /// refuses is logged.
    pub fn apply_stored(&self, params: &[(String, String)]) {
        let mut applied = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        // An eviction is an act of the moment, never a stored setting.
        for leaf in SETTABLE.iter().filter(|l| **l != "evict_client") {
            let full = format!("mdt.{}.{leaf}", self.name);
            let Some((_, value)) = params.iter().rev().find(|(n, _)| nacre_net::glob::glob(n, &full)) else {
                continue;
            };
            if applied.get(*leaf) == Some(value) {
                continue;
            }
            if let Err(e) = self.set_param(&full, value) {
                eprintln!("mds: stored parameter {full}={value}: {e}");
            }
            applied.insert(leaf.to_string(), value.clone());
        }
    }

    /// Decode a request, count it, and make its reply key if it is a change.
    fn prepare(&self, req: &Incoming) -> Result<(Cred, Request, Option<ReplyKey>), Reply> {
        let (creds, r) = Request::decode(req.header.opcode, &req.body)
            .map_err(|e| fail(-EPROTO, format!("bad MDS request: {e}")))?;
        Ok(self.account(req, creds, r))
    }

    /// Count one request of opcode `op` in `md_stats`.
    fn count(&self, op: u16) {
        if let Some(i) = OPS.iter().position(|(o, _)| *o == op) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Count a decoded request and make its reply key if it is a change.
    fn account(&self, req: &Incoming, creds: Creds, r: Request) -> (Cred, Request, Option<ReplyKey>) {
        self.count(req.header.opcode);
        let key = r.is_change().then(|| reply_key(&req.header, req.client, &req.body, &req.bulk));
        (cred(creds), r, key)
    }

    /// Take, test or drop a byte-range lock (see [`crate::locks`]). A lock that must wait
    /// holds its request (it runs apart from the service slots: `Service::waits`) until
    /// granted, or for [`LOCK_WAIT_SLICE`], after which it is answered ETIMEDOUT and the
    /// client asks again.
    async fn serve_lock(&self, req: &Incoming) -> Reply {
        let r = match Request::decode(req.header.opcode, &req.body) {
            Ok((_, r)) => r,
            Err(e) => return fail(-EPROTO, format!("bad MDS request: {e}")),
        };
        self.count(req.header.opcode);
        let mut step = self.lock_step(req, r.clone(), false);
        if let LockStep::Recall = step {
            // Other mounts may keep locks of this file their owners let go of: they let
            // go of them (or are evicted) before the conflict is judged.
            if let Request::Lock { fid, .. } = &r {
                let (_, revoked) = self.leases.recall(Some(req.client), &[mdt::lease::Key::Locks(*fid)]);
                self.recalled(&revoked).await;
            }
            step = self.lock_step(req, r, true);
        }
        let c = match step {
            LockStep::Answer(reply) => return reply,
            LockStep::Conflict(c) => c,
            LockStep::Recall => return fail(-errno::EIO, "a lock looked at again after its recall".into()),
        };
        let (res, fid, start, end) = (c.res, c.res.fid, c.want.start, c.want.end);
        let queued = match self.locks.lock(res, c.want, c.flags & lock::WAIT != 0) {
            // Let go meanwhile.
            Ok(None) => return self.lock_granted(req.client, &c),
            Ok(Some(q)) => q,
            Err(e) => return fail(-e.errno, e.message),
        };
        if res.append {
            // A mount may keep the append lock it holds: call it back.
            let (_, revoked) = self.leases.recall(None, &[mdt::lease::Key::Append(fid)]);
            self.recalled(&revoked).await;
        } else {
            // No lease on the file while this waits: one granted before it joined the
            // queue is called back (its requester's own mount too: another owner there
            // may keep a lock it let go of in this one's way), and one asked before this
            // recall is refused (the recall moves the clock past it).
            let (_, revoked) = self.leases.recall(None, &[mdt::lease::Key::Locks(fid)]);
            self.recalled(&revoked).await;
        }
        let mut granted = queued.granted;
        let outcome = match tokio::time::timeout(LOCK_WAIT_SLICE, &mut granted).await {
            Ok(outcome) => outcome.map_err(|_| ()),
            Err(_) if self.locks.cancel(res, queued.id) => {
                return fail(
                    -errno::ETIMEDOUT,
                    format!("still waiting for bytes {start}..={end} of {fid} after {LOCK_WAIT_SLICE:?}: ask again"),
                );
            }
            // Granted as the time ran out.
            Err(_) => granted.try_recv().map_err(|_| ()),
        };
        match outcome {
            Ok(Ok(())) => self.lock_granted(req.client, &c),
            Ok(Err(e)) => fail(-e.errno, e.message),
            Err(_) => fail(-errno::ENOLCK, format!("the wait for a lock on {fid} was dropped")),
        }
    }

    /// A lock request answered at once, for the transport's path that skips a request's
    /// setting up (`Service::at_once`): an unlock, a test, a lock that conflicts with
    /// nothing, or an error. The request back, with nothing changed or counted, if it
    /// must wait or be queued, its client is not yet recorded (see [`Mds::serve`]), or it
    /// does not decode (the usual path answers it).
    #[allow(clippy::result_large_err)] // as `Mds::at_once`
    fn lock_at_once(&self, req: Incoming) -> Result<Reply, Incoming> {
        if req.header.opcode == mdt::MDS_LOCK && !self.ns.knows_client(req.client) {
            return Err(req);
        }
        let Ok((_, r)) = Request::decode(req.header.opcode, &req.body) else { return Err(req) };
        match self.lock_step(&req, r, false) {
            LockStep::Answer(reply) => {
                self.count(req.header.opcode);
                Ok(reply)
            }
            LockStep::Conflict(_) | LockStep::Recall => Err(req),
        }
    }

    /// A decoded lock request, as far as it goes without waiting or queueing. Once
    /// `recalled`, a conflict is what it is (no [`LockStep::Recall`]).
    fn lock_step(&self, req: &Incoming, r: Request, recalled: bool) -> LockStep {
        let answer = LockStep::Answer;
        let (fid, handle, owner, pid, kind, flags, start, end) = match r {
            Request::Unlock { fid, owner } => {
                let o = Owner { client: req.client, owner };
                for append in [false, true] {
                    self.locks.release(Resource { fid, append }, o);
                }
                return answer(ok(mdt::Reply::Done));
            }
            Request::Lock { fid, handle, owner, pid, kind, flags, start, end } => {
                (fid, handle, owner, pid, kind, flags, start, end)
            }
            _ => return answer(fail(-errno::EIO, "not a lock request".into())),
        };
        if let Err(e) = crate::locks::check_range(start, end) {
            return answer(fail(-e.errno, e.message));
        }
        if flags & lock::CACHE != 0
            && (kind == lock::UNLOCK || flags & lock::TEST != 0 || flags & lock::APPEND != 0 && kind != lock::WRITE)
        {
            return answer(fail(
                -errno::EINVAL,
                "only a read or write lock taken (of the appends: a write lock) is kept until called back".into(),
            ));
        }
        let since = self.leases.clock();
        if !self.ns.opened_by(handle, fid, req.client) {
            return answer(fail(-errno::EBADF, format!("handle {handle} is not this client's open of {fid}")));
        }
        // A replay takes again a lock its client held before the restart: it was granted
        // then, so it waits for nothing now (a conflict means it was lost).
        let flags = if req.replayed.is_some() { flags & !lock::WAIT } else { flags };
        let res = Resource { fid, append: flags & lock::APPEND != 0 };
        let want = Lock { owner: Owner { client: req.client, owner }, write: kind == lock::WRITE, start, end, pid };
        if flags & lock::TEST != 0 {
            if kind == lock::UNLOCK {
                return answer(fail(
                    -errno::EINVAL,
                    "a lock test asks for a read or a write lock, not an unlock".into(),
                ));
            }
            if !recalled && self.cached_by_others(res, &want) {
                return LockStep::Recall;
            }
            return answer(ok(match self.locks.test(res, &want) {
                Some(h) => {
                    let kind = if h.write { lock::WRITE } else { lock::READ };
                    mdt::Reply::Lock { kind, start: h.start, end: h.end, pid: h.pid }
                }
                None => mdt::Reply::Lock { kind: lock::UNLOCK, start, end, pid: 0 },
            }));
        }
        if kind == lock::UNLOCK {
            self.locks.unlock(res, want.owner, start, end);
            return answer(ok(mdt::Reply::Done));
        }
        let c = LockAsk { res, want, handle, flags, since };
        match self.locks.try_lock(res, want) {
            Ok(true) => answer(self.lock_granted(req.client, &c)),
            Ok(false) if !recalled && self.cached_by_others(res, &want) => LockStep::Recall,
            Ok(false) => LockStep::Conflict(c),
            Err(e) => answer(fail(-e.errno, e.message)),
        }
    }

    /// Does `want` conflict with a lock of a client that holds the file's `Locks` lease,
    /// which may keep locks its owners let go of?
    fn cached_by_others(&self, res: Resource, want: &Lock) -> bool {
        let key = mdt::lease::Key::Locks(res.fid);
        !res.append && self.locks.conflicting_clients(res, want).into_iter().any(|c| self.leases.holds(c, &key))
    }

    /// The reply to a lock granted, with the lease that keeps it if asked (`lock::CACHE`):
    /// an append lock's when its client is the file's one writer, whose end is all the
    /// end there is; a user's lock, the file's `Locks` lease unless someone waits for a
    /// lock of the file, who must be woken by the next unlock.
    fn lock_granted(&self, client: u64, c: &LockAsk) -> Reply {
        let mut reply = ok(mdt::Reply::Done);
        let fid = c.res.fid;
        if c.flags & lock::CACHE == 0 {
            return reply;
        }
        let key = if c.res.append {
            if !self.ns.sole_writer(c.handle, fid, client) {
                return reply;
            }
            mdt::lease::Key::Append(fid)
        } else {
            if self.locks.has_waiters(c.res) {
                return reply;
            }
            mdt::lease::Key::Locks(fid)
        };
        reply.leased = self.leases.grant(client, &[key], c.since);
        reply
    }

    /// Carry out, over several MDTs, a change the local path found it could not make
    /// alone (a remote inode, a striped directory).
    async fn coordinate(&self, header: nacre_net::frame::FrameHeader, client: u64, body: &[u8]) -> Reply {
        let (creds, r) = match Request::decode(header.opcode, body) {
            Ok(v) => v,
            Err(e) => return fail(-EPROTO, format!("bad MDS request: {e}")),
        };

        let key = Some(reply_key(&header, client, body, &[]));
        let (c, dne) = (cred(creds), &self.dne);
        let _entered = match dne.enter() {
            Ok(p) => p,
            Err(e) => return fail(e.status(), e.message),
        };
        // A resend finds the operation its first copy began (or its answer).
        let r = match dne.stored(key).await {
            Some(r) => r,
            None => self.plan(key, &c, r).await,
        };
        match r {
            Ok(Answer::Attr(a)) => ok(mdt::Reply::Attr(a)),
            Ok(_) => ok(mdt::Reply::Done),
            Err(e) => fail(e.status(), e.message),
        }
    }

    /// Plan and run a change over several MDTs.
    async fn plan(&self, key: Option<ReplyKey>, c: &Cred, r: Request) -> Result<Answer, MdError> {
        let dne = &self.dne;
        match r {
            Request::Unlink { dir, name, rmdir } => dne.remove(key, c, dir, &name, rmdir).await,
            Request::Rename { src_dir, src_name, dst_dir, dst_name, noreplace } => {
                let how = if noreplace { RenameMode::NoReplace } else { RenameMode::Replace };
                dne.rename(key, c, src_dir, &src_name, dst_dir, &dst_name, how).await
            }
            Request::Link { fid, dir, name } => dne.link(key, c, fid, dir, &name).await,
            Request::Setattr { fid, set } => dne.setattr(key, c, fid, set_attr(&set)).await,
            Request::Setdirdefault { dir, default } => {
                let d = if default.is_empty() {
                    None
                } else {
                    Some(
                        nacre_proto::dne::DirDefault::decode(&default)
                            .map_err(|e| MdError::new(errno::EINVAL, format!("directory default: {e}")))?,
                    )
                };
                dne.set_default(key, c, dir, d).await
            }
            other => Err(MdError::new(errno::EIO, format!("{other:?} cannot span MDTs"))),
        }
    }

    /// Every change (creates of every kind, links, unlinks, renames, setattrs, xattrs,
    /// layouts, DoM writes, DNE's) runs in memory on the transport's task and is answered
    /// there, before its commit: no blocking thread per request.
    /// `None` for every other request.
    async fn serve_change(self: &Arc<Self>, req: &Incoming) -> Option<Answered> {
        if !CHANGES.contains(&req.header.opcode) {
            return None;
        }
        // A malformed body goes to `handle`, which answers it.
        let (creds, r) = Request::decode(req.header.opcode, &req.body).ok()?;
        let (c, r, key) = self.account(req, creds, r);
        // An unlink answers with its directory's attributes: the kernel drops them at
        // every unlink and asks again before the next (its permission check), and the
        // mount answers that from this reply instead of another round trip.
        let parent = match &r {
            Request::Unlink { dir, .. } => Some(*dir),
            _ => None,
        };
        let (change, weight) = match r {
            Request::Create { dir, name, mode: m, .. } if m & mode::S_IFMT == mode::S_IFDIR => {
                return Box::pin(self.mkdir(req, key, &c, dir, &name, m & mode::PERMS, -1, 0)).await;
            }
            Request::Mkdir { dir, name, mode: m, mdt: at, count } => {
                return Box::pin(self.mkdir(req, key, &c, dir, &name, m & mode::PERMS, at, count)).await;
            }
            Request::Setdirdefault { dir, default } => {
                let d = if default.is_empty() {
                    None
                } else {
                    match nacre_proto::dne::DirDefault::decode(&default) {
                        Ok(d) => match d.validate(self.dne.mdts()) {
                            Ok(()) => Some(d),
                            Err(e) => return done(fail(-errno::EINVAL, format!("directory default: {e}"))),
                        },
                        Err(e) => return done(fail(-errno::EINVAL, format!("directory default: {e}"))),
                    }
                };
                (Namespace::set_dir_default_change(&c, dir, d), 0)
            }
            Request::Update { coordinator, xid, acked_below, update } => {
                let key = ReplyKey {
                    client: coordinator_client(coordinator),
                    xid,
                    acked_below,
                    digest: update_digest(&update),
                };
                // Another MDT's step: committed before its answer (its coordinator keeps
                // no replay list), so no transno; answered once the leases it changed
                // are given up, as a change of this MDT's own is.
                let (answer, n) = self.ns.submit_numbered(Some(key), Namespace::update_change(update), 0).await;
                let reply = match answer {
                    Ok(Answer::Attr(a)) => ok(mdt::Reply::Attr(a)),
                    Ok(_) => ok(mdt::Reply::Done),
                    Err(e) => fail(e.status(), e.message),
                };
                return Some(Answered { reply, recall: 0, recalled: n.recalled, first: false });
            }
            Request::Create { dir, name, mode: m, target, layout, rdev } => {
                if rdev != 0 && !mode::is_device(m) {
                    let t = m & mode::S_IFMT;
                    return done(fail(-errno::EINVAL, format!("a device number ({rdev:#x}) for file type {t:o}")));
                }
                let perms = m & mode::PERMS;
                if !req.bulk.is_empty() {
                    // A small file and its first bytes, kept on the MDT, in one change.
                    let made = match m & mode::S_IFMT {
                        mode::S_IFREG | 0 if layout.is_empty() => {
                            self.ns.create_with_data_change(&c, dir, &name, perms, &req.bulk)
                        }
                        _ => Err(MdError::new(
                            errno::EINVAL,
                            "data comes with the create of a regular file that inherits its layout".to_string(),
                        )),
                    };
                    match made {
                        Ok(v) => v,
                        Err(e) => return done(fail(e.status(), e.message)),
                    }
                } else {
                    if matches!(m & mode::S_IFMT, mode::S_IFREG | 0) && req.replayed.is_none() {
                        self.ns.objects_ready().await;
                    }
                    let change = match m & mode::S_IFMT {
                        mode::S_IFLNK => Namespace::symlink_change(&c, dir, &name, &target),
                        mode::S_IFREG | 0 if !layout.is_empty() => match Layout::decode(&layout) {
                            Ok(l) => Ok(Namespace::create_with_layout_change(&c, dir, &name, perms, l)),
                            Err(e) => Err(MdError::new(errno::EINVAL, format!("layout: {e}"))),
                        },
                        mode::S_IFREG | 0 => Ok(Namespace::create_change(&c, dir, &name, perms)),
                        t if mode::is_special(t) => Namespace::mknod_change(&c, dir, &name, m, rdev),
                        other => Err(MdError::new(errno::EINVAL, format!("file type {other:o} is not supported"))),
                    };
                    match change {
                        Ok(change) => (change, 0),
                        Err(e) => return done(fail(e.status(), e.message)),
                    }
                }
            }
            Request::Link { fid, dir, name } => (Namespace::link_change(&c, fid, dir, &name), 0),
            // Their checks read an inode or validate a layout: quick, from redb's cache.
            Request::Setxattr { fid, name, value, flags } => {
                let (create, replace) = (flags & xattr::CREATE != 0, flags & xattr::REPLACE != 0);
                match self.ns.setxattr_change(&c, fid, &name, &value, create, replace) {
                    Ok(v) => v,
                    Err(e) => return done(fail(e.status(), e.message)),
                }
            }
            Request::Removexattr { fid, name } => match self.ns.removexattr_change(&c, fid, &name) {
                Ok(change) => (change, 0),
                Err(e) => return done(fail(e.status(), e.message)),
            },
            Request::Setdirlayout { dir, layout } => {
                let l = if layout.is_empty() { Ok(None) } else { Layout::decode(&layout).map(Some) };
                match l
                    .map_err(|e| MdError::new(errno::EINVAL, format!("layout: {e}")))
                    .and_then(|l| self.ns.set_dir_layout_change(&c, dir, l))
                {
                    Ok(change) => (change, 0),
                    Err(e) => return done(fail(e.status(), e.message)),
                }
            }
            Request::Rename { src_dir, src_name, dst_dir, dst_name, noreplace } => {
                let how = if noreplace { RenameMode::NoReplace } else { RenameMode::Replace };
                (Namespace::rename_change(&c, src_dir, &src_name, dst_dir, &dst_name, how), 0)
            }
            Request::Setattr { fid, set } => match set_attr_by(&self.ns, req.client, fid, &set, req.replayed.is_some())
            {
                Ok(s) => (Namespace::setattr_change(&c, fid, s), 0),
                Err(e) => return done(fail(e.status(), e.message)),
            },
            Request::Unlink { dir, name, rmdir } => (Namespace::remove_change(&c, dir, &name, rmdir), 0),
            // Its checks read the layout: quick, from redb's cache.
            Request::DomWrite { fid, offset, handle } => match self.ns.write_dom_change(
                &c,
                fid,
                offset,
                &req.bulk,
                // A replay was checked when it first ran: its handle may be closed since.
                req.replayed.is_some() || self.ns.writes_through(handle, fid, req.client),
            ) {
                Ok(v) => v,
                Err(e) => return done(fail(e.status(), e.message)),
            },
            Request::LayoutIntent { fid, handle, end } => {
                if req.replayed.is_none() {
                    self.ns.objects_ready().await;
                }
                // A replay was checked when it first ran: its handle may be closed since.
                let through = req.replayed.is_some() || self.ns.writes_through(handle, fid, req.client);
                let change = Namespace::layout_intent_change(&c, fid, end, through);
                // A replay takes back the objects its first answer gave.
                let first = req.replayed.as_deref().and_then(|b| match mdt::Reply::decode(b) {
                    Ok(mdt::Reply::Layout { layout, objects }) => Some(FirstAnswer { fid, layout, objects }),
                    _ => None,
                });
                let change = match first {
                    Some(first) => Namespace::replaying(first, change),
                    None => change,
                };
                let (r, n) = self.ns.submit_numbered(key, change, 0).await;
                // The layout as it is now: a resend, or a component another writer gave
                // objects meanwhile, gets the same objects as the first run.
                let reply = match r.and_then(|_| self.ns.layout_and_objects(fid)) {
                    Ok((layout, objects)) => ok(mdt::Reply::Layout { layout, objects }),
                    Err(e) => fail(e.status(), e.message),
                };
                return answered(depending(Reply { transno: n.transno, ..reply }, &n.depends), n);
            }
            Request::CreateOpen { dir, name, perms, layout, read, write } => {
                if req.replayed.is_none() {
                    self.ns.objects_ready().await;
                }
                let change = match create_change(&c, dir, &name, perms, &layout) {
                    Ok(change) => change,
                    Err(e) => return done(fail(e.status(), e.message)),
                };
                let (first, handle) = first_answer(&req.replayed).unzip();
                let handle = handle.flatten();
                if let (Some(first), Some(handle)) = (&first, handle)
                    && req.header.transno <= self.replay_from.load(Ordering::Relaxed)
                {
                    // Its create is on the drives: only its handle is lost.
                    return done(self.open_for(req.client, first.fid, read, write, Some(handle), None));
                }
                let change = match first {
                    Some(first) => Namespace::replaying(first, change),
                    None => change,
                };
                let (a, n) = match self.ns.submit_numbered(key, change, 0).await {
                    (Ok(Answer::Attr(a)), n) => (a, n),
                    (Ok(_), _) => return done(fail(-errno::EIO, "create-open: the create gave no attributes".into())),
                    (Err(e), _) => return done(fail(e.status(), e.message)),
                };
                // A replay gets the handle it had.
                let left = self.ns.getattr(dir).ok();
                let reply = self.open_for(req.client, a.fid, read, write, handle, left);
                let reply = depending(Reply { transno: n.transno, ..reply }, &n.depends);
                return answered(reply, n);
            }
            _ => return None,
        };
        let change = match (req.header.opcode, first_answer(&req.replayed)) {
            (mdt::MDS_CREATE, Some((first, _))) => Namespace::replaying(first, change),
            _ => change,
        };
        let (mut r, n) = self.ns.submit_numbered(key, change, weight).await;
        if req.header.opcode == mdt::MDS_CREATE
            && let Ok(Answer::Attr(a)) = &r
            && mode::is_reg(a.mode)
        {
            // A new file's objects go back with it: a replay of the create returns them.
            if let Ok((layout, objects)) = self.ns.layout_and_objects(a.fid)
                && !objects.is_empty()
            {
                let reply = ok(mdt::Reply::Created { attr: *a, layout, objects });
                return answered(depending(Reply { transno: n.transno, ..reply }, &n.depends), n);
            }
        }
        if matches!(r, Ok(Answer::Done))
            && let Some(dir) = parent
            && let Ok(a) = self.ns.getattr(dir)
        {
            r = Ok(Answer::Attr(a));
        }
        answered(numbered(r, &n), n)
    }

    /// A mkdir: here and plain by the local path, else placed (`-i`), striped (`-c`)
    /// or by the parent's default over the MDTs by the coordinator.
    #[allow(clippy::too_many_arguments)]
    async fn mkdir(
        &self,
        req: &Incoming,
        key: Option<ReplyKey>,
        c: &Cred,
        dir: Fid,
        name: &str,
        perms: u32,
        at: i32,
        count: i32,
    ) -> Option<Answered> {
        let mut numbered_as = Numbered::default();
        let r = match self.dne.placement(dir, at, count).await {
            Ok(None) => {
                let change = Namespace::mkdir_change(c, dir, name, perms);
                let change = match first_answer(&req.replayed) {
                    Some((first, _)) => Namespace::replaying(first, change),
                    None => change,
                };
                match self.ns.submit_numbered(key, change, 0).await {
                    // Resent: its first copy was placed elsewhere.
                    (Ok(Answer::Intent(id)), _) => match self.dne.enter() {
                        Ok(_entered) => self.dne.finish(key, id).await,
                        Err(e) => Err(e),
                    },
                    (r, n) => {
                        numbered_as = n;
                        r
                    }
                }
            }
            Ok(Some(place)) => match self.dne.enter() {
                Ok(_entered) => self.dne.mkdir(key, c, dir, name, perms, place).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        answered(numbered(r, &numbered_as), numbered_as)
    }

    /// Serve one request (blocking). A read's answer carries the leases it grants.
    pub fn handle(&self, req: Incoming) -> Reply {
        let since = self.leases.clock();
        let reply = self.answer(&req);
        if !matches!(req.header.opcode, mdt::MDS_GETATTR | mdt::MDS_LOOKUP | mdt::MDS_LOOKUP_MANY | mdt::MDS_READDIR) {
            return reply;
        }
        self.lease_reply(req.client, since, req.header.opcode, &req.body, reply)
    }

    /// [`Mds::handle`], before leases.
    fn answer(&self, req: &Incoming) -> Reply {
        if req.header.opcode == param::OP_GET_PARAM {
            return match param::decode_get(&req.body) {
                Ok(p) => Reply { status: 0, body: param::render(&self.get_param(&p)).into_bytes(), ..Reply::default() },
                Err(e) => fail(-EPROTO, format!("bad get-param request: {e}")),
            };
        }
        if req.header.opcode == param::OP_SET_PARAM {
            return match param::decode_set(&req.body) {
                Ok((name, value)) => match self.set_param(&name, &value) {
                    Ok(()) => Reply::default(),
                    Err(why) => fail(-errno::EINVAL, why),
                },
                Err(e) => fail(-EPROTO, format!("bad set-param request: {e}")),
            };
        }
        let (c, r, _) = match self.prepare(req) {
            Ok(v) => v,
            Err(reply) => return reply,
        };
        let ns = &self.ns;
        match r {
            Request::Getattr { fid } => answer(ns.getattr(fid), |a| attr_reply(ns, a)),
            Request::Lookup { dir, name } => answer(ns.lookup(&c, dir, &name), |a| attr_reply(ns, a)),
            Request::LookupMany { dir, names } => answer(ns.lookup_many(&c, dir, &names), |v| {
                // One look at the handle table for every name.
                let writing = ns.open_for_write(
                    v.iter().filter_map(|r| r.as_ref().ok()).filter(|a| mode::is_reg(a.mode)).map(|a| a.fid),
                );
                mdt::Reply::Looked(
                    v.into_iter()
                        .map(|r| match r {
                            Ok(a) if writing.contains(&a.fid) => mdt::Looked::Writing(a),
                            Ok(a) => mdt::Looked::Attr(a),
                            Err(e) => mdt::Looked::Error(e.errno),
                        })
                        .collect(),
                )
            }),
            Request::Readdir { dir, cookie, max } => {
                // A page fits one reply body (64 KiB), with room for its header.
                let max = max.clamp(1, READDIR_MAX) as usize;
                answer(ns.readdir_bounded(&c, dir, cookie, max, READDIR_REPLY_BYTES), |(entries, eof)| {
                    mdt::Reply::Entries { entries, eof }
                })
            }
            r @ (Request::Open { .. } | Request::OpenAt { .. } | Request::Close { .. }) => self
                .serve_open(req.client, &c, r, true)
                .unwrap_or_else(|| fail(-errno::EIO, "an open or close that was not served".into())),
            Request::Readlink { fid } => answer(ns.readlink(fid), mdt::Reply::Bytes),
            Request::Getxattr { fid, name } => answer(ns.getxattr(&c, fid, &name), mdt::Reply::Bytes),
            Request::Listxattr { fid } => answer(ns.listxattr(&c, fid), mdt::Reply::Names),
            Request::Getlayout { fid } => {
                answer(ns.layout(fid).and_then(|l| Ok((l, ns.objects(fid)?))), |(l, objects)| mdt::Reply::Layout {
                    layout: l.map(|l| l.encode()).unwrap_or_default(),
                    objects,
                })
            }
            Request::DomRead { fid, offset, len } => match ns.read_dom(&c, fid, offset, len as usize) {
                Ok(data) => {
                    Reply { status: 0, body: mdt::Reply::Done.encode(), bulk: Bytes::from(data), ..Reply::default() }
                }
                Err(e) => fail(e.status(), e.message),
            },
            Request::Getdirstripe { dir } => answer(
                ns.getattr(dir).and_then(|a| {
                    if !mode::is_dir(a.mode) {
                        return Err(MdError::new(errno::ENOTDIR, format!("{dir} is not a directory")));
                    }
                    Ok((ns.dir_stripe(dir)?, ns.dir_default(dir)?))
                }),
                |(s, d)| mdt::Reply::DirStripe {
                    stripe: s.map(|s| s.encode()).unwrap_or_default(),
                    default: d.map(|d| d.encode()).unwrap_or_default(),
                },
            ),
            // Changes: `serve_change` takes every well-formed one (this is not reached).
            Request::Create { .. }
            | Request::CreateOpen { .. }
            | Request::Link { .. }
            | Request::Unlink { .. }
            | Request::Rename { .. }
            | Request::Setattr { .. }
            | Request::Setxattr { .. }
            | Request::Removexattr { .. }
            | Request::Setdirlayout { .. }
            | Request::DomWrite { .. }
            | Request::LayoutIntent { .. }
            | Request::Mkdir { .. }
            | Request::Setdirdefault { .. }
            | Request::Update { .. } => fail(-errno::EIO, "changes are served by Mds::serve".into()),
            Request::Lock { .. } | Request::Unlock { .. } | Request::Leases { .. } => {
                fail(-errno::EIO, "locks and lease polls are served by Mds::serve".into())
            }
            Request::Statfs => answer(ns.statfs(), |s| mdt::Reply::StatFs {
                inodes: s.inodes,
                bytes_used: s.bytes_used,
                bytes_total: s.bytes_total,
            }),
        }
    }
}
