//! The management service's messages: targets register their NIDs, clients fetch the
//! file system's configuration (and wait for changes to it), and `set-param -P` stores
//! parameters for the whole file system.

use crate::wire::{Dec, Enc, ProtoError};

const VERSION: u8 = 1;

pub const MGS_REGISTER: u16 = 400;
pub const MGS_CONFIG: u16 = 401;
pub const MGS_SETPARAM: u16 = 402;

/// Longest file system name (Lustre's is 8; ours allows a little more).
pub const FSNAME_MAX: usize = 16;

/// Why `fsname` cannot name a file system (1 to [`FSNAME_MAX`] letters, digits or `_`, as
/// target names and mount sources are built from it), or `None`.
pub fn fsname_problem(fsname: &str) -> Option<String> {
    let ok = !fsname.is_empty()
        && fsname.len() <= FSNAME_MAX
        && fsname.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    (!ok).then(|| format!("{fsname:?} is not a file system name (1 to {FSNAME_MAX} letters, digits or _)"))
}
/// NIDs one target may list (its server and failover partners).
pub const NIDS_MAX: usize = 8;
pub const NID_MAX: usize = 128;
/// Targets of each kind a file system may have.
pub const TARGETS_MAX: u32 = 65_536;
/// Stored parameters, and the length of a name and of a value.
pub const PARAMS_MAX: usize = 4096;
pub const PARAM_NAME_MAX: usize = 256;
pub const PARAM_VALUE_MAX: usize = 4096;
/// Longest wait for a configuration change one request may ask.
pub const WAIT_MS_MAX: u32 = 60_000;

/// What a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TargetKind {
    Mdt,
    Ost,
}

impl TargetKind {
    fn code(self) -> u8 {
        match self {
            TargetKind::Mdt => 1,
            TargetKind::Ost => 2,
        }
    }

    fn from_code(c: u8) -> Result<TargetKind, ProtoError> {
        match c {
            1 => Ok(TargetKind::Mdt),
            2 => Ok(TargetKind::Ost),
            k => Err(ProtoError::Invalid(format!("target kind {k} is neither MDT (1) nor OST (2)"))),
        }
    }

    /// `nacre-MDT0000`, `nacre-OST0003`: Lustre's target names.
    pub fn name(self, fsname: &str, index: u32) -> String {
        match self {
            TargetKind::Mdt => format!("{fsname}-MDT{index:04x}"),
            TargetKind::Ost => format!("{fsname}-OST{index:04x}"),
        }
    }
}

/// The name connects to an MGS give (see `nacre_net::rpc::target_id`): one MGS serves a
/// file system, whichever node it is on.
pub const MGS_NAME: &str = "MGS";

/// One target of the file system: where to reach it, its first NID the server that
/// registered last, the others failover partners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetEntry {
    pub kind: TargetKind,
    pub index: u32,
    pub nids: Vec<String>,
}

/// A file system's configuration, at a version that grows with every change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    pub fsname: String,
    pub version: u64,
    pub targets: Vec<TargetEntry>,
    /// Parameters stored with `set-param -P`, by name (which may hold globs).
    pub params: Vec<(String, String)>,
}

fn put_str(e: Enc, s: &str) -> Enc {
    e.bytes(s.as_bytes())
}

impl Config {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = put_str(Enc::new(VERSION), &self.fsname).u64(self.version).u32(self.targets.len() as u32);
        for t in &self.targets {
            e = e.u8(t.kind.code()).u32(t.index).u32(t.nids.len() as u32);
            for n in &t.nids {
                e = put_str(e, n);
            }
        }
        e = e.u32(self.params.len() as u32);
        for (n, v) in &self.params {
            e = put_str(put_str(e, n), v);
        }
        e.done()
    }

    pub fn decode(b: &[u8]) -> Result<Config, ProtoError> {
        let mut d = Dec::new(b, "configuration", VERSION)?;
        let fsname = d.str("file system name", FSNAME_MAX)?.to_string();
        let version = d.u64("version")?;
        let n = d.u32("target count")?;
        if n > 2 * TARGETS_MAX {
            return Err(ProtoError::Invalid(format!("{n} targets")));
        }
        let mut targets = Vec::new();
        for _ in 0..n {
            let kind = TargetKind::from_code(d.u8("target kind")?)?;
            let index = d.u32("target index")?;
            let m = d.u32("NID count")? as usize;
            if m > NIDS_MAX {
                return Err(ProtoError::Invalid(format!("{m} NIDs for one target; at most {NIDS_MAX}")));
            }
            let mut nids = Vec::with_capacity(m);
            for _ in 0..m {
                nids.push(d.str("NID", NID_MAX)?.to_string());
            }
            targets.push(TargetEntry { kind, index, nids });
        }
        let p = d.u32("parameter count")? as usize;
        if p > PARAMS_MAX {
            return Err(ProtoError::Invalid(format!("{p} parameters; at most {PARAMS_MAX}")));
        }
        let mut params = Vec::with_capacity(p);
        for _ in 0..p {
            let n = d.str("parameter name", PARAM_NAME_MAX)?.to_string();
            let v = d.str("parameter value", PARAM_VALUE_MAX)?.to_string();
            params.push((n, v));
        }
        d.end()?;
        Ok(Config { fsname, version, targets, params })
    }
}

