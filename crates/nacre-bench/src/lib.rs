//! `nacre-bench`: Nacre's benchmarks. Each prints a human table and returns its figures
//! as JSON, which the CLI prints as the last line so that scripts can compare runs.
//! The RAID benches live here now; the transport selftest and the IO500 phases join them
//! with their issues.

pub mod kernel;
pub mod raid;
pub mod torture;
