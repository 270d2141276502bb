//! Writes answered before commit, as Lustre's OSTs answer them: a small write is held in
//! memory and answered with a transaction number (transno); a committer writes what is
//! held to the targets in the background and then records `last_committed`, the highest
//! transno on the drives. The client keeps each write it was answered for until
//! `last_committed` covers it and sends it again after a restart of the server (replay),
//! so nothing answered is lost when the server dies; what `fsync` promises waits for a
//! commit ([`WriteBack::commit`]).
//!
//! **Why.** A small write written at once costs a journal record on the mirrored index
//! volume and, later, its stripe again: IO500's ior-hard pieces (47,008 bytes) reached
//! 0.13 of whole-stripe writes that way. Held for a moment, the pieces of several writers
//! meet: the committer writes them as long extents, most of them whole stripes.
//!
//! **What is held.** Per object, its extents, merged as they touch (a later write over an
//! earlier one replaces its bytes). Reads, `getattr` and the sizes they give see them. A
//! write of a chunk or more goes straight to its target, as before: it is a full-stripe
//! write already, and holding it would only cost the client memory. Memory is bounded
//! (`max_bytes`): a write that finds it full waits for the committer.
//!
//! **Order.** Whatever changes an object other than a held write (a truncate, punch,
//! destroy, or a write that goes straight through) runs with the object's older writes
//! committed first and with later writes to it waiting: a write answered before a
//! truncate can never land after it, neither now nor at replay (a replay at or below
//! `last_committed` is only acknowledged, never run again).
//!
//! **Restart.** `last_committed` and the clients that were answered before commit are kept
//! in each target's index. A client's first held write records it there before its
//! answer, so a restarted server knows whom to wait for (see `nacre_net::recovery`).
//!
//! **Failure.** Should a commit fail on the drives, the server stops answering before
//! commit: what the failed commit held stays readable here and in the clients' replay
//! lists, `last_committed` stops, and every later write goes straight through, so its
//! caller gets the error.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{OsdError, Result};
use crate::object::ObjectAttr;
use crate::target::Target;

/// Key of `last_committed` in each target's service values.
const LAST_COMMITTED: &str = "wb.last_committed";
/// Prefix of the keys of clients answered before commit.
const CLIENT: &str = "wb.client.";
/// Bytes a commit joins into one write at most (then cut at a chunk boundary).
const RUN_BYTES: u64 = 16 << 20;
/// A commit starts, whatever the interval, once a `1 / COMMIT_AT` of `max_bytes` is held.
/// Earlier commits cut interleaved writers' pieces into short runs that go through the
/// journal (`nacre bench ost`: an eighth gave 0.10 of object writes, a half 0.27-0.43).
const COMMIT_AT: u64 = 2;
/// Writes a commit runs at once.
const COMMIT_STREAMS: usize = 8;

#[derive(Debug, Clone, Copy)]
pub struct WriteBackOptions {
    /// Bytes held at most (`obdfilter.*.writeback_max_mb`).
    pub max_bytes: u64,
    /// How long held bytes wait for company before the committer writes them
    /// (`obdfilter.*.commit_interval_ms`).
    pub commit_interval: Duration,
}

impl Default for WriteBackOptions {
    fn default() -> Self {
        WriteBackOptions { max_bytes: 256 << 20, commit_interval: Duration::from_millis(200) }
    }
}

/// The held pieces of one object: non-overlapping, by offset. Pieces are kept as they
/// came (a later one cuts what it covers out of earlier ones) and joined only when
/// committed, so that a write never copies its neighbours.
#[derive(Default)]
struct Extents {
    map: BTreeMap<u64, Vec<u8>>,
    /// When the last held write came (for the object's mtime).
    mtime_ns: i64,
}

impl Extents {
    fn end(&self) -> u64 {
        self.map.iter().next_back().map_or(0, |(o, v)| o + v.len() as u64)
    }

    /// The pieces that overlap `[off, end)`, by start.
    fn overlapping(&self, off: u64, end: u64) -> impl Iterator<Item = (&u64, &Vec<u8>)> {
        let first = self.map.range(..=off).next_back().map_or(off, |(&s, _)| s);
        self.map.range(first..end).filter(move |(s, v)| **s + v.len() as u64 > off)
    }

