//! Volume behaviour against a byte-array model: every level, failures, plans, scrub,
//! assembly. Randomized tests print their seed.

mod common;

use std::sync::Arc;

use common::*;
use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, RaidError, SlotState, Volume, VolumeState};

const MIB: u64 = 1 << 20;

/// Shapes covering every level and a few odd geometries.
fn shapes() -> Vec<(Level, usize, Option<usize>, u64)> {
    vec![
        (Level::Raid0, 3, None, 4096),
        (Level::Raid1, 2, None, 16384),
        (Level::Raid1, 3, None, 4096),
        (Level::Raid10, 4, None, 16384),
        (Level::Raid10, 6, Some(3), 8192),
        (Level::Raid5, 3, None, 8192),
        (Level::Raid5, 5, None, 65536),
        (Level::Raid6, 4, None, 4096),
        (Level::Raid6, 10, None, 131072),
        (Level::Raid50, 6, Some(3), 8192),
        (Level::Raid60, 8, Some(4), 4096),
        (Level::Ec { n: 4, m: 3 }, 7, None, 8192),
        (Level::Ec { n: 5, m: 4 }, 9, None, 4096),
        (Level::Ec { n: 1, m: 2 }, 3, None, 4096),
    ]
}

fn check_all(v: &Volume, model: &[u8]) {
    let mut got = vec![0u8; model.len()];
    v.read(0, &mut got).expect("read whole volume");
    assert!(got == model, "volume differs from the model");
}

fn random_writes(v: &Volume, model: &mut [u8], rng: &mut Rng, n: usize) {
    let cap = model.len() as u64;
    let stripe = v.geometry().stripe_data_bytes();
    for _ in 0..n {
        let (off, len) = match rng.below(4) {
            // full stripes
            0 => {
                let s = rng.below(cap / stripe);
                let count = 1 + rng.below(3.min(cap / stripe - s));
                (s * stripe, (count * stripe) as usize)
            }
            // sector aligned
            1 => {
                let off = rng.below(cap / 4096) * 4096;
                (off, (4096 * (1 + rng.below(8))).min(cap - off) as usize)
            }
            // anything
            _ => {
                let off = rng.below(cap);
                (off, (1 + rng.below(3 * stripe)).min(cap - off) as usize)
            }
        };
        let data = rng.bytes(len);
        v.write(off, &data).expect("write");
        model[off as usize..off as usize + len].copy_from_slice(&data);
        // Spot-check a random read too.
        let roff = rng.below(cap);
        let rlen = (1 + rng.below(2 * stripe)).min(cap - roff) as usize;
        let mut got = vec![0u8; rlen];
        v.read(roff, &mut got).expect("read");
        assert!(got[..] == model[roff as usize..roff as usize + rlen], "read at {roff}+{rlen} differs");
    }
}

#[test]
fn every_level_round_trips() {
    let mut rng = Rng::new(seed("every_level_round_trips"));
    for (level, n, group, strip) in shapes() {
        let (v, _drives) = mem_volume(level, n, group, strip, 2 * MIB);
        let mut model = vec![0u8; v.capacity() as usize];
        random_writes(&v, &mut model, &mut rng, 40);
        check_all(&v, &model);
        assert_eq!(v.scrub(false, |_, _| {}).unwrap().mismatches, 0, "level {level}: parity mismatch");
    }
}

/// All ways of choosing `r` of `n`.
fn combinations(n: usize, r: usize) -> Vec<Vec<usize>> {
    if r == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for first in 0..n {
        for mut rest in combinations(n - first - 1, r - 1) {
            rest.iter_mut().for_each(|x| *x += first + 1);
            rest.insert(0, first);
            out.push(rest);
        }
    }
    out
}

