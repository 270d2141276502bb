//! The lease on shared drives (multi-mount protection): taken only when free or expired,
//! refused with the holder's name, lost by a node that cannot renew it, and then every
//! write of that node refused.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nacre_raid::lease::{LEASE_OFFSET, MoveWhy, NODE_MAX, Taken, ask_move, holder};
use nacre_raid::{
    BlockDevice, CreateOptions, FencedDrive, Held, LeaseError, LeaseOptions, Level, MemDrive, Volume, VolumeOptions,
};

fn drives(n: usize) -> (Vec<Arc<MemDrive>>, Vec<Arc<dyn BlockDevice>>) {
    drives_of(n, 4 << 20)
}

fn drives_of(n: usize, bytes: u64) -> (Vec<Arc<MemDrive>>, Vec<Arc<dyn BlockDevice>>) {
    let mem: Vec<Arc<MemDrive>> = (0..n).map(|i| MemDrive::new(&format!("d{i}"), bytes)).collect();
    let dyns = mem.iter().map(|d| d.clone() as Arc<dyn BlockDevice>).collect();
    (mem, dyns)
}

/// Short times, so that a test waits tens of milliseconds, not seconds.
fn opts(node: &str, interval_ms: u64, expiry_ms: u64) -> LeaseOptions {
    LeaseOptions {
        node: node.into(),
        interval: Duration::from_millis(interval_ms),
        expiry: Duration::from_millis(expiry_ms),
    }
}

fn write_through(d: &[Arc<dyn BlockDevice>]) -> std::io::Result<()> {
    let buf = nacre_raid::align::AlignedBuf::zeroed(4096);
    d[0].write_at(&buf, 2 << 20)
}

#[test]
fn a_held_lease_is_refused_with_its_holders_name_and_a_released_one_is_taken_at_once() {
    let (_mem, d) = drives(4);
    let err = Held::acquire_expired(d.clone(), &opts("oss2", 10, 200)).err().unwrap();
    assert!(matches!(err, LeaseError::NotHeld(Taken::Free)), "{err}");
    let a = Held::acquire(d.clone(), &opts("oss1", 10, 200)).unwrap();
    assert_eq!((a.fence().epoch(), a.taken()), (1, &Taken::Free));
    let err = Held::acquire(d.clone(), &opts("oss2", 10, 200)).err().expect("a live lease is refused");
    assert!(matches!(&err, LeaseError::Held { node, .. } if node == "oss1"), "{err}");
    assert!(err.to_string().contains("held by node oss1"), "{err}");
    let seen = holder(&d).unwrap().unwrap();
    assert_eq!((seen.node.as_str(), seen.epoch, seen.released), ("oss1", 1, false));

    drop(a);
    assert!(holder(&d).unwrap().unwrap().released, "a clean stop releases the drives");
    // A standby takes over from a holder that died, not from one that stopped.
    let err = Held::acquire_expired(d.clone(), &opts("oss2", 10, 200)).err().unwrap();
    assert!(matches!(err, LeaseError::NotHeld(Taken::Released { .. })), "{err}");
    let b = Held::acquire(d.clone(), &opts("oss2", 10, 200)).unwrap();
    assert_eq!(b.taken(), &Taken::Released { node: "oss1".into() }, "a released lease needs no watch");
    assert_eq!(b.fence().epoch(), 2);
    assert_eq!(holder(&d).unwrap().unwrap().node, "oss2");
}

#[test]
fn a_silent_holder_is_taken_over_only_after_expiry_and_then_writes_nothing() {
    let (mem, d) = drives(4);
    let a = Held::acquire(d.clone(), &opts("oss1", 10, 300)).unwrap();
    let a_drives = FencedDrive::wrap(d.clone(), a.fence());
    write_through(&a_drives).expect("the holder writes");
    let (tx, rx) = std::sync::mpsc::channel();
    a.on_lost(move |why| {
        let _ = tx.send(why.to_string());
    });
    // oss1 stops beating, as a hung node.
    a.stall(Duration::from_secs(3600));
    let started = Instant::now();
    let b = Held::acquire_expired(d.clone(), &opts("oss2", 10, 300)).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300), "taken after {:?}, before the expiry", started.elapsed());
    assert_eq!((b.fence().epoch(), b.taken()), (2, &Taken::Expired { node: "oss1".into() }));

    // oss1's writes were refused from before oss2 could take the drives.
    let before = snapshot(&mem);
    let err = write_through(&a_drives).unwrap_err();
    assert!(err.to_string().contains("no longer holds the lease"), "{err}");
    assert_eq!(snapshot(&mem), before, "a fenced node changed the drives");
    let why = rx.recv_timeout(Duration::from_secs(5)).expect("the holder is told it lost the lease");
    assert!(why.contains("not renewed in time"), "{why}");
    // oss2 keeps the drives: the old holder's heartbeat, woken, does not write either.
    drop(a);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(holder(&d).unwrap().unwrap().node, "oss2");
    write_through(&FencedDrive::wrap(d.clone(), b.fence())).expect("the new holder writes");
}

