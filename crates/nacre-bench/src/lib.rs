//! `nacre-bench`: Nacre's benchmarks. Each prints a human table and returns its figures
//! as JSON, which the CLI prints as the last line so that scripts can compare runs.
//! The RAID benches and the transport selftest live here; the IO500 phases join them with
//! their issue.

pub mod client;
pub mod kernel;
pub mod mds;
pub mod net;
pub mod ost;
pub mod raid;
pub mod torture;
