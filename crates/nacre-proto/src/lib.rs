//! `nacre-proto`: the messages services and clients exchange, as bodies of transport
//! frames. It knows no sockets (DESIGN §2): encoding and decoding only.
//!
//! Messages are little-endian fixed fields, written with [`wire::Enc`] and read with
//! [`wire::Dec`], which checks every length against what is left and names what was
//! missing, so a short or garbled body is an error and never a panic. Each message starts
//! with a version byte; a receiver refuses versions it does not know.

pub mod acl;
pub mod dne;
pub mod fid;
pub mod layout;
pub mod mdt;
pub mod mgs;
pub mod ost;
pub mod param;
pub mod wire;
