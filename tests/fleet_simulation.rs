//! A fleet of subscription instances sharing one stream and one lease table, simulated in
//! memory: `MemoryKinesis`, `MemoryLeaseStore`, paused tokio time on one thread, the library's
//! default settings (lease duration and listing interval 10 s) but for the start position (the
//! oldest record). A writer puts a few records a second per shard, under many partition keys;
//! every instance acks each delivery at once, and the journal records each one (virtual time,
//! instance, shard, sequence number, key).
//!
//! Every instance has a lease store of its own in front of the shared table (a
//! `LayeredStore` whose layer counts calls, writes and takes, over a pass-through store that
//! counts the rows `list` and `get` return), so the table's load is known per instance and
//! per phase. The phases:
//!
//! 1. N instances start, a second apart;
//! 2. a steady minute;
//! 3. one more instance joins;
//! 4. one instance crashes (`Subscription::abort`);
//! 5. one instance leaves gracefully (`ShutdownHandle::shutdown`);
//! 6. one shard is split and two adjacent shards are merged;
//! 7. the writer stops and the fleet reads what is left.
//!
//! Each phase lasts until the shares are fair (every eligible shard held by a live instance,
//! and every share the mean rounded down or up) and, after a reshard, every child shard was
//! read; then 20 s more. A phase that does not get there within its time limit ends at the
//! limit (and 20 s).
//!
//! The report gives, per phase: how long until every shard was held and until the shares were
//! fair, the shares at its end, how often shards changed hands (a successful take from
//! another holder, or of a free lease another instance took last), the lease table's calls
//! and rows read and written per second, and the duplicates.
//!
//! Checked (correctness, not timing; every failure is reported, then the test fails):
//!
//! * no shard is read by two instances at once: per shard, each run of deliveries by one
//!   instance begins after a take of that shard by that instance which came after the
//!   previous run's last delivery;
//! * within a run, sequence numbers increase;
//! * no record is delivered twice, but in the crash phase, and in the start phase by an
//!   instance reading a shard it took while starting (`start_at` reads the shards a
//!   subscription opens with from the start position, whatever their checkpoints say);
//! * every record written is delivered;
//! * at the end of every phase the shares are fair.

#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/table_cost.rs"]
mod table_cost;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::ops::Range;
use std::time::Duration;

use fleet::{Counts, Fleet, Holdings, Log, OPERATIONS, STREAM, Taken, index_of, owner, short};
use kinesis_dataflow::api::ShardDescription;
use tokio::time::{Instant, sleep};

/// How long a phase goes on once its shares are fair (two listings, a lease duration).
const SETTLE: Duration = Duration::from_secs(20);

/// The steady phase.
const STEADY: Duration = Duration::from_secs(60);

/// A fleet's size and pace.
struct Scale {
    shards: u32,
    instances: u16,
    /// Records written per second per shard.
    records_per_shard: u32,
    /// How long a phase waits for fair shares.
    within: Duration,
    /// Other streams sharing the lease table (as many shards each), idle.
    neighbours: u32,
}

/// Quick: 40 shards, 4 instances, in the ordinary `cargo test`.
#[tokio::test(start_paused = true)]
async fn a_fleet_of_4_on_40_shards_shares_fairly_and_reads_each_shard_alone() {
    simulate(Scale {
        shards: 40,
        instances: 4,
        records_per_shard: 2,
        within: Duration::from_secs(120),
        neighbours: 2,
    })
    .await;
}

/// Full: 1000 shards, 20 instances. Run it with
/// `cargo test --release --test fleet_simulation -- --ignored --nocapture`.
#[tokio::test(start_paused = true)]
#[ignore = "a few minutes in release: cargo test --release --test fleet_simulation -- --ignored --nocapture"]
async fn a_fleet_of_20_on_1000_shards_shares_fairly_and_reads_each_shard_alone() {
    simulate(Scale {
        shards: 1000,
        instances: 20,
        records_per_shard: 2,
        within: Duration::from_secs(180),
        neighbours: 9,
    })
    .await;
}

