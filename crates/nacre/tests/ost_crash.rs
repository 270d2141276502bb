//! Crash test of a target: a `nacre ost torture` child writes small (journaled) and large
//! (straight to chunks) pieces into objects on file drives, and grows small objects by
//! appends (fragments made, copied and moved into chunks), and is killed with SIGKILL
//! mid-flight, three times. After each kill the target opens again (replaying its journal),
//! `nacre ost check` finds it clean, and every acknowledged write reads back exactly.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nacre_bench::torture;
use nacre_osd::{Target, TargetOptions};
use nacre_raid::{Volume, VolumeOptions};

mod common;
use common::*;

fn open(dir: &std::path::Path) -> Target {
    let run = VolumeOptions::default();
    let data = Volume::assemble(drives_in(&dir.join("data")), Some("ost0"), &run).unwrap().volume;
    let meta = Volume::assemble(drives_in(&dir.join("index")), Some("ost0-index"), &run).unwrap().volume;
    Target::open(Arc::new(data), Arc::new(meta), TargetOptions::default()).unwrap()
}

#[test]
fn sigkill_mid_writes_then_every_acknowledged_write_reads_back_and_check_is_clean() {
    let seed = seed("ost crash test");
    let dir = std::env::temp_dir().join(format!("nacre-ost-crash-{}-{seed}", std::process::id()));
    let out = nacre()
        .args(["ost", "format", "--size", "96M", "--data-drives", "6", "--strip", "32K", "--index-size", "48M"])
        .arg("--dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "format failed: {}", String::from_utf8_lossy(&out.stderr));
    for round in 0..3u64 {
        let round_seed = seed.wrapping_add(round);
        let mut child = nacre()
            .args(["ost", "torture", "--threads", "3", "--seed", &round_seed.to_string()])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let seen = Arc::new(AtomicU64::new(0));
        let seen_by_reader = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut acked: Vec<(u64, u64, usize)> = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let f: Vec<&str> = line.split_whitespace().collect();
                if let ["ack", oid, off, len] = f.as_slice() {
                    acked.push((oid.parse().unwrap(), off.parse().unwrap(), len.parse().unwrap()));
                    seen_by_reader.fetch_add(1, Ordering::Relaxed);
                }
                // Anything else: "ready", or a line cut by the kill.
            }
            acked
        });
        let start = Instant::now();
        while seen.load(Ordering::Relaxed) < 30 {
            assert!(start.elapsed() < Duration::from_secs(120), "the writer acknowledged nothing for two minutes");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(round_seed % 300));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let acked = reader.join().unwrap();
        eprintln!("round {round}: {} writes acknowledged", acked.len());

        // The check runs on what the crash left (after the journal's replay).
        let out = nacre().args(["ost", "check"]).arg("--dir").arg(&dir).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("clean"), "seed {round_seed}: check after the kill: {text}");

        let t = open(&dir);
        for &(oid, off, len) in &acked {
            let want = torture::ost_bytes(round_seed, oid, off, len);
            let mut got = vec![0u8; len];
            let n = t.read(oid, off, &mut got).unwrap();
            assert_eq!(n, len, "seed {round_seed}: object {oid} is short at {off}");
            assert!(
                got == want,
                "seed {round_seed}: acknowledged write of {len} bytes at {off} of object {oid} reads back different"
            );
        }
        // Moving everything to the chunks and checking again: still clean, still the same.
        t.destage_all().unwrap();
        let report = t.check().unwrap();
        assert!(report.is_clean(), "seed {round_seed}: after destage: {:?}", report.problems);
        if let Some(&(oid, off, len)) = acked.last() {
            let mut got = vec![0u8; len];
            t.read(oid, off, &mut got).unwrap();
            assert!(got == torture::ost_bytes(round_seed, oid, off, len));
        }
        // Space for the next round: this round's objects go.
        let oids: std::collections::BTreeSet<u64> = acked.iter().map(|a| a.0).collect();
        for oid in oids {
            t.destroy(oid).unwrap();
        }
        assert!(t.check().unwrap().is_clean());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
