//! `nacre-net`: the transport every Nacre service talks through, after Lustre's LNet and
//! ptlrpc: endpoints (NIDs), framing, credits, bulk RPC with xids, adaptive timeouts, request
//! policies (FIFO, TBF), fault injection and a selftest.
//!
//! In place so far: [`frame`], the wire header and a decoder that bounds every length it
//! reads, and [`credits`], peer and interface credit pools with LNet's counters. The
//! connections, RPC, timeouts and policies build on them.

pub mod credits;
pub mod frame;
