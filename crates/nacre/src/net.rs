//! `nacre net …`: the transport's selftest (after lnet_selftest), a selftest server to
//! point it at, and the simulated clients of its scale phase.

use clap::Subcommand;
use nacre_bench::net::{SelftestOptions, raw_server, run_client_sim, run_selftest, start_server};
use nacre_net::nid::Nid;

use crate::size::parse_size;

#[derive(Subcommand)]
pub enum NetCommand {
    /// Bulk write and read RPCs (1, 4, 16 MiB) and small RPCs over loopback, each against
    /// plain sockets in the same run; with --clients N, N simulated clients against one
    /// server. Prints a table and one JSON line.
    Selftest {
        /// Seconds per phase and round (the scale phase runs at least 10).
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Rounds per phase, Nacre and raw interleaved; the best of each side is kept.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Concurrent bulk clients.
        #[arg(long, default_value_t = 4)]
        bulk_clients: usize,
        /// Bulk RPC sizes, 4 KiB to 16 MiB each.
        #[arg(long, value_delimiter = ',', default_value = "1M,4M,16M", value_parser = parse_size)]
        sizes: Vec<u64>,
        /// Concurrent small-RPC clients.
        #[arg(long, default_value_t = 8)]
        ping_clients: usize,
        /// Skip the plain-socket reference (no ratios).
        #[arg(long)]
        no_raw: bool,
        /// Simulated clients for the scale phase (e.g. 10000); 0 skips it.
        #[arg(long, default_value_t = 0)]
        clients: usize,
        /// Test a running `nacre net serve` instead of a server started here.
        #[arg(long)]
        target: Option<Nid>,
    },
    /// Serve the selftest service on a NID (and the plain-socket reference on the next
    /// port) until stopped, for selftests between machines.
    Serve {
        /// Where to listen, e.g. 0.0.0.0@tcp:9000.
        #[arg(long)]
        listen: Nid,
    },
    /// The simulated clients of the scale phase (run by `selftest --clients`).
    #[command(hide = true)]
    SimClients {
        #[arg(long)]
        target: Nid,
        #[arg(long)]
        clients: usize,
        #[arg(long)]
        seconds: f64,
    },
}

/// Most simulated clients one process runs: each holds a descriptor, and a process may
/// hold 20,000 here.
const SIM_CLIENTS_MAX: usize = 15_000;

pub fn run(cmd: NetCommand) -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cmd {
        NetCommand::Selftest { seconds, rounds, bulk_clients, sizes, ping_clients, no_raw, clients, target } => {
            if let Some(bad) = sizes.iter().find(|&&b| !(4096..=16 << 20).contains(&b)) {
                return Err(format!("--sizes: {bad} bytes is outside 4K..16M (the largest bulk RPC)").into());
            }
            if !(seconds > 0.0 && seconds <= 3600.0) || bulk_clients == 0 || ping_clients == 0 {
                return Err("--seconds must be within (0, 3600] and client counts positive".into());
            }
            if !(1..=100).contains(&rounds) {
                return Err(format!("--rounds {rounds}: use 1 to 100").into());
            }
            if clients > SIM_CLIENTS_MAX {
                return Err(format!("--clients {clients}: at most {SIM_CLIENTS_MAX} from one machine").into());
            }
            let o = SelftestOptions {
                seconds,
                rounds,
                bulk_clients,
                bulk_sizes: sizes.iter().map(|&b| b as usize).collect(),
                ping_clients,
                raw: !no_raw,
                clients,
                sim_program: std::env::current_exe().ok(),
                target,
            };
            let mut out = std::io::stdout();
            let figures = rt.block_on(run_selftest(&o, &mut out))?;
            println!("{}", serde_json::to_string(&figures)?);
            Ok(())
        }
        NetCommand::Serve { listen } => rt.block_on(async {
            let server = start_server(&listen).await?;
            let Nid::Tcp(addr) = server.nid() else { return Err("serve needs a tcp NID".into()) };
            let raw_addr = std::net::SocketAddr::new(addr.ip(), addr.port().wrapping_add(1));
            let raw = tokio::net::TcpListener::bind(raw_addr).await?;
            println!("selftest service on {}, plain-socket reference on {raw_addr}", server.nid());
            raw_server(raw).await;
            Ok::<(), Box<dyn std::error::Error>>(())
        }),
        NetCommand::SimClients { target, clients, seconds } => {
            if clients == 0 || clients > SIM_CLIENTS_MAX || !(seconds > 0.0 && seconds <= 3600.0) {
                return Err(format!("--clients within 1..={SIM_CLIENTS_MAX} and --seconds within (0, 3600]").into());
            }
            let figures = rt.block_on(run_client_sim(&target, clients, seconds))?;
            println!("{}", serde_json::to_string(&figures)?);
            Ok(())
        }
    }
}
