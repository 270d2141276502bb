//! The OSS: a server's OSTs over the transport, after Lustre's ost/ofd.
//!
//! Each request names a target by its index on this server. Target operations block (they
//! do volume IO), so they run on tokio's blocking pool; the transport bounds how many are
//! held at once (`req_buffers_max`, `threads_max`). Bulk data is checked against
//! `brw_size`; a write carries one or more extents of an object (niobufs), each checked
//! against its CRC-32C before anything is written, and a read computes one when asked, so
//! that data is checked end to end. Every error goes back as a negative errno with a
//! message naming the problem.
//!
//! Small writes are answered before commit (see [`nacre_osd::writeback`]): the reply
//! carries a transno the client keeps the write under until `last_committed` covers it,
//! and a restarted OSS waits for its clients to replay what it lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use nacre_net::server::{Commits, Handler, Incoming, Recovering, RecoveryStats, Reply, Service};
use nacre_osd::{ObjectAttr, OsdError, SetAttr, Target, WriteBack, WriteBackOptions};
use nacre_proto::ost::{self, Attr, Request, StatFs, set};
use nacre_proto::param;

use crate::tunable::number;

use crate::stats::{Op, TargetStats};

/// Errnos the OSS answers with besides the object store's own.
pub mod errno {
    pub const ENODEV: i32 = -19;
    pub const EINVAL: i32 = -22;
    pub const EPROTO: i32 = -71;
    pub const EBADMSG: i32 = -74;
    pub const EIO: i32 = -5;
}

/// Settings of an OSS, named as Lustre's.
#[derive(Debug, Clone, Copy)]
pub struct OssConfig {
    /// Largest read or write in one RPC (`obdfilter.*.brw_size`).
    pub brw_size: u32,
    /// Largest batch of objects one create makes (`precreate_batch` asks for 1024).
    pub create_batch_max: u32,
    /// Small writes held before commit.
    pub writeback: WriteBackOptions,
}

impl Default for OssConfig {
    fn default() -> Self {
        OssConfig {
            brw_size: 16 << 20,
            create_batch_max: nacre_osd::target::CREATE_BATCH_MAX,
            writeback: WriteBackOptions::default(),
        }
    }
}

/// The OSS's commits, for its server.
struct OssCommits(Arc<Oss>);

impl Commits for OssCommits {
    fn last_committed(&self) -> u64 {
        self.0.wb.last_committed()
    }

    fn commit(&self) -> nacre_net::transport::BoxFuture<'static, u64> {
        let oss = self.0.clone();
        Box::pin(async move {
            let o = oss.clone();
            match tokio::task::spawn_blocking(move || o.wb.commit()).await {
                Ok(Err(e)) => eprintln!("oss: a commit asked for failed: {e}"),
                Err(e) => eprintln!("oss: a commit asked for failed: {e}"),
                Ok(Ok(_)) => {}
            }
            oss.wb.last_committed()
        })
    }

    fn forget(&self, client: u64) -> nacre_net::transport::BoxFuture<'static, ()> {
        let oss = self.0.clone();
        Box::pin(async move {
            if let Ok(Err(e)) = tokio::task::spawn_blocking(move || oss.wb.forget_client(client)).await {
                eprintln!("oss: letting go of client {client:016x}: {e}");
            }
        })
    }
}

pub struct Oss {
    /// Each target with its name (`ost0`) and statistics.
    targets: Vec<(String, Arc<Target>, TargetStats)>,
    cfg: OssConfig,
    /// `brw_size`, settable while running.
    brw_size: std::sync::atomic::AtomicU32,
    /// The server this OSS runs on, once attached (transport statistics and policy).
    server: std::sync::Mutex<Option<nacre_net::server::ServerHandle>>,
    /// Small reads running on runtime threads (see [`Oss::inline_read`]).
    inline_reads: AtomicUsize,
    /// Small writes answered before commit (see [`nacre_osd::writeback`]).
    wb: WriteBack,
    /// Each target's scrub, by index (`obdfilter.*.scrub`).
    scrubs: Vec<Arc<std::sync::Mutex<Scrub>>>,
}

