//! The MDT's write-ahead log and image: transnos, a torn log tail, checkpoints across
//! restarts, a bad image, and the memory limit.

use std::sync::Arc;

use nacre_mdt::{Cred, Namespace, NamespaceOptions};
use nacre_proto::fid::Fid;
use nacre_proto::mdt::errno;
use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, Volume, VolumeOptions};

fn volume() -> Arc<Volume> {
    let run = VolumeOptions { threads_per_drive: 1, ..VolumeOptions::default() };
    let devs: Vec<Arc<dyn BlockDevice>> =
        (0..4).map(|i| MemDrive::new(&format!("m{i}"), 64 << 20) as Arc<dyn BlockDevice>).collect();
    let mut o = CreateOptions::new("mdt0", Level::Raid10);
    o.strip_bytes = 64 << 10;
    o.assume_clean = true;
    Arc::new(Volume::create(devs, &o, &run).unwrap())
}

/// The log's region on the volume (as the namespace splits it: the last eighth).
fn log_region(v: &Volume) -> (u64, u64) {
    let cap = v.capacity() / 4096 * 4096;
    let log = (cap / 8).min(256 << 20) / 4096 * 4096;
    (cap - log, log)
}

/// Where the record of `transno` starts in the log region, if it is there.
fn find_record(v: &Volume, transno: u64) -> Option<u64> {
    let (base, room) = log_region(v);
    let mut ring = vec![0u8; room as usize];
    v.read(base, &mut ring).unwrap();
    (0..ring.len() - 32)
        .step_by(8)
        .find(|&at| {
            ring[at..at + 4] == *b"NMLR" && u64::from_le_bytes(ring[at + 16..at + 24].try_into().unwrap()) == transno
        })
        .map(|at| base + at as u64)
}

const ROOT: Fid = Fid::ROOT;

/// Checkpoints only when asked (or when the log fills): what a crash finds is known.
fn asked_only() -> NamespaceOptions {
    NamespaceOptions { checkpoint_interval: std::time::Duration::from_secs(3600), ..NamespaceOptions::default() }
}

/// A fresh MDT checkpointing only when asked, with a directory `dom` whose files keep
/// their first `size` bytes on it (`-E SIZE -L mdt -E eof -c 1`).
fn with_dom_dir(size: &str) -> (Arc<Volume>, Namespace, Fid) {
    let v = volume();
    let ns = Namespace::format(v.clone(), 0, asked_only()).unwrap();
    let args = format!("-E {size} -L mdt -E eof -c 1");
    let layout = nacre_proto::layout::Layout::from_lfs_args(&args.split_whitespace().collect::<Vec<_>>()).unwrap();
    let d = ns.mkdir(&Cred::root(), ROOT, "dom", 0o755, None).unwrap();
    ns.set_dir_layout(&Cred::root(), d.fid, Some(layout), None).unwrap();
    (v, ns, d.fid)
}

#[test]
fn transnos_grow_and_commit_across_restarts() {
    let v = volume();
    let ns = Namespace::format(v.clone(), 0, NamespaceOptions::default()).unwrap();
    let c = Cred::root();
    let (t0, _) = ns.transnos();
    ns.create(&c, ROOT, "a", 0o644, None).unwrap();
    ns.mkdir(&c, ROOT, "d", 0o755, None).unwrap();
    let (t1, committed) = ns.transnos();
    assert_eq!(t1, t0 + 2, "one transno per change");
    assert!(committed >= t1, "a change returns once it is on the drives: {committed} < {t1}");
    // A failed change takes no transno.
    assert!(ns.create(&c, ROOT, "a", 0o644, None).is_err());
    assert_eq!(ns.transnos().0, t1);
    drop(ns);
    let ns = Namespace::open(v, NamespaceOptions::default()).unwrap();
    let (t2, committed) = ns.transnos();
    assert_eq!((t2, committed), (t1, t1), "a restart goes on from the last transno");
    assert_eq!(ns.stats.recovered.load(std::sync::atomic::Ordering::Relaxed), 0, "a clean stop left no log");
    ns.create(&c, ROOT, "b", 0o644, None).unwrap();
    assert_eq!(ns.transnos().0, t1 + 1);
}

