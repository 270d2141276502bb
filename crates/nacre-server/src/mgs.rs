//! The MGS: the configuration of one file system — its name, its targets with their NIDs
//! (the server that registered last first, failover partners after), and the parameters
//! stored with `set-param -P` — kept in redb on its own volume.
//!
//! Targets register when they start; clients fetch the configuration when they mount and
//! then ask again with the version they have, which the MGS answers as soon as the
//! configuration changes (or after the wait they asked for): that is how they hear of a
//! target failing over or of a parameter set for the whole file system.

use std::sync::{Arc, Mutex};

use nacre_net::server::{Handler, Incoming, Reply};
use nacre_osd::SyncMode;
use nacre_osd::backend::VolumeBackend;
use nacre_proto::mdt::errno;
use nacre_proto::mgs::{
    Config, NIDS_MAX, PARAM_NAME_MAX, PARAM_VALUE_MAX, PARAMS_MAX, Request, TARGETS_MAX, TargetEntry, TargetKind,
    WAIT_MS_MAX,
};
use nacre_proto::param;
use nacre_raid::Volume;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// (kind, index) → NIDs, newline-separated.
const TARGETS: TableDefinition<(u8, u32), &str> = TableDefinition::new("targets");
const PARAMS: TableDefinition<&str, &str> = TableDefinition::new("params");

/// A refused MGS request: errno and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MgsError {
    pub errno: i32,
    pub message: String,
}

impl std::fmt::Display for MgsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for MgsError {}

fn err(errno: i32, message: impl Into<String>) -> MgsError {
    MgsError { errno, message: message.into() }
}

fn storage<E: std::fmt::Display>(e: E) -> MgsError {
    err(errno::EIO, format!("MGS storage: {e}"))
}

type Result<T> = std::result::Result<T, MgsError>;

fn kind_code(k: TargetKind) -> u8 {
    match k {
        TargetKind::Mdt => 1,
        TargetKind::Ost => 2,
    }
}

/// Bytes the configuration may take: it travels in one reply body (64 KiB).
pub const CONFIG_BYTES_MAX: usize = 60 << 10;
/// Config requests that may wait for a change at once; more are answered at once, so
/// waiting clients never hold every service thread.
pub const WAITERS_MAX: usize = 16;

pub struct Mgs {
    waiters: std::sync::atomic::AtomicUsize,
    db: Database,
    config: Mutex<Config>,
    changed: tokio::sync::watch::Sender<u64>,
}

/// A parameter name: dotted, of letters, digits and `_-.`, with `*?[]` globs.
fn check_param_name(name: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "_-.*?[],".contains(c);
    if name.is_empty() || name.len() > PARAM_NAME_MAX || !name.contains('.') || !name.chars().all(ok_char) {
        return Err(err(
            errno::EINVAL,
            format!(
                "{name:?} is not a parameter name (dotted, like osc.*.max_rpcs_in_flight; at most {PARAM_NAME_MAX} bytes)"
            ),
        ));
    }
    Ok(())
}