/// A target's scrub: the one running or the last one.
#[derive(Default)]
struct Scrub {
    running: bool,
    /// Asked to stop (`scrub=stop`).
    stop: bool,
    /// At most this many MB/s (`scrub_rate_mb`; 0: as fast as the drives go), read at
    /// each step, so a change applies to a running scrub.
    rate_mb: u64,
    /// Chunks read so far, of how many.
    done: u64,
    total: u64,
    /// How the last one ended.
    last: Option<Result<nacre_osd::ScrubReport, String>>,
}

impl Scrub {
    fn render(&self) -> String {
        let status = match (&self.last, self.running) {
            (_, true) => "running",
            (None, false) => "never",
            (Some(Ok(r)), false) if r.complete => "completed",
            (Some(Ok(_)), false) => "stopped",
            (Some(Err(_)), false) => "failed",
        };
        let mut out = format!("status {status}\nchunks_done {}\nchunks_total {}", self.done, self.total);
        match &self.last {
            Some(Ok(r)) => {
                let lost: Vec<String> = r.lost.iter().map(u64::to_string).collect();
                out += &format!(
                    "\nlast_blocks {}\nlast_mended {}\nlast_lost {}\nlast_lost_offsets {}",
                    r.blocks,
                    r.mended,
                    r.lost_blocks,
                    lost.join(",")
                );
            }
            Some(Err(e)) => out += &format!("\nlast_error {e}"),
            None => {}
        }
        out
    }
}

fn crc32c(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b) as u32
}

fn fail(status: i32, message: String) -> Reply {
    Reply { status, body: message.into_bytes(), ..Reply::default() }
}

fn osd_fail(e: OsdError) -> Reply {
    fail(e.errno(), e.to_string())
}

fn to_wire(a: &ObjectAttr) -> Attr {
    Attr {
        size: a.size,
        space: a.space,
        mtime_ns: a.mtime_ns,
        atime_ns: a.atime_ns,
        ctime_ns: a.ctime_ns,
        uid: a.uid,
        gid: a.gid,
        projid: a.projid,
        parent: a.parent,
    }
}

fn from_wire(s: &ost::SetAttr) -> SetAttr {
    let on = |bit: u32| s.mask & bit != 0;
    SetAttr {
        mtime_ns: on(set::MTIME).then_some(s.attr.mtime_ns),
        atime_ns: on(set::ATIME).then_some(s.attr.atime_ns),
        ctime_ns: on(set::CTIME).then_some(s.attr.ctime_ns),
        uid: on(set::UID).then_some(s.attr.uid),
        gid: on(set::GID).then_some(s.attr.gid),
        projid: on(set::PROJID).then_some(s.attr.projid),
        parent: on(set::PARENT).then_some(s.attr.parent),
    }
}

fn attr_reply(r: Result<ObjectAttr, OsdError>) -> Reply {
    match r {
        Ok(a) => Reply { status: 0, body: ost::encode_attr(&to_wire(&a)), ..Reply::default() },
        Err(e) => osd_fail(e),
    }
}

impl Oss {
    /// Serve `targets`, named `ost0`, `ost1`, … in order.
    pub fn new(targets: Vec<Arc<Target>>, cfg: OssConfig) -> Result<Arc<Oss>, OsdError> {
        let named = targets.into_iter().enumerate().map(|(i, t)| (format!("ost{i}"), t)).collect();
        Oss::named(named, cfg)
    }

    /// Serve targets under the given names.
    pub fn named(targets: Vec<(String, Arc<Target>)>, cfg: OssConfig) -> Result<Arc<Oss>, OsdError> {
        let wb = WriteBack::new(targets.iter().map(|(_, t)| t.clone()).collect(), cfg.writeback)?;
        let scrubs = targets.iter().map(|_| Arc::default()).collect();
        Ok(Arc::new(Oss {
            scrubs,
            targets: targets.into_iter().map(|(n, t)| (n, t, TargetStats::default())).collect(),
            brw_size: std::sync::atomic::AtomicU32::new(cfg.brw_size),
            cfg,
            server: std::sync::Mutex::new(None),
            inline_reads: AtomicUsize::new(0),
            wb,
        }))
    }

