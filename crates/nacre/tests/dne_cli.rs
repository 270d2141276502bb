//! Two MDTs as processes over TCP, joined by an MGS: directories made on MDT 1 through
//! MDT 0 while either MDT is killed with SIGKILL and started again. Afterwards every
//! acknowledged directory is there, every name on MDT 0 leads to an inode on MDT 1, and
//! MDT 1 holds no inode that no name leads to: no operation was left half done.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nacre_net::client::{Client, ClientConfig, Import};
use nacre_proto::fid::Fid;
use nacre_proto::mdt::{Creds, Reply, Request};

mod common;
use common::*;

fn ok(out: std::process::Output) {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

async fn call(imp: &Import, r: &Request) -> Result<Reply, String> {
    let (op, body) = r.encode(&Creds::default());
    let f = tokio::time::timeout(Duration::from_secs(3), imp.call(op, &body, &[]))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    if f.header.status != 0 {
        return Err(format!("{}: {}", f.header.status, String::from_utf8_lossy(&f.body)));
    }
    Reply::decode(&f.body).map_err(|e| e.to_string())
}

fn mkdir(name: &str) -> Request {
    Request::Mkdir { dir: Fid::ROOT, name: name.into(), mode: 0o755, mdt: 1, count: 0 }
}

/// Make directories on MDT 1 through MDT 0 until `stop` is set or a call fails; the
/// names acknowledged go to `acked`.
async fn storm(md0: Arc<Import>, prefix: String, acked: Arc<Mutex<Vec<String>>>, stop: Arc<Mutex<bool>>) {
    for i in 0.. {
        if *stop.lock().unwrap() {
            return;
        }
        let name = format!("{prefix}{i}");
        match call(&md0, &mkdir(&name)).await {
            Ok(_) => acked.lock().unwrap().push(name),
            Err(_) => return,
        }
    }
}

/// Every name in the root, with its FID.
async fn root_entries(md0: &Import) -> Vec<(String, Fid)> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let Reply::Entries { entries, eof } =
            call(md0, &Request::Readdir { dir: Fid::ROOT, cookie, max: 1000 }).await.unwrap()
        else {
            panic!()
        };
        for (e, _) in entries {
            cookie = e.cookie;
            out.push((e.name, e.fid));
        }
        if eof {
            return out;
        }
    }
}

/// The checks after a crash: acknowledged names there, names and inodes one to one.
async fn consistent(md0: &Import, md1: &Import, acked: &[String]) {
    // Give recovery the time to finish what the crash cut.
    let mut entries = Vec::new();
    for _ in 0..100 {
        entries = root_entries(md0).await;
        let Reply::StatFs { inodes, .. } = call(md1, &Request::Statfs).await.unwrap() else { panic!() };
        if inodes == entries.len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for name in acked {
        assert!(entries.iter().any(|(n, _)| n == name), "acknowledged {name} is missing");
    }
    for (n, fid) in &entries {
        assert_eq!(fid.mdt(), Some(1), "{n}");
        call(md1, &Request::Getattr { fid: *fid }).await.unwrap_or_else(|e| panic!("{n} leads nowhere: {e}"));
    }
    let Reply::StatFs { inodes, .. } = call(md1, &Request::Statfs).await.unwrap() else { panic!() };
    assert_eq!(inodes, entries.len() as u64, "MDT 1 has inodes no name leads to");
}

#[test]
fn remote_mkdirs_survive_a_crash_of_either_mdt() {
    let base = std::env::temp_dir().join(format!("nacre-dne-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (mgs_dir, d0, d1) = (base.join("mgs"), base.join("mdt0"), base.join("mdt1"));
    ok(nacre().args(["mgs", "format", "--fsname", "dne", "--dir"]).arg(&mgs_dir).output().unwrap());
    ok(nacre().args(["mdt", "format", "--size", "64M", "--drives", "2", "--dir"]).arg(&d0).output().unwrap());
    ok(nacre()
        .args(["mdt", "format", "--size", "64M", "--drives", "2", "--index", "1", "--name", "mdt1", "--dir"])
        .arg(&d1)
        .output()
        .unwrap());
    let (_mgs, mgs) = serve(&["mgs", "serve", "--listen", "127.0.0.1@tcp:0"], &mgs_dir);
    // Commits far apart, so that a crash finds changes answered and not yet on the drives:
    // a step sent to another MDT before what it depends on is committed shows.
    ok(nacre().args(["set-param", "-P", "--server", &mgs, "mdt.*.commit_interval_ms=400"]).output().unwrap());
    let mdt0 = ["mdt", "serve", "--listen", "127.0.0.1@tcp:0", "--fsname", "dne", "--mgs", &mgs];
    let mdt1 = ["mdt", "serve", "--name", "mdt1", "--listen", "127.0.0.1@tcp:0", "--fsname", "dne", "--mgs", &mgs];
    let (mut p0, mut n0) = serve(&mdt0, &d0);
    let (mut p1, mut n1) = serve(&mdt1, &d1);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = Client::new(Arc::new(nacre_net::transport::TcpTransport), ClientConfig::default());
        let connect = |nid: String| {
            let client = client.clone();
            async move { client.connect(&nid.parse().unwrap()).await.unwrap() }
        };
        let mut md0 = connect(n0.clone()).await;
        // MDT 0 learns of MDT 1 from the MGS.
        let started = std::time::Instant::now();
        while call(&md0, &mkdir("first")).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "MDT 0 never learnt of MDT 1");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let acked = Arc::new(Mutex::new(vec!["first".to_string()]));
        for (round, victim) in [0, 1, 0, 1].into_iter().enumerate() {
            let stop = Arc::new(Mutex::new(false));
            let task = tokio::spawn(storm(md0.clone(), format!("r{round}-"), acked.clone(), stop.clone()));
            tokio::time::sleep(Duration::from_millis(400 + 150 * round as u64)).await;
            // SIGKILL of one MDT in the middle of the storm, then a restart on its drives.
            if victim == 0 {
                drop(p0);
                (p0, n0) = serve(&mdt0, &d0);
            } else {
                drop(p1);
                (p1, n1) = serve(&mdt1, &d1);
            }
            *stop.lock().unwrap() = true;
            let _ = task.await;
            md0 = connect(n0.clone()).await;
            let _ = (&p0, &p1);
            let md1 = connect(n1.clone()).await;
            let acked = acked.lock().unwrap().clone();
            assert!(acked.len() > round + 1, "the storm made nothing in round {round}");
            consistent(&md0, &md1, &acked).await;
        }
    });
    let _ = std::fs::remove_dir_all(&base);
}
