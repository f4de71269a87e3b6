//! Several instances of the spec's shipping example (`examples/kinesis_subscriptions_shards.rs`,
//! the built binary, unchanged) as real processes on kinesis-local + dynalite, fed by an
//! independent producer, while instances are killed with SIGKILL and restarted at random and
//! the stream is split and merged. At the end every shipment was handled, each customer's in
//! order (the first delivery of each seq comes after the first of every earlier seq), and the
//! duplicates stay within what the unsettled tails of the killed instances explain.
//!
//! Seeded (`CHAOS_SEED`, default 7) with a fixed budget (`CHAOS_SECONDS`, default 100 s of
//! chaos); prints a summary. `CHAOS_SECONDS=1800 cargo test --test chaos -- --nocapture` is the
//! soak run: it also prints each instance's resident memory and open file descriptors when it
//! is killed and at the end, and checks they stay flat (at most twice the smallest resident
//! memory seen, at most 16 more open files).

#![forbid(unsafe_code)]

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const STREAM: &str = "shipments";
const CUSTOMERS: usize = 8;
const RECORDS_PER_SECOND: u64 = 20;
const INSTANCES: usize = 3;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn example_binary() -> PathBuf {
    let path = support::target_dir()
        .join("debug")
        .join("examples")
        .join("kinesis_subscriptions_shards");
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples",
        path.display()
    );
    path
}

/// One running copy of the example; its log goes to a file of its own per start.
struct Instance {
    name: String,
    child: Child,
}

fn start(name: &str, generation: usize, logs: &Path) -> Instance {
    let log = logs.join(format!("{name}-{generation}.log"));
    let file = std::fs::File::create(&log).expect("a log file");
    let child = Command::new(example_binary())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_ENDPOINT_URL_KINESIS", support::kinesis_endpoint())
        .env("AWS_ENDPOINT_URL_DYNAMODB", support::dynamodb_endpoint())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("a log file"))
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .expect("the example starts");
    Instance {
        name: name.to_owned(),
        child,
    }
}

/// (time, customer, seq) of every "shipped" line of a log. The time is the line's RFC 3339
/// timestamp (UTC, fixed width), so the lines of several logs sort into the order they were
/// handled in.
fn shipped(log: &Path) -> Vec<(String, String, u64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|line| line.contains("shipped"))
        .filter_map(|line| {
            let field = |name: &str| {
                let start = line.find(name)? + name.len();
                let rest = &line[start..];
                let end = rest.find(' ').unwrap_or(rest.len());
                Some(rest[..end].trim_matches('"').to_owned())
            };
            Some((
                line.split_whitespace().next()?.to_owned(),
                field("shipment.customer=")?,
                field("shipment.seq=")?.parse().ok()?,
            ))
        })
        .collect()
}

/// Resident memory (kB) and open file descriptors of a process, from /proc.
fn footprint(pid: u32) -> Option<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some((rss, fds))
}

async fn open_shards(client: &aws_sdk_kinesis::Client) -> Vec<aws_sdk_kinesis::types::Shard> {
    let listed = client
        .list_shards()
        .stream_name(STREAM)
        .send()
        .await
        .expect("ListShards");
    listed
        .shards()
        .iter()
        .filter(|s| {
            s.sequence_number_range()
                .and_then(|r| r.ending_sequence_number())
                .is_none()
        })
        .cloned()
        .collect()
}