    /// What this OSS adds to its server: `last_committed` and commits, and, when its
    /// targets name clients answered before commit when it last stopped, a recovery that
    /// waits for them to replay their writes (see `nacre_net::recovery`).
    pub fn service(self: &Arc<Self>) -> Service {
        Service {
            commits: Some(Arc::new(OssCommits(self.clone()))),
            recovering: Some(Recovering { clients: self.wb.known_clients(), last_committed: self.wb.last_committed() }),
            ..Service::default()
        }
    }

    /// Forget the clients from before this start instead of waiting for them (a file
    /// system started afresh, whose mounts cannot come back).
    pub fn forget_clients(&self) -> Result<(), OsdError> {
        self.wb.forget_known()
    }

    /// The write-back, for tests and benches.
    pub fn writeback(&self) -> &WriteBack {
        &self.wb
    }

    /// Tell the OSS which server runs it, for `ost.OSS.ost_io.*` parameters.
    pub fn attach(&self, server: nacre_net::server::ServerHandle) {
        *self.server.lock().unwrap_or_else(|e| e.into_inner()) = Some(server);
    }

    fn server(&self) -> Option<nacre_net::server::ServerHandle> {
        self.server.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn brw_size(&self) -> u32 {
        self.brw_size.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Set a parameter while running; an error names what is wrong and changes nothing.
    pub fn set_param(&self, name: &str, value: &str) -> Result<(), String> {
        let value = value.trim();
        match name {
            "ost.OSS.ost_io.nrs_policies" => {
                let policy: nacre_net::server::Policy = value.parse()?;
                let server = self.server().ok_or("this OSS runs on no server")?;
                if server.set_policy(policy) { Ok(()) } else { Err("the server has stopped".into()) }
            }
            "ost.OSS.ost_io.nrs_tbf_rule" => {
                let server = self.server().ok_or("this OSS runs on no server")?;
                server.tbf_rule(value).map_err(|e| e.to_string())
            }
            _ => {
                let Some((target, leaf)) = name.strip_prefix("obdfilter.").and_then(|r| r.split_once('.')) else {
                    return Err(format!("no settable parameter {name:?}"));
                };
                let Some(i) = self.targets.iter().position(|(n, _, _)| n == target) else {
                    return Err(format!("no target {target:?} on this server"));
                };
                let stats = &self.targets[i].2;
                match leaf {
                    "scrub" if value == "start" => self.start_scrub(i),
                    "scrub_rate_mb" => {
                        let v = number(leaf, value, "MB/s (0: unlimited)", 0..=1_000_000u64)?;
                        self.scrubs[i].lock().unwrap_or_else(|e| e.into_inner()).rate_mb = v;
                        Ok(())
                    }
                    "scrub" if value == "stop" => {
                        let mut s = self.scrubs[i].lock().unwrap_or_else(|e| e.into_inner());
                        if !s.running {
                            return Err(format!("no scrub of {target} is running"));
                        }
                        s.stop = true;
                        Ok(())
                    }
                    "brw_size" => {
                        let v: u32 =
                            value.parse().map_err(|_| format!("brw_size {value:?} is not a number of bytes"))?;
                        if !(4096..=nacre_net::frame::BULK_BYTES_LIMIT).contains(&v) || !v.is_power_of_two() {
                            return Err(format!(
                                "brw_size {v}: a power of two from 4096 to {}",
                                nacre_net::frame::BULK_BYTES_LIMIT
                            ));
                        }
                        // One value for the whole server: its targets share the transport.
                        self.brw_size.store(v, std::sync::atomic::Ordering::Relaxed);
                        Ok(())
                    }
                    // One write-back for the whole server: its targets share it.
                    "commit_interval_ms" => {
                        let v = number(leaf, value, "milliseconds", 1..=60_000u64)?;
                        self.wb.set_commit_interval(std::time::Duration::from_millis(v));
                        Ok(())
                    }
                    "writeback_max_mb" => {
                        self.wb.set_max_bytes(number(leaf, value, "MiB", 1..=65_536u64)? << 20);
                        Ok(())
                    }
                    "job_stats" | "client_stats" if value == "clear" => {
                        stats.clear();
                        Ok(())
                    }
                    _ => Err(format!("no settable parameter {name:?} (or value {value:?} not allowed)")),
                }
            }
        }
    }

    /// Scrub target `i` in the background (`set-param obdfilter.NAME.scrub=start`, until
    /// `scrub=stop`); its progress and findings are in `obdfilter.NAME.scrub`.
    fn start_scrub(&self, i: usize) -> Result<(), String> {
        let (name, t, _) = &self.targets[i];
        let state = self.scrubs[i].clone();
        {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            if s.running {
                return Err(format!("a scrub of {name} is running ({} of {} chunks read)", s.done, s.total));
            }
            *s = Scrub { running: true, last: s.last.take(), rate_mb: s.rate_mb, ..Scrub::default() };
        }
        let chunk_bytes = t.chunk_bytes();
        let started = Instant::now();
        let (name, t) = (name.clone(), t.clone());
        let spawned = std::thread::Builder::new().name(format!("scrub-{name}")).spawn(move || {
            let r = t.scrub(|done, total| {
                let (go_on, rate) = {
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    (s.done, s.total) = (done, total);
                    (!s.stop, s.rate_mb)
                };
                // Paced: no further ahead than the rate allows.
                if rate > 0 {
                    let due = std::time::Duration::from_secs_f64((done * chunk_bytes) as f64 / (rate as f64 * 1e6));
                    if let Some(early) = due.checked_sub(started.elapsed()) {
                        std::thread::sleep(early.min(std::time::Duration::from_secs(1)));
                    }
                }
                go_on
            });
            match &r {
                Ok(r) if r.lost_blocks > 0 => eprintln!(
                    "oss: scrub of {name}: {} blocks lost (their reads fail), {} mended from parity",
                    r.lost_blocks, r.mended
                ),
                Ok(_) => {}
                Err(e) => eprintln!("oss: scrub of {name} failed: {e}"),
            }
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            s.running = false;
            s.last = Some(r.map_err(|e| e.to_string()));
        });
        spawned.map(drop).map_err(|e| format!("cannot start a scrub thread: {e}"))
    }

    /// The statistics of target `i`.
    pub fn stats(&self, i: usize) -> Option<&TargetStats> {
        self.targets.get(i).map(|t| &t.2)
    }

    /// Parameters whose names match `pattern`, with their values (see `nacre get-param`).
    pub fn get_param(&self, pattern: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for ((name, t, stats), scrub) in self.targets.iter().zip(&self.scrubs) {
            let p = |leaf: &str| format!("obdfilter.{name}.{leaf}");
            let mut add = |leaf: &str, value: &dyn Fn() -> String| {
                let full = p(leaf);
                if nacre_net::glob::glob(pattern, &full) {
                    out.push((full, value()));
                }
            };
            add("brw_size", &|| self.brw_size().to_string());
            add("brw_stats", &|| stats.brw_stats());
            add("commit_interval_ms", &|| self.wb.commit_interval().as_millis().to_string());
            add("writeback_max_mb", &|| (self.wb.max_bytes() >> 20).to_string());
            add("writeback", &|| {
                let w = self.wb.stats();
                format!(
                    "held {}\nheld_bytes {}\nthrough {}\ncommits {}\ncommitted_bytes {}\ncommitted_extents {}\nkept_bytes {}\nwaits {}\nbytes {}\nlast_transno {}\nlast_committed {}",
                    w.held,
                    w.held_bytes,
                    w.through,
                    w.commits,
                    w.committed_bytes,
                    w.committed_extents,
                    w.kept_bytes,
                    w.waits,
                    w.bytes,
                    w.last_transno,
                    w.last_committed
                )
            });
            add("job_stats", &|| stats.job_stats());
            add("client_stats", &|| stats.client_stats());
            add("scrub", &|| scrub.lock().unwrap_or_else(|e| e.into_inner()).render());
            add("scrub_rate_mb", &|| scrub.lock().unwrap_or_else(|e| e.into_inner()).rate_mb.to_string());
            // The server's: its targets recover together.
            add("recovery_status", &|| RecoveryStats::render(self.server().and_then(|s| s.recovery())));
            // Asked of the target only if a matching parameter needs it, and once.
            let statfs = std::cell::OnceCell::new();
            let statfs = || statfs.get_or_init(|| t.statfs().ok()).as_ref();
            add("kbytestotal", &|| statfs().map_or("-".into(), |s| (s.total_bytes >> 10).to_string()));
            add("kbytesfree", &|| statfs().map_or("-".into(), |s| (s.free_bytes >> 10).to_string()));
            add("objects", &|| statfs().map_or("-".into(), |s| s.objects.to_string()));
            add("stats", &|| {
                let c = t.stats();
                format!(
                    "write_samples {}\nwrite_bytes {}\nread_samples {}\nread_bytes {}\nchunks_allocated {}\nin_place_writes {}\njournaled {}\ndestaged {}\njournal_used {}\njournal_bytes {}\nchecksum_errors {}\nchecksum_repairs {}\nchecksum_regions_recomputed {}",
                    c.writes,
                    c.write_bytes,
                    c.reads,
                    c.read_bytes,
                    c.chunks_allocated,
                    c.in_place_writes,
                    c.journaled,
                    c.destaged,
                    c.journal_used,
                    c.journal_bytes,
                    c.checksum_errors,
                    c.checksum_repairs,
                    c.checksum_regions_recomputed
                )
            });
        }
        if let Some(server) = self.server() {
            let mut add = |leaf: &str, value: String| {
                let full = format!("ost.OSS.ost_io.{leaf}");
                if nacre_net::glob::glob(pattern, &full) {
                    out.push((full, value));
                }
            };
            if let Some(p) = server.policy() {
                add("nrs_policies", format!("{p:?}").to_lowercase());
            }
            add(
                "nrs_tbf_rule",
                server
                    .tbf_rules()
                    .iter()
                    .map(|r| format!("{} {:?} rate={}", r.name, r.matcher, r.rate))
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
            if let Some(st) = server.stats() {
                add("stats", format!("{st:#?}"));
            }
        }
        out
    }

    /// The transport handler of this OSS.
    pub fn handler(self: &Arc<Self>) -> Handler {
        let oss = self.clone();
        Arc::new(move |req: Incoming| {
            let oss = oss.clone();
            Box::pin(async move {
                if let Some(_slot) = oss.inline_read(&req) {
                    return oss.handle(req);
                }
                match tokio::task::spawn_blocking(move || oss.handle(req)).await {
                    Ok(r) => r,
                    Err(e) => fail(errno::EIO, format!("the request failed inside the server: {e}")),
                }
            })
        })
    }

    /// A slot to serve `req` where it arrived, if it is a small read and a runtime
    /// thread is left for everything else. A 4 KiB read costs a drive read of about
    /// 90 µs here; handing it to a blocking thread and back cost two thread wakeups more,
    /// and ior-rnd4K ran 30% slower. At least one runtime thread never blocks on a drive,
    /// so pings and other connections are served whatever the drives do.
    fn inline_read(&self, req: &Incoming) -> Option<InlineRead<'_>> {
        if req.header.opcode != ost::OST_READ
            || !matches!(Request::decode(req.header.opcode, &req.body), Ok(Request::Read { len, .. }) if len <= INLINE_READ_MAX)
        {
            return None;
        }
        let most = tokio::runtime::Handle::try_current().map_or(0, |h| h.metrics().num_workers().saturating_sub(1));
        let running = &self.inline_reads;
        running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < most).then_some(n + 1))
            .ok()
            .map(|_| InlineRead(running))
    }

