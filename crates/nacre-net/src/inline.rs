//! Pipes whose writer runs the reader: no thread wake-up for a message inside one process.
//!
//! In one process (`nacre up`, the tests) a client and a server talk through in-memory
//! pipes. A request written into a pipe wakes a runtime worker for the server's
//! connection task, and its reply wakes another thread for the caller: two thread
//! wake-ups per RPC, each costing more on a loaded machine than serving the request
//! itself. Here the writer, right after its bytes are in, runs the reading task's next
//! step on its own thread, as LNet's `lo` interface delivers a message with no thread of
//! its own. A request from the mount is then read, served and answered, and its reply
//! read back, on the thread that sent it.
//!
//! The reading task stays an ordinary runtime task: it is spawned, aborted and woken as
//! any other (a timer, a lock, another pipe wake it through the runtime). The writer only
//! lends it its thread, and only for the wake-up its own bytes caused. A task is polled
//! by one thread at a time: a wake-up while it runs elsewhere asks that thread to poll it
//! once more instead of waking anyone.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use tokio::io::{AsyncWrite, DuplexStream, WriteHalf};

use crate::rpc::lock;
use crate::transport::BoxFuture;

/// Not started yet: nothing can wake it, and there is nothing to run.
const EMPTY: u8 = 0;
const IDLE: u8 = 1;
const RUNNING: u8 = 2;
/// Running, and woken meanwhile: the running thread polls it once more.
const NOTIFIED: u8 = 3;
/// Running, and its owner was dropped: the running thread drops it when its poll ends.
const CANCELLED: u8 = 4;
const DONE: u8 = 5;

/// Polls of a task woken while it runs, in one [`Reader::run`], before it goes back to its
/// runtime task (a task that wakes itself at every poll would spin).
const REPOLLS: u32 = 4;

thread_local! {
    /// The reader of the pipe this thread is writing into at the moment (its address).
    static WRITING: Cell<usize> = const { Cell::new(0) };
    /// Inside [`unlocked`]: the readers its writes woke, run when its poll is over.
    static HELD: RefCell<Option<Vec<Arc<Reader>>>> = const { RefCell::new(None) };
}

/// Run `write`, which writes into a pipe under a lock that other writers wait for, and
/// run the readers its writes woke only after each of its polls: the lock is let go
/// first (when the write is done within the poll, as it nearly always is), so another
/// thread's request is not held up behind the serving of this one.
pub(crate) async fn unlocked<F: Future>(write: F) -> F::Output {
    let mut write = std::pin::pin!(write);
    std::future::poll_fn(|cx| {
        let _held = Held(HELD.with(|h| h.replace(Some(Vec::new()))));
        write.as_mut().poll(cx)
    })
    .await
}

/// Puts back the outer scope of [`unlocked`] and runs what was held, even on a panic
/// (a woken reader that never ran would wait for ever).
struct Held(Option<Vec<Arc<Reader>>>);

impl Drop for Held {
    fn drop(&mut self) {
        let held = HELD.with(|h| h.replace(self.0.take())).unwrap_or_default();
        for reader in held {
            reader.run(true);
        }
    }
}

/// The task reading one pipe, shared by its runtime task and the pipe's writer.
pub(crate) struct Reader {
    state: AtomicU8,
    task: Mutex<Option<BoxFuture<'static, ()>>>,
    /// The runtime task's waker, for wake-ups that are not the writer's.
    owner: Mutex<Option<Waker>>,
    /// The writer's bytes woke it: the writer runs it as soon as its write is done.
    woken_by_writer: AtomicBool,
}

impl Reader {
    pub(crate) fn new() -> Arc<Reader> {
        Arc::new(Reader {
            state: AtomicU8::new(EMPTY),
            task: Mutex::new(None),
            owner: Mutex::new(None),
            woken_by_writer: AtomicBool::new(false),
        })
    }

    /// The reading task, to spawn: it runs `task`, which the pipe's writer may also step.
    pub(crate) fn start(self: Arc<Self>, task: BoxFuture<'static, ()>) -> Driven {
        *lock(&self.task) = Some(task);
        self.state.store(IDLE, Ordering::Release);
        Driven(self)
    }

    fn is_writing_into(self: &Arc<Self>) -> bool {
        WRITING.with(|w| w.get() == Arc::as_ptr(self) as usize)
    }

    fn wake_owner(&self) {
        if let Some(w) = lock(&self.owner).as_ref() {
            w.wake_by_ref();
        }
    }