    /// Hold `data` at `off` over what was held; returns the bytes held before in that
    /// range (now replaced).
    fn insert(&mut self, off: u64, data: &[u8]) -> u64 {
        let end = off + data.len() as u64;
        let hit: Vec<u64> = self.overlapping(off, end).map(|(&s, _)| s).collect();
        let mut replaced = 0;
        for s in hit {
            let Some(mut v) = self.map.remove(&s) else { continue };
            let v_end = s + v.len() as u64;
            replaced += v_end.min(end) - s.max(off);
            if v_end > end {
                self.map.insert(end, v[(end - s) as usize..].to_vec());
            }
            if s < off {
                v.truncate((off - s) as usize);
                self.map.insert(s, v);
            }
        }
        self.map.insert(off, data.to_vec());
        replaced
    }

    /// Copy what is held of `[off, off + buf.len())` into `buf`.
    fn overlay(&self, off: u64, buf: &mut [u8]) {
        let end = off + buf.len() as u64;
        for (&s, v) in self.overlapping(off, end) {
            let (lo, hi) = (s.max(off), (s + v.len() as u64).min(end));
            buf[(lo - off) as usize..(hi - off) as usize].copy_from_slice(&v[(lo - s) as usize..(hi - s) as usize]);
        }
    }

    /// What is held of `[off, end)`, as pieces of their own.
    fn part(&self, off: u64, end: u64) -> Extents {
        let mut out = Extents { map: BTreeMap::new(), mtime_ns: self.mtime_ns };
        for (&s, v) in self.overlapping(off, end) {
            let (lo, hi) = (s.max(off), (s + v.len() as u64).min(end));
            out.map.insert(lo, v[(lo - s) as usize..(hi - s) as usize].to_vec());
        }
        out
    }

    /// The pieces joined where they touch, in runs of at most about `most` bytes cut at
    /// multiples of `chunk` (so that a long run is whole stripes).
    fn runs(&self, most: u64, chunk: u64) -> Vec<(u64, Vec<u8>)> {
        // First where each run starts and ends, then each built in one allocation.
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for (&s, v) in &self.map {
            let e = s + v.len() as u64;
            match spans.last_mut() {
                Some((start, end)) if *end == s && *end - *start < most => *end = e,
                _ => spans.push((s, e)),
            }
            if let Some(last) = spans.last_mut() {
                let (start, end) = *last;
                let cut = end / chunk * chunk;
                if end - start >= most && cut > start && cut < end {
                    last.1 = cut;
                    spans.push((cut, end));
                }
            }
        }
        spans
            .into_iter()
            .map(|(start, end)| {
                let mut run = Vec::with_capacity((end - start) as usize);
                for (&s, v) in self.overlapping(start, end) {
                    let (lo, hi) = (s.max(start), (s + v.len() as u64).min(end));
                    run.extend_from_slice(&v[(lo - s) as usize..(hi - s) as usize]);
                }
                (start, run)
            })
            .collect()
    }
}

/// What a commit writes: the extents held when it began and the highest transno among
/// them.
struct Snapshot {
    objects: BTreeMap<(usize, u64), Extents>,
    upto: u64,
    bytes: u64,
}

struct State {
    /// The transno the next held write gets.
    next: u64,
    last_committed: u64,
    objects: BTreeMap<(usize, u64), Extents>,
    bytes: u64,
    /// When the oldest held write came.
    since: Option<Instant>,
    /// Being written by a commit (still read from here until it is on the drives).
    committing: Option<Arc<Snapshot>>,
    /// What a failed commit held: readable here, never written.
    failed: Vec<Arc<Snapshot>>,
    /// Goes up each time held bytes reach a target: a read that saw other held bytes
    /// reads again.
    generation: u64,
    /// Objects being changed otherwise (see [`WriteBack::flushed`]): their writes wait.
    busy: HashSet<(usize, u64)>,
    /// Clients recorded in the targets' index.
    clients: HashSet<(usize, u64)>,
    urgent: bool,
    stop: bool,
    broken: Option<String>,
}