async fn simulate(scale: Scale) {
    let (neighbours, shards) = (scale.neighbours, scale.shards);
    let mut sim = Sim::new(scale);
    sim.fleet.add_neighbours(neighbours, shards).await;
    sim.start_fleet().await;
    sim.steady().await;
    sim.join_one().await;
    sim.crash_one().await;
    sim.leave_one().await;
    sim.reshard().await;
    sim.drain().await;
    sim.check_deliveries();
    eprintln!("{}", sim.report());
    assert!(
        sim.failures.is_empty(),
        "{} check(s) failed:\n{}",
        sim.failures.len(),
        sim.failures.join("\n")
    );
}

// ------------------------------------------------------------------------------------------
// Phases
// ------------------------------------------------------------------------------------------

/// Where a phase began.
struct Mark {
    at: Instant,
    delivered: usize,
    taken: usize,
    counts: Vec<Counts>,
}

/// What a phase waited for, and when it first held (since the phase began).
#[derive(Default)]
struct Waited {
    all_held: Option<Duration>,
    fair: Option<Duration>,
    children_read: Option<Duration>,
}

/// One phase, as reported.
struct Phase {
    name: String,
    secs: f64,
    /// `None` for the steady phase (nothing to wait for).
    waited: Option<Waited>,
    end: Holdings,
    delivered: Range<usize>,
    taken: Range<usize>,
    /// What each instance asked of the lease table during the phase.
    counts: Vec<Counts>,
    duplicates: Allowed,
    note: String,
}

/// Which duplicates a phase may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allowed {
    None,
    /// Only records of shards an instance took while starting: `start_at` reads the shards a
    /// subscription opens with from the start position, whatever their checkpoints say.
    StartReplays,
    Any,
}

struct Sim {
    scale: Scale,
    fleet: Fleet,
    phases: Vec<Phase>,
    failures: Vec<String>,
}

impl Sim {
    fn new(scale: Scale) -> Sim {
        let mut fleet = Fleet::new(scale.shards);
        fleet.write_steadily(scale.shards * scale.records_per_shard, scale.shards * 8);
        Sim {
            scale,
            fleet,
            phases: Vec::new(),
            failures: Vec::new(),
        }
    }

    fn mark(&self) -> Mark {
        let log = self.fleet.journal.lock();
        Mark {
            at: Instant::now(),
            delivered: log.delivered.len(),
            taken: log.taken.len(),
            counts: self.fleet.counts(),
        }
    }

    async fn start_fleet(&mut self) {
        let mark = self.mark();
        for i in 0..self.scale.instances {
            if i > 0 {
                sleep(Duration::from_secs(1)).await;
            }
            self.fleet.join().await;
        }
        let waited = self.wait(&mark, &[]).await;
        let name = format!("start {} (1 s apart)", self.scale.instances);
        self.close(
            name,
            mark,
            Some(waited),
            Allowed::StartReplays,
            String::new(),
        )
        .await;
    }

    async fn steady(&mut self) {
        let mark = self.mark();
        sleep(STEADY).await;
        self.close(
            "steady 60 s".into(),
            mark,
            None,
            Allowed::None,
            String::new(),
        )
        .await;
    }

    async fn join_one(&mut self) {
        let mark = self.mark();
        let index = self.fleet.join().await;
        let waited = self.wait(&mark, &[]).await;
        let name = format!("join {}", self.fleet.instances[index].owner);
        self.close(name, mark, Some(waited), Allowed::None, String::new())
            .await;
    }

    async fn crash_one(&mut self) {
        let mark = self.mark();
        let crashed = &mut self.fleet.instances[0];
        crashed.crash().await;
        let name = format!("crash {}", crashed.owner);
        let waited = self.wait(&mark, &[]).await;
        self.close(name, mark, Some(waited), Allowed::Any, String::new())
            .await;
    }

    async fn leave_one(&mut self) {
        let mark = self.mark();
        let leaving = &mut self.fleet.instances[1];
        leaving.leave();
        let name = format!("leave {}", leaving.owner);
        let waited = self.wait(&mark, &[]).await;
        self.close(name, mark, Some(waited), Allowed::None, String::new())
            .await;
        if !self.fleet.instances[1].has_left() {
            let phase = self.phases.last_mut().expect("the phase");
            phase.note = "graceful stop not finished".into();
            (self.failures).push(format!("{}: the graceful stop did not finish", phase.name));
        }
    }

