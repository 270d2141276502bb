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
//! **Partial chunks.** A background commit writes the whole chunks it holds and holds the
//! partial ones over for a later commit, a few times at most and within half of
//! `max_bytes`: the piece a slower writer has not sent yet often makes the chunk whole,
//! and a whole chunk is one full-stripe write where a partial one goes through the
//! journal. `last_committed` then stops below the oldest write held over, so that a
//! restart has it replayed with everything after it. A commit someone waits for (`sync`,
//! a truncate, a glimpse) writes everything.
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
/// How many background commits may hold a partial chunk over (at the default interval,
/// 0.6 s at most).
const KEEP_COMMITS_MAX: u32 = 10;
/// Held-over partial chunks take at most `1 / KEPT_SHARE` of `max_bytes`.
const KEPT_SHARE: u64 = 2;
/// How long the committer keeps its run buffers (`COMMIT_STREAMS` of about `RUN_BYTES`
/// at most) with no commit.
const BUFFERS_KEPT_IDLE: Duration = Duration::from_secs(10);

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

/// One held piece: its bytes, the transno of the write that brought them, and how many
/// commits have held it over as part of a partial chunk.
struct Held {
    data: Vec<u8>,
    transno: u64,
    kept: u32,
}

impl Held {
    fn end(&self, at: u64) -> u64 {
        at + self.data.len() as u64
    }
}

/// The held pieces of one object: non-overlapping, by offset. Pieces are kept as they
/// came (a later one cuts what it covers out of earlier ones) and joined only when
/// committed, so that a write never copies its neighbours.
#[derive(Default)]
struct Extents {
    map: BTreeMap<u64, Held>,
    /// When the last held write came (for the object's mtime).
    mtime_ns: i64,
}

impl Extents {
    fn end(&self) -> u64 {
        self.map.iter().next_back().map_or(0, |(&o, h)| h.end(o))
    }

    /// The pieces that overlap `[off, end)`, by start.
    fn overlapping(&self, off: u64, end: u64) -> impl Iterator<Item = (&u64, &Held)> {
        let first = self.map.range(..=off).next_back().map_or(off, |(&s, _)| s);
        self.map.range(first..end).filter(move |(s, h)| h.end(**s) > off)
    }

    /// Take the pieces out of `[off, end)`, cutting those that cross its edges (their
    /// outer parts stay). Returns what was taken, by offset.
    fn take(&mut self, off: u64, end: u64) -> Vec<(u64, Held)> {
        let hit: Vec<u64> = self.overlapping(off, end).map(|(&s, _)| s).collect();
        let mut out = Vec::with_capacity(hit.len());
        for s in hit {
            let Some(mut h) = self.map.remove(&s) else { continue };
            let h_end = h.end(s);
            if h_end > end {
                let tail = h.data.split_off((end - s) as usize);
                self.map.insert(end, Held { data: tail, ..h });
            }
            if s < off {
                let inner = h.data.split_off((off - s) as usize);
                self.map.insert(s, Held { data: std::mem::replace(&mut h.data, inner), ..h });
                out.push((off, h));
            } else {
                out.push((s, h));
            }
        }
        out
    }

    /// Hold `data` at `off` for write `transno`, over what was held; returns the bytes
    /// held before in that range (now replaced).
    fn insert(&mut self, off: u64, data: &[u8], transno: u64) -> u64 {
        let end = off + data.len() as u64;
        let replaced = self.take(off, end).iter().map(|(_, h)| h.data.len() as u64).sum();
        self.map.insert(off, Held { data: data.to_vec(), transno, kept: 0 });
        replaced
    }

    /// Hold `h` at `off` under what is held: only the parts of it that no piece covers
    /// (newer writes that came while it was away). Returns the bytes it added.
    fn insert_under(&mut self, off: u64, mut h: Held) -> u64 {
        let end = h.end(off);
        let covered: Vec<(u64, u64)> =
            self.overlapping(off, end).map(|(&s, x)| (s.max(off), x.end(s).min(end))).collect();
        let mut added = 0;
        // The gaps between the covered ranges, last first, so that cutting the tail off
        // leaves the earlier offsets in place.
        let mut gaps = Vec::new();
        let mut at = off;
        for (lo, hi) in covered {
            if lo > at {
                gaps.push((at, lo));
            }
            at = at.max(hi);
        }
        if at < end {
            gaps.push((at, end));
        }
        for (lo, hi) in gaps.into_iter().rev() {
            let mut part = h.data.split_off((lo - off) as usize);
            part.truncate((hi - lo) as usize);
            added += part.len() as u64;
            self.map.insert(lo, Held { data: part, ..h });
        }
        added
    }