/// The seed (`CHAOS_SEED`, default 7) and the chaos budget (`CHAOS_SECONDS`, default 100 s).
fn settings() -> (u64, Duration) {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let budget = Duration::from_secs(
        std::env::var("CHAOS_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(100),
    );
    (seed, budget)
}

/// The instances of the example, each started again after every kill under a new generation.
struct Fleet {
    logs: PathBuf,
    instances: Vec<Instance>,
    generations: [usize; INSTANCES],
}

impl Fleet {
    /// The first instance creates the stream (`create_if_missing(2)`) and the lease table, and
    /// opens both shards at LATEST: the others start once it reads them (and so can the
    /// producer), so that no shipment is written before anyone reads.
    async fn start(logs: &Path) -> Self {
        let mut instances = vec![start("i0", 0, logs)];
        let ready = Instant::now();
        let first_log = logs.join("i0-0.log");
        while std::fs::read_to_string(&first_log)
            .unwrap_or_default()
            .matches("lease taken")
            .count()
            < 2
        {
            assert!(
                ready.elapsed() < Duration::from_secs(60),
                "the first instance never read both shards; see {}",
                first_log.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for i in 1..INSTANCES {
            instances.push(start(&format!("i{i}"), 0, logs));
        }
        Self {
            logs: logs.to_owned(),
            instances,
            generations: [0; INSTANCES],
        }
    }

    /// Kills a random instance with SIGKILL (noting its footprint first), waits one to three
    /// seconds and starts it again.
    async fn kill_and_restart(&mut self, rng: &mut Rng, at: Duration, chaos: &mut Chaos) {
        let victim = rng.below(INSTANCES as u64) as usize;
        let instance = &mut self.instances[victim];
        if let Some(pid) = instance.child.id() {
            chaos.note_footprint(pid, format!("{at:>6.1?} {}", instance.name));
        }
        instance.child.start_kill().expect("SIGKILL");
        let _ = instance.child.wait().await;
        chaos.kills += 1;
        println!("  {at:>6.1?}: killed {} (SIGKILL)", instance.name);
        tokio::time::sleep(Duration::from_secs(1 + rng.below(3))).await;
        self.generations[victim] += 1;
        let name = instance.name.clone();
        *instance = start(&name, self.generations[victim], &self.logs);
    }

    /// Notes every instance's footprint, then stops it gracefully (SIGTERM: checkpoints
    /// flushed, leases released).
    async fn stop(&mut self, chaos: &mut Chaos) {
        for instance in &mut self.instances {
            if let Some(pid) = instance.child.id() {
                chaos.note_footprint(pid, format!("end {}", instance.name));
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            let _ = tokio::time::timeout(Duration::from_secs(30), instance.child.wait()).await;
        }
    }
}

/// What the chaos did, and the instances' footprints.
#[derive(Default)]
struct Chaos {
    kills: usize,
    split: bool,
    merged: bool,
    /// A line per footprint taken, printed at the end.
    soak: Vec<String>,
    /// (resident kB, open files) of every instance when it was killed and at the end.
    footprints: Vec<(u64, usize)>,
}

impl Chaos {
    fn note_footprint(&mut self, pid: u32, when: String) {
        if let Some((rss, fds)) = footprint(pid) {
            self.footprints.push((rss, fds));
            self.soak
                .push(format!("{when}: {rss} kB resident, {fds} open files"));
        }
    }

    /// Flat: however long an instance ran (the soak run is long), it holds no more memory or
    /// files than a fresh one, within a factor that start-up noise cannot reach.
    fn assert_footprints_flat(&self) {
        let footprints = &self.footprints;
        if let (Some(rss), Some(fds)) = (
            footprints.iter().map(|f| f.0).min(),
            footprints.iter().map(|f| f.1).min(),
        ) {
            let (max_rss, max_fds) = (
                footprints.iter().map(|f| f.0).max().unwrap_or(rss),
                footprints.iter().map(|f| f.1).max().unwrap_or(fds),
            );
            assert!(
                max_rss <= rss * 2 && max_fds <= fds + 16,
                "resident memory {rss} to {max_rss} kB, open files {fds} to {max_fds}: not flat"
            );
        }
    }
}

/// The producer: customers' shipments at a steady rate, each customer as its key, until told
/// to stop; returns how many shipments each customer got.
fn start_producer(
    client: aws_sdk_kinesis::Client,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Vec<u64>>,
) {
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let producer = tokio::spawn(async move {
        let mut next = vec![0u64; CUSTOMERS];
        let mut sent = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / RECORDS_PER_SECOND));
        loop {
            tokio::select! {
                _ = stop_rx.changed() => break,
                _ = tick.tick() => {}
            }
            let c = (sent as usize) % CUSTOMERS;
            let customer = format!("customer-{c}");
            let body = format!(r#"{{"customer":"{customer}","seq":{}}}"#, next[c]);
            put_until_stored(&client, &customer, &body).await;
            next[c] += 1;
            sent += 1;
        }
        next
    });
    (stop_tx, producer)
}

/// A refused or failed put is retried until it is stored: the record must exist.
async fn put_until_stored(client: &aws_sdk_kinesis::Client, customer: &str, body: &str) {
    loop {
        match client
            .put_record()
            .stream_name(STREAM)
            .partition_key(customer)
            .data(Blob::new(body.to_owned()))
            .send()
            .await
        {
            Ok(_) => break,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Splits a random open shard in the middle of its hash key range.
async fn split_a_shard(client: &aws_sdk_kinesis::Client, rng: &mut Rng, at: Duration) {
    let shards = open_shards(client).await;
    let shard = &shards[rng.below(shards.len() as u64) as usize];
    let range = shard.hash_key_range().unwrap();
    let low: u128 = range.starting_hash_key().parse().unwrap();
    let high: u128 = range.ending_hash_key().parse().unwrap();
    let middle = low + (high - low) / 2;
    client
        .split_shard()
        .stream_name(STREAM)
        .shard_to_split(shard.shard_id())
        .new_starting_hash_key(middle.to_string())
        .send()
        .await
        .expect("SplitShard");
    println!("  {at:>6.1?}: split {}", shard.shard_id());
}

/// Merges two random adjacent open shards.
async fn merge_two_shards(client: &aws_sdk_kinesis::Client, rng: &mut Rng, at: Duration) {
    let mut shards = open_shards(client).await;
    shards.sort_by_key(|s| {
        s.hash_key_range()
            .unwrap()
            .starting_hash_key()
            .parse::<u128>()
            .unwrap()
    });
    let pick = rng.below(shards.len() as u64 - 1) as usize;
    let (left, right) = (&shards[pick], &shards[pick + 1]);
    client
        .merge_shards()
        .stream_name(STREAM)
        .shard_to_merge(left.shard_id())
        .adjacent_shard_to_merge(right.shard_id())
        .send()
        .await
        .expect("MergeShards");
    println!(
        "  {at:>6.1?}: merged {} and {}",
        left.shard_id(),
        right.shard_id()
    );
}

/// The chaos, for `budget`: kills and restarts at random moments, a split (past a quarter of
/// the budget) and a merge (past three fifths).
async fn run_chaos(
    client: &aws_sdk_kinesis::Client,
    fleet: &mut Fleet,
    rng: &mut Rng,
    budget: Duration,
) -> Chaos {
    let mut chaos = Chaos::default();
    let chaos_started = Instant::now();
    while chaos_started.elapsed() < budget {
        let wait = Duration::from_secs(8 + rng.below(10));
        tokio::time::sleep(wait.min(budget.saturating_sub(chaos_started.elapsed()))).await;
        let at = chaos_started.elapsed();
        if !chaos.split && at > budget / 4 {
            split_a_shard(client, rng, at).await;
            chaos.split = true;
        } else if chaos.split && !chaos.merged && at > budget * 3 / 5 {
            merge_two_shards(client, rng, at).await;
            chaos.merged = true;
        } else {
            fleet.kill_and_restart(rng, at, &mut chaos).await;
        }
    }
    chaos
}

/// Every handling of every instance, in the order they happened: (customer, seq).
fn handled_in_order(logs: &Path) -> Vec<(String, u64)> {
    let mut lines: Vec<(String, String, u64)> = std::fs::read_dir(logs)
        .unwrap()
        .flat_map(|e| shipped(&e.unwrap().path()))
        .collect();
    lines.sort();
    lines.into_iter().map(|(_, c, s)| (c, s)).collect()
}

/// Waits until every shipment was handled at least once (a hang guard bounds the wait).
async fn wait_until_every_shipment_is_handled(logs: &Path, expected: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut seen: HashMap<(String, u64), usize> = HashMap::new();
        for entry in handled_in_order(logs) {
            *seen.entry(entry).or_default() += 1;
        }
        if seen.len() >= expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {expected} shipments handled; logs in {}",
            seen.len(),
            logs.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Per customer: every seq handled; the first handling of each seq in seq order. Returns the
/// duplicates (handlings after the first).
fn assert_every_customer_in_order(
    handled: &[(String, u64)],
    produced: &[u64],
    logs: &Path,
) -> usize {
    let mut per_customer: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (customer, seq) in handled {
        per_customer.entry(customer.clone()).or_default().push(*seq);
    }
    let mut duplicates = 0usize;
    for (c, count) in produced.iter().enumerate() {
        let customer = format!("customer-{c}");
        let seqs = per_customer.get(&customer).cloned().unwrap_or_default();
        let mut first_seen = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for seq in &seqs {
            if seen.insert(*seq) {
                first_seen.push(*seq);
            } else {
                duplicates += 1;
            }
        }
        assert_eq!(
            first_seen,
            (0..*count).collect::<Vec<_>>(),
            "{customer}: every shipment once at least, first deliveries in order; logs in {}",
            logs.display()
        );
    }
    duplicates
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_killed_and_restarted_during_a_split_and_a_merge_lose_nothing() {
    let (seed, budget) = settings();
    let mut rng = Rng(seed.max(1));
    let client = support::kinesis_client();
    let logs = support::logs_dir().join(format!("chaos-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    println!(
        "chaos: seed {seed}, {budget:?} of chaos, logs in {}",
        logs.display()
    );
    let mut fleet = Fleet::start(&logs).await;
    let (stop_producer, producer) = start_producer(client.clone());
    let mut chaos = run_chaos(&client, &mut fleet, &mut rng, budget).await;
    let _ = stop_producer.send(true);
    let produced = producer.await.unwrap();
    let total: u64 = produced.iter().sum();
    println!("  produced {total} shipments for {CUSTOMERS} customers; waiting for the handlers");

    wait_until_every_shipment_is_handled(&logs, total as usize).await;
    fleet.stop(&mut chaos).await;
    let handled = handled_in_order(&logs);
    let duplicates = assert_every_customer_in_order(&handled, &produced, &logs);
    // A killed instance's unsettled tail: what it handled since its last checkpoint (every
    // 5 s by default) is handled again; with a second of slack, at most this many.
    let Chaos {
        kills,
        split,
        merged,
        ..
    } = chaos;
    let tail_bound = kills * RECORDS_PER_SECOND as usize * 6;
    println!(
        "chaos summary: seed {seed}, {total} shipments, {} deliveries, {duplicates} duplicates \
         (bound {tail_bound} for {kills} kills), split {split}, merged {merged}",
        handled.len()
    );
    for line in &chaos.soak {
        println!("  {line}");
    }
    assert!(
        duplicates <= tail_bound,
        "{duplicates} duplicates, more than the unsettled tails of {kills} kills explain"
    );
    assert!(split && merged, "the run split and merged the stream");
    chaos.assert_footprints_flat();
}
