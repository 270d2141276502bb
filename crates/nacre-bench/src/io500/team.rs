//! The tasks of a phase: threads that start together, and IO500's stonewall with wear-out
//! (`stoneWallingWearOut=1`): each task works until the stonewall time, then every task
//! goes on to as many steps as the busiest one did, so that each read phase finds the same
//! amount from every task.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

pub struct Team {
    tasks: usize,
    stonewall: Duration,
    /// Tasks at the wear-out point of this phase (where they agree on the count).
    mid: Mutex<usize>,
    arrived: Condvar,
    /// Set by a task that failed before the wear-out point (or ended without reaching
    /// it), so the others stop early, and stop there.
    failed: AtomicBool,
    counts: Vec<AtomicU64>,
    /// Per task: reached the wear-out point in this phase (or left without).
    at_mid: Vec<AtomicBool>,
    /// When the phase started: the stonewall counts from here, as ior's does.
    start: Mutex<Option<Instant>>,
}

/// The error a task returns when it stopped because another one failed.
fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::Interrupted, "stopped: another task failed")
}

/// Counts a task as arrived at the wear-out point when it ends without getting there (an
/// error before it, or a panic), so no other task waits for it.
struct Leaving<'t> {
    team: &'t Team,
    rank: usize,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        if !self.team.at_mid[self.rank].swap(true, Ordering::SeqCst) {
            self.team.arrive(true);
        }
    }
}

impl Team {
    pub fn new(tasks: usize, stonewall: Duration) -> Team {
        Team {
            tasks,
            stonewall,
            mid: Mutex::new(0),
            arrived: Condvar::new(),
            failed: AtomicBool::new(false),
            counts: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
            at_mid: (0..tasks).map(|_| AtomicBool::new(false)).collect(),
            start: Mutex::new(None),
        }
    }

    fn mid(&self) -> std::sync::MutexGuard<'_, usize> {
        self.mid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more task at the wear-out point; `failed` if it comes because it failed.
    fn arrive(&self, failed: bool) {
        if failed {
            self.failed.store(true, Ordering::SeqCst);
        }
        *self.mid() += 1;
        self.arrived.notify_all();
    }