fn snapshot(mem: &[Arc<MemDrive>]) -> Vec<Vec<u8>> {
    mem.iter()
        .map(|m| {
            let mut buf = nacre_raid::align::AlignedBuf::zeroed(4096);
            m.read_at(&mut buf, 2 << 20).unwrap();
            buf.to_vec()
        })
        .collect()
}

#[test]
fn a_holder_that_loses_its_drives_fences_itself() {
    let (mem, d) = drives(4);
    let a = Held::acquire(d.clone(), &opts("oss1", 10, 200)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    a.on_lost(move |why| {
        let _ = tx.send(why.to_string());
    });
    // One drive failing is the RAID's business: a majority still takes the heartbeat.
    mem[0].set_failed(true);
    std::thread::sleep(Duration::from_millis(300));
    assert!(a.fence().lost().is_none(), "{:?}", a.fence().lost());
    // Three of four gone: the lease can no longer be renewed.
    mem[1].set_failed(true);
    mem[2].set_failed(true);
    let why = rx.recv_timeout(Duration::from_secs(5)).expect("fenced");
    assert!(why.contains("reached 1 of 4 drives"), "{why}");
    for m in &mem {
        m.set_failed(false);
    }
    let fenced = FencedDrive::wrap(d.clone(), a.fence());
    assert!(write_through(&fenced).is_err());
}

#[test]
fn a_node_whose_lease_was_taken_while_it_was_stopped_steps_down_at_its_next_heartbeat() {
    let (_mem, d) = drives(3);
    let a = Held::acquire(d.clone(), &opts("oss1", 10, 100)).unwrap();
    a.stall(Duration::from_millis(400));
    let b = Held::acquire(d.clone(), &opts("oss2", 10, 100)).unwrap();
    // oss1 wakes: its next heartbeat finds the lease expired, and writes nothing.
    std::thread::sleep(Duration::from_millis(300));
    assert!(a.fence().lost().is_some());
    assert_eq!(holder(&d).unwrap().unwrap().node, "oss2");
    assert!(b.fence().lost().is_none(), "the new holder keeps beating: {:?}", b.fence().lost());
}

#[test]
fn a_lease_block_with_a_bad_checksum_is_held_never_free_and_named() {
    let (mem, d) = drives(4);
    drop(Held::acquire(d.clone(), &opts("oss1", 10, 300)).unwrap());
    // Released, then damaged on one drive: the damage must not read as free.
    mem[2].corrupt(LEASE_OFFSET + 100, 4);
    let started = Instant::now();
    let b = Held::acquire(d.clone(), &opts("oss2", 10, 300)).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300), "a damaged block was taken at once");
    assert_eq!(b.taken(), &Taken::Expired { node: "(unknown)".into() });
    let note = b.notes().join("\n");
    assert!(note.contains("mem:d2") && note.contains("bad checksum") && note.contains("held"), "{note}");
    // The taker's block is on every drive now, the damaged one too.
    assert_eq!(holder(&d).unwrap().unwrap().node, "oss2");
}

/// Take the drives as a node's monitor does: a race lost is tried again after a pause,
/// a live holder ends the attempt.
fn take(d: Vec<Arc<dyn BlockDevice>>, o: &LeaseOptions, jitter: u64) -> Result<Held, LeaseError> {
    loop {
        match Held::acquire(d.clone(), o) {
            Err(LeaseError::Raced { .. }) => std::thread::sleep(Duration::from_millis(1 + jitter)),
            r => return r,
        }
    }
}

/// Bytes each racer writes over and over to the volume while it holds the lease.
const RACED: usize = 256 << 10;