impl Mgs {
    /// Make a new MGS for file system `fsname` on `volume`.
    pub fn format(volume: Arc<Volume>, fsname: &str) -> Result<Mgs> {
        if let Some(problem) = nacre_proto::mgs::fsname_problem(fsname) {
            return Err(err(errno::EINVAL, problem));
        }
        volume.write(0, &[0u8; 8192]).map_err(storage)?;
        let db = Self::open_db(volume)?;
        let txn = db.begin_write().map_err(storage)?;
        {
            let mut m = txn.open_table(META).map_err(storage)?;
            m.insert("fsname", fsname.as_bytes()).map_err(storage)?;
            m.insert("version", 1u64.to_le_bytes().as_slice()).map_err(storage)?;
            txn.open_table(TARGETS).map_err(storage)?;
            txn.open_table(PARAMS).map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        Self::load(db)
    }

    /// Open an existing MGS.
    pub fn open(volume: Arc<Volume>) -> Result<Mgs> {
        Self::load(Self::open_db(volume)?)
    }

    fn open_db(volume: Arc<Volume>) -> Result<Database> {
        let size = volume.capacity();
        let backend = VolumeBackend::open(volume, 0, size, SyncMode::Ordered).map_err(storage)?;
        Database::builder().set_cache_size(8 << 20).create_with_backend(backend).map_err(storage)
    }

    fn load(db: Database) -> Result<Mgs> {
        let mut c = Config::default();
        {
            let txn = db.begin_read().map_err(storage)?;
            let m = txn.open_table(META).map_err(|e| err(errno::EINVAL, format!("not an MGS: {e}")))?;
            let get = |k: &str| -> Result<Vec<u8>> {
                m.get(k)
                    .map_err(storage)?
                    .map(|v| v.value().to_vec())
                    .ok_or_else(|| err(errno::EINVAL, format!("MGS lacks {k}")))
            };
            c.fsname = String::from_utf8(get("fsname")?).map_err(storage)?;
            c.version = u64::from_le_bytes(get("version")?.try_into().map_err(|_| storage("bad version"))?);
            for e in txn.open_table(TARGETS).map_err(storage)?.iter().map_err(storage)? {
                let (k, v) = e.map_err(storage)?;
                let (code, index) = k.value();
                let kind = if code == 1 { TargetKind::Mdt } else { TargetKind::Ost };
                c.targets.push(TargetEntry { kind, index, nids: v.value().lines().map(str::to_string).collect() });
            }
            for e in txn.open_table(PARAMS).map_err(storage)?.iter().map_err(storage)? {
                let (k, v) = e.map_err(storage)?;
                c.params.push((k.value().to_string(), v.value().to_string()));
            }
        }
        let (changed, _) = tokio::sync::watch::channel(c.version);
        Ok(Mgs { waiters: Default::default(), db, config: Mutex::new(c), changed })
    }

    /// The configuration now.
    pub fn config(&self) -> Config {
        self.config.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Apply a change to the stored configuration and the cached one, with a new version.
    fn change(&self, f: impl FnOnce(&redb::WriteTransaction, &mut Config) -> Result<bool>) -> Result<u64> {
        let mut c = self.config.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = c.clone();
        let txn = self.db.begin_write().map_err(storage)?;
        if !f(&txn, &mut next)? {
            return Ok(c.version);
        }
        let size = next.encode().len();
        if size > CONFIG_BYTES_MAX {
            return Err(err(
                errno::ENOSPC,
                format!("the configuration would take {size} bytes; one reply carries {CONFIG_BYTES_MAX}"),
            ));
        }
        next.version += 1;
        txn.open_table(META)
            .map_err(storage)?
            .insert("version", next.version.to_le_bytes().as_slice())
            .map_err(storage)?;
        txn.commit().map_err(storage)?;
        *c = next;
        self.changed.send_replace(c.version);
        Ok(c.version)
    }

    /// A target starting: add it, or put its NIDs first (the others stay as failover
    /// partners). Returns the configuration's version.
    pub fn register(&self, fsname: &str, t: &TargetEntry) -> Result<u64> {
        let mine = self.config().fsname;
        if fsname != mine {
            return Err(err(
                errno::EINVAL,
                format!("a target of file system {fsname:?} registering with the MGS of {mine:?}"),
            ));
        }
        if t.index >= TARGETS_MAX {
            return Err(err(errno::EINVAL, format!("target index {} (at most {})", t.index, TARGETS_MAX - 1)));
        }
        if t.nids.is_empty() || t.nids.len() > NIDS_MAX {
            return Err(err(errno::EINVAL, format!("{} NIDs: a target lists 1 to {NIDS_MAX}", t.nids.len())));
        }
        for n in &t.nids {
            n.parse::<nacre_net::nid::Nid>().map_err(|e| err(errno::EINVAL, format!("NID {n:?}: {e}")))?;
        }
        self.change(|txn, c| {
            let existing = c.targets.iter().position(|e| e.kind == t.kind && e.index == t.index);
            let nids = match existing {
                Some(i) => {
                    let mut nids = t.nids.clone();
                    nids.extend(c.targets[i].nids.iter().filter(|n| !t.nids.contains(n)).cloned());
                    nids.truncate(NIDS_MAX);
                    if nids == c.targets[i].nids {
                        return Ok(false);
                    }
                    c.targets[i].nids = nids.clone();
                    nids
                }
                None => {
                    c.targets.push(t.clone());
                    c.targets.sort_by_key(|e| (e.kind, e.index));
                    t.nids.clone()
                }
            };
            txn.open_table(TARGETS)
                .map_err(storage)?
                .insert((kind_code(t.kind), t.index), nids.join("\n").as_str())
                .map_err(storage)?;
            Ok(true)
        })
    }

    /// Store a parameter for the whole file system (`set-param -P`); an empty value
    /// removes it.
    pub fn set_param(&self, name: &str, value: &str) -> Result<u64> {
        check_param_name(name)?;
        if name == crate::cluster::FAULT_RULES {
            return Err(err(
                errno::EINVAL,
                format!("{name} is a node's, not stored: set it on the node (set-param --server NID {name}=RULE)"),
            ));
        }
        if value.len() > PARAM_VALUE_MAX || value.contains('\n') {
            return Err(err(errno::EINVAL, format!("value of {name}: one line of at most {PARAM_VALUE_MAX} bytes")));
        }
        if let Some(pool) = name.strip_prefix(nacre_proto::layout::pools::PARAM_PREFIX) {
            use nacre_proto::layout::pools;
            pools::check_name(pool).map_err(|e| err(errno::EINVAL, e))?;
            if !value.is_empty() {
                pools::parse_osts(value).map_err(|e| err(errno::EINVAL, format!("pool {pool}: {e}")))?;
            }
        }
        self.change(|txn, c| {
            let at = c.params.iter().position(|(n, _)| n == name);
            let mut t = txn.open_table(PARAMS).map_err(storage)?;
            match (at, value.is_empty()) {
                (None, true) => return Err(err(errno::ENOENT, format!("no stored parameter {name}"))),
                (Some(i), true) => {
                    c.params.remove(i);
                    t.remove(name).map_err(storage)?;
                }
                (Some(i), false) => {
                    if c.params[i].1 == value {
                        return Ok(false);
                    }
                    c.params[i].1 = value.to_string();
                    t.insert(name, value).map_err(storage)?;
                }
                (None, false) => {
                    if c.params.len() >= PARAMS_MAX {
                        return Err(err(errno::ENOSPC, format!("{PARAMS_MAX} parameters are stored already")));
                    }
                    c.params.push((name.to_string(), value.to_string()));
                    c.params.sort();
                    t.insert(name, value).map_err(storage)?;
                }
            }
            Ok(true)
        })
    }

    /// The configuration once its version is above `have`, or after `wait`.
    pub async fn wait(&self, have: u64, wait: std::time::Duration) -> Config {
        let mut rx = self.changed.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(|v| *v > have)).await;
        self.config()
    }

    /// Parameters matching `pattern`: `mgs.MGS.fsname`, `mgs.MGS.version`,
    /// `mgs.MGS.targets` (one line each: name and NIDs) and every stored parameter under
    /// its own name.
    pub fn get_param(&self, pattern: &str) -> Vec<(String, String)> {
        let c = self.config();
        let mut out = Vec::new();
        let mut add = |name: String, value: String| {
            if nacre_net::glob::glob(pattern, &name) {
                out.push((name, value));
            }
        };
        add("mgs.MGS.fsname".into(), c.fsname.clone());
        add("mgs.MGS.version".into(), c.version.to_string());
        add(
            "mgs.MGS.targets".into(),
            c.targets
                .iter()
                .map(|t| format!("{} {}", t.kind.name(&c.fsname, t.index), t.nids.join(",")))
                .collect::<Vec<_>>()
                .join("\n"),
        );
        for (n, v) in &c.params {
            add(n.clone(), v.clone());
        }
        out
    }

    /// The transport handler of this MGS.
    pub fn handler(self: &Arc<Self>) -> Handler {
        let mgs = self.clone();
        Arc::new(move |req: Incoming| {
            let mgs = mgs.clone();
            Box::pin(async move { mgs.serve(req).await })
        })
    }

    async fn serve(self: Arc<Self>, req: Incoming) -> Reply {
        let fail = |e: MgsError| Reply { status: -e.errno, body: e.message.into_bytes(), ..Reply::default() };
        let ok = |body: Vec<u8>| Reply { status: 0, body, ..Reply::default() };
        let op = req.header.opcode;
        if op == param::OP_GET_PARAM {
            return match param::decode_get(&req.body) {
                Ok(p) => ok(param::render(&self.get_param(&p)).into_bytes()),
                Err(e) => fail(err(71, format!("bad get-param request: {e}"))),
            };
        }
        if op == param::OP_SET_PARAM {
            // `set-param -P` arrives here as a plain set-param to the MGS.
            return match param::decode_set(&req.body) {
                Ok((n, v)) => {
                    let me = self.clone();
                    match tokio::task::spawn_blocking(move || me.set_param(&n, &v)).await {
                        Ok(Ok(_)) => ok(Vec::new()),
                        Ok(Err(e)) => fail(e),
                        Err(e) => fail(err(errno::EIO, e.to_string())),
                    }
                }
                Err(e) => fail(err(71, format!("bad set-param request: {e}"))),
            };
        }
        let r = match Request::decode(op, &req.body) {
            Ok(r) => r,
            Err(e) => return fail(err(71, format!("bad MGS request: {e}"))),
        };
        match r {
            Request::Config { have, wait_ms } => {
                use std::sync::atomic::{AtomicUsize, Ordering};
                /// Counts this request among the waiters while it lives (even if dropped).
                struct Waiting<'a>(&'a AtomicUsize);
                impl Drop for Waiting<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                let mut wait = std::time::Duration::from_millis(wait_ms.min(WAIT_MS_MAX) as u64);
                let _waiting = Waiting(&self.waiters);
                if self.waiters.fetch_add(1, Ordering::AcqRel) >= WAITERS_MAX {
                    wait = std::time::Duration::ZERO;
                }
                ok(self.wait(have, wait).await.encode())
            }
            Request::Register { fsname, target } => {
                let me = self.clone();
                match tokio::task::spawn_blocking(move || me.register(&fsname, &target)).await {
                    Ok(Ok(v)) => ok(v.to_le_bytes().to_vec()),
                    Ok(Err(e)) => fail(e),
                    Err(e) => fail(err(errno::EIO, e.to_string())),
                }
            }
            Request::SetParam { name, value } => {
                let me = self.clone();
                match tokio::task::spawn_blocking(move || me.set_param(&name, &value)).await {
                    Ok(Ok(v)) => ok(v.to_le_bytes().to_vec()),
                    Ok(Err(e)) => fail(e),
                    Err(e) => fail(err(errno::EIO, e.to_string())),
                }
            }
        }
    }
}