    async fn reshard(&mut self) {
        let before = self.fleet.shards().await;
        let (split, merged) = reshard_targets(&before);
        let mark = self.mark();
        let memory = &self.fleet.memory;
        let (start, end) = (hash(&split.starting_hash_key), hash(&split.ending_hash_key));
        let middle = start + (end - start) / 2 + 1;
        memory
            .split_shard(STREAM, &split.shard_id, &middle.to_string())
            .await
            .expect("the split");
        memory
            .merge_shards(STREAM, &merged.0.shard_id, &merged.1.shard_id)
            .await
            .expect("the merge");
        let children: Vec<String> = (self.fleet.shards().await.into_iter())
            .filter(|s| before.iter().all(|b| b.shard_id != s.shard_id))
            .map(|s| s.shard_id)
            .collect();
        let waited = self.wait(&mark, &children).await;
        let name = format!(
            "split {}, merge {}+{}",
            short(&split.shard_id),
            short(&merged.0.shard_id),
            short(&merged.1.shard_id)
        );
        let note = self.children_note(&mark, &children);
        self.close(name, mark, Some(waited), Allowed::None, note)
            .await;
    }

    async fn drain(&mut self) {
        self.fleet.stop_writing();
        let mark = self.mark();
        let journal = &self.fleet.journal;
        let read_all = fleet::until(self.scale.within, || {
            let log = journal.lock();
            log.distinct == log.written.len()
        })
        .await;
        let written = journal.lock().written.len();
        let note = match read_all {
            Some(after) => format!("all {written} records read {:.1} s after", secs(after)),
            None => format!("records unread after {:?}", self.scale.within),
        };
        let waited = self.wait(&mark, &[]).await;
        self.close(
            "drain (writer stopped)".into(),
            mark,
            Some(waited),
            Allowed::None,
            note,
        )
        .await;
    }

    /// Waits until the shares are fair and every one of `children` was read, or the phase's
    /// time limit.
    async fn wait(&self, mark: &Mark, children: &[String]) -> Waited {
        let mut waited = Waited::default();
        loop {
            let elapsed = mark.at.elapsed();
            let holdings = self.fleet.holdings().await;
            if holdings.unheld == 0 {
                waited.all_held.get_or_insert(elapsed);
            }
            if holdings.is_fair() {
                waited.fair.get_or_insert(elapsed);
            }
            if self.all_read(children) {
                waited.children_read.get_or_insert(elapsed);
            }
            let done = waited.fair.is_some() && waited.children_read.is_some();
            if done || elapsed >= self.scale.within {
                return waited;
            }
            sleep(Duration::from_millis(250)).await;
        }
    }

    /// True once every one of `shards` was delivered from.
    fn all_read(&self, shards: &[String]) -> bool {
        let log = self.fleet.journal.lock();
        shards
            .iter()
            .all(|s| log.first_read.contains_key(s.as_str()))
    }

    /// Ends a phase: `SETTLE` more (unless it is the steady one), then the fairness check.
    async fn close(
        &mut self,
        name: String,
        mark: Mark,
        waited: Option<Waited>,
        duplicates: Allowed,
        note: String,
    ) {
        if waited.is_some() {
            sleep(SETTLE).await;
        }
        let end = self.fleet.holdings().await;
        if !end.is_fair() {
            self.failures.push(format!(
                "{name}: shares not fair at the end of the phase: {} ({})",
                end.describe(),
                end.shares()
            ));
        }
        let log = self.fleet.journal.lock();
        let counts = self.fleet.counts();
        let zero = Counts::default();
        let counts = (counts.iter().enumerate())
            .map(|(i, now)| now.since(mark.counts.get(i).unwrap_or(&zero)))
            .collect();
        let phase = Phase {
            name,
            secs: secs(mark.at.elapsed()),
            waited,
            end,
            delivered: mark.delivered..log.delivered.len(),
            taken: mark.taken..log.taken.len(),
            counts,
            duplicates,
            note,
        };
        drop(log);
        self.phases.push(phase);
    }

