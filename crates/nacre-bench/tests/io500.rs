//! IO500's phases, small: on a folder of the local file system, on Nacre through the
//! client library (a whole file system served from this process), and with a planted
//! corruption that the read phase must catch.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nacre_bench::client::{ClientBenchOptions, serve};
use nacre_bench::io500::native::Native;
use nacre_bench::io500::storage::{Entry, Handle, Meta, Open};
use nacre_bench::io500::{self, Io500Options, Io500Report, Posix, Storage};
use nacre_client::{FileSystem, MountOptions};

fn scratch(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("nacre-io500-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// Small settings: every phase does a little of everything, in about a second.
fn tiny(tasks: usize) -> Io500Options {
    let mut o = Io500Options::new(tasks);
    o.stonewall = Duration::from_millis(200);
    o.ior_easy_transfer = 256 << 10;
    o.ior_easy_bytes = 2 << 20;
    o.ior_hard_segments = 40;
    o.mdtest_easy_files = 150;
    o.mdtest_hard_files = 120;
    o.run_dir = "run".into();
    o
}

/// What every complete run must show, whatever it ran on.
fn check(r: &Io500Report, o: &Io500Options) {
    let names: Vec<&str> = r.results.iter().map(|p| p.name).collect();
    assert_eq!(names, io500::PHASES, "every phase, in IO500's order");
    for p in &r.results {
        assert!(p.value > 0.0 && p.seconds > 0.0, "{p:?}");
        assert_eq!(p.scored, p.name != "ior-rnd4K-easy-read");
    }
    let amount = |n: &str| r.phase(n).unwrap().amount;
    // Reads, stats and deletes cover exactly what the writes made; wear-out makes the
    // tasks equal.
    assert_eq!(amount("ior-easy-read"), amount("ior-easy-write"));
    assert_eq!(amount("ior-hard-read"), amount("ior-hard-write"));
    for (w, others) in [
        ("mdtest-easy-write", &["mdtest-easy-stat", "mdtest-easy-delete"][..]),
        ("mdtest-hard-write", &["mdtest-hard-read", "mdtest-hard-stat", "mdtest-hard-delete"][..]),
    ] {
        assert_eq!(amount(w) % o.tasks as u64, 0, "{w}: every task made as many");
        for other in others {
            assert_eq!(amount(other), amount(w), "{other}");
        }
    }
    assert_eq!(amount("ior-hard-write") % (o.tasks as u64 * io500::IOR_HARD_TRANSFER as u64), 0);
    // find looked at every file and directory of the run at that point.
    let files = o.tasks as u64 // ior-easy's, a file per task
        + 1 // ior-hard's file
        + 1 // timestamp
        + amount("mdtest-easy-write")
        + amount("mdtest-hard-write");
    let dirs = 4 + 2 + o.tasks as u64; // phase dirs, test-dirs, a tree per task
    assert_eq!(amount("find"), files + dirs);
    let s = r.score;
    assert!(s.bandwidth > 0.0 && s.iops > 0.0 && (s.total - (s.bandwidth * s.iops).sqrt()).abs() < 1e-9);
    let j = r.json();
    assert_eq!(j["phases"].as_array().unwrap().len(), 13);
    assert_eq!(j["settings"]["tasks"], o.tasks);
}

#[test]
fn every_phase_runs_on_a_local_folder_and_leaves_it_empty() {
    let dir = scratch("local");
    let s = Posix::new(&dir).unwrap();
    let o = tiny(3);
    let mut out = Vec::new();
    let r = io500::run(&s, &o, &mut out).expect("io500 runs");
    check(&r, &o);
    assert!(r.layouts.is_empty(), "no layouts on a plain folder");
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().filter(|l| l.starts_with("[RESULT]")).count(), 12, "{text}");
    assert!(text.lines().last().unwrap().starts_with("[SCORE ] Bandwidth "), "{text}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the run removed everything");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Skipping a write phase (io500.ini's `run = FALSE`) skips what reads it; the others
/// run and verify as usual, and the score is over them.
#[test]
fn a_skipped_write_phase_takes_its_reads_with_it() {
    let dir = scratch("skip");
    let s = Posix::new(&dir).unwrap();
    let o = Io500Options { skip: vec!["ior-hard-write".into(), "mdtest-easy-stat".into()], ..tiny(2) };
    let r = io500::run(&s, &o, &mut Vec::new()).expect("io500 runs");
    let ran: Vec<&str> = r.results.iter().map(|p| p.name).collect();
    for gone in ["ior-hard-write", "ior-hard-read", "mdtest-easy-stat"] {
        assert!(!ran.contains(&gone), "{gone} ran: {ran:?}");
    }
    assert_eq!(ran.len(), 10, "{ran:?}");
    assert!(ran.contains(&"mdtest-easy-delete") && ran.contains(&"find"), "{ran:?}");
    assert!(r.score.iops > 0.0 && r.score.bandwidth > 0.0);
    assert_eq!(r.json()["settings"]["skipped"].as_array().unwrap().len(), 3);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the run removed everything");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_settings_are_refused_before_anything_is_made() {
    let dir = scratch("bad");
    let s = Posix::new(&dir).unwrap();
    for bad in [
        Io500Options { tasks: 0, ..tiny(1) },
        Io500Options { ior_easy_transfer: 1000, ..tiny(1) },
        Io500Options { run_dir: "../escape".into(), ..tiny(1) },
        Io500Options { ior_easy_bytes: 1000, ..tiny(1) },
        Io500Options { mdtest_hard_files: 0, ..tiny(1) },
        Io500Options { skip: vec!["ior-hardest".into()], ..tiny(1) },
    ] {
        let e = io500::run(&s, &bad, &mut Vec::new()).expect_err("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    assert!(Posix::new(dir.join("missing")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A storage that flips one byte of ior-hard's file on the drive before it is first read.
struct Corrupting {
    inner: Posix,
    done: AtomicBool,
}

impl Storage for Corrupting {
    fn api(&self) -> &'static str {
        "posix"
    }
    fn mkdir(&self, p: &str) -> io::Result<()> {
        self.inner.mkdir(p)
    }
    fn rmdir(&self, p: &str) -> io::Result<()> {
        self.inner.rmdir(p)
    }
    fn create_empty(&self, p: &str) -> io::Result<()> {
        self.inner.create_empty(p)
    }
    fn create_with(&self, p: &str, d: &[u8]) -> io::Result<()> {
        self.inner.create_with(p, d)
    }
    fn stat(&self, p: &str) -> io::Result<Meta> {
        self.inner.stat(p)
    }
    fn read_file(&self, p: &str, max: usize, buf: &mut Vec<u8>) -> io::Result<()> {
        self.inner.read_file(p, max, buf)
    }
    fn unlink(&self, p: &str) -> io::Result<()> {
        self.inner.unlink(p)
    }
    fn list(&self, p: &str, out: &mut Vec<Entry>) -> io::Result<()> {
        self.inner.list(p, out)
    }
    fn open(&self, p: &str, how: Open) -> io::Result<Box<dyn Handle>> {
        if how == Open::Read && p.ends_with("ior-hard/IOR_file") && !self.done.swap(true, Ordering::SeqCst) {
            // A byte in the middle of the third transfer.
            let at = 2 * io500::IOR_HARD_TRANSFER as u64 + 1234;
            let mut h = self.inner.open(p, Open::Write)?;
            let mut r = self.inner.open(p, Open::Read)?;
            let mut b = [0u8];
            r.read_at(at, &mut b)?;
            h.write_at(at, &[b[0] ^ 0x40])?;
            h.close(true)?;
        }
        self.inner.open(p, how)
    }
}

#[test]
fn ior_hard_read_catches_a_flipped_byte() {
    let dir = scratch("corrupt");
    let s = Corrupting { inner: Posix::new(&dir).unwrap(), done: AtomicBool::new(false) };
    let mut o = tiny(2);
    o.ior_hard_segments = 10;
    let mut out = Vec::new();
    let e = io500::run(&s, &o, &mut out).expect_err("the read phase fails");
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    let msg = e.to_string();
    assert!(msg.starts_with("ior-hard-read: "), "{msg}");
    assert!(msg.contains(&format!("byte {} differs", 2 * io500::IOR_HARD_TRANSFER + 1234)), "{msg}");
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("ior-easy-read") && !text.contains("ior-hard-read") && !text.contains("[SCORE ]"), "{text}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "a failed run still removes its files");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_phase_runs_on_nacre_through_the_client_library_with_the_helma_layouts() {
    let dir = scratch("native");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let bench = ClientBenchOptions {
        dir: dir.join("drives"),
        local_dir: dir.clone(),
        files: 2000,
        clients: 1,
        rounds: 1,
        io_bytes: 64 << 20,
    };
    let local = rt.block_on(serve(&bench.dir, &bench)).expect("a file system");
    let fs = rt.block_on(FileSystem::mount(local.mgs(), MountOptions::default())).expect("mounted");
    let s = Arc::new(Native::new(fs.clone(), rt.handle().clone(), "/").expect("root"));
    let o = tiny(4);
    let mut out = Vec::new();
    let r = io500::run(s.as_ref(), &o, &mut out).expect("io500 runs");
    check(&r, &o);
    assert_eq!(r.api, "native");
    let layouts: Vec<String> = r.layouts.iter().map(|(d, l)| format!("{d}: {l}")).collect();
    assert_eq!(
        layouts,
        [
            "ior-easy: setstripe -c 1 -S 16M",
            "ior-hard: setstripe -C 10 -S 16M",
            "mdtest-easy: setstripe -E 1M -L mdt",
            "mdtest-hard: setstripe -E 1M -L mdt",
            "mdtest-easy: setdirstripe -D -c 1 -i -1 --max-inherit-rr 2",
            "mdtest-hard: setdirstripe -D -c -1",
        ],
        "io500.sh's preparation on Helma; overstriping five per OST (two here)"
    );
    // Nothing left in the file system's root.
    let (entries, _) =
        rt.block_on(fs.readdir(&nacre_client::Creds::default(), nacre_client::Fid::ROOT, 0, 100)).unwrap();
    let names: Vec<&str> = entries.iter().map(|(e, _)| e.name.as_str()).filter(|n| *n != "." && *n != "..").collect();
    assert!(names.is_empty(), "{names:?}");
    drop(s);
    rt.block_on(fs.unmount());
    drop(local);
    drop(rt);
    std::fs::remove_dir_all(&dir).unwrap();
}
