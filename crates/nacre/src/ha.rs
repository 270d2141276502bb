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
//! target's list; clients follow the configuration change and replay there.
//!
//! A holder whose process lives on but whose network or service died (Helma's
//! `healthLNET` and `healthLUSTRE` failing) renews its lease forever: the drives alone
//! never move its targets. So each node also watches, over the network as clients do,
//! every target another node holds: when one does not answer [`PROBE_MISSES`] pings in a
//! row while the MGS answers this node, it asks the holder through the drives to hand
//! the target here ([`MoveWhy::Unreachable`]). The holder judges: it moves only if its
//! own checks fail too (the target does not answer at its own NID, or the MGS does not
//! answer it), and stays, saying so, when only the asker's view of it is broken.
//!
//! An operator moves a target with `nacre failover TARGET [--to NODE]` (and `nacre
//! failback`, each target to its primary): the request goes on the target's drives (see
//! `nacre_raid::lease`), the holder commits, stops serving and releases the lease to the
//! named node, which takes it at once. A node that
//! loses a lease it holds (its drives or its clock stalled, or a partner took over while
//! it was stopped) writes nothing more to that target (the fence refuses it), says why,
//! stops serving it and stands by for it, as a partner does; its other targets go on.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nacre_net::client::{Client, ClientConfig, Import};
use nacre_net::fault::FaultInjector;
use nacre_net::nid::{Nid, NidList};
use nacre_net::rpc::{RpcError, status};
use nacre_net::transport::{Shortcut, TcpTransport};
use nacre_proto::mgs::{MGS_NAME, TargetEntry, TargetKind};
use nacre_raid::BlockDevice;
use nacre_raid::lease::{Held, LeaseError, LeaseOptions, MoveRequest, MoveWhy, holder};
use nacre_server::cluster::{Listen, Local, MgsAt, Registration, ServeWith};

use crate::service::Access;

/// A node parameter, set through a target's services (`set-param --server NID
/// ha.lease_stall=SECONDS`): hold back that target's lease heartbeats for so long, as a
/// stuck path to its drives would (a test's hook, as Lustre's `fail_loc`).
pub const LEASE_STALL: &str = "ha.lease_stall";

/// Unanswered probes in a row (one per lease interval) before a node asks the holder of
/// a target to hand it over.
pub const PROBE_MISSES: u32 = 3;

/// What a duty serves: the MGS, or a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Mgs,
    Mdt,
    Ost,
}

impl Role {
    pub fn of(kind: TargetKind) -> Role {
        match kind {
            TargetKind::Mdt => Role::Mdt,
            TargetKind::Ost => Role::Ost,
        }
    }

    /// The kind of target it is (none for the MGS).
    pub fn target(self) -> Option<TargetKind> {
        match self {
            Role::Mgs => None,
            Role::Mdt => Some(TargetKind::Mdt),
            Role::Ost => Some(TargetKind::Ost),
        }
    }
}

/// The MGS or a target that a node may serve on shared drives.
#[derive(Clone, Debug)]
pub struct Duty {
    pub role: Role,
    /// The target's index (0 for the MGS).
    pub index: u32,
    /// Its drive files (`DATA/ostN`, `DATA/mdtN`, `DATA/mgs`).
    pub dir: PathBuf,
    /// This node's own target (else a partner's it stands by for).
    pub primary: bool,
    /// Where this node serves it, and where its other nodes do (when their ports are
    /// fixed: see `up::ClusterFile`).
    pub listen: Listen,
}

impl Duty {
    /// `MGS`, `OST0`, `MDT1`: as logs and ready lines name them.
    pub fn label(&self) -> String {
        match self.role {
            Role::Mgs => "MGS".into(),
            Role::Mdt => format!("MDT{}", self.index),
            Role::Ost => format!("OST{}", self.index),
        }
    }

    /// Its name at the MGS (`nacre-MDT0000`; the MGS is `MGS`).
    pub fn name(&self, fsname: &str) -> String {
        match self.role.target() {
            Some(kind) => kind.name(fsname, self.index),
            None => nacre_proto::mgs::MGS_NAME.into(),
        }
    }

