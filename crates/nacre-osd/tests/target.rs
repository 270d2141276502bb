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

/// A read of `len` bytes at `off` that must fail on a block's checksum, with EIO.
fn assert_lost(t: &Target, oid: u64, off: u64, len: usize) {
    match t.read(oid, off, &mut vec![0u8; len]) {
        Err(e @ OsdError::Checksum(_)) => {
            assert_eq!(e.errno(), -5, "a lost block reads as EIO");
            assert!(e.to_string().contains("does not match its checksum"), "{e}");
        }
        other => panic!("a read of {len} bytes at {off} over a changed block gave {other:?}"),
    }
}

fn read_at(t: &Target, oid: u64, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    assert_eq!(t.read(oid, off, &mut buf).unwrap(), len);
    buf
}

#[test]
fn a_block_changed_behind_the_target_fails_its_reads_and_no_other() {
    let drives = Drives::new(8 << 20);
    let (t, data) = drives.format_with_data();
    let cb = t.chunk_bytes();
    let oid = t.create(1).unwrap().start;
    let bytes = pattern(oid, 0, 4 * cb as usize, 1);
    t.write(oid, 0, &bytes).unwrap();
    // An empty target hands out chunks from its start: the object is the volume's first
    // four chunks.
    let mut raw = vec![0u8; bytes.len()];
    data.read(0, &mut raw).unwrap();
    assert!(raw == bytes, "the object lies at the start of the data volume");
    assert!(t.check().unwrap().is_clean());
    assert!(t.check().unwrap().checked_blocks >= 4 * cb / 4096, "every block of the object has a checksum");

    // A misdirected write (the volume's parity follows it, so only a checksum can tell)
    // changes 8 bytes of block 1 of chunk 1.
    let bad = cb + 4096 + 100;
    data.write(bad, &[0xAB; 8]).unwrap();
    assert_lost(&t, oid, cb + 4096, 4096);
    // A read of a few bytes of the block reads it whole to check it, and fails too; so does
    // a large read across it.
    assert_lost(&t, oid, bad + 20, 10);
    assert_lost(&t, oid, 0, 4 * cb as usize);
    // The blocks beside it read as written.
    let (lo, hi) = ((cb + 4096) as usize, (cb + 8192) as usize);
    assert!(read_at(&t, oid, cb, 4096) == bytes[cb as usize..lo]);
    assert!(read_at(&t, oid, cb + 8192, 4096) == bytes[hi..hi + 4096]);
    assert_eq!(t.stats().checksum_errors, 3, "each failed read counts its lost block");
    let report = t.check().unwrap();
    assert_eq!(report.problems, vec!["chunk 1 block 1 does not match its checksum".to_string()]);
}