#[test]
fn a_crash_replays_the_log_and_a_torn_tail_is_cut() {
    let v = volume();
    let ns = Namespace::format(v.clone(), 0, asked_only()).unwrap();
    let c = Cred::root();
    ns.checkpoint().unwrap();
    for i in 0..20 {
        ns.create(&c, ROOT, &format!("f{i}"), 0o644, None).unwrap();
    }
    let (last, _) = ns.transnos();
    // Crashed with everything logged and nothing checkpointed since: all of it replays.
    ns.crash();
    std::mem::forget(ns);
    let at = find_record(&v, last).expect("the last change is in the log");
    let ns = Namespace::open(v.clone(), asked_only()).unwrap();
    assert_eq!(ns.stats.recovered.load(std::sync::atomic::Ordering::Relaxed), 20, "the log's records replayed");
    for i in 0..20 {
        ns.lookup(&c, ROOT, &format!("f{i}")).unwrap();
    }
    // Again, and this time the last record is torn (a byte of it never landed).
    ns.checkpoint().unwrap();
    for i in 20..30 {
        ns.create(&c, ROOT, &format!("f{i}"), 0o644, None).unwrap();
    }
    let (last, _) = ns.transnos();
    ns.crash();
    std::mem::forget(ns);
    let at2 = find_record(&v, last).expect("the last change is in the log");
    assert_ne!(at, at2);
    let mut b = [0u8; 8];
    v.read(at2 + 40, &mut b).unwrap();
    b[0] ^= 0xff;
    v.write(at2 + 40, &b).unwrap();
    let ns = Namespace::open(v.clone(), asked_only()).unwrap();
    for i in 0..29 {
        ns.lookup(&c, ROOT, &format!("f{i}")).unwrap();
    }
    assert_eq!(ns.lookup(&c, ROOT, "f29").unwrap_err().errno, errno::ENOENT, "the torn change came back");
    assert_eq!(ns.transnos().0, last - 1, "its transno is given again");
    // The cut log goes on: new changes, a clean stop, a restart.
    ns.create(&c, ROOT, "f29", 0o644, None).unwrap();
    drop(ns);
    let ns = Namespace::open(v, NamespaceOptions::default()).unwrap();
    assert_eq!(ns.statfs().unwrap().inodes, 31);
}

#[test]
fn an_image_of_another_format_is_refused_by_name() {
    let v = volume();
    drop(Namespace::format(v.clone(), 0, NamespaceOptions::default()).unwrap());
    // Not an MDT at all: zeros where the image is.
    let blank = volume();
    let e = Namespace::open(blank, NamespaceOptions::default()).err().expect("a blank volume opened");
    assert_eq!(e.errno, errno::EINVAL, "{e}");
    // A volume whose image was torn to pieces.
    v.write(0, &vec![0x5au8; 64 << 10]).unwrap();
    let e = Namespace::open(v, NamespaceOptions::default()).err().expect("a broken image opened");
    assert!(e.message.contains("metadata") || e.message.contains("redb"), "{e}");
}

#[test]
fn the_memory_limit_refuses_new_files_and_lets_removals_through() {
    let v = volume();
    let opts = NamespaceOptions { memory_max: 64 << 10, ..NamespaceOptions::default() };
    let ns = Namespace::format(v, 0, opts).unwrap();
    let c = Cred::root();
    let mut made = 0;
    let e = loop {
        match ns.create(&c, ROOT, &format!("file-{made}"), 0o644, None) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 10_000, "the limit never held");
    };
    assert!(made > 10, "only {made} files fit in 64 KiB");
    assert_eq!(e.errno, errno::ENOSPC);
    assert!(e.message.contains("memory_max"), "{e}");
    assert_eq!(ns.mkdir(&c, ROOT, "d", 0o755, None).unwrap_err().errno, errno::ENOSPC);
    // Removals go, and make room.
    for i in 0..made / 2 {
        ns.remove(&c, ROOT, &format!("file-{i}"), false, None).unwrap();
    }
    ns.create(&c, ROOT, "again", 0o644, None).unwrap();
}

