//! The MDS's coordinator of operations over several MDTs (DNE): a mkdir placed on
//! another MDT or striped over several, and an unlink, rename, link or setattr whose
//! inodes live on other MDTs.
//!
//! Each is planned as an intent (see [`crate::mdt::namespace::dne`]): steps, one update on
//! one MDT each, with the update that undoes it. Steps are ordered so that what a reader
//! could see is never half made: a new directory's inodes are made before its name, a
//! removed name goes before its inode. A step on another MDT is an `MDS_UPDATE` request
//! to it; one on this MDT goes to its own group commit. Either way it runs under a reply
//! key of its own, so sending it again after a timeout or a restart cannot run it twice.
//! A step that fails with an errno undoes the steps before it; a step that cannot reach
//! its MDT waits and is sent again, as Lustre's DNE waits for the recovery of an MDT.
//!
//! An intent is on this MDT's drives before its first step leaves, so that no step
//! another MDT keeps can outlive it in a crash; intents open when the MDS stops are run
//! again when it starts ([`Coordinator::recover`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nacre_net::client::{Client, Import};
use nacre_net::nid::Nid;
use nacre_proto::dne::{DirDefault, DirStripe, HASH_FNV_1A_64, Update};
use nacre_proto::fid::Fid;
use nacre_proto::mdt::{self, Attr, Creds, Request, errno, mode};
use nacre_proto::mgs::TargetKind;
use nacre_proto::wire::Enc;
use tokio::sync::{Semaphore, watch};

use crate::mdt::namespace::dne::{Intent, STEPS_MAX, Step};
use crate::mdt::namespace::{Answer, NEEDS_COORDINATION, RenameMode};
use crate::mdt::{Cred, MdError, Namespace, ReplyKey, SetAttr};

type Result<T> = std::result::Result<T, MdError>;

pub use crate::mdt::namespace::dne::{coordinator_client, is_coordinator_client};

/// Intents one MDT runs at once.
pub const INTENTS_IN_FLIGHT: usize = 64;

/// Requests one MDS coordinates at once (planning included); more are answered
/// EINPROGRESS. It is a quarter of the transport's service slots, so that slots stay free
/// for the updates other MDTs send: two MDTs coordinating towards each other can never
/// hold every slot of both and wait on each other, and an MDT that is down holds up at
/// most this many requests here.
pub const COORDINATING_MAX: usize = 16;

/// A step's xid: the intent's id, the step, and whether it is the undo.
fn step_xid(intent: u64, step: usize, undo: bool) -> u64 {
    (intent << 10) | ((step as u64) << 1) | undo as u64
}

/// The digest of an update, for its reply key: both ends compute it the same way.
pub fn update_digest(u: &Update) -> u32 {
    let b = u.put(Enc::new(1)).done();
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    d.update(&b);
    d.finalize() as u32
}

fn creds(c: &Cred) -> Creds {
    Creds { uid: c.uid, gid: c.gid, groups: c.groups.clone(), umask: c.umask }
}

#[derive(Default)]
struct Links {
    client: Option<Client>,
    fsname: String,
    /// Each other MDT's NIDs, active first.
    nids: HashMap<u32, Vec<Nid>>,
    imports: HashMap<u32, Arc<Import>>,
}

pub struct Coordinator {
    ns: Arc<Namespace>,
    /// MDTs in the file system (1 until told otherwise).
    mdts: AtomicU32,
    links: Mutex<Links>,
    /// Intents running, with a channel that gets their answer.
    running: Mutex<HashMap<u64, RunningAnswer>>,
    /// Ids of the intents running, for the `acked_below` of step keys.
    ids: Mutex<BTreeSet<u64>>,
    slots: Semaphore,
    gate: Semaphore,
    /// Round-robin placement of new directories.
    rr: AtomicU64,
    /// Steps sent again after a transport error, and intents undone.
    pub resent: AtomicU64,
    pub undone: AtomicU64,
    /// How this MDT's own steps wait for the revocations they made; another MDT's step
    /// waits in the MDS that serves it, before answering.
    recall_wait: std::sync::OnceLock<RecallWait>,
}