#[test]
fn losing_any_m_drives_keeps_data_and_m_plus_one_goes_offline() {
    let mut rng = Rng::new(seed("losing_any_m_drives"));
    for (level, n, group, strip) in shapes() {
        let g = mem_volume(level, n, group, strip, 2 * MIB).0.geometry();
        let model = rng.bytes(g.capacity() as usize);
        // Failures within the first group are the hard case (they share stripes). A drive
        // that returned an error stays failed, so each combination gets a fresh volume.
        for lost in combinations(g.width(), g.m) {
            let (v, drives) = mem_volume(level, n, group, strip, 2 * MIB);
            v.write(0, &model).unwrap();
            for &x in &lost {
                drives[x].set_failed(true);
            }
            check_all(&v, &model);
            let failed = v.status().drives.iter().filter(|d| d.state == SlotState::Failed).count();
            assert_eq!(failed, lost.len(), "level {level}: drives that returned errors are marked failed");
        }
        // Fresh volume, fail M drives by IO error, write while degraded, then one more.
        let (v, drives) = mem_volume(level, n, group, strip, 2 * MIB);
        let mut model = vec![0u8; v.capacity() as usize];
        random_writes(&v, &mut model, &mut rng, 5);
        for d in &drives[..g.m] {
            d.set_failed(true);
        }
        random_writes(&v, &mut model, &mut rng, 10);
        check_all(&v, &model);
        if g.m > 0 {
            assert!(matches!(v.status().state, VolumeState::Degraded), "level {level} should be degraded");
        }
        drives[g.m].set_failed(true);
        let mut buf = vec![0u8; v.capacity() as usize];
        match v.read(0, &mut buf) {
            Err(RaidError::Offline { .. }) => {}
            other => panic!("level {level}: losing m+1 drives must give Offline, got {other:?}"),
        }
        assert!(matches!(v.write(0, &[1u8; 4096]), Err(RaidError::Offline { .. })));
    }
}

#[test]
fn full_stripe_writes_never_read() {
    let (v, _d) = mem_volume(Level::Raid6, 10, None, 131072, 8 * MIB);
    let stripe = v.geometry().stripe_data_bytes() as usize;
    let data = vec![7u8; 4 * stripe];
    let before = v.stats();
    v.write(stripe as u64, &data).unwrap();
    let after = v.stats();
    assert_eq!(after.drive_reads, before.drive_reads, "full-stripe writes read from drives");
    assert_eq!(after.full_stripe_writes - before.full_stripe_writes, 4);
    assert_eq!(after.drive_writes - before.drive_writes, 40);
}

#[test]
fn partial_writes_pick_the_plan_with_fewer_reads() {
    let (v, _d) = mem_volume(Level::Raid6, 10, None, 65536, 8 * MIB);
    let strip = 65536usize;
    // One strip of eight: read-modify-write reads 1 + 2, reconstruct-write would read 7.
    let s0 = v.stats();
    v.write(0, &vec![1u8; strip]).unwrap();
    let s1 = v.stats();
    assert_eq!(s1.rmw_writes - s0.rmw_writes, 1);
    assert_eq!(s1.drive_reads - s0.drive_reads, 3);
    // Seven strips of eight: reconstruct-write reads 1, read-modify-write would read 9.
    v.write(0, &vec![2u8; 7 * strip]).unwrap();
    let s2 = v.stats();
    assert_eq!(s2.rcw_writes - s1.rcw_writes, 1);
    assert_eq!(s2.drive_reads - s1.drive_reads, 1);
    let mut back = vec![0u8; 8 * strip];
    v.read(0, &mut back).unwrap();
    assert!(back[..7 * strip].iter().all(|&b| b == 2) && back[7 * strip..].iter().all(|&b| b == 0));
    // Mirrors: an aligned write needs no read at all.
    let (m, _d) = mem_volume(Level::Raid10, 4, None, 16384, 4 * MIB);
    let s0 = m.stats();
    m.write(4096, &[9u8; 8192]).unwrap();
    assert_eq!(m.stats().drive_reads - s0.drive_reads, 0);
}

