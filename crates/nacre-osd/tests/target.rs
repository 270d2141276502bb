//! The object store against a model, across reopen; space accounting to the byte; every
//! refusal with its error and nothing changed; concurrent writers to one object; and the
//! check finding what it must.

use std::sync::Arc;

use nacre_osd::{OsdError, SetAttr, SyncMode, Target, TargetOptions};
use nacre_raid::{BlockDevice, CreateOptions, Level, MemDrive, Volume, VolumeOptions};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

fn seed(test: &str) -> u64 {
    let seed = std::env::var("NACRE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("{test}: seed {seed} (rerun with NACRE_SEED={seed})");
    seed
}

/// The drives of a small target: RAID6 4+2 with 16 KiB strips (64 KiB chunks) for data,
/// RAID1 for the index.
struct Drives {
    data: Vec<Arc<MemDrive>>,
    meta: Vec<Arc<MemDrive>>,
}

impl Drives {
    /// With a small index volume: a 2 MiB journal that wraps many times in a test.
    fn small_journal(data_drive_bytes: u64) -> Drives {
        Drives {
            data: (0..6).map(|i| MemDrive::new(&format!("data{i}"), data_drive_bytes)).collect(),
            meta: (0..2).map(|i| MemDrive::new(&format!("meta{i}"), 8 << 20)).collect(),
        }
    }
}

fn devices(d: &[Arc<MemDrive>]) -> Vec<Arc<dyn BlockDevice>> {
    d.iter().map(|x| x.clone() as Arc<dyn BlockDevice>).collect()
}

fn run() -> VolumeOptions {
    VolumeOptions { threads_per_drive: 1, wil_clean_interval: std::time::Duration::from_millis(20) }
}

impl Drives {
    fn new(data_drive_bytes: u64) -> Drives {
        Drives {
            data: (0..6).map(|i| MemDrive::new(&format!("data{i}"), data_drive_bytes)).collect(),
            meta: (0..2).map(|i| MemDrive::new(&format!("meta{i}"), 64 << 20)).collect(),
        }
    }

    fn format(&self) -> Target {
        self.format_with_data().0
    }

    /// Also hands back the data volume, for tests that damage it behind the target.
    fn format_with_data(&self) -> (Target, Arc<Volume>) {
        let mut d = CreateOptions::new("ost0", Level::Raid6);
        d.strip_bytes = 16 << 10;
        d.assume_clean = true;
        d.force = true;
        let data = Volume::create(devices(&self.data), &d, &run()).unwrap();
        let mut m = CreateOptions::new("ost0-index", Level::Raid1);
        m.strip_bytes = 16 << 10;
        m.assume_clean = true;
        m.force = true;
        let meta = Volume::create(devices(&self.meta), &m, &run()).unwrap();
        let data = Arc::new(data);
        (Target::format(data.clone(), Arc::new(meta), TargetOptions::default()).unwrap(), data)
    }

    fn open(&self) -> Result<Target, OsdError> {
        let data = Volume::assemble(devices(&self.data), Some("ost0"), &run()).unwrap().volume;
        let meta = Volume::assemble(devices(&self.meta), Some("ost0-index"), &run()).unwrap().volume;
        Target::open(Arc::new(data), Arc::new(meta), TargetOptions::default())
    }
}

fn pattern(oid: u64, off: u64, len: usize, salt: u64) -> Vec<u8> {
    (0..len as u64).map(|i| ((off + i) ^ (oid << 3) ^ salt.wrapping_mul(31)) as u8 | 1).collect()
}

fn read_all(t: &Target, oid: u64) -> Vec<u8> {
    let size = t.getattr(oid).unwrap().size as usize;
    let mut buf = vec![0xEE; size + 100];
    let n = t.read(oid, 0, &mut buf).unwrap();
    assert_eq!(n, size, "a read from 0 returns the whole object");
    buf.truncate(n);
    buf
}

#[test]
fn objects_match_a_model_through_writes_truncates_punches_and_a_reopen() {
    let mut rng = Rng(seed("objects_match_a_model"));
    let drives = Drives::small_journal(8 << 20);
    let mut t = drives.format();
    let cb = t.chunk_bytes();
    assert_eq!(cb, 64 << 10, "a chunk is one full stripe");
    let oids: Vec<u64> = t.create(4).unwrap().collect();
    let mut model: Vec<Vec<u8>> = vec![Vec::new(); oids.len()];
    for step in 0..1000u64 {
        if step % 250 == 249 {
            // Reopen with whatever the journal holds: it replays, skipping what was
            // destaged and overwritten since.
            drop(t);
            t = drives.open().unwrap();
        }
        let i = rng.below(oids.len() as u64) as usize;
        let oid = oids[i];
        let m = &mut model[i];
        match rng.below(10) {
            0..=5 => {
                // Writes: sub-chunk, chunk-spanning, whole chunks, past the end with a gap.
                let off = match rng.below(3) {
                    0 => rng.below(4 * cb),
                    1 => rng.below(4) * cb,
                    _ => m.len() as u64 + rng.below(cb),
                };
                let len = match rng.below(3) {
                    0 => 1 + rng.below(5000),
                    1 => cb * (1 + rng.below(3)),
                    _ => 1 + rng.below(3 * cb),
                } as usize;
                let data = pattern(oid, off, len, step);
                t.write(oid, off, &data).unwrap();
                let end = off as usize + len;
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].copy_from_slice(&data);
            }
            6 => {
                let size = rng.below(5 * cb);
                t.truncate(oid, size).unwrap();
                m.resize(size as usize, 0);
            }
            7 => {
                let start = rng.below(m.len() as u64 + 1);
                let end = start + rng.below(3 * cb);
                t.punch(oid, start, end).unwrap();
                let e = (end as usize).min(m.len());
                if (start as usize) < e {
                    m[start as usize..e].fill(0);
                }
            }
            _ => {
                let off = rng.below(m.len() as u64 + 10);
                let mut buf = vec![0xEEu8; 1 + rng.below(2 * cb) as usize];
                let n = t.read(oid, off, &mut buf).unwrap();
                let want = m.len().saturating_sub(off as usize).min(buf.len());
                assert_eq!(n, want, "step {step}: read length at {off}");
                let expected = m.get(off as usize..off as usize + n).unwrap_or(&[]);
                assert!(buf[..n] == *expected, "step {step}: object {oid} differs at {off}");
            }
        }
        let a = t.getattr(oid).unwrap();
        assert_eq!(a.size, m.len() as u64, "step {step}: size");
        if step % 50 == 49 {
            // Once the journal is empty (no chunk promised to pieces), the space in use is
            // exactly the objects' space: what `df` says is what `stat` adds up to.
            t.destage_all().unwrap();
            let s = t.statfs().unwrap();
            let space: u64 = oids.iter().map(|&o| t.getattr(o).unwrap().space).sum();
            assert_eq!(s.total_bytes - s.free_bytes, space, "step {step}: used space is the objects' space");
        }
    }
    for (i, &oid) in oids.iter().enumerate() {
        assert!(read_all(&t, oid) == model[i], "object {oid} differs from the model");
    }
    let report = t.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(t.locks_held(), 0, "no lock outlives its operation");
    drop(t);
    let t = drives.open().unwrap();
    for (i, &oid) in oids.iter().enumerate() {
        assert!(read_all(&t, oid) == model[i], "object {oid} differs after reopen");
    }
    assert!(t.check().unwrap().is_clean());
    assert!(t.stats().journaled == 0 || t.stats().journal_bytes > 0);
}