    fn children_note(&self, mark: &Mark, children: &[String]) -> String {
        let log = self.fleet.journal.lock();
        let read: Vec<String> = (children.iter())
            .map(|c| match log.first_read.get(c.as_str()) {
                Some(at) => format!("{} read {:.1} s after", short(c), secs(*at - mark.at)),
                None => format!("{} not read", short(c)),
            })
            .collect();
        read.join(", ")
    }
}

/// The shard to split (the open one lowest in the key space) and two adjacent open shards to
/// merge (the two highest).
fn reshard_targets(
    shards: &[ShardDescription],
) -> (&ShardDescription, (&ShardDescription, &ShardDescription)) {
    let mut open: Vec<&ShardDescription> = (shards.iter())
        .filter(|s| s.ending_sequence_number.is_none())
        .collect();
    open.sort_by_key(|s| hash(&s.starting_hash_key));
    let [a, b] = open[open.len() - 2..] else {
        unreachable!("two shards at least")
    };
    assert_eq!(hash(&a.ending_hash_key) + 1, hash(&b.starting_hash_key));
    (open[0], (a, b))
}

fn hash(key: &str) -> u128 {
    key.parse().expect("a decimal hash key")
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

// ------------------------------------------------------------------------------------------
// Checks over the journal
// ------------------------------------------------------------------------------------------

impl Sim {
    /// Exclusive reads, increasing sequence numbers, duplicates, every record delivered.
    fn check_deliveries(&mut self) {
        let journal = self.fleet.journal.clone();
        let log = journal.lock();
        let mut failures = exclusive_and_ordered(&log, &self.phases, self.fleet.began);
        let duplicates = duplicates(&log, &self.phases, &self.start_takes());
        for (phase, (all, replays)) in self.phases.iter().zip(duplicates) {
            let wrong = match phase.duplicates {
                Allowed::None => all,
                Allowed::StartReplays => all - replays,
                Allowed::Any => 0,
            };
            if wrong > 0 {
                failures.push(format!(
                    "{}: {all} duplicate(s), {replays} of them replays of shards taken at a start",
                    phase.name
                ));
            }
        }
        let unread: Vec<usize> = (log.times.iter().enumerate())
            .filter(|(_, t)| **t == 0)
            .map(|(i, _)| i)
            .collect();
        if !unread.is_empty() {
            let first = &log.written[unread[0]];
            failures.push(format!(
                "{} of {} records never delivered (the first: {} {} pk-{})",
                unread.len(),
                log.written.len(),
                short(&first.shard),
                first.sequence_number,
                first.key
            ));
        }
        if log.mismatched > 0 {
            failures.push(format!(
                "{} deliveries with a shard or sequence number unlike what was written",
                log.mismatched
            ));
        }
        self.failures.extend(failures);
    }
}

impl Sim {
    /// Every instance's takes while starting, by instance.
    fn start_takes(&self) -> Vec<Range<usize>> {
        (self.fleet.instances.iter())
            .map(|i| i.start_takes.clone())
            .collect()
    }
}

/// The name of the phase holding delivery (or take) `index`.
fn phase_of(phases: &[Phase], index: usize, of: fn(&Phase) -> &Range<usize>) -> &str {
    (phases.iter())
        .find(|p| of(p).contains(&index))
        .map_or("?", |p| p.name.as_str())
}

/// Per shard: each run of one instance's deliveries begins after a take by that instance
/// that came after the previous run's last delivery; within a run, sequence numbers increase.
fn exclusive_and_ordered(log: &Log, phases: &[Phase], began: Instant) -> Vec<String> {
    let mut takes: HashMap<(&str, u16), Vec<&Taken>> = HashMap::new();
    for t in &log.taken {
        takes.entry((&t.shard, t.instance)).or_default().push(t);
    }
    let mut by_shard: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, d) in log.delivered.iter().enumerate() {
        let shard = &log.written[d.record as usize].shard;
        by_shard.entry(shard).or_default().push(i);
    }
    let mut shards: Vec<_> = by_shard.into_iter().collect();
    shards.sort();
    let mut failures = Vec::new();
    for (shard, deliveries) in shards {
        for (k, &now) in deliveries.iter().enumerate() {
            let d = log.delivered[now];
            let before = k.checked_sub(1).map(|k| deliveries[k]);
            let phase = || phase_of(phases, now, |p| &p.delivered);
            match before.map(|b| (b, log.delivered[b])) {
                Some((_, b)) if b.instance == d.instance => {
                    let earlier = &log.written[b.record as usize].sequence_number;
                    let later = &log.written[d.record as usize].sequence_number;
                    if later <= earlier {
                        failures.push(format!(
                            "{}: {} delivered {later} after {earlier} in one run ({})",
                            short(shard),
                            owner(d.instance),
                            phase()
                        ));
                    }
                }
                other => {
                    let after = other.map_or(0, |(b, _)| b + 1);
                    let taken = takes.get(&(shard, d.instance));
                    let took =
                        taken.is_some_and(|t| t.iter().any(|t| (after..=now).contains(&t.after)));
                    if !took {
                        let last_take = (taken.into_iter().flatten())
                            .rfind(|t| t.after <= now)
                            .map_or("never".into(), |t| {
                                format!("at {:.1} s", secs(t.at - began))
                            });
                        failures.push(format!(
                            "{}: {} began reading at {:.1} s without a take since the previous \
                             reader's last delivery (its last take: {last_take}; {})",
                            short(shard),
                            owner(d.instance),
                            secs(d.at - began),
                            phase()
                        ));
                    }
                }
            }
        }
    }
    summarise(failures)
}