#[test]
fn a_lost_block_stays_lost_through_writes_around_it_and_heals_when_written_whole() {
    let drives = Drives::new(8 << 20);
    let (t, data) = drives.format_with_data();
    let cb = t.chunk_bytes();
    let oid = t.create(1).unwrap().start;
    let mut model = pattern(oid, 0, 2 * cb as usize, 1);
    t.write(oid, 0, &model).unwrap();
    data.write(cb + 4096 + 100, &[0xAB; 8]).unwrap();
    // Small writes into the chunk go through the journal; their destage reads the chunk
    // back. One cuts the lost block: the block keeps failing reads (its other bytes are
    // gone), and the write's bytes outside it, like the other write's, read back.
    for (off, len, salt) in [(cb + 4000, 200, 2u64), (cb + 20_000, 3000, 3)] {
        let d = pattern(oid, off, len, salt);
        t.write(oid, off, &d).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&d);
    }
    t.destage_all().unwrap();
    assert!(t.stats().destaged > 0, "the chunk was rebuilt from the journal's pieces");
    assert_lost(&t, oid, cb + 4096, 4096);
    assert!(read_at(&t, oid, cb, 4096) == model[cb as usize..cb as usize + 4096]);
    assert!(read_at(&t, oid, cb + 16384, 8192) == model[cb as usize + 16384..cb as usize + 24576]);
    // A write in place that cuts it (large enough to skip the journal) keeps it lost too.
    let (off, len) = (cb + 4096 + 2048, (cb / 2 + 4096) as usize);
    let d = pattern(oid, off, len, 4);
    t.write(oid, off, &d).unwrap();
    model[off as usize..off as usize + len].copy_from_slice(&d);
    assert_lost(&t, oid, cb + 4096, 4096);
    assert!(read_at(&t, oid, cb + 8192, 8192) == model[cb as usize + 8192..cb as usize + 16384]);
    // Written whole, it is whole again.
    let d = pattern(oid, cb + 4096, 4096, 5);
    t.write(oid, cb + 4096, &d).unwrap();
    t.destage_all().unwrap();
    model[(cb + 4096) as usize..(cb + 8192) as usize].copy_from_slice(&d);
    assert!(read_all(&t, oid) == model);
    let report = t.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_lost_block_of_a_small_object_stays_lost_as_it_grows_into_a_chunk() {
    let drives = Drives::new(8 << 20);
    let (t, data) = drives.format_with_data();
    let cb = t.chunk_bytes();
    let oid = t.create(1).unwrap().start;
    let mut model = pattern(oid, 0, 9000, 1);
    t.write(oid, 0, &model).unwrap();
    // Its fragment is the first blocks of the first chunk (a slab): change its second block.
    data.write(4096 + 10, &[0xAB; 4]).unwrap();
    assert_lost(&t, oid, 5000, 10);
    assert!(read_at(&t, oid, 0, 4096) == model[..4096]);
    assert!(read_at(&t, oid, 8192, 808) == model[8192..]);
    // Growing moves the fragment (to more blocks, then to a chunk of its own): the lost
    // block moves with it, still lost.
    for end in [20_000u64, cb] {
        let from = model.len() as u64;
        let d = pattern(oid, from, (end - from) as usize, end);
        t.write(oid, from, &d).unwrap();
        model.extend_from_slice(&d);
        t.destage_all().unwrap();
        assert_lost(&t, oid, 4096, 4096);
        assert!(read_at(&t, oid, 8192, (end - 8192) as usize) == model[8192..]);
    }
    assert_eq!(t.stats().fragments_promoted, 1, "the object ended in a chunk of its own");
    let report = t.check().unwrap();
    assert_eq!(report.problems, vec!["chunk 1 block 1 does not match its checksum".to_string()], "moved with it");
}

/// A drive whose writes stop at a moment shared by all the drives of a test, as in a
/// crash: once the budget is spent every write fails and nothing more reaches the drives.
struct CrashDrive {
    inner: Arc<MemDrive>,
    budget: Arc<std::sync::atomic::AtomicI64>,
}

impl BlockDevice for CrashDrive {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if self.budget.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) <= 0 {
            return Err(std::io::Error::from_raw_os_error(5));
        }
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn path(&self) -> &std::path::Path {
        self.inner.path()
    }
}

