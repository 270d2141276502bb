//! Several MDTs (DNE) end to end over the in-memory transport: directories on another
//! MDT, striped directories with names spread by hash, defaults that place subdirectories
//! round-robin, unlink, rename and link across MDTs, failures undone, lost replies of
//! steps answered once, and an operation cut by a crash of its coordinator finished at
//! restart.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::frame::FrameHeader;
use nacre_net::server::{Incoming, Server, ServerConfig};
use nacre_net::transport::MemNetwork;
use nacre_proto::dne::{DirDefault, DirStripe};
use nacre_proto::fid::Fid;
use nacre_proto::mdt::{self, Attr, Creds, Reply, Request, errno, mode};
use nacre_raid::Volume;
use nacre_server::mds::Mds;
use nacre_server::mdt::{Namespace, NamespaceOptions};

fn volume(name: &str) -> Arc<Volume> {
    crate::raid1_volume(name, 64 << 20)
}

/// A file system of `n` MDTs, each served on `mdsI@mem`, and a client of each.
struct Fs {
    _servers: Vec<Server>,
    mds: Vec<Arc<Mds>>,
    imps: Vec<Arc<Import>>,
    creds: Creds,
}

async fn file_system(n: u32) -> (Fs, MemNetwork) {
    let net = MemNetwork::new();
    let (mut servers, mut mds, mut nids) = (Vec::new(), Vec::new(), HashMap::new());
    for i in 0..n {
        let ns = Arc::new(Namespace::format(volume(&format!("mdt{i}")), i, NamespaceOptions::default()).unwrap());
        let m = Mds::new(&format!("mdt{i}"), ns);
        let nid: nacre_net::nid::Nid = format!("mds{i}@mem").parse().unwrap();
        servers.push(
            Server::start(Arc::new(net.transport(&format!("mds{i}"))), &nid, m.handler(), ServerConfig::default())
                .await
                .unwrap(),
        );
        nids.insert(i, vec![nid]);
        mds.push(m);
    }
    for (i, m) in mds.iter().enumerate() {
        let peer = Client::new(Arc::new(net.transport(&format!("mds{i}-peer"))), ClientConfig::default());
        m.coordinator().set_peers(n, peer, "nacre", nids.clone());
        m.recover().unwrap();
    }
    let client = Client::new(Arc::new(net.transport("c0")), ClientConfig::default());
    let mut imps = Vec::new();
    for i in 0..n {
        imps.push(client.connect(&nids[&i][0]).await.unwrap());
    }
    (Fs { _servers: servers, mds, imps, creds: Creds::default() }, net)
}

impl Fs {
    async fn call(&self, mdt: u32, r: Request) -> Result<Reply, (i32, String)> {
        let (op, body) = r.encode(&self.creds);
        let f = self.imps[mdt as usize].call(op, &body, &[]).await.map_err(|e| (0, e.to_string()))?;
        if f.header.status != 0 {
            return Err((-f.header.status, String::from_utf8_lossy(&f.body).into_owned()));
        }
        Ok(Reply::decode(&f.body).unwrap())
    }

    async fn attr(&self, mdt: u32, r: Request) -> Result<Attr, (i32, String)> {
        match self.call(mdt, r).await? {
            Reply::Attr(a) | Reply::Writing(a) => Ok(a),
            other => panic!("not attributes: {other:?}"),
        }
    }

    /// The MDT a FID lives on.
    fn on(f: Fid) -> u32 {
        f.mdt().unwrap()
    }

    async fn getattr(&self, fid: Fid) -> Result<Attr, (i32, String)> {
        self.attr(Self::on(fid), Request::Getattr { fid }).await
    }

    async fn lookup(&self, dir: Fid, name: &str) -> Result<Attr, (i32, String)> {
        self.attr(Self::on(dir), Request::Lookup { dir, name: name.into() }).await
    }