    /// The volumes a target is made of: their folders and names.
    fn volumes(&self) -> Vec<(PathBuf, String)> {
        match self.role {
            Role::Mgs => vec![(self.dir.clone(), "mgs".into())],
            Role::Mdt => vec![(self.dir.clone(), format!("mdt{}", self.index))],
            Role::Ost => {
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
    pub mgs: NidList,
    pub fsname: String,
    /// The file system's targets as the cluster file places them, for the MDTs taken
    /// here while the MGS does not answer.
    known: Vec<nacre_proto::mgs::TargetEntry>,
    pub lease: LeaseOptions,
    /// Leases held, by target label, dropped (released) by [`Node::release`] once every
    /// target closed, or handed over when an operator moves one.
    held: Arc<Mutex<Vec<(String, Held)>>>,
    /// Set by [`Node::stop`]: the monitors stop their targets cleanly and end.
    stopping: Arc<tokio::sync::watch::Sender<bool>>,
    /// The fault rules of the node's network, shared by every target it serves.
    net: Arc<FaultInjector>,
}

impl Node {
    pub fn new(name: &str, mgs: NidList, fsname: &str, known: Vec<TargetEntry>, net: Arc<FaultInjector>) -> Node {
        Node {
            name: name.into(),
            mgs,
            fsname: fsname.into(),
            known,
            lease: LeaseOptions::new(name),
            held: Arc::default(),
            stopping: Arc::new(tokio::sync::watch::channel(false).0),
            net,
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

    /// Whether this node holds the lease of `label` (serves it) now.
    fn holds(&self, label: &str) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|(l, _)| l == label)
    }

    /// The move asked of target `label`, if any.
    fn move_asked(&self, label: &str) -> Option<MoveRequest> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter().find(|(l, _)| l == label).and_then(|(_, h)| h.move_asked())
    }

    /// Release target `label`'s lease to node `to` (its target closed), on a blocking
    /// thread: the release waits for the heartbeat thread's last renewal.
    async fn hand_over(&self, label: &str, to: &str) {
        if let Some(h) = self.take_held(label) {
            let to = to.to_string();
            let _ = tokio::task::spawn_blocking(move || h.hand_to(&to)).await;
        }
    }

    /// Hold back the heartbeats of target `label`'s lease for `d` (see [`LEASE_STALL`]).
    fn stall(&self, label: &str, d: Duration) -> Result<(), String> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (_, h) = held
            .iter()
            .find(|(l, _)| l == label)
            .ok_or_else(|| format!("node {} holds no lease of {label}", self.name))?;
        h.stall(d);
        eprintln!("{label}: lease heartbeats held back for {:.1} s ({LEASE_STALL})", d.as_secs_f64());
        Ok(())
    }

    /// Take target `label`'s lease out of those held, if held.
    fn take_held(&self, label: &str) -> Option<Held> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter().position(|(l, _)| l == label).map(|i| held.remove(i).1)
    }

    /// Forget target `label`'s lease, lost: nothing is written (its heartbeat ended
    /// with the loss).
    async fn forget_lost(&self, label: &str) {
        if let Some(h) = self.take_held(label) {
            let _ = tokio::task::spawn_blocking(move || drop(h)).await;
        }
    }

