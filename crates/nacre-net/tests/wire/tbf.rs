//! The TBF policy under a simulated clock: rates hold per client and per job, unmatched
//! requests are not limited, rule changes apply to queued requests, the queue is bounded,
//! and bad rule strings are refused with the reason.

use nacre_net::nid::Nid;
use nacre_net::tbf::{BUCKETS_MAX, Classify, RuleCommand, Tbf, TbfError};

#[derive(Debug, Clone, PartialEq)]
struct Req {
    nid: Nid,
    job: String,
    op: u16,
    n: u32,
}

impl Classify for Req {
    fn nid(&self) -> &Nid {
        &self.nid
    }
    fn job_id(&self) -> &str {
        &self.job
    }
    fn opcode(&self) -> u16 {
        self.op
    }
}

fn req(nid: &str, job: &str, op: u16, n: u32) -> Req {
    Req { nid: nid.parse().unwrap(), job: job.into(), op, n }
}

fn cmd(s: &str) -> RuleCommand {
    s.parse().unwrap()
}

/// Run the scheduler from `from_us` for `span_us`, stepping to each next-ready time;
/// returns the requests served, in order.
fn drain(t: &mut Tbf<Req>, from_us: u64, span_us: u64) -> Vec<Req> {
    let mut now = from_us;
    let mut out = Vec::new();
    while now <= from_us + span_us {
        match t.dequeue(now) {
            Some(r) => out.push(r),
            None => match t.next_ready_us(now) {
                Some(at) if at > now => now = at,
                Some(_) => now += 1,
                None => break,
            },
        }
    }
    out
}

