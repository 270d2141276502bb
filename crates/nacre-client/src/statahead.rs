//! Statahead: when a process looks up the names of a directory one after another in a
//! numbered sequence (`file.0`, `file.1`, ..., as mdtest and many job scripts name their
//! files), the attributes of the next names are fetched ahead, many per request, and its
//! later lookups are answered here without a round trip. This is Lustre's statahead for
//! regularized file names (`llite.*.statahead_max`).
//!
//! - A sequence is a directory and a name prefix, followed for one set of credentials.
//!   It runs once [`RUN_MIN`] lookups in a row asked for the previous number plus one,
//!   with no change sent from this mount in between (a process removing or touching each
//!   file it looks up gains nothing from statahead); then the window opens at
//!   [`WINDOW_MIN`] names and doubles with each fetch, up to `statahead_max`. A lookup
//!   that breaks the sequence starts it over from its name; one that skips names inside
//!   what was fetched (missing files) goes on with it. Zero-padded numbers keep their
//!   width (`f099`, `f100`).
//! - One fetch per sequence is in flight at a time, and the next starts when the reader
//!   is half way through what was fetched. A lookup of a name the fetch in flight covers
//!   waits for it (at most [`WAIT_MAX`]) rather than asking on its own. A fetch that a
//!   change overlapped is thrown away, and the sequence starts over at the smallest
//!   window.
//! - An answer is used once, within [`AGE`] of its fetch, and only if no change went out
//!   from this mount since its sequence started (a create, unlink, setattr...: the
//!   mount's change count says; a close changes nothing a lookup answers and is not
//!   counted). Other mounts' changes show within [`AGE`], as they do through the
//!   kernel's attribute cache on a FUSE mount.
//! - At most [`SEQUENCES_MAX`] sequences are followed; the one used least recently goes.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nacre_proto::fid::Fid;
use nacre_proto::mdt::{Attr, Creds};
use tokio::sync::watch;

/// Lookups in a row, each the previous number plus one, before anything is fetched.
pub const RUN_MIN: u32 = 3;
/// Names of a sequence's first fetch.
pub const WINDOW_MIN: u64 = 8;
/// How long a fetched answer may stand in for a lookup.
pub const AGE: Duration = Duration::from_secs(1);
/// Sequences followed at once.
pub const SEQUENCES_MAX: usize = 64;
/// How long a lookup waits for the fetch in flight that covers its name before it asks
/// the MDT itself (a fetch is one round trip; this bounds a slow or dead shard's cost).
pub const WAIT_MAX: Duration = Duration::from_millis(100);

/// A name split into a prefix and a trailing number: `file.mdtest.3.` and 17 from
/// `file.mdtest.3.17`. `width` is the digits' count when the number is zero-padded
/// (`f007`), else 0.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Numbered<'n> {
    prefix: &'n str,
    number: u64,
    width: usize,
}

fn numbered(name: &str) -> Option<Numbered<'_>> {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    // Up to 18 digits fit a u64 with room to count on.
    if digits == 0 || digits > 18 {
        return None;
    }
    let (prefix, tail) = name.split_at(name.len() - digits);
    let number = tail.parse().ok()?;
    let width = if digits > 1 && tail.starts_with('0') { digits } else { 0 };
    Some(Numbered { prefix, number, width })
}

fn name_of(prefix: &str, number: u64, width: usize) -> String {
    format!("{prefix}{number:0width$}")
}

/// A fetch in flight: its numbers, its end (true once landed), and its id.
struct Inflight {
    range: RangeInclusive<u64>,
    landed: watch::Receiver<bool>,
    id: u64,
}

struct Sequence {
    creds: Creds,
    /// Digits of the zero-padded numbers (0: not padded).
    width: usize,
    /// The mount's change count when the sequence started: a lookup after a change starts
    /// it over, so its fetches and their answers are good only while the count is this.
    changes: u64,
    /// The number a lookup continuing the sequence asks next.
    next: u64,
    run: u32,
    window: u64,
    /// The highest number fetched or being fetched (`None`: nothing yet).
    fetched_to: Option<u64>,
    /// Fetched answers by number: the attributes, and when.
    ready: HashMap<u64, (Attr, Instant)>,
    inflight: Option<Inflight>,
    used: u64,
}

