//! The token bucket filter (TBF) request policy, after Lustre's NRS TBF: rules give
//! clients (by NID), jobs (by job id) or operations (by opcode) a rate in requests per
//! second, each matching client or job getting its own bucket. Requests wait in their
//! bucket's FIFO; the scheduler hands out the request whose bucket gets a token first.
//!
//! Rules are set at run time with Lustre-like strings:
//! `start NAME nid={127.0.0.1@tcp:9000 10.0.0.*@tcp*} rate=100`,
//! `start NAME jobid={dd.* ior.42} rate=50`, `start NAME opcode={4 5} rate=10`,
//! `change NAME rate=N`, `stop NAME`. Rules are matched in the order they were started;
//! requests that match none share no limit. A rule change applies to requests already
//! queued: they are classified again. The queue holds at most `capacity` requests — the
//! service's request-buffer bound — and refuses more, so a storm slows clients down
//! instead of growing memory.
//!
//! Time is passed in (microseconds of a monotonic clock) so tests and a simulator drive
//! the policy deterministically.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use crate::glob::glob;
use crate::nid::Nid;

/// Burst a bucket may save up, in requests (Lustre's default depth is 3).
pub const BUCKET_DEPTH: u64 = 3;
/// Longest rule name.
const RULE_NAME_MAX: usize = 32;
/// Most buckets kept at once; see [`Tbf::enqueue`].
pub const BUCKETS_MAX: usize = 4096;
/// The bucket key that requests of a rule share once there are `BUCKETS_MAX` buckets.
const OVERFLOW_KEY: &str = "*overflow*";
/// Patterns per rule.
const PATTERNS_MAX: usize = 64;

/// What the policy needs to know of a request.
pub trait Classify {
    fn nid(&self) -> &Nid;
    fn job_id(&self) -> &str;
    fn opcode(&self) -> u16;
}

/// What a rule matches on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    Nid(Vec<String>),
    JobId(Vec<String>),
    Opcode(Vec<u16>),
}

/// One rule: a name, what it matches, and the rate each matching client or job gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub matcher: Matcher,
    /// Requests per second per bucket.
    pub rate: u64,
}

/// A parsed rule command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleCommand {
    Start(Rule),
    Change { name: String, rate: u64 },
    Stop { name: String },
}

/// Why a rule command or a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TbfError {
    /// The command text is malformed; the message says where.
    Syntax(String),
    DuplicateRule(String),
    NoSuchRule(String),
    /// The queue holds `capacity` requests already.
    Full {
        capacity: usize,
    },
}

impl fmt::Display for TbfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TbfError::Syntax(s) => write!(f, "bad TBF rule: {s}"),
            TbfError::DuplicateRule(n) => write!(f, "TBF rule '{n}' already exists"),
            TbfError::NoSuchRule(n) => write!(f, "no TBF rule named '{n}'"),
            TbfError::Full { capacity } => write!(f, "request queue full ({capacity} requests)"),
        }
    }
}

impl std::error::Error for TbfError {}

impl Rule {
    /// The bucket a request falls in under this rule, if it matches.
    fn bucket_key<R: Classify>(&self, r: &R) -> Option<String> {
        match &self.matcher {
            Matcher::Nid(pats) => {
                // One bucket per client host, however many connections it has.
                pats.iter().any(|p| r.nid().matches(p)).then(|| r.nid().host())
            }
            Matcher::JobId(pats) => pats.iter().any(|p| glob(p, r.job_id())).then(|| r.job_id().to_string()),
            Matcher::Opcode(ops) => ops.contains(&r.opcode()).then(|| r.opcode().to_string()),
        }
    }
}

impl std::str::FromStr for RuleCommand {
    type Err = TbfError;

