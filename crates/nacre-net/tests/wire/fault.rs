//! Fault rules: what they match, how often they fire, and the refusals of bad rule text.

use std::time::Duration;

use nacre_net::fault::{FaultAction, FaultInjector};
use nacre_net::nid::Nid;

fn nid(s: &str) -> Nid {
    s.parse().unwrap()
}

#[test]
fn rules_match_by_endpoint_and_opcode_and_stop_after_their_count() {
    let f = FaultInjector::new(42);
    let (c1, c2, mds) = (nid("10.0.0.1@tcp:988"), nid("10.0.1.1@tcp:988"), nid("mds0@mem"));
    assert_eq!(f.decide(&c1, &mds, 4), FaultAction::Deliver, "no rules: everything goes");
    let id = f.add("drop from=10.0.0.*@tcp* to=mds0@mem opcode=4 count=3").unwrap();
    f.add("delay ms=200 to=mds0@mem opcode=7").unwrap();
    let drops = (0..10).filter(|_| f.decide(&c1, &mds, 4) == FaultAction::Drop).count();
    assert_eq!(drops, 3, "count=3 fires three times");
    assert_eq!(f.decide(&c2, &mds, 4), FaultAction::Deliver, "other client not matched");
    assert_eq!(f.decide(&c1, &mds, 5), FaultAction::Deliver, "other opcode not matched");
    assert_eq!(f.decide(&c2, &mds, 7), FaultAction::Delay(Duration::from_millis(200)));
    assert!(f.remove(id));
    assert!(!f.remove(id));
    f.clear();
    assert_eq!(f.decide(&c2, &mds, 7), FaultAction::Deliver);
}

#[test]
fn probabilities_are_seeded_and_roughly_right() {
    let run = |seed| {
        let f = FaultInjector::new(seed);
        f.add("dup p=0.25").unwrap();
        (0..10_000).filter(|_| f.decide(&nid("a@mem"), &nid("b@mem"), 1) == FaultAction::Duplicate).count()
    };
    let n = run(7);
    assert_eq!(n, run(7), "same seed, same decisions");
    assert!((2_200..2_800).contains(&n), "p=0.25 fired {n} times in 10,000");
}

#[test]
fn bad_rules_name_the_problem() {
    let f = FaultInjector::new(1);
    let e = |s: &str| f.add(s).unwrap_err().to_string();
    assert!(e("").contains("empty rule"));
    assert!(e("explode").contains("unknown action"));
    assert!(e("delay to=x@mem").contains("delay needs ms=N"));
    assert!(e("drop p=2").contains("not within 0..1"));
    assert!(e("drop opcode=write").contains("is not a number"));
    assert!(e("drop ms=5").contains("unknown key \"ms\" for drop"));
    assert!(e("drop to").contains("expected key=value"));
}