#[test]
fn model_based_random_io_with_failures_and_replacements() {
    let seed = seed("model_based_random_io");
    let mut rng = Rng::new(seed);
    for (level, n, group, strip) in
        [(Level::Raid6, 6, None, 8192), (Level::Raid60, 8, Some(4), 4096), (Level::Ec { n: 3, m: 3 }, 6, None, 4096)]
    {
        let (v, mut drives) = mem_volume(level, n, group, strip, 2 * MIB);
        let g = v.geometry();
        let mut model = vec![0u8; v.capacity() as usize];
        let mut spare = 0;
        let mut armed: Vec<usize> = Vec::new();
        // Can the volume lose `slot` too, counting drives already gone and faults armed?
        let affordable = |v: &Volume, armed: &[usize], slot: usize| {
            let mut gone: Vec<usize> =
                v.status().drives.iter().filter(|d| d.state != SlotState::Online).map(|d| d.slot).collect();
            gone.extend(armed.iter().copied());
            gone.push(slot);
            gone.sort();
            gone.dedup();
            gone.len() <= g.m
        };
        for step in 0..60 {
            match rng.below(10) {
                0 => {
                    // Fail a drive by command, if the volume can take it with the armed ones.
                    let slot = rng.below(n as u64) as usize;
                    if affordable(&v, &armed, slot) {
                        let _ = v.fail_drive(slot);
                    }
                }
                1 => {
                    // A drive starts returning IO errors after a few more writes, if the
                    // volume can afford one more loss counting those already armed.
                    let slot = rng.below(n as u64) as usize;
                    if affordable(&v, &armed, slot) {
                        drives[slot].fail_after_writes(rng.below(5) as i64);
                        armed.push(slot);
                    }
                }
                2 => {
                    // Replace a failed drive and let the rebuild run alongside IO.
                    let st = v.status();
                    if let Some(d) = st.drives.iter().find(|d| d.state == SlotState::Failed)
                        && st.rebuild.is_none()
                    {
                        spare += 1;
                        let fresh = MemDrive::new(&format!("spare{spare}"), 2 * MIB);
                        v.replace_drive(d.slot, fresh.clone() as Arc<dyn BlockDevice>).expect("replace");
                        drives[d.slot] = fresh;
                        armed.retain(|&a| a != d.slot);
                        if rng.below(2) == 0 {
                            v.wait_rebuild();
                        }
                    }
                }
                _ => random_writes(&v, &mut model, &mut rng, 3),
            }
            if step % 10 == 9 {
                check_all(&v, &model);
            }
        }
        // Disarm pending faults, finish any rebuild, and the volume must be whole.
        for d in &drives {
            d.fail_after_writes(-1);
        }
        v.wait_rebuild();
        check_all(&v, &model);
        let report = v.scrub(false, |_, _| {}).unwrap();
        assert_eq!(report.mismatches, 0, "seed {seed}: parity mismatch after random IO");
    }
}

#[test]
fn rebuild_restores_a_replaced_drive() {
    let mut rng = Rng::new(seed("rebuild_restores"));
    let (v, drives) = mem_volume(Level::Raid6, 6, None, 16384, 4 * MIB);
    let mut model = vec![0u8; v.capacity() as usize];
    random_writes(&v, &mut model, &mut rng, 30);
    v.fail_drive(2).unwrap();
    assert!(matches!(v.fail_drive(2), Err(RaidError::WrongDriveState { .. })));
    random_writes(&v, &mut model, &mut rng, 10);
    let fresh = MemDrive::new("new2", 4 * MIB);
    v.replace_drive(2, fresh.clone() as Arc<dyn BlockDevice>).unwrap();
    random_writes(&v, &mut model, &mut rng, 10);
    v.wait_rebuild();
    assert_eq!(v.status().state, VolumeState::Optimal);
    // With the rebuilt drive in and two others gone, everything must still be there.
    drives[0].set_failed(true);
    drives[1].set_failed(true);
    check_all(&v, &model);
}

#[test]
fn scrub_finds_and_repairs_mismatches() {
    let mut rng = Rng::new(seed("scrub"));
    let (v, drives) = mem_volume(Level::Raid5, 4, None, 4096, 2 * MIB);
    let mut model = vec![0u8; v.capacity() as usize];
    random_writes(&v, &mut model, &mut rng, 30);
    // Corrupt drive 3 behind the engine's back, in two rows.
    drives[3].corrupt(MIB + 4096 * 5, 100);
    drives[3].corrupt(MIB + 4096 * 40, 1);
    let r = v.scrub(false, |_, _| {}).unwrap();
    assert_eq!(r.mismatches, 2);
    assert_eq!(r.repaired, 0);
    let r = v.scrub(true, |_, _| {}).unwrap();
    assert_eq!((r.mismatches, r.repaired), (2, 2));
    assert_eq!(v.scrub(false, |_, _| {}).unwrap().mismatches, 0);
}