/// What statahead has for a lookup.
pub enum Probe {
    Hit(Attr),
    /// A fetch in flight covers the name: wait for it, then probe again.
    Wait(watch::Receiver<bool>),
    Miss,
}

/// Names to fetch for a sequence. Its landing is told with [`Statahead::landed`]; the
/// sender ends the wait of lookups that found it in flight when dropped.
pub struct Fetch {
    pub dir: Fid,
    pub prefix: String,
    /// Which fetch of its sequence this is: a sequence that started over meanwhile has
    /// another one in flight.
    pub id: u64,
    pub first: u64,
    pub names: Vec<String>,
    pub done: watch::Sender<bool>,
}

/// The sequences by directory and prefix, a clock of notes for least-recent use, and the
/// last fetch id given.
#[derive(Default)]
struct Sequences {
    map: HashMap<(Fid, String), Sequence>,
    tick: u64,
    fetches: u64,
}

/// Does `name` (split as `n`) belong to a sequence of numbers `width` digits wide?
fn fits(name: &str, n: &Numbered<'_>, width: usize) -> bool {
    n.width == width || name_of(n.prefix, n.number, width) == name
}

#[derive(Default)]
pub struct Statahead {
    sequences: Mutex<Sequences>,
}

impl Statahead {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sequences> {
        self.sequences.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fetched answer for `name` of `dir`, if there is a good one; `changes` is the
    /// mount's change count now.
    pub fn probe(&self, dir: Fid, creds: &Creds, name: &str, changes: u64) -> Probe {
        let Some(n) = numbered(name) else { return Probe::Miss };
        let mut g = self.lock();
        let Some(s) = g.map.get_mut(&(dir, n.prefix.to_string())) else { return Probe::Miss };
        // After a change, nothing fetched is used and no fetch is waited for: it will be
        // thrown away when it lands.
        if s.creds != *creds || !fits(name, &n, s.width) || s.changes != changes {
            return Probe::Miss;
        }
        if let Some((a, at)) = s.ready.remove(&n.number) {
            if at.elapsed() < AGE {
                return Probe::Hit(a);
            }
            // The reader fell behind its window: what is left of it is as old. Fetch again
            // from here.
            s.ready.retain(|_, e| e.1.elapsed() < AGE);
            if s.inflight.is_none() {
                s.fetched_to = Some(n.number);
            }
            return Probe::Miss;
        }
        match &s.inflight {
            Some(f) if f.range.contains(&n.number) => Probe::Wait(f.landed.clone()),
            _ => Probe::Miss,
        }
    }

    /// Follow a lookup of `name` of `dir` that was answered (here or by the MDT); a fetch
    /// to start, if one is due. `max` is `statahead_max` (0: statahead is off), `changes`
    /// the mount's change count now.
    pub fn note(&self, dir: Fid, creds: &Creds, name: &str, max: u64, changes: u64) -> Option<Fetch> {
        if max == 0 {
            return None;
        }
        let n = numbered(name)?;
        let mut g = self.lock();
        g.tick += 1;
        g.fetches += 1;
        let (tick, id) = (g.tick, g.fetches);
        let map = &mut g.map;
        let key = (dir, n.prefix.to_string());
        // The next number, or one further inside what was fetched (a missing name
        // skipped), continues the sequence.
        let continues = map.get(&key).is_some_and(|s| {
            s.creds == *creds
                && s.changes == changes
                && fits(name, &n, s.width)
                && (s.next == n.number || (n.number > s.next && s.fetched_to.is_some_and(|t| n.number <= t)))
        });
        if !continues {
            if !map.contains_key(&key) && map.len() >= SEQUENCES_MAX {
                let oldest = map.iter().min_by_key(|(_, s)| s.used).map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    map.remove(&k);
                }
            }
            map.insert(
                key,
                Sequence {
                    creds: creds.clone(),
                    width: n.width,
                    changes,
                    next: n.number.saturating_add(1),
                    run: 1,
                    window: 0,
                    fetched_to: None,
                    ready: HashMap::new(),
                    inflight: None,
                    used: tick,
                },
            );
            return None;
        }
        let s = map.get_mut(&key)?;
        s.used = tick;
        s.run = s.run.saturating_add(1);
        s.next = n.number.saturating_add(1);
        s.ready.retain(|k, _| *k > n.number);
        if s.run < RUN_MIN || s.inflight.is_some() {
            return None;
        }
        let ahead = s.fetched_to.map_or(0, |t| t.saturating_sub(n.number));
        if ahead > s.window / 2 {
            return None;
        }
        s.window = (s.window * 2).clamp(WINDOW_MIN.min(max), max);
        let first = s.fetched_to.map_or(s.next, |t| t.saturating_add(1).max(s.next));
        let last = first.saturating_add(s.window - 1);
        let (done, landed) = watch::channel(false);
        s.fetched_to = Some(last);
        s.inflight = Some(Inflight { range: first..=last, landed, id });
        Some(Fetch {
            dir,
            prefix: n.prefix.to_string(),
            id,
            first,
            names: (first..=last).map(|i| name_of(n.prefix, i, s.width)).collect(),
            done,
        })
    }

