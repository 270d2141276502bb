//! `nacre-net`: the transport every Nacre service talks through, after Lustre's LNet and
//! ptlrpc: endpoints (NIDs), framing, credits, bulk RPC with xids, adaptive timeouts, request
//! policies (FIFO, TBF), fault injection and a selftest.
//!
//! In place so far: [`nid`] (endpoint names), [`frame`] (the wire header and a decoder that
//! bounds every length it reads), [`credits`] (peer and interface credit pools with LNet's
//! counters), [`at`] (adaptive timeout estimates), [`tbf`] (the token bucket request
//! policy with run-time rules) and [`fault`] (seeded fault rules). Connections, RPC with
//! bulk, the pinger and the selftest build on them.

pub mod at;
pub mod credits;
pub mod fault;
pub mod frame;
pub mod nid;
pub mod tbf;