#[test]
fn a_limited_client_gets_its_rate_and_others_are_not_slowed() {
    let mut t = Tbf::new(10_000);
    t.command(cmd("start slow nid={10.0.0.*@tcp*} rate=10"), 0).unwrap();
    for i in 0..100 {
        t.enqueue(req("10.0.0.5@tcp:988", "dd", 4, i), 0).unwrap();
        t.enqueue(req("10.0.9.9@tcp:988", "dd", 4, 1000 + i), 0).unwrap();
    }
    let served = drain(&mut t, 0, 2_000_000);
    let slow = served.iter().filter(|r| r.n < 1000).count();
    let fast = served.iter().filter(|r| r.n >= 1000).count();
    assert_eq!(fast, 100, "the unmatched client is not limited");
    // Two seconds at 10/s, plus the first token: 21 (the depth does not help a bucket
    // that never sits idle).
    assert!((20..=22).contains(&slow), "limited client served {slow} in 2 s at rate 10");
    // FIFO within a client.
    let order: Vec<u32> = served.iter().filter(|r| r.n < 1000).map(|r| r.n).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn each_job_gets_its_own_bucket() {
    let mut t = Tbf::new(10_000);
    t.command(cmd("start jobs jobid={ior.*} rate=5"), 0).unwrap();
    for i in 0..50 {
        t.enqueue(req("10.0.0.1@tcp", "ior.1", 4, i), 0).unwrap();
        t.enqueue(req("10.0.0.1@tcp", "ior.2", 4, 100 + i), 0).unwrap();
    }
    let served = drain(&mut t, 0, 1_000_000);
    let a = served.iter().filter(|r| r.job == "ior.1").count();
    let b = served.iter().filter(|r| r.job == "ior.2").count();
    assert!((5..=7).contains(&a) && (5..=7).contains(&b), "ior.1 {a}, ior.2 {b} in 1 s at 5/s each");
}

#[test]
fn rule_changes_apply_to_queued_requests() {
    let mut t = Tbf::new(10_000);
    t.command(cmd("start writes opcode={4} rate=1"), 0).unwrap();
    for i in 0..40 {
        t.enqueue(req("10.0.0.1@tcp", "x", 4, i), 0).unwrap();
    }
    assert_eq!(drain(&mut t, 0, 1_000_000).len(), 2, "rate 1: the first token and one more");
    t.command(cmd("change writes rate=1000"), 1_000_001).unwrap();
    assert_eq!(drain(&mut t, 1_000_001, 100_000).len(), 38, "the new rate drains the queue");
    for i in 0..40 {
        t.enqueue(req("10.0.0.1@tcp", "x", 4, i), 2_000_000).unwrap();
    }
    t.command(cmd("change writes rate=1"), 2_000_000).unwrap();
    t.command(cmd("stop writes"), 2_000_000).unwrap();
    assert_eq!(drain(&mut t, 2_000_000, 10).len(), 40, "stopped rule: queued requests are free");
    assert!(t.is_empty());
}

#[test]
fn the_queue_is_bounded() {
    let mut t = Tbf::new(3);
    t.command(cmd("start s nid={*} rate=1"), 0).unwrap();
    for i in 0..3 {
        t.enqueue(req("10.0.0.1@tcp", "x", 1, i), 0).unwrap();
    }
    assert_eq!(t.enqueue(req("10.0.0.1@tcp", "x", 1, 9), 0), Err(TbfError::Full { capacity: 3 }));
    assert_eq!(t.len(), 3);
}

#[test]
fn bad_rules_are_refused_with_the_reason() {
    let e = |s: &str| s.parse::<RuleCommand>().unwrap_err().to_string();
    assert!(e("start").contains("needs a rule name"));
    assert!(e("start r nid={} rate=5").contains("1 to 64 patterns"));
    assert!(e("start r nid={a} rate=0").contains("positive number"));
    assert!(e("start r host={a} rate=5").contains("unknown match \"host\""));
    assert!(e("start r opcode={write} rate=5").contains("opcode \"write\" is not a number"));
    assert!(e("start r nid={a rate=5").contains("missing '}'"));
    assert!(e("pause r").contains("unknown command"));
    assert!(e("start bad/name nid={a} rate=1").contains("rule name"));
    let mut t: Tbf<Req> = Tbf::new(10);
    t.command(cmd("start a nid={*} rate=1"), 0).unwrap();
    assert_eq!(t.command(cmd("start a nid={*} rate=2"), 0), Err(TbfError::DuplicateRule("a".into())));
    assert_eq!(t.command(cmd("stop b"), 0), Err(TbfError::NoSuchRule("b".into())));
    assert_eq!(t.rules().len(), 1);
}

#[test]
fn idle_buckets_do_not_accumulate() {
    let mut t = Tbf::new(100);
    t.command(cmd("start all nid={*} rate=100"), 0).unwrap();
    // 20,000 clients, one request each, spread over 20 s: the bucket map stays small.
    let mut now = 0;
    for i in 0..20_000u32 {
        let nid = format!("10.{}.{}.{}@tcp", i >> 16, (i >> 8) & 255, i & 255);
        t.enqueue(req(&nid, "x", 1, i), now).unwrap();
        assert!(t.dequeue(now).is_some());
        now += 1_000;
        assert!(t.bucket_count() <= 2 * t.len() + 64 + 1, "{} buckets for {} queued", t.bucket_count(), t.len());
    }
}

#[test]
fn clients_cannot_grow_the_bucket_table_past_its_cap_and_draining_loses_nothing() {
    let mut t: Tbf<Req> = Tbf::new(100_000);
    t.command(cmd("start jobs jobid={*} rate=1"), 0).unwrap();
    // Every request a new job id, all queued at once.
    for i in 0..(BUCKETS_MAX as u32 + 500) {
        t.enqueue(req("10.0.0.1@tcp", &format!("job{i}"), 4, i), 0).unwrap();
    }
    assert!(t.bucket_count() <= BUCKETS_MAX + 1, "{} buckets", t.bucket_count());
    // A bucket's tokens do not overflow after a long idle time at a high rate.
    t.command(cmd("change jobs rate=18446744073709551615"), 0).unwrap();
    assert!(t.dequeue(u64::MAX / 2).is_some());
    let left = t.len();
    let all = t.drain_all();
    assert_eq!(all.len(), left, "every queued request comes out");
    assert!(t.is_empty());
}
