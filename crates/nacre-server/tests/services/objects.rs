//! OST objects for files: pools refilled from the OSS in the background, files taking
//! their stripes' objects by layout (round-robin, a starting OST, all OSTs,
//! overstriping), removed files' objects destroyed on the OSTs, and the pools and the
//! destroy log surviving a crash of the MDT.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::server::{Server, ServerConfig};
use nacre_net::transport::MemNetwork;
use nacre_osd::{Target, TargetOptions};
use nacre_proto::fid::Fid;
use nacre_proto::layout::Layout;
use nacre_proto::mdt::errno;
use nacre_proto::ost::Request;
use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, Volume, VolumeOptions};
use nacre_server::mdt::{Cred, Namespace, NamespaceOptions};
use nacre_server::objects::{ObjectService, OstLink};
use nacre_server::oss::{Oss, OssConfig};

fn vol(name: &str, level: Level, n: usize, bytes: u64, strip: u64) -> Arc<Volume> {
    let run = VolumeOptions { threads_per_drive: 1, ..VolumeOptions::default() };
    let devs: Vec<Arc<dyn BlockDevice>> =
        (0..n).map(|i| MemDrive::new(&format!("{name}{i}"), bytes) as Arc<dyn BlockDevice>).collect();
    let mut o = CreateOptions::new(name, level);
    o.strip_bytes = strip;
    o.assume_clean = true;
    Arc::new(Volume::create(devs, &o, &run).unwrap())
}

fn ost(i: usize) -> Arc<Target> {
    let data = vol(&format!("d{i}-"), Level::Raid6, 6, 8 << 20, 16 << 10);
    let meta = vol(&format!("m{i}-"), Level::Raid1, 2, 32 << 20, 64 << 10);
    Arc::new(Target::format(data, meta, TargetOptions::default()).unwrap())
}

fn lfs(a: &str) -> Layout {
    Layout::from_lfs_args(&a.split_whitespace().collect::<Vec<_>>()).unwrap()
}

/// An OSS of `n` fresh OSTs on the in-memory network, and the MDS's import of it.
async fn oss_with(n: usize) -> (Server, Arc<Import>) {
    let net = MemNetwork::new();
    let oss = Oss::new((0..n).map(ost).collect(), OssConfig::default()).unwrap();
    let server = Server::start(
        Arc::new(net.transport("oss")),
        &"oss@mem".parse().unwrap(),
        oss.handler(),
        ServerConfig::default(),
    )
    .await
    .unwrap();
    let imp =
        Client::new(Arc::new(net.transport("mds")), ClientConfig::default()).connect(&server.nid()).await.unwrap();
    (server, imp)
}

