//! `nacre-bench`: Nacre's benchmarks. Each prints a human table and returns its figures
//! as JSON, which the CLI prints as the last line so that scripts can compare runs.
//! The RAID benches, the transport selftest, the OST and MDS surveys, the MDT's engine
//! alone, the client library bench, and IO500's phases (`io500`) on any file system or
//! on Nacre natively.

pub mod client;
pub mod io500;
pub mod kernel;
pub mod mds;
pub mod mdt;
mod mounted_locks;
pub mod net;
pub mod ost;
pub mod raid;
pub mod torture;
