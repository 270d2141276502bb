//! `nacre net …`: the transport's selftest, after lnet_selftest.

use clap::Subcommand;
use nacre_bench::net::{SelftestOptions, run_selftest};

#[derive(Subcommand)]
pub enum NetCommand {
    /// Bulk write RPCs (1, 4, 16 MiB) and pings over loopback against plain sockets in the
    /// same run; prints a table and one JSON line.
    Selftest {
        /// Seconds per phase.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Concurrent bulk clients.
        #[arg(long, default_value_t = 4)]
        bulk_clients: usize,
        /// Concurrent ping clients.
        #[arg(long, default_value_t = 8)]
        ping_clients: usize,
    },
}

pub fn run(cmd: NetCommand) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        NetCommand::Selftest { seconds, bulk_clients, ping_clients } => {
            if !(seconds > 0.0 && seconds <= 3600.0) || bulk_clients == 0 || ping_clients == 0 {
                return Err("--seconds must be within (0, 3600] and client counts positive".into());
            }
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let o = SelftestOptions { seconds, bulk_clients, ping_clients };
            let mut out = std::io::stdout();
            let figures = rt.block_on(run_selftest(&o, &mut out))?;
            println!("{}", serde_json::to_string(&figures)?);
            Ok(())
        }
    }
}