impl State {
    /// What is held of object `oid` on target `t`, oldest first: a failed commit's, the
    /// running commit's, then what waits for the next.
    fn held(&self, t: usize, oid: u64) -> impl Iterator<Item = &Extents> {
        let snaps = self.failed.iter().chain(self.committing.iter());
        snaps.filter_map(move |s| s.objects.get(&(t, oid))).chain(self.objects.get(&(t, oid)))
    }
}

/// Counters for `get-param`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBackStats {
    /// Writes answered before commit, and their bytes.
    pub held: u64,
    pub held_bytes: u64,
    /// Writes that went straight to the drives.
    pub through: u64,
    /// Commits, the bytes and extents they wrote.
    pub commits: u64,
    pub committed_bytes: u64,
    pub committed_extents: u64,
    /// Writes that waited for room.
    pub waits: u64,
    /// Bytes held now.
    pub bytes: u64,
    pub last_transno: u64,
    pub last_committed: u64,
}

#[derive(Default)]
struct Counters {
    held: AtomicU64,
    held_bytes: AtomicU64,
    through: AtomicU64,
    commits: AtomicU64,
    committed_bytes: AtomicU64,
    committed_extents: AtomicU64,
    waits: AtomicU64,
}

struct Shared {
    targets: Vec<Arc<Target>>,
    st: Mutex<State>,
    /// The committer waits for work; writers wait for room; flushes wait for commits.
    work: Condvar,
    changed: Condvar,
    /// Held by whoever writes held bytes to the targets.
    writer: Mutex<()>,
    max_bytes: AtomicU64,
    interval_us: AtomicU64,
    counters: Counters,
}

/// The write-back of one OSS over its targets (see the module).
pub struct WriteBack {
    shared: Arc<Shared>,
    committer: Option<JoinHandle<()>>,
    /// Clients answered before commit that the targets knew at start (until forgotten).
    known: Mutex<Vec<u64>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl WriteBack {
    /// The write-back over `targets`, with `last_committed` and the clients from their
    /// index.
    pub fn new(targets: Vec<Arc<Target>>, opts: WriteBackOptions) -> Result<WriteBack> {
        let mut last_committed = None::<u64>;
        let mut known = HashSet::new();
        let mut clients = HashSet::new();
        for (i, t) in targets.iter().enumerate() {
            let lc = t.service_values(LAST_COMMITTED)?.first().map_or(0, |v| v.1);
            last_committed = Some(last_committed.map_or(lc, |l| l.min(lc)));
            for (k, _) in t.service_values(CLIENT)? {
                if let Ok(c) = u64::from_str_radix(&k[CLIENT.len()..], 16) {
                    known.insert(c);
                    clients.insert((i, c));
                }
            }
        }
        let last_committed = last_committed.unwrap_or(0);
        let shared = Arc::new(Shared {
            targets,
            st: Mutex::new(State {
                next: last_committed + 1,
                last_committed,
                objects: BTreeMap::new(),
                bytes: 0,
                since: None,
                committing: None,
                failed: Vec::new(),
                generation: 0,
                busy: HashSet::new(),
                clients,
                urgent: false,
                stop: false,
                broken: None,
            }),
            work: Condvar::new(),
            changed: Condvar::new(),
            writer: Mutex::new(()),
            max_bytes: AtomicU64::new(opts.max_bytes.max(1)),
            interval_us: AtomicU64::new(opts.commit_interval.as_micros() as u64),
            counters: Counters::default(),
        });
        let s = shared.clone();
        let committer = std::thread::Builder::new()
            .name("ost-commit".into())
            .spawn(move || s.run_committer())
            .map_err(|e| OsdError::Invalid(format!("cannot start the commit thread: {e}")))?;
        let mut known: Vec<u64> = known.into_iter().collect();
        known.sort_unstable();
        Ok(WriteBack { shared, committer: Some(committer), known: Mutex::new(known) })
    }

    pub fn targets(&self) -> &[Arc<Target>] {
        &self.shared.targets
    }

    /// The highest transno on the drives.
    pub fn last_committed(&self) -> u64 {
        lock(&self.shared.st).last_committed
    }

    /// Clients that were answered before commit when the server last stopped: a restart
    /// waits for them to replay.
    pub fn known_clients(&self) -> Vec<u64> {
        lock(&self.known).clone()
    }

    pub fn set_max_bytes(&self, b: u64) {
        self.shared.max_bytes.store(b.max(1), Ordering::Relaxed);
        self.shared.changed.notify_all();
    }

    pub fn max_bytes(&self) -> u64 {
        self.shared.max_bytes.load(Ordering::Relaxed)
    }

    pub fn set_commit_interval(&self, d: Duration) {
        self.shared.interval_us.store(d.as_micros() as u64, Ordering::Relaxed);
        self.shared.work.notify_all();
    }

    pub fn commit_interval(&self) -> Duration {
        Duration::from_micros(self.shared.interval_us.load(Ordering::Relaxed))
    }

    pub fn stats(&self) -> WriteBackStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let st = lock(&self.shared.st);
        WriteBackStats {
            held: g(&c.held),
            held_bytes: g(&c.held_bytes),
            through: g(&c.through),
            commits: g(&c.commits),
            committed_bytes: g(&c.committed_bytes),
            committed_extents: g(&c.committed_extents),
            waits: g(&c.waits),
            bytes: st.bytes,
            last_transno: st.next - 1,
            last_committed: st.last_committed,
        }
    }

