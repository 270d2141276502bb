//! The OSS end to end over the in-memory transport: every operation, checksums both ways,
//! every refusal with its errno and message and nothing changed, and concurrent writers
//! to one object (IO500 ior-hard's pattern) all landing.

use std::sync::Arc;

use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::server::{Server, ServerConfig};
use nacre_net::transport::MemNetwork;
use nacre_osd::{Target, TargetOptions};
use nacre_proto::ost::{self, Attr, Niobuf, Request, SetAttr, set};
use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, Volume, VolumeOptions};
use nacre_server::oss::{Oss, OssConfig, errno};

fn crc32c(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b) as u32
}

/// A write of one extent.
fn write_req(oid: u64, offset: u64, len: u32, crc: Option<u32>) -> Request {
    Request::Write { target: 0, oid, niobufs: vec![Niobuf { offset, len, crc }] }
}

fn target(data_drive_bytes: u64) -> Arc<Target> {
    target_with_data(data_drive_bytes).0
}

/// A thin OST client for the tests: encode, call, decode, check the read checksum.
struct Ost {
    imp: Arc<Import>,
    checksums: bool,
}

type Fail = (i32, String);

impl Ost {
    async fn call(&self, r: Request, bulk: &[u8]) -> Result<nacre_net::frame::Frame, Fail> {
        let (op, body) = r.encode();
        let f = self.imp.call(op, &body, bulk).await.map_err(|e| (errno::EIO, e.to_string()))?;
        if f.header.status != 0 {
            return Err((f.header.status, String::from_utf8_lossy(&f.body).into_owned()));
        }
        Ok(f)
    }

    async fn create(&self, count: u32) -> Result<(u64, u32), Fail> {
        let f = self.call(Request::Create { target: 0, count, group: 0 }, &[]).await?;
        Ok(ost::decode_created(&f.body).unwrap())
    }

    async fn write(&self, oid: u64, offset: u64, data: &[u8]) -> Result<Attr, Fail> {
        let crc = self.checksums.then(|| crc32c(data));
        let f = self.call(write_req(oid, offset, data.len() as u32, crc), data).await?;
        Ok(ost::decode_attr(&f.body).unwrap())
    }

    async fn read(&self, oid: u64, offset: u64, len: u32) -> Result<Vec<u8>, Fail> {
        let f = self.call(Request::Read { target: 0, oid, offset, len, checksum: self.checksums }, &[]).await?;
        let (n, crc) = ost::decode_read(&f.body).unwrap();
        let data = f.bulk.into_vec();
        assert_eq!(n as usize, data.len());
        if self.checksums {
            assert_eq!(crc, Some(crc32c(&data)), "read checksum");
        }
        Ok(data)
    }

    async fn attr(&self, r: Request) -> Result<Attr, Fail> {
        let f = self.call(r, &[]).await?;
        Ok(ost::decode_attr(&f.body).unwrap())
    }
}

async fn setup(t: Arc<Target>, checksums: bool) -> (Server, MemNetwork, Ost) {
    let net = MemNetwork::new();
    let oss = Oss::new(vec![t], OssConfig { brw_size: 4 << 20, ..OssConfig::default() }).unwrap();
    let cfg = ServerConfig::default();
    let server =
        Server::start(Arc::new(net.transport("oss0")), &"oss0@mem".parse().unwrap(), oss.handler(), cfg).await.unwrap();
    let imp = Client::new(Arc::new(net.transport("c0")), ClientConfig::default()).connect(&server.nid()).await.unwrap();
    (server, net, Ost { imp, checksums })
}