    /// Poll the task on this thread, unless another thread is polling it (then that one
    /// polls again), it has ended, or it was never started. A wake-up during the poll
    /// polls it again here, a few times; past that it goes back to its runtime task.
    ///
    /// `lent`: the thread is a writer's, not the runtime task's. Its poll then runs
    /// outside the cooperative budget of whatever the writer is part of: that budget
    /// may be spent, and a task polled with a spent budget only wakes itself again.
    fn run(self: &Arc<Self>, lent: bool) {
        if self.state.compare_exchange(IDLE, RUNNING, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // Running elsewhere: it must look again, as a wake-up would make it.
            let _ = self.state.compare_exchange(RUNNING, NOTIFIED, Ordering::AcqRel, Ordering::Acquire);
            return;
        }
        let waker = Waker::from(self.clone());
        let mut cx = Context::from_waker(&waker);
        let mut polls = 0;
        loop {
            polls += 1;
            let ended = match lock(&self.task).as_mut() {
                Some(task) if lent => {
                    let mut once = tokio::task::unconstrained(std::future::poll_fn(|cx| task.as_mut().poll(cx)));
                    Pin::new(&mut once).poll(&mut cx).is_ready()
                }
                Some(task) => task.as_mut().poll(&mut cx).is_ready(),
                None => true,
            };
            if !ended {
                match self.state.compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return,
                    Err(NOTIFIED) if polls < REPOLLS => {
                        self.state.store(RUNNING, Ordering::Release);
                        continue;
                    }
                    Err(NOTIFIED) => {
                        self.state.store(IDLE, Ordering::Release);
                        return self.wake_owner();
                    }
                    Err(_) => {} // CANCELLED: dropped below.
                }
            }
            // Dropped outside the lock: its drop may wake other tasks.
            let task = lock(&self.task).take();
            self.state.store(DONE, Ordering::Release);
            drop(task);
            self.wake_owner();
            return;
        }
    }

    /// The runtime task is gone (aborted, or its server stopped): drop the task now, or
    /// when the thread running it is done with this poll.
    fn cancel(&self) {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            let next = match s {
                EMPTY | IDLE => DONE,
                RUNNING | NOTIFIED => CANCELLED,
                _ => return,
            };
            match self.state.compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if next == DONE => {
                    let task = lock(&self.task).take();
                    drop(task);
                    return;
                }
                Ok(_) => return,
                Err(now) => s = now,
            }
        }
    }
}

impl Wake for Reader {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            match s {
                RUNNING => match self.state.compare_exchange(RUNNING, NOTIFIED, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return,
                    Err(now) => s = now,
                },
                IDLE if self.is_writing_into() => {
                    self.woken_by_writer.store(true, Ordering::Release);
                    return;
                }
                IDLE => return self.wake_owner(),
                _ => return,
            }
        }
    }
}

/// The runtime task of a [`Reader`]; dropping it (an abort) drops the reading task.
pub(crate) struct Driven(Arc<Reader>);

impl Future for Driven {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut owner = lock(&self.0.owner);
            if !owner.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *owner = Some(cx.waker().clone());
            }
        }
        self.0.run(false);
        match self.0.state.load(Ordering::Acquire) {
            DONE => Poll::Ready(()),
            _ => Poll::Pending,
        }
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The writing end of a pipe: after each write that woke the reader, it runs the reader.
pub(crate) struct PipeWrite {
    pub(crate) pipe: WriteHalf<DuplexStream>,
    pub(crate) reader: Arc<Reader>,
}

impl PipeWrite {
    /// Do `io` on the pipe, then run the reader if it woke it.
    fn writing<T>(&mut self, io: impl FnOnce(Pin<&mut WriteHalf<DuplexStream>>) -> T) -> T {
        let me = Arc::as_ptr(&self.reader) as usize;
        let before = WRITING.with(|w| w.replace(me));
        let r = io(Pin::new(&mut self.pipe));
        WRITING.with(|w| w.set(before));
        if self.reader.woken_by_writer.swap(false, Ordering::AcqRel) {
            let reader = &self.reader;
            let held = HELD.with(|h| match h.borrow_mut().as_mut() {
                Some(list) => {
                    if !list.iter().any(|r| Arc::ptr_eq(r, reader)) {
                        list.push(reader.clone());
                    }
                    true
                }
                None => false,
            });
            if !held {
                reader.run(true);
            }
        }
        r
    }
}

impl AsyncWrite for PipeWrite {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.writing(|p| p.poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.pipe).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.writing(|p| p.poll_shutdown(cx))
    }
}
