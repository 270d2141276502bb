//! The MDS end to end: operations over the in-memory transport with credentials, errors
//! as negative errnos with their message, a lost reply answered once, and a change resent
//! after a restart of the MDS answered from its stored reply.

use std::sync::Arc;

use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::frame::FrameHeader;
use nacre_net::server::{Incoming, Server, ServerConfig};
use nacre_net::transport::MemNetwork;
use nacre_proto::fid::Fid;
use nacre_proto::mdt::{self, Attr, Creds, Reply, Request, errno, lock, mode, set};
use nacre_server::mds::Mds;
use nacre_server::mdt::{Namespace, NamespaceOptions};

use crate::mdt_volume as volume;

struct Md {
    imp: Arc<Import>,
    creds: Creds,
}

impl Md {
    async fn call(&self, r: Request) -> Result<Reply, (i32, String)> {
        let (op, body) = r.encode(&self.creds);
        let f = self.imp.call(op, &body, &[]).await.map_err(|e| (0, e.to_string()))?;
        if f.header.status != 0 {
            return Err((f.header.status, String::from_utf8_lossy(&f.body).into_owned()));
        }
        Ok(Reply::decode(&f.body).unwrap())
    }

    async fn attr(&self, r: Request) -> Result<Attr, (i32, String)> {
        match self.call(r).await? {
            Reply::Attr(a) | Reply::Writing(a) | Reply::Opened { attr: a, .. } => Ok(a),
            other => panic!("not attributes: {other:?}"),
        }
    }
}

async fn setup() -> (Server, Arc<Mds>, MemNetwork, Md) {
    setup_with(ServerConfig::default()).await
}

async fn setup_with(cfg: ServerConfig) -> (Server, Arc<Mds>, MemNetwork, Md) {
    let net = MemNetwork::new();
    let ns = Arc::new(Namespace::format(volume(), 0, NamespaceOptions::default()).unwrap());
    let mds = Mds::new("mdt0", ns);
    let server = Server::start_service(
        Arc::new(net.transport("mds0")),
        &"mds0@mem".parse().unwrap(),
        mds.handler(),
        cfg,
        mds.service(),
    )
    .await
    .unwrap();
    mds.follow_evictions(server.handle());
    let imp = Client::new(Arc::new(net.transport("c0")), ClientConfig::default()).connect(&server.nid()).await.unwrap();
    (server, mds, net, Md { imp, creds: Creds::default() })
}

