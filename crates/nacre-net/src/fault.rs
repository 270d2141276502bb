//! Fault injection: delay, drop, duplicate or cut messages between given NIDs or of given
//! opcodes, switchable at run time, so that every layer above can be tested against a
//! network that misbehaves the way real ones do.
//!
//! Rules are strings, like `drop from=10.0.0.*@tcp* to=* opcode=4 p=0.5 count=10` or
//! `delay ms=200 to=mds0@mem`. The first rule that matches a message and fires (with
//! probability `p`, at most `count` times) decides its fate. Decisions come from a seeded
//! generator, so a failing test replays exactly.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::nid::Nid;

/// Rules held at once.
const RULES_MAX: usize = 256;

/// What happens to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    Deliver,
    Drop,
    Delay(Duration),
    /// Deliver it twice.
    Duplicate,
    /// Close the connection it travels on.
    Cut,
}

#[derive(Debug, Clone, PartialEq)]
struct FaultRule {
    id: u64,
    action: FaultAction,
    from: String,
    to: String,
    opcode: Option<u16>,
    /// Opcodes the rule never touches (a management network that stays up while the data
    /// one fails: `drop except=200,201` keeps `get-param` and `set-param` working).
    except: Vec<u16>,
    /// Probability in millionths.
    p_micro: u64,
    remaining: Option<u64>,
    /// The rule as it was given.
    text: String,
}

/// Why a rule string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRuleError(pub String);

impl std::fmt::Display for FaultRuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad fault rule: {}", self.0)
    }
}

impl std::error::Error for FaultRuleError {}

struct State {
    rules: Vec<FaultRule>,
    rng: u64,
    next_id: u64,
}

/// The fault rules of one transport instance.
pub struct FaultInjector {
    state: Mutex<State>,
    /// Rules in force: the send path checks this before taking the lock.
    rules: AtomicUsize,
}

impl FaultInjector {
    pub fn new(seed: u64) -> FaultInjector {
        FaultInjector {
            state: Mutex::new(State { rules: Vec::new(), rng: seed, next_id: 1 }),
            rules: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// With a seed of its own, different from every other in the process.
    pub fn fresh() -> FaultInjector {
        FaultInjector::new(crate::rpc::fresh_seed())
    }

    /// Add a rule; returns its id for [`FaultInjector::remove`].
    pub fn add(&self, text: &str) -> Result<u64, FaultRuleError> {
        let bad = |m: String| FaultRuleError(m);
        let mut words = text.split_whitespace();
        let verb = words.next().ok_or_else(|| bad("empty rule".into()))?;
        let mut rule = FaultRule {
            id: 0,
            action: match verb {
                "drop" => FaultAction::Drop,
                "dup" => FaultAction::Duplicate,
                "cut" => FaultAction::Cut,
                "delay" => FaultAction::Delay(Duration::ZERO),
                other => return Err(bad(format!("unknown action {other:?} (use drop, delay, dup or cut)"))),
            },
            from: "*".into(),
            to: "*".into(),
            opcode: None,
            except: Vec::new(),
            p_micro: 1_000_000,
            remaining: None,
            text: text.split_whitespace().collect::<Vec<_>>().join(" "),
        };
        let mut delay_set = false;
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| bad(format!("expected key=value, got {w:?}")))?;
            match k {
                "from" => rule.from = v.to_string(),
                "to" => rule.to = v.to_string(),
                "opcode" => rule.opcode = Some(v.parse().map_err(|_| bad(format!("opcode {v:?} is not a number")))?),
                "except" => {
                    for o in v.split(',') {
                        rule.except.push(o.parse().map_err(|_| bad(format!("except: opcode {o:?} is not a number")))?);
                    }
                }
                "p" => {
                    let p: f64 = v.parse().map_err(|_| bad(format!("p {v:?} is not a number")))?;
                    if !(0.0..=1.0).contains(&p) {
                        return Err(bad(format!("p {v} is not within 0..1")));
                    }
                    rule.p_micro = (p * 1e6).round() as u64;
                }
                "count" => rule.remaining = Some(v.parse().map_err(|_| bad(format!("count {v:?} is not a number")))?),
                "ms" if matches!(rule.action, FaultAction::Delay(_)) => {
                    let ms: u64 = v.parse().map_err(|_| bad(format!("ms {v:?} is not a number")))?;
                    rule.action = FaultAction::Delay(Duration::from_millis(ms));
                    delay_set = true;
                }
                _ => return Err(bad(format!("unknown key {k:?} for {verb}"))),
            }
        }
        if matches!(rule.action, FaultAction::Delay(_)) && !delay_set {
            return Err(bad("delay needs ms=N".into()));
        }
        let mut st = self.lock();
        if st.rules.len() >= RULES_MAX {
            return Err(bad(format!("at most {RULES_MAX} rules")));
        }
        rule.id = st.next_id;
        st.next_id += 1;
        let id = rule.id;
        st.rules.push(rule);
        self.rules.store(st.rules.len(), Ordering::Release);
        Ok(id)
    }

