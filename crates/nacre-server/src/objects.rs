//! The MDS's side of OST objects: keeping every OST's pool of precreated objects full, and
//! destroying the objects of removed files.
//!
//! Files take objects from the pools inside their create's transaction
//! ([`crate::mdt::Namespace`]), so a create never waits on an OST. Here a task per OST asks
//! its OSS for a batch (`precreate_batch`, 1,024 as on Helma) whenever the pool falls below
//! half a batch, and records the new objects in the namespace before any file can take
//! them. Another task reads the namespace's destroy log — written in the same
//! transaction that removed the file, so it survives restarts — destroys the objects on
//! their OSTs and then drops them from the log. An object already gone counts as
//! destroyed, so a destroy repeated after a crash is harmless.

use std::sync::Arc;
use std::time::Duration;

use nacre_net::client::Import;
use nacre_proto::ost::{self, Request};

use crate::mdt::Namespace;

/// Objects asked of an OSS at once (Lustre's `precreate_batch`, 1,024 on Helma).
pub const PRECREATE_BATCH: u32 = 1024;
/// Objects destroyed per pass of the destroy task.
const DESTROY_PASS: usize = 256;
/// Lustre's ENOENT, negated as a reply status.
const ENOENT: i32 = -2;

/// An OST as the MDS reaches it: its index in the file system, the connection to its
/// OSS, and its number on that OSS.
#[derive(Clone)]
pub struct OstLink {
    pub index: u32,
    pub import: Arc<Import>,
    pub target: u32,
}

/// The precreate and destroy tasks of one MDT; they stop when this is dropped.
pub struct ObjectService {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ObjectService {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

impl ObjectService {
    /// Attach `osts` to the namespace and start filling their pools and destroying what
    /// removed files left. Runs on the current tokio runtime.
    pub fn start(ns: Arc<Namespace>, osts: Vec<OstLink>, batch: u32) -> ObjectService {
        let batch = batch.max(2);
        let mut tasks = Vec::new();
        for link in osts.clone() {
            let ns = ns.clone();
            tasks.push(tokio::spawn(async move { precreate(ns, link, batch).await }));
        }
        tasks.push(tokio::spawn(async move { destroy(ns, osts).await }));
        ObjectService { tasks }
    }
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
        let ns2 = ns.clone();
        let level = blocking(move || ns2.pool_levels())
            .await
            .and_then(|l| l.into_iter().find(|(o, _)| *o == link.index))
            .map(|l| l.1);
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

async fn destroy(ns: Arc<Namespace>, osts: Vec<OstLink>) {
    loop {
        // OST by OST, so that one that does not answer holds up only its own objects.
        let mut any = false;
        for link in &osts {
            let (ns2, ost) = (ns.clone(), link.index);
            let Some(Ok(pending)) = blocking(move || ns2.pending_destroys(Some(ost), DESTROY_PASS)).await else {
                return;
            };
            let mut done = Vec::with_capacity(pending.len());
            for (ost, oid) in pending {
                let (op, body) = Request::Destroy { target: link.target, oid }.encode();
                match link.import.call(op, &body, &[]).await {
                    Ok(f) if f.header.status == 0 || f.header.status == ENOENT => done.push((ost, oid)),
                    // Not now: try again on a later pass.
                    _ => break,
                }
            }
            any |= !done.is_empty();
            let ns2 = ns.clone();
            if blocking(move || ns2.destroyed(done)).await.is_none() {
                return;
            }
        }
        if !any {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
