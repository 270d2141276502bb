//! RPC over TCP: requests and replies matched by xid, bulk payloads read straight from the
//! socket into their own buffer, bounded in-flight requests per client connection, and a
//! server whose request buffers are bounded: when `req_buffers_max` requests are being
//! handled, its connections stop reading, so TCP pushes back on the clients instead of
//! the server running out of memory (CEA's OOM at 20,000 clients).
//!
//! A connection reads a frame as header (checked, see [`crate::frame`]), then body, then
//! bulk, each with `read_exact` into a buffer of the checked length; a malformed frame
//! closes that connection with the reason, and nothing else. Every spawned task belongs to
//! a `JoinSet` that is aborted when its owner is dropped.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore, oneshot};
use tokio::task::JoinSet;

use crate::bulk::BulkPool;
use crate::frame::{Frame, FrameError, FrameHeader, FrameLimits, HEADER_BYTES, flags};

/// Errors of an RPC call or of a connection.
#[derive(Debug)]
pub enum RpcError {
    Io(io::Error),
    /// The peer sent something that is not a frame; the connection was closed.
    Frame(FrameError),
    /// No reply within the deadline.
    Timeout {
        xid: u64,
        after: Duration,
    },
    /// The connection closed before the reply came.
    Closed,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Io(e) => write!(f, "connection error: {e}"),
            RpcError::Frame(e) => write!(f, "connection closed: {e}"),
            RpcError::Timeout { xid, after } => write!(f, "request {xid} got no reply within {after:?}"),
            RpcError::Closed => write!(f, "connection closed before the reply"),
        }
    }
}

impl std::error::Error for RpcError {}

impl From<io::Error> for RpcError {
    fn from(e: io::Error) -> Self {
        RpcError::Io(e)
    }
}

/// Read one frame: header first, then exactly the lengths it was allowed to claim.
pub async fn read_frame(
    r: &mut OwnedReadHalf,
    limits: &FrameLimits,
    pool: &Arc<BulkPool>,
) -> Result<Option<Frame>, RpcError> {
    let mut raw = [0u8; HEADER_BYTES];
    match r.read_exact(&mut raw).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let header = FrameHeader::decode(&raw, limits).map_err(RpcError::Frame)?;
    let mut body = Vec::with_capacity(header.body_len as usize);
    read_exactly(r, header.body_len as usize, &mut body).await?;
    let mut bulk = pool.take(header.bulk_len as usize);
    read_exactly(r, header.bulk_len as usize, &mut bulk).await?;
    Ok(Some(Frame { header, body, bulk }))
}

/// Read exactly `n` bytes (already checked against the limits) into `buf`, straight
/// from the socket into its spare capacity: no zeroing pass over a 16 MiB bulk first
/// (measured: zeroed buffers cost a third of the bulk bandwidth on loopback).
async fn read_exactly(r: &mut OwnedReadHalf, n: usize, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.reserve(n);
    while buf.len() < n {
        let mut limited = (&mut *r).take((n - buf.len()) as u64);
        if limited.read_buf(buf).await? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "stream ended inside a frame"));
        }
    }
    Ok(())
}

/// Write one frame; the bulk goes from its own buffer, never copied into a message.
pub async fn write_frame(w: &mut OwnedWriteHalf, header: &FrameHeader, body: &[u8], bulk: &[u8]) -> io::Result<()> {
    w.write_all(&header.encode()).await?;
    w.write_all(body).await?;
    w.write_all(bulk).await?;
    Ok(())
}

/// Settings of a client connection.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Requests outstanding on the connection (`max_rpcs_in_flight`).
    pub max_rpcs_in_flight: usize,
    pub limits: FrameLimits,
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { max_rpcs_in_flight: 8, limits: FrameLimits::default(), timeout: Duration::from_secs(30) }
    }
}

type Pending = Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<Frame>>>>;

/// One client connection to a server.
pub struct RpcClient {
    writer: Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_xid: AtomicU64,
    in_flight: Arc<Semaphore>,
    opts: ClientOptions,
    _tasks: JoinSet<()>,
}

