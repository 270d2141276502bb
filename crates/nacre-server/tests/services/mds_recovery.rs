//! The MDS answers changes before they are on its drives, and its clients replay them
//! after a restart. Each test runs clients over the in-memory network against an MDS
//! whose log commits only when asked (so answered changes are really uncommitted),
//! crashes it (the staged log is lost), starts it again on the same volume, and checks
//! the tree: equal to the model of every answered change when every client comes back,
//! in transno order over clients (creates, renames, DoM writes, unlinks that depend on
//! each other); equal to every committed (fsync'd) change when a client dies with the
//! MDS, whose dependent changes then fail cleanly; files open across the restart stay
//! open through their handles, one unlinked meanwhile until its last close; requests
//! made during recovery wait for its end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use nacre_net::at::AtConfig;
use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::rpc::RpcError;
use nacre_net::server::{Server, ServerConfig};
use nacre_net::transport::MemNetwork;
use nacre_proto::fid::Fid;
use nacre_proto::layout::Layout;
use nacre_proto::mdt::{Attr, Creds, Reply, Request, errno, lock, mode};
use nacre_raid::Volume;
use nacre_server::mds::Mds;
use nacre_server::mdt::{Cred, Namespace, NamespaceOptions};

use crate::mdt_volume as volume;

/// Commits only when a client waits for one (its first change, an fsync): what the
/// others were answered is staged, not on the drives.
fn options() -> NamespaceOptions {
    NamespaceOptions {
        sync_on_reply: false,
        commit_interval: Duration::from_secs(600),
        checkpoint_interval: Duration::from_secs(600),
        ..NamespaceOptions::default()
    }
}

const SOFT_MS: u64 = 600;

struct Mdt {
    ns: Arc<Namespace>,
    mds: Arc<Mds>,
    server: Server,
}

impl Mdt {
    async fn start(net: &MemNetwork, v: &Arc<Volume>, format: bool) -> Mdt {
        Mdt::start_with(net, v, format, Duration::from_millis(SOFT_MS)).await
    }

