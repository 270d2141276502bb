//! Transports: how bytes get from one endpoint to another. The RPC layer sees only a
//! [`Transport`] that connects to and listens on [`Nid`]s and hands out byte streams, so an
//! RDMA or in-memory transport can be added without touching a service.
//!
//! Two are here: [`TcpTransport`] (sockets with `TCP_NODELAY`, one stream per connection;
//! the RPC layer opens `conns_per_peer` of them to each peer) and [`MemTransport`]
//! (in-process pipes between named endpoints of one [`MemNetwork`], for tests where
//! sockets add nothing but time); [`Shortcut`] is TCP with pipes inside one process. The
//! writer of a pipe runs its reader's task on its own thread (`crate::inline`), so a
//! message inside one process costs no thread wake-up.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::inline::{PipeWrite, Reader};
use crate::nid::Nid;
use crate::rpc::lock;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// One connection: its two directions and the endpoints at each end.
pub struct Stream {
    pub read: ReadHalf,
    pub write: WriteHalf,
    pub local: Nid,
    pub peer: Nid,
    /// An in-memory pipe's reading task, which the other end's writer runs.
    reader: Option<Arc<Reader>>,
}

impl Stream {
    /// How to run the task that will read this stream (take it before moving `read`
    /// into the task).
    pub fn read_task(&mut self) -> ReadTask {
        ReadTask(self.reader.take())
    }
}

/// The task that reads a [`Stream`], to spawn. On an in-memory pipe the writer at the
/// other end runs it on its own thread when its bytes wake it (see [`crate::inline`]);
/// on a socket it is the task itself.
pub struct ReadTask(Option<Arc<Reader>>);

impl ReadTask {
    pub fn run(self, task: impl Future<Output = ()> + Send + 'static) -> BoxFuture<'static, ()> {
        match self.0 {
            Some(reader) => Box::pin(reader.start(Box::pin(task))),
            None => Box::pin(task),
        }
    }
}

/// Two connected in-memory streams: `a` at `a_nid` to `b` at `b_nid`. Each one's writer
/// runs the other's reading task (see [`crate::inline`]).
fn pipe(a_nid: Nid, b_nid: Nid) -> (Stream, Stream) {
    let (a, b) = tokio::io::duplex(MEM_PIPE_BYTES);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let (a_reader, b_reader) = (Reader::new(), Reader::new());
    let a = Stream {
        read: Box::new(ar),
        write: Box::new(PipeWrite { pipe: aw, reader: b_reader.clone() }),
        local: a_nid.clone(),
        peer: b_nid.clone(),
        reader: Some(a_reader.clone()),
    };
    let b = Stream {
        read: Box::new(br),
        write: Box::new(PipeWrite { pipe: bw, reader: a_reader }),
        local: b_nid,
        peer: a_nid,
        reader: Some(b_reader),
    };
    (a, b)
}

/// Something that connects to and listens on NIDs.
pub trait Transport: Send + Sync + 'static {
    fn connect<'a>(&'a self, to: &'a Nid) -> BoxFuture<'a, io::Result<Stream>>;
    fn listen<'a>(&'a self, on: &'a Nid) -> BoxFuture<'a, io::Result<Box<dyn Listener>>>;
}

/// A listening endpoint.
pub trait Listener: Send {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Stream>>;
    /// The NID it listens on (with the port filled in if 0 was asked for).
    fn nid(&self) -> Nid;
}

fn unreachable_nid(kind: &str, nid: &Nid) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("the {kind} transport cannot reach {nid}"))
}

/// TCP sockets.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpTransport;

impl Transport for TcpTransport {
    fn connect<'a>(&'a self, to: &'a Nid) -> BoxFuture<'a, io::Result<Stream>> {
        Box::pin(async move {
            let Nid::Tcp(addr) = to else { return Err(unreachable_nid("tcp", to)) };
            let s = TcpStream::connect(addr).await?;
            tcp_stream(s)
        })
    }

    fn listen<'a>(&'a self, on: &'a Nid) -> BoxFuture<'a, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let Nid::Tcp(addr) = on else { return Err(unreachable_nid("tcp", on)) };
            let l = TcpListener::bind(addr).await?;
            let nid = Nid::Tcp(l.local_addr()?);
            Ok(Box::new(TcpListen { l, nid }) as Box<dyn Listener>)
        })
    }
}

/// Bytes a socket's reader takes from the kernel at once.
const READ_BUFFER_BYTES: usize = 4 << 10;

fn tcp_stream(s: TcpStream) -> io::Result<Stream> {
    s.set_nodelay(true)?;
    let (local, peer) = (Nid::Tcp(s.local_addr()?), Nid::Tcp(s.peer_addr()?));
    let (r, w) = s.into_split();
    let r = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, r);
    Ok(Stream { read: Box::new(r), write: Box::new(w), local, peer, reader: None })
}

struct TcpListen {
    l: TcpListener,
    nid: Nid,
}

impl Listener for TcpListen {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Stream>> {
        Box::pin(async move {
            let (s, _) = self.l.accept().await?;
            tcp_stream(s)
        })
    }

    fn nid(&self) -> Nid {
        self.nid.clone()
    }
}

/// Bytes a pipe of the in-memory transport buffers in each direction.
const MEM_PIPE_BYTES: usize = 256 << 10;
/// Connections waiting to be accepted by one in-memory listener (its backlog).
const MEM_BACKLOG: usize = 1024;

/// The in-process network that [`MemTransport`] endpoints share.
#[derive(Default, Clone)]
pub struct MemNetwork {
    listeners: Arc<Mutex<HashMap<String, mpsc::Sender<Stream>>>>,
}