impl RpcClient {
    pub async fn connect(addr: SocketAddr, opts: ClientOptions) -> Result<RpcClient, RpcError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (mut r, w) = stream.into_split();
        let pending: Pending = Arc::default();
        let mut tasks = JoinSet::new();
        let (p, limits) = (pending.clone(), opts.limits);
        tasks.spawn(async move {
            // Replies go to their callers, so their buffers are not pooled here.
            let pool = BulkPool::new(0);
            // Replies are matched by xid; a reply nobody waits for (timed out) is dropped.
            while let Ok(Some(frame)) = read_frame(&mut r, &limits, &pool).await {
                if frame.header.flags & flags::EARLY != 0 {
                    continue;
                }
                let waiter = p.lock().unwrap_or_else(|e| e.into_inner()).remove(&frame.header.xid);
                if let Some(tx) = waiter {
                    let _ = tx.send(frame);
                }
            }
            // Connection gone: every waiter learns it at once.
            p.lock().unwrap_or_else(|e| e.into_inner()).clear();
        });
        Ok(RpcClient {
            writer: Mutex::new(w),
            pending,
            next_xid: AtomicU64::new(1),
            in_flight: Arc::new(Semaphore::new(opts.max_rpcs_in_flight.max(1))),
            opts,
            _tasks: tasks,
        })
    }

    /// Send a request and wait for its reply.
    pub async fn call(&self, opcode: u16, body: &[u8], bulk: &[u8]) -> Result<Frame, RpcError> {
        let _slot = self.in_flight.acquire().await.map_err(|_| RpcError::Closed)?;
        let xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
        let header = FrameHeader {
            opcode,
            flags: 0,
            status: 0,
            xid,
            body_len: body.len() as u32,
            bulk_len: bulk.len() as u32,
            job_id: 0,
            timeout_ms: self.opts.timeout.as_millis().min(u32::MAX as u128) as u32,
        };
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(xid, tx);
        let sent = {
            let mut w = self.writer.lock().await;
            write_frame(&mut w, &header, body, bulk).await
        };
        if let Err(e) = sent {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&xid);
            return Err(e.into());
        }
        match tokio::time::timeout(self.opts.timeout, rx).await {
            Ok(Ok(frame)) => Ok(frame),
            Ok(Err(_)) => Err(RpcError::Closed),
            Err(_) => {
                self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&xid);
                Err(RpcError::Timeout { xid, after: self.opts.timeout })
            }
        }
    }
}

/// What a service does with a request: the reply's status, body and bulk.
pub type Reply = (i32, Vec<u8>, Vec<u8>);
type HandlerFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;
/// A service's request handler.
pub type Handler = Arc<dyn Fn(Frame) -> HandlerFuture + Send + Sync>;

/// Settings of a server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Requests being handled at once, over all connections (`req_buffers_max`).
    pub req_buffers_max: usize,
    pub limits: FrameLimits,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions { req_buffers_max: 512, limits: FrameLimits::default() }
    }
}

/// A listening RPC server. Dropping it stops it and every connection.
pub struct RpcServer {
    addr: SocketAddr,
    buffers: Arc<Semaphore>,
    opts: ServerOptions,
    _tasks: JoinSet<()>,
}

impl RpcServer {
    /// Listen on `addr` (port 0 picks a free one) and serve every request with `handler`.
    pub async fn bind(addr: SocketAddr, handler: Handler, opts: ServerOptions) -> Result<RpcServer, RpcError> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let buffers = Arc::new(Semaphore::new(opts.req_buffers_max.max(1)));
        let mut tasks = JoinSet::new();
        let (b, limits) = (buffers.clone(), opts.limits);
        // Enough kept buffers for every request buffer to hold a full bulk, at most 256 MiB.
        let pool = BulkPool::new((opts.req_buffers_max * limits.bulk_max as usize).min(256 << 20));
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _peer)) => stream,
                    Err(_) => {
                        // Out of descriptors or similar: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                conns.spawn(serve_connection(stream, handler.clone(), b.clone(), limits, pool.clone()));
                // Reap finished connections so the set does not grow with churn.
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(RpcServer { addr, buffers, opts, _tasks: tasks })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Request buffers in use now.
    pub fn buffers_in_use(&self) -> usize {
        self.opts.req_buffers_max.max(1) - self.buffers.available_permits()
    }
}

/// One connection: wait for bytes, take a request buffer, then read the request. With
/// every buffer taken the loop waits before reading, and the socket's receive window fills.
async fn serve_connection(
    stream: TcpStream,
    handler: Handler,
    buffers: Arc<Semaphore>,
    limits: FrameLimits,
    pool: Arc<BulkPool>,
) {
    let (mut r, w) = stream.into_split();
    let w = Arc::new(Mutex::new(w));
    let mut handlers = JoinSet::new();
    loop {
        // Wait for the peer to send before taking a buffer: an idle connection holds none,
        // so 10,000 quiet clients cannot starve a busy one.
        // (Readiness alone is not enough: it stays set after a read that drained the
        // socket exactly, so peek until a byte is really there.)
        match r.peek(&mut [0u8; 1]).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(permit) = buffers.clone().acquire_owned().await else { break };
        let frame = match read_frame(&mut r, &limits, &pool).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(RpcError::Frame(e)) => {
                // A peer that does not speak the protocol is cut off, with the reason.
                eprintln!("nacre-net: closing connection: {e}");
                break;
            }
            Err(_) => break,
        };
        let (handler, w) = (handler.clone(), w.clone());
        handlers.spawn(async move {
            let xid = frame.header.xid;
            let opcode = frame.header.opcode;
            let (status, body, bulk) = handler(frame).await;
            let header = FrameHeader {
                opcode,
                flags: flags::REPLY,
                status,
                xid,
                body_len: body.len() as u32,
                bulk_len: bulk.len() as u32,
                job_id: 0,
                timeout_ms: 0,
            };
            let mut w = w.lock().await;
            let _ = write_frame(&mut w, &header, &body, &bulk).await;
            drop(permit);
        });
        while handlers.try_join_next().is_some() {}
    }
    while handlers.join_next().await.is_some() {}
}
