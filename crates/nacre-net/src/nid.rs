//! NIDs: the names of endpoints, in Lustre's spelling with a port: `127.0.0.1@tcp:9000`,
//! `[::1]@tcp:9000`, or `name@mem` for the in-memory transport that tests use where
//! sockets add nothing.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// LNet's acceptor port, used when a NID names none.
pub const DEFAULT_PORT: u16 = 988;
/// Longest name of an in-memory endpoint.
const MEM_NAME_MAX: usize = 64;

/// A network endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Nid {
    Tcp(SocketAddr),
    Mem(String),
}

/// Why text is not a NID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NidError {
    pub text: String,
    pub reason: &'static str,
}

impl fmt::Display for NidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad NID {:?}: {} (expected ADDR@tcp[:PORT] or NAME@mem)", self.text, self.reason)
    }
}

impl std::error::Error for NidError {}

impl FromStr for Nid {
    type Err = NidError;

    fn from_str(s: &str) -> Result<Nid, NidError> {
        let bad = |reason| NidError { text: s.to_string(), reason };
        let (addr, rest) = s.trim().rsplit_once('@').ok_or(bad("no '@NET'"))?;
        let (net, port) = match rest.split_once(':') {
            Some((net, port)) => (net, Some(port)),
            None => (rest, None),
        };
        match net {
            "tcp" | "tcp0" => {
                let port = match port {
                    Some(p) => p.parse::<u16>().map_err(|_| bad("port is not a number from 0 to 65535"))?,
                    None => DEFAULT_PORT,
                };
                let host = addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(addr);
                let ip: IpAddr = host.parse().map_err(|_| bad("address is not an IPv4 or IPv6 address"))?;
                Ok(Nid::Tcp(SocketAddr::new(ip, port)))
            }
            "mem" => {
                if port.is_some() {
                    return Err(bad("in-memory endpoints have no port"));
                }
                let ok = !addr.is_empty()
                    && addr.len() <= MEM_NAME_MAX
                    && addr.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
                if !ok {
                    return Err(bad("name must be 1-64 characters of A-Z a-z 0-9 - _ ."));
                }
                Ok(Nid::Mem(addr.to_string()))
            }
            _ => Err(bad("unknown network type")),
        }
    }
}

impl fmt::Display for Nid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Nid::Tcp(SocketAddr::V4(a)) => write!(f, "{}@tcp:{}", a.ip(), a.port()),
            Nid::Tcp(SocketAddr::V6(a)) => write!(f, "[{}]@tcp:{}", a.ip(), a.port()),
            Nid::Mem(name) => write!(f, "{name}@mem"),
        }
    }
}

impl Nid {
    /// The endpoint without its port (`10.0.0.5@tcp`, `oss0@mem`): what names a client
    /// host in rules, since a client's connections come from passing ports.
    pub fn host(&self) -> String {
        match self {
            Nid::Tcp(SocketAddr::V4(a)) => format!("{}@tcp", a.ip()),
            Nid::Tcp(SocketAddr::V6(a)) => format!("[{}]@tcp", a.ip()),
            Nid::Mem(name) => format!("{name}@mem"),
        }
    }

    /// Does a rule's glob pattern name this endpoint? A pattern with a port
    /// (`…@tcp:9000`) is matched against the whole NID, any other against [`Nid::host`].
    pub fn matches(&self, pattern: &str) -> bool {
        let with_port = pattern.rsplit_once('@').is_some_and(|(_, net)| net.contains(':'));
        if with_port { crate::glob::glob(pattern, &self.to_string()) } else { crate::glob::glob(pattern, &self.host()) }
    }
}

/// Most NIDs a [`NidList`] holds.
pub const LIST_MAX: usize = 8;

/// The NIDs of one service that more than one node may serve (an MGS and its failover
/// partner), in the order they are tried: `NID[,NID…]`, as a mount names its MGS.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NidList(Vec<Nid>);