/// The first ten failures and how many more.
fn summarise(mut failures: Vec<String>) -> Vec<String> {
    if failures.len() > 10 {
        let more = failures.len() - 10;
        failures.truncate(10);
        failures.push(format!("... and {more} more like these"));
    }
    failures
}

/// Deliveries of a record delivered before, per phase: (all, start replays). A duplicate is a
/// start replay when its instance's latest take of the shard was one it made while starting.
fn duplicates(log: &Log, phases: &[Phase], start_takes: &[Range<usize>]) -> Vec<(usize, usize)> {
    let mut seen = vec![false; log.written.len()];
    let mut latest_take: HashMap<(&str, u16), usize> = HashMap::new();
    let mut takes = log.taken.iter().enumerate().peekable();
    let mut per_phase = vec![(0, 0); phases.len()];
    for (i, d) in log.delivered.iter().enumerate() {
        while let Some((j, t)) = takes.next_if(|(_, t)| t.after <= i) {
            latest_take.insert((&t.shard, t.instance), j);
        }
        if !std::mem::replace(&mut seen[d.record as usize], true) {
            continue;
        }
        let shard = &*log.written[d.record as usize].shard;
        let replay = (latest_take.get(&(shard, d.instance)))
            .is_some_and(|j| start_takes[usize::from(d.instance)].contains(j));
        if let Some(p) = phases.iter().position(|p| p.delivered.contains(&i)) {
            per_phase[p].0 += 1;
            per_phase[p].1 += usize::from(replay);
        }
    }
    per_phase
}

/// Hand-offs per phase: (total, most of one shard). A take is a hand-off when the shard's
/// holder (as the taker saw it, or for a free lease whoever took it last) was another instance.
fn hand_offs(log: &Log, phases: &[Phase]) -> Vec<(usize, usize)> {
    let mut last: HashMap<&str, u16> = HashMap::new();
    let mut per_phase: Vec<HashMap<&str, usize>> = vec![HashMap::new(); phases.len()];
    for (i, t) in log.taken.iter().enumerate() {
        let from = (t.from.as_deref().and_then(index_of)).or(last.get(&*t.shard).copied());
        last.insert(&t.shard, t.instance);
        let phase = phases.iter().position(|p| p.taken.contains(&i));
        if let (Some(from), Some(p)) = (from, phase)
            && from != t.instance
        {
            *per_phase[p].entry(&t.shard).or_default() += 1;
        }
    }
    (per_phase.iter())
        .map(|m| (m.values().sum(), m.values().copied().max().unwrap_or(0)))
        .collect()
}