    /// Copy what is held of `[off, off + buf.len())` into `buf`.
    fn overlay(&self, off: u64, buf: &mut [u8]) {
        let end = off + buf.len() as u64;
        for (&s, h) in self.overlapping(off, end) {
            let (lo, hi) = (s.max(off), h.end(s).min(end));
            buf[(lo - off) as usize..(hi - off) as usize]
                .copy_from_slice(&h.data[(lo - s) as usize..(hi - s) as usize]);
        }
    }

    /// What is held of `[off, end)`, as pieces of their own.
    fn part(&self, off: u64, end: u64) -> Extents {
        let mut out = Extents { map: BTreeMap::new(), mtime_ns: self.mtime_ns };
        for (&s, h) in self.overlapping(off, end) {
            let (lo, hi) = (s.max(off), h.end(s).min(end));
            let data = h.data[(lo - s) as usize..(hi - s) as usize].to_vec();
            out.map.insert(lo, Held { data, ..*h });
        }
        out
    }

    /// Where the pieces, joined where they touch, make runs of at most about `most` bytes
    /// cut at multiples of `chunk` (so that a long run is whole stripes): `(start, end)`.
    fn spans(&self, most: u64, chunk: u64) -> Vec<(u64, u64)> {
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for (&s, h) in &self.map {
            let e = h.end(s);
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
    }

    /// The bytes of span `[start, end)` (one of [`Extents::spans`]) into `run`.
    fn fill(&self, start: u64, end: u64, run: &mut Vec<u8>) {
        run.clear();
        for (&s, h) in self.overlapping(start, end) {
            let (lo, hi) = (s.max(start), h.end(s).min(end));
            run.extend_from_slice(&h.data[(lo - s) as usize..(hi - s) as usize]);
        }
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
    /// Bytes of partial chunks that commits held over for a later one.
    pub kept_bytes: u64,
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
    kept_bytes: AtomicU64,
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
    /// Run buffers of earlier commits, kept for the next (see [`Shared::write_out`]).
    buffers: Mutex<Vec<Vec<u8>>>,
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
            buffers: Mutex::new(Vec::new()),
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
            kept_bytes: g(&c.kept_bytes),
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
        let replaced: u64 = pieces.iter().map(|&(offset, data)| e.insert(offset, data, transno)).sum();
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
        self.flushed_all(t, &[oid], f)
    }

    /// [`WriteBack::flushed`] for several objects at once (a batched destroy): all of
    /// them are taken together, so two such calls never wait on each other in a cycle.
    pub fn flushed_all<R>(&self, t: usize, oids: &[u64], f: impl FnOnce(&Target) -> Result<R>) -> Result<R> {
        let target = self.target(t)?.clone();
        let s = &self.shared;
        let held = {
            let mut st = lock(&s.st);
            while oids.iter().any(|o| st.busy.contains(&(t, *o))) {
                st = s.changed.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.busy.extend(oids.iter().map(|o| (t, *o)));
            oids.iter().any(|o| {
                st.objects.contains_key(&(t, *o))
                    || st.committing.as_ref().is_some_and(|c| c.objects.contains_key(&(t, *o)))
            })
        };
        let r = if held { self.commit().and_then(|_| f(&target)) } else { f(&target) };
        let mut st = lock(&s.st);
        for o in oids {
            st.busy.remove(&(t, *o));
        }
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
            self.shared.commit_once(false)?;
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
        let mut last_commit = Instant::now();
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
                if last_commit.elapsed() >= BUFFERS_KEPT_IDLE {
                    lock(&self.buffers).clear();
                }
                let wait = st.since.map_or(interval, |t| interval.saturating_sub(t.elapsed()));
                st =
                    self.work.wait_timeout(st, wait.max(Duration::from_millis(1))).unwrap_or_else(|e| e.into_inner()).0;
                continue;
            }
            drop(st);
            if let Err(e) = self.commit_once(true) {
                eprintln!("ost: a commit failed, writes now go straight to the drives: {e}");
            }
            last_commit = Instant::now();
            st = lock(&self.st);
        }
    }