#[test]
fn a_crash_at_any_moment_of_a_write_in_place_leaves_each_block_old_or_new_and_checked() {
    use std::sync::atomic::{AtomicI64, Ordering};
    let cb = 64u64 << 10;
    let old = pattern(1, 0, 3 * cb as usize, 1);
    // Past half a chunk, into a mapped chunk: a write in place, cutting a block at each end.
    let (at, len) = (cb + 1000, (cb - 3000) as usize);
    let mut new = old.clone();
    new[at as usize..at as usize + len].copy_from_slice(&pattern(1, at, len, 2));
    let mut recomputed = 0;
    for budget in 0.. {
        let drives = Drives::small_journal(4 << 20);
        let clock = Arc::new(AtomicI64::new(i64::MAX));
        let wrap = |d: &[Arc<MemDrive>], clock: &Arc<AtomicI64>| -> Vec<Arc<dyn BlockDevice>> {
            d.iter()
                .map(|x| Arc::new(CrashDrive { inner: x.clone(), budget: clock.clone() }) as Arc<dyn BlockDevice>)
                .collect()
        };
        let mut d = CreateOptions::new("ost0", Level::Raid6);
        d.strip_bytes = 16 << 10;
        d.assume_clean = true;
        let data = Volume::create(wrap(&drives.data, &clock), &d, &run()).unwrap();
        let mut m = CreateOptions::new("ost0-index", Level::Raid1);
        m.strip_bytes = 16 << 10;
        m.assume_clean = true;
        let meta = Volume::create(wrap(&drives.meta, &clock), &m, &run()).unwrap();
        let t = Target::format(Arc::new(data), Arc::new(meta), TargetOptions::default()).unwrap();
        let oid = t.create(1).unwrap().start;
        t.write(oid, 0, &old).unwrap();
        clock.store(budget, Ordering::SeqCst);
        let wrote = t.write(oid, at, &new[at as usize..at as usize + len]);
        let finished = wrote.is_ok() && clock.load(Ordering::SeqCst) > 0;
        drop(t);
        let again = Arc::new(AtomicI64::new(i64::MAX));
        let data = Volume::assemble(wrap(&drives.data, &again), Some("ost0"), &run()).unwrap().volume;
        let meta = Volume::assemble(wrap(&drives.meta, &again), Some("ost0-index"), &run()).unwrap().volume;
        let t = Target::open(Arc::new(data), Arc::new(meta), TargetOptions::default()).unwrap();
        let got = read_all(&t, oid);
        for (i, (g, (o, n))) in got.chunks(4096).zip(old.chunks(4096).zip(new.chunks(4096))).enumerate() {
            assert!(g == o || g == n, "crash after {budget} writes: block {i} is neither old nor new");
        }
        let report = t.check().unwrap();
        assert!(report.is_clean(), "crash after {budget} writes: {:?}", report.problems);
        recomputed += t.stats().checksum_regions_recomputed;
        if finished {
            assert!(got == new, "the write that finished reads back");
            break;
        }
    }
    assert!(recomputed > 0, "some crash fell between a write in place and its checksums' commit");
}

/// Bytes no two blocks of share.
fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len.div_ceil(8)).flat_map(|_| rng.next().to_le_bytes()).take(len).collect()
}

/// The drive and offset that hold `block` (4 KiB, found whole on one drive).
fn find_on_drives(drives: &[Arc<MemDrive>], block: &[u8]) -> (usize, u64) {
    for (i, d) in drives.iter().enumerate() {
        let mut all = vec![0u8; d.size() as usize];
        d.read_at(&mut all, 0).unwrap();
        if let Some(at) = (0..all.len() - block.len()).step_by(512).find(|&at| all[at..at + block.len()] == *block) {
            return (i, at as u64);
        }
    }
    panic!("the block is on no drive");
}

#[test]
fn a_block_a_drive_returns_wrong_is_decoded_from_parity_and_mended() {
    let mut rng = Rng(seed("decoded_from_parity"));
    let drives = Drives::new(8 << 20);
    let (t, data) = drives.format_with_data();
    let cb = t.chunk_bytes();
    let oids: Vec<u64> = t.create(5).unwrap().collect();
    // One object in chunks, one small object in a fragment, and more small objects beside
    // it in its slab (else the slab's parity could equal the fragment's strip).
    let big = random_bytes(&mut rng, 3 * cb as usize);
    let small = random_bytes(&mut rng, 9000);
    t.write(oids[0], 0, &big).unwrap();
    t.write(oids[1], 0, &small).unwrap();
    for &oid in &oids[2..] {
        t.write(oid, 0, &random_bytes(&mut rng, 16_000)).unwrap();
    }
    for (oid, bytes, block) in [(oids[0], &big, cb + 8192), (oids[1], &small, 4096)] {
        let b = block as usize;
        let (drive, at) = find_on_drives(&drives.data, &bytes[b..b + 4096]);
        // The drive flips bits and says nothing.
        drives.data[drive].corrupt(at + 100, 8);
        let repairs = data.stats().repairs;
        assert!(read_all(&t, oid) == *bytes, "the read returns the bytes as written");
        assert_eq!(data.stats().repairs, repairs + 1, "and mends the drive");
        let mut on_drive = vec![0u8; 4096];
        drives.data[drive].read_at(&mut on_drive, at).unwrap();
        assert!(on_drive == bytes[b..b + 4096], "the drive holds the right bytes again");
        assert!(read_all(&t, oid) == *bytes);
        assert_eq!(data.stats().repairs, repairs + 1, "once mended, reads find nothing wrong");
    }
    let s = t.stats();
    assert_eq!((s.checksum_repairs, s.checksum_errors), (2, 0));
    // The same damage while the drive holding the block's parity is out cannot be undone:
    // a lost block, an error, the rest readable.
    let b = (2 * cb + 4096) as usize;
    let (drive, at) = find_on_drives(&drives.data, &big[b..b + 4096]);
    drives.data[drive].corrupt(at, 8);
    let others: Vec<usize> = (0..drives.data.len()).filter(|&i| i != drive).collect();
    data.fail_drive(others[0]).unwrap();
    data.fail_drive(others[1]).unwrap();
    assert_lost(&t, oids[0], b as u64, 4096);
    assert!(read_at(&t, oids[0], 0, 2 * cb as usize) == big[..2 * cb as usize]);
    assert_eq!(t.stats().checksum_errors, 1);
}