#[test]
fn concurrent_changes_get_distinct_fids_and_transnos() {
    let v = volume();
    let ns = Namespace::format(v.clone(), 0, NamespaceOptions::default()).unwrap();
    let c = Cred::root();
    let (threads, per) = (4usize, 300usize);
    let (t0, _) = ns.transnos();
    let fids: Vec<Vec<Fid>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (ns, c) = (&ns, c.clone());
                s.spawn(move || {
                    let d = ns.mkdir(&c, ROOT, &format!("t{t}"), 0o755, None).unwrap();
                    let mut out = vec![d.fid];
                    for i in 0..per {
                        out.push(ns.create(&c, d.fid, &format!("f{i}"), 0o644, None).unwrap().fid);
                        if i % 3 == 0 {
                            ns.remove(&c, d.fid, &format!("f{i}"), false, None).unwrap();
                            out.pop();
                        }
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: std::collections::BTreeSet<Fid> = fids.iter().flatten().copied().collect();
    let kept = threads * (1 + per - per.div_ceil(3));
    assert_eq!(all.len(), kept, "a FID was given twice");
    assert_eq!(ns.statfs().unwrap().inodes, kept as u64 + 1);
    assert_eq!(ns.transnos().0, t0 + (threads * (1 + per + per.div_ceil(3))) as u64, "one transno per change");
    for f in &all {
        ns.getattr(*f).unwrap();
    }
    // And the same after a crash, from the log.
    ns.crash();
    std::mem::forget(ns);
    let ns = Namespace::open(v, NamespaceOptions::default()).unwrap();
    assert_eq!(ns.statfs().unwrap().inodes, kept as u64 + 1);
    for f in &all {
        ns.getattr(*f).unwrap();
    }
}

#[test]
fn dom_bytes_leave_memory_at_checkpoints_and_are_read_from_the_image() {
    let (v, ns, d) = with_dom_dir("256K");
    let c = Cred::root();
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let f = ns.create(&c, d, "f", 0o644, None).unwrap();
    ns.write_dom(&c, f.fid, 0, &body, false, None).unwrap();
    assert_eq!(ns.dom_bytes_in_memory(), body.len() as u64);
    ns.checkpoint().unwrap();
    assert_eq!(ns.dom_bytes_in_memory(), 0, "a checkpoint left the bytes in memory");
    assert_eq!(ns.read_dom(&c, f.fid, 0, 1 << 20).unwrap(), body, "read back from the image");
    // A write into an imaged block reads the rest of it from the image.
    let mut want = body.clone();
    want[70_000..70_010].copy_from_slice(b"0123456789");
    ns.write_dom(&c, f.fid, 70_000, b"0123456789", false, None).unwrap();
    assert_eq!(ns.dom_bytes_in_memory(), 64 << 10, "one block back in memory");
    assert_eq!(ns.read_dom(&c, f.fid, 0, 1 << 20).unwrap(), want);
    // A truncate into an imaged block, then a crash: the log replays over the image.
    ns.checkpoint().unwrap();
    ns.setattr(&c, f.fid, nacre_mdt::SetAttr { size: Some(150_000), ..Default::default() }, None).unwrap();
    want.truncate(150_000);
    assert_eq!(ns.read_dom(&c, f.fid, 0, 1 << 20).unwrap(), want);
    ns.crash();
    std::mem::forget(ns);
    let ns = Namespace::open(v.clone(), asked_only()).unwrap();
    assert_eq!(ns.dom_bytes_in_memory(), 0, "start-up loads the index, not the bytes");
    assert_eq!(ns.read_dom(&c, f.fid, 0, 1 << 20).unwrap(), want);
    // Removed: its blocks go from the index and the image.
    ns.remove(&c, d, "f", false, None).unwrap();
    drop(ns);
    let ns = Namespace::open(v, asked_only()).unwrap();
    assert_eq!(ns.lookup(&c, d, "f").unwrap_err().errno, errno::ENOENT);
    assert_eq!(ns.statfs().unwrap().inodes, 2);
}

#[test]
fn a_change_larger_than_its_reservation_is_logged_whole() {
    let v = volume();
    let ns = Namespace::format(v.clone(), 0, asked_only()).unwrap();
    let c = Cred::root();
    let f = ns.create(&c, ROOT, "many-xattrs", 0o644, None).unwrap();
    // 400 xattrs: removing the file logs a delete of each, some 16 KiB of record where a
    // change reserves 4 KiB.
    for i in 0..400 {
        ns.setxattr(&c, f.fid, &format!("user.attribute-number-{i:04}"), b"v", false, false, None).unwrap();
    }
    let (before, _) = ns.transnos();
    ns.remove(&c, ROOT, "many-xattrs", false, None).unwrap();
    assert_eq!(ns.transnos().0, before + 1);
    ns.crash();
    std::mem::forget(ns);
    let ns = Namespace::open(v, asked_only()).unwrap();
    assert_eq!(ns.lookup(&c, ROOT, "many-xattrs").unwrap_err().errno, errno::ENOENT);
    assert_eq!(ns.statfs().unwrap().inodes, 1);
}

#[test]
fn the_log_wraps_its_ring_many_times_and_a_crash_replays_across_laps() {
    use nacre_proto::layout::Layout;
    let v = volume();
    let ns = Namespace::format(v.clone(), 0, asked_only()).unwrap();
    let c = Cred::root();
    let lfs = |a: &str| Layout::from_lfs_args(&a.split_whitespace().collect::<Vec<_>>()).unwrap();
    let d = ns.mkdir(&c, ROOT, "dom", 0o755, None).unwrap();
    ns.set_dir_layout(&c, d.fid, Some(lfs("-E 1M -L mdt -E eof -c 1")), None).unwrap();
    let f = ns.create(&c, d.fid, "f", 0o644, None).unwrap();
    // 48 writes of 1 MiB: three times the log's 16 MiB ring. Checkpoints come only as the
    // log fills (the interval is an hour), and the writer never overwrites what they have
    // not taken.
    let mut last = Vec::new();
    for i in 0..48u32 {
        last = (0..1u32 << 20).map(|j| (j.wrapping_mul(31).wrapping_add(i)) as u8).collect();
        ns.write_dom(&c, f.fid, 0, &last, false, None).unwrap();
    }
    ns.create(&c, d.fid, "after", 0o644, None).unwrap();
    assert!(ns.stats.checkpoints.load(std::sync::atomic::Ordering::Relaxed) >= 2, "the ring never filled");
    ns.crash();
    std::mem::forget(ns);
    let ns = Namespace::open(v, asked_only()).unwrap();
    assert_eq!(ns.read_dom(&c, f.fid, 0, 1 << 20).unwrap(), last);
    ns.lookup(&c, d.fid, "after").unwrap();
}

/// The first bytes of small file `i`: its name, then a pattern of its own.
fn small_body(i: u32) -> Vec<u8> {
    let mut b = format!("small-file-{i:05}-").into_bytes();
    b.extend((0..3901 - b.len() as u32).map(|j| ((i * 31 + j) % 251) as u8));
    b
}

#[test]
fn dom_bytes_go_to_the_dom_area_are_checked_and_their_room_is_used_again() {
    let (v, ns, d) = with_dom_dir("64K");
    let c = Cred::root();
    let mut fids = Vec::new();
    for i in 0..100 {
        fids.push(ns.create_with_data(&c, d, &format!("f{i}"), 0o644, &small_body(i), None).unwrap().fid);
    }
    assert_eq!(ns.dom_area_bytes(), 0, "nothing written out before a checkpoint");
    ns.checkpoint().unwrap();
    assert_eq!(ns.dom_area_bytes(), 100 * 4096, "one 4 KiB unit per 3,901-byte file");
    assert_eq!(ns.dom_bytes_in_memory(), 0);
    for (i, f) in fids.iter().enumerate() {
        assert_eq!(ns.read_dom(&c, *f, 0, 8192).unwrap(), small_body(i as u32), "file {i}");
    }

    // Half of them go: their units are free once a checkpoint has let them go, and the
    // next files take them (the area does not grow).
    for i in (0..100).step_by(2) {
        ns.remove(&c, d, &format!("f{i}"), false, None).unwrap();
    }
    ns.checkpoint().unwrap();
    assert_eq!(ns.dom_area_bytes(), 50 * 4096);
    let used = ns.statfs().unwrap().bytes_used;
    for i in 100..150 {
        let f = ns.create_with_data(&c, d, &format!("f{i}"), 0o644, &small_body(i), None).unwrap().fid;
        fids[(i - 100) as usize * 2] = f;
    }
    ns.checkpoint().unwrap();
    assert_eq!(ns.dom_area_bytes(), 100 * 4096);
    assert!(ns.statfs().unwrap().bytes_used <= used + 50 * 4096, "the freed units were taken again");
    let expect = |slot: usize| small_body(if slot.is_multiple_of(2) { 100 + slot as u32 / 2 } else { slot as u32 });

    // Across a restart: the area is rebuilt from the index, and the bytes are there.
    drop(ns);
    let ns = Namespace::open(v.clone(), asked_only()).unwrap();
    assert_eq!((ns.dom_area_bytes(), ns.dom_bytes_in_memory()), (100 * 4096, 0));
    for (slot, f) in fids.iter().enumerate() {
        assert_eq!(ns.read_dom(&c, *f, 0, 8192).unwrap(), expect(slot), "slot {slot}");
    }

    // A block damaged on the drives is not served: EIO, naming the block and the check.
    let (log_at, _) = log_region(&v);
    let mut top = vec![0u8; 1 << 20];
    v.read(log_at - top.len() as u64, &mut top).unwrap();
    let marker = b"small-file-00001-";
    let at = top.windows(marker.len()).position(|w| w == marker).expect("file 1's bytes below the log");
    v.write(log_at - top.len() as u64 + at as u64 + 100, b"X").unwrap();
    let e = ns.read_dom(&c, fids[1], 0, 8192).unwrap_err();
    assert_eq!(e.errno, errno::EIO, "{e}");
    assert!(e.message.contains("DoM block 0") && e.message.contains("checksum"), "{e}");
    assert_eq!(ns.read_dom(&c, fids[3], 0, 8192).unwrap(), expect(3), "its neighbours read as before");
}

/// An MDT of format 3 kept DoM bytes in a table of their own: it opens, its blocks are
/// copied into the index as they are, and they move to the DoM area when written again.
#[test]
fn an_mdt_of_format_3_opens_with_its_dom_bytes() {
    use redb::{ReadableDatabase, ReadableTable, TableDefinition};
    let (v, ns, d) = with_dom_dir("64K");
    let c = Cred::root();
    let f = ns.create_with_data(&c, d, "old", 0o644, &small_body(7), None).unwrap().fid;
    drop(ns);
    // Made into format 3 by hand: the bytes in table `dom`, no index.
    {
        let (db_bytes, _) = log_region(&v);
        let backend =
            nacre_osd::backend::VolumeBackend::open(v.clone(), 0, db_bytes, nacre_osd::SyncMode::Ordered).unwrap();
        let db = redb::Database::builder().create_with_backend(backend).unwrap();
        let old: TableDefinition<(u128, u64), &[u8]> = TableDefinition::new("dom");
        let index: TableDefinition<(u128, u64), &[u8]> = TableDefinition::new("dom_index");
        let meta: TableDefinition<&str, u64> = TableDefinition::new("meta");
        let txn = db.begin_write().unwrap();
        assert!(txn.open_table(index).unwrap().get((f.key(), 0)).unwrap().is_some(), "the index has the block");
        txn.delete_table(index).unwrap();
        txn.open_table(old).unwrap().insert((f.key(), 0), small_body(7).as_slice()).unwrap();
        txn.open_table(meta).unwrap().insert("format", 3).unwrap();
        txn.commit().unwrap();
        let read = db.begin_read().unwrap();
        assert_eq!(read.open_table(meta).unwrap().get("format").unwrap().unwrap().value(), 3);
    }
    let ns = Namespace::open(v.clone(), asked_only()).unwrap();
    assert_eq!(ns.read_dom(&c, f, 0, 8192).unwrap(), small_body(7));
    assert_eq!(ns.dom_area_bytes(), 0, "indexed where it is");
    ns.write_dom(&c, f, 0, b"new-", false, None).unwrap();
    ns.checkpoint().unwrap();
    assert_eq!(ns.dom_area_bytes(), 4096, "written again, it is in the area");
    drop(ns);
    let ns = Namespace::open(v, asked_only()).unwrap();
    let mut want = small_body(7);
    want[..4].copy_from_slice(b"new-");
    assert_eq!(ns.read_dom(&c, f, 0, 8192).unwrap(), want);
}