    /// Run `f(rank)` on every task at once; their results in rank order and the seconds
    /// from the first task's start to the last task's end. The first real error of any
    /// task.
    pub fn run<T: Send>(&self, f: impl Fn(usize) -> io::Result<T> + Sync) -> io::Result<(Vec<T>, f64)> {
        self.failed.store(false, Ordering::SeqCst);
        *self.mid() = 0;
        for a in &self.at_mid {
            a.store(false, Ordering::SeqCst);
        }
        let start = Barrier::new(self.tasks);
        *self.start.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.tasks)
                .map(|rank| {
                    let (f, start) = (&f, &start);
                    s.spawn(move || {
                        let _leaving = Leaving { team: self, rank };
                        start.wait();
                        let began = Instant::now();
                        let r = f(rank);
                        (r, began, Instant::now())
                    })
                })
                .collect();
            let (mut out, mut span, mut err) = (Vec::with_capacity(self.tasks), None::<(Instant, Instant)>, None);
            for h in handles {
                match h.join() {
                    Ok((Ok(v), began, ended)) => {
                        out.push(v);
                        span = Some(span.map_or((began, ended), |(b, e)| (b.min(began), e.max(ended))));
                    }
                    Ok((Err(e), _, _)) => {
                        // A real failure wins over "stopped because another failed".
                        if err.as_ref().is_none_or(|x: &io::Error| x.kind() == io::ErrorKind::Interrupted) {
                            err = Some(e);
                        }
                    }
                    Err(_) => err = Some(io::Error::other("a task panicked")),
                }
            }
            match (err, span) {
                (Some(e), _) => Err(e),
                (None, Some((b, e))) => Ok((out, (e - b).as_secs_f64())),
                (None, None) => Ok((out, 0.0)),
            }
        })
    }

    /// The stonewall's end in the current phase.
    pub fn deadline(&self) -> Instant {
        let start = self.start.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(Instant::now);
        start + self.stonewall
    }

    /// Inside [`Team::run`], on every task: `step(i)` for i = 0, 1, … until `cap` steps
    /// or the stonewall (from the phase's start), then on to the largest count any task
    /// reached. A task that ends without calling it (an error before) counts as failed,
    /// and the others stop. The steps done, and whether the stonewall (rather than the
    /// cap) stopped this task.
    pub fn wear_out(
        &self,
        rank: usize,
        cap: u64,
        mut step: impl FnMut(u64) -> io::Result<()>,
    ) -> io::Result<(u64, bool)> {
        let deadline = self.deadline();
        let (mut done, mut walled, mut err) = (0u64, false, None);
        while done < cap {
            if self.failed.load(Ordering::Relaxed) {
                break;
            }
            if Instant::now() >= deadline {
                walled = true;
                break;
            }
            if let Err(e) = step(done) {
                err = Some(e);
                break;
            }
            done += 1;
        }
        self.counts[rank].store(done, Ordering::SeqCst);
        if !self.at_mid[rank].swap(true, Ordering::SeqCst) {
            self.arrive(err.is_some());
        }
        {
            let mut arrived = self.mid();
            while *arrived < self.tasks {
                arrived = self.arrived.wait(arrived).unwrap_or_else(|e| e.into_inner());
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        // Every task has arrived, each having set the flag first if it failed.
        if self.failed.load(Ordering::SeqCst) {
            return Err(stopped());
        }
        let most = self.counts.iter().map(|c| c.load(Ordering::SeqCst)).max().unwrap_or(done);
        while done < most {
            step(done)?;
            done += 1;
        }
        Ok((done, walled))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_wears_out_to_the_busiest_count() {
        let team = Team::new(3, Duration::from_millis(50));
        let (counts, secs) = team
            .run(|rank| {
                // Task 0 is slow: the others do many more steps before the stonewall.
                team.wear_out(rank, u64::MAX, |_| {
                    std::thread::sleep(Duration::from_millis(if rank == 0 { 20 } else { 1 }));
                    Ok(())
                })
            })
            .expect("no task fails");
        let most = counts.iter().map(|c| c.0).max().unwrap_or(0);
        assert!(most > 5, "{counts:?}");
        assert!(counts.iter().all(|c| c.0 == most && c.1), "{counts:?}");
        assert!(secs >= 0.05);
    }

    #[test]
    fn the_cap_ends_a_task_before_the_stonewall() {
        let team = Team::new(2, Duration::from_secs(600));
        let (counts, _) = team.run(|rank| team.wear_out(rank, 10 + rank as u64, |_| Ok(()))).expect("ok");
        assert_eq!(counts, vec![(11, false), (11, false)], "wear-out to the larger cap, no stonewall");
    }

    #[test]
    fn a_task_failing_before_the_wear_out_point_does_not_hang_the_others() {
        let team = Team::new(3, Duration::from_secs(600));
        let e = team
            .run(|rank| {
                if rank == 2 {
                    return Err(io::Error::other("open failed"));
                }
                team.wear_out(rank, u64::MAX, |_| Ok(()))
            })
            .expect_err("task 2 fails");
        assert_eq!(e.to_string(), "open failed");
        // The next phase starts clean.
        let (counts, _) = team.run(|rank| team.wear_out(rank, 5, |_| Ok(()))).expect("ok");
        assert_eq!(counts, vec![(5, false); 3]);
    }

    #[test]
    fn one_failing_task_stops_the_phase_with_its_error() {
        let team = Team::new(3, Duration::from_secs(600));
        let steps = AtomicUsize::new(0);
        let e = team
            .run(|rank| {
                team.wear_out(rank, u64::MAX, |i| {
                    steps.fetch_add(1, Ordering::Relaxed);
                    if rank == 1 && i == 3 { Err(io::Error::other("disk on fire")) } else { Ok(()) }
                })
            })
            .expect_err("task 1 fails");
        assert_eq!(e.to_string(), "disk on fire");
    }
}