    fn target(&self, t: usize) -> Result<&Arc<Target>> {
        self.shared.targets.get(t).ok_or_else(|| OsdError::Invalid(format!("no target {t}")))
    }

    /// Write `pieces` (offset, bytes: in offset order, none overlapping) to object `oid`
    /// on target `t` for `client`, as one change. Returns the transno the client keeps
    /// it under until `last_committed` covers it, or 0 when it is on the drives already.
    /// `replay`: the transno of a write answered before a restart, sent again; at or
    /// below `last_committed` it is only acknowledged.
    pub fn write(&self, t: usize, client: u64, oid: u64, pieces: &[(u64, &[u8])], replay: Option<u64>) -> Result<u64> {
        let target = self.target(t)?.clone();
        for &(offset, data) in pieces {
            if offset.checked_add(data.len() as u64).is_none_or(|e| e > target.max_object_bytes()) {
                return Err(OsdError::TooLarge { offset, len: data.len() as u64, max: target.max_object_bytes() });
            }
        }
        if let Some(r) = replay
            && r <= self.last_committed()
        {
            return Ok(r);
        }
        // It must exist now: the answer says it was written.
        target.getattr(oid)?;
        let len: u64 = pieces.iter().map(|(_, d)| d.len() as u64).sum();
        // Whole chunks are whole-stripe writes already: holding them would only cost
        // memory. Many small pieces in one request are held, to be joined.
        let through = replay.is_none()
            && (pieces.iter().all(|(_, d)| d.len() as u64 >= target.chunk_bytes()) || {
                let st = lock(&self.shared.st);
                st.broken.is_some() || !self.room_on(&target, &st, len)?
            });
        if through {
            return self.write_through(t, oid, pieces);
        }
        self.remember(t, client)?;
        let s = &self.shared;
        let mut st = lock(&s.st);
        let mut waited = false;
        while st.busy.contains(&(t, oid)) || (st.bytes > 0 && st.bytes + len > self.max_bytes()) {
            if st.broken.is_some() && replay.is_none() {
                drop(st);
                return self.write_through(t, oid, pieces);
            }
            if !waited && !st.busy.contains(&(t, oid)) {
                s.counters.waits.fetch_add(1, Ordering::Relaxed);
                waited = true;
            }
            st.urgent = true;
            s.work.notify_one();
            st = s.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let transno = match replay {
            Some(r) => {
                st.next = st.next.max(r + 1);
                r
            }
            None => {
                st.next += 1;
                st.next - 1
            }
        };
        let e = st.objects.entry((t, oid)).or_default();
        let replaced: u64 = pieces.iter().map(|&(offset, data)| e.insert(offset, data)).sum();
        e.mtime_ns = e.mtime_ns.max(now_ns());
        st.bytes = st.bytes + len - replaced;
        st.since.get_or_insert_with(Instant::now);
        s.counters.held.fetch_add(1, Ordering::Relaxed);
        s.counters.held_bytes.fetch_add(len, Ordering::Relaxed);
        if st.bytes >= self.max_bytes() / COMMIT_AT {
            s.work.notify_one();
        }
        Ok(transno)
    }

    /// A write straight to the drives, ordered after the object's held writes.
    fn write_through(&self, t: usize, oid: u64, pieces: &[(u64, &[u8])]) -> Result<u64> {
        self.shared.counters.through.fetch_add(1, Ordering::Relaxed);
        self.flushed(t, oid, |tg| pieces.iter().try_for_each(|&(offset, data)| tg.write(oid, offset, data))).map(|()| 0)
    }

    /// Is there room on `target` for `len` bytes more, beyond what is held? Held bytes are
    /// counted twice (a chunk per small object, a partial chunk's journal record): a write
    /// that might not fit goes straight through and gets its ENOSPC there.
    fn room_on(&self, target: &Target, st: &State, len: u64) -> Result<bool> {
        let free = target.statfs()?.free_bytes;
        Ok(free >= (st.bytes + len) * 2 + target.chunk_bytes() * 4)
    }

    /// Record `client` in target `t`'s index before its first answer before commit.
    fn remember(&self, t: usize, client: u64) -> Result<()> {
        if lock(&self.shared.st).clients.contains(&(t, client)) {
            return Ok(());
        }
        let key = format!("{CLIENT}{client:016x}");
        self.shared.targets[t].put_service_values(&[(&key, Some(1))])?;
        lock(&self.shared.st).clients.insert((t, client));
        Ok(())
    }

    /// `client` left cleanly: commit what it was answered for and forget it.
    pub fn forget_client(&self, client: u64) -> Result<()> {
        let held: Vec<usize> =
            lock(&self.shared.st).clients.iter().filter(|(_, c)| *c == client).map(|(t, _)| *t).collect();
        if held.is_empty() {
            return Ok(());
        }
        self.commit()?;
        let key = format!("{CLIENT}{client:016x}");
        for t in held {
            self.shared.targets[t].put_service_values(&[(&key, None)])?;
            lock(&self.shared.st).clients.remove(&(t, client));
        }
        Ok(())
    }

    /// Forget every client from before this start (a file system started afresh, whose
    /// clients cannot come back).
    pub fn forget_known(&self) -> Result<()> {
        for c in self.known_clients() {
            self.forget_client(c)?;
            lock(&self.known).retain(|&k| k != c);
        }
        Ok(())
    }

    /// Up to `buf.len()` bytes at `offset`, held bytes included; how many (short at the
    /// end of the object).
    pub fn read(&self, t: usize, oid: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let target = self.target(t)?;
        let end = offset.saturating_add(buf.len() as u64);
        loop {
            // What is held of the range, oldest first, and the generation it was taken in:
            // should held bytes reach the drives meanwhile, the read goes again.
            let (generation, layers, held_end) = {
                let st = lock(&self.shared.st);
                let mut layers = Vec::new();
                let mut held_end = 0;
                for e in st.held(t, oid) {
                    held_end = held_end.max(e.end());
                    layers.push(e.part(offset, end));
                }
                (st.generation, layers, held_end)
            };
            let n = target.read(oid, offset, buf)?;
            if lock(&self.shared.st).generation != generation {
                continue;
            }
            if layers.is_empty() {
                return Ok(n);
            }
            buf[n..].fill(0);
            for l in &layers {
                l.overlay(offset, buf);
            }
            let held = held_end.saturating_sub(offset).min(buf.len() as u64) as usize;
            return Ok(n.max(held));
        }
    }

    /// The attributes of `oid`, its size and mtime counting held writes.
    pub fn getattr(&self, t: usize, oid: u64) -> Result<ObjectAttr> {
        let (end, mtime) =
            lock(&self.shared.st).held(t, oid).fold((0, 0), |(e, m), x| (e.max(x.end()), m.max(x.mtime_ns)));
        let mut a = self.target(t)?.getattr(oid)?;
        a.size = a.size.max(end);
        a.mtime_ns = a.mtime_ns.max(mtime);
        Ok(a)
    }

    /// Run `f` on target `t` for object `oid` (a truncate, punch, setattr, destroy, or a
    /// write straight through) with every earlier held write committed and later writes
    /// to the object waiting until it is done.
    pub fn flushed<R>(&self, t: usize, oid: u64, f: impl FnOnce(&Target) -> Result<R>) -> Result<R> {
        let target = self.target(t)?.clone();
        let s = &self.shared;
        let held = {
            let mut st = lock(&s.st);
            while st.busy.contains(&(t, oid)) {
                st = s.changed.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.busy.insert((t, oid));
            st.objects.contains_key(&(t, oid))
                || st.committing.as_ref().is_some_and(|c| c.objects.contains_key(&(t, oid)))
        };
        let r = if held { self.commit().and_then(|_| f(&target)) } else { f(&target) };
        let mut st = lock(&s.st);
        st.busy.remove(&(t, oid));
        drop(st);
        s.changed.notify_all();
        r
    }

    /// Commit everything answered so far; the new `last_committed`.
    pub fn commit(&self) -> Result<u64> {
        let want = lock(&self.shared.st).next - 1;
        loop {
            {
                let st = lock(&self.shared.st);
                if let Some(why) = &st.broken {
                    return Err(OsdError::Invalid(format!("commits stopped: {why}")));
                }
                if st.last_committed >= want {
                    return Ok(st.last_committed);
                }
            }
            self.shared.commit_once()?;
        }
    }

    /// Stop as a crash would, for tests: what is held is dropped unwritten, and the
    /// committer stops.
    pub fn crash(&self) {
        let mut st = lock(&self.shared.st);
        st.objects.clear();
        st.bytes = 0;
        st.stop = true;
        st.broken = Some("crashed".into());
        drop(st);
        self.shared.work.notify_all();
        self.shared.changed.notify_all();
    }
}

impl Drop for WriteBack {
    fn drop(&mut self) {
        if lock(&self.shared.st).broken.is_none()
            && let Err(e) = self.commit()
        {
            eprintln!("ost: the last commit failed: {e}");
        }
        lock(&self.shared.st).stop = true;
        self.shared.work.notify_all();
        if let Some(h) = self.committer.take() {
            let _ = h.join();
        }
    }
}

impl Shared {
    fn run_committer(&self) {
        let mut st = lock(&self.st);
        loop {
            if st.stop {
                return;
            }
            let interval = Duration::from_micros(self.interval_us.load(Ordering::Relaxed));
            let due = st.since.is_some_and(|t| t.elapsed() >= interval)
                || st.bytes >= self.max_bytes.load(Ordering::Relaxed) / COMMIT_AT
                || (st.urgent && st.bytes > 0);
            if !due || st.broken.is_some() {
                let wait = st.since.map_or(interval, |t| interval.saturating_sub(t.elapsed()));
                st =
                    self.work.wait_timeout(st, wait.max(Duration::from_millis(1))).unwrap_or_else(|e| e.into_inner()).0;
                continue;
            }
            drop(st);
            if let Err(e) = self.commit_once() {
                eprintln!("ost: a commit failed, writes now go straight to the drives: {e}");
            }
            st = lock(&self.st);
        }
    }

    /// Write what is held now to the targets, then record `last_committed`.
    fn commit_once(&self) -> Result<()> {
        let _writer = lock(&self.writer);
        let snap = {
            let mut st = lock(&self.st);
            if let Some(why) = &st.broken {
                return Err(OsdError::Invalid(format!("commits stopped: {why}")));
            }
            st.urgent = false;
            st.since = None;
            let upto = st.next - 1;
            if upto <= st.last_committed {
                return Ok(());
            }
            let snap = Arc::new(Snapshot { objects: std::mem::take(&mut st.objects), upto, bytes: st.bytes });
            st.committing = Some(snap.clone());
            snap
        };
        let written = self.write_out(&snap);
        let mut st = lock(&self.st);
        st.committing = None;
        st.generation += 1;
        st.bytes -= snap.bytes;
        let r = match written {
            Ok(extents) => {
                st.last_committed = snap.upto;
                let c = &self.counters;
                c.commits.fetch_add(1, Ordering::Relaxed);
                c.committed_bytes.fetch_add(snap.bytes, Ordering::Relaxed);
                c.committed_extents.fetch_add(extents, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                st.broken = Some(e.to_string());
                st.failed.push(snap);
                Err(e)
            }
        };
        drop(st);
        self.changed.notify_all();
        r
    }

    /// Every extent of `snap` to its target, then `last_committed` to every target's
    /// index; the extents written.
    fn write_out(&self, snap: &Snapshot) -> Result<u64> {
        let mut runs = Vec::new();
        for (&(t, oid), e) in &snap.objects {
            for (off, data) in e.runs(RUN_BYTES, self.targets[t].chunk_bytes()) {
                runs.push((t, oid, off, data));
            }
        }
        // Several at once, as several clients' streams would be: one stream alone leaves
        // most of the drives idle.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..COMMIT_STREAMS.min(runs.len()) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((t, oid, off, data)) = runs.get(i) else { return };
                        match self.targets[*t].write(*oid, *off, data) {
                            // Destroyed since (its destroy committed it first; nothing of
                            // it is owed to anyone).
                            Ok(()) | Err(OsdError::NoSuchObject(_)) => {}
                            Err(e) => {
                                lock(&failed).get_or_insert(e);
                                return;
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        let extents = runs.len() as u64;
        for t in &self.targets {
            t.put_service_values(&[(LAST_COMMITTED, Some(snap.upto))])?;
        }
        Ok(extents)
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(e: &Extents) -> Vec<(u64, Vec<u8>)> {
        e.map.iter().map(|(&o, v)| (o, v.clone())).collect()
    }

    #[test]
    fn later_pieces_cut_earlier_ones_and_commits_join_what_touches() {
        let mut e = Extents::default();
        assert_eq!(e.insert(10, b"abc"), 0);
        assert_eq!(e.insert(20, b"xyz"), 0);
        assert_eq!(e.insert(13, b"de"), 0);
        assert_eq!(held(&e), vec![(10, b"abc".to_vec()), (13, b"de".to_vec()), (20, b"xyz".to_vec())]);
        // Over parts of three pieces and the gap between: they are cut around it.
        assert_eq!(e.insert(12, b"QQQQQQQQQ"), 1 + 2 + 1);
        assert_eq!(held(&e), vec![(10, b"ab".to_vec()), (12, b"QQQQQQQQQ".to_vec()), (21, b"yz".to_vec())]);
        assert_eq!(e.end(), 23);
        // Inside one piece: it is cut in two around the new one.
        assert_eq!(e.insert(14, b"!"), 1);
        let mut buf = [0u8; 16];
        e.overlay(8, &mut buf);
        assert_eq!(&buf, b"\0\0abQQ!QQQQQQyz\0");
        let p = e.part(11, 16);
        assert_eq!(held(&p), vec![(11, b"b".to_vec()), (12, b"QQ".to_vec()), (14, b"!".to_vec()), (15, b"Q".to_vec())]);
        // A commit joins what touches.
        assert_eq!(e.runs(1 << 20, 4096), vec![(10, b"abQQ!QQQQQQyz".to_vec())]);
        // And cuts long runs at chunk boundaries.
        let mut long = Extents::default();
        for i in 0..10u64 {
            long.insert(i * 3, &[i as u8; 3]);
        }
        let runs = long.runs(8, 8);
        assert_eq!(runs.iter().map(|(o, v)| (*o, v.len())).collect::<Vec<_>>(), vec![(0, 8), (8, 8), (16, 8), (24, 6)]);
    }
}
