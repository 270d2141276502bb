//! `nacre bench …`: benchmarks of the services' layers, each against its raw reference in
//! the same run. `ost` is the object store's obdfilter-survey; `mdt` the metadata engine
//! alone, measured with the process's counting allocator ([`crate::heap`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use nacre_bench::client::{ClientBenchOptions, run_client_bench};
use nacre_bench::mds::{MdsBenchOptions, run_mds_bench};
use nacre_bench::mdt::{HeapCounter, MdtBenchOptions, run_mdt_bench};
use nacre_bench::ost::{OstBenchOptions, run_ost_bench};

use crate::size::parse_size;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Object write, rewrite and read on a target (RAID6 8+2 data, RAID1 index) against
    /// the raw data volume, and 47,008-byte interleaved writes; one JSON line at the end.
    Ost {
        /// Folder for the drive files (removed afterwards).
        #[arg(long, default_value = "/tmp")]
        dir: PathBuf,
        /// Bytes each large phase moves.
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        /// Threads (one object each).
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// Rounds; the best of each phase is kept.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Bytes per large IO (`brw_size`).
        #[arg(long, default_value = "16M", value_parser = parse_size)]
        brw_size: u64,
        /// Objects of 3,901 bytes the small-objects space phase makes.
        #[arg(long, default_value_t = 10_000)]
        small_objects: u32,
    },
    /// Create, stat and unlink rates of one MDT served over loopback to N clients, against
    /// the local file system doing the same with N threads and the transport's ping RPC, in
    /// the same run; one JSON line at the end.
    Mds {
        /// Folder for the MDT's drive files (/dev/shm: the CPU-bound case).
        #[arg(long, default_value = "/dev/shm")]
        dir: PathBuf,
        /// The local file system the reference runs on.
        #[arg(long, default_value = "/tmp")]
        local_dir: PathBuf,
        /// Files per phase, over all clients.
        #[arg(long, default_value_t = 40_000)]
        files: u64,
        /// Concurrent clients (and reference threads).
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Rounds; the best of each phase is kept.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Also measure durable creates with the drives in this folder (a disk), against
        /// local creates that fsync their directory.
        #[arg(long)]
        durable_dir: Option<PathBuf>,
        /// `mdt.*.sync_on_reply`: 0 (the MDS's default) answers a change once applied and
        /// staged in the log, the client keeping it for replay; 1 once it is on the drives
        /// (durable creates always wait).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
        sync_on_reply: u8,
    },
    /// The MDT's engine in process, no transport: N threads creating, stating, renaming
    /// and unlinking, against the local file system with N threads in the same run; the
    /// memory an MDT holds per file and the start-up time of one of `--startup-files`
    /// files; one JSON line at the end.
    Mdt {
        /// Folder for the MDT's drive files (/dev/shm: the CPU-bound case).
        #[arg(long, default_value = "/dev/shm")]
        dir: PathBuf,
        /// The local file system the reference runs on.
        #[arg(long, default_value = "/tmp")]
        local_dir: PathBuf,
        /// Files per phase, over all threads.
        #[arg(long, default_value_t = 40_000)]
        files: u64,
        /// Threads, each in its own directory (and as many reference threads).
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// Rounds; the best of each phase is kept.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Files of the MDT whose memory per file and start-up are measured (made at
        /// the engine's rate, 12-19K/s on 2 cores: lower it for a quicker run; the
        /// start-up time is also given per million files).
        #[arg(long, default_value_t = 1_000_000)]
        startup_files: u64,
        /// Changes answer once on the drives (`mdt.*.sync_on_reply=1`), not once applied
        /// in memory and staged in the log.
        #[arg(long)]
        sync_on_reply: bool,
    },
    /// The client library with no kernel in between: a whole file system served from this
    /// process over loopback, creates, stats, unlinks and sequential IO through
    /// `nacre-client`, against the local file system with as many threads.
    Client {
        /// Folder for the drive files.
        #[arg(long, default_value = "/dev/shm")]
        dir: PathBuf,
        /// The local file system the reference runs on.
        #[arg(long, default_value = "/tmp")]
        local_dir: PathBuf,
        /// Files per phase, over all clients.
        #[arg(long, default_value_t = 8000)]
        files: u64,
        /// Concurrent tasks (and reference threads).
        #[arg(long, default_value_t = 4)]
        clients: usize,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Bytes each task writes and reads back.
        #[arg(long, default_value = "64M", value_parser = crate::size::parse_size)]
        io_size: u64,
    },
    /// A failover pair (`nacre up --ha`) under a load of writers through its mount: the
    /// node serving the MDT is killed, comes back as a standby, then its partner is
    /// stopped (a hung node) and resumed. The longest pause a writer saw, every
    /// acknowledged file read back, and races of two takers for the same drives; one JSON
    /// line at the end.
    Failover {
        /// Folder for the bench's file system (removed afterwards).
        #[arg(long, default_value = "/tmp")]
        dir: PathBuf,
        /// Programs writing files through the mount (each writes, fsyncs, closes).
        #[arg(long, default_value_t = 4)]
        writers: usize,
        /// Seconds of load between events.
        #[arg(long, default_value_t = 5)]
        settle: u64,
        /// Races of two takers for one set of drives.
        #[arg(long, default_value_t = 100)]
        races: usize,
    },
    /// Many clients mounting one file system at once (a mount storm): a `nacre up` in a
    /// folder of its own, and N simulated clients in this process, each a whole mount. How
    /// long until all were mounted, the tries that failed, and the server's memory per
    /// client; one JSON line at the end.
    Storm {
        /// Folder for the bench's file system (removed afterwards).
        #[arg(long, default_value = "/tmp")]
        dir: PathBuf,
        /// Simulated clients, all mounting at once (each holds two descriptors here and
        /// two in the server).
        #[arg(long, default_value_t = 2000)]
        clients: usize,
        /// Seconds the mounted clients idle before they unmount.
        #[arg(long, default_value_t = 10)]
        idle: u64,
    },
}

