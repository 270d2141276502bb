//! The MGS: targets register (failover partners kept), parameters stored for the whole
//! file system, everything back after a restart, bad input refused with the reason, and a
//! client waiting for a change hears of it at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nacre_net::client::{Client, ClientConfig};
use nacre_net::server::{Server, ServerConfig};
use nacre_net::transport::MemNetwork;
use nacre_proto::mdt::errno;
use nacre_proto::mgs::{Config, Request, TargetEntry, TargetKind};
use nacre_raid::Volume;
use nacre_server::mgs::Mgs;

fn volume() -> Arc<Volume> {
    crate::raid1_volume("mgs", 16 << 20)
}

fn target(kind: TargetKind, index: u32, nids: &[&str]) -> TargetEntry {
    TargetEntry { kind, index, nids: nids.iter().map(|s| s.to_string()).collect() }
}

#[test]
fn registrations_and_parameters_persist_and_bad_input_is_refused() {
    let v = volume();
    assert_eq!(Mgs::format(v.clone(), "bad name!").err().unwrap().errno, errno::EINVAL);
    let mgs = Mgs::format(v.clone(), "nacre").unwrap();
    let v0 = mgs.config().version;
    mgs.register("nacre", &target(TargetKind::Mdt, 0, &["10.0.0.1@tcp:9200"])).unwrap();
    mgs.register("nacre", &target(TargetKind::Ost, 1, &["10.0.0.2@tcp:9100"])).unwrap();
    mgs.register("nacre", &target(TargetKind::Ost, 0, &["10.0.0.2@tcp:9100"])).unwrap();
    // The partner server takes over OST 1: its NID goes first, the old one stays.
    let v1 = mgs.register("nacre", &target(TargetKind::Ost, 1, &["10.0.0.3@tcp:9100"])).unwrap();
    assert_eq!(v1, v0 + 4);
    // The same registration again changes nothing.
    assert_eq!(mgs.register("nacre", &target(TargetKind::Ost, 1, &["10.0.0.3@tcp:9100"])).unwrap(), v1);
    let c = mgs.config();
    assert_eq!(
        c.targets,
        vec![
            target(TargetKind::Mdt, 0, &["10.0.0.1@tcp:9200"]),
            target(TargetKind::Ost, 0, &["10.0.0.2@tcp:9100"]),
            target(TargetKind::Ost, 1, &["10.0.0.3@tcp:9100", "10.0.0.2@tcp:9100"]),
        ]
    );
    // Refusals, each naming the problem, changing nothing.
    let e = mgs.register("other", &target(TargetKind::Ost, 2, &["10.0.0.2@tcp:9100"])).unwrap_err();
    assert!(e.message.contains("\"other\"") && e.errno == errno::EINVAL, "{e}");
    let e = mgs.register("nacre", &target(TargetKind::Ost, 2, &["not a nid"])).unwrap_err();
    assert!(e.message.contains("not a nid"), "{e}");
    assert_eq!(
        mgs.register("nacre", &target(TargetKind::Ost, 1 << 20, &["10.0.0.2@tcp"])).unwrap_err().errno,
        errno::EINVAL
    );
    assert_eq!(mgs.register("nacre", &target(TargetKind::Ost, 2, &[])).unwrap_err().errno, errno::EINVAL);
    assert_eq!(mgs.config(), c);
    // Parameters for the whole file system.
    mgs.set_param("osc.*.max_rpcs_in_flight", "16").unwrap();
    mgs.set_param("obdfilter.*.brw_size", "4194304").unwrap();
    mgs.set_param("obdfilter.*.brw_size", "").unwrap();
    for bad in ["", "nodot", "a.b c", "a.b\n"] {
        let e = mgs.set_param(bad, "1").unwrap_err();
        assert_eq!(e.errno, errno::EINVAL, "{bad:?}: {e}");
    }
    assert_eq!(mgs.set_param("a.b", "x\ny").unwrap_err().errno, errno::EINVAL);
    assert_eq!(mgs.set_param("a.b", "").unwrap_err().errno, errno::ENOENT);
    // A node's fault rules are set on the node, never stored for the file system.
    let e = mgs.set_param("net.fault_rules", "drop").unwrap_err();
    assert!(e.errno == errno::EINVAL && e.message.contains("set it on the node"), "{e}");
    assert!(mgs.get_param("net.*").is_empty());
    let p = mgs.get_param("osc.*.*");
    assert_eq!(p, vec![("osc.*.max_rpcs_in_flight".to_string(), "16".to_string())]);
    assert!(mgs.get_param("mgs.MGS.targets")[0].1.contains("nacre-OST0001 10.0.0.3@tcp:9100,10.0.0.2@tcp:9100"));
    // The configuration fits one reply: past that, parameters are refused.
    let big = "x".repeat(4000);
    let refused = (0..40).map(|i| mgs.set_param(&format!("llite.*.p{i}"), &big)).find_map(Result::err).unwrap();
    assert_eq!(refused.errno, errno::ENOSPC, "{refused}");
    assert!(mgs.config().encode().len() <= nacre_server::mgs::CONFIG_BYTES_MAX);
    // A restart keeps everything.
    let before = mgs.config();
    drop(mgs);
    let mgs = Mgs::open(v).unwrap();
    assert_eq!(mgs.config(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_client_hears_of_a_change_at_once() {
    let net = MemNetwork::new();
    let mgs = Arc::new(Mgs::format(volume(), "nacre").unwrap());
    let server = Server::start(
        Arc::new(net.transport("mgs")),
        &"mgs@mem".parse().unwrap(),
        mgs.handler(),
        ServerConfig::default(),
    )
    .await
    .unwrap();
    let imp = Client::new(Arc::new(net.transport("c")), ClientConfig::default()).connect(&server.nid()).await.unwrap();
    let fetch = |have: u64, wait_ms: u32| {
        let imp = imp.clone();
        async move {
            let (op, body) = Request::Config { have, wait_ms }.encode();
            let f = imp.call(op, &body, &[]).await.unwrap();
            assert_eq!(f.header.status, 0);
            Config::decode(&f.body).unwrap()
        }
    };
    let c = fetch(0, 0).await;
    assert_eq!(c.fsname, "nacre");
    // Nothing changes: the answer comes after the wait, unchanged.
    let t = Instant::now();
    assert_eq!(fetch(c.version, 200).await.version, c.version);
    assert!(t.elapsed() >= Duration::from_millis(150));
    // A change while a client waits: it hears at once, not after its 30 s.
    let waiting = tokio::spawn(fetch(c.version, 30_000));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    let (op, body) = Request::SetParam { name: "llite.*.max_read_ahead_mb".into(), value: "64".into() }.encode();
    assert_eq!(imp.call(op, &body, &[]).await.unwrap().header.status, 0);
    let got = waiting.await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(got.version, c.version + 1);
    assert_eq!(got.params, vec![("llite.*.max_read_ahead_mb".to_string(), "64".to_string())]);
    // A bad request is refused with the reason.
    let (op, body) = Request::SetParam { name: "bad".into(), value: "1".into() }.encode();
    let f = imp.call(op, &body, &[]).await.unwrap();
    assert_eq!(f.header.status, -errno::EINVAL);
    assert!(String::from_utf8_lossy(&f.body).contains("not a parameter name"));
}

/// Wait up to 10 s for `what`.
async fn until(what: &str, f: impl Fn() -> bool) {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what} never happened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An MDT keeps the configuration the MGS gave it on its own volume: restarted while no
/// MGS answers, it still has the file system's OST pools and its stored parameters (and
/// a later version from the MGS replaces the copy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mdt_restarted_while_no_mgs_answers_keeps_its_pools_and_parameters() {
    use nacre_net::nid::Nid;
    use nacre_proto::fid::Fid;
    use nacre_proto::layout::Layout;
    use nacre_server::cluster::{Listen, Local, MgsAt, Registration};
    use nacre_server::mdt::{Cred, Namespace, NamespaceOptions};

    let net = MemNetwork::new();
    let listen = |name: &str| -> Listen { format!("{name}@mem").parse::<Nid>().unwrap().into() };
    let volume_of_mdt = crate::mdt_volume();
    let mgs = Arc::new(Mgs::format(volume(), "copyfs").unwrap());
    mgs.set_param("lov.pool.fast", "0").unwrap();
    mgs.set_param("mdt.*.lease_contended_ms", "321").unwrap();
    let contended = |local: &Local| local.mdses()[0].get_param("mdt.mdt0.lease_contended_ms")[0].1.clone();
    let pooled = Layout::from_lfs_args(&["-c", "1", "-p", "fast"]).unwrap();

    let ns = Arc::new(Namespace::format(volume_of_mdt.clone(), 0, NamespaceOptions::default()).unwrap());
    let t = Arc::new(net.transport("servers"));
    let local = Local::start(
        t.clone(),
        listen,
        MgsAt::Here(mgs.clone()),
        vec![ns.clone()],
        Vec::new(),
        Registration::Wait(Duration::ZERO),
        false,
        Default::default(),
    )
    .await
    .unwrap();
    let mgs_nids = local.mgs().clone();
    until("the MDT took its stored parameter", || contended(&local) == "321").await;
    let copy = || ns.config_copy().unwrap().map(|b| Config::decode(&b).unwrap());
    until("the MDT kept the configuration", || {
        copy().is_some_and(|c| c.params.iter().any(|(n, _)| n == "lov.pool.fast"))
    })
    .await;
    // A later version replaces the copy.
    mgs.set_param("mdt.*.lease_contended_ms", "654").unwrap();
    until("the copy followed the MGS", || {
        copy().is_some_and(|c| c.params.iter().any(|(n, v)| n == "mdt.*.lease_contended_ms" && v == "654"))
    })
    .await;
    local.stop().await;
    drop(ns);

    // The MDT again, its MGS gone. Opened, it knows no pools until it follows its copy.
    let ns = Arc::new(Namespace::open(volume_of_mdt.clone(), NamespaceOptions::default()).unwrap());
    let e = ns.set_dir_layout(&Cred::root(), Fid::ROOT, Some(pooled.clone()), None).unwrap_err();
    assert!(e.errno == errno::EINVAL && e.message.contains("no pools"), "{e}");
    let remote = MgsAt::Remote { nids: mgs_nids, fsname: "copyfs".into(), known: Vec::new() };
    let local = Local::start(
        t,
        listen,
        remote,
        vec![ns.clone()],
        Vec::new(),
        Registration::Background,
        true,
        Default::default(),
    )
    .await
    .unwrap();
    until("the MDT took its stored parameter from its copy", || contended(&local) == "654").await;
    ns.set_dir_layout(&Cred::root(), Fid::ROOT, Some(pooled), None).unwrap();
    local.stop().await;
}