#[test]
fn streaming_writes_are_full_stripes_and_space_is_exact() {
    let drives = Drives::new(8 << 20);
    let t = drives.format();
    let cb = t.chunk_bytes();
    let before = t.statfs().unwrap();
    assert_eq!(before.free_bytes, before.total_bytes);
    let oid = t.create(1).unwrap().start;
    let data = pattern(oid, 0, (16 * cb) as usize, 1);
    t.write(oid, 0, &data).unwrap();
    let s = t.stats();
    assert_eq!((s.chunks_allocated, s.in_place_writes), (16, 0), "new chunks, written whole");
    let a = t.getattr(oid).unwrap();
    assert_eq!((a.size, a.space), (16 * cb, 16 * cb));
    assert_eq!(t.statfs().unwrap().free_bytes, before.total_bytes - 16 * cb);
    // Small writes go through the journal; one past the end holds a chunk for its destage.
    t.write(oid, 100, b"journal").unwrap();
    t.write(oid, 20 * cb + 5, b"far").unwrap();
    let s = t.stats();
    assert_eq!((s.chunks_allocated, s.in_place_writes, s.journaled), (16, 0, 2));
    assert_eq!(t.getattr(oid).unwrap().size, 20 * cb + 8, "journaled writes count in the size at once");
    assert_eq!(t.statfs().unwrap().free_bytes, before.total_bytes - 17 * cb, "the far chunk is promised");
    t.destage_all().unwrap();
    assert_eq!(t.stats().journal_used, 0);
    assert_eq!(t.getattr(oid).unwrap().space, 17 * cb, "the gap is a hole");
    let mut head = [0u8; 7];
    t.read(oid, 100, &mut head).unwrap();
    assert_eq!(&head, b"journal");
    let mut gap = vec![1u8; cb as usize];
    t.read(oid, 17 * cb, &mut gap).unwrap();
    assert!(gap.iter().all(|&b| b == 0), "holes read as zeros");
    // Destroy gives everything back.
    t.destroy(oid).unwrap();
    let after = t.statfs().unwrap();
    assert_eq!((after.free_bytes, after.objects), (before.total_bytes, 0));
    assert!(t.check().unwrap().is_clean());
}