    /// A fetch landed: `found` holds the attributes of the names that exist (`None`: it
    /// failed), `changes` is the mount's change count now.
    pub fn landed(&self, f: &Fetch, found: Option<Vec<(u64, Attr)>>, changes: u64) {
        let mut g = self.lock();
        let Some(s) = g.map.get_mut(&(f.dir, f.prefix.clone())) else { return };
        if s.inflight.as_ref().is_none_or(|i| i.id != f.id) {
            // The sequence started over meanwhile: this fetch is not its own.
            return;
        }
        s.inflight = None;
        match found {
            Some(found) if s.changes == changes => {
                let now = Instant::now();
                for (i, a) in found {
                    if i >= s.next {
                        s.ready.insert(i, (a, now));
                    }
                }
            }
            // Failed, or a change went out meanwhile: start over from where the reader
            // is, at the smallest window, after a new run.
            _ => {
                s.fetched_to = s.next.checked_sub(1);
                s.run = 0;
                s.window = 0;
            }
        }
    }

    /// Answers held, over every sequence.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.lock().map.values().map(|s| s.ready.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lookups of `names` in order, with no change between them: the last starts a fetch,
    /// the others none.
    fn run(sa: &Statahead, d: Fid, c: &Creds, names: &[&str], max: u64) -> Fetch {
        let (last, first) = names.split_last().expect("a name");
        for n in first {
            assert!(sa.note(d, c, n, max, 0).is_none(), "{n} starts nothing");
        }
        sa.note(d, c, last, max, 0).expect("the run starts a fetch")
    }

    fn attr(n: u64) -> Attr {
        Attr { fid: Fid::new(0x2_0000_0400, n as u32 + 1), nlink: 1, ..Attr::default() }
    }

    #[test]
    fn names_split_into_prefix_and_number_and_format_back() {
        let n = numbered("file.mdtest.3.17").unwrap();
        assert_eq!((n.prefix, n.number, n.width), ("file.mdtest.3.", 17, 0));
        assert_eq!(name_of(n.prefix, 18, n.width), "file.mdtest.3.18");
        let z = numbered("f007").unwrap();
        assert_eq!((z.prefix, z.number, z.width), ("f", 7, 3));
        assert_eq!(name_of("f", 8, 3), "f008");
        assert_eq!(numbered("0").map(|n| (n.number, n.width)), Some((0, 0)));
        assert!(numbered("plain").is_none());
        assert!(numbered(&"9".repeat(19)).is_none(), "too long for a u64 with room");
    }

