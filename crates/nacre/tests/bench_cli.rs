//! The benches at small sizes, end to end: each runs, verifies what it reads, and ends
//! with a JSON line holding every figure the issues ask for.

mod common;
use common::*;

/// The failover bench runs alone: its nodes renew their leases every second and step down
/// when a renewal is late past half the expiry (2.5 s), and beside another bench on two
/// cores one did (CI, 2026-11-28: "MDT0: node b lost its lease: its lease was not renewed
/// in time"). The other benches share.
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    ALONE.read().unwrap_or_else(|e| e.into_inner())
}

/// The OST bench at a small size: every figure in its JSON line, each positive, and the
/// small-write bound no higher than its two references allow.
#[test]
fn bench_ost_prints_every_figure() {
    let _shared = shared();
    let dir = std::env::temp_dir().join(format!("nacre-bench-ost-{}", std::process::id()));
    let out = nacre()
        .args([
            "bench",
            "ost",
            "--size",
            "32M",
            "--threads",
            "2",
            "--rounds",
            "1",
            "--brw-size",
            "4M",
            "--small-objects",
            "1000",
        ])
        .arg("--dir")
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let v = bench_figures(
        &out,
        &[
            "raw_write_gbps",
            "raw_read_gbps",
            "write_gbps",
            "rewrite_gbps",
            "read_gbps",
            "small_write_gbps",
            "raw_index_small_gbps",
            "small_write_bound_gbps",
            "write_ratio",
            "read_ratio",
            "small_write_ratio",
            "small_write_bound_ratio",
            "scrub_gbps",
            "scrub_vs_raw_read_ratio",
        ],
    );
    let f = |k: &str| v[k].as_f64().unwrap();
    assert!(f("small_write_bound_gbps") <= f("raw_index_small_gbps").min(f("raw_write_gbps")));
    assert_eq!(v["objects_created"].as_u64(), Some(99_328));
}