#[test]
fn a_full_target_says_enospc_and_keeps_what_it_has() {
    let drives = Drives::new(2 << 20);
    let t = drives.format();
    let total = t.statfs().unwrap().total_bytes;
    let oid = t.create(2).unwrap().start;
    let keep = pattern(oid, 0, total as usize - 3 * t.chunk_bytes() as usize, 2);
    t.write(oid, 0, &keep).unwrap();
    let other = oid + 1;
    let e = t.write(other, 0, &vec![7u8; 4 * t.chunk_bytes() as usize]).unwrap_err();
    match &e {
        OsdError::NoSpace { need, free } => assert_eq!((*need, *free), (4 * t.chunk_bytes(), 3 * t.chunk_bytes())),
        other => panic!("expected ENOSPC, got {other}"),
    }
    assert_eq!(e.errno(), -28);
    assert_eq!(t.getattr(other).unwrap().size, 0, "the refused write changed nothing");
    assert_eq!(t.statfs().unwrap().free_bytes, 3 * t.chunk_bytes());
    assert!(read_all(&t, oid) == keep, "stored data unharmed");
    // What fits still goes in; then the target is exactly full.
    t.write(other, 0, &vec![7u8; 3 * t.chunk_bytes() as usize]).unwrap();
    assert_eq!(t.statfs().unwrap().free_bytes, 0);
    assert!(matches!(t.write(other, 10 * t.chunk_bytes(), b"x"), Err(OsdError::NoSpace { .. })));
    assert!(t.check().unwrap().is_clean());
}

