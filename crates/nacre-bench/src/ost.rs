//! `nacre bench ost`: Nacre's obdfilter-survey. One target on file drives — RAID6 8+2 for
//! data, RAID1 for the index — and, in the same run, the raw data volume:
//!
//! - raw write / read: `threads` streams of `brw`-byte IOs straight to the volume;
//! - object write / rewrite / read: the same streams into one object per thread;
//! - small writes: `threads` writers interleaving 47,008-byte pieces (IO500's ior-hard
//!   transfer) into one shared object, answered before commit (the OSS's write-back; the
//!   clock stops when the last commit is on the drives), twice the write-back's bound so
//!   that commits follow each other: with the writers paced (each yields after each
//!   piece, as requests from many clients interleave) and in bursts (each runs for its
//!   time slice); and again each written to the drives before it returns (the journal);
//! - raw index writes: `threads` writers of 48 KiB (one journal record of 47,008 bytes)
//!   straight to the mirrored index volume, the reference for the small writes;
//! - random 4 KiB reads: `threads` readers (the queue depth), each reading aligned 4 KiB
//!   blocks at random places of the objects, against the same on the raw volume;
//! - small objects: 10,000 objects of 3,901 bytes (IO500's mdtest file), the space they
//!   take from the target over their bytes, and all of it given back when they go.
//!
//! A small write is acknowledged once its record is on the mirrored volume, and its chunk
//! is later destaged as one full stripe; so the sustained small-write rate can be no
//! higher than the bound of writing each byte once as a journal record (at the raw index
//! rate) and once more in full stripes (at the raw data rate) on the same disk:
//! `1 / (1 / raw_index_small + 1 / raw_write)`. The bench reports it and how close the
//! small writes come.
//!
//! Every read checks what it gets. Rounds interleave raw and object phases and keep the
//! best of each, because the shared disk moves single runs a lot.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use nacre_osd::{Target, TargetOptions, WriteBack, WriteBackOptions};
use nacre_raid::align::AlignedBuf;
use nacre_raid::{Level, Volume};
use serde_json::{Value, json};

use crate::net::rss_mib;
use crate::raid::{BenchError, check, create, make_drives, peak, ratio, stamp, timed};

/// Objects the memory phase creates.
const MANY_OBJECTS: u64 = 100_000;

/// IO500's ior-hard transfer size.
pub const SMALL_WRITE_BYTES: usize = 47_008;

/// What one 47,008-byte journal record occupies on the index volume (a 64-byte header,
/// rounded up to 4 KiB).
const SMALL_RECORD_BYTES: usize = 48 << 10;

#[derive(Debug, Clone)]
pub struct OstBenchOptions {
    pub dir: PathBuf,
    /// Bytes each large phase moves.
    pub size: u64,
    pub threads: usize,
    pub rounds: usize,
    /// Bytes per large IO (Lustre's `brw_size`).
    pub brw: u64,
    pub strip: u64,
    /// Objects the small-objects space phase makes (IO500's mdtest file size each).
    pub small_objects: u32,
}

impl OstBenchOptions {
    pub fn new(dir: PathBuf) -> OstBenchOptions {
        OstBenchOptions {
            dir,
            size: 1 << 30,
            threads: 8,
            rounds: 3,
            brw: 16 << 20,
            strip: 128 << 10,
            small_objects: 10_000,
        }
    }
}

/// Large streams straight to the volume: thread `j` owns `[j × per, (j+1) × per)`.
fn raw(v: &Volume, o: &OstBenchOptions, write: bool, salt: u64) -> Result<f64, BenchError> {
    let per = o.size / o.threads as u64 / o.brw * o.brw;
    let secs = timed(
        o.threads,
        |_| AlignedBuf::zeroed(o.brw as usize),
        |j, buf| {
            for n in 0..per / o.brw {
                let off = j as u64 * per + n * o.brw;
                if write {
                    stamp(buf, off, salt);
                    v.write(off, buf)?;
                } else {
                    v.read(off, buf)?;
                    check(buf, off, salt)?;
                }
            }
            Ok(())
        },
    )?;
    Ok((per * o.threads as u64) as f64 / secs / 1e9)
}

