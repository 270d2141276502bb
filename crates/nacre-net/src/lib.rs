//! `nacre-net`: the transport every Nacre service talks through, after Lustre's LNet and
//! ptlrpc: endpoints (NIDs), framing, credits, bulk RPC with xids, adaptive timeouts, request
//! policies (FIFO, TBF), fault injection and a selftest.
//!
//! In place so far: [`nid`] (endpoint names), [`frame`] (the wire header and a decoder that
//! bounds every length it reads), [`credits`] (peer and interface credit pools with LNet's
//! counters) and [`at`] (adaptive timeout estimates). Connections, RPC, the pinger,
//! request policies, fault injection and the selftest build on them.

pub mod at;
pub mod credits;
pub mod frame;
pub mod nid;