    /// Take `duty` once (blocking: a free lease takes half the expiry and an interval, a
    /// held one the expiry more) and serve it; the served target lives as long as the
    /// returned `Local` (and the target opened, to close after it). The receiver learns
    /// why, should the lease be lost.
    async fn take(&self, duty: &Duty, drives: Vec<Arc<dyn BlockDevice>>) -> Result<Taken, TakeError> {
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
        let (lost_tx, lost) = tokio::sync::watch::channel(None::<String>);
        held.on_lost(move |why| {
            eprintln!("{on_lost}: node {node} lost its lease: {why}; stepping down");
            let _ = lost_tx.send(Some(why.to_string()));
        });
        let access = Access::Fenced(held.fence().clone());
        let (dir, name, role) = (duty.dir.clone(), duty.label().to_lowercase(), duty.role);
        let opened = tokio::task::spawn_blocking(move || -> Result<Opened, String> {
            Ok(match role {
                Role::Mgs => Opened::Mgs(Arc::new(crate::mgs::open_as(&dir, &access).map_err(|e| e.to_string())?)),
                Role::Mdt => {
                    Opened::Mdt(Arc::new(crate::mdt::open_as(&dir, &name, &access).map_err(|e| e.to_string())?))
                }
                Role::Ost => {
                    Opened::Ost(Arc::new(crate::ost::open_as(&dir, &name, &access).map_err(|e| e.to_string())?))
                }
            })
        })
        .await
        .map_err(|e| TakeError::Other(e.to_string()))?
        .map_err(|e| TakeError::Other(format!("{label}: {e}")))?;
        // Answers only while the lease holds: checking it (past its validity) fences the
        // target.
        let fence = held.fence().clone();
        let gate: nacre_server::cluster::Gate = Arc::new(move || fence.check().is_ok());
        // Held from here on, whatever happens: released only once the target closed.
        self.held.lock().unwrap_or_else(|e| e.into_inner()).push((label.clone(), held));
        let remote = MgsAt::Remote { nids: self.mgs.clone(), fsname: self.fsname.clone(), known: self.known.clone() };
        let (mgs, mdts, osts) = match &opened {
            Opened::Mgs(m) => (MgsAt::Here(m.clone()), vec![], vec![]),
            Opened::Mdt(ns) => (remote, vec![ns.clone()], vec![]),
            Opened::Ost(t) => (remote, vec![], vec![(duty.index, t.clone())]),
        };
        let at = duty.listen.clone();
        let listen = move |_: &str| at.clone();
        // Served at once, registered when the MGS answers: clients that know the target's
        // NIDs find it here even while the MGS is down.
        let (node, stalled) = (self.clone(), label.clone());
        let node_param: nacre_server::cluster::NodeParam = Arc::new(move |name, value| {
            (name == LEASE_STALL).then(|| {
                let secs: f64 = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && (0.0..=3600.0).contains(s))
                    .ok_or_else(|| format!("{LEASE_STALL}: {value:?} is not a number of seconds from 0 to 3600"))?;
                node.stall(&stalled, Duration::from_secs_f64(secs))
            })
        });
        let with = ServeWith { gate: Some(gate), faults: Some(self.net.clone()), node_param: Some(node_param) };
        let local = Local::start(Arc::new(Shortcut), listen, mgs, mdts, osts, Registration::Background, true, with)
            .await
            .map_err(|e| TakeError::Other(format!("{label}: {e}")))?;
        eprintln!("{label}: opened, registered and serving in {:.1} s", started.elapsed().as_secs_f64());
        Ok(Taken { local, opened, lost })
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
        // Ends with the node's stop, as this monitor does.
        tokio::spawn(self.clone().watch(duty.clone(), drives.clone()));
        loop {
            if *stopping.borrow() {
                return;
            }
            let outcome = self.take(&duty, drives.clone()).await;
            let mut watched = false;
            let standing = match outcome {
                Ok(Taken { local, opened, mut lost }) => {
                    if !local.wait_ready(osts, Duration::from_secs(300)).await {
                        eprintln!("{label}: no objects from the {osts} OSTs within 300 s; serving anyway");
                    }
                    let nids: Vec<String> = local.nids().iter().map(Nid::to_string).collect();
                    eprintln!("{label}: served by node {} at {}", self.name, nids.join(", "));
                    if let Some(f) = first.take() {
                        let _ = f.send(Ok(()));
                    }
                    // Served until the node stops, the lease is lost, an operator moves
                    // the target, or a node that cannot reach it asks for it and this
                    // node's own checks fail too.
                    let mut judged = None;
                    let lost_why = async {
                        let told = lost.wait_for(Option::is_some).await.map(|why| why.clone().unwrap_or_default());
                        match told {
                            Ok(why) => why,
                            // Never told: the lease is held as long as this serves.
                            Err(_) => std::future::pending().await,
                        }
                    };
                    tokio::pin!(lost_why);
                    let to = loop {
                        let end = tokio::select! {
                            _ = stopping.wait_for(|s| *s) => Some(End::Stop),
                            why = &mut lost_why => Some(End::Lost(why)),
                            _ = tokio::time::sleep(self.lease.interval / 4) => None,
                        };
                        if let Some(end) = end {
                            break end;
                        }
                        let Some(asked) = self.move_asked(&label) else { continue };
                        if asked.why == MoveWhy::Operator {
                            eprintln!("{label}: moving to node {}, as an operator asked", asked.to);
                            break End::Move(asked.to);
                        }
                        if judged == Some(asked.stamp_ms) {
                            continue;
                        }
                        judged = Some(asked.stamp_ms);
                        // Fresh links: one kept idle since the last judgment may have been
                        // evicted, which would read as a failure here.
                        let mut probe = Probe::new(self.lease.interval, &self.net);
                        let failure = self.own_failure(&mut probe, &duty, &local).await;
                        probe.close().await;
                        match failure {
                            Some(why) => {
                                eprintln!("{label}: node {} cannot reach it, and {why}: moving it there", asked.to);
                                break End::Move(asked.to);
                            }
                            None => eprintln!(
                                "{label}: node {} cannot reach it, but it answers here and the MGS answers this \
                                 node: staying",
                                asked.to
                            ),
                        }
                    };
                    let to = match to {
                        End::Stop => {
                            local.stop().await;
                            return;
                        }
                        End::Lost(why) => {
                            // Nothing reaches its drives any more (the fence refuses it):
                            // stop serving it, close it in the background (what it would
                            // still write is refused too), and stand by for it.
                            local.stop().await;
                            tokio::spawn(opened.close(Duration::from_secs(1)));
                            self.forget_lost(&label).await;
                            eprintln!("{label}: stepped down ({why}); this node's other targets go on");
                            said.clear();
                            continue;
                        }
                        End::Move(to) => to,
                    };
                    // Committed first, so that its clients have nothing to replay there.
                    local.commit_all().await;
                    // Stopped and dropped: its services no longer listen. Closed under the
                    // lease (its last checkpoint written), then handed over.
                    local.stop().await;
                    opened.close(Duration::from_secs(1)).await;
                    self.hand_over(&label, &to).await;
                    eprintln!("{label}: handed to node {to}");
                    said.clear();
                    continue;
                }
                Err(TakeError::Lease(LeaseError::Held { node, .. })) => {
                    watched = true;
                    format!("served by node {node}; standing by")
                }
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
            // Handed here while this node watched its holder: taken at once.
            if watched && lease_holder(&drives).await.is_some_and(|b| b.released && b.to == self.name) {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.lease.interval) => {}
                _ = stopping.wait_for(|s| *s) => return,
            }
        }
    }
}

impl Node {
    /// What fails here for target `duty`, served by `local`, if anything: it does not
    /// answer at its own NID, or the MGS does not answer this node.
    async fn own_failure(&self, probe: &mut Probe, duty: &Duty, local: &Local) -> Option<String> {
        let own: Vec<Nid> = local.nids().into_iter().take(1).collect();
        if !probe.answers(&duty.name(&self.fsname), &own).await {
            let at = own.first().map(Nid::to_string).unwrap_or_default();
            return Some(format!("it does not answer at {at} either"));
        }
        if duty.role != Role::Mgs && probe.targets(&self.mgs).await.is_none() {
            return Some(format!("the MGS at {} does not answer this node", self.mgs));
        }
        None
    }