/// The checks themselves catch what they are for: a second reader without a take, the first
/// reader going on after it, a sequence number going back, a duplicate.
#[test]
fn the_checks_catch_two_readers_at_once_and_a_duplicate() {
    let shard: std::sync::Arc<str> = "shardId-000000000000".into();
    let mut log = Log::default();
    for (key, sequence_number) in ["1", "2", "3", "4"].into_iter().enumerate() {
        log.written.push(fleet::Written {
            shard: shard.clone(),
            sequence_number: sequence_number.into(),
            key: key as u32,
        });
    }
    let at = Instant::now();
    log.taken.push(Taken {
        at,
        instance: 0,
        shard,
        from: None,
        after: 0,
    });
    // i00 reads 0 and 1, i01 reads 2 without a take, i00 reads 3 and then 2 again.
    for (instance, record) in [(0, 0), (0, 1), (1, 2), (0, 3), (0, 2)] {
        log.delivered.push(fleet::Delivered {
            at,
            instance,
            record,
        });
    }
    let phases = [Phase {
        name: "test".into(),
        secs: 1.0,
        waited: None,
        end: Holdings {
            eligible: 1,
            unheld: 0,
            held: Default::default(),
        },
        delivered: 0..5,
        taken: 0..1,
        counts: Vec::new(),
        duplicates: Allowed::None,
        note: String::new(),
    }];
    let failures = exclusive_and_ordered(&log, &phases, at);
    assert_eq!(failures.len(), 3, "{failures:#?}");
    assert!(failures[0].contains("i01 began reading"), "{}", failures[0]);
    assert!(failures[1].contains("i00 began reading"), "{}", failures[1]);
    assert!(
        failures[2].contains("delivered 3 after 4"),
        "{}",
        failures[2]
    );
    assert_eq!(duplicates(&log, &phases, &[0..0, 0..0]), [(1, 0)]);
    // i00's last run began with the take it made while starting: a start replay.
    assert_eq!(duplicates(&log, &phases, &[0..1, 0..0]), [(1, 1)]);
    assert_eq!(hand_offs(&log, &phases), [(0, 0)]);
}

// ------------------------------------------------------------------------------------------
// The report
// ------------------------------------------------------------------------------------------

impl Sim {
    fn report(&self) -> String {
        let log = self.fleet.journal.lock();
        let mut out = String::new();
        let s = &self.scale;
        let _ = writeln!(
            out,
            "\nfleet simulation: {} shards, {} instances (+1 joins, 1 crashes, 1 leaves), \
             {} records/s per shard, default lease settings; {} records written, {} \
             deliveries, {} subscription errors; each phase waits up to {} s for fair shares, \
             then {} s more",
            s.shards,
            s.instances,
            s.records_per_shard,
            log.written.len(),
            log.delivered.len(),
            log.errors,
            s.within.as_secs(),
            SETTLE.as_secs()
        );
        self.phase_table(&mut out, &log);
        self.rate_table(&mut out);
        self.operation_table(&mut out);
        self.layout_table(&mut out);
        out
    }

    /// What the phases' listings would cost in DynamoDB, by key layout, and the watch reads.
    fn layout_table(&self, out: &mut String) {
        let streams = 1 + self.scale.neighbours;
        let _ = writeln!(
            out,
            "\nlease-table read units, the table holding {streams} streams of {} shards (the \
             others idle): the fleet's listings per hour; units per listing by stream (Query) \
             and single-key (Scan); the fleet's units per hour for this stream's listings by \
             each, and for its watch reads (either layout)\n\
             {:<26} {:>8} {:>8} {:>8} {:>11} {:>11} {:>11}",
            self.scale.shards, "phase", "lists/h", "Query", "Scan", "Query/h", "Scan/h", "watch/h"
        );
        for p in &self.phases {
            let sum = |f: fn(&Counts) -> u64| p.counts.iter().map(f).sum::<u64>() as f64;
            let hour = 3600.0 / p.secs;
            let lists = sum(|c| c.calls[1]);
            let query = sum(|c| c.query_units) / 1000.0;
            let scan = sum(|c| c.scan_units) / 1000.0;
            let _ = writeln!(
                out,
                "{:<26} {:>8.0} {:>8.1} {:>8.1} {:>11.0} {:>11.0} {:>11.0}",
                p.name,
                lists * hour,
                query / lists.max(1.0),
                scan / lists.max(1.0),
                query * hour,
                scan * hour,
                sum(|c| c.get_units) / 1000.0 * hour,
            );
        }
    }