pub fn run(cmd: BenchCommand) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        BenchCommand::Ost { dir, size, threads, rounds, brw_size, small_objects } => {
            if !(1..=256).contains(&threads) || !(1..=100).contains(&rounds) {
                return Err("--threads must be 1 to 256 and --rounds 1 to 100".into());
            }
            if !(4096..=16 << 20).contains(&brw_size) || !brw_size.is_multiple_of(4096) {
                return Err(format!("--brw-size {brw_size}: a multiple of 4K from 4K to 16M").into());
            }
            if !(threads as u32..=1_000_000).contains(&small_objects) {
                return Err(format!("--small-objects {small_objects}: from --threads to 1,000,000").into());
            }
            let mut o = OstBenchOptions::new(dir);
            o.small_objects = small_objects;
            o.size = size;
            o.threads = threads;
            o.rounds = rounds;
            o.brw = brw_size;
            let figures = run_ost_bench(&o, &mut std::io::stdout())?;
            println!("{}", serde_json::to_string(&figures)?);
            Ok(())
        }
        BenchCommand::Mds { dir, local_dir, files, clients, rounds, durable_dir, sync_on_reply } => {
            if !(1..=1024).contains(&clients) || !(1..=100).contains(&rounds) {
                return Err("--clients must be 1 to 1024 and --rounds 1 to 100".into());
            }
            if !(clients as u64..=10_000_000).contains(&files) {
                return Err(format!("--files {files}: at least --clients and at most 10,000,000").into());
            }
            let mut o = MdsBenchOptions::new(dir);
            o.local_dir = local_dir;
            o.files = files;
            o.clients = clients;
            o.rounds = rounds;
            o.durable_dir = durable_dir;
            o.sync_on_reply = sync_on_reply == 1;
            let figures = run_mds_bench(&o, &mut std::io::stdout())?;
            println!("{}", serde_json::to_string(&figures)?);
            Ok(())
        }
        BenchCommand::Mdt { dir, local_dir, files, threads, rounds, startup_files, sync_on_reply } => {
            if !(1..=256).contains(&threads) || !(1..=100).contains(&rounds) {
                return Err("--threads must be 1 to 256 and --rounds 1 to 100".into());
            }
            if !(threads as u64..=10_000_000).contains(&files) {
                return Err(format!("--files {files}: at least --threads and at most 10,000,000").into());
            }
            if !(1..=10_000_000).contains(&startup_files) {
                return Err(format!("--startup-files {startup_files}: 1 to 10,000,000").into());
            }
            let o = MdtBenchOptions {
                local_dir,
                files,
                threads,
                rounds,
                startup_files,
                sync_on_reply,
                heap: Some(HeapCounter { counting: crate::heap::counting, net_bytes: crate::heap::net_bytes }),
                ..MdtBenchOptions::new(dir)
            };
            let figures = run_mdt_bench(&o, &mut std::io::stdout())?;
            println!("{}", serde_json::to_string(&figures)?);
            Ok(())
        }
        BenchCommand::Client { dir, local_dir, files, clients, rounds, io_size } => {
            if !(1..=256).contains(&clients) || !(1..=100).contains(&rounds) {
                return Err("--clients must be 1 to 256 and --rounds 1 to 100".into());
            }
            if !(clients as u64..=1_000_000).contains(&files) {
                return Err(format!("--files {files}: at least --clients and at most 1,000,000").into());
            }
            if !(1 << 20..=4 << 30).contains(&io_size) {
                return Err(format!("--io-size {io_size}: 1M to 4G").into());
            }
            let o = ClientBenchOptions { dir, local_dir, files, clients, rounds, io_bytes: io_size };
            let figures = run_client_bench(&o, &mut std::io::stdout())?;
            println!("{}", serde_json::to_string(&figures)?);
            Ok(())
        }
        BenchCommand::Failover { dir, writers, settle, races } => {
            if !(1..=64).contains(&writers) || !(1..=600).contains(&settle) || races > 100_000 {
                return Err("--writers must be 1 to 64, --settle 1 to 600 and --races at most 100,000".into());
            }
            let o = crate::failover::FailoverOptions { dir, writers, settle: Duration::from_secs(settle), races };
            let figures = crate::failover::run(&o, &mut std::io::stdout())?;
            println!("{}", serde_json::to_string(&figures)?);
            Ok(())
        }
        BenchCommand::Storm { dir, clients, idle } => {
            if !(1..=1_000_000).contains(&clients) || idle > 3600 {
                return Err("--clients must be 1 to 1,000,000 and --idle at most 3600".into());
            }
            let o = crate::storm::StormOptions { dir, clients, idle: Duration::from_secs(idle) };
            let figures = crate::storm::run(&o, &mut std::io::stdout())?;
            println!("{}", serde_json::to_string(&figures)?);
            Ok(())
        }
    }
}