fn bytes(seed: u64, n: usize) -> Vec<u8> {
    (0..n as u64).map(|i| ((i * 31 + seed * 7) % 253) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_through_the_service() {
    let t = target(8 << 20);
    let (_s, _n, c) = setup(t.clone(), true).await;
    // Precreate a batch, as the MDS will.
    let (first, count) = c.create(1024).await.unwrap();
    assert_eq!(count, 1024);
    let stat = |c: &Ost| {
        let imp = c.imp.clone();
        async move {
            let (op, body) = Request::Statfs { target: 0 }.encode();
            ost::decode_statfs(&imp.call(op, &body, &[]).await.unwrap().body).unwrap()
        }
    };
    let before = stat(&c).await;
    assert_eq!(before.objects, 1024);
    let oid = first + 3;
    let big = bytes(1, 3 << 20);
    let a = c.write(oid, 0, &big).await.unwrap();
    assert_eq!(a.size, 3 << 20);
    c.write(oid, 100, b"small piece").await.unwrap();
    let back = c.read(oid, 0, 4 << 20).await.unwrap();
    assert_eq!(back.len(), 3 << 20, "a read past the end is short");
    assert_eq!(&back[100..111], b"small piece");
    assert!(back[..100] == big[..100] && back[111..] == big[111..]);
    assert_eq!(stat(&c).await.free_bytes, before.free_bytes - (3 << 20), "statfs is exact");
    // Truncate, punch, setattr, getattr.
    let a = c.attr(Request::Truncate { target: 0, oid, size: 1 << 20 }).await.unwrap();
    assert_eq!((a.size, a.space), (1 << 20, 1 << 20));
    let a = c.attr(Request::Punch { target: 0, oid, start: 0, end: 1 << 20 }).await.unwrap();
    assert_eq!((a.size, a.space), (1 << 20, 0));
    assert!(c.read(oid, 0, 1 << 20).await.unwrap().iter().all(|&b| b == 0));
    let want = Attr { uid: 1000, gid: 100, parent: [0x2_0000_0401, 7], ..Attr::default() };
    let a = c
        .attr(Request::Setattr { target: 0, oid, set: SetAttr { mask: set::UID | set::GID | set::PARENT, attr: want } })
        .await
        .unwrap();
    assert_eq!((a.uid, a.gid, a.parent, a.size), (1000, 100, [0x2_0000_0401, 7], 1 << 20), "size is not in the mask");
    assert_eq!(c.attr(Request::Getattr { target: 0, oid }).await.unwrap().uid, 1000);
    c.call(Request::Sync { target: 0 }, &[]).await.unwrap();
    // Destroy: the object is gone, its space is back.
    c.call(Request::Destroy { target: 0, oid }, &[]).await.unwrap();
    let e = c.attr(Request::Getattr { target: 0, oid }).await.unwrap_err();
    assert_eq!(e.0, -2, "{}", e.1);
    assert_eq!(stat(&c).await.free_bytes, before.free_bytes);
    // A batched destroy, as the MDS sends them: objects with data (one with a small write
    // the write-back still holds), an empty one, one destroyed just now and one never made.
    let (x, y, z) = (first + 10, first + 11, first + 12);
    c.write(x, 0, &bytes(2, 2 << 20)).await.unwrap();
    c.write(y, 5, b"held").await.unwrap();
    let oids = vec![x, oid, y, first + 5000, z];
    let (op, body) = Request::DestroyMany { target: 0, oids: oids.clone() }.encode();
    let f = c.imp.call(op, &body, &[]).await.unwrap();
    assert_eq!(f.header.status, 0);
    assert_eq!(ost::decode_destroyed(&f.body, oids.len()).unwrap(), [true, false, true, false, true]);
    for o in [x, y, z] {
        let e = c.attr(Request::Getattr { target: 0, oid: o }).await.unwrap_err();
        assert_eq!(e.0, -2, "object {o} outlived its destroy: {}", e.1);
    }
    let after = stat(&c).await;
    assert_eq!((after.free_bytes, after.objects), (before.free_bytes, before.objects - 4));
    // Sent again (its reply lost, say): nothing left to destroy, nothing changes.
    let f = c.imp.call(op, &body, &[]).await.unwrap();
    assert_eq!(ost::decode_destroyed(&f.body, oids.len()).unwrap(), [false; 5]);
    assert_eq!(stat(&c).await, after);
    assert!(t.check().unwrap().is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_carry_their_errno_and_reason_and_change_nothing() {
    let t = target(2 << 20);
    let (_s, _n, c) = setup(t.clone(), true).await;
    let (oid, _) = c.create(1).await.unwrap();
    c.write(oid, 0, b"keep me").await.unwrap();
    // A corrupted bulk: the checksum catches it before anything is written.
    let data = b"XXXXXXX".to_vec();
    let crc = crc32c(b"keep me");
    let e = c.call(write_req(oid, 0, 7, Some(crc)), &data).await.unwrap_err();
    assert_eq!(e.0, errno::EBADMSG);
    assert!(e.1.contains("checksum mismatch"), "{}", e.1);
    assert_eq!(c.read(oid, 0, 7).await.unwrap(), b"keep me");
    let cases: Vec<(Request, Vec<u8>, i32, &str)> = vec![
        (Request::Getattr { target: 5, oid }, vec![], errno::ENODEV, "no target 5"),
        (Request::Getattr { target: 0, oid: oid + 99 }, vec![], -2, "no object"),
        (Request::Create { target: 0, count: 0, group: 0 }, vec![], errno::EINVAL, "create of 0"),
        (Request::Read { target: 0, oid, offset: 0, len: 5 << 20, checksum: false }, vec![], errno::EINVAL, "brw_size"),
        (write_req(oid, 0, 9, None), vec![1; 3], errno::EPROTO, "announces 9"),
        (write_req(oid, u64::MAX - 1, 1, None), vec![1; 1], -27, "maximum object size"),
        (Request::Punch { target: 0, oid, start: 9, end: 3 }, vec![], errno::EINVAL, "punch from 9"),
    ];
    for (r, bulk, want, text) in cases {
        let e = c.call(r.clone(), &bulk).await.unwrap_err();
        assert_eq!(e.0, want, "{r:?}: {}", e.1);
        assert!(e.1.contains(text), "{r:?}: {}", e.1);
    }
    // A body that is not a request.
    let f = c.imp.call(ost::OST_GETATTR, &[1, 2, 3], &[]).await.unwrap();
    assert_eq!(f.header.status, errno::EPROTO);
    // A full target: ENOSPC, and what it held is intact.
    let (other, _) = c.create(1).await.unwrap();
    let mut at = 0;
    let e = loop {
        match c.write(other, at, &vec![1u8; 2 << 20]).await {
            Ok(_) => at += 2 << 20,
            Err(e) => break e,
        }
        assert!(at < 1 << 30, "the target never filled");
    };
    assert_eq!(e.0, -28, "{}", e.1);
    assert!(e.1.contains("no space"), "{}", e.1);
    assert_eq!(
        c.attr(Request::Getattr { target: 0, oid: other }).await.unwrap().size,
        at,
        "the refused write changed nothing"
    );
    assert_eq!(c.read(oid, 0, 7).await.unwrap(), b"keep me");
    assert_eq!(c.attr(Request::Getattr { target: 0, oid }).await.unwrap().size, 7);
    assert!(t.check().unwrap().is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_many_extents_lands_each_and_one_bad_extent_refuses_it_all() {
    let t = target(8 << 20);
    let (_s, _n, c) = setup(t.clone(), true).await;
    let (oid, _) = c.create(1).await.unwrap();
    let old = bytes(9, 300_000);
    c.write(oid, 0, &old).await.unwrap();
    // Three scattered pieces in one RPC, as a client sends one ior-hard task's blocks.
    let pieces: Vec<(u64, Vec<u8>)> =
        vec![(1_000, bytes(1, 4096)), (100_000, bytes(2, 47_008)), (250_000, bytes(3, 7))];
    let niobufs = |bad: Option<usize>| -> Vec<Niobuf> {
        pieces
            .iter()
            .enumerate()
            .map(|(i, (o, d))| Niobuf {
                offset: *o,
                len: d.len() as u32,
                crc: Some(crc32c(d) ^ (bad == Some(i)) as u32),
            })
            .collect()
    };
    let bulk: Vec<u8> = pieces.iter().flat_map(|(_, d)| d.clone()).collect();
    // Refused, each for its reason, with nothing written.
    let too_far = {
        let mut n = niobufs(None);
        n[2].offset = t.max_object_bytes() - 3;
        n
    };
    let swapped = {
        let mut n = niobufs(None);
        n.swap(0, 1);
        n
    };
    let cases: Vec<(Vec<Niobuf>, Vec<u8>, i32, &str)> = vec![
        (niobufs(Some(1)), bulk.clone(), errno::EBADMSG, "(extent 1 of 3)"),
        (niobufs(None), bulk[1..].to_vec(), errno::EPROTO, "announces 51111 bytes in 3 extents, the bulk holds 51110"),
        (too_far, bulk.clone(), -27, "maximum object size"),
        (
            swapped,
            bulk.clone(),
            errno::EPROTO,
            "extent 1 of a write (4096 bytes at 1000) is before the end of extent 0",
        ),
    ];
    for (n, bulk, want, text) in cases {
        let e = c.call(Request::Write { target: 0, oid, niobufs: n.clone() }, &bulk).await.unwrap_err();
        assert_eq!(e.0, want, "{n:?}: {}", e.1);
        assert!(e.1.contains(text), "{n:?}: {}", e.1);
        assert!(c.read(oid, 0, 300_000).await.unwrap() == old, "{n:?} changed the object");
    }
    let many: Vec<Niobuf> =
        (0..=ost::NIOBUFS_MAX as u64).map(|i| Niobuf { offset: i * 8192, len: 1, crc: None }).collect();
    let e = c.call(Request::Write { target: 0, oid, niobufs: many }, &vec![7; 1025]).await.unwrap_err();
    assert!(e.0 == errno::EPROTO && e.1.contains("a write of 1025 extents (1 to 1024)"), "{e:?}");
    let big: Vec<Niobuf> = (0..2).map(|i| Niobuf { offset: i << 22, len: 3 << 20, crc: None }).collect();
    let e = c.call(Request::Write { target: 0, oid, niobufs: big }, &vec![7; 6 << 20]).await.unwrap_err();
    assert!(e.0 == errno::EINVAL && e.1.contains("6291456 bytes exceeds brw_size"), "{e:?}");
    assert!(c.read(oid, 0, 300_000).await.unwrap() == old);
    // Accepted: each piece where it was sent, the bytes between them untouched.
    let a = c.attr(Request::Getattr { target: 0, oid }).await.unwrap();
    c.call(Request::Write { target: 0, oid, niobufs: niobufs(None) }, &bulk).await.unwrap();
    let mut want = old.clone();
    for (o, d) in &pieces {
        want[*o as usize..*o as usize + d.len()].copy_from_slice(d);
    }
    assert!(c.read(oid, 0, 300_000).await.unwrap() == want);
    assert_eq!(c.attr(Request::Getattr { target: 0, oid }).await.unwrap().size, a.size);
    c.call(Request::Sync { target: 0 }, &[]).await.unwrap();
    let mut back = vec![0u8; 300_000];
    assert_eq!(t.read(oid, 0, &mut back).unwrap(), 300_000);
    assert!(back == want, "and so on the drives");
    assert!(t.check().unwrap().is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_to_disjoint_ranges_of_one_object_all_land() {
    let t = target(8 << 20);
    let (s, net, c) = setup(t.clone(), false).await;
    let (oid, _) = c.create(1).await.unwrap();
    const PIECE: u64 = 47_008;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..6u64 {
        let imp = Client::new(Arc::new(net.transport(&format!("w{w}"))), ClientConfig::default())
            .connect(&s.nid())
            .await
            .unwrap();
        tasks.spawn(async move {
            let c = Ost { imp, checksums: w % 2 == 0 };
            for i in 0..12u64 {
                let n = i * 6 + w;
                c.write(oid, n * PIECE, &bytes(n, PIECE as usize)).await.unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let all = c.read(oid, 0, (72 * PIECE) as u32).await.unwrap();
    for n in 0..72u64 {
        let got = &all[(n * PIECE) as usize..((n + 1) * PIECE) as usize];
        assert!(got == bytes(n, PIECE as usize), "piece {n} did not land");
    }
    assert!(t.check().unwrap().is_clean());
}

/// A drive whose reads wait while its gate is shut (a drive that stalls).
struct Stalling {
    inner: Arc<MemDrive>,
    shut: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

impl BlockDevice for Stalling {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let (m, cv) = &*self.shut;
        let mut shut = m.lock().unwrap();
        while *shut {
            shut = cv.wait(shut).unwrap();
        }
        drop(shut);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn path(&self) -> &std::path::Path {
        self.inner.path()
    }
}

/// Small reads run on the transport's threads, but never on all of them: with every data
/// drive stalled and more small reads waiting than the server has threads, it still
/// answers pings, and the reads return the right bytes once the drives move again. (The
/// server has a runtime of its own, so that its blocked threads cannot stall the test.)
#[test]
fn small_reads_on_stalled_drives_leave_the_server_answering() {
    let shut = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let run = VolumeOptions { threads_per_drive: 1, ..VolumeOptions::default() };
    let data: Vec<Arc<dyn BlockDevice>> = (0..6)
        .map(|i| {
            Arc::new(Stalling { inner: MemDrive::new(&format!("d{i}"), 8 << 20), shut: shut.clone() })
                as Arc<dyn BlockDevice>
        })
        .collect();
    let mut d = CreateOptions::new("ost0", Level::Raid6);
    d.strip_bytes = 16 << 10;
    d.assume_clean = true;
    let meta: Vec<Arc<dyn BlockDevice>> =
        (0..2).map(|i| MemDrive::new(&format!("m{i}"), 32 << 20) as Arc<dyn BlockDevice>).collect();
    let mut m = CreateOptions::new("ost0-index", Level::Raid1);
    m.strip_bytes = 64 << 10;
    m.assume_clean = true;
    let t = Arc::new(
        Target::format(
            Arc::new(Volume::create(data, &d, &run).unwrap()),
            Arc::new(Volume::create(meta, &m, &run).unwrap()),
            TargetOptions::default(),
        )
        .unwrap(),
    );
    let runtime = || tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (server_rt, client_rt) = (runtime(), runtime());
    let net = MemNetwork::new();
    let oss = Oss::new(vec![t], OssConfig::default()).unwrap();
    let transport = Arc::new(net.transport("oss0"));
    let server = server_rt
        .block_on(Server::start(transport, &"oss0@mem".parse().unwrap(), oss.handler(), ServerConfig::default()))
        .unwrap();
    let nid = server.nid();
    client_rt.block_on(async {
        let imp = Client::new(Arc::new(net.transport("c0")), ClientConfig::default()).connect(&nid).await.unwrap();
        let c = Arc::new(Ost { imp, checksums: true });
        let (oid, _) = c.create(1).await.unwrap();
        let body = bytes(5, 1 << 20);
        c.write(oid, 0, &body).await.unwrap();
        *shut.0.lock().unwrap() = true;
        let reads: Vec<_> = (0..4u64)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move { c.read(oid, i * 8192, 4096).await.unwrap() })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(reads.iter().all(|r| !r.is_finished()), "the drives are stalled");
        let pinged = tokio::time::timeout(std::time::Duration::from_secs(5), c.imp.ping()).await;
        *shut.0.lock().unwrap() = false;
        shut.1.notify_all();
        assert!(matches!(pinged, Ok(Ok(()))), "a stalled drive held every server thread: {pinged:?}");
        for (i, r) in reads.into_iter().enumerate() {
            let at = i * 8192;
            assert!(r.await.unwrap() == body[at..at + 4096], "read {i}");
        }
    });
    drop(server);
}

/// An OSS serving `t` with its commits and recovery, on `oss0@mem` (again after a stop:
/// the old listener goes when its task is next polled).
async fn serve_recovering(net: &MemNetwork, t: &Arc<Target>, interval: std::time::Duration) -> (Server, Arc<Oss>) {
    let cfg = OssConfig {
        writeback: nacre_osd::WriteBackOptions { commit_interval: interval, ..Default::default() },
        ..OssConfig::default()
    };
    let oss = Oss::new(vec![t.clone()], cfg).unwrap();
    let scfg = ServerConfig {
        recovery_time_soft: std::time::Duration::from_secs(5),
        recovery_time_hard: std::time::Duration::from_secs(20),
        ..ServerConfig::default()
    };
    for _ in 0..100 {
        let tr = Arc::new(net.transport("oss0"));
        if let Ok(s) =
            Server::start_service(tr, &"oss0@mem".parse().unwrap(), oss.handler(), scfg.clone(), oss.service()).await
        {
            return (s, oss);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the stopped OSS still listens");
}

/// A client of `oss0@mem` from endpoint `name`.
async fn ost_client(net: &MemNetwork, name: &str) -> Ost {
    let imp = Client::new(Arc::new(net.transport(name)), ClientConfig::default())
        .connect(&"oss0@mem".parse().unwrap())
        .await
        .unwrap();
    Ost { imp, checksums: true }
}

/// Small writes are answered before commit: another client reads them at once; a glimpse
/// and a sync commit them (`last_committed` passes their transnos); a truncate after them
/// cuts what they wrote, now and after a commit. The write-back's knobs are checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_writes_are_answered_before_commit_and_read_at_once() {
    let t = target(8 << 20);
    let net = MemNetwork::new();
    let (_s, oss) = serve_recovering(&net, &t, std::time::Duration::from_secs(60)).await;
    let (a, b) = (ost_client(&net, "a").await, ost_client(&net, "b").await);
    let (oid, _) = a.create(1).await.unwrap();
    let body = bytes(9, 47_008 * 8);
    for i in (0..8).rev() {
        let at = i * 47_008;
        a.write(oid, at as u64, &body[at..at + 47_008]).await.unwrap();
    }
    let wb = oss.writeback().stats();
    assert_eq!((wb.held, wb.commits), (8, 0), "held, none committed: {wb:?}");
    assert!(a.imp.uncommitted() >= 8, "the client keeps what is not committed");
    assert!(b.read(oid, 0, body.len() as u32).await.unwrap() == body, "another client reads held writes");
    assert_eq!(t.getattr(oid).unwrap().size, 0, "nothing is on the drives yet");
    // A glimpse commits the object's held writes first: the space it gives is theirs.
    let attr = b.attr(Request::Getattr { target: 0, oid }).await.unwrap();
    assert_eq!(attr.size, body.len() as u64);
    assert!(attr.space >= body.len() as u64, "{attr:?}");
    assert_eq!(t.getattr(oid).unwrap().size, body.len() as u64);
    // The write-back's figures and knobs.
    let text = |p: &str| oss.get_param(p).into_iter().map(|(_, v)| v).collect::<Vec<_>>().join("\n");
    assert!(text("obdfilter.ost0.writeback").contains("held 8\n"), "{}", text("obdfilter.ost0.writeback"));
    oss.set_param("obdfilter.ost0.commit_interval_ms", "30000").unwrap();
    assert_eq!(text("obdfilter.ost0.commit_interval_ms"), "30000");
    oss.set_param("obdfilter.ost0.writeback_max_mb", "64").unwrap();
    assert_eq!(text("obdfilter.ost0.writeback_max_mb"), "64");
    for (k, v) in [("commit_interval_ms", "0"), ("writeback_max_mb", "lots")] {
        let e = oss.set_param(&format!("obdfilter.ost0.{k}"), v).unwrap_err();
        assert!(e.contains(k), "{e}");
    }
    // A sync commits everything answered.
    a.call(Request::Sync { target: 0 }, &[]).await.unwrap();
    let wb = oss.writeback().stats();
    assert!(wb.last_committed >= 8 && wb.commits >= 1, "{wb:?}");
    assert_eq!(t.getattr(oid).unwrap().size, body.len() as u64);
    // Two extents at most reached the target: the pieces met.
    assert!(wb.committed_extents <= 2, "{wb:?}");
    // Held writes, then a truncate: cut, also once committed.
    a.write(oid, 400_000, &bytes(3, 10_000)).await.unwrap();
    b.attr(Request::Truncate { target: 0, oid, size: 100_000 }).await.unwrap();
    oss.writeback().commit().unwrap();
    let back = a.read(oid, 0, 1 << 20).await.unwrap();
    assert!(back.len() == 100_000 && back == body[..100_000], "the truncate cut the held write");
}

/// A background commit holds a partial chunk over (its last piece has not come), and
/// later writes commit past it; the OSS then dies. `last_committed` stayed below the
/// held-over write, so replay runs it and everything after it in transno order: each
/// answered byte reads back, a newer write over the held-over bytes included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_held_over_a_commit_come_back_by_replay_after_a_kill() {
    let t = target(8 << 20);
    let net = MemNetwork::new();
    let (server, oss) = serve_recovering(&net, &t, std::time::Duration::from_secs(60)).await;
    let (a, b) = (ost_client(&net, "a").await, ost_client(&net, "b").await);
    let (oid, _) = a.create(1).await.unwrap();
    let cb = t.chunk_bytes() as usize;
    let q = cb / 4;
    let mut want = vec![0u8; 5 * cb];
    let mut put = async |c: &Ost, at: usize, seed: u64, len: usize| {
        let piece = bytes(seed, len);
        c.write(oid, at as u64, &piece).await.unwrap();
        want[at..at + len].copy_from_slice(&piece);
    };
    let commit_once = async |oss: &Oss, commits: u64| {
        oss.set_param("obdfilter.ost0.commit_interval_ms", "5").unwrap();
        while oss.writeback().stats().commits < commits {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        oss.set_param("obdfilter.ost0.commit_interval_ms", "60000").unwrap();
    };
    // Chunk 2 whole from both clients; chunk 3 without its last quarter.
    for i in 0..7 {
        put(if i % 2 == 0 { &a } else { &b }, 2 * cb + i * q, i as u64, q).await;
    }
    commit_once(&oss, 1).await;
    let st = oss.writeback().stats();
    assert!(st.kept_bytes >= 3 * q as u64, "chunk 3 held over: {st:?}");
    // Chunk 4, whole, commits past it; then a newer write over the held-over bytes.
    for i in 0..4 {
        put(&b, 4 * cb + i * q, 20 + i as u64, q).await;
    }
    commit_once(&oss, st.commits + 1).await;
    put(&b, 3 * cb + 100, 30, 1000).await;
    assert!(t.getattr(oid).unwrap().size >= 5 * cb as u64, "chunk 4 is on the drives");
    let lc = oss.writeback().last_committed();
    assert!(lc < oss.writeback().stats().last_transno, "last_committed {lc} stops below the held-over write");
    let want = &want[..5 * cb];
    oss.writeback().crash();
    drop(server);
    drop(oss);
    let (_server, oss) = serve_recovering(&net, &t, std::time::Duration::from_secs(60)).await;
    let (ra, rb) = tokio::join!(a.read(oid, 0, 5 * cb as u32), b.read(oid, 0, 5 * cb as u32));
    assert!(ra.unwrap() == want && rb.unwrap() == want, "every answered write, in its order");
    oss.writeback().commit().unwrap();
    let mut back = vec![0u8; 5 * cb];
    assert_eq!(t.read(oid, 0, &mut back).unwrap(), 5 * cb);
    assert!(back == want, "and on the drives");
    assert!(t.check().unwrap().is_clean());
}

/// An OSS that dies with writes answered and not committed: its clients replay them when
/// it starts again, and every acknowledged byte reads back; a replay of a write already
/// committed is acknowledged and not run again, so it cannot undo a later write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oss_killed_with_clients_alive_gets_every_answered_write_back_by_replay() {
    let t = target(8 << 20);
    let net = MemNetwork::new();
    let (server, oss) = serve_recovering(&net, &t, std::time::Duration::from_secs(60)).await;
    let (a, b) = (ost_client(&net, "a").await, ost_client(&net, "b").await);
    let (oid, _) = a.create(2).await.unwrap();
    // Committed: a's first piece and b's overwrite of its first half.
    let mut want = vec![0u8; 200_000];
    let first = bytes(1, 60_000);
    a.write(oid, 0, &first).await.unwrap();
    want[..60_000].copy_from_slice(&first);
    let over = bytes(2, 30_000);
    b.write(oid, 0, &over).await.unwrap();
    want[..30_000].copy_from_slice(&over);
    a.call(Request::Sync { target: 0 }, &[]).await.unwrap();
    // Answered, not committed: pieces from both clients, one over another.
    for (i, c) in [&a, &b, &a, &b].into_iter().enumerate() {
        let at = 50_000 + i * 30_000;
        let piece = bytes(10 + i as u64, 40_000);
        c.write(oid, at as u64, &piece).await.unwrap();
        want[at..at + 40_000].copy_from_slice(&piece);
    }
    let want = &want[..180_000];
    assert!(a.imp.uncommitted() >= 2 && b.imp.uncommitted() >= 2);
    // The crash: the held writes are gone from the server.
    oss.writeback().crash();
    drop(server);
    drop(oss);
    assert!(t.getattr(oid).unwrap().size < want.len() as u64, "the crash lost the held writes");
    let (_server, oss) = serve_recovering(&net, &t, std::time::Duration::from_secs(60)).await;
    assert_eq!(oss.writeback().known_clients().len(), 2, "both clients are waited for");
    // Their next requests reconnect and replay first.
    let (ra, rb) = tokio::join!(a.read(oid, 0, 200_000), b.read(oid, 0, 200_000));
    assert!(ra.unwrap() == want, "client a reads every answered write");
    assert!(rb.unwrap() == want, "client b reads every answered write");
    oss.writeback().commit().unwrap();
    let mut back = vec![0u8; 200_000];
    let n = t.read(oid, 0, &mut back).unwrap();
    assert!(back[..n] == *want, "and it is on the drives");
    // A late replay of a's first write (transno 1, committed since, and overwritten by
    // b's): acknowledged, not run.
    let (opcode, body) = write_req(oid, 0, 60_000, None).encode();
    let replay = nacre_net::server::Incoming {
        header: nacre_net::frame::FrameHeader { opcode, xid: 99, transno: 1, ..Default::default() },
        body,
        bulk: first.clone().into(),
        peer: "a@mem".parse().unwrap(),
        client: 1,
        replayed: Some(Vec::new()),
    };
    let r = oss.handler()(replay).await;
    assert_eq!((r.status, r.transno), (0, 1), "{}", String::from_utf8_lossy(&r.body));
    assert!(a.read(oid, 0, 200_000).await.unwrap() == want, "the old replay changed nothing");
}

/// A target on drives in memory (RAID6 4+2 with 16 KiB strips for data, RAID1 for the
/// index), with its data volume, for tests that damage it.
fn target_with_data(data_drive_bytes: u64) -> (Arc<Target>, Arc<Volume>) {
    let run = VolumeOptions { threads_per_drive: 1, ..VolumeOptions::default() };
    let devs = |n: usize, bytes: u64, p: &str| -> Vec<Arc<dyn BlockDevice>> {
        (0..n).map(|i| MemDrive::new(&format!("{p}{i}"), bytes) as Arc<dyn BlockDevice>).collect()
    };
    let mut d = CreateOptions::new("ost0", Level::Raid6);
    d.strip_bytes = 16 << 10;
    d.assume_clean = true;
    let data = Arc::new(Volume::create(devs(6, data_drive_bytes, "d"), &d, &run).unwrap());
    let mut m = CreateOptions::new("ost0-index", Level::Raid1);
    m.strip_bytes = 64 << 10;
    m.assume_clean = true;
    let meta = Volume::create(devs(2, 32 << 20, "m"), &m, &run).unwrap();
    (Arc::new(Target::format(data.clone(), Arc::new(meta), TargetOptions::default()).unwrap()), data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_block_reads_as_eio_naming_its_object_and_a_scrub_reports_it() {
    let (t, data) = target_with_data(8 << 20);
    let (_s, _n, c) = setup(t.clone(), true).await;
    let (oid, _) = c.create(1).await.unwrap();
    let cb = t.chunk_bytes();
    let written = bytes(3, 2 * cb as usize);
    c.write(oid, 0, &written).await.unwrap();
    let mut raw = vec![0u8; written.len()];
    data.read(0, &mut raw).unwrap();
    assert!(raw == written, "the object is the volume's first two chunks");
    // A misdirected write into block 1 of chunk 1 (parity follows: nothing can mend it).
    data.write(cb + 4096 + 9, &[0xAB; 2]).unwrap();
    let e = c.read(oid, cb + 4096, 4096).await.unwrap_err();
    assert_eq!(e.0, -5, "EIO");
    assert!(e.1.contains(&format!("object {oid:#x}")) && e.1.contains("does not match its checksum"), "{}", e.1);
    // The blocks beside it read.
    assert_eq!(c.read(oid, cb, 4096).await.unwrap(), written[cb as usize..cb as usize + 4096]);
    // A scrub through the parameters finds it, once, and says where.
    let oss = Oss::new(vec![t.clone()], OssConfig::default()).unwrap();
    let get = |oss: &Oss| oss.get_param("obdfilter.ost0.scrub")[0].1.clone();
    assert!(get(&oss).starts_with("status never"), "{}", get(&oss));
    oss.set_param("obdfilter.ost0.scrub", "start").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !get(&oss).starts_with("status completed") {
        assert!(std::time::Instant::now() < deadline, "{}", get(&oss));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let report = get(&oss);
    assert!(report.contains("last_mended 0\nlast_lost 1\n"), "{report}");
    assert!(report.ends_with(&format!("last_lost_offsets {}", cb + 4096)), "{report}");
    let stats = oss.get_param("obdfilter.ost0.stats")[0].1.clone();
    assert!(stats.contains("checksum_errors 2\n"), "the read and the scrub each met the lost block: {stats}");
    let wb = oss.get_param("obdfilter.ost0.writeback")[0].1.clone();
    assert!(wb.contains("\nkept_bytes 0\n"), "{wb}");
    assert!(oss.set_param("obdfilter.ost0.scrub", "sometime").is_err(), "only start and stop are values");
    let e = oss.set_param("obdfilter.ost0.scrub", "stop").unwrap_err();
    assert!(e.contains("no scrub of ost0 is running"), "{e}");
    // Its pace: a number of MB/s, 0 for none; anything else is refused and changes nothing.
    assert_eq!(oss.get_param("obdfilter.ost0.scrub_rate_mb")[0].1, "0");
    oss.set_param("obdfilter.ost0.scrub_rate_mb", "200").unwrap();
    assert!(oss.set_param("obdfilter.ost0.scrub_rate_mb", "fast").is_err());
    assert_eq!(oss.get_param("obdfilter.ost0.scrub_rate_mb")[0].1, "200");
}