#[test]
fn assemble_finds_volumes_and_refuses_stale_and_foreign_drives() {
    let mut rng = Rng::new(seed("assemble"));
    let a = mem_drives("a", 6, 2 * MIB);
    let b = mem_drives("b", 4, 2 * MIB);
    let mut oa = CreateOptions::new("alpha", Level::Raid6);
    oa.strip_bytes = 8192;
    oa.assume_clean = true;
    let va = Volume::create(as_devices(&a), &oa, &small_opts()).unwrap();
    let mut ob = CreateOptions::new("beta", Level::Raid10);
    ob.strip_bytes = 4096;
    ob.assume_clean = true;
    let vb = Volume::create(as_devices(&b), &ob, &small_opts()).unwrap();
    let mut model = vec![0u8; va.capacity() as usize];
    random_writes(&va, &mut model, &mut rng, 20);
    va.fail_drive(4).unwrap();
    random_writes(&va, &mut model, &mut rng, 5);
    va.close().unwrap();
    vb.close().unwrap();

    // All drives of both volumes, shuffled.
    let mut all = as_devices(&a);
    all.extend(as_devices(&b));
    all.reverse();
    assert!(matches!(Volume::assemble(all.clone(), None, &small_opts()), Err(RaidError::AmbiguousVolume(_))));
    assert!(matches!(Volume::assemble(all.clone(), Some("gamma"), &small_opts()), Err(RaidError::NoSuchVolume(_))));
    let asm = Volume::assemble(all, Some("alpha"), &small_opts()).unwrap();
    let stale: Vec<_> = asm.refused.iter().filter(|e| matches!(e, RaidError::StaleDrive { .. })).collect();
    let foreign: Vec<_> = asm.refused.iter().filter(|e| matches!(e, RaidError::ForeignDrive { .. })).collect();
    assert_eq!(stale.len(), 1, "refused: {:?}", asm.refused);
    assert!(stale[0].to_string().contains("mem:a4"), "{}", stale[0]);
    assert_eq!(foreign.len(), 4);
    assert!(foreign[0].to_string().contains("belongs to volume 'beta'"));
    let v = asm.volume;
    assert_eq!(v.status().state, VolumeState::Degraded);
    check_all(&v, &model);
    // A replaced drive's old disk is stale forever after.
    let fresh = MemDrive::new("a4new", 2 * MIB);
    v.replace_drive(4, fresh.clone() as Arc<dyn BlockDevice>).unwrap();
    v.wait_rebuild();
    v.close().unwrap();
    let mut again = as_devices(&a);
    again.push(fresh as Arc<dyn BlockDevice>);
    let asm = Volume::assemble(again, Some("alpha"), &small_opts()).unwrap();
    assert_eq!(asm.volume.status().state, VolumeState::Optimal);
    assert_eq!(asm.refused.len(), 1);
    assert!(asm.refused[0].to_string().contains("now holds another drive"), "{}", asm.refused[0]);
    check_all(&asm.volume, &model);
}

#[test]
fn write_intent_log_resyncs_only_dirty_regions() {
    let drives = mem_drives("w", 4, 4 * MIB);
    let mut o = CreateOptions::new("wil", Level::Raid5);
    o.strip_bytes = 4096;
    o.assume_clean = true;
    o.wil_region_bytes = 3 * 4096 * 16; // 16 stripes per region
    let mut run = small_opts();
    run.wil_clean_interval = std::time::Duration::from_secs(3600);
    let v = Volume::create(as_devices(&drives), &o, &run).unwrap();
    let region_bytes = 3 * 4096 * 16u64;
    // Region 0 and 5 written (left dirty by the "crash"), region 9 written and cleaned before.
    v.write(9 * region_bytes, &[3u8; 4096]).unwrap();
    v.flush().unwrap();
    v.close().unwrap();
    let v = Volume::assemble(as_devices(&drives), Some("wil"), &run).unwrap().volume;
    v.write(0, &[1u8; 5000]).unwrap();
    v.write(5 * region_bytes + 4096, &[2u8; 100]).unwrap();
    assert_eq!(v.status().dirty_regions, 2);
    v.halt_without_cleanup();
    // Break parity in region 0 (dirty) and region 9 (clean): only the first is resynced.
    let parity_drive_row0 = 3; // left-symmetric RAID5 over 4: row 0 parity on drive 3
    drives[parity_drive_row0].corrupt(MIB, 10);
    let row_region9 = 9 * 16; // rows == stripes for one group
    let pd = 3 - (row_region9 % 4) as usize;
    drives[pd].corrupt(MIB + row_region9 * 4096, 10);
    let asm = Volume::assemble(as_devices(&drives), Some("wil"), &run).unwrap();
    assert_eq!(asm.resynced_stripes, 32, "exactly the two dirty regions are resynced");
    let r = asm.volume.scrub(false, |_, _| {}).unwrap();
    assert_eq!(r.mismatches, 1, "the clean region keeps its (injected) mismatch: it was not resynced");
    let mut b = vec![0u8; 5000];
    asm.volume.read(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 1));
}

