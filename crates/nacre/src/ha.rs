//! Failover pairs: targets on drives that two (or more) nodes of a cluster file can open.
//!
//! The node that serves such a target holds the lease on its drives
//! (`nacre_raid::lease`, Lustre's MMP) and writes through them only while it does: every
//! drive of the target is wrapped in the lease's fence. Each node runs a monitor per target
//! it may serve:
//!
//! - its own targets (`mdts`, `osts`) it takes at start, unless a partner serves them (it
//!   then stands by, and takes them back when the partner stops or dies);
//! - its partners' targets (`failover_mdts`, `failover_osts`) it takes only when their
//!   holder's heartbeat stops for the expiry: drives never leased, or released by a node
//!   stopped on purpose, are left alone.
//!
//! A target taken over registers its new NID with the MGS, which moves it first in the
//! target's list; clients follow the configuration change and replay there. A node that
//! loses a lease it holds (its drives or its clock stalled, or a partner took over while
//! it was stopped) says why and exits at once: its writes are refused from then on.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nacre_net::nid::Nid;
use nacre_net::transport::Shortcut;
use nacre_proto::mgs::TargetKind;
use nacre_raid::BlockDevice;
use nacre_raid::lease::{Held, LeaseError, LeaseOptions, holder};
use nacre_server::cluster::{Local, MgsAt};

use crate::service::Access;

/// The exit status of a node that lost a lease (it stepped down).
pub const EXIT_FENCED: i32 = 3;

/// A target a node may serve on shared drives.
#[derive(Clone, Debug)]
pub struct Duty {
    pub kind: TargetKind,
    pub index: u32,
    /// Its drive files (`DATA/ostN`, `DATA/mdtN`).
    pub dir: PathBuf,
    /// This node's own target (else a partner's it stands by for).
    pub primary: bool,
}

impl Duty {
    /// `OST0`, `MDT1`: as logs and ready lines name targets.
    pub fn label(&self) -> String {
        match self.kind {
            TargetKind::Mdt => format!("MDT{}", self.index),
            TargetKind::Ost => format!("OST{}", self.index),
        }
    }

    /// The volumes a target is made of: their folders and names.
    fn volumes(&self) -> Vec<(PathBuf, String)> {
        match self.kind {
            TargetKind::Mdt => vec![(self.dir.clone(), format!("mdt{}", self.index))],
            TargetKind::Ost => {
                let (data, index) = crate::ost::volume_dirs(&self.dir);
                vec![(data, format!("ost{}", self.index)), (index, format!("ost{}-index", self.index))]
            }
        }
    }

    /// Every drive of the target, opened shared for its lease; an error says what this
    /// node cannot see (a failover node without the drives is refused at start).
    pub fn lease_drives(&self) -> Result<Vec<Arc<dyn BlockDevice>>, String> {
        let mut all = Vec::new();
        for (dir, name) in self.volumes() {
            let drives = crate::service::drives_with(&dir, &Access::Watch)
                .map_err(|e| format!("{}: cannot see its drives: {e}", self.label()))?;
            if drives.is_empty() {
                return Err(format!("{}: no drive files in {}", self.label(), dir.display()));
            }
            for d in &drives {
                let sb = nacre_raid::volume::read_superblock(d.as_ref())
                    .map_err(|e| format!("{}: {}: {e}", self.label(), d.path().display()))?;
                if sb.name != name {
                    return Err(format!(
                        "{}: {} belongs to volume {:?}, not {name:?}",
                        self.label(),
                        d.path().display(),
                        sb.name
                    ));
                }
            }
            all.extend(drives);
        }
        Ok(all)
    }
}

