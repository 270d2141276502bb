//! Drive queues: a few threads per drive slot run the reads and writes of a volume, so
//! that one stripe's strips go to all its drives at once.
//!
//! A caller hands a batch of requests to [`DriveQueues::run`] and blocks until every one
//! has finished; the buffers are borrowed for exactly that long, which is what makes the
//! raw pointers below sound (the same contract as `std::thread::scope`). One request of
//! each batch runs on the calling thread: waking a thread on the other core costs ≈ 25 µs
//! on these machines, and a single-strip read then pays no hop at all.
//!
//! The queue of each slot is bounded (`QUEUE_DEPTH_MAX`); a caller that finds it full
//! waits, so memory never grows with the offered load.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::drive::BlockDevice;

/// Requests queued per drive slot before callers wait.
pub const QUEUE_DEPTH_MAX: usize = 256;

/// The buffer of one request: filled by a read, sent by a write; a flush has none.
pub enum IoBuf<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
    /// Make the drive's completed writes durable (`BlockDevice::sync`).
    Flush,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Read,
    Write,
    Flush,
}

/// One read or write of one drive slot.
pub struct IoReq<'a> {
    pub slot: usize,
    pub drive: Arc<dyn BlockDevice>,
    pub offset: u64,
    pub buf: IoBuf<'a>,
}

/// A request failed: which one (its index in the batch), on which slot, and why.
#[derive(Debug)]
pub struct IoFailure {
    pub index: usize,
    pub slot: usize,
    pub error: io::Error,
}

struct Batch {
    remaining: AtomicUsize,
    failures: Mutex<Vec<IoFailure>>,
    waiter: Thread,
}

impl Batch {
    fn finish(&self, index: usize, slot: usize, result: io::Result<()>) {
        if let Err(error) = result {
            self.failures.lock().unwrap_or_else(|e| e.into_inner()).push(IoFailure { index, slot, error });
        }
        // Clone the handle first: once `remaining` hits zero the batch may be freed.
        let waiter = self.waiter.clone();
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            waiter.unpark();
        }
    }
}

struct Job {
    drive: Arc<dyn BlockDevice>,
    kind: Kind,
    ptr: usize,
    len: usize,
    offset: u64,
    index: usize,
    slot: usize,
    batch: Arc<Batch>,
}

impl Job {
    fn execute(self) {
        // A drive implementation that panics must still complete its job: the caller
        // is parked on the batch and its buffers are borrowed until every job finishes.
        let batch = self.batch.clone();
        let (index, slot) = (self.index, self.slot);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.perform())) {
            Ok(result) => batch.finish(index, slot, result),
            Err(_) => batch.finish(index, slot, Err(std::io::Error::other("drive IO panicked"))),
        }
    }

    fn perform(&self) -> std::io::Result<()> {
        if self.kind == Kind::Flush {
            self.drive.sync()
        } else if self.kind == Kind::Write {
            // SAFETY: `run` keeps the borrowed buffer alive and unaliased until this job
            // has called `finish`, and ptr/len came from a valid slice.
            let buf = unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) };
            self.drive.write_at(buf, self.offset)
        } else {
            // SAFETY: as above; the slice was a unique `&mut` borrow in the batch.
            let buf = unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) };
            self.drive.read_at(buf, self.offset)
        }
    }
}

/// The worker threads of one volume.
pub struct DriveQueues {
    senders: Vec<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl DriveQueues {
    pub fn new(slots: usize, threads_per_slot: usize) -> DriveQueues {
        let mut senders = Vec::with_capacity(slots);
        let mut threads = Vec::new();
        for slot in 0..slots {
            let (tx, rx): (Sender<Job>, Receiver<Job>) = bounded(QUEUE_DEPTH_MAX);
            for t in 0..threads_per_slot.max(1) {
                let rx = rx.clone();
                let handle = thread::Builder::new()
                    .name(format!("raid-io-{slot}.{t}"))
                    .spawn(move || {
                        for job in rx {
                            job.execute();
                        }
                    })
                    .expect("spawn drive IO thread");
                threads.push(handle);
            }
            senders.push(tx);
        }
        DriveQueues { senders, threads }
    }

    /// Run every request, in parallel across slots, and return the failures.
    pub fn run(&self, reqs: Vec<IoReq<'_>>) -> Vec<IoFailure> {
        let n = reqs.len();
        if n == 0 {
            return Vec::new();
        }
        let batch = Arc::new(Batch {
            remaining: AtomicUsize::new(n),
            failures: Mutex::new(Vec::new()),
            waiter: thread::current(),
        });
        let mut inline = None;
        for (index, req) in reqs.into_iter().enumerate() {
            let (kind, ptr, len) = match req.buf {
                IoBuf::Read(b) => (Kind::Read, b.as_mut_ptr() as usize, b.len()),
                IoBuf::Write(b) => (Kind::Write, b.as_ptr() as usize, b.len()),
                IoBuf::Flush => (Kind::Flush, 0, 0),
            };
            let job = Job {
                drive: req.drive,
                kind,
                ptr,
                len,
                offset: req.offset,
                index,
                slot: req.slot,
                batch: batch.clone(),
            };
            if index == n - 1 {
                inline = Some(job);
            } else if let Err(e) = self.senders[req.slot].send(job) {
                // Workers are gone only after shutdown; run it here rather than lose it.
                e.into_inner().execute();
            }
        }
        if let Some(job) = inline {
            job.execute();
        }
        while batch.remaining.load(Ordering::Acquire) != 0 {
            thread::park();
        }
        std::mem::take(&mut *batch.failures.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for DriveQueues {
    fn drop(&mut self) {
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