/// Locks over the wire: bad requests refused by name and changing nothing, and waits
/// that hold no service slot (with one slot, a change goes through while three lock
/// requests wait), woken when the lock goes, and ended by the holder's eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_requests_are_checked_and_waits_hold_no_service_slot() {
    let (server, mds, net, a) = setup_with(ServerConfig { threads_max: 1, ..ServerConfig::default() }).await;
    let b = Md {
        imp: Client::new(Arc::new(net.transport("c1")), ClientConfig::default()).connect(&server.nid()).await.unwrap(),
        creds: Creds::default(),
    };
    let create = |name: &str| Request::CreateOpen {
        dir: Fid::ROOT,
        name: name.into(),
        perms: 0o644,
        layout: vec![],
        read: true,
        write: true,
    };
    let opened = |r: Reply| match r {
        Reply::Opened { handle, attr, .. } => (handle, attr.fid),
        other => panic!("not opened: {other:?}"),
    };
    // A create-open's reply brings its directory as the create left it.
    let Reply::Attr(root) = a.call(Request::Getattr { fid: Fid::ROOT }).await.unwrap() else { panic!("no root") };
    match a.call(create("first")).await.unwrap() {
        Reply::Opened { dir: Some(d), .. } => {
            assert_eq!(d.fid, Fid::ROOT);
            assert!(d.mtime_ns > root.mtime_ns, "the directory as the create left it: {d:?} after {root:?}");
        }
        other => panic!("no directory in {other:?}"),
    }
    let (ha, f) = opened(a.call(create("f")).await.unwrap());
    let (hg, g) = opened(a.call(create("g")).await.unwrap());
    let (hb, _) = opened(b.call(Request::Open { fid: f, read: true, write: true, dom_read: 0 }).await.unwrap());
    let lk = |fid, handle, owner, kind, flags, start, end| Request::Lock {
        fid,
        handle,
        owner,
        pid: owner as u32,
        kind,
        flags,
        start,
        end,
    };
    // Bad requests: a handle not this client's or not of this file, a range that ends
    // before it starts, a test for an unlock, an unknown kind (malformed).
    for (r, errno_, what) in [
        (lk(f, hb, 1, lock::WRITE, 0, 0, 9), -errno::EBADF, "not this client's open"),
        (lk(f, hg, 1, lock::WRITE, 0, 0, 9), -errno::EBADF, "not this client's open"),
        (lk(f, ha, 1, lock::WRITE, 0, 9, 0), -errno::EINVAL, "ends (0) before it starts (9)"),
        (lk(f, ha, 1, lock::UNLOCK, lock::TEST, 0, 9), -errno::EINVAL, "not an unlock"),
        (lk(f, ha, 1, lock::WRITE, lock::CACHE | lock::TEST, 0, 9), -errno::EINVAL, "only a read or write lock taken"),
        (lk(f, ha, 1, lock::UNLOCK, lock::CACHE, 0, 9), -errno::EINVAL, "only a read or write lock taken"),
        (lk(f, ha, 1, lock::READ, lock::CACHE | lock::APPEND, 0, 9), -errno::EINVAL, "of the appends: a write lock"),
    ] {
        let e = a.call(r).await.unwrap_err();
        assert_eq!(e.0, errno_, "{}", e.1);
        assert!(e.1.contains(what), "{}", e.1);
    }
    let (op, mut body) = lk(f, ha, 1, lock::WRITE, 0, 0, 9).encode(&a.creds);
    let at = body.len() - 18;
    body[at] = 9;
    let f2 = a.imp.call(op, &body, &[]).await.unwrap();
    assert_eq!(f2.header.status, -71);
    assert!(String::from_utf8_lossy(&f2.body).contains("lock kind 9"));
    assert_eq!(mds.get_param("mdt.mdt0.locks")[0].1.lines().next(), Some("held 0"), "nothing was taken");
    // a holds bytes 0..=99; three waits of b's owners wait for it, holding no slot.
    a.call(lk(f, ha, 1, lock::WRITE, 0, 0, 99)).await.unwrap();
    let e = b.call(lk(f, hb, 2, lock::READ, 0, 50, 50)).await.unwrap_err();
    assert_eq!(e.0, -errno::EAGAIN);
    let b = Arc::new(b);
    let waits: Vec<_> = (0..3u64)
        .map(|i| {
            let b = b.clone();
            tokio::spawn(async move { b.call(lk(f, hb, 10 + i, lock::READ, lock::WAIT, i, i)).await })
        })
        .collect();
    while !mds.get_param("mdt.mdt0.locks")[0].1.contains("waiting 3") {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let made = a.attr(Request::create(Fid::ROOT, "made", mode::S_IFREG));
    let made = tokio::time::timeout(std::time::Duration::from_secs(20), made).await;
    made.expect("a change goes through its one service slot while lock requests wait").unwrap();
    let test = a.call(lk(f, ha, 1, lock::WRITE, lock::TEST, 0, 0)).await.unwrap();
    assert_eq!(test, Reply::Lock { kind: lock::UNLOCK, start: 0, end: 0, pid: 0 }, "its own lock is no conflict");
    let test = b.call(lk(f, hb, 2, lock::WRITE, lock::TEST, 0, 0)).await.unwrap();
    assert_eq!(test, Reply::Lock { kind: lock::WRITE, start: 0, end: 99, pid: 1 });
    // The holder's unlock wakes all three readers.
    a.call(Request::Unlock { fid: f, owner: 1 }).await.unwrap();
    for w in waits {
        assert_eq!(w.await.unwrap(), Ok(Reply::Done));
    }
    // A wait on a lock whose holder is evicted ends with the eviction.
    a.call(lk(g, hg, 1, lock::WRITE, 0, 0, 0)).await.unwrap();
    let (hb2, _) = opened(b.call(Request::Open { fid: g, read: true, write: true, dom_read: 0 }).await.unwrap());
    let wait = {
        let b = b.clone();
        tokio::spawn(async move { b.call(lk(g, hb2, 20, lock::WRITE, lock::WAIT, 0, 0)).await })
    };
    while !mds.get_param("mdt.mdt0.locks")[0].1.contains("waiting 1") {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let exports = mds.get_param("mdt.mdt0.exports")[0].1.clone();
    let holder = exports.lines().find(|l| l.contains("locks=1")).and_then(|l| l.split(' ').next()).unwrap();
    mds.set_param("mdt.mdt0.evict_client", holder).unwrap();
    assert_eq!(wait.await.unwrap(), Ok(Reply::Done));
    let locks = mds.get_param("mdt.mdt0.locks")[0].1.clone();
    assert!(locks.contains("evicted 1") && locks.contains("held 4"), "{locks}");
    assert!(mds.set_param("mdt.mdt0.evict_client", "nothex").unwrap_err().contains("a client id in hex"));
    assert!(mds.set_param("mdt.mdt0.evict_client", "1").unwrap_err().contains("no such client"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_through_the_service() {
    let (_s, mds, _n, md) = setup().await;
    let root = Fid::ROOT;
    let d = md.attr(Request::create(root, "d", mode::S_IFDIR | 0o755)).await.unwrap();
    assert!(mode::is_dir(d.mode));
    for i in 0..50 {
        md.attr(Request::Create {
            dir: d.fid,
            name: format!("f{i}"),
            mode: mode::S_IFREG | 0o644,
            target: vec![],
            layout: vec![],
            rdev: 0,
        })
        .await
        .unwrap();
    }
    // Readdir in pages, resumed by cookie.
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let Reply::Entries { entries, eof } = md.call(Request::Readdir { dir: d.fid, cookie, max: 7 }).await.unwrap()
        else {
            panic!("not entries")
        };
        for (e, a) in &entries {
            assert_eq!(e.fid, a.fid);
            names.push(e.name.clone());
            cookie = e.cookie;
        }
        if eof {
            break;
        }
    }
    names.sort();
    let mut want: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names, want);
    let f = md.attr(Request::Lookup { dir: d.fid, name: "f7".into() }).await.unwrap();
    // Errors come back as negative errnos with a message that names the problem.
    let e = md.attr(Request::create(d.fid, "f7", mode::S_IFREG | 0o644)).await.unwrap_err();
    assert_eq!(e.0, -errno::EEXIST);
    assert!(e.1.contains("\"f7\" exists"), "{}", e.1);
    let e = md.call(Request::Unlink { dir: root, name: "d".into(), rmdir: true }).await.unwrap_err();
    assert_eq!(e.0, -errno::ENOTEMPTY);
    // Setattr by mask; "now" times; truncate.
    let s =
        mdt::SetAttr { mask: set::MODE | set::SIZE | set::MTIME_NOW, mode: 0o600, size: 1 << 33, ..Default::default() };
    let a = md.attr(Request::Setattr { fid: f.fid, set: s }).await.unwrap();
    assert_eq!((a.mode, a.size), (mode::S_IFREG | 0o600, 1 << 33));
    // Another user: denied by the new mode.
    let bob = Md { imp: md.imp.clone(), creds: Creds { uid: 1001, gid: 1001, ..Creds::default() } };
    let e = bob.call(Request::Open { fid: f.fid, read: true, write: false, dom_read: 0 }).await.unwrap_err();
    assert_eq!(e.0, -errno::EACCES);
    // Symlinks, xattrs, rename, open/close, statfs.
    let l = md
        .attr(Request::Create {
            dir: root,
            name: "l".into(),
            mode: mode::S_IFLNK | 0o777,
            target: b"d/f7".to_vec(),
            layout: vec![],
            rdev: 0,
        })
        .await
        .unwrap();
    assert_eq!(md.call(Request::Readlink { fid: l.fid }).await.unwrap(), Reply::Bytes(b"d/f7".to_vec()));
    md.call(Request::Setxattr { fid: f.fid, name: "user.k".into(), value: b"v".to_vec(), flags: 0 }).await.unwrap();
    assert_eq!(
        md.call(Request::Getxattr { fid: f.fid, name: "user.k".into() }).await.unwrap(),
        Reply::Bytes(b"v".to_vec())
    );
    assert_eq!(md.call(Request::Listxattr { fid: f.fid }).await.unwrap(), Reply::Names(vec!["user.k".into()]));
    md.call(Request::Rename {
        src_dir: d.fid,
        src_name: "f7".into(),
        dst_dir: root,
        dst_name: "g".into(),
        noreplace: true,
    })
    .await
    .unwrap();
    assert!(matches!(md.call(Request::Getattr { fid: f.fid }).await.unwrap(), Reply::Attr(_)));
    let Reply::Opened { handle: reader, .. } =
        md.call(Request::Open { fid: f.fid, read: true, write: false, dom_read: 0 }).await.unwrap()
    else {
        panic!("not opened")
    };
    assert!(matches!(md.call(Request::Getattr { fid: f.fid }).await.unwrap(), Reply::Attr(_)), "only read");
    let Reply::Opened { handle, .. } =
        md.call(Request::Open { fid: f.fid, read: true, write: true, dom_read: 0 }).await.unwrap()
    else {
        panic!("not opened")
    };
    // Open for writing: getattr and lookup say so (the size is the objects').
    assert!(matches!(md.call(Request::Getattr { fid: f.fid }).await.unwrap(), Reply::Writing(_)));
    assert!(matches!(
        md.call(Request::Lookup { dir: root, name: "g".into() }).await.unwrap(),
        Reply::Writing(a) if a.fid == f.fid
    ));
    // A truncate through a handle needs it open for writing by this client, on this file:
    // a read-only or unknown handle is EBADF and changes nothing.
    let size_before = md.attr(Request::Getattr { fid: f.fid }).await.unwrap().size;
    let by = |h: u64| mdt::SetAttr { mask: set::SIZE | set::BY_HANDLE, size: 5, handle: h, ..Default::default() };
    for h in [reader, 0xdead] {
        let e = md.call(Request::Setattr { fid: f.fid, set: by(h) }).await.unwrap_err();
        assert!(e.0 == -errno::EBADF && e.1.contains("not open for writing"), "{e:?}");
    }
    assert_eq!(md.attr(Request::Getattr { fid: f.fid }).await.unwrap().size, size_before);
    assert_eq!(md.attr(Request::Setattr { fid: f.fid, set: by(handle) }).await.unwrap().size, 5);
    // A writer publishing the size its objects hold: the size grows to it, never shrinks.
    let at_least = |size: u64, h: u64| mdt::SetAttr {
        mask: set::SIZE_AT_LEAST | set::BY_HANDLE,
        size,
        handle: h,
        ..Default::default()
    };
    assert_eq!(md.attr(Request::Setattr { fid: f.fid, set: at_least(3, handle) }).await.unwrap().size, 5);
    assert_eq!(md.attr(Request::Setattr { fid: f.fid, set: at_least(9, handle) }).await.unwrap().size, 9);
    let e = md.call(Request::Setattr { fid: f.fid, set: at_least(20, reader) }).await.unwrap_err();
    assert_eq!(e.0, -errno::EBADF, "{e:?}");
    assert_eq!(md.attr(Request::Setattr { fid: f.fid, set: by(handle) }).await.unwrap().size, 5);
    md.call(Request::Close { handle: reader }).await.unwrap();
    md.call(Request::Unlink { dir: root, name: "g".into(), rmdir: false }).await.unwrap();
    assert_eq!(md.attr(Request::Getattr { fid: f.fid }).await.unwrap().nlink, 0, "open: still there");
    md.call(Request::Close { handle }).await.unwrap();
    assert_eq!(md.attr(Request::Getattr { fid: f.fid }).await.unwrap_err().0, -errno::ENOENT);
    // Layouts: a directory default through the service, inherited by a new file; a bad
    // one refused with the rule it breaks.
    let lfs = |a: &str| nacre_proto::layout::Layout::from_lfs_args(&a.split_whitespace().collect::<Vec<_>>()).unwrap();
    md.call(Request::Setdirlayout { dir: d.fid, layout: lfs("-c 4 -S 2M").encode() }).await.unwrap();
    let nf = md.attr(Request::create(d.fid, "striped", mode::S_IFREG | 0o644)).await.unwrap();
    let Reply::Layout { layout: b, objects } = md.call(Request::Getlayout { fid: nf.fid }).await.unwrap() else {
        panic!()
    };
    assert!(objects.is_empty(), "no OSTs attached: no objects");
    assert_eq!(nacre_proto::layout::Layout::decode(&b).unwrap(), lfs("-c 4 -S 2M"));
    // An open's reply carries the layout too (no fetch before the first IO); a
    // directory's open carries none.
    let Reply::Opened { handle, layout, objects: o, .. } =
        md.call(Request::Open { fid: nf.fid, read: true, write: false, dom_read: 0 }).await.unwrap()
    else {
        panic!("not opened")
    };
    assert_eq!((layout, o), (b.clone(), objects.clone()));
    md.call(Request::Close { handle }).await.unwrap();
    let Reply::Opened { handle, layout, objects: o, .. } =
        md.call(Request::Open { fid: d.fid, read: true, write: false, dom_read: 0 }).await.unwrap()
    else {
        panic!("not opened")
    };
    assert!(layout.is_empty() && o.is_empty(), "a directory has a default, not a file layout");
    md.call(Request::Close { handle }).await.unwrap();
    let e = md
        .call(Request::Create {
            dir: d.fid,
            name: "bad".into(),
            mode: mode::S_IFREG,
            target: vec![],
            layout: vec![9],
            rdev: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.0, -errno::EINVAL);
    // Special files over the wire: a device node keeps its number; a device number on
    // anything else, or an unknown file type, is refused and makes nothing.
    let create = |name: &str, mode: u32, rdev: u32| Request::Create {
        dir: d.fid,
        name: name.into(),
        mode,
        target: vec![],
        layout: vec![],
        rdev,
    };
    let chr = md.attr(create("null", mode::S_IFCHR | 0o666, 0x103)).await.unwrap();
    assert_eq!((chr.mode, chr.rdev), (mode::S_IFCHR | 0o666, 0x103));
    assert_eq!(md.attr(Request::Getattr { fid: chr.fid }).await.unwrap().rdev, 0x103);
    let fifo = md.attr(create("fifo", mode::S_IFIFO | 0o600, 0)).await.unwrap();
    assert_eq!((fifo.mode, fifo.rdev), (mode::S_IFIFO | 0o600, 0));
    for (name, m, rdev) in [("r", mode::S_IFREG | 0o644, 7), ("p", mode::S_IFIFO, 7), ("u", 0o170000 | 0o644, 0)] {
        let e = md.call(create(name, m, rdev)).await.unwrap_err();
        assert_eq!(e.0, -errno::EINVAL, "{m:o} {rdev}: {}", e.1);
        let gone = md.call(Request::Lookup { dir: d.fid, name: name.into() }).await.unwrap_err();
        assert_eq!(gone.0, -errno::ENOENT);
    }
    for name in ["null", "fifo"] {
        md.call(Request::Unlink { dir: d.fid, name: name.into(), rmdir: false }).await.unwrap();
    }
    md.call(Request::Unlink { dir: d.fid, name: "striped".into(), rmdir: false }).await.unwrap();
    // A listing of long names comes in pages that each fit one reply.
    let long = md.attr(Request::create(root, "long", mode::S_IFDIR | 0o755)).await.unwrap();
    for i in 0..400 {
        let name = format!("{i:03}{}", "n".repeat(250));
        md.attr(Request::Create {
            dir: long.fid,
            name,
            mode: mode::S_IFREG | 0o644,
            target: vec![],
            layout: vec![],
            rdev: 0,
        })
        .await
        .unwrap();
    }
    let (mut cookie, mut listed, mut pages) = (0, 0, 0);
    loop {
        let Reply::Entries { entries, eof } =
            md.call(Request::Readdir { dir: long.fid, cookie, max: 1024 }).await.unwrap()
        else {
            panic!("not entries")
        };
        listed += entries.len();
        pages += 1;
        cookie = entries.last().map_or(cookie, |(e, _)| e.cookie);
        if eof {
            break;
        }
    }
    assert_eq!(listed, 400);
    assert!(pages > 1, "400 entries of 253-byte names cannot fit one 64 KiB reply");
    // Data on the MDT: a 3,901-byte file written and read back through the service.
    md.call(Request::Setdirlayout { dir: d.fid, layout: lfs("-E 64K -L mdt -E eof -c 1").encode() }).await.unwrap();
    let small = md.attr(Request::create(d.fid, "dom", mode::S_IFREG | 0o644)).await.unwrap();
    let body: Vec<u8> = (0..3901u32).map(|i| (i % 253) as u8).collect();
    let (op, req) = Request::DomWrite { fid: small.fid, offset: 0, handle: 0 }.encode(&md.creds);
    let f = md.imp.call(op, &req, &body).await.unwrap();
    assert_eq!(f.header.status, 0, "{}", String::from_utf8_lossy(&f.body));
    let (op, req) = Request::DomRead { fid: small.fid, offset: 0, len: 65536 }.encode(&md.creds);
    let f = md.imp.call(op, &req, &[]).await.unwrap();
    assert_eq!(f.header.status, 0);
    assert_eq!(f.bulk.into_vec(), body);
    let (op, req) = Request::DomWrite { fid: small.fid, offset: 65535, handle: 0 }.encode(&md.creds);
    assert_eq!(md.imp.call(op, &req, b"xy").await.unwrap().header.status, -errno::EFBIG);
    md.call(Request::Unlink { dir: d.fid, name: "dom".into(), rmdir: false }).await.unwrap();
    let Reply::StatFs { inodes, bytes_total, .. } = md.call(Request::Statfs).await.unwrap() else { panic!() };
    assert_eq!(inodes, 1 + 1 + 49 + 1 + 401);
    assert!(bytes_total > 0);
    // Bad input: a malformed body is refused with the reason.
    let f2 = md.imp.call(mdt::MDS_LOOKUP, &[1, 2, 3], &[]).await.unwrap();
    assert_eq!(f2.header.status, -71);
    assert!(String::from_utf8_lossy(&f2.body).contains("bad MDS request"));
    let p = mds.get_param("mdt.mdt0.md_stats");
    assert!(p[0].1.contains("create 462") && p[0].1.contains("setdirlayout 2"), "{p:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mdt_knobs_are_read_and_set_over_the_wire() {
    let (_server, mds, _n, md) = setup().await;
    let get = |leaf: &str| mds.get_param(&format!("mdt.mdt0.{leaf}"))[0].1.clone();
    assert_eq!(get("sync_on_reply"), "0", "replies before commit by default");
    // A client's first change is committed before its reply all the same.
    md.call(Request::create(Fid::ROOT, "f", mode::S_IFREG | 0o644)).await.unwrap();
    let commits = get("commits");
    let last =
        |what: &str| -> u64 { commits.lines().find_map(|l| l.strip_prefix(what)).unwrap().trim().parse().unwrap() };
    assert!(last("last_transno") >= 1 && last("last_committed") == last("last_transno"), "{commits}");
    assert!(get("memory").contains("inodes 2"), "{}", get("memory"));
    // Set through the transport, as `nacre set-param` does.
    let set = |name: &str, value: &str| {
        let body = nacre_proto::param::encode_set(name, value);
        let imp = md.imp.clone();
        async move {
            let f = imp.call(nacre_proto::param::OP_SET_PARAM, &body, &[]).await.unwrap();
            (f.header.status, String::from_utf8_lossy(&f.body).into_owned())
        }
    };
    assert_eq!(set("mdt.mdt0.sync_on_reply", "1").await.0, 0);
    assert_eq!(get("sync_on_reply"), "1");
    md.call(Request::create(Fid::ROOT, "g", mode::S_IFREG | 0o644)).await.unwrap();
    // Bad values are refused by name and change nothing.
    let (status, why) = set("mdt.mdt0.sync_on_reply", "maybe").await;
    assert!(status == -errno::EINVAL && why.contains("0 or 1"), "{status} {why}");
    assert_eq!(get("sync_on_reply"), "1");
    let (status, why) = set("mdt.mdt0.memory_max", "12").await;
    assert!(status == -errno::EINVAL && why.contains("at least"), "{why}");
    assert_eq!(get("commit_interval_ms"), "5");
    assert_eq!(set("mdt.mdt0.commit_interval_ms", "20").await.0, 0);
    assert_eq!(get("commit_interval_ms"), "20");
    let (status, why) = set("mdt.mdt0.commit_interval_ms", "0").await;
    assert!(status == -errno::EINVAL && why.contains("from 1"), "{why}");
    assert_eq!(get("commit_interval_ms"), "20");
    let (status, why) = set("mdt.mdt0.nonsense", "1").await;
    assert!(status == -errno::EINVAL && why.contains("nonsense"), "{why}");
    // A limit below what the MDT holds stops new files, with ENOSPC naming it.
    assert_eq!(set("mdt.mdt0.memory_max", "1048576").await.0, 0);
    assert_eq!(get("memory_max"), "1048576");
    mds.namespace().set_memory_max(100);
    let e = md.call(Request::create(Fid::ROOT, "h", mode::S_IFREG | 0o644)).await.unwrap_err();
    assert!(e.0 == -errno::ENOSPC && e.1.contains("memory_max"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_creates_once() {
    let (server, _mds, _n, md) = setup().await;
    server.faults().add(&format!("drop opcode={} count=1", mdt::MDS_CREATE)).unwrap();
    let imp = md.imp.clone();
    let (op, body) = Request::create(Fid::ROOT, "once", mode::S_IFREG | 0o644).encode(&Creds::default());
    // The client resends after its deadline; the answer is the first one, not EEXIST.
    let f = tokio::time::timeout(std::time::Duration::from_secs(120), imp.call(op, &body, &[])).await.unwrap().unwrap();
    assert_eq!(f.header.status, 0, "{}", String::from_utf8_lossy(&f.body));
}

fn incoming(client: u64, xid: u64, acked: u64, r: &Request) -> Incoming {
    let (opcode, body) = r.encode(&Creds::default());
    Incoming {
        header: FrameHeader { opcode, xid, acked_xid: acked, ..FrameHeader::default() },
        body,
        bulk: Vec::new().into(),
        peer: "c0@mem".parse().unwrap(),
        client,
        replayed: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_resent_after_a_restart_gets_its_stored_answer() {
    let v = volume();
    let ns = Arc::new(Namespace::format(v.clone(), 0, NamespaceOptions::default()).unwrap());
    let mds = Mds::new("mdt0", ns);
    let create = Request::create(Fid::ROOT, "f", mode::S_IFREG | 0o644);
    let first = mds.serve(incoming(42, 5, 5, &create)).await;
    assert_eq!(first.status, 0);
    let rename = Request::Rename {
        src_dir: Fid::ROOT,
        src_name: "f".into(),
        dst_dir: Fid::ROOT,
        dst_name: "g".into(),
        noreplace: false,
    };
    // Sent while the first reply was still missing: xid 5 is not acknowledged.
    assert_eq!(mds.serve(incoming(42, 6, 5, &rename)).await.status, 0);
    drop(mds);
    // The MDS restarts on the same volume; the client never saw the two replies.
    let ns = Arc::new(Namespace::open(v, NamespaceOptions::default()).unwrap());
    let mds = Mds::new("mdt0", ns);
    let again = mds.serve(incoming(42, 5, 5, &create)).await;
    assert_eq!((again.status, again.body), (0, first.body));
    assert_eq!(mds.serve(incoming(42, 6, 5, &rename)).await.status, 0, "the rename is not run again (no ENOENT)");
    // Another client's identical request is a new request.
    let other = mds.serve(incoming(43, 5, 5, &create)).await;
    assert_eq!(other.status, 0, "f is free again after the rename");
    let e = mds.serve(incoming(43, 6, 6, &create)).await;
    assert_eq!(e.status, -errno::EEXIST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_client_loses_its_open_files_and_reply_records() {
    let (server, mds, net, _md) = setup().await;
    mds.follow_evictions(server.handle());
    let client = Client::new(Arc::new(net.transport("c9")), ClientConfig::default());
    let md = Md { imp: client.connect(&server.nid()).await.unwrap(), creds: Creds::default() };
    let f = md.attr(Request::create(Fid::ROOT, "held", mode::S_IFREG | 0o644)).await.unwrap();
    md.call(Request::Open { fid: f.fid, read: true, write: true, dom_read: 0 }).await.unwrap();
    md.call(Request::Unlink { dir: Fid::ROOT, name: "held".into(), rmdir: false }).await.unwrap();
    let ns = mds.namespace().clone();
    assert_eq!(ns.getattr(f.fid).unwrap().nlink, 0, "open: it lives on");
    assert!(ns.reply_records(client.id()).unwrap() > 0);
    assert!(server.evict(client.id()));
    let started = std::time::Instant::now();
    while ns.getattr(f.fid).is_ok() || ns.reply_records(client.id()).unwrap() > 0 {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "the evicted client's state stayed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A request's reply and whether it grants a lease.
async fn leased(md: &Md, r: Request) -> (i32, bool) {
    let (op, body) = r.encode(&md.creds);
    let f = md.imp.call(op, &body, &[]).await.unwrap();
    (f.header.status, f.header.flags & nacre_net::frame::flags::LEASED != 0)
}

/// One poll of a client's callback channel, acknowledging `acked`.
async fn poll(md: &Md, acked: u64) -> Result<Vec<(u64, mdt::lease::Key)>, (i32, String)> {
    match md.call(Request::Leases { acked }).await? {
        Reply::Revoked(v) => Ok(v),
        other => panic!("not revocations: {other:?}"),
    }
}

/// Leases over the wire: granted only to clients that listen for callbacks, revoked from
/// them by another client's change (which waits for the acknowledgement), by an open for
/// writing, and on a missing name when it is made; an acknowledgement of a revocation
/// never sent refused, changing nothing; a holder that never acknowledges evicted after
/// the callback timeout, and the change it held up answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_revoked_before_a_change_answers_and_a_silent_holder_is_evicted() {
    use mdt::lease::Key;
    use std::time::Duration;
    let (server, mds, net, a) = setup().await;
    mds.set_param("mdt.mdt0.lease_contended_ms", "0").unwrap();
    mds.set_param("mdt.mdt0.lease_callback_timeout_ms", "500").unwrap();
    let connect = |name: &'static str| {
        let (net, nid) = (net.clone(), server.nid());
        async move {
            let client = Client::new(Arc::new(net.transport(name)), ClientConfig::default());
            let imp = client.connect(&nid).await.unwrap();
            (Arc::new(Md { imp, creds: Creds::default() }), client.id())
        }
    };
    let ((b, _), (c, c_id)) = (connect("c1").await, connect("c2").await);
    let f = a.attr(Request::create(Fid::ROOT, "f", mode::S_IFREG | 0o644));
    let f = f.await.unwrap().fid;
    let getattr = Request::Getattr { fid: f };
    assert_eq!(leased(&b, getattr.clone()).await, (0, false), "b does not listen yet");
    // b listens: its first poll waits for a revocation.
    let first = tokio::spawn({
        let b = b.clone();
        async move { poll(&b, 0).await }
    });
    while !mds.get_param("mdt.mdt0.leases")[0].1.contains("clients 1") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(leased(&b, getattr.clone()).await, (0, true));
    // a's chmod revokes b's lease, and is answered only once b has acknowledged it.
    let chmod =
        |m: u32| Request::Setattr { fid: f, set: mdt::SetAttr { mask: set::MODE, mode: m, ..Default::default() } };
    let change = tokio::spawn({
        let imp = a.imp.clone();
        let (op, body) = chmod(0o600).encode(&Creds::default());
        async move { imp.call(op, &body, &[]).await.unwrap().header.status }
    });
    assert_eq!(first.await.unwrap().unwrap(), vec![(1, Key::Attr(f))]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!change.is_finished(), "the chmod waits for b to give its lease up");
    // A poll that acknowledges a revocation never sent is refused, and changes nothing.
    let e = poll(&b, 7).await.unwrap_err();
    assert_eq!(e.0, -errno::EINVAL);
    assert!(e.1.contains("acknowledges revocation 7, but only 1 were sent"), "{}", e.1);
    assert!(!change.is_finished());
    let next = tokio::spawn({
        let b = b.clone();
        async move { poll(&b, 1).await }
    });
    assert_eq!(change.await.unwrap(), 0);
    // Granted again, then taken by a's open for writing.
    assert_eq!(leased(&b, getattr.clone()).await, (0, true));
    let open = tokio::spawn({
        let imp = a.imp.clone();
        let (op, body) = Request::Open { fid: f, read: false, write: true, dom_read: 0 }.encode(&Creds::default());
        async move { imp.call(op, &body, &[]).await.unwrap().header.status }
    });
    assert_eq!(next.await.unwrap().unwrap(), vec![(2, Key::Attr(f))]);
    let next = tokio::spawn({
        let b = b.clone();
        async move { poll(&b, 2).await }
    });
    assert_eq!(open.await.unwrap(), 0);
    assert_eq!(leased(&b, getattr.clone()).await, (0, false), "no attribute lease while a writes it");
    // A missing name is leased; making it revokes the lease.
    assert_eq!(leased(&b, Request::Lookup { dir: Fid::ROOT, name: "g".into() }).await, (-errno::ENOENT, true));
    let create = tokio::spawn({
        let imp = a.imp.clone();
        let r = Request::create(Fid::ROOT, "g", mode::S_IFREG | 0o644);
        let (op, body) = r.encode(&Creds::default());
        async move { imp.call(op, &body, &[]).await.unwrap().header.status }
    });
    let v = next.await.unwrap().unwrap();
    assert_eq!(v, vec![(3, Key::Name(Fid::ROOT, "g".into()))]);
    let _listening = tokio::spawn({
        let b = b.clone();
        async move { poll(&b, 3).await }
    });
    assert_eq!(create.await.unwrap(), 0);
    // c listens, takes a lease and never acknowledges its revocation: a's change waits
    // the callback timeout, then c is evicted and the change answered.
    let g = a.attr(Request::Lookup { dir: Fid::ROOT, name: "g".into() }).await.unwrap().fid;
    let silent = tokio::spawn({
        let c = c.clone();
        async move { poll(&c, 0).await }
    });
    while !mds.get_param("mdt.mdt0.leases")[0].1.contains("clients 2") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(leased(&c, Request::Getattr { fid: g }).await, (0, true));
    let t = std::time::Instant::now();
    let chmod_g = Request::Setattr { fid: g, set: mdt::SetAttr { mask: set::MODE, mode: 0o600, ..Default::default() } };
    a.attr(chmod_g).await.unwrap();
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(500) && waited < Duration::from_secs(5), "waited {waited:?}");
    let leases = mds.get_param("mdt.mdt0.leases")[0].1.clone();
    assert!(leases.contains("callback_timeouts 1") && leases.contains("clients 1"), "{leases}");
    assert!(!server.handle().connected(c_id), "the silent client is evicted");
    silent.abort();
}