impl NidList {
    /// The list of `nids`, if it holds 1 to [`LIST_MAX`].
    pub fn new(nids: Vec<Nid>) -> Option<NidList> {
        (1..=LIST_MAX).contains(&nids.len()).then_some(NidList(nids))
    }

    /// The NID tried first.
    pub fn first(&self) -> &Nid {
        &self.0[0]
    }

    pub fn all(&self) -> &[Nid] {
        &self.0
    }
}

impl From<Nid> for NidList {
    fn from(nid: Nid) -> NidList {
        NidList(vec![nid])
    }
}

impl From<&Nid> for NidList {
    fn from(nid: &Nid) -> NidList {
        NidList(vec![nid.clone()])
    }
}

impl From<&NidList> for NidList {
    fn from(list: &NidList) -> NidList {
        list.clone()
    }
}

impl FromStr for NidList {
    type Err = NidError;

    fn from_str(s: &str) -> Result<NidList, NidError> {
        let nids = s.split(',').map(str::parse).collect::<Result<Vec<Nid>, NidError>>()?;
        NidList::new(nids).ok_or(NidError { text: s.to_string(), reason: "a list holds 1 to 8 NIDs" })
    }
}

impl fmt::Display for NidList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            n.fmt(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_without_a_port_name_the_host() {
        let n: Nid = "10.0.1.5@tcp:45678".parse().unwrap();
        assert_eq!(n.host(), "10.0.1.5@tcp");
        assert!(n.matches("10.0.1.5@tcp"));
        assert!(n.matches("10.0.1.*"));
        assert!(n.matches("10.0.1.5@tcp:45678"));
        assert!(!n.matches("10.0.1.5@tcp:988"));
        assert!(!n.matches("10.0.2.*"));
        assert!("oss0@mem".parse::<Nid>().unwrap().matches("oss*@mem"));
    }

    #[test]
    fn parse_and_print() {
        for s in ["127.0.0.1@tcp:9000", "[::1]@tcp:9000", "ost0@mem"] {
            let n: Nid = s.parse().unwrap();
            assert_eq!(n.to_string(), s);
        }
        assert_eq!("10.1.2.3@tcp".parse::<Nid>().unwrap().to_string(), "10.1.2.3@tcp:988");
        assert_eq!("10.1.2.3@tcp0:1".parse::<Nid>().unwrap().to_string(), "10.1.2.3@tcp:1");
    }

    #[test]
    fn lists_of_nids() {
        let l: NidList = "10.0.0.1@tcp:9400,10.0.0.2@tcp:9400".parse().unwrap();
        assert_eq!(l.all().len(), 2);
        assert_eq!(l.first().to_string(), "10.0.0.1@tcp:9400");
        assert_eq!(l.to_string(), "10.0.0.1@tcp:9400,10.0.0.2@tcp:9400");
        assert_eq!("a@mem".parse::<NidList>().unwrap().to_string(), "a@mem");
        let e = |s: &str| s.parse::<NidList>().unwrap_err();
        assert_eq!(e("10.0.0.1@tcp,").text, "");
        assert_eq!(e("a@mem,b").reason, "no '@NET'");
        assert_eq!(e(&["a@mem"; 9].join(",")).reason, "a list holds 1 to 8 NIDs");
    }

    #[test]
    fn bad_nids_name_the_problem() {
        let e = |s: &str| s.parse::<Nid>().unwrap_err().reason;
        assert_eq!(e("127.0.0.1"), "no '@NET'");
        assert_eq!(e("127.0.0.1@o2ib"), "unknown network type");
        assert_eq!(e("127.0.0.1@tcp:99999"), "port is not a number from 0 to 65535");
        assert_eq!(e("host.example@tcp"), "address is not an IPv4 or IPv6 address");
        assert_eq!(e("a b@mem"), "name must be 1-64 characters of A-Z a-z 0-9 - _ .");
        assert_eq!(e("x@mem:3"), "in-memory endpoints have no port");
        assert!("nope".parse::<Nid>().unwrap_err().to_string().contains("bad NID \"nope\""));
    }
}