/// Serve the RAID6 volume `v` on `d` under lease `held`, as a node does: assembled on the
/// fenced drives, its first [`RACED`] bytes written with `fill` until the lease is lost or
/// a few rounds are done.
fn serve_volume(d: Vec<Arc<dyn BlockDevice>>, held: &Held, fill: u8) {
    let Ok(assembled) = Volume::assemble(FencedDrive::wrap(d, held.fence()), Some("v"), &VolumeOptions::default())
    else {
        return;
    };
    let data = vec![fill; RACED];
    for _ in 0..5 {
        if assembled.volume.write(0, &data).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn two_nodes_racing_for_the_same_drives_end_with_one_holder_and_a_clean_volume_every_time() {
    for race in 0..100 {
        let (mem, d) = drives_of(6, 2 << 20);
        drop(Volume::create(d.clone(), &CreateOptions::new("v", Level::Raid6), &VolumeOptions::default()).unwrap());
        let go = Arc::new(Barrier::new(2));
        let racers: Vec<_> = [("oss1", 0, 1u8), ("oss2", 7, 2u8)]
            .into_iter()
            .map(|(node, jitter, fill)| {
                let (d, go) = (d.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    let held = take(d.clone(), &opts(node, 5, 40), jitter)?;
                    serve_volume(d, &held, fill);
                    Ok((held, node, fill))
                })
            })
            .collect();
        let results: Vec<Result<(Held, &str, u8), LeaseError>> =
            racers.into_iter().map(|t| t.join().unwrap()).collect();
        let fills: Vec<(&str, u8)> = results.iter().flatten().map(|(_, node, fill)| (*node, *fill)).collect();
        let results: Vec<Result<Held, LeaseError>> = results.into_iter().map(|r| r.map(|(h, ..)| h)).collect();
        std::thread::sleep(Duration::from_millis(30));
        let winners: Vec<&Held> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        let serving: Vec<&&Held> = winners.iter().filter(|h| h.fence().lost().is_none()).collect();
        let errors: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().map(|e| e.to_string())).collect();
        assert_eq!(serving.len(), 1, "race {race}: {errors:?}");
        // A claim that landed late may take the drives from a node that had them: then the
        // first stopped writing before the second began.
        if let [a, b] = winners[..] {
            let (first, second) = if a.fence().lost().is_some() { (a, b) } else { (b, a) };
            let (ended, began) = (first.fence().window().1.expect("stepped down"), second.fence().window().0);
            assert!(ended <= began, "race {race}: two writers for {:?}", ended - began);
        }
        // The holder's claim is on every drive.
        let blocks: Vec<_> =
            mem.iter().map(|m| holder(&[m.clone() as Arc<dyn BlockDevice>]).unwrap().unwrap()).collect();
        assert!(
            blocks.windows(2).all(|w| w[0].node == w[1].node && w[0].epoch == w[1].epoch),
            "race {race}: {blocks:?}"
        );
        assert_eq!(blocks[0].epoch, serving[0].fence().epoch());
        // The volume is whole: parity agrees everywhere, and its bytes are the holder's.
        let holder_fill = fills.iter().find(|(n, _)| *n == blocks[0].node).map(|(_, f)| *f).unwrap();
        drop(results);
        let v = Volume::assemble(d, Some("v"), &VolumeOptions::default()).unwrap().volume;
        let report = v.scrub(false, |_, _| {}).unwrap();
        assert_eq!((report.mismatches, report.unchecked), (0, 0), "race {race}: {report:?}");
        let mut back = vec![0u8; RACED];
        v.read(0, &mut back).unwrap();
        assert!(back.iter().all(|b| *b == holder_fill), "race {race}: bytes of another node than the holder");
    }
}