async fn exists(imp: &Import, target: u32, oid: u64) -> bool {
    let (op, body) = Request::Getattr { target, oid }.encode();
    imp.call(op, &body, &[]).await.unwrap().header.status == 0
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(30), "waited 30 s for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_get_objects_by_layout_and_removed_files_lose_them() {
    let (_server, imp) = oss_with(3).await;
    let mdt = vol("mdt", Level::Raid10, 4, 32 << 20, 64 << 10);
    let ns = Arc::new(Namespace::format(mdt.clone(), 0, NamespaceOptions::default()).unwrap());
    let links: Vec<OstLink> = (0..3).map(|i| OstLink { index: i, import: imp.clone(), target: i }).collect();
    let svc = ObjectService::start(ns.clone(), links.clone(), 64);
    wait_for("the pools to fill", || {
        let l = ns.pool_levels();
        l.len() == 3 && l.iter().all(|(_, n)| *n >= 32)
    })
    .await;
    // An OST attached without objects (down, say) is skipped by free placement.
    let ns2 = ns.clone();
    tokio::task::spawn_blocking(move || ns2.attach_osts(&[9]).unwrap()).await.unwrap();
    let c = Cred::root();
    let ns2 = ns.clone();
    let files = tokio::task::spawn_blocking(move || {
        let mk = |name: &str, l: Option<&str>| match l {
            Some(l) => ns2.create_with_layout(&c, Fid::ROOT, name, 0o644, lfs(l), None).unwrap(),
            None => ns2.create(&c, Fid::ROOT, name, 0o644, None).unwrap(),
        };
        let a = mk("a", None);
        let b = mk("b", None);
        let two = mk("two", Some("-c 2 -i 1"));
        let all = mk("all", Some("-c -1"));
        let many = mk("many", Some("-c 9"));
        let over = mk("over", Some("-C 6"));
        let pfl = mk("pfl", Some("-E 1M -L mdt -E 64M -c 1 -E -1 -c 2"));
        let bad = ns2.create_with_layout(&c, Fid::ROOT, "bad", 0o644, lfs("-c 1 -i 7"), None).unwrap_err();
        (a, b, two, all, many, over, pfl, bad)
    })
    .await
    .unwrap();
    let (a, b, two, all, many, over, pfl, bad) = files;
    let osts_of = |f: Fid| -> Vec<Vec<u32>> {
        ns.objects(f).unwrap().iter().map(|c| c.iter().map(|(o, _)| *o).collect()).collect()
    };
    // Default: one stripe, round-robin over the OSTs.
    let (oa, ob) = (osts_of(a.fid), osts_of(b.fid));
    assert_eq!((oa[0].len(), ob[0].len()), (1, 1));
    assert_ne!(oa[0][0], ob[0][0], "round-robin placement");
    assert_eq!(osts_of(two.fid), vec![vec![1, 2]]);
    assert_eq!(osts_of(all.fid)[0].len(), 3, "-1: every OST that has objects");
    for f in [a.fid, b.fid, all.fid, many.fid, over.fid] {
        assert!(osts_of(f).iter().flatten().all(|&o| o != 9), "a file placed on the empty OST 9");
    }
    assert_eq!(osts_of(many.fid)[0].len(), 3, "without overstriping a file has at most one stripe per OST");
    let mut o = osts_of(over.fid)[0].clone();
    o.sort();
    assert_eq!(o, vec![0, 0, 1, 1, 2, 2], "overstriping puts two stripes on each OST");
    // A PFL file whose first component is on the MDT takes no object when it is made;
    // a write's layout intent gives the components it reaches theirs, and only those,
    // once.
    assert!(osts_of(pfl.fid).iter().all(Vec::is_empty), "{:?}", osts_of(pfl.fid));
    let ns2 = ns.clone();
    let comps = tokio::task::spawn_blocking(move || {
        let lens = |ns: &Namespace| ns.objects(pfl.fid).unwrap().iter().map(Vec::len).collect::<Vec<_>>();
        let mut seen = Vec::new();
        for end in [1 << 20, (1 << 20) + 1, (1 << 20) + 2, (64 << 20) + 1] {
            ns2.layout_intent(&Cred::root(), pfl.fid, end, None).unwrap();
            seen.push((lens(&ns2), ns2.objects(pfl.fid).unwrap()));
        }
        // Not a file, or no write permission: refused, nothing given.
        let dir = ns2.layout_intent(&Cred::root(), Fid::ROOT, 1 << 30, None).unwrap_err();
        let user = ns2.layout_intent(&Cred::user(1000, 1000), a.fid, 1 << 30, None).unwrap_err();
        (seen, dir.errno, user.errno)
    })
    .await
    .unwrap();
    let (seen, dir, user) = comps;
    assert!(seen[0].0.iter().all(|&n| n == 0), "the DoM component needs no object: {:?}", seen[0].0);
    assert_eq!(seen[1].0, vec![0, 1, 0], "a write past 1 MiB reaches the second component only");
    assert_eq!(seen[2].1, seen[1].1, "asked again: the same objects");
    assert_eq!(seen[3].0, vec![0, 1, 2], "past 64 MiB: the third");
    assert_eq!(seen[3].1[1], seen[1].1[1], "the second keeps its object");
    assert_eq!((dir, user), (errno::EINVAL, errno::EACCES));
    assert_eq!(bad.errno, errno::EINVAL);
    assert!(bad.message.contains("OST 7"), "{}", bad.message);
    // Every object exists on its OST, and no two files share one.
    let mut seen = std::collections::HashSet::new();
    for f in [a.fid, b.fid, two.fid, all.fid, many.fid, over.fid, pfl.fid] {
        for (o, oid) in ns.objects(f).unwrap().into_iter().flatten() {
            assert!(seen.insert((o, oid)), "object {oid} of OST {o} given twice");
            assert!(exists(&imp, o, oid).await, "object {oid} of OST {o} does not exist");
        }
    }
    // A removed file's objects are destroyed on their OSTs in the background.
    let gone = ns.objects(all.fid).unwrap();
    let ns2 = ns.clone();
    tokio::task::spawn_blocking(move || ns2.remove(&Cred::root(), Fid::ROOT, "all", false, None).unwrap())
        .await
        .unwrap();
    wait_for("the destroy log to empty", || ns.pending_destroys(None, 10).unwrap().is_empty()).await;
    for (o, oid) in gone.into_iter().flatten() {
        assert!(!exists(&imp, o, oid).await, "object {oid} of OST {o} outlived its file");
    }
    // Without the background tasks, a removed file's objects wait in the log; the log and
    // the pools survive a crash, and the tasks finish the job after the restart.
    drop(svc);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let left = ns.objects(two.fid).unwrap();
    let ns2 = ns.clone();
    tokio::task::spawn_blocking(move || ns2.remove(&Cred::root(), Fid::ROOT, "two", false, None).unwrap())
        .await
        .unwrap();
    assert_eq!(ns.pending_destroys(None, 10).unwrap().len(), 2);
    let levels = ns.pool_levels();
    // A precreate whose answer never reached the MDT: objects on OST 0 nobody recorded.
    let (op, body) = Request::Create { target: 0, count: 10, group: 0 }.encode();
    let (lost, _) = nacre_proto::ost::decode_created(&imp.call(op, &body, &[]).await.unwrap().body).unwrap();
    ns.crash();
    let ns = Arc::new(Namespace::open(mdt, NamespaceOptions::default()).unwrap());
    assert_eq!(ns.pool_levels(), levels, "precreated objects are not lost in a crash");
    assert_eq!(ns.pending_destroys(None, 10).unwrap().len(), 2);
    let _svc = ObjectService::start(ns.clone(), links, 64);
    wait_for("the destroy log to empty after the restart", || ns.pending_destroys(None, 10).unwrap().is_empty()).await;
    for (o, oid) in left.into_iter().flatten() {
        assert!(!exists(&imp, o, oid).await);
    }
    // Those orphans are found and destroyed when the OST is attached again.
    let t = Instant::now();
    while exists(&imp, 0, lost + 9).await {
        assert!(t.elapsed() < Duration::from_secs(30), "orphan objects outlived the restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for oid in lost..lost + 10 {
        assert!(!exists(&imp, 0, oid).await, "orphan {oid} kept");
    }
    // Files' objects are not orphans.
    for f in [a.fid, b.fid, many.fid] {
        for (o, oid) in ns.objects(f).unwrap().into_iter().flatten() {
            assert!(exists(&imp, o, oid).await, "object {oid} of OST {o} destroyed as an orphan");
        }
    }
    // Files made after the restart take objects nobody had.
    let ns2 = ns.clone();
    let n = tokio::task::spawn_blocking(move || ns2.create(&Cred::root(), Fid::ROOT, "new", 0o644, None).unwrap())
        .await
        .unwrap();
    for (o, oid) in ns.objects(n.fid).unwrap().into_iter().flatten() {
        assert!(!seen.contains(&(o, oid)), "object {oid} of OST {o} given twice across a restart");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mdts_precreate_apart_and_clean_up_only_their_own_orphans() {
    let (_server, imp) = oss_with(1).await;
    let links = vec![OstLink { index: 0, import: imp.clone(), target: 0 }];
    let mut mdts = Vec::new();
    for i in 0..2u32 {
        let v = vol(&format!("mdt{i}-"), Level::Raid1, 2, 64 << 20, 64 << 10);
        let ns = Arc::new(Namespace::format(v, i, NamespaceOptions::default()).unwrap());
        let ns2 = ns.clone();
        tokio::task::spawn_blocking(move || ns2.attach_osts(&[0]).unwrap()).await.unwrap();
        let svc = ObjectService::start(ns.clone(), links.clone(), 64);
        wait_for("a first precreate", || ns.pool_levels().iter().any(|(_, l)| *l > 0)).await;
        mdts.push((ns, svc));
    }
    // A directory on MDT 1 (the root is on MDT 0), as MDT 0 makes one there.
    let dir1 = Fid::new(Fid::seq_of(1, nacre_server::mdt::namespace::dne::PEER_SEQ_BASE), 1);
    let attr = nacre_proto::mdt::Attr {
        fid: dir1,
        mode: nacre_proto::mdt::mode::S_IFDIR | 0o755,
        nlink: 2,
        ..Default::default()
    };
    let make = nacre_proto::dne::Update::MakeInode { attr, parent: Fid::ROOT, stripe: vec![], default: vec![] };
    mdts[1].0.submit(None, Namespace::update_change(make), 0).await.unwrap();
    // Each MDT's files have objects in its own group of the OST's ids.
    let mut files = Vec::new();
    for (i, (ns, _)) in mdts.iter().enumerate() {
        let (ns2, dir) = (ns.clone(), [Fid::ROOT, dir1][i]);
        let a = tokio::task::spawn_blocking(move || ns2.create(&Cred::root(), dir, "f", 0o644, None).unwrap())
            .await
            .unwrap();
        let objects: Vec<(u32, u64)> = ns.objects(a.fid).unwrap().into_iter().flatten().collect();
        assert!(objects.iter().all(|(_, oid)| nacre_osd::target::group_of(*oid) == i as u32), "{objects:?}");
        files.push(objects);
    }
    // MDT 0 restarts its object service: its orphan cleanup leaves MDT 1's objects, and
    // MDT 1's precreated pool, alone.
    let (ns0, svc0) = mdts.remove(0);
    drop(svc0);
    let _svc0 = ObjectService::start(ns0.clone(), links.clone(), 64);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (o, oid) in &files[1] {
        assert!(exists(&imp, *o, *oid).await, "MDT 1's object {oid:#x} destroyed by MDT 0");
    }
    let (ns1, _svc1) = &mdts[0];
    let ns2 = ns1.clone();
    let b =
        tokio::task::spawn_blocking(move || ns2.create(&Cred::root(), dir1, "g", 0o644, None).unwrap()).await.unwrap();
    for (o, oid) in ns1.objects(b.fid).unwrap().into_iter().flatten() {
        assert!(exists(&imp, o, oid).await, "MDT 1's pool object {oid:#x} is gone");
    }
}

/// The MDS follows the OSTs of the configuration: an OST listed where nothing answers
/// holds up none of the others, and once the configuration names where it is now (its
/// partner took it over, say) its pool fills there, while the OST that did not move
/// keeps the tasks it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ost_that_does_not_answer_holds_up_none_of_the_others_and_is_served_where_it_moves() {
    let net = MemNetwork::new();
    let mut servers = Vec::new();
    for name in ["oss0@mem", "oss1b@mem"] {
        let oss = Oss::new(vec![ost(servers.len())], OssConfig::default()).unwrap();
        let t = Arc::new(net.transport(name));
        servers.push(Server::start(t, &name.parse().unwrap(), oss.handler(), ServerConfig::default()).await.unwrap());
    }
    let mdt = vol("mdt", Level::Raid10, 4, 32 << 20, 64 << 10);
    let ns = Arc::new(Namespace::format(mdt, 0, NamespaceOptions::default()).unwrap());
    let client = Client::new(Arc::new(net.transport("mds")), ClientConfig::default());
    let mut svc = ObjectService::new(ns.clone(), 64);
    let level = |ns: &Namespace, ost: u32| ns.pool_levels().into_iter().find(|(o, _)| *o == ost).map(|(_, n)| n);
    // OST 1 is listed where nothing serves it.
    let gone = (1, vec!["oss1@mem".parse().unwrap()]);
    svc.follow(&client, "nacre", &[(0, vec![servers[0].nid()]), gone.clone()]);
    wait_for("OST 0's pool to fill", || level(&ns, 0).is_some_and(|n| n >= 32)).await;
    assert_eq!(level(&ns, 1), None, "OST 1 attached without answering");
    // The same configuration again, or with only OST 1 moved, leaves OST 0's tasks be:
    // its pool stays full without a precreate of its own objects over again.
    svc.follow(&client, "nacre", &[(0, vec![servers[0].nid()]), gone]);
    let before = servers[0].stats();
    svc.follow(&client, "nacre", &[(0, vec![servers[0].nid()]), (1, vec![servers[1].nid()])]);
    wait_for("OST 1's pool to fill where it moved", || level(&ns, 1).is_some_and(|n| n >= 32)).await;
    let after = servers[0].stats();
    // A restarted task would have asked OST 0 its last id again.
    assert_eq!(after.requests, before.requests, "OST 0 was asked again: its tasks restarted");
    // A file striped over both takes an object on each.
    let ns2 = ns.clone();
    let f = tokio::task::spawn_blocking(move || {
        ns2.create_with_layout(&Cred::root(), Fid::ROOT, "f", 0o644, lfs("-c -1"), None).unwrap()
    })
    .await
    .unwrap();
    let osts: Vec<u32> = ns.objects(f.fid).unwrap().into_iter().flatten().map(|(o, _)| o).collect();
    assert_eq!(osts.len(), 2, "{osts:?}");
    // Dropped from the configuration: let go.
    svc.follow(&client, "nacre", &[(1, vec![servers[1].nid()])]);
    drop(svc);
}