    fn from_str(s: &str) -> Result<RuleCommand, TbfError> {
        let syntax = |m: String| TbfError::Syntax(m);
        let mut words = s.split_whitespace();
        let verb = words.next().ok_or_else(|| syntax("empty command".into()))?;
        let name = words.next().ok_or_else(|| syntax(format!("'{verb}' needs a rule name")))?;
        if name.is_empty()
            || name.len() > RULE_NAME_MAX
            || !name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        {
            return Err(syntax(format!("rule name {name:?}: 1-{RULE_NAME_MAX} of A-Z a-z 0-9 _ -")));
        }
        let rest: Vec<&str> = words.collect();
        let rest = rest.join(" ");
        let parse_rate = |text: &str| -> Result<u64, TbfError> {
            let v = text.strip_prefix("rate=").ok_or_else(|| syntax(format!("expected rate=N, got {text:?}")))?;
            match v.parse::<u64>() {
                Ok(r) if r > 0 => Ok(r),
                _ => Err(syntax(format!("rate {v:?} is not a positive number of requests per second"))),
            }
        };
        match verb {
            "stop" if rest.is_empty() => Ok(RuleCommand::Stop { name: name.into() }),
            "stop" => Err(syntax(format!("unexpected {rest:?} after 'stop {name}'"))),
            "change" => Ok(RuleCommand::Change { name: name.into(), rate: parse_rate(rest.trim())? }),
            "start" => {
                let (kind, tail) =
                    rest.split_once("={").ok_or_else(|| syntax("expected nid={…}, jobid={…} or opcode={…}".into()))?;
                let (list, tail) = tail.split_once('}').ok_or_else(|| syntax("missing '}'".into()))?;
                let items: Vec<&str> = list.split_whitespace().collect();
                if items.is_empty() || items.len() > PATTERNS_MAX {
                    return Err(syntax(format!("a rule takes 1 to {PATTERNS_MAX} patterns")));
                }
                let matcher = match kind.trim() {
                    "nid" => Matcher::Nid(items.iter().map(|s| s.to_string()).collect()),
                    "jobid" => Matcher::JobId(items.iter().map(|s| s.to_string()).collect()),
                    "opcode" => Matcher::Opcode(
                        items
                            .iter()
                            .map(|s| s.parse::<u16>().map_err(|_| syntax(format!("opcode {s:?} is not a number"))))
                            .collect::<Result<_, _>>()?,
                    ),
                    other => return Err(syntax(format!("unknown match {other:?} (use nid, jobid or opcode)"))),
                };
                Ok(RuleCommand::Start(Rule { name: name.into(), matcher, rate: parse_rate(tail.trim())? }))
            }
            other => Err(syntax(format!("unknown command {other:?} (use start, change or stop)"))),
        }
    }
}

#[derive(Debug)]
struct Bucket<R> {
    rate: u64,
    /// Tokens, in millionths of a request.
    tokens_micro: u64,
    last_us: u64,
    queue: VecDeque<R>,
}

impl<R> Bucket<R> {
    fn new(rate: u64, now_us: u64) -> Bucket<R> {
        // A new bucket starts with one request's worth: the first request goes at once.
        Bucket { rate, tokens_micro: 1_000_000, last_us: now_us, queue: VecDeque::new() }
    }

    fn refill(&mut self, now_us: u64) {
        let dt = now_us.saturating_sub(self.last_us);
        self.last_us = now_us.max(self.last_us);
        let cap = BUCKET_DEPTH * 1_000_000;
        self.tokens_micro = self.tokens_micro.saturating_add(dt.saturating_mul(self.rate)).min(cap);
    }

    /// Microseconds until this bucket has a whole token.
    fn wait_us(&self) -> u64 {
        if self.tokens_micro >= 1_000_000 { 0 } else { (1_000_000 - self.tokens_micro).div_ceil(self.rate) }
    }
}

/// The TBF queue of one service.
pub struct Tbf<R> {
    rules: Vec<Rule>,
    /// Keyed by (rule name, client or job); requests matching no rule are kept in `free`.
    buckets: BTreeMap<(String, String), Bucket<R>>,
    free: VecDeque<R>,
    queued: usize,
    capacity: usize,
}

impl<R: Classify> Tbf<R> {
    pub fn new(capacity: usize) -> Tbf<R> {
        Tbf { rules: Vec::new(), buckets: BTreeMap::new(), free: VecDeque::new(), queued: 0, capacity }
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Requests it may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.queued
    }

    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Buckets held (for memory accounting and tests).
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Apply a rule command; queued requests are classified again under the new rules.
    pub fn command(&mut self, cmd: RuleCommand, now_us: u64) -> Result<(), TbfError> {
        match cmd {
            RuleCommand::Start(rule) => {
                if self.rules.iter().any(|r| r.name == rule.name) {
                    return Err(TbfError::DuplicateRule(rule.name));
                }
                self.rules.push(rule);
            }
            RuleCommand::Change { name, rate } => {
                let r = self.rules.iter_mut().find(|r| r.name == name).ok_or(TbfError::NoSuchRule(name))?;
                r.rate = rate;
            }
            RuleCommand::Stop { name } => {
                let i = self.rules.iter().position(|r| r.name == name).ok_or(TbfError::NoSuchRule(name))?;
                self.rules.remove(i);
            }
        }
        self.reclassify(now_us);
        Ok(())
    }