    /// Watch target `duty` over the network whenever another node holds it (its lease on
    /// `drives`): one ping per lease interval while it answers; when it does not answer
    /// [`PROBE_MISSES`] probes in a row while the MGS answers this node, ask its holder to
    /// hand it here (again each expiry while that lasts); the holder judges (see the
    /// module's doc). Ends when the node stops.
    async fn watch(self, duty: Duty, drives: Vec<Arc<dyn BlockDevice>>) {
        let (label, name) = (duty.label(), duty.name(&self.fsname));
        let mut probe = Probe::new(self.lease.interval, &self.net);
        let mut stopping = self.stopping.subscribe();
        let (mut misses, mut asked_at) = (0u32, None::<Instant>);
        // Where it may be served, as the cluster file says until the MGS is asked.
        let mut nids = self.nids_of(&duty, None);
        // One probe per interval, however long the last took.
        let mut tick = tokio::time::interval(self.lease.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopping.wait_for(|s| *s) => break,
            }
            let Some(held) = lease_holder(&drives).await.filter(|b| !b.released && b.node != self.name) else {
                misses = 0;
                continue;
            };
            if probe.answers(&name, &nids).await {
                if misses >= PROBE_MISSES {
                    eprintln!("{label}: node {} answers again", held.node);
                }
                (misses, asked_at) = (0, None);
                continue;
            }
            // Silent: the MGS is asked where the target is now (tried from the next
            // probe on), and whether it answers this node.
            misses += 1;
            let targets = probe.targets(&self.mgs).await;
            let tried = std::mem::replace(&mut nids, self.nids_of(&duty, targets.as_deref()));
            // The MGS answering this node tells that its own network works, unless this
            // node serves the MGS (it answers over loopback whatever the network does);
            // the MGS's own standby has no such witness (its holder judges alone).
            let witness = duty.role == Role::Mgs || (targets.is_some() && !self.holds("MGS"));
            if misses < PROBE_MISSES || !witness || asked_at.is_some_and(|t| t.elapsed() < self.lease.expiry) {
                continue;
            }
            let list: Vec<String> = tried.iter().map(Nid::to_string).collect();
            eprintln!(
                "{label}: node {} holds it but it does not answer at {} ({misses} probes){}: asking for it here",
                held.node,
                list.join(", "),
                if duty.role == Role::Mgs { "" } else { ", while the MGS answers this node" }
            );
            let (d, me) = (drives.clone(), self.name.clone());
            // An operator's request still pending is left in place: it moves the target.
            let asked = tokio::task::spawn_blocking(move || match nacre_raid::lease::move_asked(&d, held.epoch) {
                Some(r) if r.why == MoveWhy::Operator => Ok(()),
                _ => nacre_raid::lease::ask_move(&d, held.epoch, &me, MoveWhy::Unreachable),
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            if let Err(e) = asked {
                eprintln!("{label}: asking for it: {e}");
            }
            asked_at = Some(Instant::now());
        }
        probe.close().await;
    }

    /// Where target `duty` may be served by another node: the NIDs the MGS lists for it
    /// (`targets`, when it answered), else those the cluster file gives; never this
    /// node's own.
    fn nids_of(&self, duty: &Duty, targets: Option<&[TargetEntry]>) -> Vec<Nid> {
        let own = &duty.listen.nid;
        if duty.role == Role::Mgs {
            return self.mgs.all().iter().filter(|n| *n != own).cloned().collect();
        }
        let kind = duty.role.target();
        let entry = |list: &[TargetEntry]| -> Vec<Nid> {
            list.iter()
                .filter(|t| Some(t.kind) == kind && t.index == duty.index)
                .flat_map(|t| t.nids.iter().filter_map(|n| n.parse().ok()))
                .collect()
        };
        let mut nids = targets.map(entry).unwrap_or_default();
        nids.extend(entry(&self.known));
        nids.extend(duty.listen.failover.iter().cloned());
        let mut seen = Vec::new();
        nids.retain(|n| {
            n != own && !seen.contains(n) && {
                seen.push(n.clone());
                true
            }
        });
        nids
    }
}

/// A node's look at the network, over TCP as clients see it, and through the node's
/// own fault rules: does a target answer a ping, does the MGS.
struct Probe {
    client: Client,
    /// How long an answer may take.
    wait: Duration,
    /// Links kept from one probe to the next, by service name (one export each at the
    /// server, not one per probe).
    imports: HashMap<String, Arc<Import>>,
}

impl Probe {
    /// Probes on the node's network (`net`: its fault rules), each answered within `wait`.
    fn new(wait: Duration, net: &Arc<FaultInjector>) -> Probe {
        let cfg = ClientConfig { ping: false, ..ClientConfig::default() };
        let client = Client::with_faults(Arc::new(TcpTransport), cfg, Some(net.clone()));
        Probe { client, wait, imports: HashMap::new() }
    }

