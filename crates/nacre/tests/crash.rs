//! Crash test: a `nacre raid torture` child writes a seeded pattern over a RAID6 volume on
//! file drives and is killed with SIGKILL mid-flight. Assembling the drives again must
//! resync the write-intent regions, after which scrub finds no parity mismatch and every
//! acknowledged write reads back (the one write per thread that was in flight may show
//! old or new bytes, nothing else).

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nacre_bench::torture;
use nacre_raid::{Volume, VolumeOptions};

mod common;
use common::*;

#[test]
fn sigkill_mid_write_then_assemble_scrub_and_verify() {
    let seed = seed("crash test");
    let tmp = std::env::temp_dir().join(format!("nacre-crash-{}-{seed}", std::process::id()));
    let dir = tmp.join("drives");
    let out = nacre()
        .args(["raid", "create", "--name", "crash", "--level", "6", "--strip", "16K", "--count", "6", "--size", "9M"])
        .arg("--dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "create failed: {}", String::from_utf8_lossy(&out.stderr));

    for round in 0..3u64 {
        let round_seed = seed.wrapping_add(round);
        let threads = 3u64;
        let mut child = nacre()
            .args(["raid", "torture", "--name", "crash", "--threads", "3", "--seed", &round_seed.to_string()])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen_by_reader = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut acked = vec![None::<u64>; threads as usize];
            let mut geometry = None;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let f: Vec<&str> = line.split_whitespace().collect();
                match f.as_slice() {
                    ["ready", cap, stripe] => {
                        geometry = Some((cap.parse::<u64>().unwrap(), stripe.parse::<u64>().unwrap()))
                    }
                    ["ack", t, seq] => {
                        acked[t.parse::<usize>().unwrap()] = Some(seq.parse().unwrap());
                        seen_by_reader.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    _ => {} // a line cut by the kill
                }
            }
            (geometry, acked)
        });
        // Let it get going (however slow the machine), then kill it at a random moment.
        let start = Instant::now();
        while seen.load(std::sync::atomic::Ordering::Relaxed) < 50 {
            assert!(start.elapsed() < Duration::from_secs(120), "the writer acknowledged nothing for two minutes");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(round_seed % 500));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let (geometry, acked) = reader.join().unwrap();
        let (cap, stripe) = geometry.expect("torture never became ready");
        let total: u64 = acked.iter().map(|a| a.map_or(0, |s| s + 1)).sum();
        eprintln!("round {round}: {total} writes acknowledged in {:?}", start.elapsed());
        assert!(total >= 10, "too few writes before the kill to test anything");

        let asm = Volume::assemble(drives_in(&dir), Some("crash"), &VolumeOptions::default()).unwrap();
        assert!(asm.refused.is_empty(), "refused: {:?}", asm.refused);
        assert!(asm.resynced_stripes > 0, "a killed writer must leave dirty regions to resync");
        let v = asm.volume;
        let report = v.scrub(false, |_, _| {}).unwrap();
        assert_eq!(report.mismatches, 0, "seed {round_seed}: parity mismatch after crash and resync");

        // Replay each thread's writes from the seed. Bytes of acknowledged writes must be
        // exact; the write in flight may have landed in part.
        for t in 0..threads {
            let (base, per) = torture::region(cap, threads, t);
            let mut image = vec![0u8; per as usize];
            v.read(base, &mut image).unwrap();
            // Expected: what the previous rounds left (read now from a replay of all rounds
            // is costly), so compare only the bytes this round's acknowledged writes own.
            let mut owner = vec![None::<usize>; per as usize];
            let mut ops = Vec::new();
            let last = acked[t as usize];
            let upto = last.map_or(0, |s| s + 1);
            for seq in 0..=upto {
                let (off, data) = torture::op(round_seed, cap, threads, t, seq, stripe);
                let idx = ops.len();
                let from = (off - base) as usize;
                for o in &mut owner[from..from + data.len()] {
                    *o = Some(idx);
                }
                ops.push((from, data, seq));
            }
            for (i, got) in image.iter().enumerate() {
                let Some(idx) = owner[i] else { continue };
                let (from, data, seq) = &ops[idx];
                let want = data[i - from];
                if Some(*seq) <= last {
                    assert_eq!(
                        *got,
                        want,
                        "seed {round_seed}: thread {t} byte {} of acknowledged write {seq}",
                        base + i as u64
                    );
                } else {
                    // In flight: either its new byte or whatever an earlier write left.
                    let older = ops[..idx].iter().rev().find(|(f, d, _)| i >= *f && i < f + d.len());
                    let ok = *got == want || older.is_some_and(|(f, d, _)| d[i - f] == *got) || older.is_none();
                    assert!(
                        ok,
                        "seed {round_seed}: thread {t} byte {} holds neither old nor new data",
                        base + i as u64
                    );
                }
            }
        }
        v.close().unwrap();
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