    /// A write's extents cut from its bulk, every check passed before anything is
    /// written: the bulk holds exactly their bytes, no more than `brw_size` in all, and
    /// each piece matches its checksum (one bad piece refuses the whole write).
    fn pieces<'a>(&self, oid: u64, niobufs: &[ost::Niobuf], bulk: &'a [u8]) -> Result<Vec<(u64, &'a [u8])>, Reply> {
        let len = ost::niobufs_bytes(niobufs);
        if bulk.len() as u64 != len {
            return Err(fail(
                errno::EPROTO,
                format!("write announces {len} bytes in {} extents, the bulk holds {}", niobufs.len(), bulk.len()),
            ));
        }
        if len > self.brw_size() as u64 {
            return Err(fail(errno::EINVAL, format!("write of {len} bytes exceeds brw_size {}", self.brw_size())));
        }
        let mut at = 0usize;
        let mut pieces = Vec::with_capacity(niobufs.len());
        for (i, n) in niobufs.iter().enumerate() {
            let data = &bulk[at..at + n.len as usize];
            at += n.len as usize;
            if let Some(want) = n.crc {
                let got = crc32c(data);
                if got != want {
                    return Err(fail(
                        errno::EBADMSG,
                        format!(
                            "checksum mismatch on write to object {oid:#x} at {} (extent {i} of {}): sent {want:#010x}, received {got:#010x}",
                            n.offset,
                            niobufs.len()
                        ),
                    ));
                }
            }
            pieces.push((n.offset, data));
        }
        Ok(pieces)
    }

    fn target(&self, i: u32) -> Result<&(String, Arc<Target>, TargetStats), Reply> {
        self.targets.get(i as usize).ok_or_else(|| {
            fail(errno::ENODEV, format!("no target {i} on this server ({} targets)", self.targets.len()))
        })
    }

    /// Serve one request (blocking).
    pub fn handle(&self, req: Incoming) -> Reply {
        if req.header.opcode == param::OP_SET_PARAM {
            return match param::decode_set(&req.body) {
                Ok((name, value)) => match self.set_param(&name, &value) {
                    Ok(()) => Reply::default(),
                    Err(why) => fail(errno::EINVAL, why),
                },
                Err(e) => fail(errno::EPROTO, format!("bad set-param request: {e}")),
            };
        }
        if req.header.opcode == param::OP_GET_PARAM {
            return match param::decode_get(&req.body) {
                Ok(pattern) => {
                    Reply { status: 0, body: param::render(&self.get_param(&pattern)).into_bytes(), ..Reply::default() }
                }
                Err(e) => fail(errno::EPROTO, format!("bad get-param request: {e}")),
            };
        }
        let r = match Request::decode(req.header.opcode, &req.body) {
            Ok(r) => r,
            Err(e) => return fail(errno::EPROTO, format!("bad OST request: {e}")),
        };
        let target = match &r {
            Request::Create { target, .. }
            | Request::Destroy { target, .. }
            | Request::DestroyMany { target, .. }
            | Request::Read { target, .. }
            | Request::Write { target, .. }
            | Request::Punch { target, .. }
            | Request::Truncate { target, .. }
            | Request::Getattr { target, .. }
            | Request::Setattr { target, .. }
            | Request::Sync { target }
            | Request::Statfs { target }
            | Request::LastId { target, .. } => *target,
        };
        let (_, _, stats) = match self.target(target) {
            Ok(t) => t,
            Err(reply) => return reply,
        };
        let started = Instant::now();
        let op = match &r {
            Request::Create { .. } => Op::Create,
            Request::Destroy { .. } | Request::DestroyMany { .. } => Op::Destroy,
            Request::Read { len, .. } => Op::Read(*len as u64),
            Request::Write { niobufs, .. } => Op::Write(ost::niobufs_bytes(niobufs)),
            Request::Punch { .. } | Request::Truncate { .. } => Op::Punch,
            Request::Getattr { .. } => Op::Getattr,
            Request::Setattr { .. } => Op::Setattr,
            Request::Sync { .. } => Op::Sync,
            Request::Statfs { .. } | Request::LastId { .. } => Op::Statfs,
        };
        let reply = self.serve(target as usize, r, &req);
        if reply.status == 0 {
            stats.record(req.header.job_id, req.client, op, started.elapsed());
        }
        reply
    }

    fn serve(&self, ti: usize, r: Request, req: &Incoming) -> Reply {
        let (wb, t) = (&self.wb, &self.targets[ti].1);
        match r {
            Request::Create { count, group, .. } => {
                if count == 0 || count > self.cfg.create_batch_max {
                    return fail(
                        errno::EINVAL,
                        format!("create of {count} objects (1 to {})", self.cfg.create_batch_max),
                    );
                }
                match t.create_in(group, count) {
                    Ok(ids) => Reply { status: 0, body: ost::encode_created(ids.start, count), ..Reply::default() },
                    Err(e) => osd_fail(e),
                }
            }
            Request::Destroy { oid, .. } => match wb.flushed(ti, oid, |t| t.destroy(oid)) {
                Ok(()) => Reply::default(),
                Err(e) => osd_fail(e),
            },
            Request::DestroyMany { oids, .. } => match wb.flushed_all(ti, &oids, |t| t.destroy_many(&oids)) {
                Ok(existed) => Reply { status: 0, body: ost::encode_destroyed(&existed), ..Reply::default() },
                Err(e) => osd_fail(e),
            },
            Request::Read { oid, offset, len, checksum, .. } => {
                if len > self.brw_size() {
                    return fail(errno::EINVAL, format!("read of {len} bytes exceeds brw_size {}", self.brw_size()));
                }
                let mut buf = vec![0u8; len as usize];
                match wb.read(ti, oid, offset, &mut buf) {
                    Ok(n) => {
                        buf.truncate(n);
                        let crc = checksum.then(|| crc32c(&buf));
                        Reply {
                            status: 0,
                            body: ost::encode_read(n as u32, crc),
                            bulk: Bytes::from(buf),
                            ..Reply::default()
                        }
                    }
                    Err(e) => {
                        if matches!(e, OsdError::Checksum(_)) {
                            eprintln!("oss: {}: {e}", self.targets[ti].0);
                        }
                        osd_fail(e)
                    }
                }
            }
            Request::Write { oid, niobufs, .. } => {
                let pieces = match self.pieces(oid, &niobufs, &req.bulk) {
                    Ok(p) => p,
                    Err(reply) => return reply,
                };
                let replay = req.replayed.is_some().then_some(req.header.transno);
                match wb.write(ti, req.client, oid, &pieces, replay) {
                    Ok(transno) => Reply { transno, ..attr_reply(wb.getattr(ti, oid)) },
                    Err(e) => osd_fail(e),
                }
            }
            Request::Punch { oid, start, end, .. } => attr_reply(wb.flushed(ti, oid, |t| t.punch(oid, start, end))),
            Request::Truncate { oid, size, .. } => attr_reply(wb.flushed(ti, oid, |t| t.truncate(oid, size))),
            // A glimpse (size and space, for `stat` and for the size a close publishes):
            // held writes are committed first, so that the space is what they take.
            Request::Getattr { oid, .. } => attr_reply(wb.flushed(ti, oid, |t| t.getattr(oid))),
            Request::Setattr { oid, set, .. } => {
                attr_reply(t.setattr(oid, &from_wire(&set)).and_then(|_| wb.getattr(ti, oid)))
            }
            // What was answered before commit is on the drives when a sync is answered.
            Request::Sync { .. } => match wb.commit().and_then(|_| t.flush()) {
                Ok(()) => Reply::default(),
                Err(e) => osd_fail(e),
            },
            Request::LastId { group, .. } => match t.next_oid_in(group) {
                Ok(n) => Reply { status: 0, body: n.to_le_bytes().to_vec(), ..Reply::default() },
                Err(e) => osd_fail(e),
            },
            Request::Statfs { .. } => match t.statfs() {
                Ok(s) => Reply {
                    status: 0,
                    body: ost::encode_statfs(&StatFs {
                        total_bytes: s.total_bytes,
                        free_bytes: s.free_bytes,
                        objects: s.objects,
                        chunk_bytes: s.chunk_bytes,
                    }),
                    ..Reply::default()
                },
                Err(e) => osd_fail(e),
            },
        }
    }
}

/// Reads of at most this many bytes may run on the transport's thread.
const INLINE_READ_MAX: u32 = 64 << 10;

/// A read running on a runtime thread; the count goes down when it ends.
struct InlineRead<'a>(&'a AtomicUsize);

impl Drop for InlineRead<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