    async fn mkdir(&self, dir: Fid, name: &str, mdt: i32, count: i32) -> Result<Attr, (i32, String)> {
        self.attr(Self::on(dir), Request::Mkdir { dir, name: name.into(), mode: 0o755, mdt, count }).await
    }

    async fn create(&self, dir: Fid, name: &str) -> Result<Attr, (i32, String)> {
        let r = Request::Create {
            dir,
            name: name.into(),
            mode: mode::S_IFREG | 0o644,
            target: vec![],
            layout: vec![],
            rdev: 0,
        };
        self.attr(Self::on(dir), r).await
    }

    async fn unlink(&self, dir: Fid, name: &str, rmdir: bool) -> Result<(), (i32, String)> {
        self.call(Self::on(dir), Request::Unlink { dir, name: name.into(), rmdir }).await.map(|_| ())
    }

    async fn stripe(&self, dir: Fid) -> Option<DirStripe> {
        match self.call(Self::on(dir), Request::Getdirstripe { dir }).await.unwrap() {
            Reply::DirStripe { stripe, .. } if !stripe.is_empty() => Some(DirStripe::decode(&stripe).unwrap()),
            _ => None,
        }
    }

    /// Names of a plain directory or of every shard of a striped one.
    async fn names(&self, dir: Fid) -> BTreeSet<String> {
        let dirs = match self.stripe(dir).await {
            Some(s) => s.shards,
            None => vec![dir],
        };
        let mut out = BTreeSet::new();
        for d in dirs {
            let mut cookie = 0;
            loop {
                match self.call(Self::on(d), Request::Readdir { dir: d, cookie, max: 1000 }).await.unwrap() {
                    Reply::Entries { entries, eof } => {
                        for (e, _) in &entries {
                            assert!(out.insert(e.name.clone()), "{} listed twice", e.name);
                            cookie = e.cookie;
                        }
                        if eof {
                            break;
                        }
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        out
    }

    fn intents(&self) -> usize {
        self.mds.iter().map(|m| m.namespace().intents().unwrap().len()).sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_on_another_mdt() {
    let (fs, _net) = file_system(2).await;
    let d = fs.mkdir(Fid::ROOT, "d", 1, 0).await.unwrap();
    assert_eq!(d.fid.mdt(), Some(1));
    assert!(mode::is_dir(d.mode) && d.nlink == 2);
    // The root's MDT answers the name with the FID; the attributes come from MDT 1.
    let stub = fs.lookup(Fid::ROOT, "d").await.unwrap();
    assert_eq!((stub.fid, stub.mode & mode::S_IFMT), (d.fid, mode::S_IFDIR));
    assert_eq!(fs.getattr(d.fid).await.unwrap().mode, mode::S_IFDIR | 0o755);
    assert_eq!(fs.getattr(Fid::ROOT).await.unwrap().nlink, 3);
    assert_eq!(fs.lookup(d.fid, "..").await.unwrap().fid, Fid::ROOT);
    assert_eq!(fs.mkdir(Fid::ROOT, "d", 1, 0).await.unwrap_err().0, errno::EEXIST);
    assert_eq!(fs.mkdir(Fid::ROOT, "e", 2, 0).await.unwrap_err().0, errno::EINVAL);
    // Files in it are made on MDT 1 alone.
    let f = fs.create(d.fid, "f").await.unwrap();
    assert_eq!(f.fid.mdt(), Some(1));
    // rmdir from MDT 0 of a non-empty directory on MDT 1: refused, and the name is back.
    assert_eq!(fs.unlink(Fid::ROOT, "d", true).await.unwrap_err().0, errno::ENOTEMPTY);
    assert_eq!(fs.lookup(Fid::ROOT, "d").await.unwrap().fid, d.fid);
    assert_eq!(fs.getattr(Fid::ROOT).await.unwrap().nlink, 3);
    assert_eq!(fs.unlink(Fid::ROOT, "d", false).await.unwrap_err().0, errno::EISDIR);
    fs.unlink(d.fid, "f", false).await.unwrap();
    fs.unlink(Fid::ROOT, "d", true).await.unwrap();
    assert_eq!(fs.lookup(Fid::ROOT, "d").await.unwrap_err().0, errno::ENOENT);
    assert_eq!(fs.getattr(d.fid).await.unwrap_err().0, errno::ENOENT);
    assert_eq!(fs.getattr(Fid::ROOT).await.unwrap().nlink, 2);
    assert_eq!(fs.intents(), 0);
    let p = fs.mds[0].get_param("mdt.mdt0.md_stats");
    assert!(p[0].1.contains("mkdir 3"), "{p:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_directory_spreads_names_by_hash() {
    let (fs, _net) = file_system(2).await;
    let d = fs.mkdir(Fid::ROOT, "s", -1, -1).await.unwrap();
    let s = fs.stripe(d.fid).await.unwrap();
    assert_eq!(s.shards.len(), 2);
    let on: BTreeSet<u32> = s.shards.iter().map(|f| f.mdt().unwrap()).collect();
    assert_eq!(on, BTreeSet::from([0, 1]));
    // A name sent to its shard is made there; sent to the master it is refused, naming why.
    let mut want = BTreeSet::new();
    for i in 0..64 {
        let name = format!("f{i:03}");
        let shard = s.shards[s.shard_of(&name)];
        let f = fs.create(shard, &name).await.unwrap();
        assert_eq!(f.fid.mdt(), shard.mdt());
        want.insert(name);
    }
    let per: Vec<usize> =
        s.shards.iter().map(|sh| want.iter().filter(|n| s.shards[s.shard_of(n)] == *sh).count()).collect();
    assert!(per.iter().all(|&k| k > 10), "hash spread {per:?}");
    let e = fs.create(d.fid, "x").await.unwrap_err();
    assert_eq!(e.0, errno::EREMOTE);
    assert!(e.1.contains("striped over 2 MDTs"), "{}", e.1);
    assert_eq!(fs.lookup(d.fid, "f001").await.unwrap_err().0, errno::EREMOTE);
    assert_eq!(fs.names(d.fid).await, want);
    // Shards take the master's mode.
    let chmod =
        Request::Setattr { fid: d.fid, set: mdt::SetAttr { mask: mdt::set::MODE, mode: 0o700, ..Default::default() } };
    assert_eq!(fs.attr(0, chmod).await.unwrap().mode, mode::S_IFDIR | 0o700);
    for sh in &s.shards {
        assert_eq!(fs.getattr(*sh).await.unwrap().mode, mode::S_IFDIR | 0o700);
    }
    // Not empty: refused whole, every shard still there.
    assert_eq!(fs.unlink(Fid::ROOT, "s", true).await.unwrap_err().0, errno::ENOTEMPTY);
    for sh in &s.shards {
        fs.getattr(*sh).await.unwrap();
    }
    assert_eq!(fs.names(d.fid).await.len(), 64);
    for n in &want {
        fs.unlink(s.shards[s.shard_of(n)], n, false).await.unwrap();
    }
    fs.unlink(Fid::ROOT, "s", true).await.unwrap();
    for f in s.shards.iter().chain([&d.fid]) {
        assert_eq!(fs.getattr(*f).await.unwrap_err().0, errno::ENOENT);
    }
    assert_eq!(fs.getattr(Fid::ROOT).await.unwrap().nlink, 2);
    assert_eq!(fs.intents(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_place_subdirectories_round_robin() {
    let (fs, _net) = file_system(2).await;
    let top = fs.mkdir(Fid::ROOT, "easy", 0, 0).await.unwrap();
    let def = DirDefault { count: 1, offset: -1, max_inherit: 3, max_inherit_rr: 2 };
    let bad = DirDefault { offset: 5, ..def };
    let e = fs.call(0, Request::Setdirdefault { dir: top.fid, default: bad.encode() }).await.unwrap_err();
    assert!(e.0 == errno::EINVAL && e.1.contains("MDT index 5"), "{e:?}");
    fs.call(0, Request::Setdirdefault { dir: top.fid, default: def.encode() }).await.unwrap();
    let mut on = [0; 2];
    let mut subs = Vec::new();
    for i in 0..8 {
        let a = fs.mkdir(top.fid, &format!("d{i}"), -1, 0).await.unwrap();
        on[a.fid.mdt().unwrap() as usize] += 1;
        subs.push(a);
    }
    assert_eq!(on, [4, 4], "round-robin over two MDTs");
    // One level down round-robin lasts (max-inherit-rr 2), two levels down it has ended.
    let sub = subs[1];
    match fs.call(Fs::on(sub.fid), Request::Getdirstripe { dir: sub.fid }).await.unwrap() {
        Reply::DirStripe { default, .. } => {
            let d = DirDefault::decode(&default).unwrap();
            assert_eq!((d.max_inherit, d.max_inherit_rr), (2, 1));
        }
        other => panic!("{other:?}"),
    }
    let mut on2 = BTreeSet::new();
    for i in 0..4 {
        on2.insert(fs.mkdir(sub.fid, &format!("e{i}"), -1, 0).await.unwrap().fid.mdt().unwrap());
    }
    assert_eq!(on2.len(), 2, "still round-robin one level down");
    let leaf = fs.mkdir(sub.fid, "leaf", -1, 0).await.unwrap();
    for i in 0..4 {
        let a = fs.mkdir(leaf.fid, &format!("g{i}"), -1, 0).await.unwrap();
        assert_eq!(a.fid.mdt(), leaf.fid.mdt(), "round-robin has run out: the parent's MDT");
    }
    // `-c -1` as a default: every new subdirectory striped over all MDTs (mdtest-hard).
    let hard = fs.mkdir(Fid::ROOT, "hard", 0, 0).await.unwrap();
    let all = DirDefault { count: -1, offset: -1, max_inherit: 3, max_inherit_rr: 0 };
    fs.call(0, Request::Setdirdefault { dir: hard.fid, default: all.encode() }).await.unwrap();
    let h = fs.mkdir(hard.fid, "test-dir", -1, 0).await.unwrap();
    let hs = fs.stripe(h.fid).await.unwrap();
    assert_eq!(hs.shards.len(), 2);
    // A default set on a striped directory reaches its shards, where its subdirectories
    // are made: round-robin from every shard.
    fs.call(0, Request::Setdirdefault { dir: h.fid, default: def.encode() }).await.unwrap();
    let mut on3 = [0; 2];
    for i in 0..8 {
        let name = format!("t{i}");
        let shard = hs.shards[hs.shard_of(&name)];
        on3[fs.mkdir(shard, &name, -1, 0).await.unwrap().fid.mdt().unwrap() as usize] += 1;
    }
    assert!(on3[0] > 0 && on3[1] > 0, "round-robin below a striped directory: {on3:?}");
    for sh in &hs.shards {
        match fs.call(Fs::on(*sh), Request::Getdirstripe { dir: *sh }).await.unwrap() {
            Reply::DirStripe { default, .. } => assert_eq!(DirDefault::decode(&default).unwrap(), def),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(fs.intents(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_and_link_across_mdts() {
    let (fs, _net) = file_system(2).await;
    let a = fs.mkdir(Fid::ROOT, "a", 0, 0).await.unwrap();
    let b = fs.mkdir(Fid::ROOT, "b", 1, 0).await.unwrap();
    let f = fs.create(a.fid, "f").await.unwrap();
    let victim = fs.create(b.fid, "g").await.unwrap();
    let rename = |src_dir, src: &str, dst_dir, dst: &str, noreplace| Request::Rename {
        src_dir,
        src_name: src.into(),
        dst_dir,
        dst_name: dst.into(),
        noreplace,
    };
    // No-replace over an existing name: refused, nothing moved.
    let e = fs.call(0, rename(a.fid, "f", b.fid, "g", true)).await.unwrap_err();
    assert_eq!(e.0, errno::EEXIST);
    assert_eq!(fs.lookup(a.fid, "f").await.unwrap().fid, f.fid);
    // A file from MDT 0 over a file on MDT 1: the target goes.
    fs.call(0, rename(a.fid, "f", b.fid, "g", false)).await.unwrap();
    assert_eq!(fs.lookup(a.fid, "f").await.unwrap_err().0, errno::ENOENT);
    assert_eq!(fs.lookup(b.fid, "g").await.unwrap().fid, f.fid);
    assert_eq!(fs.getattr(victim.fid).await.unwrap_err().0, errno::ENOENT);
    // A directory from MDT 0 into one on MDT 1: its `..` and both link counts follow.
    let x = fs.mkdir(a.fid, "x", 0, 0).await.unwrap();
    fs.call(0, rename(a.fid, "x", b.fid, "x", false)).await.unwrap();
    assert_eq!(fs.lookup(x.fid, "..").await.unwrap().fid, b.fid);
    assert_eq!(fs.getattr(a.fid).await.unwrap().nlink, 2);
    assert_eq!(fs.getattr(b.fid).await.unwrap().nlink, 3);
    // Not below itself: b/x may not take b.
    let e = fs.call(0, rename(Fid::ROOT, "b", x.fid, "b", false)).await.unwrap_err();
    assert_eq!(e.0, errno::EINVAL, "{e:?}");
    assert_eq!(fs.lookup(Fid::ROOT, "b").await.unwrap().fid, b.fid);
    // A hard link on MDT 0 to the file now named on MDT 1 (its inode is on MDT 0).
    let l = fs.attr(1, Request::Link { fid: f.fid, dir: b.fid, name: "h".into() }).await;
    assert_eq!(l.unwrap().nlink, 2);
    let t = fs.create(b.fid, "t").await.unwrap();
    let l = fs.attr(0, Request::Link { fid: t.fid, dir: a.fid, name: "t2".into() }).await.unwrap();
    assert_eq!(l.nlink, 2);
    assert_eq!(fs.getattr(t.fid).await.unwrap().nlink, 2);
    // Link onto a taken name: the count goes back.
    let e = fs.call(0, Request::Link { fid: t.fid, dir: a.fid, name: "t2".into() }).await.unwrap_err();
    assert_eq!(e.0, errno::EEXIST);
    assert_eq!(fs.getattr(t.fid).await.unwrap().nlink, 2);
    // Unlink through MDT 0 of a name whose inode is on MDT 1: one link less, then gone.
    fs.unlink(a.fid, "t2", false).await.unwrap();
    assert_eq!(fs.getattr(t.fid).await.unwrap().nlink, 1);
    fs.unlink(b.fid, "t", false).await.unwrap();
    assert_eq!(fs.getattr(t.fid).await.unwrap_err().0, errno::ENOENT);
    assert_eq!(fs.intents(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_step_reply_runs_the_step_once() {
    let (fs, _net) = file_system(2).await;
    // MDT 1 makes the directory's inode; its answer to MDT 0 is lost, twice.
    fs._servers[1].faults().add(&format!("drop opcode={} count=2", mdt::MDS_UPDATE)).unwrap();
    let d = tokio::time::timeout(Duration::from_secs(120), fs.mkdir(Fid::ROOT, "d", 1, 0)).await.unwrap().unwrap();
    assert_eq!(fs.getattr(d.fid).await.unwrap().nlink, 2);
    assert_eq!(fs.names(Fid::ROOT).await, BTreeSet::from(["d".to_string()]));
    assert_eq!(fs.mds[1].namespace().statfs().unwrap().inodes, 1, "the inode is made once");
    assert!(fs._servers[1].stats().resends >= 1);
    assert_eq!(fs.intents(), 0);
}

fn incoming(client: u64, xid: u64, r: &Request) -> Incoming {
    let (opcode, body) = r.encode(&Creds::default());
    Incoming {
        header: FrameHeader { opcode, xid, acked_xid: xid, ..FrameHeader::default() },
        body,
        bulk: Vec::new().into(),
        peer: "c0@mem".parse().unwrap(),
        client,
        replayed: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_of_the_coordinator_is_finished_at_restart() {
    let net = MemNetwork::new();
    // MDT 1 serves; MDT 0 is driven through its handler, so that it can be cut anywhere.
    let ns1 = Arc::new(Namespace::format(volume("mdt1"), 1, NamespaceOptions::default()).unwrap());
    let mds1 = Mds::new("mdt1", ns1.clone());
    let nid1: nacre_net::nid::Nid = "mds1@mem".parse().unwrap();
    let s1 =
        Server::start(Arc::new(net.transport("mds1")), &nid1, mds1.handler(), ServerConfig::default()).await.unwrap();
    let v0 = volume("mdt0");
    let peers = HashMap::from([(1, vec![nid1.clone()])]);
    let mkdir = Request::Mkdir { dir: Fid::ROOT, name: "d".into(), mode: 0o755, mdt: 1, count: 0 };
    {
        // Its log waits long for company: what nobody waits for stays in memory, so the
        // crash below loses whatever the intent did not make durable itself.
        let slow = NamespaceOptions { commit_interval: Duration::from_secs(10), ..NamespaceOptions::default() };
        let ns0 = Arc::new(Namespace::format(v0.clone(), 0, slow).unwrap());
        let mds0 = Mds::new("mdt0", ns0.clone());
        mds0.coordinator().set_peers(
            2,
            Client::new(Arc::new(net.transport("old0")), ClientConfig::default()),
            "nacre",
            peers.clone(),
        );
        // Every answer of MDT 1 to this MDT 0 is lost: the step is done there, never
        // acknowledged.
        s1.faults().add(&format!("drop opcode={} to=old0@mem", mdt::MDS_UPDATE)).unwrap();
        let h = mds0.handler();
        let task = tokio::spawn(h(incoming(42, 7, &mkdir)));
        for _ in 0..200 {
            if ns1.stats.changes.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(ns0.intents().unwrap().len(), 1, "the intent is stored before any step");
        // The crash: MDT 0 stops where it is, and its log writes nothing more.
        ns0.crash();
        task.abort();
        let _ = task.await;
        drop(h);
        drop(mds0);
        for _ in 0..100 {
            if Arc::strong_count(&ns0) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(Arc::strong_count(&ns0), 1);
    }
    // MDT 0 restarts on its volume and finishes what it began.
    let ns0 = Arc::new(Namespace::open(v0, NamespaceOptions::default()).unwrap());
    let mds0 = Mds::new("mdt0", ns0.clone());
    mds0.coordinator().set_peers(
        2,
        Client::new(Arc::new(net.transport("new0")), ClientConfig::default()),
        "nacre",
        peers,
    );
    assert_eq!(mds0.recover().unwrap(), 1, "the intent was on the drives before its step left");
    for _ in 0..500 {
        if ns0.intents().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ns0.intents().unwrap().is_empty());
    let stub = ns0.lookup(&nacre_server::mdt::Cred::root(), Fid::ROOT, "d").unwrap();
    assert_eq!(stub.fid.mdt(), Some(1));
    assert_eq!(ns1.getattr(stub.fid).unwrap().nlink, 2);
    assert_eq!(ns1.statfs().unwrap().inodes, 1, "one inode made on MDT 1, not two");
    assert_eq!(ns0.getattr(Fid::ROOT).unwrap().nlink, 3);
    // The client's resend gets the first answer.
    let again = mds0.handler()(incoming(42, 7, &mkdir)).await;
    assert_eq!(again.status, 0, "{}", String::from_utf8_lossy(&again.body));
    match Reply::decode(&again.body).unwrap() {
        Reply::Attr(a) => assert_eq!(a.fid, stub.fid),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_operation_over_two_mdts_gets_its_first_answer() {
    let (fs, _net) = file_system(2).await;
    let d = fs.mkdir(Fid::ROOT, "d", 1, 0).await.unwrap();
    let f = fs.create(d.fid, "f").await.unwrap();
    let h = fs.mds[0].handler();
    // A link on MDT 0 to a file on MDT 1, sent twice with one xid: one link, the same
    // attributes both times.
    let link = Request::Link { fid: f.fid, dir: Fid::ROOT, name: "l".into() };
    let first = h(incoming(77, 1, &link)).await;
    let again = h(incoming(77, 1, &link)).await;
    assert_eq!(first.status, 0, "{}", String::from_utf8_lossy(&first.body));
    assert_eq!((again.status, &again.body), (0, &first.body));
    assert_eq!(fs.getattr(f.fid).await.unwrap().nlink, 2);
    // The unlink of a remote directory, resent: done once, answered twice.
    fs.unlink(d.fid, "f", false).await.unwrap();
    let rmdir = Request::Unlink { dir: Fid::ROOT, name: "d".into(), rmdir: true };
    assert_eq!(h(incoming(77, 2, &rmdir)).await.status, 0);
    assert_eq!(h(incoming(77, 2, &rmdir)).await.status, 0, "not ENOENT");
    // A chmod of a striped directory, resent: attributes both times.
    let s = fs.mkdir(Fid::ROOT, "s", 0, 2).await.unwrap();
    let chmod =
        Request::Setattr { fid: s.fid, set: mdt::SetAttr { mask: mdt::set::MODE, mode: 0o750, ..Default::default() } };
    for _ in 0..2 {
        let r = h(incoming(77, 3, &chmod)).await;
        match Reply::decode(&r.body).unwrap() {
            Reply::Attr(a) => assert_eq!(a.mode, mode::S_IFDIR | 0o750),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(fs.intents(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_mdt_holds_up_a_bounded_number_of_requests() {
    let (fs, net) = file_system(2).await;
    // MDT 1 stops answering MDT 0: remote mkdirs wait for it, each holding a slot.
    let rule = fs._servers[1].faults().add(&format!("drop opcode={}", mdt::MDS_UPDATE)).unwrap();
    let max = nacre_server::dne::COORDINATING_MAX;
    let mut waiting = Vec::new();
    for i in 0..max {
        // A client each: one client keeps only so many requests in flight.
        let c = Client::new(Arc::new(net.transport(&format!("w{i}"))), ClientConfig::default());
        let imp = c.connect(&"mds0@mem".parse().unwrap()).await.unwrap();
        let r = Request::Mkdir { dir: Fid::ROOT, name: format!("w{i}"), mode: 0o755, mdt: 1, count: 0 };
        waiting.push(tokio::spawn(async move {
            let (op, body) = r.encode(&Creds::default());
            let f = imp.call(op, &body, &[]).await.unwrap();
            (f.header.status, c)
        }));
    }
    for _ in 0..500 {
        if fs.intents() == max {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fs.intents(), max);
    // One more is turned away at once, and local work goes on.
    let e = fs.mkdir(Fid::ROOT, "more", 1, 0).await.unwrap_err();
    assert_eq!(e.0, errno::EINPROGRESS, "{}", e.1);
    fs.create(Fid::ROOT, "local").await.unwrap();
    // MDT 1 answers again: every waiting mkdir ends, each once.
    fs._servers[1].faults().remove(rule);
    for w in waiting {
        assert_eq!(tokio::time::timeout(Duration::from_secs(120), w).await.unwrap().unwrap().0, 0);
    }
    assert_eq!(fs.names(Fid::ROOT).await.len(), max + 1);
    assert_eq!(fs.mds[1].namespace().statfs().unwrap().inodes, max as u64);
    assert_eq!(fs.intents(), 0);
}
