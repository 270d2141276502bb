//! `nacre-net`: the transport every Nacre service talks through, after Lustre's LNet and
//! ptlrpc.
//!
//! - [`nid`]: endpoint names (`127.0.0.1@tcp:9000`, `oss0@mem`).
//! - [`transport`]: the [`transport::Transport`] trait with TCP and in-memory transports.
//!   In-memory pipes run their reader on the writer's thread (`inline`).
//! - [`frame`]: the wire header and a decoder that bounds every length it reads.
//! - [`credits`]: peer and interface credit pools with LNet's counters.
//! - [`rpc`], [`client`], [`server`]: RPC with xids, bulk, `max_rpcs_in_flight`, bounded
//!   request buffers, adaptive timeouts ([`at`]), early replies, resends answered from a
//!   reply cache, a pinger and eviction.
//! - [`tbf`]: the token bucket request policy with run-time rules.
//! - [`fault`]: seeded fault rules (delay, drop, duplicate, cut) on every send.

pub mod at;
pub mod bulk;
pub mod client;
pub mod credits;
pub mod fault;
pub mod frame;
pub mod glob;
mod inline;
pub mod nid;
pub mod recovery;
pub mod rpc;
pub mod server;
pub mod tbf;
pub mod transport;
