//! What the handles of one file on this mount share (its write-behind is in `behind`), and
//! its read-ahead chunks, shared as the kernel's page cache is by the processes of one
//! node. ior-hard's tasks read
//! interleaved blocks of one file: with a cache per handle, every task fetched every
//! chunk (four times the data for four tasks); with one per file, each chunk is fetched
//! once for all of them.
//!
//! A chunk is one RPC's worth of the file at a multiple of the RPC size. It is fetched by
//! a task of its own; readers wait on a watch channel for its bytes. Chunks read ahead
//! hold part of the mount's `max_read_ahead_mb`; a chunk a read needed when that budget
//! was spent holds none and goes once read. A chunk goes when every handle streaming
//! through the file has passed it, when a write or truncate on this mount changes the
//! file, or when the file is found changed at an open (its size or mtime differ from
//! what the cache was filled under: close-to-open).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use nacre_proto::fid::Fid;
use nacre_proto::mdt::Attr;
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::behind::WriteBehind;
use crate::error::{Error, Result, errno};
use crate::fs::lock;
use crate::whole::Image;

/// A chunk's bytes once fetched (`None` while on the way).
pub(crate) type Fetch = watch::Receiver<Option<Result<Bytes>>>;

struct Slot {
    fetch: Fetch,
    /// Its share of `max_read_ahead_mb` (none for a chunk a read needed when it was spent).
    permit: Option<OwnedSemaphorePermit>,
    /// A read has needed it (a chunk read ahead and dropped unused was wasted).
    used: bool,
}

/// What a read continues (see the read-ahead state of `file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pattern {
    Random,
    Sequential,
    Strided,
}

/// The mount's read-ahead counters (`llite.*.read_ahead_stats`, as Lustre's).
#[derive(Default)]
pub(crate) struct ReadAheadStats {
    /// Reads whose chunks were all there or on their way when they came.
    pub hits: AtomicU64,
    /// Reads that had to start an RPC of their own.
    pub misses: AtomicU64,
    pub sequential: AtomicU64,
    pub strided: AtomicU64,
    /// Reads that continued no stream (random, backward, a stride wider than a chunk):
    /// each fetched what it asked.
    pub random: AtomicU64,
    /// Chunks fetched ahead of every read, and their bytes.
    pub chunks_ahead: AtomicU64,
    pub bytes_ahead: AtomicU64,
    /// Chunks read ahead and dropped before any read needed them.
    pub discarded: AtomicU64,
}

impl ReadAheadStats {
    pub(crate) fn count(&self, p: Pattern) {
        match p {
            Pattern::Random => &self.random,
            Pattern::Sequential => &self.sequential,
            Pattern::Strided => &self.strided,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// One counter per line, as `get-param` shows multi-line values.
    pub(crate) fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "hits {}\nmisses {}\nsequential_reads {}\nstrided_reads {}\nrandom_reads {}\nchunks_read_ahead {}\nbytes_read_ahead {}\nchunks_discarded {}\n",
            g(&self.hits),
            g(&self.misses),
            g(&self.sequential),
            g(&self.strided),
            g(&self.random),
            g(&self.chunks_ahead),
            g(&self.bytes_ahead),
            g(&self.discarded)
        )
    }

