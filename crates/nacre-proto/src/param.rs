//! `get-param` over the wire: every service answers it, with the values of its tunables
//! and statistics whose dotted names match a glob pattern (`obdfilter.*.brw_stats`).

use crate::wire::{Dec, Enc, ProtoError};

/// A transport-level service opcode every Nacre service serves.
pub const OP_GET_PARAM: u16 = 200;
const VERSION: u8 = 1;
/// Longest pattern accepted.
pub const PATTERN_MAX: usize = 256;

pub fn encode_get(pattern: &str) -> Vec<u8> {
    let mut e = Enc::new(VERSION).u32(pattern.len() as u32).done();
    e.extend_from_slice(pattern.as_bytes());
    e
}

pub fn decode_get(b: &[u8]) -> Result<String, ProtoError> {
    let mut d = Dec::new(b, "get-param", VERSION)?;
    let n = d.u32("pattern length")? as usize;
    if n > PATTERN_MAX {
        return Err(ProtoError::Invalid(format!("pattern of {n} bytes (at most {PATTERN_MAX})")));
    }
    let text = b.get(5..5 + n).ok_or(ProtoError::Truncated { what: "pattern", at: 5, len: b.len() })?;
    if b.len() != 5 + n {
        return Err(ProtoError::Trailing { extra: b.len() - 5 - n });
    }
    String::from_utf8(text.to_vec()).map_err(|_| ProtoError::Invalid("pattern is not UTF-8".into()))
}

/// The reply: `name=value` lines; a value of several lines starts on the next line, as
/// `lctl get_param` prints it.
pub fn render(values: &[(String, String)]) -> String {
    let mut out = String::new();
    for (name, value) in values {
        let v = value.trim_end();
        if v.contains('\n') {
            out.push_str(&format!("{name}=\n{v}\n"));
        } else {
            out.push_str(&format!("{name}={v}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_round_trip_and_bad_ones_are_named() {
        assert_eq!(decode_get(&encode_get("obdfilter.*.brw_stats")).unwrap(), "obdfilter.*.brw_stats");
        let long = "x".repeat(PATTERN_MAX + 1);
        assert!(decode_get(&encode_get(&long)).unwrap_err().to_string().contains("at most"));
        let mut b = encode_get("abc");
        b.pop();
        assert!(decode_get(&b).is_err());
        assert_eq!(render(&[("a.b".into(), "1".into()), ("c".into(), "x\ny\n".into())]), "a.b=1\nc=\nx\ny\n");
    }
}

/// Set one parameter on a running service: `name=value` (the service checks both and
/// answers an error naming what is wrong).
pub const OP_SET_PARAM: u16 = 201;
/// Longest value accepted.
pub const VALUE_MAX: usize = 4096;

pub fn encode_set(name: &str, value: &str) -> Vec<u8> {
    let mut e = Enc::new(VERSION).u32(name.len() as u32).u32(value.len() as u32).done();
    e.extend_from_slice(name.as_bytes());
    e.extend_from_slice(value.as_bytes());
    e
}

pub fn decode_set(b: &[u8]) -> Result<(String, String), ProtoError> {
    let mut d = Dec::new(b, "set-param", VERSION)?;
    let (n, v) = (d.u32("name length")? as usize, d.u32("value length")? as usize);
    if n > PATTERN_MAX || v > VALUE_MAX {
        return Err(ProtoError::Invalid(format!("name of {n} or value of {v} bytes is too long")));
    }
    let text = b.get(9..9 + n + v).ok_or(ProtoError::Truncated { what: "name and value", at: 9, len: b.len() })?;
    if b.len() != 9 + n + v {
        return Err(ProtoError::Trailing { extra: b.len() - 9 - n - v });
    }
    let s = |x: &[u8]| String::from_utf8(x.to_vec()).map_err(|_| ProtoError::Invalid("not UTF-8".into()));
    Ok((s(&text[..n])?, s(&text[n..])?))
}

#[cfg(test)]
mod set_tests {
    use super::*;

    #[test]
    fn set_messages_round_trip_and_bad_ones_are_named() {
        let b = encode_set("ost.OSS.ost_io.nrs_tbf_rule", "start a nid={*} rate=5");
        assert_eq!(decode_set(&b).unwrap(), ("ost.OSS.ost_io.nrs_tbf_rule".into(), "start a nid={*} rate=5".into()));
        for cut in 0..b.len() {
            assert!(decode_set(&b[..cut]).is_err());
        }
        assert!(decode_set(&encode_set("x", &"v".repeat(VALUE_MAX + 1))).unwrap_err().to_string().contains("too long"));
    }
}