#[test]
fn marks_of_regions_written_in_place_go_with_a_sync_or_a_second_of_quiet_not_with_a_flush() {
    let drives = Drives::new(8 << 20);
    let t = drives.format();
    let cb = t.chunk_bytes();
    let oid = t.create(1).unwrap().start;
    // Two regions of 64 chunks: chunks 0 and 64 are in different ones.
    let mut model = pattern(oid, 0, 65 * cb as usize, 1);
    t.write(oid, 0, &model).unwrap();
    let mut rewrite = |t: &Target, c: u64, salt: u64| {
        let d = pattern(oid, c * cb, cb as usize, salt);
        t.write(oid, c * cb, &d).unwrap();
        model[(c * cb) as usize..((c + 1) * cb) as usize].copy_from_slice(&d);
    };
    // Stopped without a sync right after a write in place: its chunk is checked again.
    rewrite(&t, 1, 2);
    drop(t);
    let t = drives.open().unwrap();
    assert_eq!(t.stats().checksum_regions_recomputed, 1);
    // A flush (what an fsync waits for) makes the bytes durable and leaves the mark to
    // go with quiet: the region is checked again after a stop right after it.
    rewrite(&t, 1, 6);
    t.flush().unwrap();
    drop(t);
    let t = drives.open().unwrap();
    assert_eq!(t.stats().checksum_regions_recomputed, 1);
    // A sync clears every mark.
    rewrite(&t, 2, 3);
    t.sync().unwrap();
    drop(t);
    let t = drives.open().unwrap();
    assert_eq!(t.stats().checksum_regions_recomputed, 0);
    // A write a second after another clears the older one's mark, not its own.
    rewrite(&t, 0, 4);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    rewrite(&t, 64, 5);
    drop(t);
    let t = drives.open().unwrap();
    assert_eq!(t.stats().checksum_regions_recomputed, 1);
    assert!(read_all(&t, oid) == model);
    assert!(t.check().unwrap().is_clean());
}