/// What a node's monitors share: who it is and where the file system's MGS is.
#[derive(Clone)]
pub struct Node {
    pub name: String,
    pub host: String,
    pub mgs: Nid,
    pub fsname: String,
    pub lease: LeaseOptions,
    /// Leases held, dropped (released) by [`Node::release`] once every target closed.
    held: Arc<Mutex<Vec<Held>>>,
    /// Set by [`Node::stop`]: the monitors stop their targets cleanly and end.
    stopping: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Node {
    pub fn new(name: &str, host: &str, mgs: Nid, fsname: &str) -> Node {
        Node {
            name: name.into(),
            host: host.into(),
            mgs,
            fsname: fsname.into(),
            lease: LeaseOptions::new(name),
            held: Arc::default(),
            stopping: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }

    /// Stop every monitor: the targets served stop cleanly (their links to other targets
    /// say goodbye); wait for them, at most `limit`.
    pub async fn stop(&self, monitors: Vec<tokio::task::JoinHandle<()>>, limit: Duration) {
        self.stopping.send_replace(true);
        let _ = tokio::time::timeout(limit, async {
            for m in monitors {
                let _ = m.await;
            }
        })
        .await;
    }

    /// Release every lease held: call once the targets are closed (the runtime that
    /// served them dropped), so that their last writes happen under the lease.
    pub fn release(&self) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Take `duty` once (blocking: a free lease takes half the expiry and an interval, a
    /// held one the expiry more) and serve it; the served target lives as long as the
    /// returned `Local`.
    async fn take(&self, duty: &Duty, drives: Vec<Arc<dyn BlockDevice>>) -> Result<Local, TakeError> {
        let (opts, primary) = (self.lease.clone(), duty.primary);
        let started = std::time::Instant::now();
        let held = tokio::task::spawn_blocking(move || {
            if primary { Held::acquire(drives, &opts) } else { Held::acquire_expired(drives, &opts) }
        })
        .await
        .map_err(|e| TakeError::Other(e.to_string()))??;
        let label = duty.label();
        for note in held.notes() {
            eprintln!("{label}: {note}");
        }
        eprintln!(
            "{label}: lease taken (epoch {}; {}) in {:.1} s",
            held.fence().epoch(),
            held.taken(),
            started.elapsed().as_secs_f64()
        );
        let started = std::time::Instant::now();
        let node = self.name.clone();
        let on_lost = label.clone();
        held.on_lost(move |why| {
            eprintln!("{on_lost}: node {node} lost its lease: {why}; stepping down");
            std::process::exit(EXIT_FENCED);
        });
        let access = Access::Fenced(held.fence().clone());
        let (dir, name, kind) = (duty.dir.clone(), duty.label().to_lowercase(), duty.kind);
        let opened = tokio::task::spawn_blocking(move || -> Result<Opened, String> {
            Ok(match kind {
                TargetKind::Mdt => {
                    Opened::Mdt(Arc::new(crate::mdt::open_as(&dir, &name, &access).map_err(|e| e.to_string())?))
                }
                TargetKind::Ost => {
                    Opened::Ost(Arc::new(crate::ost::open_as(&dir, &name, &access).map_err(|e| e.to_string())?))
                }
            })
        })
        .await
        .map_err(|e| TakeError::Other(e.to_string()))?
        .map_err(|e| TakeError::Other(format!("{label}: {e}")))?;
        // Answers only while the lease holds: checking it (past its validity) fences the
        // node and ends the process.
        let fence = held.fence().clone();
        let gate: nacre_server::cluster::Gate = Arc::new(move || fence.check().is_ok());
        // Held from here on, whatever happens: released only once the target closed.
        self.held.lock().unwrap_or_else(|e| e.into_inner()).push(held);
        let (mdts, osts) = match opened {
            Opened::Mdt(ns) => (vec![ns], vec![]),
            Opened::Ost(t) => (vec![], vec![(duty.index, t)]),
        };
        let (host, mgs_nid) = (self.host.clone(), self.mgs.clone());
        let listen = move |_: &str| -> Nid { format!("{host}@tcp:0").parse().unwrap_or_else(|_| mgs_nid.clone()) };
        let mgs = MgsAt::Remote { nid: self.mgs.clone(), fsname: self.fsname.clone() };
        let local =
            Local::start(Arc::new(Shortcut), listen, mgs, mdts, osts, Duration::from_secs(300), true, Some(gate))
                .await
                .map_err(|e| TakeError::Other(format!("{label}: {e}")))?;
        eprintln!("{label}: opened, registered and serving in {:.1} s", started.elapsed().as_secs_f64());
        Ok(local)
    }

    /// Watch `duty` (its `drives`, from [`Duty::lease_drives`]) and serve it whenever this
    /// node may (see the module's doc), for as long as the task runs; `first` is told
    /// after the first attempt whether it serves. An MDT served waits for objects on
    /// `osts` OSTs before it counts as served.
    pub async fn monitor(
        self,
        duty: Duty,
        drives: Vec<Arc<dyn BlockDevice>>,
        osts: usize,
        first: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
    ) {
        let label = duty.label();
        let mut first = first;
        let mut said = String::new();
        let mut stopping = self.stopping.subscribe();
        loop {
            if *stopping.borrow() {
                return;
            }
            let outcome = self.take(&duty, drives.clone()).await;
            let standing = match outcome {
                Ok(local) => {
                    if !local.wait_ready(osts, Duration::from_secs(300)).await {
                        eprintln!("{label}: no objects from the {osts} OSTs within 300 s; serving anyway");
                    }
                    let nids: Vec<String> = local.nids().iter().map(Nid::to_string).collect();
                    eprintln!("{label}: served by node {} at {}", self.name, nids.join(", "));
                    if let Some(f) = first.take() {
                        let _ = f.send(Ok(()));
                    }
                    // Served until the node stops (or loses the lease and exits).
                    let _ = stopping.wait_for(|s| *s).await;
                    local.stop().await;
                    return;
                }
                Err(TakeError::Lease(LeaseError::Held { node, .. })) => format!("served by node {node}; standing by"),
                Err(TakeError::Lease(LeaseError::NotHeld(how))) => {
                    let who = holder(&drives).ok().flatten().map(|b| b.node).unwrap_or_default();
                    format!("{how}{}; standing by", if who.is_empty() { String::new() } else { format!(" ({who})") })
                }
                Err(TakeError::Lease(LeaseError::Raced { node })) => format!("node {node} took it first; standing by"),
                Err(e) => format!("{e}; trying again"),
            };
            if standing != said {
                eprintln!("{label}: {standing}");
                said = standing.clone();
            }
            if let Some(f) = first.take() {
                let _ = f.send(Err(standing));
            }
            tokio::select! {
                _ = tokio::time::sleep(self.lease.interval) => {}
                _ = stopping.wait_for(|s| *s) => return,
            }
        }
    }
}

enum Opened {
    Mdt(Arc<nacre_server::mdt::Namespace>),
    Ost(Arc<nacre_osd::Target>),
}

/// Why a take did not end in a served target: the lease's answer, or the target's.
enum TakeError {
    Lease(LeaseError),
    Other(String),
}

impl From<LeaseError> for TakeError {
    fn from(e: LeaseError) -> TakeError {
        TakeError::Lease(e)
    }
}

impl std::fmt::Display for TakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TakeError::Lease(e) => e.fmt(f),
            TakeError::Other(e) => f.write_str(e),
        }
    }
}

