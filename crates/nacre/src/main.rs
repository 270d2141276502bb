//! `nacre`: one command for everything Nacre does. Today: software RAID volumes
//! (`nacre raid …`) and their benchmarks, and the transport selftest (`nacre net …`); the
//! file system's services join as they land.

mod bench;
mod net;
mod ost;
mod raid;
mod size;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "nacre", version, about = "Nacre: a parallel file system in user space")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Software RAID volumes over drives (files or block devices).
    #[command(subcommand)]
    Raid(raid::RaidCommand),
    /// The transport: selftest against plain sockets.
    #[command(subcommand)]
    Net(net::NetCommand),
    /// Object storage targets on file drives: format, check, stat.
    #[command(subcommand)]
    Ost(ost::OstCommand),
    /// Benchmarks of the services' layers (`ost`: the object store).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Raid(cmd) => raid::run(cmd),
        Command::Net(cmd) => net::run(cmd),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Ost(cmd) => ost::run(cmd),
    };
    if let Err(e) = result {
        eprintln!("nacre: {e}");
        std::process::exit(1);
    }
}
