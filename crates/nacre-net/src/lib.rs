//! `nacre-net`: the transport every Nacre service talks through, after Lustre's LNet and
//! ptlrpc: endpoints (NIDs), framing, credits, bulk RPC with xids, adaptive timeouts, request
//! policies (FIFO, TBF), fault injection and a selftest.
//!
//! In place so far: [`nid`] (endpoint names), [`frame`] (the wire header and a decoder that
//! bounds every length it reads), [`credits`] (peer and interface credit pools with LNet's
//! counters), [`at`] (adaptive timeout estimates), [`tbf`] (the token bucket request
//! policy with run-time rules), [`fault`] (seeded fault rules) and a first [`rpc`] over TCP
//! (xid matching, bulk read straight from the socket, `max_rpcs_in_flight`,
//! `req_buffers_max` with read back-pressure). The transport trait, credits and policies
//! wired into the RPC path, early replies, resend, the pinger and the selftest come next.

pub mod at;
pub mod bulk;
pub mod credits;
pub mod fault;
pub mod frame;
pub mod glob;
pub mod nid;
pub mod rpc;
pub mod tbf;