#[test]
fn bad_requests_get_their_error_and_change_nothing() {
    let drives = Drives::new(4 << 20);
    let t = drives.format();
    let oid = t.create(1).unwrap().start;
    t.write(oid, 0, b"hello").unwrap();
    let max = t.max_object_bytes();
    let no = oid + 1000;
    assert!(matches!(t.write(no, 0, b"x"), Err(OsdError::NoSuchObject(o)) if o == no));
    assert!(matches!(t.read(no, 0, &mut [0; 4]), Err(OsdError::NoSuchObject(_))));
    assert!(matches!(t.getattr(no), Err(OsdError::NoSuchObject(_))));
    assert!(matches!(t.setattr(no, &SetAttr::default()), Err(OsdError::NoSuchObject(_))));
    assert!(matches!(t.truncate(no, 0), Err(OsdError::NoSuchObject(_))));
    assert!(matches!(t.destroy(no), Err(OsdError::NoSuchObject(_))));
    assert!(matches!(t.write(oid, max - 2, b"xyz"), Err(OsdError::TooLarge { .. })));
    assert!(matches!(t.write(oid, u64::MAX, b"x"), Err(OsdError::TooLarge { .. })));
    assert!(matches!(t.truncate(oid, max + 1), Err(OsdError::TooLarge { .. })));
    assert!(matches!(t.punch(oid, 10, 5), Err(OsdError::Invalid(_))));
    assert!(matches!(t.create(0), Err(OsdError::Invalid(_))));
    assert_eq!(read_all(&t, oid), b"hello", "nothing changed");
    assert_eq!(t.statfs().unwrap().objects, 1);
    assert!(t.check().unwrap().is_clean());
    // Attributes set and kept.
    let a = t.setattr(oid, &SetAttr { uid: Some(1000), parent: Some([5, 6]), ..SetAttr::default() }).unwrap();
    assert_eq!((a.uid, a.parent, a.size), (1000, [5, 6], 5));
}