    fn phase_table(&self, out: &mut String, log: &Log) {
        let _ = writeln!(
            out,
            "{PHASE_LEGEND}\n{:<26} {:>7} {:>9} {:>9} {:>15} {:>9} {:>5} {:>5} {:>5}  note",
            "phase",
            "secs",
            "all held",
            "fair",
            "shares at end",
            "hand-offs",
            "max",
            "dups",
            "start"
        );
        let hand_offs = hand_offs(log, &self.phases);
        let duplicates = duplicates(log, &self.phases, &self.start_takes());
        for (i, p) in self.phases.iter().enumerate() {
            let (held, fair) = match &p.waited {
                Some(w) => (
                    after(w.all_held, self.scale.within),
                    after(w.fair, self.scale.within),
                ),
                None => ("-".into(), "-".into()),
            };
            let shares = format!(
                "{}..{} of {:.1}",
                p.end.held.values().min().unwrap_or(&0),
                p.end.held.values().max().unwrap_or(&0),
                p.end.mean()
            );
            let _ = writeln!(
                out,
                "{:<26} {:>7.1} {held:>9} {fair:>9} {shares:>15} {:>9} {:>5} {:>5} {:>5}  {}",
                p.name,
                p.secs,
                hand_offs[i].0,
                hand_offs[i].1,
                duplicates[i].0,
                duplicates[i].1,
                p.note
            );
        }
    }

    fn rate_table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nlease table, per second of the phase: per instance mean / max / the fleet's \
             total (instances that made a call in the phase)\n\
             {:<26} {:>4} {:>23} {:>23} {:>23}",
            "phase", "inst", "calls", "rows read", "rows written"
        );
        for p in &self.phases {
            let active: Vec<&Counts> = p.counts.iter().filter(|c| c.total_calls() > 0).collect();
            let rate = |f: fn(&Counts) -> u64| {
                let per: Vec<f64> = active.iter().map(|c| f(c) as f64 / p.secs).collect();
                let total: f64 = per.iter().sum();
                let max = per.iter().copied().fold(0.0, f64::max);
                let mean = total / per.len().max(1) as f64;
                format!("{mean:>6.1} /{max:>6.1} /{total:>7.1}")
            };
            let _ = writeln!(
                out,
                "{:<26} {:>4} {:>23} {:>23} {:>23}",
                p.name,
                active.len(),
                rate(Counts::total_calls),
                rate(|c| c.rows_read),
                rate(|c| c.rows_written)
            );
        }
    }

    fn operation_table(&self, out: &mut String) {
        let _ = write!(
            out,
            "\nfleet's calls per second by operation\n{:<26}",
            "phase"
        );
        for o in &OPERATIONS[1..] {
            let _ = write!(out, " {o:>10}");
        }
        for p in &self.phases {
            let _ = write!(out, "\n{:<26}", p.name);
            for op in 1..OPERATIONS.len() {
                let calls: u64 = p.counts.iter().map(|c| c.calls[op]).sum();
                let _ = write!(out, " {:>10.2}", calls as f64 / p.secs);
            }
        }
        out.push('\n');
    }
}

/// What the phase table's columns mean.
const PHASE_LEGEND: &str = "
all held, fair: seconds into the phase until every eligible shard was held by a live instance,
  and until the shares were fair too (>N s: not within the phase's limit)
shares at end: the least and the most one live instance held, of the mean
hand-offs: shards changing hands in the phase; max: the most times one shard did
dups: deliveries of a record delivered before; start: those of them by an instance reading a
  shard it took while starting (start_at reads those from the horizon, whatever the checkpoint)";

/// `12.3 s`, or `>120 s` when not reached within the phase's limit.
fn after(reached: Option<Duration>, within: Duration) -> String {
    match reached {
        Some(d) => format!("{:.1} s", secs(d)),
        None => format!(">{} s", within.as_secs()),
    }
}
