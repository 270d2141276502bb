//! Reading and writing message bodies.

use std::fmt;

/// Why a body is not the message it claims to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// The body ended before `what`.
    Truncated { what: &'static str, at: usize, len: usize },
    /// Bytes left over after the message.
    Trailing { extra: usize },
    /// A version this build does not read.
    Version { message: &'static str, got: u8, want: u8 },
    /// A field holds a value the message does not allow.
    Invalid(String),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Truncated { what, at, len } => write!(f, "message ends at byte {len}, before {what} (at {at})"),
            ProtoError::Trailing { extra } => write!(f, "{extra} bytes after the end of the message"),
            ProtoError::Version { message, got, want } => {
                write!(f, "{message} message of version {got}; this build reads {want}")
            }
            ProtoError::Invalid(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for ProtoError {}

/// A message being written.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// A message of version `version`, with room for the common ones (an attribute
    /// reply, a create): growing from one byte cost several reallocations per message.
    pub fn new(version: u8) -> Enc {
        let mut v = Vec::with_capacity(128);
        v.push(version);
        Enc(v)
    }
    pub fn u8(mut self, v: u8) -> Enc {
        self.0.push(v);
        self
    }
    pub fn u32(mut self, v: u32) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(mut self, v: i64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A length-prefixed byte string (names, values, paths).
    pub fn bytes(mut self, v: &[u8]) -> Enc {
        self.0.extend_from_slice(&(v.len() as u32).to_le_bytes());
        self.0.extend_from_slice(v);
        self
    }
    pub fn done(self) -> Vec<u8> {
        self.0
    }
}

/// A message being read; every read checks what is left.
pub struct Dec<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Dec<'a> {
    /// Start reading a message named `message`, of version `want`.
    pub fn new(b: &'a [u8], message: &'static str, want: u8) -> Result<Dec<'a>, ProtoError> {
        let mut d = Dec { b, at: 0 };
        let got = d.u8("version")?;
        if got != want {
            return Err(ProtoError::Version { message, got, want });
        }
        Ok(d)
    }

    fn take<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtoError> {
        let s =
            self.b.get(self.at..self.at + N).ok_or(ProtoError::Truncated { what, at: self.at, len: self.b.len() })?;
        self.at += N;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.take::<1>(what)?[0])
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.take(what)?))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.take(what)?))
    }
    pub fn i64(&mut self, what: &'static str) -> Result<i64, ProtoError> {
        Ok(i64::from_le_bytes(self.take(what)?))
    }

    /// A length-prefixed byte string of at most `max` bytes; a longer one is refused
    /// before anything is taken.
    pub fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], ProtoError> {
        let len = self.u32(what)? as usize;
        if len > max {
            return Err(ProtoError::Invalid(format!("{what} of {len} bytes is longer than {max}")));
        }
        let s =
            self.b.get(self.at..self.at + len).ok_or(ProtoError::Truncated { what, at: self.at, len: self.b.len() })?;
        self.at += len;
        Ok(s)
    }

    /// A length-prefixed UTF-8 string of at most `max` bytes.
    pub fn str(&mut self, what: &'static str, max: usize) -> Result<&'a str, ProtoError> {
        let b = self.bytes(what, max)?;
        std::str::from_utf8(b).map_err(|_| ProtoError::Invalid(format!("{what} is not UTF-8")))
    }

    /// Nothing is left to read.
    pub fn at_end(&self) -> bool {
        self.at == self.b.len()
    }

    /// The message must end here.
    pub fn end(self) -> Result<(), ProtoError> {
        match self.b.len() - self.at {
            0 => Ok(()),
            extra => Err(ProtoError::Trailing { extra }),
        }
    }
}
