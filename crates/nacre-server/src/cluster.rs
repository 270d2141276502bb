//! Services wired into a file system: an MDT following the MGS's configuration (its DNE
//! peers, OST pools and the OSTs it precreates on), and [`Local`], a whole file system —
//! MGS, MDTs and OSTs — served from one process (`nacre up`, and tests).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nacre_net::client::{Client, ClientConfig};
use nacre_net::fault::FaultInjector;
use nacre_net::nid::{Nid, NidList};
use nacre_net::server::{Handler, Reply, Server, ServerConfig, Service};
use nacre_net::transport::Transport;
use nacre_osd::Target;
use nacre_proto::mgs::{Config, MGS_NAME, Request, TargetEntry, TargetKind};
use nacre_proto::param;

use crate::mds::Mds;
use crate::mdt::Namespace;
use crate::mgs::Mgs;
use crate::objects::{ObjectService, PRECREATE_BATCH};
use crate::oss::{Oss, OssConfig};

/// Follow the file system's targets in the MGS's configuration, for as long as the task
/// runs: tell the coordinator of operations over several MDTs where the other MDTs are,
/// keep the OST pools, take the MDT's parameters stored with `set-param -P`, and keep
/// precreate and destroy tasks on every OST (see [`ObjectService::follow`]). Each new
/// version the MGS gives is kept on the MDT's volume ([`Namespace::keep_config_copy`]).
/// Until the MGS first answers, that copy stands in for it (targets, pools, parameters),
/// with the targets `known` from the node's cluster file added: an MDT taken over, or
/// restarted, while the MGS is down still reaches its OSTs, places files in its pools
/// and runs with its stored parameters.
pub async fn follow_config(client: Client, mgs: NidList, fsname: String, known: Vec<TargetEntry>, mds: Arc<Mds>) {
    let (ns, dne) = (mds.namespace().clone(), mds.coordinator().clone());
    let mut have = 0;
    let mut objects = ObjectService::new(ns.clone(), PRECREATE_BATCH);
    let mut standin = {
        let ns = ns.clone();
        let copy = tokio::task::spawn_blocking(move || ns.config_copy()).await;
        let mut cfg = match copy {
            Ok(Ok(Some(bytes))) => Config::decode(&bytes).ok().filter(|c| c.fsname == fsname),
            _ => None,
        };
        if cfg.is_none() && !known.is_empty() {
            cfg = Some(Config { fsname: fsname.clone(), version: 0, targets: Vec::new(), params: Vec::new() });
        }
        cfg.map(|mut c| {
            for t in known {
                if !c.targets.iter().any(|k| k.kind == t.kind && k.index == t.index) {
                    c.targets.push(t);
                }
            }
            c
        })
    };
    let mut kept_version = None;
    loop {
        let fetched = async {
            let imp = client.connect_any(MGS_NAME, mgs.all()).await.ok()?;
            let (op, body) = Request::Config { have, wait_ms: 30_000 }.encode();
            let f = imp.call(op, &body, &[]).await.ok()?;
            (f.header.status == 0).then(|| Config::decode(&f.body).ok()).flatten()
        }
        .await;
        let from_mgs = fetched.is_some();
        // The stand-in serves once, before the MGS first answers.
        let Some(cfg) = fetched.or_else(|| if have == 0 { standin.take() } else { None }) else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let nids = |t: &TargetEntry| -> Vec<Nid> { t.nids.iter().filter_map(|n| n.parse().ok()).collect() };
        let mdts: HashMap<u32, Vec<Nid>> = cfg
            .targets
            .iter()
            .filter(|t| t.kind == TargetKind::Mdt && t.index != ns.index())
            .map(|t| (t.index, nids(t)))
            .collect();
        let count = cfg.targets.iter().filter(|t| t.kind == TargetKind::Mdt).map(|t| t.index + 1).max().unwrap_or(1);
        dne.set_peers(count, client.clone(), &fsname, mdts);
        let osts: Vec<(u32, Vec<Nid>)> =
            cfg.targets.iter().filter(|t| t.kind == TargetKind::Ost).map(|t| (t.index, nids(t))).collect();
        objects.follow(&client, &fsname, &osts);
        // The cluster file's list alone says nothing of pools and parameters.
        if from_mgs || cfg.version > 0 {
            ns.set_ost_pools(nacre_proto::layout::pools::from_params(
                cfg.params.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            ));
            mds.apply_stored(&cfg.params);
        }
        if !from_mgs {
            // Asked again after a pause.
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        have = cfg.version;
        if kept_version != Some(cfg.version) {
            let (keeper, bytes) = (ns.clone(), cfg.encode());
            let failed = match tokio::task::spawn_blocking(move || keeper.keep_config_copy(&bytes)).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            match failed {
                None => kept_version = Some(cfg.version),
                Some(e) => {
                    eprintln!("{}: keeping a copy of the configuration: {e}", TargetKind::Mdt.name(&fsname, ns.index()))
                }
            }
        }
    }
}

/// Where the MGS is for the targets a process serves: in this process, or on another
/// node (registration then goes over the network, retried until the MGS answers).
pub enum MgsAt {
    Here(Arc<Mgs>),
    /// On another node (or one of several: `nids`, tried in turn); `known` lists the file
    /// system's targets as this node's cluster file has them (empty when it knows none),
    /// used while the MGS does not answer.
    Remote {
        nids: NidList,
        fsname: String,
        known: Vec<TargetEntry>,
    },
}

/// Register target `index` of `kind`, served at `nids[0]` (its failover nodes' NIDs
/// after it), with the MGS at `mgs` (`nacre mdt serve` and `ost serve` register so too).
pub async fn register_remote(
    client: &Client,
    mgs: &NidList,
    fsname: &str,
    kind: TargetKind,
    index: u32,
    nids: &[Nid],
) -> Result<(), String> {
    let import = client.connect_any(MGS_NAME, mgs.all()).await.map_err(|e| format!("MGS {mgs}: {e}"))?;
    let (op, body) = Request::Register {
        fsname: fsname.to_string(),
        target: TargetEntry { kind, index, nids: nids.iter().map(Nid::to_string).collect() },
    }
    .encode();
    let reply = import.call(op, &body, &[]).await.map_err(|e| format!("MGS {mgs}: {e}"))?;
    // The MGS need not keep an export for a client that only registered.
    let _ = import.disconnect().await;
    if reply.header.status != 0 {
        return Err(format!(
            "MGS {mgs} refused {}: {}",
            kind.name(fsname, index),
            String::from_utf8_lossy(&reply.body)
        ));
    }
    Ok(())
}

/// Where a service of a [`Local`] listens, and the NIDs of the other nodes that may serve
/// its target. These are registered with the MGS after its own, so that clients know
/// where to look before the target first moves, even when the MGS is down then.
#[derive(Clone, Debug)]
pub struct Listen {
    pub nid: Nid,
    pub failover: Vec<Nid>,
}

impl From<Nid> for Listen {
    fn from(nid: Nid) -> Listen {
        Listen { nid, failover: Vec::new() }
    }
}

/// How long [`Local::stop`] waits for the other targets to answer its goodbyes.
const GOODBYE_WAIT: Duration = Duration::from_secs(2);

/// How long [`Local::start`] waits for a remote MGS to take its targets' registrations.
#[derive(Clone, Copy, Debug)]
pub enum Registration {
    /// Up to this long, then the start fails.
    Wait(Duration),
    /// Not at all: a target serves at once and registers in the background, retrying
    /// until the MGS answers (a target taken over on a failover node, whose clients
    /// find it by its NID listed already).
    Background,
}

/// Whether the targets of a [`Local`] may still answer: a node's lease on their drives.
/// Asked as each request arrives and again before its reply goes; once it says no,
/// nothing more is answered (the request waits forever, and its client, timing out,
/// goes to where the target moved). A node stopped and resumed thus answers nothing on
/// state that is no longer the target's.
pub type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

/// A node's own settable parameter, answered by the services of a [`Local`] before
/// their own: `Some` for a name it knows (set, or refused with the reason), `None` for
/// the services to answer.
pub type NodeParam = Arc<dyn Fn(&str, &str) -> Option<Result<(), String>> + Send + Sync>;

/// What the node adds to every service of a [`Local`].
#[derive(Clone, Default)]
pub struct ServeWith {
    /// The lease that gates their answers (see [`Gate`]).
    pub gate: Option<Gate>,
    /// The fault rules of the node's network, shared by every service on it (one set
    /// for all the `Local`s of a process, as LNet's drop rules are the node's), read and
    /// changed with the parameter [`FAULT_RULES`]. `None`: the `Local`'s own.
    pub faults: Option<Arc<FaultInjector>>,
    /// The node's own parameters, set through any of these services.
    pub node_param: Option<NodeParam>,
}

/// The node's fault rules as a parameter, served by every service of a [`Local`]
/// (Lustre's `lctl net_drop_add`): `set-param net.fault_rules="drop except=200,201"`
/// adds a rule (see `nacre_net::fault`), `del ID` removes one, `clear` all of them;
/// `get-param` lists them.
pub const FAULT_RULES: &str = "net.fault_rules";

/// `handler`, answering only while `gate` allows, and serving [`FAULT_RULES`] from
/// `faults` before the service's own parameters.
fn wrap(handler: Handler, gate: Option<Gate>, faults: Arc<FaultInjector>, node_param: Option<NodeParam>) -> Handler {
    Arc::new(move |req| {
        let op = req.header.opcode;
        let params = op == param::OP_GET_PARAM || op == param::OP_SET_PARAM;
        if gate.is_none() && !params {
            return handler(req);
        }
        let (handler, gate, faults, node_param) = (handler.clone(), gate.clone(), faults.clone(), node_param.clone());
        Box::pin(async move {
            let open = || gate.as_ref().is_none_or(|g| g());
            if !open() {
                return std::future::pending().await;
            }
            let reply = match op {
                param::OP_SET_PARAM => match param::decode_set(&req.body) {
                    Ok((name, value)) if name == FAULT_RULES => set_fault_rule(&faults, &value),
                    Ok((name, value)) => match node_param.as_ref().and_then(|f| f(&name, &value)) {
                        Some(Ok(())) => Reply::default(),
                        Some(Err(why)) => refused(why),
                        None => handler(req).await,
                    },
                    _ => handler(req).await,
                },
                param::OP_GET_PARAM => {
                    let pattern = param::decode_get(&req.body).ok();
                    let mut reply = handler(req).await;
                    if reply.status == 0 && pattern.is_some_and(|p| nacre_net::glob::glob(&p, FAULT_RULES)) {
                        let rules = (FAULT_RULES.to_string(), faults.list().join("\n"));
                        reply.body.extend_from_slice(param::render(&[rules]).as_bytes());
                    }
                    reply
                }
                _ => handler(req).await,
            };
            if !open() {
                return std::future::pending().await;
            }
            reply
        })
    })
}

/// A parameter refused (EINVAL), saying why.
fn refused(why: String) -> Reply {
    Reply { status: crate::oss::errno::EINVAL, body: why.into_bytes(), ..Reply::default() }
}

/// Apply one `set-param net.fault_rules=VALUE`: a rule to add, `del ID` or `clear`.
fn set_fault_rule(faults: &FaultInjector, value: &str) -> Reply {
    match value.split_whitespace().collect::<Vec<_>>()[..] {
        ["clear"] => faults.clear(),
        ["del", id] => match id.parse() {
            Ok(id) if faults.remove(id) => {}
            _ => return refused(format!("{FAULT_RULES}: no rule {id:?} (get-param {FAULT_RULES} lists them)")),
        },
        _ => {
            if let Err(e) = faults.add(value) {
                return refused(format!("{FAULT_RULES}: {e}"));
            }
        }
    }
    Reply::default()
}

/// Targets served from this process — a whole file system (`nacre up`) or one node's
/// share of it (`nacre server --node`) — each on a server of its own. Dropping it stops
/// every service.
pub struct Local {
    mgs: Option<Arc<Mgs>>,
    /// The MGS's NIDs (the one served here, when it is).
    mgs_nid: NidList,
    mdses: Vec<Arc<Mds>>,
    osses: Vec<Arc<Oss>>,
    servers: Vec<Server>,
    followers: Vec<tokio::task::AbortHandle>,
    /// The MDTs' clients of the other targets (DNE peers, OSTs for objects).
    clients: Vec<Client>,
}

impl Drop for Local {
    fn drop(&mut self) {
        for f in &self.followers {
            f.abort();
        }
    }
}

impl Local {
    /// Serve the MGS (if here), the MDTs `mdts` and the OSTs `osts` (with their indices)
    /// on `transport`. `listen(name)` gives where each service listens (`name` is `mgs`,
    /// `mdt0`, `ost3`…; a TCP port of 0 takes any free one) and its target's failover
    /// NIDs. With a remote MGS, each target registers with it as `registration` says. With `recover`,
    /// each MDT waits for its clients from before a restart to replay (see
    /// `nacre_net::recovery`); without, it forgets them (a whole file system restarting
    /// with its own new mount, where nobody from before comes back). `with` gives what the
    /// node adds to every service (see [`ServeWith`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        transport: Arc<dyn Transport>,
        listen: impl Fn(&str) -> Listen,
        mgs: MgsAt,
        mdts: Vec<Arc<Namespace>>,
        osts: Vec<(u32, Arc<Target>)>,
        registration: Registration,
        recover: bool,
        with: ServeWith,
    ) -> Result<Local, String> {
        let faults = with.faults.unwrap_or_else(|| Arc::new(FaultInjector::fresh()));
        let serve = |name: String, handler, service: Service| {
            let at = listen(&name);
            let transport = transport.clone();
            let handler = wrap(handler, with.gate.clone(), faults.clone(), with.node_param.clone());
            let service = Service { faults: Some(faults.clone()), ..service };
            async move {
                let server = Server::start_service(transport, &at.nid, handler, ServerConfig::default(), service)
                    .await
                    .map_err(|e| format!("{name}: cannot listen on {}: {e}", at.nid))?;
                // The NID served (a port of 0 became a real one), then the failover ones.
                let nids: Vec<Nid> = std::iter::once(server.nid()).chain(at.failover).collect();
                Ok::<_, String>((server, nids))
            }
        };
        let mut servers = Vec::new();
        let (here, mgs_nid, fsname, known) = match mgs {
            MgsAt::Here(m) => {
                let service = Service { target: Some(MGS_NAME.to_string()), ..Service::default() };
                let (server, _) = serve("mgs".into(), m.handler(), service).await?;
                let nid = NidList::from(server.nid());
                servers.push(server);
                let fsname = m.config().fsname;
                (Some(m), nid, fsname, Vec::new())
            }
            MgsAt::Remote { nids, fsname, known } => (None, nids, fsname, known),
        };
        // The node's clients share its fault rules with its servers: one network.
        let cfg = ClientConfig { ping: false, ..ClientConfig::default() };
        let client = Client::with_faults(transport.clone(), cfg, Some(faults.clone()));
        let wait = match registration {
            Registration::Wait(wait) => Some(wait),
            Registration::Background => None,
        };
        let register = |kind: TargetKind, index: u32, nids: Vec<Nid>| {
            let (here, client, mgs_nid, fsname) = (here.clone(), client.clone(), mgs_nid.clone(), fsname.clone());
            async move {
                let name = kind.name(&fsname, index);
                if let Some(m) = &here {
                    let nids = nids.iter().map(Nid::to_string).collect();
                    return m
                        .register(&fsname, &TargetEntry { kind, index, nids })
                        .map(|_| ())
                        .map_err(|e| format!("registering {name}: {e}"));
                }
                let started = tokio::time::Instant::now();
                let mut said = false;
                loop {
                    match register_remote(&client, &mgs_nid, &fsname, kind, index, &nids).await {
                        Ok(()) => {
                            if said {
                                eprintln!("{name}: registered with the MGS at {mgs_nid}");
                            }
                            return Ok(());
                        }
                        Err(e) if wait.is_some_and(|w| started.elapsed() >= w) => return Err(e),
                        Err(e) => {
                            if wait.is_none() && !said {
                                eprintln!("{name}: serving; registering when the MGS answers ({e})");
                                said = true;
                            }
                            tokio::time::sleep(Duration::from_millis(500)).await
                        }
                    }
                }
            }
        };
        let background = wait.is_none() && here.is_none();
        // Registrations in the background, and the MDTs' configuration followers.
        let mut followers = Vec::new();
        let mut osses = Vec::new();
        for (i, t) in osts {
            let oss = Oss::new(vec![t], OssConfig::default()).map_err(|e| format!("ost{i}: {e}"))?;
            if !recover {
                oss.forget_clients().map_err(|e| format!("ost{i}: {e}"))?;
            }
            let service = Service { target: Some(TargetKind::Ost.name(&fsname, i)), ..oss.service() };
            let (server, nids) = serve(format!("ost{i}"), oss.handler(), service).await?;
            oss.attach(server.handle());
            let registering = register(TargetKind::Ost, i, nids);
            if background {
                followers.push(tokio::spawn(registering).abort_handle());
            } else {
                registering.await?;
            }
            servers.push(server);
            osses.push(oss);
        }
        let mut mdses = Vec::new();
        let mut clients = Vec::new();
        for ns in mdts {
            let index = ns.index();
            let name = format!("mdt{index}");
            let mds = Mds::new(&name, ns.clone());
            if !recover {
                let m = mds.clone();
                tokio::task::spawn_blocking(move || m.abort_recovery())
                    .await
                    .map_err(|e| format!("{name}: {e}"))?
                    .map_err(|e| format!("{name}: {e}"))?;
            }
            let service = Service { target: Some(TargetKind::Mdt.name(&fsname, index)), ..mds.service() };
            let (server, nids) = serve(name, mds.handler(), service).await?;
            mds.follow_evictions(server.handle());
            let registering = register(TargetKind::Mdt, index, nids);
            if background {
                followers.push(tokio::spawn(registering).abort_handle());
            } else {
                registering.await?;
            }
            servers.push(server);
            let client = Client::with_faults(transport.clone(), ClientConfig::default(), Some(faults.clone()));
            clients.push(client.clone());
            let task = tokio::spawn(follow_config(client, mgs_nid.clone(), fsname.clone(), known.clone(), mds.clone()));
            followers.push(task.abort_handle());
            mdses.push(mds);
        }
        // Operations over several MDTs a stop cut short: finished now that every MDT
        // is reachable.
        for mds in &mdses {
            let m = mds.clone();
            tokio::task::spawn_blocking(move || m.recover())
                .await
                .map_err(|e| format!("recovery: {e}"))?
                .map_err(|e| format!("recovery: {e}"))?;
        }
        Ok(Local { mgs: here, mgs_nid, mdses, osses, servers, followers, clients })
    }

    /// Stop serving, cleanly: the MDTs' links to other targets say goodbye first (an OST
    /// restarted later then waits for no MDT of this start), then every service stops.
    pub async fn stop(self) {
        for f in &self.followers {
            f.abort();
        }
        // All at once, and not waited for past a bound: over a network that failed (a
        // node handing its targets over because of it), the servers forget these links
        // by evicting them instead.
        let mut goodbyes = tokio::task::JoinSet::new();
        for c in &self.clients {
            let c = c.clone();
            goodbyes.spawn(async move { c.disconnect_all().await });
        }
        let _ = tokio::time::timeout(GOODBYE_WAIT, async { while goodbyes.join_next().await.is_some() {} }).await;
    }

    /// Commit what every target served here has answered (an MDT's changes, an OST's
    /// unstable writes): before a planned move, so that clients have nothing to replay.
    pub async fn commit_all(&self) {
        for m in &self.mdses {
            if let Err(e) = m.namespace().committed_all().await {
                eprintln!("mdt{}: commit before stopping: {}", m.namespace().index(), e.message);
            }
        }
        for o in &self.osses {
            let o = o.clone();
            match tokio::task::spawn_blocking(move || o.writeback().commit()).await {
                Ok(Err(e)) => eprintln!("oss: commit before stopping: {e}"),
                Err(e) => eprintln!("oss: commit before stopping: {e}"),
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Where clients mount from.
    pub fn mgs(&self) -> &NidList {
        &self.mgs_nid
    }

    /// The MGS itself, when served here (`set-param -P` without a round trip).
    pub fn mgs_service(&self) -> Option<&Arc<Mgs>> {
        self.mgs.as_ref()
    }

    pub fn mdses(&self) -> &[Arc<Mds>] {
        &self.mdses
    }

    pub fn osses(&self) -> &[Arc<Oss>] {
        &self.osses
    }

    /// Every service's name and NID, MGS first.
    pub fn nids(&self) -> Vec<Nid> {
        self.servers.iter().map(Server::nid).collect()
    }

    /// Wait until every MDT served here has precreated objects on `osts` OSTs (a create
    /// right after start then gets its stripes); at most `limit`.
    pub async fn wait_ready(&self, osts: usize, limit: Duration) -> bool {
        let started = tokio::time::Instant::now();
        loop {
            let ready = self.mdses.iter().all(|m| {
                let levels = m.namespace().pool_levels();
                levels.len() >= osts && levels.iter().all(|(_, n)| *n > 0)
            });
            if ready || osts == 0 {
                return true;
            }
            if started.elapsed() > limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