    /// Remove a rule; false if there was none with this id.
    pub fn remove(&self, id: u64) -> bool {
        let mut st = self.lock();
        let before = st.rules.len();
        st.rules.retain(|r| r.id != id);
        self.rules.store(st.rules.len(), Ordering::Release);
        st.rules.len() != before
    }

    /// The rules in force, each as `ID: RULE` (the id [`FaultInjector::remove`] takes)
    /// with how many times it may still fire when it was given a count.
    pub fn list(&self) -> Vec<String> {
        let st = self.lock();
        st.rules
            .iter()
            .map(|r| match r.remaining {
                Some(n) => format!("{}: {} ({n} left)", r.id, r.text),
                None => format!("{}: {}", r.id, r.text),
            })
            .collect()
    }

    pub fn clear(&self) {
        let mut st = self.lock();
        st.rules.clear();
        self.rules.store(0, Ordering::Release);
    }

    /// The fate of one message from `from` to `to`.
    pub fn decide(&self, from: &Nid, to: &Nid, opcode: u16) -> FaultAction {
        if self.rules.load(Ordering::Acquire) == 0 {
            return FaultAction::Deliver;
        }
        let mut st = self.lock();
        if st.rules.is_empty() {
            return FaultAction::Deliver;
        }
        let State { rules, rng, .. } = &mut *st;
        for r in rules.iter_mut() {
            let matches = from.matches(&r.from)
                && to.matches(&r.to)
                && r.opcode.is_none_or(|o| o == opcode)
                && !r.except.contains(&opcode)
                && r.remaining != Some(0);
            if !matches {
                continue;
            }
            let mut m = crate::rpc::SplitMix(*rng);
            let z = m.next_u64();
            *rng = m.0;
            if z % 1_000_000 < r.p_micro {
                if let Some(n) = r.remaining.as_mut() {
                    *n -= 1;
                }
                return r.action;
            }
        }
        FaultAction::Deliver
    }
}

/// What a sender does with a message under `action`: `Some(n)` — write it `n` times (0 for
/// a drop), after the delay if there is one; `None` — cut the connection instead.
pub async fn copies(action: FaultAction) -> Option<usize> {
    match action {
        FaultAction::Deliver => Some(1),
        FaultAction::Drop => Some(0),
        FaultAction::Duplicate => Some(2),
        FaultAction::Delay(d) => {
            tokio::time::sleep(d).await;
            Some(1)
        }
        FaultAction::Cut => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excepted_opcodes_pass_and_rules_list_as_given() {
        let f = FaultInjector::new(7);
        let (a, b): (Nid, Nid) = ("a@mem".parse().unwrap(), "b@mem".parse().unwrap());
        let id = f.add("drop   except=200,201").unwrap();
        assert_eq!(f.decide(&a, &b, 1), FaultAction::Drop);
        assert_eq!(f.decide(&a, &b, 200), FaultAction::Deliver);
        assert_eq!(f.decide(&a, &b, 201), FaultAction::Deliver);
        f.add("cut opcode=5 count=2").unwrap();
        assert_eq!(
            f.list(),
            vec![format!("{id}: drop except=200,201"), format!("{}: cut opcode=5 count=2 (2 left)", id + 1)]
        );
        assert!(f.remove(id));
        assert_eq!(f.decide(&a, &b, 1), FaultAction::Deliver);
        assert!(f.add("drop except=200,x").unwrap_err().to_string().contains("\"x\" is not a number"));
    }
}