/// Journal-record-sized writes straight to the index volume: `threads` writers taking
/// turns along it, as appenders to a log do; as many bytes as the small-write phase.
fn raw_index_small(v: &Volume, o: &OstBenchOptions) -> Result<f64, BenchError> {
    let records = small_pieces_per_thread(o, journaled_small_bytes(o)) * o.threads as u64;
    let room = v.capacity() / SMALL_RECORD_BYTES as u64;
    let per = records / o.threads as u64;
    let secs = timed(
        o.threads,
        |_| AlignedBuf::zeroed(SMALL_RECORD_BYTES),
        |j, buf| {
            for n in 0..per {
                let at = (n * o.threads as u64 + j as u64) % room;
                v.write(at * SMALL_RECORD_BYTES as u64, buf)?;
            }
            Ok(())
        },
    )?;
    Ok((per * o.threads as u64 * SMALL_WRITE_BYTES as u64) as f64 / secs / 1e9)
}

/// Each writer's pieces for `bytes` of small writes in all.
fn small_pieces_per_thread(o: &OstBenchOptions, bytes: u64) -> u64 {
    (bytes / SMALL_WRITE_BYTES as u64 / o.threads as u64).max(1)
}

/// Bytes of the small writes answered before commit: twice the write-back's default
/// bound, so that the phase is commits following each other as under a long ior-hard,
/// not one burst and its commit.
fn held_small_bytes(o: &OstBenchOptions) -> u64 {
    o.size / 2
}

/// Bytes of the small writes each on the drives before its answer (and of the raw index
/// writes, their reference): slow, so fewer.
fn journaled_small_bytes(o: &OstBenchOptions) -> u64 {
    o.size / 8
}

/// Large streams into objects: thread `j` writes or reads object `oids[j]` from 0.
fn objects(t: &Target, oids: &[u64], o: &OstBenchOptions, write: bool, salt: u64) -> Result<f64, BenchError> {
    let per = o.size / o.threads as u64 / o.brw * o.brw;
    let secs = timed(
        o.threads,
        |_| AlignedBuf::zeroed(o.brw as usize),
        |j, buf| {
            let oid = oids[j];
            for n in 0..per / o.brw {
                let off = n * o.brw;
                // Stamped with the object in the high bits, so objects never look alike.
                let tag = (oid << 40) | off;
                if write {
                    stamp(buf, tag, salt);
                    t.write(oid, off, buf).map_err(|e| BenchError::Bad(e.to_string()))?;
                } else {
                    let got = t.read(oid, off, buf).map_err(|e| BenchError::Bad(e.to_string()))?;
                    if got != buf.len() {
                        return Err(BenchError::Verify(format!("object {oid:#x}: short read at {off}")));
                    }
                    check(buf, tag, salt)?;
                }
            }
            Ok(())
        },
    )?;
    Ok((per * o.threads as u64) as f64 / secs / 1e9)
}

