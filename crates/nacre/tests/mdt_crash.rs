//! Crash test of a metadata target: a `nacre mdt torture` child runs creates, mkdirs,
//! renames (over existing files too), unlinks, rmdirs and truncates from four threads,
//! each in its own directory, and is killed with SIGKILL mid-flight, three times. After
//! each kill the namespace opens again (replaying its redo log) and every thread's
//! directory is exactly the model after its acknowledged operations, or after one more
//! (the one in flight): nothing acknowledged is lost, no operation is half done. No inode
//! is leaked: the namespace holds exactly the root, the thread directories and their
//! entries. The writer checkpoints every 2 ms, so kills land inside checkpoints too.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nacre_bench::torture::MdtModel;
use nacre_proto::fid::Fid;
use nacre_proto::mdt::mode;
use nacre_raid::{Volume, VolumeOptions};
use nacre_server::mdt::{Cred, Namespace, NamespaceOptions};

mod common;
use common::*;

fn open(dir: &std::path::Path) -> Namespace {
    let vol = Volume::assemble(drives_in(dir), Some("mdt0"), &VolumeOptions::default()).unwrap().volume;
    Namespace::open(Arc::new(vol), NamespaceOptions::default()).unwrap()
}

/// A directory's entries as the model keeps them: name → (directory?, size).
fn listing(ns: &Namespace, dir: Fid) -> std::collections::BTreeMap<String, (bool, u64)> {
    let mut out = std::collections::BTreeMap::new();
    let mut cookie = 0;
    loop {
        let (entries, eof) = ns.readdir(&Cred::root(), dir, cookie, 100).unwrap();
        for (e, a) in entries {
            cookie = e.cookie;
            out.insert(e.name, (mode::is_dir(a.mode), if mode::is_dir(a.mode) { 0 } else { a.size }));
        }
        if eof {
            return out;
        }
    }
}

const THREADS: u64 = 4;

#[test]
fn sigkill_mid_operations_then_every_acknowledged_one_is_there_and_nothing_is_half_done() {
    let seed = seed("mdt crash test");
    let dir = std::env::temp_dir().join(format!("nacre-mdt-crash-{}-{seed}", std::process::id()));
    let out = nacre().args(["mdt", "format", "--size", "64M"]).arg("--dir").arg(&dir).output().unwrap();
    assert!(out.status.success(), "format failed: {}", String::from_utf8_lossy(&out.stderr));
    // Every round's directories, with the operations acknowledged in each.
    let mut rounds: Vec<(String, Vec<u64>)> = Vec::new();
    for round in 0..3u64 {
        let prefix = format!("r{round}");
        let mut child = nacre()
            .args([
                "mdt",
                "torture",
                "--threads",
                &THREADS.to_string(),
                "--seed",
                &seed.to_string(),
                "--prefix",
                &prefix,
                // Checkpoints back to back: the kill often lands inside one.
                "--checkpoint-ms",
                "2",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let seen = Arc::new(AtomicU64::new(0));
        let seen_by_reader = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut acked = vec![0u64; THREADS as usize];
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let f: Vec<&str> = line.split_whitespace().collect();
                match f.as_slice() {
                    ["ack", t, k] => {
                        let (t, k): (usize, u64) = (t.parse().unwrap(), k.parse().unwrap());
                        assert_eq!(k, acked[t], "acknowledgements of thread {t} out of order");
                        acked[t] = k + 1;
                        seen_by_reader.fetch_add(1, Ordering::Relaxed);
                    }
                    ["failed", ..] => panic!("the torture writer failed: {line}"),
                    _ => {}
                }
            }
            acked
        });
        let start = Instant::now();
        let want = 1000 + 1500 * round;
        while seen.load(Ordering::Relaxed) < want {
            assert!(start.elapsed() < Duration::from_secs(120), "the writer acknowledged too little in two minutes");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let acked = reader.join().unwrap();
        rounds.push((prefix, acked));
        // Reopen: every round so far is as acknowledged.
        let ns = open(&dir);
        let mut entries = 0u64;
        for (prefix, acked) in &rounds {
            for t in 0..THREADS {
                let d = ns.lookup(&Cred::root(), Fid::ROOT, &format!("{prefix}-t{t}")).unwrap();
                let got = listing(&ns, d.fid);
                let n = acked[t as usize];
                let (at_n, at_next) = (MdtModel::after(seed, t, n), MdtModel::after(seed, t, n + 1));
                assert!(
                    got == at_n.entries || got == at_next.entries,
                    "round {round}, {prefix}-t{t}: directory matches neither {n} nor {} operations\n got {got:?}\n want {:?}",
                    n + 1,
                    at_n.entries
                );
                entries += got.len() as u64;
            }
        }
        let dirs = rounds.len() as u64 * THREADS;
        assert_eq!(ns.statfs().unwrap().inodes, 1 + dirs + entries, "inodes leaked or lost");
        // What landed of the operation in flight stays: count it for the next rounds.
        for (prefix, acked) in rounds.iter_mut() {
            for t in 0..THREADS {
                let d = ns.lookup(&Cred::root(), Fid::ROOT, &format!("{prefix}-t{t}")).unwrap();
                if listing(&ns, d.fid) != MdtModel::after(seed, t, acked[t as usize]).entries {
                    acked[t as usize] += 1;
                }
            }
        }
        eprintln!("round {round}: {} operations acknowledged", rounds.last().unwrap().1.iter().sum::<u64>());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