    fn reclassify(&mut self, now_us: u64) {
        let mut all: Vec<R> = self.free.drain(..).collect();
        let old = std::mem::take(&mut self.buckets);
        let mut kept: BTreeMap<(String, String), Bucket<R>> = BTreeMap::new();
        for (key, mut b) in old {
            all.extend(b.queue.drain(..));
            // Keep the token state of buckets whose rule still exists, at the rule's rate.
            if let Some(rule) = self.rules.iter().find(|r| r.name == key.0) {
                b.refill(now_us);
                b.rate = rule.rate;
                kept.insert(key, b);
            }
        }
        self.buckets = kept;
        self.queued = 0;
        // Order among requests of one bucket is kept: `all` holds each old queue in order.
        for r in all {
            self.place(r, now_us);
        }
    }

    fn place(&mut self, r: R, now_us: u64) {
        self.queued += 1;
        for rule in &self.rules {
            if let Some(mut k) = rule.bucket_key(&r) {
                let rate = rule.rate;
                // Clients choose their job ids: past BUCKETS_MAX, new keys of a rule share
                // one bucket instead of growing the table.
                if self.buckets.len() >= BUCKETS_MAX && !self.buckets.contains_key(&(rule.name.clone(), k.clone())) {
                    k = OVERFLOW_KEY.to_string();
                }
                self.buckets
                    .entry((rule.name.clone(), k))
                    .or_insert_with(|| Bucket::new(rate, now_us))
                    .queue
                    .push_back(r);
                return;
            }
        }
        self.free.push_back(r);
    }

    /// Queue a request, or refuse it when the queue is full.
    pub fn enqueue(&mut self, r: R, now_us: u64) -> Result<(), TbfError> {
        if self.queued >= self.capacity {
            return Err(TbfError::Full { capacity: self.capacity });
        }
        // Buckets outlive their requests only while their tokens matter; sweep the idle
        // ones before their number can outgrow the queue (20,000 clients, one request each).
        if self.buckets.len() > 2 * self.queued + 64 {
            self.buckets.retain(|_, b| {
                b.refill(now_us);
                !b.queue.is_empty() || b.tokens_micro < BUCKET_DEPTH * 1_000_000
            });
        }
        self.place(r, now_us);
        Ok(())
    }

    /// Take every queued request out, in no particular order (switching policies).
    pub fn drain_all(&mut self) -> Vec<R> {
        let mut all: Vec<R> = self.free.drain(..).collect();
        for b in self.buckets.values_mut() {
            all.extend(b.queue.drain(..));
        }
        self.queued = 0;
        all
    }

    /// The next request allowed to run now: unlimited requests first, then the bucket with
    /// the most tokens saved (the one that has waited longest). `None` if nothing may run before
    /// [`Tbf::next_ready_us`].
    pub fn dequeue(&mut self, now_us: u64) -> Option<R> {
        if let Some(r) = self.free.pop_front() {
            self.queued -= 1;
            return Some(r);
        }
        let mut best: Option<(&(String, String), u64)> = None;
        for (k, b) in self.buckets.iter_mut() {
            if b.queue.is_empty() {
                continue;
            }
            b.refill(now_us);
            if b.wait_us() == 0 && best.is_none_or(|(_, t)| b.tokens_micro > t) {
                best = Some((k, b.tokens_micro));
            }
        }
        let key = best.map(|(k, _)| k.clone())?;
        let b = self.buckets.get_mut(&key)?;
        b.tokens_micro -= 1_000_000;
        let r = b.queue.pop_front();
        if r.is_some() {
            self.queued -= 1;
        }
        // Idle buckets with full tokens carry no information: drop them to bound memory.
        if b.queue.is_empty() && b.tokens_micro + 1_000_000 >= BUCKET_DEPTH * 1_000_000 {
            self.buckets.remove(&key);
        }
        r
    }

    /// When the next request may run (now if one may), `None` if the queue is empty.
    pub fn next_ready_us(&mut self, now_us: u64) -> Option<u64> {
        if !self.free.is_empty() {
            return Some(now_us);
        }
        self.buckets
            .values_mut()
            .filter(|b| !b.queue.is_empty())
            .map(|b| {
                b.refill(now_us);
                now_us + b.wait_us()
            })
            .min()
    }
}
