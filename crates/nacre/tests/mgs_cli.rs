//! `nacre mgs`, `nacre mdt serve --mgs` and `nacre ost serve --mgs` end to end: an MGS
//! and two targets as three processes over TCP; the targets register, `get-param` shows
//! them, `set-param -P` stores a parameter, and a bad one is refused with the reason.

mod common;
use common::*;

fn ok(out: std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn targets_register_with_the_mgs_and_set_param_p_stores_parameters() {
    let base = std::env::temp_dir().join(format!("nacre-mgs-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (mgs_dir, mdt_dir, ost_dir) = (base.join("mgs"), base.join("mdt0"), base.join("ost0"));
    ok(nacre().args(["mgs", "format", "--fsname", "demo", "--dir"]).arg(&mgs_dir).output().unwrap());
    ok(nacre().args(["mdt", "format", "--size", "32M", "--dir"]).arg(&mdt_dir).output().unwrap());
    ok(nacre()
        .args(["ost", "format", "--size", "64M", "--index-size", "32M", "--dir"])
        .arg(&ost_dir)
        .output()
        .unwrap());
    let (_mgs, mgs) = serve(&["mgs", "serve", "--listen", "127.0.0.1@tcp:0"], &mgs_dir);
    let (_mdt, mdt) =
        serve(&["mdt", "serve", "--listen", "127.0.0.1@tcp:0", "--fsname", "demo", "--mgs", &mgs], &mdt_dir);
    let (_ost, ost) = serve(
        &["ost", "serve", "--listen", "127.0.0.1@tcp:0", "--fsname", "demo", "--index", "0", "--mgs", &mgs],
        &ost_dir,
    );
    let targets = ok(nacre().args(["get-param", "--server", &mgs, "mgs.MGS.targets"]).output().unwrap());
    assert!(targets.contains(&format!("demo-MDT0000 {mdt}")), "{targets}");
    assert!(targets.contains(&format!("demo-OST0000 {ost}")), "{targets}");
    ok(nacre().args(["set-param", "-P", "--server", &mgs, "osc.*.checksums=0"]).output().unwrap());
    let p = ok(nacre().args(["get-param", "--server", &mgs, "osc.*.checksums"]).output().unwrap());
    assert!(p.contains("osc.*.checksums=0"), "{p}");
    let bad = nacre().args(["set-param", "-P", "--server", &mgs, "nodots=1"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a parameter name"));
    // The MDS follows the OSTs in the configuration: a new file gets an object on the
    // OST, which exists there.
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        use nacre_proto::mdt::{Creds, Reply, Request, mode};
        let client = nacre_net::client::Client::new(
            std::sync::Arc::new(nacre_net::transport::TcpTransport),
            nacre_net::client::ClientConfig::default(),
        );
        let md = client.connect(&mdt.parse().unwrap()).await.unwrap();
        let os = client.connect(&ost.parse().unwrap()).await.unwrap();
        let started = std::time::Instant::now();
        let (attr, created) = loop {
            let r = Request::create(nacre_proto::fid::Fid::ROOT, "f", mode::S_IFREG | 0o644);
            let (op, body) = r.encode(&Creds::default());
            let f = md.call(op, &body, &[]).await.unwrap();
            if f.header.status == 0 {
                let Reply::Created { attr, objects, .. } = Reply::decode(&f.body).unwrap() else { panic!() };
                break (attr, objects);
            }
            // ENOSPC until the first precreate batch is in.
            assert_eq!(f.header.status, -28, "{}", String::from_utf8_lossy(&f.body));
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "no objects after 30 s");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        let (op, body) = Request::Getlayout { fid: attr.fid }.encode(&Creds::default());
        let Reply::Layout { objects, .. } = Reply::decode(&md.call(op, &body, &[]).await.unwrap().body).unwrap() else {
            panic!()
        };
        assert_eq!(objects, created, "the create's answer named the file's objects");
        assert_eq!(objects.len(), 1);
        let (ost_index, oid) = objects[0][0];
        assert_eq!(ost_index, 0);
        let (op, body) = nacre_proto::ost::Request::Getattr { target: 0, oid }.encode();
        assert_eq!(os.call(op, &body, &[]).await.unwrap().header.status, 0, "object {oid} is on the OST");
        // An OST pool set on the MGS reaches the MDS: a layout may name it, and only it.
        ok(nacre().args(["set-param", "-P", "--server", &mgs, "lov.pool.fast=0"]).output().unwrap());
        let bad = nacre().args(["set-param", "-P", "--server", &mgs, "lov.pool.slow=zero"]).output().unwrap();
        assert!(!bad.status.success());
        assert!(String::from_utf8_lossy(&bad.stderr).contains("not an OST index"));
        let create = |name: &str, pool: &str| Request::Create {
            dir: nacre_proto::fid::Fid::ROOT,
            name: name.into(),
            mode: mode::S_IFREG | 0o644,
            target: vec![],
            layout: nacre_proto::layout::Layout::from_lfs_args(&["-c", "1", "-p", pool]).unwrap().encode(),
            rdev: 0,
        };
        let started = std::time::Instant::now();
        loop {
            let (op, body) = create("pooled", "fast").encode(&Creds::default());
            let f = md.call(op, &body, &[]).await.unwrap();
            if f.header.status == 0 {
                break;
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "{}", String::from_utf8_lossy(&f.body));
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let (op, body) = create("unpooled", "slow").encode(&Creds::default());
        let f = md.call(op, &body, &[]).await.unwrap();
        assert_eq!(f.header.status, -22);
        assert!(String::from_utf8_lossy(&f.body).contains("not defined"));
    });
    // A target of another file system is refused, and says so.
    let other_dir = base.join("ost1");
    ok(nacre()
        .args(["ost", "format", "--size", "64M", "--index-size", "32M", "--dir"])
        .arg(&other_dir)
        .output()
        .unwrap());
    let other = nacre()
        .args([
            "ost",
            "serve",
            "--listen",
            "127.0.0.1@tcp:0",
            "--fsname",
            "other",
            "--index",
            "1",
            "--mgs",
            &mgs,
            "--dir",
        ])
        .arg(&other_dir)
        .output()
        .unwrap();
    assert!(!other.status.success());
    let why = String::from_utf8_lossy(&other.stderr);
    assert!(why.contains("other-OST0001") && why.contains("\"demo\""), "{why}");
    let _ = std::fs::remove_dir_all(&base);
}