    /// Back to zero (a write to `read_ahead_stats`).
    pub(crate) fn clear(&self) {
        for a in [
            &self.hits,
            &self.misses,
            &self.sequential,
            &self.strided,
            &self.random,
            &self.chunks_ahead,
            &self.bytes_ahead,
            &self.discarded,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

pub(crate) struct Chunks {
    /// The file's size and mtime at the open that found or made this cache.
    stamp: (u64, i64),
    slots: BTreeMap<u64, Slot>,
    /// Where each handle reading sequentially is (by MDT handle): a chunk behind all of
    /// them is done with.
    streams: HashMap<u64, u64>,
    stats: Arc<ReadAheadStats>,
}

/// What the handles of one file on this mount share: its read-ahead chunks, its
/// write-behind, and the image of a small file they write (see `whole`).
pub(crate) struct Shared {
    pub chunks: Mutex<Chunks>,
    pub behind: Mutex<WriteBehind>,
    pub image: Mutex<Image>,
}

/// The live caches of a mount, by file; an entry dies with the last handle of its file.
#[derive(Default)]
pub(crate) struct Caches {
    files: Mutex<HashMap<Fid, Weak<Shared>>>,
    pub stats: Arc<ReadAheadStats>,
}

/// Entries `Caches` keeps before it sweeps out those of closed files.
const SWEEP_AT: usize = 1024;

impl Caches {
    /// The cache of `attr`'s file for a handle opening it now; what it holds is dropped
    /// if the file changed since it was filled.
    pub(crate) fn open(&self, attr: &Attr) -> Arc<Shared> {
        let stamp = (attr.size, attr.mtime_ns);
        let mut files = lock(&self.files);
        if let Some(s) = files.get(&attr.fid).and_then(Weak::upgrade) {
            let mut g = lock(&s.chunks);
            if g.stamp != stamp {
                g.clear();
                g.stamp = stamp;
            }
            drop(g);
            return s;
        }
        if files.len() >= SWEEP_AT {
            files.retain(|_, w| w.strong_count() > 0);
        }
        let s = Arc::new(Shared {
            chunks: Mutex::new(Chunks {
                stamp,
                slots: BTreeMap::new(),
                streams: HashMap::new(),
                stats: self.stats.clone(),
            }),
            behind: Mutex::new(WriteBehind::default()),
            image: Mutex::new(Image::default()),
        });
        files.insert(attr.fid, Arc::downgrade(&s));
        s
    }

    /// `fid` was cut or extended to `size` bytes through this mount.
    pub(crate) fn resized(&self, fid: Fid, size: u64) {
        self.with_image(fid, |i| i.resized(size));
    }

    /// `fid` changed, or will, where this mount does not see it: the image its handles
    /// here were writing is no longer the file.
    pub(crate) fn changed_elsewhere(&self, fid: Fid) {
        self.with_image(fid, Image::unknown);
    }

    /// Apply `f` to the image of `fid`'s handles here, if any is open.
    fn with_image(&self, fid: Fid, f: impl FnOnce(&mut Image)) {
        let s = lock(&self.files).get(&fid).and_then(Weak::upgrade);
        if let Some(s) = s {
            f(&mut lock(&s.image));
        }
    }
}

impl Chunks {
    /// Drop every chunk (the file changed on this mount, or was found changed).
    pub(crate) fn clear(&mut self) {
        while let Some((&at, _)) = self.slots.first_key_value() {
            self.remove(at);
        }
    }

    /// Drop the chunk at `at`, counting it if it was read ahead for nothing.
    fn remove(&mut self, at: u64) {
        if let Some(s) = self.slots.remove(&at)
            && !s.used
        {
            self.stats.discarded.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The fetch of the chunk at `at`, if there is one; `read`: a read needs it now.
    pub(crate) fn get(&mut self, at: u64, read: bool) -> Option<Fetch> {
        let s = self.slots.get_mut(&at)?;
        s.used |= read;
        Some(s.fetch.clone())
    }

    /// Whether chunks for every byte of `[from, to)` are here or on their way.
    pub(crate) fn covers(&self, from: u64, to: u64, chunk: u64) -> bool {
        let mut c = from / chunk * chunk;
        while c < to {
            if !self.slots.contains_key(&c) {
                return false;
            }
            c += chunk;
        }
        true
    }

    pub(crate) fn insert(&mut self, at: u64, fetch: Fetch, permit: Option<OwnedSemaphorePermit>, read: bool) {
        self.slots.insert(at, Slot { fetch, permit, used: read });
    }

    /// Remove the chunk at `at` if it is still `fetch` (not one fetched again since).
    pub(crate) fn remove_if(&mut self, at: u64, fetch: &Fetch) {
        if self.slots.get(&at).is_some_and(|s| s.fetch.same_channel(fetch)) {
            self.remove(at);
        }
    }

    /// Remove the chunk at `at` if it holds no budget: a read needed it when the budget
    /// was spent, and has read it.
    pub(crate) fn remove_unbudgeted(&mut self, at: u64) {
        if self.slots.get(&at).is_some_and(|s| s.permit.is_none()) {
            self.remove(at);
        }
    }

    /// Handle `handle` streams on at `next`; `None`: it stopped streaming (closed, or
    /// reads elsewhere).
    pub(crate) fn stream(&mut self, handle: u64, next: Option<u64>) {
        match next {
            Some(n) => {
                self.streams.insert(handle, n);
            }
            None => {
                self.streams.remove(&handle);
            }
        }
    }

    /// Drop the chunks (each `chunk` bytes) that end before `before`.
    pub(crate) fn drop_before(&mut self, before: u64, chunk: u64) {
        while let Some((&s, _)) = self.slots.first_key_value() {
            if s.saturating_add(chunk) > before {
                break;
            }
            self.remove(s);
        }
    }

    /// Drop the chunks every stream has passed by more than `slack` bytes.
    pub(crate) fn drop_passed(&mut self, slack: u64, chunk: u64) {
        if let Some(&low) = self.streams.values().min() {
            self.drop_before(low.saturating_sub(slack), chunk);
        }
    }
}

/// Wait for a fetch's bytes. A fetch whose task is gone reads as an error.
pub(crate) async fn fetched(mut f: Fetch) -> Result<Bytes> {
    match f.wait_for(Option::is_some).await {
        Ok(v) => v.clone().unwrap_or_else(|| Err(Error::new(errno::EIO, "read-ahead fetch lost"))),
        Err(_) => Err(Error::new(errno::EIO, "read-ahead task stopped")),
    }
}

/// A chunk whose bytes are here already.
pub(crate) fn ready(data: Bytes) -> Fetch {
    watch::channel(Some(Ok(data))).1
}

/// A fetch running `read`; its bytes go to every reader waiting on it.
pub(crate) fn spawn_fetch<F>(read: F) -> Fetch
where
    F: std::future::Future<Output = Result<Bytes>> + Send + 'static,
{
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let r = read.await;
        // No receiver left: the chunk was dropped meanwhile, nobody wants it.
        let _ = tx.send(Some(r));
    });
    rx
}