impl MemNetwork {
    pub fn new() -> MemNetwork {
        MemNetwork::default()
    }

    /// A transport whose connections come from `name@mem`.
    pub fn transport(&self, name: &str) -> MemTransport {
        MemTransport { net: self.clone(), local: Nid::Mem(name.to_string()) }
    }
}

/// One endpoint of a [`MemNetwork`].
#[derive(Clone)]
pub struct MemTransport {
    net: MemNetwork,
    local: Nid,
}

impl Transport for MemTransport {
    fn connect<'a>(&'a self, to: &'a Nid) -> BoxFuture<'a, io::Result<Stream>> {
        Box::pin(async move {
            let Nid::Mem(name) = to else { return Err(unreachable_nid("in-memory", to)) };
            let tx = lock(&self.net.listeners).get(name).cloned();
            let tx =
                tx.ok_or_else(|| io::Error::new(io::ErrorKind::ConnectionRefused, format!("nothing listens on {to}")))?;
            let (ours, theirs) = pipe(self.local.clone(), to.clone());
            tx.send(theirs)
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::ConnectionRefused, format!("{to} stopped")))?;
            Ok(ours)
        })
    }

    fn listen<'a>(&'a self, on: &'a Nid) -> BoxFuture<'a, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let Nid::Mem(name) = on else { return Err(unreachable_nid("in-memory", on)) };
            let mut map = lock(&self.net.listeners);
            if map.get(name).is_some_and(|tx| !tx.is_closed()) {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{on} is already listening")));
            }
            let (tx, rx) = mpsc::channel(MEM_BACKLOG);
            map.insert(name.clone(), tx);
            Ok(Box::new(MemListen { rx, nid: on.clone(), net: self.net.clone() }) as Box<dyn Listener>)
        })
    }
}

struct MemListen {
    rx: mpsc::Receiver<Stream>,
    nid: Nid,
    net: MemNetwork,
}

impl Listener for MemListen {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Stream>> {
        Box::pin(async move {
            self.rx.recv().await.ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "listener closed"))
        })
    }

    fn nid(&self) -> Nid {
        self.nid.clone()
    }
}

impl Drop for MemListen {
    fn drop(&mut self) {
        // Close first: then the registered sender reports closed if it is ours, and a
        // newer listener on the same name is left alone.
        self.rx.close();
        if let Nid::Mem(name) = &self.nid {
            let mut map = lock(&self.net.listeners);
            if map.get(name).is_some_and(|tx| tx.is_closed()) {
                map.remove(name);
            }
        }
    }
}

/// TCP, with a shortcut inside one process: a connect to a NID that a [`Shortcut`]
/// listener of this same process serves becomes an in-memory pipe to it, with no
/// socket, no syscalls and no loopback stack; anything else is plain TCP. `nacre up`
/// serves its targets and its own mount with it (over loopback TCP a stat cost three
/// times as much), while other processes and machines reach the same listeners over TCP.
#[derive(Debug, Default, Clone, Copy)]
pub struct Shortcut;

/// The listeners of this process, by the TCP NID they serve.
fn shortcuts() -> &'static Mutex<HashMap<Nid, mpsc::Sender<Stream>>> {
    static MAP: std::sync::OnceLock<Mutex<HashMap<Nid, mpsc::Sender<Stream>>>> = std::sync::OnceLock::new();
    MAP.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Shortcut {
    /// Whether a listener of this process serves `nid` (a connect to it stays inside).
    pub fn serves(nid: &Nid) -> bool {
        lock(shortcuts()).get(nid).is_some_and(|tx| !tx.is_closed())
    }
}

impl Transport for Shortcut {
    fn connect<'a>(&'a self, to: &'a Nid) -> BoxFuture<'a, io::Result<Stream>> {
        Box::pin(async move {
            let tx = lock(shortcuts()).get(to).filter(|tx| !tx.is_closed()).cloned();
            let Some(tx) = tx else { return TcpTransport.connect(to).await };
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let me = Nid::Mem(format!("local-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
            let (ours, theirs) = pipe(me, to.clone());
            tx.send(theirs)
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::ConnectionRefused, format!("{to} stopped")))?;
            Ok(ours)
        })
    }

    fn listen<'a>(&'a self, on: &'a Nid) -> BoxFuture<'a, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let Nid::Tcp(addr) = on else { return Err(unreachable_nid("tcp", on)) };
            let l = TcpListener::bind(addr).await?;
            let nid = Nid::Tcp(l.local_addr()?);
            let (tx, rx) = mpsc::channel(MEM_BACKLOG);
            lock(shortcuts()).insert(nid.clone(), tx);
            Ok(Box::new(ShortcutListen { tcp: TcpListen { l, nid }, rx }) as Box<dyn Listener>)
        })
    }
}

struct ShortcutListen {
    tcp: TcpListen,
    rx: mpsc::Receiver<Stream>,
}

impl Listener for ShortcutListen {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Stream>> {
        Box::pin(async move {
            tokio::select! {
                s = self.rx.recv() => s.ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "listener closed")),
                s = self.tcp.accept() => s,
            }
        })
    }

    fn nid(&self) -> Nid {
        self.tcp.nid.clone()
    }
}

impl Drop for ShortcutListen {
    fn drop(&mut self) {
        self.rx.close();
        let mut map = lock(shortcuts());
        if map.get(&self.tcp.nid).is_some_and(|tx| tx.is_closed()) {
            map.remove(&self.tcp.nid);
        }
    }
}
