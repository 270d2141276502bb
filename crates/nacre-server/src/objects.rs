//! The MDS's side of OST objects: keeping every OST's pool of precreated objects full, and
//! destroying the objects of removed files.
//!
//! Files take objects from the pools inside their create's transaction
//! ([`crate::mdt::Namespace`]), so a create never waits on an OST. Here, for each OST, a
//! task asks its OSS for a batch (`precreate_batch`, 1,024 as on Helma) whenever the pool
//! falls below half a batch, and records the new objects in the namespace before any file
//! can take them; another reads the namespace's destroy log — written in the same
//! transaction that removed the file, so it survives restarts — destroys that OST's
//! objects and then drops them from the log. An object already gone counts as destroyed,
//! so a destroy repeated after a crash is harmless. The tasks of one OST live and fail on
//! their own: an OST that is away or moving holds up nothing of the others'.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nacre_net::client::{Client, Import};
use nacre_net::nid::Nid;
use nacre_proto::mgs::TargetKind;
use nacre_proto::ost::{self, Request};

use crate::mdt::Namespace;

/// Objects asked of an OSS at once (Lustre's `precreate_batch`, 1,024 on Helma).
pub const PRECREATE_BATCH: u32 = 1024;
/// Objects destroyed per pass of the destroy task: one batched destroy, one transaction
/// on the OST.
const DESTROY_PASS: usize = 256;
/// How long the destroy task lets a batch gather after one that was not full. A pass
/// costs a transaction on the OST and a change on the MDT whatever its size; at 10 ms an
/// unlink storm through the mount sent passes of a few dozen objects, and the OST's
/// commits of them took a fifth of the server's CPU. Space comes back this much later.
const DESTROY_GATHER: Duration = Duration::from_millis(100);

/// An OST as the MDS reaches it: its index in the file system, the connection to its
/// OSS, and its number on that OSS.
#[derive(Clone)]
pub struct OstLink {
    pub index: u32,
    pub import: Arc<Import>,
    pub target: u32,
}

/// The precreate and destroy tasks of one MDT, by OST index; they stop when this is
/// dropped.
pub struct ObjectService {
    ns: Arc<Namespace>,
    batch: u32,
    osts: HashMap<u32, OstTasks>,
}

