//! Failover pairs on one machine (`nacre up --ha`): node `a` serves MDT0 and OST0, node
//! `b` serves OST1, and each stands by for the other's targets on the same drive files.
//! Killing or stopping a node moves its targets to its partner under the lease on their
//! drives, and the mount carries on: programs see a pause, never an error, and every byte
//! written before reads back. Also the cluster file's checks of failover pairs.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Up, nacre};

fn up(name: &str) -> Up {
    Up::start_in(common::scratch("ha", name), &["--ha"])
}

fn pid_of(up: &Up, node: &str) -> i32 {
    fs::read_to_string(up.data.join(format!("nacre-{node}.pid"))).unwrap().trim().parse().unwrap()
}

fn log_of(up: &Up, node: &str) -> String {
    fs::read_to_string(up.data.join(format!("nacre-{node}.log"))).unwrap_or_default()
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on a process this test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal {sig} to {pid}");
}

fn alive(pid: i32) -> bool {
    !u32::try_from(pid).is_ok_and(nacre_raid::lease::process_gone)
}

/// Bytes of `n` that differ from file to file.
fn bytes(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Folders `d1`, `d2`, `d3` whose files stripe over both OSTs. Made before any node fails:
/// `setstripe` is a command of its own, not the mount, and does not wait out a failover.
fn striped_dirs(mnt: &Path) {
    for seed in 1..=3 {
        let dir = mnt.join(format!("d{seed}"));
        fs::create_dir(&dir).unwrap();
        let out = nacre().args(["setstripe", "-c", "-1", "-S", "1M"]).arg(&dir).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Files on every target of the pair, in folder `d{seed}` (see [`striped_dirs`]): small
/// ones (their bytes on the MDT) and large ones (striped over both OSTs), all fsync'd but
/// the last of each.
fn write_files(mnt: &Path, seed: u8) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let dir = mnt.join(format!("d{seed}"));
    let mut files = Vec::new();
    for (i, n) in [100, 5000, 3 << 20, 70_000, 2 << 20].into_iter().enumerate() {
        let (p, data) = (dir.join(format!("f{i}")), bytes(seed.wrapping_add(i as u8), n));
        let mut f = fs::File::create(&p).unwrap();
        f.write_all(&data).unwrap();
        if i < 4 {
            f.sync_all().unwrap();
        }
        files.push((p, data));
    }
    files
}

fn check_files(files: &[(std::path::PathBuf, Vec<u8>)]) {
    for (p, data) in files {
        let mut back = Vec::new();
        fs::File::open(p).unwrap().read_to_end(&mut back).unwrap();
        assert!(back == *data, "{}: {} bytes read back, {} written, or different", p.display(), back.len(), data.len());
    }
}

#[test]
fn a_killed_node_hands_its_targets_to_its_partner_and_the_mount_carries_on() {
    let up = up("kill");
    striped_dirs(&up.mnt);
    let before = write_files(&up.mnt, 1);
    // A descriptor open for writing across the failover.
    let held =
        fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(up.mnt.join("held")).unwrap();
    held.write_all_at(b"before the failover, ", 0).unwrap();

    let a = pid_of(&up, "a");
    signal(a, libc::SIGKILL);
    let started = Instant::now();
    // Right away, through the mount: a new file on the MDT that moved, and one on OST0.
    let after = write_files(&up.mnt, 2);
    let pause = started.elapsed();
    eprintln!("first changes after the kill took {pause:?}");
    check_files(&before);
    check_files(&after);
    held.write_all_at(b"and after", 21).unwrap();
    held.sync_all().unwrap();
    let mut back = String::new();
    fs::File::open(up.mnt.join("held")).unwrap().read_to_string(&mut back).unwrap();
    assert_eq!(back, "before the failover, and after");

    let log = log_of(&up, "b");
    for target in ["MDT0", "OST0"] {
        assert!(
            log.contains(&format!("{target}: lease taken (epoch 2; held by node a")),
            "{target} not taken over:\n{log}"
        );
        assert!(log.contains(&format!("{target}: served by node b")), "{log}");
    }
    // `nacre status` reads the leases from the drives, and the NIDs from the MGS: b holds
    // every target, MDT0 and OST0 at the epoch after a's, served at b's NIDs first.
    let out = nacre().args(["status", "--json", "--data"]).arg(&up.data).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let targets = status["targets"].as_array().unwrap();
    let row = |t: &str| targets.iter().find(|r| r["target"] == t).unwrap_or_else(|| panic!("{t} in {status}"));
    for (t, epoch) in [("MDT0", 2), ("OST0", 2), ("OST1", 1)] {
        let r = row(t);
        assert_eq!(
            (r["holder"].as_str(), r["lease"].as_str(), r["epoch"].as_u64()),
            (Some("b"), Some("held"), Some(epoch)),
            "{r}"
        );
    }
    // The targets that moved recovered (the mount came back to both: the writes above
    // waited for it); the status asks each at its NIDs.
    for t in ["MDT0", "OST0"] {
        assert_eq!(row(t)["recovery"], "COMPLETE", "{status}");
    }
    assert!(row("MGS")["recovery"].is_null(), "{status}");
    let mds_nids = row("MDT0")["nids"].as_str().unwrap().to_string();
    assert_eq!(mds_nids.split(',').count(), 2, "a's NID stays listed after b's: {mds_nids}");
    assert!(log.contains(&format!("MDT0: served by node b at {}", mds_nids.split(',').next().unwrap())), "{log}");

    // Node a comes back: its targets are b's now, so it stands by for them.
    let cluster = up.data.join("cluster.toml");
    let out = nacre().args(["server", "--config"]).arg(&cluster).args(["--node", "a"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("standing by for") && said.contains("MDT0") && said.contains("served by node b"), "{said}");
    check_files(&before);
    let again = write_files(&up.mnt, 3);
    check_files(&again);
}

/// Target `t`'s NIDs as `nacre status --json` has them from the MGS (active first).
fn nids_of(up: &Up, t: &str) -> String {
    let out = nacre().args(["status", "--json", "--data"]).arg(&up.data).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = status["targets"].as_array().unwrap().iter();
    rows.filter(|r| r["target"] == t).map(|r| r["nids"].as_str().unwrap_or_default().to_string()).collect()
}

#[test]
fn the_mgs_and_a_node_killed_together_move_to_the_partner_and_the_mount_finds_them() {
    let up = up("nomgs");
    // Fixed ports after the MGS's: a's (MDT0, OST0, OST1), then b's, then b's for the
    // MGS. Every target is listed at both its nodes before anything moves, its serving
    // node first.
    let nid = |port: u16| format!("127.0.0.1@tcp:{port}");
    let (a_port, b_port, b_mgs) = (up.port + 1, up.port + 4, up.port + 7);
    assert_eq!(nids_of(&up, "MDT0"), format!("{},{}", nid(a_port), nid(b_port)));
    assert_eq!(nids_of(&up, "OST0"), format!("{},{}", nid(a_port + 1), nid(b_port + 1)));
    assert_eq!(nids_of(&up, "OST1"), format!("{},{}", nid(b_port + 2), nid(a_port + 2)));
    assert_eq!(nids_of(&up, "MGS"), format!("{},{}", nid(up.port), nid(b_mgs)));
    striped_dirs(&up.mnt);
    let before = write_files(&up.mnt, 1);

    // The MGS's node and node a die at once: b takes the MGS, MDT0 and OST0 once their
    // leases expire, and the mount walks to b's NIDs on its own.
    signal(pid_of(&up, "mgs"), libc::SIGKILL);
    signal(pid_of(&up, "a"), libc::SIGKILL);
    let started = Instant::now();
    let after = write_files(&up.mnt, 2);
    eprintln!("first changes after the kill took {:?}", started.elapsed());
    check_files(&before);
    check_files(&after);
    let log = log_of(&up, "b");
    for (target, port) in [("MGS", b_mgs), ("MDT0", b_port), ("OST0", b_port + 1)] {
        assert!(log.contains(&format!("{target}: lease taken (epoch 2; held by node")), "{log}");
        assert!(log.contains(&format!("{target}: served by node b at {}", nid(port))), "{log}");
    }
    // b's targets registered with b's MGS: their NIDs first.
    let waited = Instant::now();
    while !nids_of(&up, "MDT0").starts_with(&nid(b_port)) && waited.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(nids_of(&up, "MDT0"), format!("{},{}", nid(b_port), nid(a_port)));
    assert_eq!(nids_of(&up, "OST0"), format!("{},{}", nid(b_port + 1), nid(a_port + 1)));
    assert_eq!(nids_of(&up, "MGS"), format!("{},{}", nid(b_mgs), nid(up.port)));
    assert_eq!(holders(&up)["MGS"], held_by("b", 2));

    // Parameters go to whichever of the MGS's NIDs answers: b's.
    let mgs = format!("{},{}", nid(up.port), nid(b_mgs));
    let out = nacre().args(["set-param", "-P", "--server", &mgs, "osc.*.checksums=0"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = nacre().args(["get-param", "--server", &mgs, "osc.*.checksums"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("osc.*.checksums=0"), "{out:?}");

    // A new mount names both MGS NIDs and finds the one that answers.
    let mnt2 = up.data.parent().unwrap().join("mnt2");
    fs::create_dir_all(&mnt2).unwrap();
    let out = nacre().args(["mount", "--mgs", &mgs]).arg(&mnt2).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen: Vec<_> = after.iter().map(|(p, d)| (mnt2.join(p.strip_prefix(&up.mnt).unwrap()), d.clone())).collect();
    check_files(&seen);
    let out = nacre().arg("umount").arg(&mnt2).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The MGS's node back: b serves the MGS now, so it stands by.
    let cluster = up.data.join("cluster.toml");
    let out = nacre().args(["server", "--config"]).arg(&cluster).args(["--node", "mgs"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("standing by for MGS"), "{said}");
    // And it takes the MGS back when asked: handed over on the drives, no expiry waited.
    let out = nacre().args(["failback", "MGS", "--data"]).arg(&up.data).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("MGS: moved from node b to node mgs in"), "{said}");
    assert_eq!(holders(&up)["MGS"], held_by("mgs", 3));
    assert_eq!(nids_of(&up, "MGS"), format!("{},{}", nid(up.port), nid(b_mgs)));
    let again = write_files(&up.mnt, 3);
    check_files(&before);
    check_files(&after);
    check_files(&again);
}

#[test]
fn a_stopped_node_is_taken_over_after_its_lease_expires_and_stands_by_when_it_wakes() {
    let up = up("stop");
    striped_dirs(&up.mnt);
    let before = write_files(&up.mnt, 1);
    let a = pid_of(&up, "a");
    signal(a, libc::SIGSTOP);
    // Its process lives, so b waits for the lease to expire before it takes over.
    let after = write_files(&up.mnt, 2);
    check_files(&before);
    check_files(&after);
    assert!(log_of(&up, "b").contains("MDT0: lease taken (epoch 2; held by node a, whose heartbeat stopped"));

    // Woken, a finds its leases gone: it writes nothing more to those targets, stops
    // serving them and stands by for them, alive, as a partner does.
    signal(a, libc::SIGCONT);
    for target in ["MDT0", "OST0"] {
        wait_log(&up, "a", &format!("{target}: served by node b; standing by"));
    }
    assert!(alive(a), "node a exited instead of standing by");
    let log = log_of(&up, "a");
    assert!(log.contains("node a lost its lease") && log.contains("stepping down"), "{log}");
    check_files(&before);
    check_files(&after);
    let again = write_files(&up.mnt, 3);
    check_files(&again);
}

/// A node that loses one target's lease (its heartbeats on that target's drives held
/// back past the expiry, as a stuck path to them would) steps down from that target
/// alone: its partner takes it, and the node goes on serving its other target. Every
/// byte written before reads back, and writes go on.
#[test]
fn a_node_that_loses_one_lease_steps_down_from_that_target_alone() {
    let up = up("one-lease");
    striped_dirs(&up.mnt);
    let before = write_files(&up.mnt, 1);
    let a = pid_of(&up, "a");
    let nids = nids_of(&up, "OST0");
    let ost0 = nids.split(',').next().unwrap().trim().to_string();
    // A bad value is refused, and changes nothing; then the stall.
    let (refused, why) = set_on(&ost0, "ha.lease_stall=forever");
    assert!(!refused && why.contains("not a number of seconds"), "{why}");
    let (ok, why) = set_on(&ost0, "ha.lease_stall=8");
    assert!(ok, "{why}");
    wait_log(&up, "a", "OST0: stepped down");
    wait_log(&up, "a", "OST0: served by node b; standing by");
    assert!(alive(a), "node a exited");
    let log = log_of(&up, "a");
    assert!(!log.contains("MDT0: node a lost its lease"), "{log}");
    let h = holders(&up);
    assert_eq!((h["MDT0"].0.as_str(), h["OST0"].0.as_str()), ("a", "b"), "{h:?}");
    check_files(&before);
    let after = write_files(&up.mnt, 2);
    check_files(&after);
}

/// A cluster file with a failover pair, on drive files in `data`.
fn cluster(dir: &Path, nodes: &str) -> std::path::PathBuf {
    let p = dir.join("cluster.toml");
    let data = dir.join("data");
    fs::create_dir_all(&data).unwrap();
    let port = common::free_port();
    let text = format!("fsname = \"ha\"\nmgs = \"127.0.0.1@tcp:{port}\"\n{nodes}")
        .replace("DATA", &data.display().to_string())
        .replace("MGSPORT", &port.to_string());
    fs::write(&p, text).unwrap();
    p
}

#[test]
fn failover_pairs_in_a_cluster_file_are_checked_before_anything_starts() {
    let dir = common::scratch("ha", "cluster");
    let node = |name: &str, more: &str| {
        format!("\n[[node]]\nname = \"{name}\"\nhost = \"127.0.0.1\"\ndata = \"DATA\"\n{more}\n")
    };
    let cases = [
        (
            node("m", "mgs = true\nmdts = [0]\nosts = [0]") + &node("b", "failover_osts = [1]"),
            "stands by for OST 1, which no node serves",
        ),
        (node("m", "mgs = true\nmdts = [0]\nosts = [0]\nfailover_osts = [0]"), "node m lists OST 0 twice"),
        (
            node("m", "mgs = true\nmdts = [0]\nosts = [0]") + &node("b", "failover_osts = [0, 0]"),
            "node b lists OST 0 twice",
        ),
        // Fixed ports: within range, and apart on one address.
        (
            node("m", "mgs = true\nport = 65535\nmdts = [0]\nosts = [0]"),
            "node m: port = 65535: the ports of its 2 targets must lie within 1 to 65535",
        ),
        (
            node("m", "mgs = true\nport = 20000\nmdts = [0]\nosts = [0]")
                + &node("b", "port = 20001\nfailover_osts = [0]"),
            "on 127.0.0.1, node m's ports 20000 to 20001 and node b's ports 20001 to 20002 overlap",
        ),
        (node("m", "mgs = true\nport = MGSPORT\nmdts = [0]\nosts = [0]"), "and node m's ports"),
        // The MGS: one NID per node that may serve it, on that node's host.
        (
            node("m", "mgs = true\nmdts = [0]\nosts = [0]") + &node("b", "failover_mgs = true"),
            "lists 1 NID(s) for 2 MGS node(s) (m, b): one each, in that order",
        ),
        (
            node("m", "mgs = true\nfailover_mgs = true\nmdts = [0]\nosts = [0]"),
            "node m serves the MGS and stands by for it too",
        ),
        (
            node("m", "mgs = true\nmdts = [0]\nosts = [0]").replace("127.0.0.1", "127.0.0.2"),
            "is not on node m's host 127.0.0.2",
        ),
        // b stands by for OST0, whose drives are not where b looks.
        (
            node("m", "mgs = true\nmdts = [0]\nosts = [0]") + &node("b", "failover_osts = [0]"),
            "node b cannot stand by for OST0",
        ),
    ];
    for (nodes, said) in cases {
        let c = cluster(&dir, &nodes);
        let node = if said.contains("cannot stand by") { "b" } else { "m" };
        // In the foreground, so that a file wrongly taken serves: killed after a minute.
        let mut child = nacre()
            .args(["server", "--foreground", "--config"])
            .arg(&c)
            .args(["--node", node])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(said), "{nodes}\n{err}");
        // Nothing was made for a refused file.
        assert!(fs::read_dir(dir.join("data")).unwrap().next().is_none(), "{nodes}");
    }
    let _ = fs::remove_dir_all(dir);
}

/// The holder of each target as `nacre status --json` reads it from the drives: (node,
/// lease state, epoch).
fn holders(up: &Up) -> std::collections::BTreeMap<String, (String, String, u64)> {
    let out = nacre().args(["status", "--json", "--data"]).arg(&up.data).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = status["targets"].as_array().unwrap().iter();
    rows.map(|r| {
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        (s("target"), (s("holder"), s("lease"), r["epoch"].as_u64().unwrap_or(0)))
    })
    .collect()
}

fn held_by(node: &str, epoch: u64) -> (String, String, u64) {
    (node.to_string(), "held".to_string(), epoch)
}

#[test]
fn an_operator_moves_a_target_and_back_while_the_mount_carries_on() {
    // Two MDTs on node a: MDT1 moves alone first, and MDT0 (still on a) reaches it on b.
    let up = Up::start_in(common::scratch("ha", "move"), &["--ha", "--mdts", "2"]);
    striped_dirs(&up.mnt);
    let before = write_files(&up.mnt, 1);
    let out = nacre().args(["mkdir", "-i", "1"]).arg(up.mnt.join("on1")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fs::write(up.mnt.join("on1/before"), b"made on MDT1 before it moved").unwrap();
    fs::write(up.mnt.join("d1/crossing"), b"from MDT0 to MDT1").unwrap();
    let held =
        fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(up.mnt.join("held")).unwrap();
    held.write_all_at(b"before the move, ", 0).unwrap();
    let move_ = |args: &[&str]| {
        let out = nacre().args(args).arg("--data").arg(&up.data).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // Bad requests name what is wrong and move nothing.
    let was = holders(&up);
    for (args, says) in [
        (&["failover", "MDT9"][..], "no target \"MDT9\" in the cluster file (it has MGS, MDT0, MDT1, OST0, OST1)"),
        (&["failover", "OST1", "--to", "c"][..], "OST1 can be served by b, a only, not by c"),
        (&["failover", "OST1", "--to", "b"][..], "OST1 is served by node b already"),
    ] {
        let (ok, _, err) = move_(args);
        assert!(!ok && err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(holders(&up), was);

    // MDT1 alone to b: operations over both MDTs (a rename from MDT0's folder into
    // MDT1's, a folder made on MDT1 from MDT0's root) go between the nodes.
    let (ok, out, err) = move_(&["failover", "MDT1", "--to", "b"]);
    assert!(ok && out.contains("MDT1: moved from node a to node b in"), "{out}\n{err}");
    fs::rename(up.mnt.join("d1/crossing"), up.mnt.join("on1/crossed")).unwrap();
    let out = nacre().args(["mkdir", "-i", "1"]).arg(up.mnt.join("on1-again")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fs::write(up.mnt.join("on1-again/after"), b"made on MDT1 on node b").unwrap();
    assert_eq!(fs::read(up.mnt.join("on1/crossed")).unwrap(), b"from MDT0 to MDT1");
    assert_eq!(fs::read(up.mnt.join("on1/before")).unwrap(), b"made on MDT1 before it moved");
    assert!(!up.mnt.join("d1/crossing").exists());
    let now = holders(&up);
    assert_eq!((&now["MDT0"], &now["MDT1"]), (&held_by("a", 1), &held_by("b", 2)));

    let (ok, out, err) = move_(&["failover", "mdt0"]);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("MDT0: asked node a to hand it to node b") && out.contains("MDT0: moved from node a to node b in"),
        "{out}"
    );
    assert!(out.contains("(epoch 2), served at "), "the command returns once the MGS lists the new NID: {out}");
    let after = write_files(&up.mnt, 2);
    check_files(&before);
    check_files(&after);
    let now = holders(&up);
    assert_eq!((&now["MDT0"], &now["OST0"], &now["OST1"]), (&held_by("b", 2), &held_by("a", 1), &held_by("b", 1)));
    let (a_log, b_log) = (log_of(&up, "a"), log_of(&up, "b"));
    assert!(
        a_log.contains("MDT0: moving to node b, as an operator asked") && a_log.contains("MDT0: handed to node b"),
        "{a_log}"
    );
    assert!(b_log.contains("MDT0: lease taken (epoch 2; handed by node a to node b)"), "{b_log}");
    assert!(b_log.contains("MDT0: served by node b"), "{b_log}");

    // Back to the primaries: only the MDTs are away from their own.
    let (ok, out, err) = move_(&["failback"]);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("MDT0: moved from node b to node a in")
            && out.contains("MDT1: moved from node b to node a in")
            && out.contains("OST1: on its primary node b already"),
        "{out}"
    );
    held.write_all_at(b"and after", 17).unwrap();
    held.sync_all().unwrap();
    let mut back = String::new();
    fs::File::open(up.mnt.join("held")).unwrap().read_to_string(&mut back).unwrap();
    assert_eq!(back, "before the move, and after");
    let now = holders(&up);
    assert_eq!(
        (&now["MDT0"], &now["MDT1"], &now["OST0"], &now["OST1"]),
        (&held_by("a", 3), &held_by("a", 3), &held_by("a", 1), &held_by("b", 1))
    );
    assert_eq!(fs::read(up.mnt.join("on1-again/after")).unwrap(), b"made on MDT1 on node b");
    fs::rename(up.mnt.join("on1/crossed"), up.mnt.join("d1/crossed-back")).unwrap();
    assert_eq!(fs::read(up.mnt.join("d1/crossed-back")).unwrap(), b"from MDT0 to MDT1");
    let again = write_files(&up.mnt, 3);
    check_files(&before);
    check_files(&after);
    check_files(&again);
    // Both nodes still run: a move is no failure.
    assert!(alive(pid_of(&up, "a")) && alive(pid_of(&up, "b")));
}

/// Set `setting` on the node serving `nid` (its services share the node's fault rules).
fn set_on(nid: &str, setting: &str) -> (bool, String) {
    let out = nacre().args(["set-param", "--server", nid, setting]).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Wait (at most 60 s) until node `node`'s log says `what`.
fn wait_log(up: &Up, node: &str, what: &str) -> Duration {
    let started = Instant::now();
    while !log_of(up, node).contains(what) {
        assert!(started.elapsed() < Duration::from_secs(60), "{node} never said {what:?}:\n{}", log_of(up, node));
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

/// A node whose process and lease live on while its network fails moves nothing by its
/// lease alone. Its partner, which finds its targets silent while the MGS answers, asks
/// for them through the drives; the holder moves them only if its own checks fail too.
#[test]
fn a_node_whose_network_fails_is_asked_for_its_targets_and_hands_them_over() {
    let up = up("silent");
    striped_dirs(&up.mnt);
    let before = write_files(&up.mnt, 1);
    let first = |nids: String| nids.split(',').next().unwrap_or_default().to_string();
    let (mdt0_at_a, ost1_at_b) = (first(nids_of(&up, "MDT0")), first(nids_of(&up, "OST1")));

    // Bad rules are refused, named, and change nothing.
    let (ok, err) = set_on(&mdt0_at_a, "net.fault_rules=explode");
    assert!(!ok && err.contains("unknown action \"explode\""), "{err}");
    let (ok, err) = set_on(&mdt0_at_a, "net.fault_rules=del 99");
    assert!(!ok && err.contains("no rule \"99\""), "{err}");

    // Only b's view of MDT0 breaks: b asks, a checks itself, finds nothing wrong and stays.
    let (ok, err) = set_on(&ost1_at_b, &format!("net.fault_rules=drop to={mdt0_at_a}"));
    assert!(ok, "{err}");
    let out = nacre().args(["get-param", "--server", &ost1_at_b, "net.fault_rules"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("net.fault_rules=1: drop to={mdt0_at_a}"));
    wait_log(&up, "b", "MDT0: node a holds it but it does not answer at");
    wait_log(&up, "a", "MDT0: node b cannot reach it, but it answers here and the MGS answers this node: staying");
    assert_eq!(holders(&up)["MDT0"], held_by("a", 1));
    let (ok, err) = set_on(&ost1_at_b, "net.fault_rules=clear");
    assert!(ok, "{err}");

    // a's network fails whole: nothing it sends arrives but connects and parameters (the
    // test's way in). b asks for MDT0 and OST0; a cannot reach itself or the MGS either,
    // and hands both over, alive, its leases never lost.
    let (ok, err) = set_on(&mdt0_at_a, "net.fault_rules=drop except=1,200,201");
    assert!(ok, "{err}");
    let started = Instant::now();
    let after = write_files(&up.mnt, 2);
    eprintln!("first changes after a's network failed took {:?}", started.elapsed());
    check_files(&before);
    check_files(&after);
    let now = holders(&up);
    assert_eq!((&now["MDT0"], &now["OST0"], &now["OST1"]), (&held_by("b", 2), &held_by("b", 2), &held_by("b", 1)));
    let a_log = log_of(&up, "a");
    for t in ["MDT0", "OST0"] {
        assert!(a_log.contains(&format!("{t}: node b cannot reach it, and it does not answer at ")), "{a_log}");
        assert!(a_log.contains(&format!("{t}: handed to node b")), "{a_log}");
    }
    assert!(alive(pid_of(&up, "a")), "a hands over, it is not fenced:\n{a_log}");
    assert!(!a_log.contains("lost its lease"), "{a_log}");
}