#[test]
fn reads_racing_writes_in_place_never_see_a_checksum_mismatch() {
    let drives = Drives::new(8 << 20);
    let t = Arc::new(drives.format());
    let cb = t.chunk_bytes();
    let oids: Vec<u64> = t.create(2).unwrap().collect();
    // One object in chunks, one in a fragment.
    t.write(oids[0], 0, &pattern(oids[0], 0, 4 * cb as usize, 0)).unwrap();
    t.write(oids[1], 0, &pattern(oids[1], 0, 12_000, 0)).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut threads = Vec::new();
    for w in 0..2u64 {
        let (t, stop, oids) = (t.clone(), stop.clone(), oids.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng(w + 1);
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                // In place: whole chunks, pieces past half a chunk cutting blocks, small
                // pieces through the journal, and the fragment.
                let (oid, off, len) = match rng.below(4) {
                    0 => (oids[0], rng.below(4) * cb, cb as usize),
                    1 => (oids[0], rng.below(3 * cb), (cb / 2 + rng.below(cb / 2)) as usize),
                    2 => (oids[0], rng.below(4 * cb - 5000), 1 + rng.below(5000) as usize),
                    _ => (oids[1], rng.below(11_000), 1 + rng.below(1000) as usize),
                };
                t.write(oid, off, &pattern(oid, off, len, n)).unwrap();
            }
        }));
    }
    for r in 0..2u64 {
        let (t, stop, oids) = (t.clone(), stop.clone(), oids.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng(r + 100);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let oid = oids[rng.below(2) as usize];
                let size = t.getattr(oid).unwrap().size;
                let off = rng.below(size);
                let mut buf = vec![0u8; 1 + rng.below(cb) as usize];
                if let Err(e) = t.read(oid, off, &mut buf) {
                    panic!("a read racing writes failed: {e}");
                }
            }
        }));
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(t.stats().checksum_errors, 0);
    t.destage_all().unwrap();
    let report = t.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_scrub_mends_what_parity_knows_and_names_what_is_lost() {
    let mut rng = Rng(seed("scrub"));
    let drives = Drives::new(8 << 20);
    let (t, data) = drives.format_with_data();
    let cb = t.chunk_bytes();
    let oids: Vec<u64> = t.create(4).unwrap().collect();
    let big = random_bytes(&mut rng, 3 * cb as usize);
    t.write(oids[0], 0, &big).unwrap();
    for &oid in &oids[1..] {
        t.write(oid, 0, &random_bytes(&mut rng, 9000)).unwrap();
    }
    // A small object shrunk and grown again: blocks given back and taken anew.
    t.truncate(oids[3], 100).unwrap();
    t.write(oids[3], 0, &random_bytes(&mut rng, 9000)).unwrap();
    let clean = t.scrub(|_, _| true).unwrap();
    assert_eq!((clean.mended, clean.lost_blocks), (0, 0), "{clean:?}");
    assert!(clean.chunks >= 4 && clean.blocks == clean.chunks * cb / 4096);
    // A drive flips bits under one block; a misdirected write (parity follows it) changes
    // another. Neither is read by anyone before the scrub.
    let b = (cb + 8192) as usize;
    let (drive, at) = find_on_drives(&drives.data, &big[b..b + 4096]);
    drives.data[drive].corrupt(at + 7, 3);
    data.write(2 * cb + 4096 * 3 + 5, &[0xAB; 3]).unwrap();
    let mut seen = Vec::new();
    let r = t
        .scrub(|done, total| {
            seen.push((done, total));
            true
        })
        .unwrap();
    assert!(r.complete);
    assert_eq!((r.mended, r.lost_blocks, r.lost.clone()), (1, 1, vec![2 * cb + 4096 * 3]));
    assert_eq!(seen.last(), Some(&(r.chunks, r.chunks)), "progress reaches the end");
    let mut on_drive = vec![0u8; 4096];
    drives.data[drive].read_at(&mut on_drive, at).unwrap();
    assert!(on_drive == big[b..b + 4096], "the scrub mended the drive");
    // Again: nothing more to mend, the lost block still lost; written whole, it is gone.
    let again = t.scrub(|_, _| true).unwrap();
    assert_eq!((again.mended, again.lost_blocks), (0, 1));
    t.write(oids[0], 2 * cb + 4096 * 3, &random_bytes(&mut rng, 4096)).unwrap();
    t.destage_all().unwrap();
    let last = t.scrub(|_, _| true).unwrap();
    assert_eq!((last.mended, last.lost_blocks), (0, 0));
    // Neighbouring chunks are read 16 at a time; stopped after the first 16, it says so.
    let more = t.create(1).unwrap().start;
    t.write(more, 0, &random_bytes(&mut rng, 20 * cb as usize)).unwrap();
    let stopped = t.scrub(|_, _| false).unwrap();
    assert_eq!((stopped.chunks, stopped.complete), (16, false));
    assert!(t.scrub(|_, _| true).unwrap().complete);
}
