//! `nacre-server`: the services. The OSS ([`oss`]) serves object storage targets over the
//! transport; the MDS ([`mds`]) serves a metadata target's namespace ([`mdt`]); the MGS
//! ([`mgs`]) keeps the configuration; [`cluster`] wires them into a file system.

pub mod cluster;
pub mod dne;
pub mod mds;
pub mod mdt;
pub mod mgs;
pub mod objects;
pub mod oss;
pub mod stats;