/// The tasks of one OST, and where they reach it (its NIDs, sorted).
struct OstTasks {
    at: Option<Vec<Nid>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OstTasks {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

impl ObjectService {
    /// No OSTs yet (see [`ObjectService::follow`]); `batch` objects asked at once.
    pub fn new(ns: Arc<Namespace>, batch: u32) -> ObjectService {
        ObjectService { ns, batch: batch.max(2), osts: HashMap::new() }
    }

    /// Attach `osts`, already connected, to the namespace and start filling their pools
    /// and destroying what removed files left. Runs on the current tokio runtime.
    pub fn start(ns: Arc<Namespace>, osts: Vec<OstLink>, batch: u32) -> ObjectService {
        let mut service = ObjectService::new(ns, batch);
        for link in osts {
            let (ns, batch) = (service.ns.clone(), service.batch);
            let task = tokio::spawn(serve(ns, link.clone(), batch));
            service.osts.insert(link.index, OstTasks { at: None, task });
        }
        service
    }

    /// Serve the OSTs of the configuration of file system `fsname`, each (index, NIDs)
    /// target 0 of the server at the first NID that answers for it (the import walks the
    /// others when that one fails): an OST seen before at the same NIDs keeps its tasks,
    /// whatever else changed or whichever NID is listed first now; one that is new or
    /// moved gets new ones, which connect through `client` (trying again each second
    /// until it answers); one no longer listed is let go.
    pub fn follow(&mut self, client: &Client, fsname: &str, osts: &[(u32, Vec<Nid>)]) {
        self.osts.retain(|index, _| osts.iter().any(|(i, _)| i == index));
        for (index, nids) in osts {
            let mut set = nids.clone();
            set.sort();
            if self.osts.get(index).is_some_and(|t| t.at.as_ref() == Some(&set)) {
                continue;
            }
            let (ns, client, batch, index) = (self.ns.clone(), client.clone(), self.batch, *index);
            let (name, nids) = (TargetKind::Ost.name(fsname, index), nids.clone());
            let task = tokio::spawn(async move {
                let import = loop {
                    match client.connect_any(&name, &nids).await {
                        Ok(i) => break i,
                        Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                    }
                };
                serve(ns, OstLink { index, import, target: 0 }, batch).await
            });
            // Replacing the entry drops (aborts) the tasks that reached it elsewhere.
            self.osts.insert(index, OstTasks { at: Some(set), task });
        }
    }
}

/// Keep the pool of `link`'s OST full and destroy the objects removed files left there.
async fn serve(ns: Arc<Namespace>, link: OstLink, batch: u32) {
    tokio::join!(precreate(ns.clone(), link.clone(), batch), destroy(ns, link));
}

async fn precreate(ns: Arc<Namespace>, link: OstLink, batch: u32) {
    // Attached through group commit first, so its pool exists and survives restarts.
    loop {
        let (ns2, ost) = (ns.clone(), link.index);
        match blocking(move || ns2.attach_osts(&[ost])).await {
            Some(Ok(())) => break,
            Some(Err(_)) => tokio::time::sleep(Duration::from_millis(500)).await,
            None => return,
        }
    }
    cleanup_orphans(&ns, &link).await;
    loop {
        if ns.has_stale(link.index) {
            // Replays are over: what they did not claim of the objects from before this
            // start goes to the destroy log.
            let (ns2, ost) = (ns.clone(), link.index);
            match blocking(move || ns2.retire_stale(ost)).await {
                Some(Ok(_)) => continue,
                Some(Err(_)) => tokio::time::sleep(Duration::from_millis(500)).await,
                None => return,
            }
        }
        // Read from memory: no blocking thread for it (two thread wake-ups per look).
        let level = ns.pool_levels().into_iter().find(|(o, _)| *o == link.index).map(|l| l.1);
        let Some(level) = level else { return };
        if level >= batch as u64 / 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        // Objects in this MDT's own group: no other MDT's cleanup reaches them.
        let (op, body) = Request::Create { target: link.target, count: batch, group: ns.index() }.encode();
        let made = match link.import.call(op, &body, &[]).await {
            Ok(f) if f.header.status == 0 => ost::decode_created(&f.body).ok(),
            _ => None,
        };
        let Some((first, count)) = made else {
            // The OSS is away or refusing: try again later, files meanwhile use the rest.
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let ns2 = ns.clone();
        let ost = link.index;
        match blocking(move || ns2.add_precreated(ost, first, count as u64)).await {
            Some(Ok(())) => {}
            Some(Err(_)) => {
                // Made but not recorded: have them destroyed rather than leaked, and
                // slow down.
                let ns2 = ns.clone();
                let _ = blocking(move || ns2.discard_objects(ost, first, count as u64)).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            None => return,
        }
    }
}

/// Objects the OST made for this MDT's precreates but that never reached its pool (the
/// answer was lost, or the MDS stopped in between) are orphans: every id from the end of
/// the last recorded range up to the OST's next one. They go to the destroy log, as
/// Lustre's MDS has the OST destroy its orphans when they reconnect; while replays are
/// expected, only once they are over (a lost create may have been given some, and its
/// replay claims them). An OST this MDT has never precreated on is left alone (its
/// objects are not ours).
async fn cleanup_orphans(ns: &Arc<Namespace>, link: &OstLink) {
    let (op, body) = Request::LastId { target: link.target, group: ns.index() }.encode();
    let next = match link.import.call(op, &body, &[]).await {
        Ok(f) if f.header.status == 0 && f.body.len() == 8 => {
            u64::from_le_bytes(f.body[..8].try_into().unwrap_or([0; 8]))
        }
        _ => return,
    };
    loop {
        let (ns2, ost) = (ns.clone(), link.index);
        if !matches!(blocking(move || ns2.reclaim_orphans(ost, next)).await, Some(Ok(true))) {
            return;
        }
    }
}

async fn destroy(ns: Arc<Namespace>, link: OstLink) {
    loop {
        // Read from memory, as the pool's level is.
        let Ok(pending) = ns.pending_destroys(Some(link.index), DESTROY_PASS) else { return };
        if pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        // Whether each object existed or was gone already (a pass repeated after a
        // crash), it is destroyed now.
        let oids: Vec<u64> = pending.iter().map(|p| p.1).collect();
        let (op, body) = Request::DestroyMany { target: link.target, oids }.encode();
        let destroyed = match link.import.call(op, &body, &[]).await {
            Ok(f) if f.header.status == 0 => ost::decode_destroyed(&f.body, pending.len()).is_ok(),
            _ => false,
        };
        if !destroyed {
            // Not now: try again on a later pass.
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let full = pending.len() == DESTROY_PASS;
        let ns2 = ns.clone();
        if blocking(move || ns2.destroyed(pending)).await.is_none() {
            return;
        }
        if !full {
            // Let the next batch gather rather than pay a transaction on the OST for
            // every few objects.
            tokio::time::sleep(DESTROY_GATHER).await;
        }
    }
}