/// Where the answer of an intent another task runs will come.
type RunningAnswer = watch::Receiver<Option<Result<Answer>>>;

/// Waits until the lease revocations a step made (client, revocation) are carried out,
/// or their holders evicted (the MDS's `recalled`).
pub type RecallWait =
    Arc<dyn Fn(Vec<(u64, u64)>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Coordinator {
    pub fn new(ns: Arc<Namespace>) -> Coordinator {
        Coordinator {
            ns,
            mdts: AtomicU32::new(1),
            links: Mutex::new(Links::default()),
            running: Mutex::new(HashMap::new()),
            ids: Mutex::new(BTreeSet::new()),
            slots: Semaphore::new(INTENTS_IN_FLIGHT),
            gate: Semaphore::new(COORDINATING_MAX),
            rr: AtomicU64::new(0),
            resent: AtomicU64::new(0),
            undone: AtomicU64::new(0),
            recall_wait: std::sync::OnceLock::new(),
        }
    }

    /// Set how this MDT's own steps wait for their lease revocations (once).
    pub fn set_recall_wait(&self, w: RecallWait) {
        let _ = self.recall_wait.set(w);
    }

    /// Leave to coordinate one request, or EINPROGRESS if [`COORDINATING_MAX`] are.
    pub fn enter(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.gate.try_acquire().map_err(|_| {
            MdError::new(
                errno::EINPROGRESS,
                format!(
                    "MDT{} is coordinating {COORDINATING_MAX} operations over several MDTs: send again",
                    self.index()
                ),
            )
        })
    }

    fn index(&self) -> u32 {
        self.ns.index()
    }

    /// MDTs of the file system.
    pub fn mdts(&self) -> u32 {
        self.mdts.load(Ordering::Relaxed)
    }

    /// File system `fsname` has `mdts` MDTs, reached through `client` at `nids` (each
    /// MDT's NIDs, active first: a link walks them when the one it uses fails).
    pub fn set_peers(&self, mdts: u32, client: Client, fsname: &str, nids: HashMap<u32, Vec<Nid>>) {
        let mut l = lock(&self.links);
        // A link to an MDT at none of its NIDs now goes; the next step reconnects.
        l.imports.retain(|m, i| nids.get(m).is_some_and(|n| n.contains(&i.target())));
        l.client = Some(client);
        l.fsname = fsname.to_string();
        l.nids = nids;
        self.mdts.store(mdts.max(1), Ordering::Relaxed);
    }

    async fn import(&self, mdt: u32) -> Option<Arc<Import>> {
        let (client, (name, nids)) = {
            let l = lock(&self.links);
            if let Some(i) = l.imports.get(&mdt) {
                return Some(i.clone());
            }
            (l.client.clone()?, (TargetKind::Mdt.name(&l.fsname, mdt), l.nids.get(&mdt)?.clone()))
        };
        let i = client.connect_any(&name, &nids).await.ok()?;
        lock(&self.links).imports.insert(mdt, i.clone());
        Some(i)
    }

    /// Ask MDT `mdt` something (as root), waiting for it to be reachable: a transport
    /// error is retried, an errno is the answer.
    async fn ask(&self, mdt: u32, r: &Request) -> Result<mdt::Reply> {
        let (op, body) = r.encode(&Creds::default());
        let mut wait = Duration::from_millis(20);
        loop {
            if let Some(imp) = self.import(mdt).await {
                match imp.call(op, &body, &[]).await {
                    Ok(f) if f.header.status == 0 => {
                        let reply = mdt::Reply::decode(&f.body)
                            .map_err(|e| MdError::new(errno::EIO, format!("MDT {mdt} answered badly: {e}")))?;
                        return Ok(reply);
                    }
                    Ok(f) if f.header.status != -errno::EIO => {
                        return Err(MdError::new(-f.header.status, String::from_utf8_lossy(&f.body).into_owned()));
                    }
                    // EIO (a failed batch, an MDT shutting down) passes: send again.
                    Ok(_) => {}
                    Err(_) => {
                        lock(&self.links).imports.remove(&mdt);
                    }
                }
            }
            self.resent.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
        }
    }

    /// The attributes of `fid`, wherever it lives.
    async fn getattr(&self, fid: Fid) -> Result<Attr> {
        if fid.mdt() == Some(self.index()) {
            let ns = self.ns.clone();
            return blocking(move || ns.getattr(fid)).await;
        }
        let m = owner(fid)?;
        match self.ask(m, &Request::Getattr { fid }).await? {
            mdt::Reply::Attr(a) | mdt::Reply::Writing(a) => Ok(a),
            other => Err(MdError::new(errno::EIO, format!("getattr answered {other:?}"))),
        }
    }

    /// The stripes and default of directory `dir`, wherever it lives.
    async fn dir_stripe(&self, dir: Fid) -> Result<(Option<DirStripe>, Option<DirDefault>)> {
        if dir.mdt() == Some(self.index()) {
            let ns = self.ns.clone();
            return blocking(move || Ok((ns.dir_stripe(dir)?, ns.dir_default(dir)?))).await;
        }
        let m = owner(dir)?;
        match self.ask(m, &Request::Getdirstripe { dir }).await? {
            mdt::Reply::DirStripe { stripe, default } => {
                let bad = |e: nacre_proto::wire::ProtoError| MdError::new(errno::EIO, e.to_string());
                let s = if stripe.is_empty() { None } else { Some(DirStripe::decode(&stripe).map_err(bad)?) };
                let d = if default.is_empty() { None } else { Some(DirDefault::decode(&default).map_err(bad)?) };
                Ok((s, d))
            }
            other => Err(MdError::new(errno::EIO, format!("getdirstripe answered {other:?}"))),
        }
    }

    /// The parent of directory `dir` (`..`), wherever it lives.
    async fn parent_of(&self, dir: Fid) -> Result<Fid> {
        let m = owner(dir)?;
        let r = Request::Lookup { dir, name: "..".into() };
        if m == self.index() {
            let ns = self.ns.clone();
            return blocking(move || ns.lookup(&Cred::root(), dir, "..").map(|a| a.fid)).await;
        }
        match self.ask(m, &r).await? {
            mdt::Reply::Attr(a) | mdt::Reply::Writing(a) => Ok(a.fid),
            other => Err(MdError::new(errno::EIO, format!("lookup answered {other:?}"))),
        }
    }

    /// Run step `i` (or its undo) of intent `id` on its MDT.
    async fn exec(&self, id: u64, i: usize, undo: bool, mdt: u32, u: &Update) -> Result<Answer> {
        let acked_below = lock(&self.ids).first().map_or(0, |&f| step_xid(f, 0, false));
        let xid = step_xid(id, i, undo);
        if mdt == self.index() {
            let key = ReplyKey { client: coordinator_client(mdt), xid, acked_below, digest: update_digest(u) };
            let (answer, n) = self.ns.submit_numbered(Some(key), Namespace::update_change(u.clone()), 0).await;
            if !n.recalled.is_empty()
                && let Some(wait) = self.recall_wait.get()
            {
                wait(n.recalled).await;
            }
            return answer;
        }
        let r = Request::Update { coordinator: self.index(), xid, acked_below, update: u.clone() };
        match self.ask(mdt, &r).await? {
            mdt::Reply::Attr(a) => Ok(Answer::Attr(a)),
            _ => Ok(Answer::Done),
        }
    }

    /// Run an intent to its end: its steps in order, the undos of those done if one
    /// fails; then end it, giving the client's record the answer.
    async fn run(&self, intent: Intent, tx: watch::Sender<Option<Result<Answer>>>) -> Result<Answer> {
        // The intent is on the drives before any step leaves: a step that another MDT
        // commits must never outlive, in a crash of this one, the intent that would undo
        // it or finish it. (Its begin was answered, and may be only in memory.)
        let mut answer = match self.ns.committed_all().await {
            Ok(()) => Ok(Answer::Done),
            Err(e) => {
                lock(&self.running).remove(&intent.id);
                lock(&self.ids).remove(&intent.id);
                let _ = tx.send(Some(Err(e.clone())));
                return Err(e);
            }
        };
        for (i, s) in intent.steps.iter().enumerate() {
            match self.exec(intent.id, i, false, s.mdt, &s.update).await {
                Ok(a) if intent.reply == Some(i as u32) => answer = Ok(a),
                Ok(_) => {}
                Err(e) => {
                    for (j, d) in intent.steps[..i].iter().enumerate().rev() {
                        if let Some(u) = &d.undo
                            && let Err(x) = self.exec(intent.id, j, true, d.mdt, u).await
                        {
                            // An undo checks only what its step made, which nothing else
                            // can reach meanwhile; should one fail, say so and go on.
                            eprintln!(
                                "mdt{}: intent {} could not undo step {j}: {}",
                                self.index(),
                                intent.id,
                                x.message
                            );
                        }
                    }
                    self.undone.fetch_add(1, Ordering::Relaxed);
                    answer = Err(e);
                    break;
                }
            }
        }
        let end = Namespace::end_intent_change(intent.id, intent.client, answer.clone());
        let ended = self.ns.submit(None, end, 0).await;
        lock(&self.running).remove(&intent.id);
        if ended.is_ok() {
            // Still open otherwise: its step records must stay.
            lock(&self.ids).remove(&intent.id);
        }
        let _ = tx.send(Some(answer.clone()));
        ended?;
        answer
    }

    /// Take intent `id` to run it, or, if it runs already, the channel of its answer.
    fn claim(&self, id: u64) -> std::result::Result<watch::Sender<Option<Result<Answer>>>, RunningAnswer> {
        let mut running = lock(&self.running);
        if let Some(rx) = running.get(&id) {
            return Err(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        running.insert(id, rx);
        lock(&self.ids).insert(id);
        Ok(tx)
    }

    /// What a change keyed `key` already answered, if anything: an operation over
    /// several MDTs resent while (or after) it ran finds its intent here. `None`: nothing
    /// stored, plan it afresh.
    pub async fn stored(&self, key: Option<ReplyKey>) -> Option<Result<Answer>> {
        key?;
        // A probe that changes nothing and is never stored: only a stored answer is
        // anything but NEEDS_COORDINATION.
        let probe: crate::mdt::namespace::Change = Box::new(|_| Err(MdError::new(NEEDS_COORDINATION, "probe")));
        match self.ns.submit(key, probe, 0).await {
            Err(e) if e.errno == NEEDS_COORDINATION => None,
            Ok(Answer::Intent(id)) => Some(self.finish(key, id).await),
            other => Some(other),
        }
    }

    /// Begin an intent under the client's key and run it; a resent request finds the
    /// intent its first copy began and waits for that one's answer.
    async fn start(
        &self,
        key: Option<ReplyKey>,
        plan: impl FnOnce(&mut crate::mdt::namespace::Tx<'_>) -> Result<(Vec<Step>, Option<u32>)> + Send + 'static,
    ) -> Result<Answer> {
        let _slot = self.slots.acquire().await.map_err(|_| MdError::new(errno::EIO, "the MDS is stopping"))?;
        let id = match self.ns.submit(key, Namespace::begin_intent_change(key, plan), 0).await? {
            Answer::Intent(id) => id,
            // The final answer of an operation that ended already.
            other => return Ok(other),
        };
        self.finish(key, id).await
    }

    /// The answer of intent `id`: wait for it if it runs, run it if it is open and
    /// nobody runs it, or read its final answer from the client's record.
    pub async fn finish(&self, key: Option<ReplyKey>, id: u64) -> Result<Answer> {
        match self.claim(id) {
            Err(mut rx) => loop {
                if let Some(a) = rx.borrow().clone() {
                    return a;
                }
                if rx.changed().await.is_err() {
                    break;
                }
            },
            Ok(tx) => {
                let ns = self.ns.clone();
                let intent = blocking(move || ns.intents()).await.map(|v| v.into_iter().find(|i| i.id == id));
                match intent {
                    Ok(Some(i)) => return self.run(i, tx).await,
                    _ => {
                        // Ended already: nothing to run.
                        lock(&self.running).remove(&id);
                        lock(&self.ids).remove(&id);
                        let _ = tx.send(None);
                    }
                }
            }
        }
        // Ended: the client's record holds its answer now.
        let stale: crate::mdt::namespace::Change =
            Box::new(|_| Err(MdError::new(errno::EIO, "an operation over several MDTs lost its answer")));
        self.ns.submit(key, stale, 0).await
    }

    /// Run again the intents a stop left open. Call once at start, before serving.
    pub fn recover(self: &Arc<Self>) -> Result<usize> {
        let open = self.ns.intents()?;
        let n = open.len();
        let claimed: Vec<_> = open.into_iter().filter_map(|i| self.claim(i.id).ok().map(|tx| (i, tx))).collect();
        for (i, tx) in claimed {
            let me = self.clone();
            tokio::spawn(async move {
                let id = i.id;
                if let Err(e) = me.run(i, tx).await {
                    eprintln!("mdt{}: recovered intent {id} ended with: {}", me.index(), e.message);
                }
            });
        }
        Ok(n)
    }

    /// Where a new directory under `dir` goes: its first MDT and stripe count, from the
    /// request (`mdt` ≥ 0, `count` ≠ 0) or the parent's default. `None`: a plain
    /// directory on this MDT, made by the local path.
    pub async fn placement(&self, dir: Fid, mdt: i32, count: i32) -> Result<Option<(u32, u32)>> {
        let n = self.mdts();
        if n <= 1 && mdt <= 0 && (-1..=1).contains(&count) {
            return Ok(None);
        }
        let def = if mdt < 0 || count == 0 {
            let ns = self.ns.clone();
            blocking(move || ns.dir_default(dir)).await?
        } else {
            None
        };
        let count = match if count != 0 { count } else { def.map_or(1, |d| d.count) } {
            -1 => n,
            c if c <= 1 => 1,
            c if c as u32 > n => {
                return Err(MdError::new(
                    errno::EINVAL,
                    format!("{c} directory stripes but the file system has {n} MDTs"),
                ));
            }
            c => c as u32,
        };
        let start = if mdt >= 0 {
            if mdt as u32 >= n {
                return Err(MdError::new(
                    errno::EINVAL,
                    format!("MDT index {mdt}: the file system has MDTs 0 to {}", n - 1),
                ));
            }
            mdt as u32
        } else {
            match def {
                Some(d) if d.offset >= 0 && (d.offset as u32) < n => d.offset as u32,
                Some(d) if d.round_robin() || count > 1 => (self.rr.fetch_add(1, Ordering::Relaxed) % n as u64) as u32,
                _ => self.index(),
            }
        };
        Ok((count > 1 || start != self.index()).then_some((start, count)))
    }

    /// A directory on other MDTs or striped over several: its inodes (shards first, then
    /// the master), then its name here.
    pub async fn mkdir(
        &self,
        key: Option<ReplyKey>,
        cred: &Cred,
        dir: Fid,
        name: &str,
        perms: u32,
        (start, count): (u32, u32),
    ) -> Result<Answer> {
        let (cred, name, n, me) = (cred.clone(), name.to_string(), self.mdts(), self.index());
        self.start(key, move |tx| {
            let (d, _) = tx.parent_for_new(&cred, dir, &name)?;
            let gid = if d.mode & mode::S_ISGID != 0 { d.gid } else { cred.gid };
            let mut perms = perms & mode::PERMS & !(mode::S_ISUID | mode::S_ISGID);
            if d.mode & mode::S_ISGID != 0 {
                perms |= mode::S_ISGID;
            }
            let default = tx.inherited_default(dir)?.map(|d| d.encode()).unwrap_or_default();
            let attr = |fid| Attr { fid, mode: mode::S_IFDIR | perms, nlink: 2, uid: cred.uid, gid, ..Attr::default() };
            let master = tx.fid_on(start)?;
            let mut steps = Vec::new();
            let mut stripe = Vec::new();
            if count > 1 {
                let mut shards = Vec::with_capacity(count as usize);
                for i in 0..count {
                    let m = (start + i) % n;
                    let f = tx.fid_on(m)?;
                    shards.push(f);
                    steps.push(Step {
                        mdt: m,
                        update: Update::MakeInode {
                            attr: attr(f),
                            parent: master,
                            stripe: vec![],
                            default: default.clone(),
                        },
                        undo: Some(Update::Rmdir { fid: f }),
                    });
                }
                stripe = DirStripe { hash: HASH_FNV_1A_64, shards }.encode();
            }
            steps.push(Step {
                mdt: start,
                update: Update::MakeInode { attr: attr(master), parent: dir, stripe, default },
                undo: Some(Update::Rmdir { fid: master }),
            });
            let reply = steps.len() as u32 - 1;
            steps.push(Step {
                mdt: me,
                update: Update::AddEntry {
                    creds: creds(&cred),
                    dir,
                    name,
                    fid: master,
                    kind: mode::S_IFDIR,
                    dlink: 1,
                    replace: false,
                },
                undo: None,
            });
            Ok((steps, Some(reply)))
        })
        .await
    }

    /// The steps that empty-check and then remove directory `fid` (striped or not):
    /// `Kill` each shard and the master, where a non-empty one fails with nothing yet
    /// undone but earlier kills; then, after its name has gone, `Rmdir` each, which can
    /// no longer fail (a killed directory takes no new entries).
    async fn rmdir_steps(&self, fid: Fid) -> Result<(Vec<Step>, Vec<Step>)> {
        let mut dirs = match self.dir_stripe(fid).await?.0 {
            Some(s) => s.shards,
            None => Vec::new(),
        };
        dirs.push(fid);
        let mut kills = Vec::new();
        let mut rmdirs = Vec::new();
        for f in dirs {
            let m = owner(f)?;
            kills.push(Step { mdt: m, update: Update::Kill { fid: f }, undo: Some(Update::Revive { fid: f }) });
            rmdirs.push(Step { mdt: m, update: Update::Rmdir { fid: f }, undo: None });
        }
        Ok((kills, rmdirs))
    }

    /// Unlink or rmdir of a name whose inode lives on another MDT, or of a striped
    /// directory: a directory (each shard, then the master) is checked empty and closed
    /// to new entries first, then the name goes, then the inodes.
    pub async fn remove(
        &self,
        key: Option<ReplyKey>,
        cred: &Cred,
        dir: Fid,
        name: &str,
        rmdir: bool,
    ) -> Result<Answer> {
        let (child, a) = self.child(cred, dir, name).await?;
        let is_dir = mode::is_dir(a.mode);
        if rmdir && !is_dir {
            return Err(MdError::new(errno::ENOTDIR, format!("{name:?} is not a directory")));
        }
        if !rmdir && is_dir {
            return Err(MdError::new(errno::EISDIR, format!("{name:?} is a directory")));
        }
        let (kills, rmdirs) = if is_dir { self.rmdir_steps(child).await? } else { (Vec::new(), Vec::new()) };
        let mut steps = kills;
        steps.push(unname_step(self.index(), cred, dir, name, &a, if is_dir { -1 } else { 0 }));
        if is_dir {
            steps.extend(rmdirs);
        } else {
            steps.push(Step {
                mdt: child.mdt().unwrap_or(0),
                update: Update::Link { fid: child, delta: -1 },
                undo: None,
            });
        }
        self.start(key, move |_| Ok((steps, None))).await
    }

    /// The inode `name` of `dir` names here, with its attributes from wherever it lives.
    async fn child(&self, cred: &Cred, dir: Fid, name: &str) -> Result<(Fid, Attr)> {
        let ns = self.ns.clone();
        let (c, n) = (cred.clone(), name.to_string());
        let stub = blocking(move || ns.lookup(&c, dir, &n)).await?;
        let a = if stub.fid.mdt() == Some(self.index()) { stub } else { self.getattr(stub.fid).await? };
        Ok((stub.fid, a))
    }

    /// The FID `name` of `dir` names, wherever `dir` lives.
    async fn lookup_any(&self, cred: &Cred, dir: Fid, name: &str) -> Result<Fid> {
        let m = owner(dir)?;
        if m == self.index() {
            let (ns, c, n) = (self.ns.clone(), cred.clone(), name.to_string());
            return blocking(move || ns.lookup(&c, dir, &n).map(|a| a.fid)).await;
        }
        match self.ask(m, &Request::Lookup { dir, name: name.to_string() }).await? {
            mdt::Reply::Attr(a) | mdt::Reply::Writing(a) => Ok(a.fid),
            other => Err(MdError::new(errno::EIO, format!("lookup answered {other:?}"))),
        }
    }

    /// A rename that touches another MDT (the target directory, the inode, or an
    /// ancestor checked for loops): the source name goes, the target name comes (replacing
    /// what it names, when that lives with it), and a moved directory learns its parent.
    #[allow(clippy::too_many_arguments)]
    pub async fn rename(
        &self,
        key: Option<ReplyKey>,
        cred: &Cred,
        src_dir: Fid,
        src_name: &str,
        dst_dir: Fid,
        dst_name: &str,
        how: RenameMode,
    ) -> Result<Answer> {
        let (child, a) = self.child(cred, src_dir, src_name).await?;
        let is_dir = mode::is_dir(a.mode);
        if is_dir && self.dir_stripe(child).await?.0.is_some() && dst_dir != src_dir {
            // Its shards' `..` would all change with it.
            return Err(MdError::new(
                errno::EXDEV,
                format!("{src_name:?} is a striped directory: it moves within its directory only"),
            ));
        }
        // Two names of one inode: POSIX says do nothing.
        if let Ok(t) = self.lookup_any(cred, dst_dir, dst_name).await
            && t == child
        {
            return Ok(Answer::Done);
        }
        let moved = is_dir && dst_dir != src_dir;
        if moved {
            if !Namespace::may(cred, &a, 2) {
                return Err(MdError::new(errno::EACCES, format!("uid {} may not move {child}", cred.uid)));
            }
            // No directory may move below itself: walk up from the target.
            let mut at = dst_dir;
            for _ in 0..4096 {
                if at == child {
                    return Err(MdError::new(
                        errno::EINVAL,
                        format!("cannot move directory {child} into its own subtree"),
                    ));
                }
                if at == Fid::ROOT {
                    break;
                }
                at = self.parent_of(at).await?;
            }
        }
        let kind = a.mode & mode::S_IFMT;
        let dlink = if moved { 1 } else { 0 };
        let mut steps = vec![
            unname_step(self.index(), cred, src_dir, src_name, &a, -dlink),
            Step {
                mdt: owner(dst_dir)?,
                update: Update::AddEntry {
                    creds: creds(cred),
                    dir: dst_dir,
                    name: dst_name.to_string(),
                    fid: child,
                    kind,
                    dlink,
                    replace: how == RenameMode::Replace,
                },
                undo: None,
            },
        ];
        if moved {
            steps.push(Step {
                mdt: child.mdt().unwrap_or(0),
                update: Update::SetParent { fid: child, parent: dst_dir },
                undo: None,
            });
        }
        self.start(key, move |_| Ok((steps, None))).await
    }

    /// A hard link here to a file on another MDT: its link count first, then the name.
    pub async fn link(&self, key: Option<ReplyKey>, cred: &Cred, fid: Fid, dir: Fid, name: &str) -> Result<Answer> {
        let a = self.getattr(fid).await?;
        let m = owner(fid)?;
        let steps = vec![
            Step { mdt: m, update: Update::Link { fid, delta: 1 }, undo: Some(Update::Link { fid, delta: -1 }) },
            Step {
                mdt: self.index(),
                update: Update::AddEntry {
                    creds: creds(cred),
                    dir,
                    name: name.to_string(),
                    fid,
                    kind: a.mode & mode::S_IFMT,
                    dlink: 0,
                    replace: false,
                },
                undo: None,
            },
        ];
        self.start(key, move |_| Ok((steps, Some(0)))).await
    }

    /// A setattr of a striped directory's mode or owner: the master changes in the
    /// transaction that stores the intent, then every shard takes the same.
    pub async fn setattr(&self, key: Option<ReplyKey>, cred: &Cred, fid: Fid, s: SetAttr) -> Result<Answer> {
        let shards = match self.dir_stripe(fid).await?.0 {
            Some(st) => st.shards,
            None => return Err(MdError::new(errno::EIO, format!("{fid} is not striped"))),
        };
        let cred = cred.clone();
        self.start(key, move |tx| {
            let a = match Namespace::setattr_change_plain(&cred, fid, s)(tx)? {
                Answer::Attr(a) => a,
                _ => return Err(MdError::new(errno::EIO, "setattr answered no attributes")),
            };
            let mut steps: Vec<Step> = shards
                .iter()
                .map(|&f| Step {
                    mdt: f.mdt().unwrap_or(0),
                    update: Update::CopyAttr { fid: f, mode: a.mode, uid: a.uid, gid: a.gid },
                    undo: None,
                })
                .collect();
            // Last, the master once more: its attributes are the answer, stored for
            // resends too.
            steps.push(Step {
                mdt: fid.mdt().unwrap_or(0),
                update: Update::CopyAttr { fid, mode: a.mode, uid: a.uid, gid: a.gid },
                undo: None,
            });
            let n = steps.len();
            if n > STEPS_MAX {
                return Err(MdError::new(errno::EINVAL, "too many shards"));
            }
            Ok((steps, Some(n as u32 - 1)))
        })
        .await
    }

    /// `setdirstripe -D` on a striped directory: the master changes in the transaction
    /// that stores the intent, then every shard takes the same default (subdirectories
    /// are made in the shards).
    pub async fn set_default(
        &self,
        key: Option<ReplyKey>,
        cred: &Cred,
        dir: Fid,
        d: Option<DirDefault>,
    ) -> Result<Answer> {
        let shards = match self.dir_stripe(dir).await?.0 {
            Some(st) => st.shards,
            None => return Err(MdError::new(errno::EIO, format!("{dir} is not striped"))),
        };
        let cred = cred.clone();
        let default = d.map(|d| d.encode()).unwrap_or_default();
        self.start(key, move |tx| {
            Namespace::set_dir_default_change_plain(&cred, dir, d)(tx)?;
            let steps = shards
                .iter()
                .map(|&f| Step {
                    mdt: f.mdt().unwrap_or(0),
                    update: Update::CopyDefault { fid: f, default: default.clone() },
                    undo: None,
                })
                .collect();
            Ok((steps, None))
        })
        .await
    }

    /// Is `e` the local path saying it needs this coordinator?
    pub fn needs(e: &MdError) -> bool {
        e.errno == NEEDS_COORDINATION
    }
}

/// The MDT that owns `fid`; ESTALE for a FID outside every MDT's sequences.
fn owner(fid: Fid) -> Result<u32> {
    fid.mdt().ok_or_else(|| MdError::new(errno::ESTALE, format!("{fid} belongs to no MDT")))
}

/// The step that removes the name `name` → `a` from `dir` (here, the coordinator), with
/// the undo that puts it back; `dir`'s link count moves by `dlink`.
fn unname_step(me: u32, cred: &Cred, dir: Fid, name: &str, a: &Attr, dlink: i32) -> Step {
    let kind = a.mode & mode::S_IFMT;
    Step {
        mdt: me,
        update: Update::DelEntry {
            creds: creds(cred),
            dir,
            name: name.to_string(),
            fid: a.fid,
            kind,
            owner: a.uid,
            dlink,
        },
        undo: Some(Update::AddEntry {
            creds: Creds::default(),
            dir,
            name: name.to_string(),
            fid: a.fid,
            kind,
            dlink: -dlink,
            replace: false,
        }),
    }
}

/// Run blocking namespace work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(MdError::new(errno::EIO, format!("the request failed inside the server: {e}"))))
}