/// Interleaved 47,008-byte writes into one object; returns GB/s and the seconds of the
/// last commit, after checking the object. Through `wb`, each is answered before commit
/// and the clock stops once the last commit has put every byte on the drives; without,
/// each is on the drives when it returns.
///
/// `paced`: each writer yields the CPU after each piece, so that the writers' pieces
/// arrive interleaved, as requests from many clients over a network do. Unpaced, eight
/// writers on two cores run in bursts of a scheduler time slice each and drift apart by
/// a hundred MiB and more of the object: most chunks are still partial at each commit.
fn small_writes(
    t: &Target,
    wb: Option<&WriteBack>,
    oid: u64,
    o: &OstBenchOptions,
    bytes: u64,
    paced: bool,
) -> Result<(f64, f64), BenchError> {
    let pieces_per_thread = small_pieces_per_thread(o, bytes);
    // Piece i is a window into one pattern (built before the clock starts): distinct per
    // piece, and nothing is computed per byte while timing.
    let pattern: Vec<u8> = (0..SMALL_WRITE_BYTES as u64 + 251).map(|b| (b % 251) as u8).collect();
    let piece = |i: u64| -> &[u8] {
        let at = ((i * 7) % 251) as usize;
        &pattern[at..at + SMALL_WRITE_BYTES]
    };
    let bad = |e: nacre_osd::OsdError| BenchError::Bad(e.to_string());
    let last_done = std::sync::atomic::AtomicUsize::new(0);
    let commit_us = std::sync::atomic::AtomicU64::new(0);
    let secs = timed(
        o.threads,
        |_| (),
        |j, _| {
            for k in 0..pieces_per_thread {
                let i = k * o.threads as u64 + j as u64;
                let at = i * SMALL_WRITE_BYTES as u64;
                match wb {
                    Some(wb) => wb.write(0, j as u64 + 1, oid, &[(at, piece(i))], None).map(drop).map_err(bad)?,
                    None => t.write(oid, at, piece(i)).map_err(bad)?,
                }
                if paced {
                    std::thread::yield_now();
                }
            }
            // The last writer to finish waits for the commit of everything.
            if last_done.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1 == o.threads
                && let Some(wb) = wb
            {
                let started = Instant::now();
                wb.commit().map_err(bad)?;
                commit_us.store(started.elapsed().as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        },
    )?;
    let total = pieces_per_thread * o.threads as u64;
    let mut buf = vec![0u8; SMALL_WRITE_BYTES];
    for i in 0..total {
        let n = t.read(oid, i * SMALL_WRITE_BYTES as u64, &mut buf).map_err(|e| BenchError::Bad(e.to_string()))?;
        if n != buf.len() || buf != piece(i) {
            return Err(BenchError::Verify(format!("small write {i} of object {oid:#x} reads back different")));
        }
    }
    let commit_secs = commit_us.into_inner() as f64 / 1e6;
    Ok(((total * SMALL_WRITE_BYTES as u64) as f64 / secs / 1e9, commit_secs))
}

/// How long each random-read phase reads.
const RAND_READ_SECS: f64 = 1.0;
/// Bytes of each random read (IO500's ior-rnd4K).
const RAND_READ_BYTES: usize = 4096;
/// The size of the space phase's small objects (IO500's mdtest file).
const SMALL_OBJECT_BYTES: usize = 3_901;

/// `threads` readers of random aligned 4 KiB blocks for [`RAND_READ_SECS`]: reader `j`
/// calls `read(j, k, buf)` for its `k`-th read, which reads and checks one block. Returns
/// reads per second.
fn rand_reads<F>(threads: usize, read: F) -> Result<f64, BenchError>
where
    F: Fn(usize, u64, &mut [u8]) -> Result<(), BenchError> + Sync,
{
    let done: Vec<std::sync::atomic::AtomicU64> = (0..threads).map(|_| Default::default()).collect();
    let secs = timed(
        threads,
        |_| AlignedBuf::zeroed(RAND_READ_BYTES),
        |j, buf| {
            let start = Instant::now();
            let mut k = 0;
            while start.elapsed().as_secs_f64() < RAND_READ_SECS {
                read(j, k, buf)?;
                k += 1;
            }
            done[j].store(k, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        },
    )?;
    let reads: u64 = done.iter().map(|d| d.load(std::sync::atomic::Ordering::Relaxed)).sum();
    Ok(reads as f64 / secs)
}

/// The `k`-th random block of reader `j` among `blocks` (a fixed mix, so rounds and the
/// raw and object phases draw alike).
fn rand_block(j: usize, k: u64, blocks: u64) -> u64 {
    let mut x = (j as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 29)) % blocks.max(1)
}

/// Random 4 KiB reads of the raw volume's first `size` bytes, as `raw` wrote them.
fn raw_rand_reads(v: &Volume, o: &OstBenchOptions, salt: u64) -> Result<f64, BenchError> {
    let per = o.size / o.threads as u64 / o.brw * o.brw;
    let blocks = per * o.threads as u64 / RAND_READ_BYTES as u64;
    rand_reads(o.threads, |j, k, buf| {
        let off = rand_block(j, k, blocks) * RAND_READ_BYTES as u64;
        v.read(off, buf)?;
        check(buf, off, salt)
    })
}

/// Random 4 KiB reads spread over the objects `objects` wrote.
fn object_rand_reads(t: &Target, oids: &[u64], o: &OstBenchOptions, salt: u64) -> Result<f64, BenchError> {
    let per = o.size / o.threads as u64 / o.brw * o.brw;
    let blocks = per / RAND_READ_BYTES as u64;
    let objects = o.threads as u64;
    rand_reads(o.threads, |j, k, buf| {
        let b = rand_block(j, k, blocks * objects);
        let (oid, off) = (oids[(b / blocks) as usize], (b % blocks) * RAND_READ_BYTES as u64);
        let got = t.read(oid, off, buf).map_err(|e| BenchError::Bad(e.to_string()))?;
        if got != buf.len() {
            return Err(BenchError::Verify(format!("object {oid:#x}: short read at {off}")));
        }
        check(buf, (oid << 40) | off, salt)
    })
}

/// What [`small_objects`] found.
struct SmallSpace {
    /// Target space the objects took over their bytes.
    ratio: f64,
    /// Bytes per object.
    per_object: f64,
    /// Objects made per second (create, write).
    per_s: f64,
    /// Whether all of it came back when they were destroyed.
    given_back: bool,
}

/// `small_objects` objects of [`SMALL_OBJECT_BYTES`], written by `threads` writers, read
/// back, then destroyed.
fn small_objects(t: &Target, o: &OstBenchOptions) -> Result<SmallSpace, BenchError> {
    let bad = |e: nacre_osd::OsdError| BenchError::Bad(e.to_string());
    let free = |t: &Target| t.statfs().map(|s| s.free_bytes).map_err(bad);
    let before = free(t)?;
    let count = o.small_objects.max(1);
    let oids: Vec<u64> = t.create(count).map_err(bad)?.collect();
    let body =
        |oid: u64| -> Vec<u8> { (0..SMALL_OBJECT_BYTES as u64).map(|i| (oid.wrapping_add(i) % 251) as u8).collect() };
    let secs = timed(
        o.threads,
        |_| (),
        |j, _| {
            for &oid in oids.iter().skip(j).step_by(o.threads) {
                t.write(oid, 0, &body(oid)).map_err(bad)?;
            }
            Ok(())
        },
    )?;
    t.destage_all().map_err(bad)?;
    let taken = before.saturating_sub(free(t)?);
    let mut buf = vec![0u8; SMALL_OBJECT_BYTES + 1];
    for &oid in &oids {
        let n = t.read(oid, 0, &mut buf).map_err(bad)?;
        if n != SMALL_OBJECT_BYTES || buf[..n] != body(oid)[..] {
            return Err(BenchError::Verify(format!("small object {oid:#x} reads back different")));
        }
    }
    for &oid in &oids {
        t.destroy(oid).map_err(bad)?;
    }
    let bytes = (u64::from(count) * SMALL_OBJECT_BYTES as u64) as f64;
    Ok(SmallSpace {
        ratio: ratio(taken as f64, bytes),
        per_object: taken as f64 / f64::from(count),
        per_s: f64::from(count) / secs,
        given_back: free(t)? == before,
    })
}

/// Run the bench; prints progress and a table, returns the figures.
pub fn run_ost_bench(o: &OstBenchOptions, out: &mut dyn std::io::Write) -> Result<Value, BenchError> {
    if o.threads == 0 || (o.size / o.threads as u64) < o.brw {
        return Err(BenchError::Bad(format!(
            "--size {} is too small for {} threads of {}-byte IOs",
            o.size, o.threads, o.brw
        )));
    }
    std::fs::create_dir_all(&o.dir)?;
    let work = o.dir.join(format!("nacre-bench-ost-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let result = run_in(o, &work, out);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn run_in(o: &OstBenchOptions, work: &std::path::Path, out: &mut dyn std::io::Write) -> Result<Value, BenchError> {
    // Each data drive holds an eighth of a phase plus a quarter spare (chunks are whole
    // stripes; the small-write object needs its own).
    // The objects (`size`), both small-write objects, and the small objects, with slack.
    let data_drive =
        ((o.size + 2 * held_small_bytes(o) + journaled_small_bytes(o)) / 8 + o.size / 32).div_ceil(1 << 20) * (1 << 20)
            + (64 << 20);
    let _ = writeln!(
        out,
        "nacre bench ost: RAID6 8+2 data ({} MiB drives, {} KiB strips) + RAID10 index (4 x 1 GiB) in {}, {} threads, {} MiB IOs, {} MiB per phase, {} rounds",
        data_drive >> 20,
        o.strip >> 10,
        o.dir.display(),
        o.threads,
        o.brw >> 20,
        o.size >> 20,
        o.rounds
    );
    let (data_dir, index_dir) = (work.join("data"), work.join("index"));
    std::fs::create_dir_all(&data_dir)?;
    std::fs::create_dir_all(&index_dir)?;
    let data = Arc::new(create(&make_drives(&data_dir, 10, data_drive)?, Level::Raid6, o.strip)?);
    // The index volume: RAID10 over four 1 GiB drives (a 512 MiB journal), 256 KiB
    // strips. Measured for 47,008-byte writes (512M, one round each): RAID1 with 64 KiB
    // strips 0.206 GB/s (a journal batch's partial stripes went one after another), RAID1
    // with 1 MiB strips 0.231-0.238, RAID10 0.271-0.272; more journal batches in flight or
    // more IO threads per drive did not help on these file drives.
    let meta = Arc::new(create(&make_drives(&index_dir, 4, 1 << 30)?, Level::Raid10, 256 << 10)?);
    // f[5]: 47,008-byte writes answered before commit, paced; f[7]: each on the drives
    // before it returns (the journal); f[8]: answered before commit, in bursts.
    let mut f: [Vec<f64>; 9] = Default::default();
    // Random 4 KiB reads per second: the raw volume's, the objects'.
    let (mut raw_rand, mut obj_rand) = (Vec::new(), Vec::new());
    // A scrub of everything written so far (every block against its checksum), GB/s.
    let mut scrub = Vec::new();
    for round in 0..o.rounds.max(1) {
        let salt = 0x5eed + round as u64;
        f[0].push(raw(&data, o, true, salt)?);
        f[1].push(raw(&data, o, false, salt)?);
        raw_rand.push(raw_rand_reads(&data, o, salt)?);
        // Before the format: the target's index lives on this volume.
        f[6].push(raw_index_small(&meta, o)?);
        let t = Target::format(data.clone(), meta.clone(), TargetOptions::default())
            .map_err(|e| BenchError::Bad(e.to_string()))?;
        let oids: Vec<u64> = t.create(o.threads as u32 + 1).map_err(|e| BenchError::Bad(e.to_string()))?.collect();
        f[2].push(objects(&t, &oids, o, true, salt)?);
        f[3].push(objects(&t, &oids, o, true, salt + 1)?);
        f[4].push(objects(&t, &oids, o, false, salt + 1)?);
        obj_rand.push(object_rand_reads(&t, &oids, o, salt + 1)?);
        let started = Instant::now();
        let r = t.scrub(|_, _| true).map_err(|e| BenchError::Bad(e.to_string()))?;
        if r.lost_blocks > 0 || r.mended > 0 {
            return Err(BenchError::Bad(format!(
                "the scrub found {} lost and {} mended blocks",
                r.lost_blocks, r.mended
            )));
        }
        scrub.push((r.blocks * nacre_osd::target::BLOCK_BYTES) as f64 / started.elapsed().as_secs_f64() / 1e9);
        let t = Arc::new(t);
        // Paced (the figure of the target) and in bursts.
        for (paced, slot) in [(true, 5), (false, 8)] {
            let wb = WriteBack::new(vec![t.clone()], WriteBackOptions::default())
                .map_err(|e| BenchError::Bad(e.to_string()))?;
            let oid = t.create(1).map_err(|e| BenchError::Bad(e.to_string()))?.start;
            let (gbps, commit_secs) = small_writes(&t, Some(&wb), oid, o, held_small_bytes(o), paced)?;
            f[slot].push(gbps);
            let w = wb.stats();
            drop(wb);
            let _ = writeln!(
                out,
                "  small writes answered before commit, {}: {:.0} ms in all, the last commit {:.0} ms; {} held, {} commits of {} extents ({:.0} KiB each), {} MiB of partial chunks held over, {} waits for room",
                if paced { "paced" } else { "in bursts" },
                held_small_bytes(o) as f64 / gbps / 1e6,
                commit_secs * 1e3,
                w.held,
                w.commits,
                w.committed_extents,
                w.committed_bytes as f64 / w.committed_extents.max(1) as f64 / 1024.0,
                w.kept_bytes >> 20,
                w.waits
            );
        }
        let sync_oid = t.create(1).map_err(|e| BenchError::Bad(e.to_string()))?.start;
        let before = t.stats();
        f[7].push(small_writes(&t, None, sync_oid, o, journaled_small_bytes(o), true)?.0);
        let after = t.stats();
        let _ = writeln!(
            out,
            "  small writes each on the drives before its answer: {} journaled in {} batches, {} chunks destaged in {:.0} ms of destage time; {:.0} ms in appends of {:.0} ms",
            after.journaled - before.journaled,
            after.journal_batches - before.journal_batches,
            after.destaged - before.destaged,
            (after.destage_us - before.destage_us) as f64 / 1000.0,
            (after.append_us - before.append_us) as f64 / 1000.0,
            (after.small_write_us - before.small_write_us) as f64 / 1000.0,
        );
        let report = t.check().map_err(|e| BenchError::Bad(e.to_string()))?;
        if !report.is_clean() {
            return Err(BenchError::Verify(format!("check after round {round}: {:?}", report.problems)));
        }
        let _ = writeln!(
            out,
            "round {}: raw write {:.2} read {:.2} index 48K {:.3} | object write {:.2} rewrite {:.2} read {:.2} | 47,008-byte writes {:.3} GB/s paced, {:.3} in bursts, {:.3} each on the drives before its answer | random 4 KiB reads: raw {:.0}/s, objects {:.0}/s",
            round + 1,
            f[0][round],
            f[1][round],
            f[6][round],
            f[2][round],
            f[3][round],
            f[4][round],
            f[5][round],
            f[8][round],
            f[7][round],
            raw_rand[round],
            obj_rand[round]
        );
    }
    // Memory under many objects: the index lives on the volume, so creating 100,000
    // objects (in Helma's precreate batches of 1,024) must not grow the process by more
    // than redb's bounded cache.
    let t = Target::format(data.clone(), meta.clone(), TargetOptions::default())
        .map_err(|e| BenchError::Bad(e.to_string()))?;
    let small = small_objects(&t, o)?;
    let _ = writeln!(
        out,
        "{} objects of {SMALL_OBJECT_BYTES} bytes: {:.0} bytes of target space each ({:.2}x their bytes), {:.0} made/s; {} when destroyed",
        o.small_objects.max(1),
        small.per_object,
        small.ratio,
        small.per_s,
        if small.given_back { "all space given back" } else { "SPACE NOT GIVEN BACK" }
    );
    if !small.given_back {
        return Err(BenchError::Verify("destroying the small objects did not give back their space".into()));
    }
    let rss_before = rss_mib().0;
    let started = Instant::now();
    for _ in 0..MANY_OBJECTS / 1024 {
        t.create(1024).map_err(|e| BenchError::Bad(e.to_string()))?;
    }
    let create_rate = (MANY_OBJECTS / 1024 * 1024) as f64 / started.elapsed().as_secs_f64();
    let rss_after = rss_mib().0;
    let objects = t.statfs().map_err(|e| BenchError::Bad(e.to_string()))?.objects;
    let _ = writeln!(
        out,
        "{objects} objects created at {create_rate:.0}/s; process RSS {rss_before:.0} -> {rss_after:.0} MiB (redb cache: 64 MiB at most)"
    );
    drop(t);
    let b: Vec<f64> = f.iter().map(|v| peak(v)).collect();
    let (write_ratio, read_ratio, rewrite_ratio, small_ratio) =
        (ratio(b[2], b[0]), ratio(b[4], b[1]), ratio(b[3], b[0]), ratio(b[5], b[2]));
    // Each small-write byte goes once to the journal and once more in a full stripe.
    let bound = if b[6] > 0.0 && b[0] > 0.0 { 1.0 / (1.0 / b[6] + 1.0 / b[0]) } else { 0.0 };
    let (bound_ratio, small_vs_bound) = (ratio(bound, b[2]), ratio(b[7], bound));
    let small_sync_ratio = ratio(b[7], b[2]);
    let small_bursty_ratio = ratio(b[8], b[2]);
    let (raw_rand, obj_rand) = (peak(&raw_rand), peak(&obj_rand));
    let rand_ratio = ratio(obj_rand, raw_rand);
    let scrub = peak(&scrub);
    let scrub_ratio = ratio(scrub, b[1]);
    let _ = writeln!(out, "\n| phase | GB/s (best of {}) | ratio | target |\n|---|---:|---:|---:|", o.rounds);
    let _ = writeln!(out, "| raw volume write | {:.2} | | |", b[0]);
    let _ = writeln!(out, "| raw volume read | {:.2} | | |", b[1]);
    let _ = writeln!(out, "| object write | {:.2} | {write_ratio:.3} of raw write | ≥ 0.9 |", b[2]);
    let _ = writeln!(out, "| object rewrite | {:.2} | {rewrite_ratio:.3} of raw write | |", b[3]);
    let _ = writeln!(out, "| object read | {:.2} | {read_ratio:.3} of raw read | ≥ 0.9 |", b[4]);
    let _ = writeln!(
        out,
        "| 47,008-byte writes, answered before commit (writers paced) | {:.3} | {small_ratio:.3} of object write | ≥ 0.5 |",
        b[5]
    );
    let _ = writeln!(
        out,
        "| 47,008-byte writes, answered before commit (writers in bursts) | {:.3} | {small_bursty_ratio:.3} of object write | |",
        b[8]
    );
    let _ = writeln!(
        out,
        "| 47,008-byte writes, each on the drives before its answer | {:.3} | {small_sync_ratio:.3} of object write | |",
        b[7]
    );
    let _ =
        writeln!(out, "| raw index volume, 48 KiB writes | {:.3} | {:.3} of object write | |", b[6], ratio(b[6], b[2]));
    let _ = writeln!(
        out,
        "| bound for journaled small writes | {bound:.3} | {bound_ratio:.3} of object write | journaled ones reach {small_vs_bound:.3} of it |"
    );
    let _ = writeln!(
        out,
        "\n| random 4 KiB reads, queue depth {} | reads/s (best of {}) | ratio | target |\n|---|---:|---:|---:|",
        o.threads, o.rounds
    );
    let _ = writeln!(out, "| raw volume | {raw_rand:.0} | | |");
    let _ = writeln!(out, "| objects | {obj_rand:.0} | {rand_ratio:.3} of raw | ≥ 0.7 |");
    let _ = writeln!(
        out,
        "\nscrub (one thread, every block against its checksum): {scrub:.2} GB/s, {scrub_ratio:.3} of the raw volume's read"
    );
    let _ = writeln!(
        out,
        "small objects: {:.2}x their bytes of target space (target ≤ 2, with the MDT's share)",
        small.ratio
    );
    Ok(json!({
        "bench": "ost",
        "dir": o.dir.display().to_string(),
        "size": o.size,
        "threads": o.threads,
        "rounds": o.rounds,
        "brw_size": o.brw,
        "raw_write_gbps": b[0],
        "raw_read_gbps": b[1],
        "write_gbps": b[2],
        "rewrite_gbps": b[3],
        "read_gbps": b[4],
        "small_write_gbps": b[5],
        "small_write_sync_gbps": b[7],
        "small_write_bursty_gbps": b[8],
        "small_write_bursty_ratio": small_bursty_ratio,
        "small_write_sync_ratio": small_sync_ratio,
        "write_ratio": write_ratio,
        "read_ratio": read_ratio,
        "rewrite_ratio": rewrite_ratio,
        "small_write_ratio": small_ratio,
        "raw_index_small_gbps": b[6],
        "small_write_bound_gbps": bound,
        "small_write_bound_ratio": bound_ratio,
        "small_write_vs_bound": small_vs_bound,
        "raw_rand_read_iops": raw_rand,
        "rand_read_iops": obj_rand,
        "rand_read_vs_volume_ratio": rand_ratio,
        "scrub_gbps": scrub,
        "scrub_vs_raw_read_ratio": scrub_ratio,
        "small_file_space_ratio": small.ratio,
        "small_object_bytes_each": small.per_object,
        "small_objects_per_s": small.per_s,
        "objects_created": objects,
        "create_per_s": create_rate,
        "rss_before_objects_mib": rss_before,
        "rss_after_objects_mib": rss_after,
    }))
}
