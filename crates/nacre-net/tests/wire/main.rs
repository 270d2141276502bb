//! The transport's integration tests, one binary: each module was a test binary of its
//! own, and linking seven of them (each with its own copy of the runtime and the client)
//! cost CI more than running them.

mod credits;
mod fault;
mod frame;
mod inline;
mod recovery;
mod rpc;
mod tbf;
// t