    /// With a recovery window of `soft` (and four times that at most).
    async fn start_with(net: &MemNetwork, v: &Arc<Volume>, format: bool, soft: Duration) -> Mdt {
        let ns = Arc::new(if format {
            let ns = Namespace::format(v.clone(), 0, options()).unwrap();
            // Files keep their first 64 KiB on the MDT (no OST here).
            let dom = Layout::from_lfs_args(&["-E", "64K", "-L", "mdt"]).unwrap();
            ns.set_dir_layout(&Cred::root(), Fid::ROOT, Some(dom), None).unwrap();
            ns
        } else {
            Namespace::open(v.clone(), options()).unwrap()
        });
        let mds = Mds::new("mdt0", ns.clone());
        let cfg = ServerConfig {
            at: AtConfig { at_min: Duration::from_millis(300), ..AtConfig::default() },
            at_extra: Duration::from_millis(500),
            at_early_margin: Duration::from_millis(150),
            recovery_time_soft: soft,
            recovery_time_hard: soft * 4,
            ..ServerConfig::default()
        };
        // The stopped server's listener goes when its task is next polled.
        for _ in 0..100 {
            let t = Arc::new(net.transport("mds0"));
            match Server::start_service(t, &"mds0@mem".parse().unwrap(), mds.handler(), cfg.clone(), mds.service())
                .await
            {
                Ok(server) => {
                    mds.follow_evictions(server.handle());
                    return Mdt { ns, mds, server };
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        panic!("the stopped MDS still listens");
    }

    /// The MDS dies: what its log had not written is lost.
    fn crash(self) {
        self.ns.crash();
        drop(self.server);
    }

    fn status(&self) -> String {
        self.mds.get_param("mdt.mdt0.recovery_status").pop().map(|p| p.1).unwrap_or_default()
    }

    /// Every name under the root with its FID, mode, size and DoM bytes.
    fn tree(&self) -> BTreeMap<String, (Fid, u32, u64, Vec<u8>)> {
        let mut out = BTreeMap::new();
        let c = Cred::root();
        let mut dirs = vec![(String::new(), Fid::ROOT)];
        while let Some((path, dir)) = dirs.pop() {
            let (entries, _) = self.ns.readdir(&c, dir, 0, 10_000).unwrap();
            for (e, a) in entries {
                let p = format!("{path}/{}", e.name);
                let data = if mode::is_reg(a.mode) { self.ns.read_dom(&c, a.fid, 0, 4096).unwrap() } else { vec![] };
                if mode::is_dir(a.mode) {
                    dirs.push((p.clone(), a.fid));
                }
                out.insert(p, (a.fid, a.mode, a.size, data));
            }
        }
        out
    }
}

fn client_cfg() -> ClientConfig {
    ClientConfig {
        at: AtConfig { at_min: Duration::from_millis(300), ..AtConfig::default() },
        ping: false,
        max_resends: 50,
        ..ClientConfig::default()
    }
}

struct Md {
    imp: Arc<Import>,
}

impl Md {
    async fn connect(net: &MemNetwork, name: &str) -> Md {
        let client = Client::new(Arc::new(net.transport(name)), client_cfg());
        Md { imp: client.connect(&"mds0@mem".parse().unwrap()).await.unwrap() }
    }

    async fn try_call(&self, r: Request, bulk: &[u8]) -> Result<Reply, RpcError> {
        let (op, body) = r.encode(&Creds::default());
        let f = self.imp.call(op, &body, bulk).await?;
        if f.header.status != 0 {
            return Err(RpcError::Protocol(format!("{}: {}", f.header.status, String::from_utf8_lossy(&f.body))));
        }
        Ok(Reply::decode(&f.body).unwrap())
    }

    async fn call(&self, r: Request) -> Reply {
        self.try_call(r, &[]).await.unwrap()
    }

    async fn attr(&self, r: Request) -> Attr {
        match self.call(r).await {
            Reply::Attr(a) | Reply::Writing(a) | Reply::Opened { attr: a, .. } => a,
            other => panic!("not attributes: {other:?}"),
        }
    }

    async fn mkdir(&self, dir: Fid, name: &str) -> Attr {
        let r = Request::Create {
            dir,
            name: name.into(),
            mode: mode::S_IFDIR | 0o755,
            target: vec![],
            layout: vec![],
            rdev: 0,
        };
        self.attr(r).await
    }

    async fn create(&self, dir: Fid, name: &str) -> Attr {
        let r = Request::Create {
            dir,
            name: name.into(),
            mode: mode::S_IFREG | 0o644,
            target: vec![],
            layout: vec![],
            rdev: 0,
        };
        self.attr(r).await
    }

    async fn create_open(&self, dir: Fid, name: &str) -> (u64, Attr) {
        let r = Request::CreateOpen { dir, name: name.into(), perms: 0o644, layout: vec![], read: true, write: true };
        match self.call(r).await {
            Reply::Opened { handle, attr, .. } => (handle, attr),
            other => panic!("not opened: {other:?}"),
        }
    }

    async fn rename(&self, dir: Fid, from: &str, to: &str) -> Result<Reply, RpcError> {
        let r = Request::Rename {
            src_dir: dir,
            src_name: from.into(),
            dst_dir: dir,
            dst_name: to.into(),
            noreplace: false,
        };
        self.try_call(r, &[]).await
    }

    /// Open for reading and writing, kept for replay as the mount keeps its opens.
    async fn open(&self, fid: Fid) -> u64 {
        let (op, body) = Request::Open { fid, read: true, write: true, dom_read: 0 }.encode(&Creds::default());
        let f = self.imp.call(op, &body, &[]).await.unwrap();
        let Reply::Opened { handle, .. } = Reply::decode(&f.body).unwrap() else { panic!("no handle") };
        self.imp.keep_open(handle, op, &body, &f);
        handle
    }

    async fn write(&self, fid: Fid, handle: u64, offset: u64, data: &[u8]) {
        self.try_call(Request::DomWrite { fid, offset, handle }, data).await.unwrap();
    }
}

/// The create of regular file `name` under the root with the layout `lfs` gives
/// (`setstripe` arguments).
fn file_with_layout(name: &str, lfs: &[&str]) -> Request {
    Request::Create {
        dir: Fid::ROOT,
        name: name.into(),
        mode: mode::S_IFREG | 0o644,
        target: vec![],
        layout: Layout::from_lfs_args(lfs).unwrap().encode(),
        rdev: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_rebuild_the_tree_every_client_was_answered() {
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let (a, b) = (Md::connect(&net, "a").await, Md::connect(&net, "b").await);
    // Each client's first change is committed before its reply.
    let d = a.mkdir(Fid::ROOT, "d").await;
    b.create(d.fid, "x").await;
    let committed = mdt.ns.transnos().1;
    // From here on answered, not committed, and dependent across the two clients.
    let f = a.create(d.fid, "f").await;
    b.rename(d.fid, "f", "g").await.unwrap();
    let (h, hf) = a.create_open(d.fid, "h").await;
    a.write(hf.fid, h, 0, b"written before the crash").await;
    b.call(Request::Unlink { dir: d.fid, name: "x".into(), rmdir: false }).await;
    let sub = b.mkdir(d.fid, "sub").await;
    a.create(sub.fid, "y").await;
    b.rename(d.fid, "g", "f2").await.unwrap();
    let (last, now_committed) = mdt.ns.transnos();
    assert_eq!(now_committed, committed, "nothing more was committed");
    assert!(last >= committed + 8);
    assert!(a.imp.uncommitted() >= 4 && b.imp.uncommitted() >= 4);
    let answered = mdt.tree();
    assert_eq!(answered["/d/f2"].0, f.fid);
    mdt.crash();

    let mdt = Mdt::start(&net, &v, false).await;
    assert!(mdt.status().contains("RECOVERING"), "{}", mdt.status());
    assert!(!mdt.tree().contains_key("/d/f2"), "the crash lost the uncommitted changes");
    // Their next requests reconnect, replay, and run once recovery is over.
    let (ra, rb) = tokio::join!(a.create(Fid::ROOT, "after-a"), b.create(Fid::ROOT, "after-b"));
    let mut now = mdt.tree();
    assert_eq!(now.remove("/after-a").map(|e| e.0), Some(ra.fid));
    assert_eq!(now.remove("/after-b").map(|e| e.0), Some(rb.fid));
    assert_eq!(now, answered, "the replays rebuilt every answered change, FIDs included");
    let status = mdt.status();
    assert!(status.contains("COMPLETE") && status.contains("completed_clients: 2/2"), "{status}");
    assert!(status.contains("failed_replays: 0"), "{status}");
    // The create-open was replayed with its handle: writing and closing through it work.
    a.write(hf.fid, h, 24, b", and after").await;
    a.call(Request::Close { handle: h }).await;
    let c = Cred::root();
    assert_eq!(mdt.ns.read_dom(&c, hf.fid, 0, 100).unwrap(), b"written before the crash, and after");
    // New FIDs do not collide with replayed ones.
    let n = a.create(Fid::ROOT, "new").await;
    assert!(answered.values().all(|e| e.0 != n.fid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_lost_with_the_mds_is_evicted_and_what_depended_on_it_fails_cleanly() {
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let (a, b) = (Md::connect(&net, "a").await, Md::connect(&net, "b").await);
    a.mkdir(Fid::ROOT, "a-first").await;
    b.mkdir(Fid::ROOT, "b-first").await;
    // a fsyncs one change: it must survive whatever happens to a.
    a.create(Fid::ROOT, "durable").await;
    a.imp.commit().await.unwrap();
    // Then, uncommitted: a makes p, b renames it (depends on a), b makes its own dir.
    a.create(Fid::ROOT, "p").await;
    b.rename(Fid::ROOT, "p", "q").await.unwrap();
    b.mkdir(Fid::ROOT, "b-own").await;
    mdt.crash();

    // a dies with the MDS: it never comes back.
    let mdt = Mdt::start(&net, &v, false).await;
    let t = std::time::Instant::now();
    b.call(Request::Getattr { fid: Fid::ROOT }).await;
    assert!(t.elapsed() >= Duration::from_millis(SOFT_MS / 2), "b waited for the window to close");
    let tree = mdt.tree();
    for name in ["/a-first", "/b-first", "/durable", "/b-own"] {
        assert!(tree.contains_key(name), "{name} is lost: {:?}", tree.keys());
    }
    assert!(!tree.contains_key("/p") && !tree.contains_key("/q"), "{:?}", tree.keys());
    let status = mdt.status();
    assert!(status.contains("evicted_clients: 1") && status.contains("failed_replays: 1"), "{status}");
    // a, evicted, is told so; what it kept is dropped, not applied.
    let e = a.try_call(Request::Getattr { fid: Fid::ROOT }, &[]).await;
    assert!(matches!(e, Err(RpcError::Evicted { .. })), "{e:?}");
    assert!(a.imp.stats().replays_lost >= 1);
    assert!(!mdt.tree().contains_key("/p"));
}

/// `recovery_time_soft` and `_hard` are parameters: refused values change nothing, a
/// value set while recovering takes effect at once (counted from the start of recovery),
/// and one stored in the MGS (`set-param -P`) is taken when new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recovery_window_is_set_while_recovering_and_from_stored_parameters() {
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let a = Md::connect(&net, "a").await;
    a.mkdir(Fid::ROOT, "first").await;
    a.create(Fid::ROOT, "lost").await;
    mdt.crash();
    // a never comes back; the window is a minute.
    let mdt = Mdt::start_with(&net, &v, false, Duration::from_secs(60)).await;
    let window = |m: &Mdt| {
        let get = |leaf: &str| m.mds.get_param(&format!("mdt.mdt0.{leaf}")).pop().unwrap().1;
        (get("recovery_time_soft"), get("recovery_time_hard"))
    };
    assert_eq!(window(&mdt), ("60".into(), "240".into()));
    assert!(mdt.status().contains("status: RECOVERING"), "{}", mdt.status());
    for (leaf, value, why) in [
        ("recovery_time_soft", "0", "from 1 to 3600"),
        ("recovery_time_hard", "7200", "from 1 to 3600"),
        ("recovery_time_soft", "300", "past recovery_time_hard"),
        ("recovery_time_hard", "soon", "not a number"),
    ] {
        let e = mdt.mds.set_param(&format!("mdt.mdt0.{leaf}"), value).unwrap_err();
        assert!(e.contains(why), "{leaf}={value}: {e}");
    }
    assert_eq!(window(&mdt), ("60".into(), "240".into()), "refused values changed nothing");
    // Stored in the MGS: taken now, and the recovery under way ends a second after its
    // start instead of a minute.
    let stored = vec![("mdt.*.recovery_time_soft".to_string(), "1".to_string())];
    mdt.mds.apply_stored(&stored);
    assert_eq!(window(&mdt).0, "1");
    let t = std::time::Instant::now();
    while mdt.status().contains("status: RECOVERING") {
        assert!(t.elapsed() < Duration::from_secs(20), "the shorter window never closed: {}", mdt.status());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(mdt.status().contains("evicted_clients: 1"), "{}", mdt.status());
    assert!(!mdt.tree().contains_key("/lost"));
    // A value set here stays until the stored one changes.
    mdt.mds.set_param("mdt.mdt0.recovery_time_soft", "5").unwrap();
    mdt.mds.apply_stored(&stored);
    assert_eq!(window(&mdt).0, "5");
    mdt.mds.apply_stored(&[("mdt.*.recovery_time_soft".to_string(), "2".to_string())]);
    assert_eq!(window(&mdt).0, "2");
}

/// Version-based recovery: a change to a file made after another client's change to the
/// same file, replayed when that client is lost, fails with EOVERFLOW instead of
/// applying to a state its client never saw; changes that did not depend on the lost one
/// replay as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_depended_on_a_lost_change_fails_and_changes_nothing() {
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let (a, b) = (Md::connect(&net, "a").await, Md::connect(&net, "b").await);
    a.mkdir(Fid::ROOT, "a-first").await;
    b.mkdir(Fid::ROOT, "b-first").await;
    let f = a.create(Fid::ROOT, "shared").await;
    a.imp.commit().await.unwrap();
    let (ha, hb) = (a.open(f.fid).await, b.open(f.fid).await);
    // a writes (lost with a), then b writes over it: b's write came after a's.
    a.write(f.fid, ha, 0, b"a's bytes, lost").await;
    b.write(f.fid, hb, 0, b"b's").await;
    b.mkdir(Fid::ROOT, "b-own").await;
    let c = Cred::root();
    assert_eq!(mdt.ns.read_dom(&c, f.fid, 0, 100).unwrap(), b"b's bytes, lost");
    mdt.crash();

    let mdt = Mdt::start(&net, &v, false).await;
    b.call(Request::Getattr { fid: Fid::ROOT }).await;
    let status = mdt.status();
    assert!(status.contains("evicted_clients: 1") && status.contains("failed_replays: 1"), "{status}");
    assert_eq!(mdt.ns.read_dom(&c, f.fid, 0, 100).unwrap(), b"", "neither write: b's depended on a's");
    assert!(mdt.tree().contains_key("/b-own"), "what did not depend on a replayed");
    assert!(b.imp.stats().replay_failures >= 1);
    // b's handle was replayed: it writes again.
    b.write(f.fid, hb, 0, b"again").await;
    assert_eq!(mdt.ns.read_dom(&c, f.fid, 0, 100).unwrap(), b"again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_during_recovery_wait_for_its_end() {
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let a = Md::connect(&net, "a").await;
    a.mkdir(Fid::ROOT, "first").await;
    a.create(Fid::ROOT, "answered").await;
    mdt.crash();
    // Sent while the MDS is down: resent until it is back, then held until a replayed.
    let late = tokio::spawn(async move {
        let r = a.create(Fid::ROOT, "late").await;
        (a, r)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mdt = Mdt::start(&net, &v, false).await;
    // A new client is held off until recovery ends.
    let c = Md::connect(&net, "c").await;
    let e = c.try_call(Request::create(Fid::ROOT, "answered", mode::S_IFREG | 0o644), &[]);
    let e = e.await;
    assert!(
        matches!(&e, Err(RpcError::Protocol(m)) if m.starts_with(&format!("-{}", errno::EEXIST))),
        "the new client ran after a's replay made the name: {e:?}"
    );
    let (_a, r) = late.await.unwrap();
    let tree = mdt.tree();
    assert_eq!(tree["/late"].0, r.fid);
    assert!(tree.contains_key("/answered"));
}

/// An open of a file another client made and the MDS had not committed replays after
/// that create (its reply says after which transno), not after its own client's last
/// change: the handle works after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_of_another_clients_uncommitted_file_replays_after_its_create() {
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let (a, b) = (Md::connect(&net, "a").await, Md::connect(&net, "b").await);
    // Each client's first change is committed; b's comes last.
    a.mkdir(Fid::ROOT, "a-dir").await;
    b.mkdir(Fid::ROOT, "b-dir").await;
    let f = a.create(Fid::ROOT, "made-by-a").await;
    let h = b.open(f.fid).await;
    assert_eq!((a.imp.uncommitted(), b.imp.uncommitted()), (1, 0));
    mdt.crash();

    let mdt = Mdt::start(&net, &v, false).await;
    // b comes back first: its open waits for a's create.
    let (_, _) = tokio::join!(b.call(Request::Getattr { fid: Fid::ROOT }), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.call(Request::Getattr { fid: Fid::ROOT }).await
    });
    let status = mdt.status();
    assert!(status.contains("COMPLETE") && status.contains("failed_replays: 0"), "{status}");
    b.write(f.fid, h, 0, b"through b's handle").await;
    assert_eq!(mdt.ns.read_dom(&Cred::root(), f.fid, 0, 100).unwrap(), b"through b's handle");
    b.call(Request::Close { handle: h }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_files_stay_open_across_a_restart_even_unlinked() {
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let (a, b) = (Md::connect(&net, "a").await, Md::connect(&net, "b").await);
    let kept = a.create(Fid::ROOT, "kept").await;
    let gone = a.create(Fid::ROOT, "gone").await;
    a.imp.commit().await.unwrap();
    let (h1, h2) = (a.open(kept.fid).await, a.open(gone.fid).await);
    assert_eq!(a.imp.open_states(), 2);
    // b's first change: committed, so the orphan is on the drives.
    b.call(Request::Unlink { dir: Fid::ROOT, name: "gone".into(), rmdir: false }).await;
    a.write(kept.fid, h1, 0, b"before").await;
    mdt.crash();

    let mdt = Mdt::start(&net, &v, false).await;
    tokio::join!(a.call(Request::Getattr { fid: Fid::ROOT }), b.call(Request::Getattr { fid: Fid::ROOT }));
    let status = mdt.status();
    assert!(status.contains("COMPLETE") && status.contains("failed_replays: 0"), "{status}");
    let c = Cred::root();
    assert_eq!(mdt.ns.read_dom(&c, kept.fid, 0, 100).unwrap(), b"before");
    // Both handles work: the file unlinked while open lives on.
    a.write(kept.fid, h1, 6, b" and after").await;
    a.write(gone.fid, h2, 0, b"ghost").await;
    assert_eq!(mdt.ns.read_dom(&c, kept.fid, 0, 100).unwrap(), b"before and after");
    assert_eq!(mdt.ns.read_dom(&c, gone.fid, 0, 100).unwrap(), b"ghost");
    assert_eq!(mdt.ns.getattr(gone.fid).unwrap().nlink, 0);
    a.call(Request::Close { handle: h2 }).await;
    assert!(mdt.ns.getattr(gone.fid).is_err(), "its last close removed it");
    a.call(Request::Close { handle: h1 }).await;
}

/// Locks come back after a restart: each client replays the lock requests of what it
/// holds (as the mount keeps them), after its opens; a lock another client held is still
/// in the way, and goes when its holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_taken_again_by_their_holders_after_a_restart() {
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let (a, b) = (Md::connect(&net, "a").await, Md::connect(&net, "b").await);
    let f = a.create(Fid::ROOT, "f").await;
    a.imp.commit().await.unwrap();
    // b makes no change: its open makes it a client the MDS waits for all the same.
    let (ha, hb) = (a.open(f.fid).await, b.open(f.fid).await);
    let lk = |handle, owner: u64, kind, flags, start, end| Request::Lock {
        fid: f.fid,
        handle,
        owner,
        pid: owner as u32,
        kind,
        flags,
        start,
        end,
    };
    // a holds a write lock on 0..=9 and b a read lock on 20..=29, each kept for replay.
    for (md, r, key) in
        [(&a, lk(ha, 1, lock::WRITE, 0, 0, 9), 1u64 << 63), (&b, lk(hb, 2, lock::READ, 0, 20, 29), 1 << 63)]
    {
        md.call(r.clone()).await;
        let (op, body) = r.encode(&Creds::default());
        md.imp.keep_state(key, op, &body);
    }
    mdt.crash();

    let mdt = Mdt::start(&net, &v, false).await;
    tokio::join!(a.call(Request::Getattr { fid: Fid::ROOT }), b.call(Request::Getattr { fid: Fid::ROOT }));
    let status = mdt.status();
    assert!(status.contains("COMPLETE") && status.contains("failed_replays: 0"), "{status}");
    let locks = mdt.mds.get_param("mdt.mdt0.locks").pop().unwrap().1;
    assert!(locks.starts_with("held 2\n"), "{locks}");
    // Still in each other's way.
    let e = b.try_call(lk(hb, 2, lock::WRITE, 0, 5, 5), &[]).await.unwrap_err().to_string();
    assert!(e.contains(&format!("{}", -errno::EAGAIN)), "{e}");
    let e = a.try_call(lk(ha, 1, lock::WRITE, 0, 25, 25), &[]).await.unwrap_err().to_string();
    assert!(e.contains(&format!("{}", -errno::EAGAIN)), "{e}");
    // a lets go: b takes it.
    a.call(Request::Unlock { fid: f.fid, owner: 1 }).await;
    a.imp.forget_state(1);
    b.call(lk(hb, 2, lock::WRITE, 0, 5, 5)).await;
}

/// Changes made through a handle (a writer publishing its size, a DoM write) replay
/// after a restart even when the handle was closed before it: they were checked when
/// they first ran. A failover moves an MDT while files written just before are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_through_a_handle_closed_since_replay_after_a_restart() {
    use nacre_proto::mdt::{SetAttr, set};
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let a = Md::connect(&net, "a").await;
    let f = a.create(Fid::ROOT, "f").await;
    a.imp.commit().await.unwrap();
    let h = a.open(f.fid).await;
    a.write(f.fid, h, 0, b"written").await;
    let set = SetAttr {
        mask: set::BY_HANDLE | set::MTIME | set::SIZE | set::SIZE_AT_LEAST,
        mtime_ns: 42_000_000_000,
        size: 7,
        handle: h,
        ..SetAttr::default()
    };
    a.call(Request::Setattr { fid: f.fid, set }).await;
    a.call(Request::Close { handle: h }).await;
    a.imp.forget_open(h);
    mdt.crash();

    let mdt = Mdt::start(&net, &v, false).await;
    a.call(Request::Getattr { fid: Fid::ROOT }).await;
    let status = mdt.status();
    assert!(status.contains("COMPLETE") && status.contains("failed_replays: 0"), "{status}");
    let c = Cred::root();
    assert_eq!(mdt.ns.read_dom(&c, f.fid, 0, 100).unwrap(), b"written");
    assert_eq!(mdt.ns.getattr(f.fid).unwrap().mtime_ns, 42_000_000_000);
    // A handle that was never open is refused, as before.
    let set = SetAttr { mask: set::BY_HANDLE | set::MTIME, mtime_ns: 1, handle: h, ..SetAttr::default() };
    let err = a.try_call(Request::Setattr { fid: f.fid, set }, &[]).await.unwrap_err();
    assert!(err.to_string().contains("not open for writing"), "{err}");
}

/// An open made by a create-open stays open across a restart when the create was
/// committed without its client knowing: the replay of an earlier change tells it so,
/// and the open is then replayed as open state rather than dropped with the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_opens_handle_survives_a_restart_when_the_replay_learns_it_was_committed() {
    let (net, v) = (MemNetwork::new(), volume());
    let mdt = Mdt::start(&net, &v, true).await;
    let (a, b) = (Md::connect(&net, "a").await, Md::connect(&net, "b").await);
    // Each client's first change is durable before its answer.
    b.create(Fid::ROOT, "b0").await;
    a.create(Fid::ROOT, "a0").await;
    a.create(Fid::ROOT, "x").await;
    let r =
        Request::CreateOpen { dir: Fid::ROOT, name: "f".into(), perms: 0o644, layout: vec![], read: true, write: true };
    let (op, body) = r.encode(&Creds::default());
    let f = a.imp.call(op, &body, &[]).await.unwrap();
    let Reply::Opened { handle, attr, .. } = Reply::decode(&f.body).unwrap() else { panic!("not opened") };
    a.imp.keep_open(handle, op, &body, &f);
    assert_eq!(a.imp.uncommitted(), 2);
    // b's commit makes a's changes durable too; a does not hear of it.
    b.imp.commit().await.unwrap();
    mdt.crash();

    let mdt = Mdt::start(&net, &v, false).await;
    tokio::join!(a.call(Request::Getattr { fid: Fid::ROOT }), b.call(Request::Getattr { fid: Fid::ROOT }));
    let status = mdt.status();
    assert!(status.contains("COMPLETE"), "{status}");
    a.write(attr.fid, handle, 0, b"still open").await;
    assert_eq!(mdt.ns.read_dom(&Cred::root(), attr.fid, 0, 100).unwrap(), b"still open");
    a.call(Request::Close { handle }).await;
}

/// A new MDT with OST 0 attached and objects 100..150 in its pool, and two clients, `a`
/// having made a change (so the MDT waits for it after a restart).
async fn with_one_ost(net: &MemNetwork, v: &Arc<Volume>) -> (Mdt, Md, Md) {
    let mdt = Mdt::start(net, v, true).await;
    mdt.ns.attach_osts(&[0]).unwrap();
    mdt.ns.add_precreated(0, 100, 50).unwrap();
    let (a, b) = (Md::connect(net, "a").await, Md::connect(net, "b").await);
    a.mkdir(Fid::ROOT, "a-first").await;
    (mdt, a, b)
}

/// A create answered before a restart is replayed with the OST objects its first answer
/// gave (the client may have written them), not whatever the pool holds then: here the
/// client that made the first file dies with the MDS, so a replay that took the pool's
/// front would get that file's object while its client writes to the next. The object
/// of the create nobody replays is destroyed, not given to a new file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_creates_keep_the_objects_their_first_answer_gave() {
    let (net, v) = (MemNetwork::new(), volume());
    let (mdt, a, b) = with_one_ost(&net, &v).await;
    b.mkdir(Fid::ROOT, "b-first").await;
    b.imp.commit().await.unwrap();
    let striped = Layout::from_lfs_args(&["-c", "1"]).unwrap().encode();
    let create = |md: &Md, name: &str| {
        let r = file_with_layout(name, &["-c", "1"]);
        let md = md.imp.clone();
        async move {
            let (op, body) = r.encode(&Creds::default());
            let f = md.call(op, &body, &[]).await.unwrap();
            assert_eq!(f.header.status, 0, "{}", String::from_utf8_lossy(&f.body));
            match Reply::decode(&f.body).unwrap() {
                Reply::Created { attr, objects, .. } => (attr, objects),
                other => panic!("a regular file's create answers its objects: {other:?}"),
            }
        }
    };
    // Uncommitted: a's file is given object 100, then b's create and create-open 101, 102.
    let (lost, lost_objects) = create(&a, "lost").await;
    assert_eq!(lost_objects, vec![vec![(0, 100)]]);
    let (kept, kept_objects) = create(&b, "kept").await;
    let r = Request::CreateOpen {
        dir: Fid::ROOT,
        name: "opened".into(),
        perms: 0o644,
        layout: striped.clone(),
        read: true,
        write: true,
    };
    let (handle, opened, opened_objects) = match b.call(r).await {
        Reply::Opened { handle, attr, objects, .. } => (handle, attr, objects),
        other => panic!("not opened: {other:?}"),
    };
    assert_eq!((kept_objects.clone(), opened_objects.clone()), (vec![vec![(0, 101)]], vec![vec![(0, 102)]]));
    mdt.crash();

    // a dies with the MDS; b replays both of its creates.
    let mdt = Mdt::start(&net, &v, false).await;
    // The OST's next objects, as the precreate task adds them after a restart.
    mdt.ns.add_precreated(0, 150, 50).unwrap();
    let (fresh, fresh_objects) = create(&b, "fresh").await;
    let status = mdt.status();
    assert!(status.contains("evicted_clients: 1") && status.contains("failed_replays: 0"), "{status}");
    let c = Cred::root();
    let fid = |name: &str| mdt.ns.lookup(&c, Fid::ROOT, name).map(|a| a.fid).map_err(|e| e.errno);
    assert_eq!(fid("lost"), Err(errno::ENOENT));
    assert_eq!((fid("kept"), fid("opened"), fid("fresh")), (Ok(kept.fid), Ok(opened.fid), Ok(fresh.fid)));
    assert_eq!(mdt.ns.objects(kept.fid).unwrap(), kept_objects, "the replayed create kept its object");
    assert_eq!(mdt.ns.objects(opened.fid).unwrap(), opened_objects, "so did the replayed create-open");
    assert_eq!(fresh_objects, vec![vec![(0, 150)]], "a new file takes an object made since the restart");
    assert_eq!(mdt.ns.pending_destroys(Some(0), 10).unwrap(), vec![(0, 100)], "{lost:?}'s object is destroyed");
    // The handle replayed with its create-open is b's still.
    b.call(Request::Close { handle }).await;
    // Once replays are over, the rest of the objects from before the restart go too.
    assert!(mdt.ns.has_stale(0));
    while mdt.ns.retire_stale(0).unwrap() {}
    let destroyed = mdt.ns.pending_destroys(Some(0), 100).unwrap();
    assert_eq!(destroyed.len(), 1 + 47, "{destroyed:?}");
    assert!(destroyed.iter().all(|&(_, o)| o == 100 || (103..150).contains(&o)), "{destroyed:?}");
}

/// A layout intent answered before a restart is replayed with the objects its first
/// answer gave (its client may have written them), as a create is: here another client's
/// create that took the pool's front dies with the MDS, so a replay that took the pool's
/// front again would give the writer that file's object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_layout_intents_keep_the_objects_their_first_answer_gave() {
    let (net, v) = (MemNetwork::new(), volume());
    let (mdt, a, b) = with_one_ost(&net, &v).await;
    let file = b.attr(file_with_layout("pfl", &["-E", "64K", "-L", "mdt", "-E", "-1", "-c", "1"])).await;
    assert!(mdt.ns.objects(file.fid).unwrap().iter().all(Vec::is_empty), "no object before a write needs one");
    let handle = b.open(file.fid).await;
    b.imp.commit().await.unwrap();
    // Uncommitted: a's file takes object 100, then b's write past 64 KiB object 101.
    a.call(file_with_layout("lost", &["-c", "1"])).await;
    let first = match b.call(Request::LayoutIntent { fid: file.fid, handle, end: 70_000 }).await {
        Reply::Layout { objects, .. } => objects,
        other => panic!("a layout intent answers the layout: {other:?}"),
    };
    assert_eq!(first, vec![vec![], vec![(0, 101)]]);
    // Asked again (a second writer, or a resend): the same objects.
    match b.call(Request::LayoutIntent { fid: file.fid, handle, end: 1 << 30 }).await {
        Reply::Layout { objects, .. } => assert_eq!(objects, first),
        other => panic!("{other:?}"),
    }
    mdt.crash();

    // a dies with the MDS; b replays its open and its intents.
    let mdt = Mdt::start(&net, &v, false).await;
    mdt.ns.add_precreated(0, 150, 50).unwrap();
    b.mkdir(Fid::ROOT, "after").await;
    let status = mdt.status();
    assert!(status.contains("evicted_clients: 1") && status.contains("failed_replays: 0"), "{status}");
    assert_eq!(mdt.ns.objects(file.fid).unwrap(), first, "the replayed intent kept its object");
    assert_eq!(mdt.ns.pending_destroys(Some(0), 10).unwrap(), vec![(0, 100)], "the lost create's object is destroyed");
    // Bad input changes nothing: a handle that is not the caller's, a directory.
    let e = b.try_call(Request::LayoutIntent { fid: Fid::ROOT, handle: 0, end: 1 }, &[]).await.unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    assert_eq!(mdt.ns.objects(file.fid).unwrap(), first);
    b.call(Request::Close { handle }).await;
}