/// The MDS bench at a small size: every figure of its JSON line is there and positive.
#[test]
fn bench_mds_prints_every_figure() {
    let _shared = shared();
    let dir = std::env::temp_dir().join(format!("nacre-bench-mds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = nacre()
        .args(["bench", "mds", "--files", "400", "--clients", "4", "--rounds", "1", "--dir"])
        .arg(&dir)
        .arg("--local-dir")
        .arg(&dir)
        .arg("--durable-dir")
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let v = bench_figures(
        &out,
        &[
            "create_per_s",
            "stat_per_s",
            "unlink_per_s",
            "ping_per_s",
            "ping_beside_min_per_s",
            "ping_beside_max_per_s",
            "readdir_per_s",
            "dom_files_per_s",
            "local_create_per_s",
            "create_ratio",
            "unlink_ratio",
            "stat_vs_ping_ratio",
            "setattr_per_s",
            "rename_per_s",
            "mkdir_per_s",
            "rmdir_per_s",
            "create_vs_ping_ratio",
            "unlink_vs_ping_ratio",
            "mkdir_vs_ping_ratio",
            "rmdir_vs_ping_ratio",
            "rename_vs_ping_ratio",
            "setattr_vs_ping_ratio",
            "dom_files_vs_ping_ratio",
            "lock_unlock_pairs_per_s",
            "lock_unlock_pairs_vs_ping_ratio",
            "ping_cpu_us_per_rpc",
            "stat_cpu_us_per_rpc",
            "lock_unlock_pairs_cpu_us_per_rpc",
            "create_cpu_us_per_rpc",
            "dom_files_cpu_us_per_rpc",
            "dom_files_cpu_vs_ping_ratio",
            "lock_cpu_vs_ping_ratio",
            "mounted_lock_unlock_pairs_per_s",
            "mounted_lock_ping_per_s",
            "mounted_lock_unlock_pairs_vs_ping_ratio",
            "durable_create_ratio",
            "one_mdt_shared_create_per_s",
            "two_mdt_striped_create_per_s",
            "two_mdt_striped_unlink_per_s",
            "two_mdt_striped_stat_per_s",
            "two_mdt_striped_readdir_per_s",
            "two_mdt_striped_dom_files_per_s",
            "two_mdt_create_ratio",
            "two_mdt_unlink_ratio",
            "two_mdt_stat_ratio",
            "two_mdt_readdir_ratio",
            "two_mdt_dom_files_ratio",
            "cores",
        ],
    );
    // Through the client library a mount keeps its locks under the lease: its pairs
    // ask the MDS (almost) nothing once it does.
    let rpcs = v["mounted_lock_rpcs_per_pair"].as_f64().unwrap();
    assert!(rpcs < 0.5, "{rpcs} lock RPCs a pair through the client library");
}

/// The MDT engine bench at a small size: every figure of its JSON line is there and
/// positive (memory from the binary's counting allocator), and it leaves nothing behind
/// in the drives' folder or the reference's.
#[test]
fn bench_mdt_prints_every_figure_and_leaves_nothing() {
    let _shared = shared();
    let dir = scratch("bench-mdt", "drives");
    let local = scratch("bench-mdt", "local");
    let out = nacre()
        .args(["bench", "mdt", "--files", "200", "--threads", "2", "--rounds", "2", "--startup-files", "2000"])
        .arg("--dir")
        .arg(&dir)
        .arg("--local-dir")
        .arg(&local)
        .output()
        .unwrap();
    let left = |d: &std::path::Path| std::fs::read_dir(d).unwrap().count();
    let (left_dir, left_local) = (left(&dir), left(&local));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&local);
    let v = bench_figures(
        &out,
        &[
            "create_per_s",
            "stat_per_s",
            "rename_per_s",
            "unlink_per_s",
            "local_create_per_s",
            "local_stat_per_s",
            "local_rename_per_s",
            "local_unlink_per_s",
            "create_ratio",
            "stat_ratio",
            "rename_ratio",
            "unlink_ratio",
            "bytes_per_file",
            "name_bytes_avg",
            "startup_s",
            "startup_s_per_million_files",
            "startup_fill_per_s",
            "cores",
        ],
    );
    assert_eq!(v["memory_gauge"], "heap");
    assert_eq!((left_dir, left_local), (0, 0), "the bench left files behind");
}

/// The client library bench at a small size: every figure of its JSON line is there and
/// positive (its IO phases read back and check what they wrote).
#[test]
fn bench_client_prints_every_figure() {
    let _shared = shared();
    let dir = std::env::temp_dir().join(format!("nacre-bench-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = nacre()
        .args(["bench", "client", "--files", "200", "--clients", "2", "--rounds", "1", "--io-size", "2M", "--dir"])
        .arg(&dir)
        .arg("--local-dir")
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bench_figures(
        &out,
        &[
            "create_per_s",
            "stat_per_s",
            "unlink_per_s",
            "write_mib_s",
            "read_mib_s",
            "local_create_per_s",
            "local_unlink_per_s",
            "create_ratio",
            "unlink_ratio",
            "stat_ratio",
            "write_ratio",
            "read_ratio",
            "cores",
        ],
    );
}

/// The failover bench, short: the MDT moved by hand and back, a node's network failed, a
/// node killed and another stopped, under writers through the mount; every acknowledged file reads back, nothing
/// failed, the stopped node stepped down, no lease race ended with two writers, and the
/// bench's folder is gone.
#[test]
fn bench_failover_checks_every_acknowledged_file_and_leaves_nothing() {
    let _alone = ALONE.write().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("nacre-bench-failover-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = nacre()
        .args(["bench", "failover", "--settle", "1", "--writers", "2", "--races", "10", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(left.is_empty(), "the bench left {left:?}");
    let v = bench_figures(
        &out,
        &[
            "max_pause_s",
            "pause_over_moves_s",
            "pause_after_network_failure_s",
            "pause_after_kill_s",
            "pause_after_stop_s",
            "files_acknowledged",
        ],
    );
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!((v["lost_acknowledged"].as_u64(), v["errors"].as_u64()), (Some(0), Some(0)), "{v}");
    assert_eq!(v["stepped_down"], true, "{v}");
    assert_eq!((v["double_serve_races"].as_u64(), v["double_serve_failures"].as_u64()), (Some(10), Some(0)), "{v}");
    assert!(v["no_holder_races"].as_u64().is_some(), "{v}");
}

/// The storm bench, small: 150 clients mount one file system at once (more than the MGS
/// holds configuration polls for), every one of them mounted with no try failed, the
/// server's memory per client measured, the server idle while they idle, and the bench's
/// folder and server gone afterwards.
#[test]
fn bench_storm_mounts_every_client_and_leaves_nothing() {
    let _shared = shared();
    let dir = std::env::temp_dir().join(format!("nacre-bench-storm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = nacre().args(["bench", "storm", "--clients", "150", "--idle", "2", "--dir"]).arg(&dir).output().unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(left.is_empty(), "the bench left {left:?}");
    let v = bench_figures(&out, &["mount_s", "slowest_mount_s", "bytes_per_client", "idle_bytes_per_client"]);
    assert_eq!((v["clients"].as_u64(), v["mounted"].as_u64()), (Some(150), Some(150)), "{v}");
    assert_eq!((v["mount_failures"].as_u64(), v["failed_tries"].as_u64()), (Some(0), Some(0)), "{v}");
    // A mount's own share of the server is tens of KiB at most, never megabytes.
    assert!(v["bytes_per_client"].as_u64().unwrap() < 1 << 20, "{v}");
    // Idle mounts cost a ping now and then: a server kept busy means some mount polls in
    // a loop (they did, past the MGS's bound on held configuration polls).
    assert!(v["idle_server_cpu_cores"].as_f64().unwrap() < 0.5, "{v}");
}

/// More clients than descriptors allow: a clear error that names the limit, nothing made.
#[test]
fn bench_storm_refuses_more_clients_than_descriptors() {
    let _shared = shared();
    let dir = std::env::temp_dir().join(format!("nacre-bench-storm-many-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = nacre().args(["bench", "storm", "--clients", "1000000", "--dir"]).arg(&dir).output().unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("descriptors") && err.contains("routers"), "{err}");
    assert!(left.is_empty(), "the bench left {left:?}");
}