    /// Write what is held now to the targets, then record `last_committed`. With
    /// `keep_partial`, the parts of chunks that are not whole may stay held for a later
    /// commit (see [`Shared::plan`]).
    fn commit_once(&self, keep_partial: bool) -> Result<()> {
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
        let plan = self.plan(&snap, keep_partial);
        let written = self.write_out(&snap, &plan);
        let mut st = lock(&self.st);
        st.committing = None;
        st.generation += 1;
        st.bytes -= snap.bytes;
        let r = match written {
            Ok(()) => {
                let c = &self.counters;
                c.commits.fetch_add(1, Ordering::Relaxed);
                c.committed_bytes.fetch_add(snap.bytes - plan.kept_bytes, Ordering::Relaxed);
                c.committed_extents.fetch_add(plan.runs.len() as u64, Ordering::Relaxed);
                c.kept_bytes.fetch_add(plan.kept_bytes, Ordering::Relaxed);
                st.last_committed = plan.last_committed;
                // What stays goes back under what came meanwhile, in the same breath as the
                // snapshot leaves: a read sees it all along.
                let mut objects = match Arc::try_unwrap(snap) {
                    Ok(s) => s.objects,
                    Err(shared) => shared.objects.iter().map(|(k, e)| (*k, e.part(0, u64::MAX))).collect(),
                };
                let mut back = 0;
                for &(key, lo, hi) in &plan.kept {
                    let Some(e) = objects.get_mut(&key) else { continue };
                    let mtime = e.mtime_ns;
                    let pieces = e.take(lo, hi);
                    let into = st.objects.entry(key).or_default();
                    into.mtime_ns = into.mtime_ns.max(mtime);
                    for (at, mut h) in pieces {
                        h.kept += 1;
                        back += into.insert_under(at, h);
                    }
                }
                st.bytes += back;
                if back > 0 {
                    st.since.get_or_insert_with(Instant::now);
                }
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

    /// What a commit of `snap` writes and what it keeps. Without `keep_partial` (a commit
    /// someone waits for) everything is written. With it (the background commit), each
    /// run's whole chunks are written, and its
    /// partial chunks at either end stay held for a later commit, as md's stripe cache and
    /// xiRAID's merged writes hold partial stripes: a slow writer of ior-hard is often a
    /// moment behind the others, and its piece makes the chunk whole. A partial chunk is
    /// held over at most [`KEEP_COMMITS_MAX`] times, and held-over bytes stay within
    /// `max_bytes / KEPT_SHARE`. Eight interleaved writers on two cores drift apart by
    /// hundreds of pieces: each commit of `nacre bench ost`'s sustained phase wrote about
    /// 1,500 runs of 85 KiB, nearly all through the journal, before this.
    fn plan(&self, snap: &Snapshot, keep_partial: bool) -> Plan {
        let budget = if keep_partial { self.max_bytes.load(Ordering::Relaxed) / KEPT_SHARE } else { 0 };
        let mut plan = Plan { runs: Vec::new(), kept: Vec::new(), kept_bytes: 0, last_committed: snap.upto };
        let mut oldest_kept = u64::MAX;
        for (&key, e) in &snap.objects {
            let cb = self.targets[key.0].chunk_bytes();
            for (start, end) in e.spans(RUN_BYTES, cb) {
                let (whole_lo, whole_hi) = (start.div_ceil(cb) * cb, end / cb * cb);
                let mut parts = Vec::with_capacity(3);
                if whole_lo < whole_hi {
                    if start < whole_lo {
                        parts.push((start, whole_lo, true));
                    }
                    parts.push((whole_lo, whole_hi, false));
                    if whole_hi < end {
                        parts.push((whole_hi, end, true));
                    }
                } else {
                    parts.push((start, end, true));
                }
                for (lo, hi, partial) in parts {
                    let keep = partial
                        && plan.kept_bytes + (hi - lo) <= budget
                        && e.overlapping(lo, hi).all(|(_, h)| h.kept < KEEP_COMMITS_MAX);
                    if keep {
                        plan.kept.push((key, lo, hi));
                        plan.kept_bytes += hi - lo;
                        oldest_kept = e.overlapping(lo, hi).map(|(_, h)| h.transno).fold(oldest_kept, u64::min);
                    } else {
                        plan.runs.push((key, lo, hi));
                    }
                }
            }
        }
        // The drives hold every write below the oldest kept one.
        if oldest_kept != u64::MAX {
            plan.last_committed = snap.upto.min(oldest_kept - 1);
        }
        plan
    }

    /// The runs of `plan` to their targets, then its `last_committed` to every target's
    /// index.
    ///
    /// Each stream joins a run's pieces into a buffer and writes it. The buffers stay for
    /// the next commit while commits keep coming: a fresh 16 MiB buffer costs 4,096 page
    /// faults and its zeroing, and building the runs of a 64 MiB commit took 53-142 ms
    /// that way, more than writing them (36-48 ms, `nacre bench ost`).
    fn write_out(&self, snap: &Snapshot, plan: &Plan) -> Result<()> {
        // Several at once, as several clients' streams would be: one stream alone leaves
        // most of the drives idle.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..COMMIT_STREAMS.min(plan.runs.len()) {
                s.spawn(|| {
                    let mut buf = lock(&self.buffers).pop().unwrap_or_default();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&((t, oid), start, end)) = plan.runs.get(i) else { break };
                        let Some(e) = snap.objects.get(&(t, oid)) else { continue };
                        e.fill(start, end, &mut buf);
                        match self.targets[t].write(oid, start, &buf) {
                            // Destroyed since (its destroy committed it first; nothing of
                            // it is owed to anyone).
                            Ok(()) | Err(OsdError::NoSuchObject(_)) => {}
                            Err(e) => {
                                lock(&failed).get_or_insert(e);
                                break;
                            }
                        }
                    }
                    lock(&self.buffers).push(buf);
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        for t in &self.targets {
            t.put_service_values(&[(LAST_COMMITTED, Some(plan.last_committed))])?;
        }
        Ok(())
    }
}

/// What one commit writes and keeps: `(target, object)` and a range each.
struct Plan {
    runs: Vec<((usize, u64), u64, u64)>,
    kept: Vec<((usize, u64), u64, u64)>,
    kept_bytes: u64,
    /// What `last_committed` is once the runs are on the drives.
    last_committed: u64,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(e: &Extents) -> Vec<(u64, Vec<u8>)> {
        e.map.iter().map(|(&o, h)| (o, h.data.clone())).collect()
    }

    #[test]
    fn later_pieces_cut_earlier_ones_and_commits_join_what_touches() {
        let mut e = Extents::default();
        assert_eq!(e.insert(10, b"abc", 1), 0);
        assert_eq!(e.insert(20, b"xyz", 1), 0);
        assert_eq!(e.insert(13, b"de", 1), 0);
        assert_eq!(held(&e), vec![(10, b"abc".to_vec()), (13, b"de".to_vec()), (20, b"xyz".to_vec())]);
        // Over parts of three pieces and the gap between: they are cut around it.
        assert_eq!(e.insert(12, b"QQQQQQQQQ", 1), 1 + 2 + 1);
        assert_eq!(held(&e), vec![(10, b"ab".to_vec()), (12, b"QQQQQQQQQ".to_vec()), (21, b"yz".to_vec())]);
        assert_eq!(e.end(), 23);
        // Inside one piece: it is cut in two around the new one.
        assert_eq!(e.insert(14, b"!", 1), 1);
        let mut buf = [0u8; 16];
        e.overlay(8, &mut buf);
        assert_eq!(&buf, b"\0\0abQQ!QQQQQQyz\0");
        let p = e.part(11, 16);
        assert_eq!(held(&p), vec![(11, b"b".to_vec()), (12, b"QQ".to_vec()), (14, b"!".to_vec()), (15, b"Q".to_vec())]);
        // A commit joins what touches, into a buffer that held another run before.
        assert_eq!(e.spans(1 << 20, 4096), vec![(10, 23)]);
        let mut run = b"an older run, longer".to_vec();
        e.fill(10, 23, &mut run);
        assert_eq!(run, b"abQQ!QQQQQQyz");
        // And cuts long runs at chunk boundaries.
        let mut long = Extents::default();
        for i in 0..10u64 {
            long.insert(i * 3, &[i as u8; 3], i);
        }
        assert_eq!(long.spans(8, 8), vec![(0, 8), (8, 16), (16, 24), (24, 30)]);
        long.fill(8, 16, &mut run);
        assert_eq!(run, [2, 3, 3, 3, 4, 4, 4, 5]);
    }

    #[test]
    fn pieces_taken_out_and_put_back_under_newer_ones_keep_their_transno() {
        let mut e = Extents::default();
        e.insert(0, b"aaaa", 1);
        e.insert(4, b"bbbb", 2);
        e.insert(8, b"cccc", 3);
        // Out of [2, 10): the edge pieces are cut, their outer parts stay.
        let out = e.take(2, 10);
        let got: Vec<(u64, Vec<u8>, u64)> = out.iter().map(|(o, h)| (*o, h.data.clone(), h.transno)).collect();
        assert_eq!(got, vec![(2, b"aa".to_vec(), 1), (4, b"bbbb".to_vec(), 2), (8, b"cc".to_vec(), 3)]);
        assert_eq!(held(&e), vec![(0, b"aa".to_vec()), (10, b"cc".to_vec())]);
        // Newer bytes came meanwhile at [5, 7): what was taken goes back only around them.
        e.insert(5, b"NN", 9);
        let mut added = 0;
        for (at, h) in out {
            added += e.insert_under(at, h);
        }
        assert_eq!(added, 8 - 2);
        assert_eq!(
            held(&e),
            vec![
                (0, b"aa".to_vec()),
                (2, b"aa".to_vec()),
                (4, b"b".to_vec()),
                (5, b"NN".to_vec()),
                (7, b"b".to_vec()),
                (8, b"cc".to_vec()),
                (10, b"cc".to_vec())
            ]
        );
        let transnos: Vec<u64> = e.map.values().map(|h| h.transno).collect();
        assert_eq!(transnos, vec![1, 1, 2, 9, 2, 3, 3]);
        let mut buf = [0u8; 12];
        e.overlay(0, &mut buf);
        assert_eq!(&buf, b"aaaabNNbcccc");
    }
}