    /// The link to service `name`: the one kept, else a new one to the first of `nids`
    /// that takes a connect within the wait (each NID its own). `Err(true)`: no link, but
    /// a server refused the connect, so it answers (in recovery, or full); `Err(false)`:
    /// nothing answered.
    async fn link(&mut self, name: &str, nids: &[Nid]) -> Result<Arc<Import>, bool> {
        if let Some(i) = self.imports.get(name) {
            return Ok(i.clone());
        }
        let mut refused = false;
        for nid in nids {
            match tokio::time::timeout(self.wait, self.client.connect_once(name, nid)).await {
                Ok(Ok(i)) => {
                    self.imports.insert(name.to_string(), i.clone());
                    return Ok(i);
                }
                Ok(Err(RpcError::Refused { status: s, .. })) if s == status::EBUSY || s == status::EUSERS => {
                    refused = true
                }
                _ => {}
            }
        }
        Err(refused)
    }

    /// Whether service `name` answers at one of `nids` within the wait: a ping on the kept
    /// link, and if that fails on a new one (a link kept from before may have been
    /// evicted, or its server restarted and be recovering).
    async fn answers(&mut self, name: &str, nids: &[Nid]) -> bool {
        for _ in 0..2 {
            let kept = self.imports.contains_key(name);
            let i = match self.link(name, nids).await {
                Ok(i) => i,
                Err(answered) => return answered,
            };
            if matches!(tokio::time::timeout(self.wait, i.ping()).await, Ok(Ok(()))) {
                return true;
            }
            self.imports.remove(name);
            if !kept {
                break;
            }
        }
        false
    }

    /// The file system's targets as the MGS at `mgs` lists them; `None` when it does not
    /// answer within the wait (on the kept link, then on a new one).
    async fn targets(&mut self, mgs: &NidList) -> Option<Vec<TargetEntry>> {
        for _ in 0..2 {
            let kept = self.imports.contains_key(MGS_NAME);
            let i = self.link(MGS_NAME, mgs.all()).await.ok()?;
            let (op, body) = nacre_proto::mgs::Request::Config { have: 0, wait_ms: 0 }.encode();
            if let Ok(Ok(f)) = tokio::time::timeout(self.wait, i.call(op, &body, &[])).await
                && f.header.status == 0
                && let Ok(c) = nacre_proto::mgs::Config::decode(&f.body)
            {
                return Some(c.targets);
            }
            self.imports.remove(MGS_NAME);
            if !kept {
                break;
            }
        }
        None
    }