/// A target as the cluster file places it (for `nacre status`).
pub struct Spot {
    pub kind: TargetKind,
    pub index: u32,
    /// Its primary, then its failover nodes.
    pub nodes: Vec<String>,
    /// Its drive files, as its primary sees them.
    pub dir: PathBuf,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// The cluster file (default: DATA/cluster.toml, as `nacre up --ha` and
    /// `--per-service` write it).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A data folder of `nacre up`.
    #[arg(long, default_value = "nacre-data")]
    pub data: PathBuf,
    /// One JSON line instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `nacre status`: every target of a cluster file, the node whose lease holds its drives
/// (read from the drives), how old that node's last heartbeat is, and where the MGS says
/// it is served.
pub fn status(a: StatusArgs) -> crate::service::CliResult {
    let path = a.config.unwrap_or_else(|| a.data.join("cluster.toml"));
    let (fsname, mgs, spots) = crate::up::cluster_targets(&path)?;
    // Where the MGS says each target is, if it answers.
    let body = nacre_proto::param::encode_get("mgs.*.targets");
    let served = crate::call_param(&mgs, nacre_proto::param::OP_GET_PARAM, &body).unwrap_or_default();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let mut rows = Vec::new();
    for s in &spots {
        let duty = Duty { kind: s.kind, index: s.index, dir: s.dir.clone(), primary: true };
        let (holder_node, lease, epoch, age_s) = match duty.lease_drives() {
            Err(e) if e.contains("in use") => (String::new(), "exclusive (no failover)".to_string(), 0, None),
            Err(e) => (String::new(), format!("unreadable: {e}"), 0, None),
            Ok(drives) => match holder(&drives) {
                Ok(None) => (String::new(), "never leased".into(), 0, None),
                Ok(Some(b)) => {
                    let age = (now_ms - b.stamp_ms as i64).max(0) as f64 / 1000.0;
                    let state = if b.released {
                        "released"
                    } else if age * 1000.0 > b.expiry.as_millis() as f64 {
                        "expired"
                    } else {
                        "held"
                    };
                    (b.node, state.to_string(), b.epoch, Some(age))
                }
                Err(why) => (String::new(), format!("held by an unknown node ({why})"), 0, None),
            },
        };
        let name = s.kind.name(&fsname, s.index);
        let nids = served.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap_or("").trim().to_string();
        rows.push((duty.label(), s.nodes.join(", "), holder_node, lease, epoch, age_s, nids));
    }
    if a.json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(t, nodes, holder, lease, epoch, age, nids)| {
                serde_json::json!({"target": t, "nodes": nodes, "holder": holder, "lease": lease, "epoch": epoch, "heartbeat_age_s": age, "nids": nids})
            })
            .collect();
        println!("{}", serde_json::json!({ "fsname": fsname, "mgs": mgs.to_string(), "targets": list }));
        return Ok(());
    }
    println!("file system {fsname}, MGS {mgs}{}", if served.is_empty() { " (not answering)" } else { "" });
    println!(
        "{:<7} {:<12} {:<8} {:<24} {:>5} {:>10}  NIDS (active first)",
        "TARGET", "NODES", "HOLDER", "LEASE", "EPOCH", "HEARTBEAT"
    );
    for (t, nodes, holder, lease, epoch, age, nids) in rows {
        let age = age.map(|a| format!("{a:.1} s ago")).unwrap_or_else(|| "-".into());
        println!("{t:<7} {nodes:<12} {holder:<8} {lease:<24} {epoch:>5} {age:>10}  {nids}");
    }
    Ok(())
}