/// A request to the MGS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A target starting on a server: its file system, identity and NIDs.
    Register { fsname: String, target: TargetEntry },
    /// The configuration, once its version is above `have` or `wait_ms` have passed.
    Config { have: u64, wait_ms: u32 },
    /// Store a parameter for the whole file system; an empty value removes it.
    SetParam { name: String, value: String },
}

impl Request {
    pub fn encode(&self) -> (u16, Vec<u8>) {
        let e = Enc::new(VERSION);
        match self {
            Request::Register { fsname, target } => {
                let mut e = put_str(e, fsname).u8(target.kind.code()).u32(target.index).u32(target.nids.len() as u32);
                for n in &target.nids {
                    e = put_str(e, n);
                }
                (MGS_REGISTER, e.done())
            }
            Request::Config { have, wait_ms } => (MGS_CONFIG, e.u64(*have).u32(*wait_ms).done()),
            Request::SetParam { name, value } => (MGS_SETPARAM, put_str(put_str(e, name), value).done()),
        }
    }

    pub fn decode(opcode: u16, body: &[u8]) -> Result<Request, ProtoError> {
        let name = match opcode {
            MGS_REGISTER => "register",
            MGS_CONFIG => "config",
            MGS_SETPARAM => "set-param",
            other => return Err(ProtoError::Invalid(format!("opcode {other} is not an MGS operation"))),
        };
        let mut d = Dec::new(body, name, VERSION)?;
        let r = match opcode {
            MGS_REGISTER => {
                let fsname = d.str("file system name", FSNAME_MAX)?.to_string();
                let kind = TargetKind::from_code(d.u8("target kind")?)?;
                let index = d.u32("target index")?;
                let m = d.u32("NID count")? as usize;
                if m == 0 || m > NIDS_MAX {
                    return Err(ProtoError::Invalid(format!("{m} NIDs: a target lists 1 to {NIDS_MAX}")));
                }
                let mut nids = Vec::with_capacity(m);
                for _ in 0..m {
                    nids.push(d.str("NID", NID_MAX)?.to_string());
                }
                Request::Register { fsname, target: TargetEntry { kind, index, nids } }
            }
            MGS_CONFIG => Request::Config { have: d.u64("version")?, wait_ms: d.u32("wait")? },
            _ => Request::SetParam {
                name: d.str("parameter name", PARAM_NAME_MAX)?.to_string(),
                value: d.str("parameter value", PARAM_VALUE_MAX)?.to_string(),
            },
        };
        d.end()?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_cuts_fail() {
        let t = TargetEntry {
            kind: TargetKind::Ost,
            index: 3,
            nids: vec!["10.0.0.1@tcp:9100".into(), "10.0.0.2@tcp:9100".into()],
        };
        let all = [
            Request::Register { fsname: "nacre".into(), target: t.clone() },
            Request::Config { have: 7, wait_ms: 1000 },
            Request::SetParam { name: "osc.*.max_rpcs_in_flight".into(), value: "16".into() },
        ];
        for r in all {
            let (op, body) = r.encode();
            assert_eq!(Request::decode(op, &body), Ok(r.clone()));
            for cut in 0..body.len() {
                assert!(Request::decode(op, &body[..cut]).is_err(), "{r:?} cut at {cut}");
            }
        }
        let c =
            Config { fsname: "nacre".into(), version: 9, targets: vec![t], params: vec![("a.b".into(), "1".into())] };
        let b = c.encode();
        assert_eq!(Config::decode(&b), Ok(c));
        for cut in 0..b.len() {
            assert!(Config::decode(&b[..cut]).is_err());
        }
        let (op, body) = Request::Register {
            fsname: "x".into(),
            target: TargetEntry { kind: TargetKind::Mdt, index: 0, nids: vec![] },
        }
        .encode();
        assert!(Request::decode(op, &body).unwrap_err().to_string().contains("1 to 8"));
        assert_eq!(TargetKind::Ost.name("nacre", 26), "nacre-OST001a");
    }
}
