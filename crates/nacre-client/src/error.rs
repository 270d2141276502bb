//! The client's one error type: an errno, as the kernel would return it, and a message
//! that says what went wrong.

use std::fmt;

use nacre_net::rpc::RpcError;

/// Error numbers the client returns besides the MDS's ([`nacre_proto::mdt::errno`]).
pub mod errno {
    pub use nacre_proto::mdt::errno::*;
    pub const ENOTCONN: i32 = 107;
    pub const ETIMEDOUT: i32 = 110;
    pub const ESHUTDOWN: i32 = 108;
    pub const EBADMSG: i32 = 74;
    pub const EPROTO: i32 = 71;
    pub const ENODEV: i32 = 19;
    pub const ESPIPE: i32 = 29;
}

/// An operation's failure: `errno` (positive) and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub errno: i32,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(errno: i32, message: impl Into<String>) -> Error {
        Error { errno, message: message.into() }
    }

    /// A server's error reply: its status is a negative errno, its body the message.
    pub fn from_reply(status: i32, body: &[u8]) -> Error {
        Error { errno: status.saturating_abs(), message: String::from_utf8_lossy(body).into_owned() }
    }

    /// A transport failure talking to `what`.
    pub fn rpc(what: &str, e: RpcError) -> Error {
        let errno = match &e {
            RpcError::Timeout { .. } => errno::ETIMEDOUT,
            RpcError::Evicted { .. } => errno::EIO,
            RpcError::Refused { .. } | RpcError::Closed | RpcError::Io(_) => errno::ENOTCONN,
            RpcError::Frame(_) | RpcError::Protocol(_) => errno::EPROTO,
            RpcError::TooLarge { .. } => errno::E2BIG,
        };
        Error { errno, message: format!("{what}: {e}") }
    }

    /// A reply that does not decode, or is not the one the request calls for.
    pub fn protocol(what: &str, detail: impl fmt::Display) -> Error {
        Error { errno: errno::EPROTO, message: format!("{what}: {detail}") }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for Error {}