#[test]
fn assembly_refuses_an_offline_volume_and_writes_nothing() {
    let mut rng = Rng::new(seed("assembly_refuses_offline"));
    let (v, drives) = mem_volume(Level::Raid6, 6, None, 8192, 2 * MIB);
    let mut model = vec![0u8; v.capacity() as usize];
    random_writes(&v, &mut model, &mut rng, 10);
    v.close().unwrap();
    let gen_before = nacre_raid::volume::read_superblock(drives[0].as_ref()).unwrap().generation;
    // Three of six drives listed: RAID6 needs four.
    let some = as_devices(&drives[..3]);
    match Volume::assemble(some, Some("t"), &small_opts()) {
        Err(RaidError::Offline { reason, .. }) => assert!(reason.contains("nothing was written"), "{reason}"),
        Err(e) => panic!("expected Offline, got {e}"),
        Ok(_) => panic!("expected Offline, got a volume"),
    }
    assert_eq!(nacre_raid::volume::read_superblock(drives[0].as_ref()).unwrap().generation, gen_before);
    // With every drive back, nothing is stale and nothing is degraded.
    let asm = Volume::assemble(as_devices(&drives), Some("t"), &small_opts()).unwrap();
    assert!(asm.refused.is_empty(), "{:?}", asm.refused);
    assert_eq!(asm.volume.status().state, VolumeState::Optimal);
    check_all(&asm.volume, &model);
}

#[test]
fn initialization_makes_parity_of_old_contents() {
    let drives = mem_drives("old", 5, 2 * MIB);
    for (i, d) in drives.iter().enumerate() {
        d.write_at(&vec![i as u8 + 1; MIB as usize], MIB).unwrap();
    }
    let mut o = CreateOptions::new("init", Level::Raid5);
    o.strip_bytes = 4096;
    let v = Volume::create(as_devices(&drives), &o, &small_opts()).unwrap();
    assert_eq!(v.scrub(false, |_, _| {}).unwrap().mismatches, 0, "initialization left parity inconsistent");
    // Degraded reads now reconstruct the old contents exactly.
    let mut before = vec![0u8; v.capacity() as usize];
    v.read(0, &mut before).unwrap();
    drives[1].set_failed(true);
    let mut after = vec![0u8; v.capacity() as usize];
    v.read(0, &mut after).unwrap();
    assert!(before == after);
}

#[test]
fn replace_refuses_drives_that_carry_a_superblock() {
    let (v, drives) = mem_volume(Level::Raid6, 6, None, 8192, 2 * MIB);
    let (other, other_drives) = mem_volume(Level::Raid1, 2, None, 8192, 2 * MIB);
    other.close().unwrap();
    v.fail_drive(1).unwrap();
    let e = v.replace_drive(1, other_drives[0].clone() as Arc<dyn BlockDevice>).unwrap_err();
    assert!(matches!(e, RaidError::DriveInUse { .. }), "{e}");
    let e = v.replace_drive(1, drives[2].clone() as Arc<dyn BlockDevice>).unwrap_err();
    assert!(matches!(e, RaidError::DriveInUse { .. }), "{e}");
    let e = v.replace_drive(0, MemDrive::new("x", 2 * MIB) as Arc<dyn BlockDevice>).unwrap_err();
    assert!(matches!(e, RaidError::WrongDriveState { .. }), "{e}");
    let e = v.replace_drive(1, MemDrive::new("small", MIB) as Arc<dyn BlockDevice>).unwrap_err();
    assert!(matches!(e, RaidError::DriveTooSmall { .. }), "{e}");
}