#[test]
fn a_volume_on_fenced_drives_refuses_every_write_once_the_lease_is_gone() {
    let (_mem, d) = drives(6);
    let a = Held::acquire(d.clone(), &opts("oss1", 10, 100)).unwrap();
    let fenced = FencedDrive::wrap(d.clone(), a.fence());
    let v = Volume::create(fenced, &CreateOptions::new("v", Level::Raid6), &VolumeOptions::default()).unwrap();
    let data = vec![7u8; 256 << 10];
    v.write(0, &data).unwrap();
    a.stall(Duration::from_secs(3600));
    std::thread::sleep(Duration::from_millis(150));
    let err = v.write(256 << 10, &data).unwrap_err();
    assert!(err.to_string().contains("no longer holds the lease"), "{err}");
    // What was written before reads back, from the shared drives, by the next holder.
    drop(v);
    let b = Held::acquire(d.clone(), &opts("oss2", 10, 100)).unwrap();
    let v = Volume::assemble(FencedDrive::wrap(d, b.fence()), Some("v"), &VolumeOptions::default()).unwrap().volume;
    let mut back = vec![0u8; 256 << 10];
    v.read(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn bad_settings_are_refused_by_name() {
    let (_mem, d) = drives(2);
    for (o, what) in [(opts("", 10, 100), "node name"), (opts("x", 0, 100), "interval"), (opts("x", 10, 30), "expiry")]
    {
        let err = Held::acquire(d.clone(), &o).err().unwrap();
        assert!(err.to_string().contains(what), "{err}");
    }
    assert!(holder(&d).unwrap().is_none(), "a refused acquire wrote nothing");
}

/// A move (`nacre failover`): a request for the holder's epoch reaches it at its next
/// renewal (one for an older epoch is ignored); it hands the drives to the named node,
/// which takes them at once, while any other node watches them as that node's for the
/// expiry. The holder writes nothing once it let go, and is not told it lost anything.
#[test]
fn a_move_request_reaches_the_holder_and_the_named_node_takes_the_drives_at_once() {
    let (_mem, d) = drives(3);
    let a = Held::acquire(d.clone(), &opts("oss1", 10, 400)).unwrap();
    let a_drives = FencedDrive::wrap(d.clone(), a.fence());
    let (tx, rx) = std::sync::mpsc::channel();
    a.on_lost(move |why| {
        let _ = tx.send(why.to_string());
    });
    ask_move(&d, 0, "oss2", MoveWhy::Operator).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(a.move_asked(), None, "a request for another epoch moves nothing");
    ask_move(&d, a.fence().epoch(), "oss2", MoveWhy::Unreachable).unwrap();
    let started = Instant::now();
    while a.move_asked().is_none() && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let asked = a.move_asked().unwrap();
    assert_eq!((asked.to.as_str(), asked.why), ("oss2", MoveWhy::Unreachable));
    a.hand_to("oss2");
    let err = write_through(&a_drives).unwrap_err();
    assert!(err.to_string().contains("released"), "{err}");
    let seen = holder(&d).unwrap().unwrap();
    assert_eq!((seen.released, seen.to.as_str()), (true, "oss2"));

    // A third node watches the drives as oss2's: it gives up as soon as oss2 claims them.
    let d3 = d.clone();
    let third = std::thread::spawn(move || Held::acquire(d3, &opts("oss3", 10, 400)).err());
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    let b = Held::acquire_expired(d.clone(), &opts("oss2", 10, 400)).unwrap();
    assert!(started.elapsed() < Duration::from_millis(400), "no watch for the named node: {:?}", started.elapsed());
    assert_eq!(b.taken(), &Taken::Handed { from: "oss1".into(), to: "oss2".into() });
    assert_eq!(b.fence().epoch(), 2);
    let err = third.join().unwrap().expect("the third node does not take the drives");
    assert!(matches!(&err, LeaseError::Held { node, .. } if node == "oss2"), "{err}");
    assert!(rx.try_recv().is_err(), "a holder that let go on purpose is not told it lost the lease");
    assert_eq!(ask_move(&d, 2, "", MoveWhy::Operator), Err(format!("node name \"\": 1 to {NODE_MAX} bytes")));
}

/// Drives handed to a node that never takes them are taken by another after the expiry.
#[test]
fn drives_handed_to_a_node_that_never_comes_are_taken_after_the_expiry() {
    let (_mem, d) = drives(3);
    let a = Held::acquire(d.clone(), &opts("oss1", 10, 300)).unwrap();
    a.hand_to("oss2");
    let started = Instant::now();
    let c = Held::acquire_expired(d.clone(), &opts("oss3", 10, 300)).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300), "taken after {:?}", started.elapsed());
    assert_eq!(c.taken(), &Taken::Handed { from: "oss1".into(), to: "oss2".into() });
}

/// A process whose first thread has exited (it shows as a zombie) while another of its
/// threads still runs is not gone: that thread could still write, and still holds the
/// process's files and locks. Gone only once its last thread has ended.
#[test]
fn a_process_is_gone_only_when_its_last_thread_is() {
    extern "C" fn linger(_: *mut libc::c_void) -> *mut libc::c_void {
        let t = libc::timespec { tv_sec: 1, tv_nsec: 500_000_000 };
        // SAFETY: nanosleep on a valid timespec.
        unsafe { libc::nanosleep(&t, std::ptr::null_mut()) };
        std::ptr::null_mut()
    }
    // SAFETY: the child calls only pthread_create, nanosleep and raw exits, allocating
    // nothing of the parent's heap; the parent waits for it below.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: see above; the first thread ends alone (exit, not exit_group).
        unsafe {
            let mut t: libc::pthread_t = std::mem::zeroed();
            if libc::pthread_create(&mut t, std::ptr::null(), linger, std::ptr::null_mut()) != 0 {
                libc::_exit(2);
            }
            libc::syscall(libc::SYS_exit, 0);
        }
        unreachable!("the first thread has exited");
    }
    let pid_u = u32::try_from(pid).expect("a fork's pid is positive");
    let stat = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = || stat().rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    let start = Instant::now();
    while !zombie() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(zombie(), "the first thread of {pid} should have exited: {}", stat());
    let lingering = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);
    let early = nacre_raid::lease::process_gone(pid_u);
    // Its other thread ends within 1.5 s; then it is gone, before and after it is reaped.
    while !nacre_raid::lease::process_gone(pid_u) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let late = nacre_raid::lease::process_gone(pid_u);
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(lingering, 2, "right after its first thread exits, the child has that one and its sleeper");
    assert!(!early, "process {pid} counted gone while one of its threads still ran");
    assert!(late, "process {pid} should count as gone once its last thread ended");
    assert!(nacre_raid::lease::process_gone(pid_u), "a reaped process is gone");
}
