//! The log writer: a thread of its own appends each batch's redo record to the log
//! while the committing thread builds the next batch, so that a batch's log write and
//! the next batch's work overlap instead of taking turns.
//!
//! A batch is committed in redb (without durability) and then handed over with its
//! answers; the answers go out once its record is on the drives. Records are appended
//! in the order batches were committed, so an acknowledged change never depends on one
//! that is not in the log. Before a checkpoint resets the log, the committing thread
//! waits for every record handed over to be written ([`LogWriter::drain`]): a record
//! appended after a reset would be replayed over a checkpoint that holds newer state.
//!
//! Should an append fail, the MDT is broken: the batch and every one after it are
//! answered with EIO, nothing more is committed or checkpointed, and a restart goes back
//! to the last checkpoint and the records before the failed one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex};

use nacre_proto::mdt::errno;

use super::super::log::MdLog;
use super::{Answer, MdError, Result, lock};

/// Batches handed over and not yet being written, at most: the committing thread waits
/// beyond it. The writer takes every batch waiting at once, in one write and one flush,
/// so that batches made while a flush runs share the next one.
const QUEUED_MAX: usize = 64;

/// A committed batch waiting for its record to be written. A batch that changed nothing
/// comes with an empty record while earlier ones are still being written: its answers
/// (a stored reply, say, or an error seen against their state) wait their turn.
pub(super) struct Job {
    pub record: Vec<u8>,
    pub answers: Vec<(tokio::sync::oneshot::Sender<Result<Answer>>, Result<Answer>)>,
}

struct Shared {
    log: Mutex<MdLog>,
    room: u64,
    broken: AtomicBool,
    /// Jobs handed over and not finished.
    inflight: Mutex<usize>,
    idle: Condvar,
    /// The log's bytes in use after the last append, and those handed over since.
    head: AtomicU64,
    pending: AtomicU64,
}

pub(super) struct LogWriter {
    tx: Mutex<Option<SyncSender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    shared: Arc<Shared>,
}

impl Drop for LogWriter {
    /// The thread finishes what it was handed and stops; the log (and its volume) are
    /// let go when this returns, as they were before the writer had a thread.
    fn drop(&mut self) {
        lock(&self.tx).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl LogWriter {
    pub fn start(log: MdLog) -> LogWriter {
        let (room, head) = (log.room(), log.usage().0);
        let shared = Arc::new(Shared {
            log: Mutex::new(log),
            room,
            broken: AtomicBool::new(false),
            inflight: Mutex::new(0),
            idle: Condvar::new(),
            head: AtomicU64::new(head),
            pending: AtomicU64::new(0),
        });
        let (tx, rx) = sync_channel(QUEUED_MAX);
        let s = shared.clone();
        let spawned = std::thread::Builder::new().name("mdt-log".into()).spawn(move || write_loop(&s, rx));
        let (tx, thread) = match spawned {
            Ok(t) => (Some(tx), Some(t)),
            Err(e) => {
                // No thread: every batch fails, as after a failed append.
                eprintln!("mdt: the log writer thread did not start: {e}");
                shared.broken.store(true, Ordering::Release);
                (None, None)
            }
        };
        LogWriter { tx: Mutex::new(tx), thread: Mutex::new(thread), shared }
    }

    /// Hand a committed batch over; its answers go out once its record is written.
    pub fn submit(&self, job: Job) {
        let padded = bytes_of(&job);
        *lock(&self.shared.inflight) += 1;
        self.shared.pending.fetch_add(padded, Ordering::AcqRel);
        let sent = match &*lock(&self.tx) {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        };
        if let Err(job) = sent {
            self.shared.pending.fetch_sub(padded, Ordering::AcqRel);
            finish(&self.shared, job, Err(MdError::new(errno::EIO, "the metadata log writer is gone")));
        }
    }

    /// Wait until every record handed over is written (or failed).
    pub fn drain(&self) {
        let mut n = lock(&self.shared.inflight);
        while *n > 0 {
            n = self.shared.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Work on the log itself; call [`LogWriter::drain`] first.
    pub fn with_log<R>(&self, f: impl FnOnce(&mut MdLog) -> R) -> R {
        let mut log = lock(&self.shared.log);
        let r = f(&mut log);
        self.shared.head.store(log.usage().0, Ordering::Release);
        r
    }

    /// Would a record of `len` bytes fit after those handed over?
    pub fn fits(&self, len: usize) -> bool {
        self.used() + MdLog::padded(len) <= self.shared.room
    }

    /// Bytes in use, counting records handed over and not yet written. `pending` is read
    /// first: the writer raises `head` before it lowers `pending`, so a write landing
    /// between the two loads is counted twice, never missed.
    pub fn used(&self) -> u64 {
        let pending = self.shared.pending.load(Ordering::Acquire);
        self.shared.head.load(Ordering::Acquire) + pending
    }

    /// Has nothing handed over been left unwritten?
    pub fn idle(&self) -> bool {
        *lock(&self.shared.inflight) == 0
    }

    pub fn set_broken(&self) {
        self.shared.broken.store(true, Ordering::Release);
    }

    pub fn room(&self) -> u64 {
        self.shared.room
    }

    pub fn broken(&self) -> bool {
        self.shared.broken.load(Ordering::Acquire)
    }
}

fn write_loop(s: &Shared, rx: Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while let Ok(more) = rx.try_recv() {
            jobs.push(more);
        }
        let padded: u64 = jobs.iter().map(bytes_of).sum();
        let records: Vec<&[u8]> = jobs.iter().map(|j| j.record.as_slice()).filter(|r| !r.is_empty()).collect();
        let r = if s.broken.load(Ordering::Acquire) {
            Err(MdError::new(errno::EIO, "the metadata log failed earlier: restart the MDT"))
        } else if records.is_empty() {
            Ok(())
        } else {
            let mut log = lock(&s.log);
            match log.append_all(&records) {
                Ok(()) => {
                    s.head.store(log.usage().0, Ordering::Release);
                    Ok(())
                }
                Err(e) => {
                    s.broken.store(true, Ordering::Release);
                    Err(MdError::new(errno::EIO, format!("metadata log: {e}; restart the MDT")))
                }
            }
        };
        s.pending.fetch_sub(padded, Ordering::AcqRel);
        for job in jobs {
            finish(s, job, r.clone());
        }
    }
}

/// Log bytes a job takes (none for a batch that changed nothing).
fn bytes_of(job: &Job) -> u64 {
    if job.record.is_empty() { 0 } else { MdLog::padded(job.record.len()) }
}

/// Answer a job's changes (each its own answer, or the log's error) and count it done.
fn finish(s: &Shared, job: Job, r: std::result::Result<(), MdError>) {
    for (tx, answer) in job.answers {
        let _ = tx.send(match &r {
            Ok(()) => answer,
            Err(e) => Err(e.clone()),
        });
    }
    let mut n = lock(&s.inflight);
    *n -= 1;
    if *n == 0 {
        s.idle.notify_all();
    }
}