    /// Say goodbye to every server probed, so none keeps an export for this node.
    async fn close(self) {
        for i in self.imports.values() {
            let _ = tokio::time::timeout(self.wait, i.disconnect()).await;
        }
    }
}

/// The lease block of `drives` as a majority carries it, read on a blocking thread; `None`
/// when never leased or unreadable.
async fn lease_holder(drives: &[Arc<dyn BlockDevice>]) -> Option<nacre_raid::lease::LeaseBlock> {
    let d = drives.to_vec();
    tokio::task::spawn_blocking(move || holder(&d)).await.ok().and_then(Result::ok).flatten()
}

enum Opened {
    Mgs(Arc<nacre_server::mgs::Mgs>),
    Mdt(Arc<nacre_server::mdt::Namespace>),
    Ost(Arc<nacre_osd::Target>),
}

impl Opened {
    /// Close the target: once nothing else uses it (the services that served it let go),
    /// waiting at most `limit`, its last writes (an MDT's final checkpoint) happen as it
    /// drops, on a blocking thread. An MDT something still holds (a request in flight) is
    /// closed explicitly instead: committed, checkpointed, and refusing changes from then
    /// on.
    async fn close(self, limit: Duration) {
        let started = std::time::Instant::now();
        loop {
            let last = match &self {
                Opened::Mgs(m) => Arc::strong_count(m) == 1,
                Opened::Mdt(ns) => Arc::strong_count(ns) == 1,
                Opened::Ost(t) => Arc::strong_count(t) == 1,
            };
            if last || started.elapsed() >= limit {
                let _ = tokio::task::spawn_blocking(move || {
                    if let Opened::Mdt(ns) = &self
                        && !last
                    {
                        ns.close();
                    }
                    drop(self)
                })
                .await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A target taken and served: its services, the target, and the lease's loss, if it comes.
struct Taken {
    local: Local,
    opened: Opened,
    lost: tokio::sync::watch::Receiver<Option<String>>,
}

/// How serving a target ends.
enum End {
    /// The node stops.
    Stop,
    /// Handed to this node.
    Move(String),
    /// The lease was lost, for this reason.
    Lost(String),
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
    /// Its primary, then its failover nodes.
    pub nodes: Vec<String>,
    /// The target as its primary serves it (its label, its lease's drives).
    pub duty: Duty,
}

/// Where a cluster file is: `--config`, or `DATA/cluster.toml`.
#[derive(clap::Args)]
pub struct ClusterAt {
    /// The cluster file (default: DATA/cluster.toml, as `nacre up --ha` and
    /// `--per-service` write it).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A data folder of `nacre up`.
    #[arg(long, default_value = "nacre-data")]
    pub data: PathBuf,
}

impl ClusterAt {
    fn path(&self) -> PathBuf {
        self.config.clone().unwrap_or_else(|| self.data.join("cluster.toml"))
    }
}

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub at: ClusterAt,
    /// One JSON line instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct FailoverArgs {
    /// The target to move: `MDT0`, `OST1` (or `nacre-OST0001`).
    pub target: String,
    /// The node to move it to (default: its first node that does not serve it now).
    #[arg(long)]
    pub to: Option<String>,
    #[command(flatten)]
    pub at: ClusterAt,
    /// How long to wait for the new node to take the drives, in seconds.
    #[arg(long, default_value_t = 60)]
    pub wait: u64,
}

#[derive(clap::Args)]
pub struct FailbackArgs {
    /// The target to move back (default: every target not on its primary node).
    pub target: Option<String>,
    #[command(flatten)]
    pub at: ClusterAt,
    /// How long to wait for the primaries to take the drives, in seconds.
    #[arg(long, default_value_t = 60)]
    pub wait: u64,
}

/// The target of `spots` that `name` names (`MDT0`, `ost1`, `nacre-OST0001`).
fn find_spot<'a>(spots: &'a [Spot], fsname: &str, name: &str) -> Result<&'a Spot, String> {
    let want = name.to_ascii_uppercase();
    spots.iter().find(|s| s.duty.label() == want || s.duty.name(fsname).eq_ignore_ascii_case(name)).ok_or_else(|| {
        let known: Vec<String> = spots.iter().map(|s| s.duty.label()).collect();
        format!("no target {name:?} in the cluster file (it has {})", known.join(", "))
    })
}

/// A move asked of a target's holder, to wait for.
struct Asked {
    label: String,
    /// Its name at the MGS (`nacre-MDT0000`).
    name: String,
    from: String,
    to: String,
    epoch: u64,
    drives: Vec<Arc<dyn BlockDevice>>,
    /// The NID the MGS listed first for it before the move (`None`: the MGS did not
    /// answer).
    nid_before: Option<String>,
}

/// The NIDs the MGS lists for every target (`NAME nid,nid` lines, active first); `None`
/// if it does not answer.
fn served_nids(mgs: &NidList) -> Option<String> {
    let body = nacre_proto::param::encode_get("mgs.*.targets");
    crate::call_param_any(mgs, nacre_proto::param::OP_GET_PARAM, &body).ok()
}

/// The first NID `served` (from [`served_nids`]) lists for target `name`.
fn first_nid(served: &str, name: &str) -> Option<String> {
    let nids = served.lines().find_map(|l| l.strip_prefix(&format!("{name} ")))?;
    nids.split(',').next().map(|n| n.trim().to_string())
}

/// Ask the holder of `spot` to hand it to `to` (default: its first other node). Errors
/// name what is wrong, and nothing is written then.
fn ask(spot: &Spot, to: Option<&str>, fsname: &str, mgs: &NidList) -> Result<Asked, String> {
    let duty = &spot.duty;
    let label = duty.label();
    if spot.nodes.len() < 2 {
        return Err(format!("{label} has no failover node (only {})", spot.nodes.join(", ")));
    }
    let drives = duty.lease_drives()?;
    let b = match holder(&drives) {
        Ok(Some(b)) => b,
        Ok(None) => return Err(format!("{label} has never been served on shared drives: nothing to move")),
        Err(why) => return Err(format!("{label}: its lease does not decode ({why})")),
    };
    if b.released {
        return Err(format!("{label} is not served (its lease was released by node {}): nothing to move", b.node));
    }
    let to = match to {
        Some(to) if !spot.nodes.iter().any(|n| n == to) => {
            return Err(format!("{label} can be served by {} only, not by {to}", spot.nodes.join(", ")));
        }
        Some(to) if to == b.node => return Err(format!("{label} is served by node {to} already")),
        Some(to) => to.to_string(),
        None => spot.nodes.iter().find(|n| **n != b.node).cloned().unwrap_or_default(),
    };
    let name = spot.duty.name(fsname);
    // The MGS lists no NID of its own: its move is seen on its drives alone.
    let nid_before = match duty.role {
        Role::Mgs => None,
        _ => served_nids(mgs).map(|s| first_nid(&s, &name).unwrap_or_default()),
    };
    nacre_raid::lease::ask_move(&drives, b.epoch, &to, MoveWhy::Operator).map_err(|e| format!("{label}: {e}"))?;
    Ok(Asked { label, name, from: b.node, to, epoch: b.epoch, drives, nid_before })
}

/// Wait until every move of `asked` landed, at most `limit`, saying each as it does: the
/// new node holds the drives (a newer epoch) and serves the target (the MGS lists a new
/// NID first; when the MGS did not answer before the move, the lease alone).
fn wait_moves(asked: Vec<Asked>, mgs: &NidList, limit: Duration) -> crate::service::CliResult {
    let started = std::time::Instant::now();
    let mut left = asked;
    while !left.is_empty() {
        // The MGS is asked (a connection each time) only once some lease moved, and once
        // per round.
        let mut served: Option<Option<String>> = None;
        left.retain(|a| match holder(&a.drives) {
            Ok(Some(b)) if b.epoch > a.epoch && !b.released && b.node == a.to => {
                let served = served.get_or_insert_with(|| served_nids(mgs));
                let now = served.as_deref().and_then(|s| first_nid(s, &a.name));
                let registered = match (&a.nid_before, &now) {
                    (Some(before), Some(now)) => before != now,
                    (Some(_), None) => false,
                    (None, _) => true,
                };
                if !registered {
                    return true;
                }
                let s = started.elapsed().as_secs_f64();
                let at = now.map(|n| format!(" at {n}")).unwrap_or_default();
                println!(
                    "{}: moved from node {} to node {} in {s:.1} s (epoch {}), served{at}",
                    a.label, a.from, a.to, b.epoch
                );
                false
            }
            _ => true,
        });
        if left.is_empty() {
            break;
        }
        if started.elapsed() >= limit {
            let names: Vec<String> = left.iter().map(|a| format!("{} (to {})", a.label, a.to)).collect();
            return Err(format!(
                "not moved within {limit:?}: {}; the nodes' logs say why (nacre status shows where each is)",
                names.join(", ")
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// `nacre failover TARGET [--to NODE]`.
pub fn failover(a: FailoverArgs) -> crate::service::CliResult {
    let (fsname, mgs, spots) = crate::up::cluster_targets(&a.at.path())?;
    let spot = find_spot(&spots, &fsname, &a.target)?;
    let asked = ask(spot, a.to.as_deref(), &fsname, &mgs)?;
    println!("{}: asked node {} to hand it to node {}", asked.label, asked.from, asked.to);
    wait_moves(vec![asked], &mgs, Duration::from_secs(a.wait))
}

/// `nacre failback [TARGET]`: targets served away from their primary go back to it.
pub fn failback(a: FailbackArgs) -> crate::service::CliResult {
    let (fsname, mgs, spots) = crate::up::cluster_targets(&a.at.path())?;
    let chosen: Vec<&Spot> = match &a.target {
        Some(t) => vec![find_spot(&spots, &fsname, t)?],
        None => spots.iter().filter(|s| s.nodes.len() > 1).collect(),
    };
    let mut asked = Vec::new();
    for s in chosen {
        let duty = &s.duty;
        let primary = &s.nodes[0];
        let on = duty.lease_drives().ok().and_then(|d| holder(&d).ok().flatten());
        match on {
            Some(b) if !b.released && b.node != *primary => asked.push(ask(s, Some(primary), &fsname, &mgs)?),
            Some(b) if !b.released => println!("{}: on its primary node {primary} already", duty.label()),
            _ if a.target.is_some() => return Err(format!("{}: not served: nothing to move", duty.label()).into()),
            _ => {}
        }
    }
    for m in &asked {
        println!("{}: asked node {} to hand it to node {}", m.label, m.from, m.to);
    }
    wait_moves(asked, &mgs, Duration::from_secs(a.wait))
}

/// A target's recovery as its server reports it (`COMPLETE`, `RECOVERING 1/2`,
/// `INACTIVE`), asked at the first of `nids` (`NID,NID`) that answers; `None` if none does.
fn recovery_of(nids: &str) -> Option<String> {
    let nids: NidList = nids.parse().ok()?;
    let body = nacre_proto::param::encode_get("*.recovery_status");
    recovery_summary(&crate::call_param_any(&nids, nacre_proto::param::OP_GET_PARAM, &body).ok()?)
}

/// The state in a `recovery_status` reply (the first, when a server has several targets).
fn recovery_summary(text: &str) -> Option<String> {
    // A one-line value follows its name on the line (`name=status: INACTIVE`).
    let value = |l: &str| l.split_once('=').map_or(l, |(_, v)| v).trim().to_string();
    let field = |key: &str| text.lines().map(value).find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()));
    Some(match (field("status:")?, field("completed_clients:")) {
        (status, Some(done)) if status == "RECOVERING" => format!("RECOVERING {done}"),
        (status, _) => status,
    })
}

/// `nacre status`: every target of a cluster file, the node whose lease holds its drives
/// (read from the drives), how old that node's last heartbeat is, and where the MGS says
/// it is served.
pub fn status(a: StatusArgs) -> crate::service::CliResult {
    let (fsname, mgs, spots) = crate::up::cluster_targets(&a.at.path())?;
    // Where the MGS says each target is, if it answers.
    let served = served_nids(&mgs).unwrap_or_default();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let mut rows = Vec::new();
    for s in &spots {
        let duty = &s.duty;
        let (holder_node, lease, epoch, age_s) = match duty.lease_drives() {
            Err(e) if e.contains("in use") => (String::new(), "exclusive (no failover)".to_string(), 0, None),
            Err(e) => (String::new(), format!("unreadable: {e}"), 0, None),
            Ok(drives) => match holder(&drives) {
                Ok(None) => (String::new(), "never leased".into(), 0, None),
                Ok(Some(b)) => {
                    let age = (now_ms - b.stamp_ms as i64).max(0) as f64 / 1000.0;
                    let state = if b.released && !b.to.is_empty() {
                        format!("handed to {}", b.to)
                    } else if b.released {
                        "released".into()
                    } else if age * 1000.0 > b.expiry.as_millis() as f64 {
                        "expired".into()
                    } else {
                        "held".into()
                    };
                    (b.node, state, b.epoch, Some(age))
                }
                Err(why) => (String::new(), format!("held by an unknown node ({why})"), 0, None),
            },
        };
        let name = s.duty.name(&fsname);
        let nids = match duty.role {
            // The MGS's own NIDs are the cluster file's, in its nodes' order: the holder's
            // first.
            Role::Mgs => {
                let mut all: Vec<String> =
                    std::iter::once(&duty.listen.nid).chain(&duty.listen.failover).map(Nid::to_string).collect();
                if let Some(i) = s.nodes.iter().position(|n| *n == holder_node).filter(|&i| i < all.len()) {
                    let active = all.remove(i);
                    all.insert(0, active);
                }
                all.join(",")
            }
            _ => served.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap_or("").trim().to_string(),
        };
        let recovery = match duty.role {
            Role::Mgs => None,
            _ => recovery_of(&nids),
        };
        rows.push((duty.label(), s.nodes.join(", "), holder_node, lease, epoch, age_s, recovery, nids));
    }
    if a.json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(t, nodes, holder, lease, epoch, age, recovery, nids)| {
                serde_json::json!({"target": t, "nodes": nodes, "holder": holder, "lease": lease, "epoch": epoch, "heartbeat_age_s": age, "recovery": recovery, "nids": nids})
            })
            .collect();
        println!("{}", serde_json::json!({ "fsname": fsname, "mgs": mgs.to_string(), "targets": list }));
        return Ok(());
    }
    println!("file system {fsname}, MGS {mgs}{}", if served.is_empty() { " (not answering)" } else { "" });
    println!(
        "{:<7} {:<12} {:<8} {:<24} {:>5} {:>10}  {:<16} NIDS (active first)",
        "TARGET", "NODES", "HOLDER", "LEASE", "EPOCH", "HEARTBEAT", "RECOVERY"
    );
    for (t, nodes, holder, lease, epoch, age, recovery, nids) in rows {
        let age = age.map(|a| format!("{a:.1} s ago")).unwrap_or_else(|| "-".into());
        let recovery = recovery.unwrap_or_else(|| "-".into());
        println!("{t:<7} {nodes:<12} {holder:<8} {lease:<24} {epoch:>5} {age:>10}  {recovery:<16} {nids}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    /// The NIDs a node's watch pings for a target another node holds: the MGS's list when
    /// it answered, then the cluster file's, never this node's own, each once.
    #[test]
    fn a_watch_pings_the_target_where_the_mgs_or_the_cluster_file_places_it_never_here() {
        let (here, there, moved) = ("10.0.0.2@tcp:9411", "10.0.0.1@tcp:9401", "10.0.0.3@tcp:9501");
        let mgs = NidList::new(vec![nid("10.0.0.1@tcp:9400"), nid("10.0.0.2@tcp:9400")]).unwrap();
        let entry = |index: u32, nids: &[&str]| TargetEntry {
            kind: TargetKind::Ost,
            index,
            nids: nids.iter().map(|n| n.to_string()).collect(),
        };
        let known = vec![entry(0, &[there, here]), entry(1, &["10.0.0.9@tcp:1"])];
        let node = Node::new("b", mgs.clone(), "nacre", known, Arc::new(FaultInjector::fresh()));
        let duty = |role: Role, listen: &str| Duty {
            role,
            index: 0,
            dir: PathBuf::from("/nonexistent"),
            primary: false,
            listen: Listen { nid: nid(listen), failover: vec![nid(there)] },
        };
        let ost0 = duty(Role::Ost, here);
        // Before the MGS answered: the cluster file's NIDs for OST0 alone, not this node's.
        assert_eq!(node.nids_of(&ost0, None), vec![nid(there)]);
        // The MGS's list first (the target moved to a third NID), then the cluster file's.
        let listed = [entry(0, &[moved, here, there])];
        assert_eq!(node.nids_of(&ost0, Some(&listed)), vec![nid(moved), nid(there)]);
        // The MGS is watched at its other NIDs.
        assert_eq!(node.nids_of(&duty(Role::Mgs, "10.0.0.2@tcp:9400"), Some(&listed)), vec![nid("10.0.0.1@tcp:9400")]);
    }

    #[test]
    fn recovery_states_read_from_a_status_reply() {
        let recovering = "mdt.mdt0.recovery_status=\nstatus: RECOVERING\ncompleted_clients: 1/2\nevicted_clients: 0\n";
        assert_eq!(recovery_summary(recovering).as_deref(), Some("RECOVERING 1/2"));
        let two = "obdfilter.ost0.recovery_status=\nstatus: COMPLETE\ncompleted_clients: 2/2\n\
                   obdfilter.ost1.recovery_status=\nstatus: RECOVERING\ncompleted_clients: 0/2\n";
        assert_eq!(recovery_summary(two).as_deref(), Some("COMPLETE"));
        assert_eq!(recovery_summary("mdt.mdt0.recovery_status=status: INACTIVE\n").as_deref(), Some("INACTIVE"));
        assert_eq!(recovery_summary("").as_deref(), None);
    }
}
