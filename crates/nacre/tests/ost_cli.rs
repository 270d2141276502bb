//! `nacre ost serve` and `nacre get-param` end to end: a target on file drives served over
//! TCP, written through the OSS with a job id, and its statistics read back by name.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;

use nacre_net::client::{Client, ClientConfig, Request as RpcRequest};
use nacre_net::nid::Nid;
use nacre_net::transport::TcpTransport;
use nacre_proto::ost::{self, Request};

mod common;
use common::*;

#[test]
fn served_target_counts_jobs_and_get_param_reads_them() {
    let dir = std::env::temp_dir().join(format!("nacre-ost-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = nacre()
        .args(["ost", "format", "--size", "64M", "--index-size", "32M"])
        .arg("--dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut child = nacre()
        .args(["ost", "serve", "--listen", "127.0.0.1@tcp:0"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _guard = Kill(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let nid: Nid = line.trim().rsplit(' ').next().unwrap().parse().unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = Client::new(Arc::new(TcpTransport), ClientConfig::default());
        let imp = client.connect(&nid).await.unwrap();
        let (op, body) = Request::Create { target: 0, count: 16, group: 0 }.encode();
        let (first, _) = ost::decode_created(&imp.call(op, &body, &[]).await.unwrap().body).unwrap();
        let data = vec![9u8; 1 << 20];
        for i in 0..3u64 {
            let niobufs = vec![ost::Niobuf { offset: i << 20, len: 1 << 20, crc: None }];
            let (op, body) = Request::Write { target: 0, oid: first, niobufs }.encode();
            let f = imp.send(RpcRequest { job_id: 4242, ..RpcRequest::new(op, &body, &data) }).await.unwrap();
            assert_eq!(f.header.status, 0, "{}", String::from_utf8_lossy(&f.body));
        }
    });

    let get = |pattern: &str| nacre().args(["get-param", "--server", &nid.to_string(), pattern]).output().unwrap();
    let out = get("obdfilter.*.job_stats");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("obdfilter.ost0.job_stats=\njob_stats:"), "{text}");
    assert!(text.contains("job_id: 4242") && text.contains("write_bytes: { samples: 3, sum: 3145728 }"), "{text}");
    let out = get("obdfilter.ost0.brw_stats");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("write I/O size") && text.contains("      1M:          3 100 100"), "{text}");
    let out = get("obdfilter.ost0.kbytes*");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("obdfilter.ost0.kbytestotal=") && text.contains("obdfilter.ost0.kbytesfree="), "{text}");
    let out = get("no.such.*");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no parameter matches"));

    // set-param: the request policy and a TBF rule while serving, as lctl set_param.
    let set = |setting: &str| nacre().args(["set-param", "--server", &nid.to_string(), setting]).output().unwrap();
    assert!(set("ost.OSS.ost_io.nrs_policies=tbf").status.success());
    let out = set("ost.OSS.ost_io.nrs_tbf_rule=start slow nid={127.0.0.1@tcp} rate=50");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&get("ost.OSS.ost_io.nrs_*").stdout).into_owned();
    assert!(text.contains("ost.OSS.ost_io.nrs_policies=tbf") && text.contains("slow"), "{text}");
    assert!(set("obdfilter.ost0.job_stats=clear").status.success());
    let text = String::from_utf8_lossy(&get("obdfilter.ost0.job_stats").stdout).into_owned();
    assert!(!text.contains("4242"), "{text}");
    for (bad, why) in [
        ("ost.OSS.ost_io.nrs_policies=lifo", "unknown request policy"),
        ("obdfilter.ost0.brw_size=12345", "power of two"),
        ("obdfilter.ost9.brw_size=4096", "no target"),
        ("no.such=1", "no settable parameter"),
        ("missing-equals", "expected NAME=VALUE"),
    ] {
        let out = set(bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{bad}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