    #[test]
    fn a_run_opens_a_window_that_doubles_and_answers_are_used_once() {
        let sa = Statahead::default();
        let (d, c) = (Fid::new(0x2_0000_0400, 1), Creds::default());
        let f = run(&sa, d, &c, &["f0", "f1", "f2"], 128);
        assert_eq!(f.names, (3..11).map(|i| format!("f{i}")).collect::<Vec<_>>());
        assert!(matches!(sa.probe(d, &c, "f3", 0), Probe::Wait(_)), "in flight: wait for it");
        assert!(matches!(sa.probe(d, &c, "f11", 0), Probe::Miss));
        // f5 does not exist: it is simply not among the answers.
        let found = (3..11).filter(|&i| i != 5).map(|i| (i, attr(i))).collect();
        sa.landed(&f, Some(found), 0);
        assert_eq!(sa.held(), 7);
        match sa.probe(d, &c, "f3", 0) {
            Probe::Hit(a) => assert_eq!(a, attr(3)),
            _ => panic!("f3 was fetched"),
        }
        assert!(matches!(sa.probe(d, &c, "f3", 0), Probe::Miss), "an answer is used once");
        assert!(sa.note(d, &c, "f3", 128, 0).is_none(), "7 ahead of 8: not yet");
        assert!(matches!(sa.probe(d, &c, "f4", 1), Probe::Miss), "a change went out since the fetch");
        assert!(sa.note(d, &c, "f4", 128, 0).is_none());
        assert!(matches!(sa.probe(d, &c, "f5", 0), Probe::Miss), "f5 does not exist");
        assert!(sa.note(d, &c, "f5", 128, 0).is_none(), "still 5 ahead");
        let g = sa.note(d, &c, "f6", 128, 0).expect("half way through: the next fetch, twice as long");
        assert_eq!((g.first, g.names.len()), (11, 16));
        assert!(matches!(sa.probe(d, &c, "f7", 0), Probe::Hit(_)));
        assert!(matches!(sa.probe(d, &c, "f7", 0), Probe::Miss), "{} held", sa.held());
        // Other credentials never see these answers.
        let other = Creds { uid: 1000, gid: 1000, ..Creds::default() };
        assert!(matches!(sa.probe(d, &other, "f9", 0), Probe::Miss));
        assert!(matches!(sa.probe(d, &c, "f9", 0), Probe::Hit(_)));
    }

    #[test]
    fn a_break_starts_over_and_a_fetch_of_the_old_run_is_ignored() {
        let sa = Statahead::default();
        let (d, c) = (Fid::new(0x2_0000_0400, 1), Creds::default());
        let f = run(&sa, d, &c, &["a0", "a1", "a2"], 64);
        assert!(sa.note(d, &c, "a20", 64, 0).is_none(), "a jump past what was fetched starts over");
        sa.landed(&f, Some(vec![(3, attr(3))]), 0);
        assert_eq!(sa.held(), 0, "the old run's answers are dropped");
        // Two prefixes in one directory are two sequences (mdtest-hard's tasks).
        run(&sa, d, &c, &["b0", "b1", "b2"], 64);
        assert!(sa.note(d, &c, "a21", 64, 0).is_none());
        assert!(matches!(sa.probe(d, &c, "b3", 0), Probe::Wait(_)), "b's fetch is in flight");
        // A skip inside what was fetched goes on with the run.
        run(&sa, d, &c, &["s0", "s1", "s2"], 64);
        assert!(sa.note(d, &c, "s5", 64, 0).is_none());
        assert!(matches!(sa.probe(d, &c, "s6", 0), Probe::Wait(_)), "the run and its fetch went on");
        // Off: nothing is followed.
        assert!(sa.note(d, &c, "z0", 0, 0).is_none());
    }

    #[test]
    fn a_failed_fetch_is_asked_again_and_answers_grow_old() {
        let sa = Statahead::default();
        let (d, c) = (Fid::new(0x2_0000_0400, 1), Creds::default());
        let f = run(&sa, d, &c, &["x0", "x1", "x2"], 16);
        sa.landed(&f, None, 0);
        assert!(sa.note(d, &c, "x3", 16, 0).is_none(), "a new run first");
        assert!(sa.note(d, &c, "x4", 16, 0).is_none());
        let again = sa.note(d, &c, "x5", 16, 0).expect("refetched from where the reader is");
        assert_eq!((again.first, again.names.len()), (6, 8));
        sa.landed(&again, Some(vec![(6, attr(6))]), 0);
        {
            let mut g = sa.lock();
            let s = g.map.get_mut(&(d, "x".to_string())).unwrap();
            let e = s.ready.get_mut(&6).unwrap();
            e.1 = Instant::now().checked_sub(AGE).unwrap();
        }
        assert!(matches!(sa.probe(d, &c, "x6", 0), Probe::Miss), "older than AGE");
        let next = sa.note(d, &c, "x6", 16, 0).expect("a reader behind its window is fetched for again");
        assert_eq!(next.first, 7);
    }