#[test]
fn a_rebuild_cut_short_by_a_crash_resumes_from_its_checkpoint() {
    let mut rng = Rng::new(seed("rebuild_resumes"));
    // The crash must land while the rebuild runs; on a stalled machine it may finish
    // first, so the scenario is tried again (a few times at most).
    for attempt in 0..5 {
        let drives = mem_drives("r", 6, 16 * MIB);
        let mut o = CreateOptions::new("r", Level::Raid6);
        o.strip_bytes = 4096;
        o.assume_clean = true;
        o.recon_prio = 1;
        let v = Volume::create(as_devices(&drives), &o, &small_opts()).unwrap();
        let mut model = vec![0u8; v.capacity() as usize];
        random_writes(&v, &mut model, &mut rng, 40);
        v.fail_drive(2).unwrap();
        let fresh = MemDrive::new("r2new", 16 * MIB);
        v.replace_drive(2, fresh.clone() as Arc<dyn BlockDevice>).unwrap();
        // Client writes slow the rebuild down (recon_prio 1), then the process "dies".
        random_writes(&v, &mut model, &mut rng, 20);
        let running = v.status().rebuild.is_some_and(|(_, done, total)| done < total);
        v.halt_without_cleanup();
        if !running {
            eprintln!("attempt {attempt}: the rebuild finished before the crash; again");
            continue;
        }
        let mut all = as_devices(&drives);
        all[2] = fresh as Arc<dyn BlockDevice>;
        let asm = Volume::assemble(all, Some("r"), &small_opts()).unwrap();
        assert!(asm.refused.is_empty(), "{:?}", asm.refused);
        let v = asm.volume;
        v.wait_rebuild();
        assert_eq!(v.status().state, VolumeState::Optimal);
        assert_eq!(v.scrub(false, |_, _| {}).unwrap().mismatches, 0);
        // Lose two others: the rebuilt drive must carry its share.
        drives[0].set_failed(true);
        drives[4].set_failed(true);
        check_all(&v, &model);
        return;
    }
    panic!("the rebuild always finished before the simulated crash");
}

#[test]
fn scrub_with_two_parities_finds_the_bad_strip_and_restores_data() {
    let mut rng = Rng::new(seed("scrub_locates"));
    let (v, drives) = mem_volume(Level::Raid6, 6, None, 4096, 2 * MIB);
    let model = rng.bytes(v.capacity() as usize);
    v.write(0, &model).unwrap();
    // Damage a data strip of stripe 7 and a parity strip of stripe 30, found through the
    // geometry.
    let g = v.geometry();
    let data_loc = g.locate(7, 2);
    let parity_loc = g.locate(30, g.k + 1);
    drives[data_loc.drive].corrupt(MIB + data_loc.row * 4096 + 100, 50);
    drives[parity_loc.drive].corrupt(MIB + parity_loc.row * 4096, 4096);
    // A healthy read returns the damaged bytes (this layer has no per-block checksums).
    let mut got = vec![0u8; model.len()];
    v.read(0, &mut got).unwrap();
    assert!(got != model);
    let r = v.scrub(true, |_, _| {}).unwrap();
    assert_eq!((r.mismatches, r.located, r.repaired), (2, 2, 2), "{r:?}");
    check_all(&v, &model);
    assert_eq!(v.scrub(false, |_, _| {}).unwrap().mismatches, 0);
    // Two damaged strips in one stripe are beyond what two parities can locate (they may
    // even look like one damaged parity): scrub still reports the stripe and leaves it
    // consistent, so that a later drive failure does not turn it into different data.
    let a = g.locate(11, 0);
    let b = g.locate(11, 1);
    drives[a.drive].corrupt(MIB + a.row * 4096, 8);
    drives[b.drive].corrupt(MIB + b.row * 4096 + 16, 8);
    let r = v.scrub(true, |_, _| {}).unwrap();
    assert_eq!((r.mismatches, r.repaired), (1, 1), "{r:?}");
    assert_eq!(v.scrub(false, |_, _| {}).unwrap().mismatches, 0);
}