#[test]
fn concurrent_writers_to_disjoint_ranges_of_one_object_all_land() {
    let drives = Drives::new(8 << 20);
    let t = Arc::new(drives.format());
    let oid = t.create(1).unwrap().start;
    // 47,008-byte pieces interleaved over 4 writers (IO500's ior-hard): pieces share
    // chunks, and new chunks are allocated by whichever writer comes first.
    const PIECE: u64 = 47_008;
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let t = t.clone();
            std::thread::spawn(move || {
                for i in 0..24u64 {
                    let off = (i * 4 + w) * PIECE;
                    t.write(oid, off, &pattern(oid, off, PIECE as usize, 9)).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let all = read_all(&t, oid);
    assert_eq!(all.len() as u64, 96 * PIECE);
    assert!(all == pattern(oid, 0, all.len(), 9), "every piece landed, none overwritten");
    assert!(t.check().unwrap().is_clean());
    assert_eq!(t.locks_held(), 0);
}

#[test]
fn open_refuses_what_is_not_this_target() {
    let drives = Drives::new(4 << 20);
    {
        // Volumes without a target.
        let mut d = CreateOptions::new("ost0", Level::Raid6);
        d.strip_bytes = 16 << 10;
        d.assume_clean = true;
        Volume::create(devices(&drives.data), &d, &run()).unwrap();
        let mut m = CreateOptions::new("ost0-index", Level::Raid1);
        m.strip_bytes = 16 << 10;
        m.assume_clean = true;
        Volume::create(devices(&drives.meta), &m, &run()).unwrap();
    }
    match drives.open() {
        Err(e @ OsdError::NotATarget(_)) => assert!(e.to_string().contains("not a target"), "{e}"),
        Err(e) => panic!("expected NotATarget, got {e}"),
        Ok(_) => panic!("opened volumes that hold no target"),
    }
    let t = drives.format();
    drop(t);
    assert!(drives.open().is_ok());
    // A data volume of another shape.
    let other = Drives::new(4 << 20);
    let mut d = CreateOptions::new("ost0", Level::Raid6);
    d.strip_bytes = 32 << 10;
    d.assume_clean = true;
    let data = Volume::create(devices(&other.data), &d, &run()).unwrap();
    let meta = Volume::assemble(devices(&drives.meta), Some("ost0-index"), &run()).unwrap().volume;
    match Target::open(
        Arc::new(data),
        Arc::new(meta),
        TargetOptions { sync: SyncMode::Drives, ..TargetOptions::default() },
    ) {
        Err(OsdError::NotATarget(m)) => assert!(m.contains("chunks of"), "{m}"),
        Err(e) => panic!("expected NotATarget, got {e}"),
        Ok(_) => panic!("opened an index with a data volume of another shape"),
    }
}

#[test]
fn check_finds_bytes_past_an_objects_end() {
    let drives = Drives::new(4 << 20);
    let (t, data) = drives.format_with_data();
    let oid = t.create(1).unwrap().start;
    t.write(oid, 0, &[7u8; 100]).unwrap();
    t.destage_all().unwrap();
    assert!(t.check().unwrap().is_clean());
    // The small object's fragment is the first block of the first chunk (a slab); dirty a
    // byte past its size, inside its block.
    data.write(200, &[1u8; 8]).unwrap();
    let report = t.check().unwrap();
    assert!(!report.is_clean());
    assert!(report.problems[0].contains("past its size 100 is not zero"), "{:?}", report.problems);
}

/// Used space of a target, and the sum of its objects' space.
fn used_and_space(t: &Target, oids: &[u64]) -> (u64, u64) {
    let s = t.statfs().unwrap();
    let space = oids.iter().filter_map(|&o| t.getattr(o).ok()).map(|a| a.space).sum();
    (s.total_bytes - s.free_bytes, space)
}

/// Files of 3,901 bytes (mdtest-hard's) take a 4 KiB block each, not a chunk: in slabs
/// shared by many objects, across a reopen; and all of it comes back when they go.
#[test]
fn small_objects_take_blocks_not_chunks() {
    let drives = Drives::new(4 << 20);
    let t = drives.format();
    let total = t.statfs().unwrap().total_bytes;
    let oids: Vec<u64> = t.create(200).unwrap().collect();
    for &oid in &oids {
        t.write(oid, 0, &pattern(oid, 0, 3901, 1)).unwrap();
    }
    let s = t.stats();
    assert_eq!((s.fragment_writes, s.chunks_allocated, s.journaled), (200, 0, 0), "{s:?}");
    assert_eq!(used_and_space(&t, &oids), (200 * 4096, 200 * 4096), "a block each");
    for &oid in &oids {
        assert_eq!(t.getattr(oid).unwrap().space, 4096);
        assert!(read_all(&t, oid) == pattern(oid, 0, 3901, 1));
    }
    assert!(t.check().unwrap().is_clean(), "{:?}", t.check().unwrap().problems);
    drop(t);
    let t = drives.open().unwrap();
    for &oid in &oids {
        assert!(read_all(&t, oid) == pattern(oid, 0, 3901, 1), "after reopen");
    }
    assert_eq!(used_and_space(&t, &oids), (200 * 4096, 200 * 4096));
    for &oid in &oids {
        t.destroy(oid).unwrap();
    }
    assert_eq!(t.statfs().unwrap().free_bytes, total, "every slab went back");
    let r = t.check().unwrap();
    assert!(r.is_clean() && r.free_chunks * t.chunk_bytes() == total, "{r:?}");
}

/// A small object written in appends keeps at most twice its bytes (its fragment doubles),
/// and past half a chunk moves into a chunk of its own with every byte.
#[test]
fn a_small_object_grows_into_a_chunk() {
    let drives = Drives::new(4 << 20);
    let t = drives.format();
    let (cb, max) = (t.chunk_bytes(), t.fragment_max());
    assert_eq!(max, cb / 2);
    let oid = t.create(1).unwrap().start;
    let mut model = Vec::new();
    let mut off = 0u64;
    while off < max + 10_000 {
        let data = pattern(oid, off, 3000, 2);
        t.write(oid, off, &data).unwrap();
        model.extend_from_slice(&data);
        off += 3000;
        let a = t.getattr(oid).unwrap();
        assert!(read_all(&t, oid) == model, "at {off}");
        let blocks = a.size.div_ceil(4096) * 4096;
        if a.size <= max {
            assert!(a.space >= blocks && a.space <= 2 * blocks, "{} bytes hold {} of space", a.size, a.space);
        } else {
            assert_eq!(a.space, cb, "promoted to one chunk");
        }
        assert_eq!(used_and_space(&t, &[oid]).0, a.space);
    }
    assert_eq!(t.stats().fragments_promoted, 1);
    assert!(t.check().unwrap().is_clean(), "{:?}", t.check().unwrap().problems);
    // A small write to chunk 0 of an object whose chunk 0 is mapped goes in place.
    t.write(oid, 10, b"in place").unwrap();
    model[10..18].copy_from_slice(b"in place");
    t.destage_all().unwrap();
    assert!(read_all(&t, oid) == model);
    assert_eq!(t.getattr(oid).unwrap().space, cb);
}

/// Truncates, punches and overwrites of a fragment: bytes past the size stay zero, space
/// given back by whole blocks, a punch of all of chunk 0 frees the fragment.
#[test]
fn truncate_punch_and_overwrite_of_a_small_object() {
    let drives = Drives::new(4 << 20);
    let t = drives.format();
    let cb = t.chunk_bytes();
    let oid = t.create(1).unwrap().start;
    let mut model = pattern(oid, 0, 20_000, 3);
    t.write(oid, 0, &model).unwrap();
    assert_eq!(t.getattr(oid).unwrap().space, 5 * 4096);
    t.truncate(oid, 5_000).unwrap();
    model.truncate(5_000);
    assert_eq!(t.getattr(oid).unwrap().space, 2 * 4096, "blocks past the size went back");
    assert!(read_all(&t, oid) == model);
    assert!(t.check().unwrap().is_clean(), "bytes past the size are zero: {:?}", t.check().unwrap().problems);
    t.truncate(oid, 12_000).unwrap();
    model.resize(12_000, 0);
    assert!(read_all(&t, oid) == model, "a truncate up reads zeros");
    t.write(oid, 4_000, &[9u8; 3_000]).unwrap();
    model[4_000..7_000].fill(9);
    t.punch(oid, 1_000, 3_000).unwrap();
    model[1_000..3_000].fill(0);
    assert!(read_all(&t, oid) == model);
    assert_eq!(used_and_space(&t, &[oid]), (t.getattr(oid).unwrap().space, t.getattr(oid).unwrap().space));
    t.punch(oid, 0, cb).unwrap();
    let a = t.getattr(oid).unwrap();
    assert_eq!((a.size, a.space), (12_000, 0), "the fragment is gone, the size kept");
    assert!(read_all(&t, oid).iter().all(|&b| b == 0));
    assert_eq!(t.statfs().unwrap().free_bytes, t.statfs().unwrap().total_bytes);
    assert!(t.check().unwrap().is_clean(), "{:?}", t.check().unwrap().problems);
}

/// A fragment beside chunks further out (a small write at 0, a far one later): punches of
/// the far chunks, or from past the fragment's first block, leave its bytes alone.
#[test]
fn punches_past_a_fragment_keep_it() {
    let drives = Drives::new(4 << 20);
    let t = drives.format();
    let cb = t.chunk_bytes();
    let oid = t.create(1).unwrap().start;
    let head = pattern(oid, 0, 5_000, 4);
    t.write(oid, 0, &head).unwrap();
    t.write(oid, 3 * cb, &pattern(oid, 3 * cb, cb as usize, 4)).unwrap();
    t.punch(oid, cb, 4 * cb).unwrap();
    let mut got = vec![0u8; 5_000];
    t.read(oid, 0, &mut got).unwrap();
    assert!(got == head, "a punch of whole chunks past chunk 0 kept the fragment's bytes");
    t.punch(oid, 4096, 3 * cb).unwrap();
    t.read(oid, 0, &mut got).unwrap();
    assert!(got[..4096] == head[..4096] && got[4096..].iter().all(|&b| b == 0));
    assert_eq!(t.getattr(oid).unwrap().space, 2 * 4096, "punches inside a fragment give no block back");
    assert!(t.check().unwrap().is_clean(), "{:?}", t.check().unwrap().problems);
}

/// Many writers of small objects at once: each gets blocks of its own.
#[test]
fn concurrent_small_writers_never_share_blocks() {
    let drives = Drives::new(4 << 20);
    let t = Arc::new(drives.format());
    let oids: Vec<u64> = t.create(64).unwrap().collect();
    let threads: Vec<_> = oids
        .chunks(16)
        .map(|part| {
            let (t, part) = (t.clone(), part.to_vec());
            std::thread::spawn(move || {
                for round in 0..3u64 {
                    for &oid in &part {
                        let len = 1000 + ((oid + round) % 7) as usize * 2000;
                        t.write(oid, round * 500, &pattern(oid, round * 500, len, round)).unwrap();
                    }
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    for &oid in &oids {
        let mut model = Vec::new();
        for round in 0..3u64 {
            let len = 1000 + ((oid + round) % 7) as usize * 2000;
            let (off, data) = (round as usize * 500, pattern(oid, round * 500, len, round));
            if model.len() < off + len {
                model.resize(off + len, 0);
            }
            model[off..off + len].copy_from_slice(&data);
        }
        assert!(read_all(&t, oid) == model, "object {oid}");
    }
    let (used, space) = used_and_space(&t, &oids);
    assert_eq!(used, space);
    assert!(t.check().unwrap().is_clean(), "{:?}", t.check().unwrap().problems);
}

/// The write-back holds at most `max_bytes`: writers that find it full wait for the
/// committer, and every byte they wrote reads back, before and after the commit; a
/// target opened again has `last_committed` and the writers' clients.
#[test]
fn held_writes_stay_within_their_memory_bound_and_all_land() {
    use nacre_osd::{WriteBack, WriteBackOptions};
    let drives = Drives::new(64 << 20);
    let t = Arc::new(drives.format());
    let oids: Vec<u64> = t.create(4).unwrap().collect();
    const MAX: u64 = 256 << 10;
    let opts = WriteBackOptions { max_bytes: MAX, commit_interval: std::time::Duration::from_secs(60) };
    let wb = WriteBack::new(vec![t.clone()], opts).unwrap();
    std::thread::scope(|s| {
        for (j, &oid) in oids.iter().enumerate() {
            let wb = &wb;
            s.spawn(move || {
                for k in 0..64u64 {
                    // Pieces in a shuffled order, each 12,000 bytes.
                    let i = (k * 37) % 64;
                    wb.write(0, 100 + j as u64, oid, &[(i * 12_000, &pattern(oid, i * 12_000, 12_000, 5))], None)
                        .unwrap();
                    let held = wb.stats().bytes;
                    assert!(held <= MAX, "{held} bytes held, at most {MAX}");
                }
            });
        }
    });
    let st = wb.stats();
    assert!(st.waits > 0 && st.commits > 0, "writers waited for the committer: {st:?}");
    let read = |oid: u64| {
        let mut buf = vec![0u8; 64 * 12_000 + 10];
        let n = wb.read(0, oid, 0, &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    for &oid in &oids {
        assert!(read(oid) == pattern(oid, 0, 64 * 12_000, 5), "object {oid} before the last commit");
    }
    let last = wb.commit().unwrap();
    assert_eq!(last, 4 * 64, "every write committed");
    for &oid in &oids {
        assert!(read_all(&t, oid) == pattern(oid, 0, 64 * 12_000, 5), "object {oid} on the drives");
    }
    drop(wb);
    drop(t);
    let wb = WriteBack::new(vec![Arc::new(drives.open().unwrap())], WriteBackOptions::default()).unwrap();
    assert_eq!(wb.last_committed(), 4 * 64);
    assert_eq!(wb.known_clients(), vec![100, 101, 102, 103]);
    // A file system started afresh forgets them, in its index too.
    wb.forget_known().unwrap();
    assert!(wb.known_clients().is_empty());
    drop(wb);
    let wb = WriteBack::new(vec![Arc::new(drives.open().unwrap())], WriteBackOptions::default()).unwrap();
    assert!(wb.known_clients().is_empty(), "forgotten for good");
    assert_eq!(wb.last_committed(), 4 * 64);
}

/// A background commit writes whole chunks and holds a partial one over (a slow writer's
/// piece is missing); `last_committed` stops below the oldest write held over, so a
/// crash would have it replayed. When the missing piece comes, the chunk is whole and
/// goes at the next commit.
#[test]
fn a_background_commit_holds_a_partial_chunk_over_until_it_fills() {
    use nacre_osd::{WriteBack, WriteBackOptions};
    use std::time::{Duration, Instant};
    let drives = Drives::new(64 << 20);
    let t = Arc::new(drives.format());
    let cb = t.chunk_bytes();
    let oid = t.create(1).unwrap().start;
    let opts = WriteBackOptions { max_bytes: 64 << 20, commit_interval: Duration::from_secs(60) };
    let wb = WriteBack::new(vec![t.clone()], opts).unwrap();
    // Chunks 2 to 4 of the object, in quarters.
    let (base, quarter) = (2 * cb, cb / 4);
    let want = pattern(oid, base, 3 * cb as usize, 7);
    let put = |i: u64| {
        let piece = &want[(i * quarter) as usize..((i + 1) * quarter) as usize];
        wb.write(0, 1, oid, &[(base + i * quarter, piece)], None).unwrap()
    };
    let committed_after = |commits: u64| {
        let until = Instant::now() + Duration::from_secs(20);
        while wb.stats().commits < commits {
            assert!(Instant::now() < until, "no background commit: {:?}", wb.stats());
            std::thread::sleep(Duration::from_millis(2));
        }
        wb.set_commit_interval(Duration::from_secs(60));
    };
    // Chunks 2 and 3 whole, chunk 4 without its second quarter.
    let transnos: Vec<u64> = (0..12).filter(|&i| i != 9).map(put).collect();
    wb.set_commit_interval(Duration::from_millis(5));
    committed_after(1);
    let st = wb.stats();
    assert!(st.kept_bytes >= 3 * quarter, "chunk 4's three quarters held over: {st:?}");
    let lc = wb.last_committed();
    assert!(lc >= transnos[7] && lc < transnos[8], "last_committed {lc} of {transnos:?}");
    let mut on_drives = vec![0u8; 2 * cb as usize];
    t.read(oid, base, &mut on_drives).unwrap();
    assert!(on_drives == want[..2 * cb as usize], "the whole chunks are on the drives");
    let mut buf = vec![0u8; 3 * cb as usize];
    assert_eq!(wb.read(0, oid, base, &mut buf).unwrap(), buf.len());
    assert!(buf[..9 * quarter as usize] == want[..9 * quarter as usize], "held-over bytes read as written");
    // The slow writer's quarter: the chunk is whole and goes as one.
    let extents = wb.stats().committed_extents;
    let last = put(9);
    wb.set_commit_interval(Duration::from_millis(5));
    committed_after(st.commits + 1);
    assert_eq!(wb.last_committed(), last);
    assert_eq!(wb.stats().committed_extents, extents + 1, "{:?}", wb.stats());
    assert!(read_all(&t, oid)[base as usize..] == want[..], "every byte on the drives");
    assert!(t.check().unwrap().is_clean());
}
