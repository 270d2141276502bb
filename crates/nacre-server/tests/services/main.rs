//! The services' integration tests (MGS, MDS, OSS, DNE, object pools), one binary: each
//! module was a test binary of its own, and building six of them (each with its own copy
//! of the services, the runtime and the client) cost CI more than running them.

mod dne;
mod mds;
mod mds_recovery;
mod mgs;
mod objects;
mod oss;
// t