    #[test]
    fn a_fetch_is_told_apart_from_a_later_one_with_the_same_first_number() {
        let sa = Statahead::default();
        let (d, c) = (Fid::new(0x2_0000_0400, 1), Creds::default());
        let old = run(&sa, d, &c, &["f0", "f1", "f2"], 64);
        // The same prefix, zero-padded: a new sequence whose first fetch also starts at 3.
        let new = run(&sa, d, &c, &["f000", "f001", "f002"], 64);
        assert_eq!((old.first, new.first), (3, 3));
        assert_eq!(new.names[0], "f003");
        sa.landed(&old, Some(vec![(3, attr(3))]), 0);
        assert!(matches!(sa.probe(d, &c, "f003", 0), Probe::Wait(_)), "f3's attributes are not f003's");
        sa.landed(&new, Some(vec![(3, attr(33))]), 0);
        match sa.probe(d, &c, "f003", 0) {
            Probe::Hit(a) => assert_eq!(a, attr(33)),
            _ => panic!("f003 was fetched"),
        }
    }

    #[test]
    fn changes_between_lookups_or_during_a_fetch_hold_statahead_back() {
        let sa = Statahead::default();
        let (d, c) = (Fid::new(0x2_0000_0400, 1), Creds::default());
        // A change between each lookup (rm file.*): never a fetch.
        for i in 0..10u64 {
            assert!(sa.note(d, &c, &format!("r{i}"), 64, 2 * i).is_none(), "r{i}");
        }
        // A change during a fetch: nobody waits for it, its answers go, and the sequence
        // needs a new run before it fetches again.
        let f = run(&sa, d, &c, &["g0", "g1", "g2"], 64);
        assert!(matches!(sa.probe(d, &c, "g3", 2), Probe::Miss), "no wait on a fetch a change overlapped");
        sa.landed(&f, Some(vec![(3, attr(3)), (4, attr(4))]), 2);
        assert!(matches!(sa.probe(d, &c, "g3", 2), Probe::Miss));
        assert!(sa.note(d, &c, "g3", 64, 2).is_none(), "the change count moved: a new run");
        assert!(sa.note(d, &c, "g4", 64, 2).is_none());
        let again = sa.note(d, &c, "g5", 64, 2).expect("a new run, a new fetch");
        assert_eq!((again.first, again.names.len()), (6, 8), "from where the reader is, smallest window");
    }

    #[test]
    fn zero_padded_numbers_keep_their_width_past_a_power_of_ten() {
        let sa = Statahead::default();
        let (d, c) = (Fid::new(0x2_0000_0400, 1), Creds::default());
        let f = run(&sa, d, &c, &["f097", "f098", "f099"], 16);
        assert_eq!(f.names[0], "f100");
        sa.landed(&f, Some(vec![(100, attr(100))]), 0);
        assert!(matches!(sa.probe(d, &c, "f100", 0), Probe::Hit(_)));
        assert!(sa.note(d, &c, "f100", 16, 0).is_none(), "f100 goes on with the run of f097");
        assert!(matches!(sa.probe(d, &c, "f0101", 0), Probe::Miss), "another width");
    }

    #[test]
    fn sequences_are_bounded() {
        let sa = Statahead::default();
        let c = Creds::default();
        for i in 0..(SEQUENCES_MAX as u32 + 10) {
            sa.note(Fid::new(0x2_0000_0400, i + 1), &c, "f0", 64, 0);
        }
        assert_eq!(sa.lock().map.len(), SEQUENCES_MAX);
    }
}
