//! `nacre-server`: the services. The OSS ([`oss`]) serves object storage targets over the
//! transport; the MDS ([`mds`]) serves a metadata target's namespace (the `nacre-mdt`
//! crate, here as [`mdt`]); the MGS ([`mgs`]) keeps the configuration; [`cluster`] wires
//! them into a file system.

pub mod cluster;
pub mod dne;
pub mod leases;
pub mod locks;
pub mod mds;
pub mod mgs;
pub use nacre_mdt as mdt;
pub mod objects;
pub mod oss;
pub mod stats;
mod tunable;
