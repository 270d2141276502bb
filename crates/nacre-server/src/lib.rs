//! `nacre-server`: the services. The OSS ([`oss`]) serves object storage targets over the
//! transport; the MGS and MDS join with their issue.

pub mod mdt;
pub mod oss;
pub mod stats;
