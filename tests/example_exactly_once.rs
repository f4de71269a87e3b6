//! The exactly-once example (`examples/exactly_once.rs`, the built binary) live on the
//! emulators, killed with SIGKILL 24 times, each at a random moment (up to 200 ms)
//! after its run applied its first record, and started again each time: in
//! the end its SQLite database holds every record's effect exactly once, with no gap, and no
//! committed record was ever delivered again (the position source opened each shard right
//! after its last effect, however far the lease table's checkpoint lagged).

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

const RECORDS: usize = 5_000;
const KILLS: usize = 24;

/// Puts `e-0..e-{RECORDS}` under six keys, 500 a call.
async fn put_all(client: &aws_sdk_kinesis::Client, stream: &str) {
    for chunk in (0..RECORDS).collect::<Vec<_>>().chunks(500) {
        let entries = chunk
            .iter()
            .map(|i| {
                PutRecordsRequestEntry::builder()
                    .partition_key(format!("key-{}", i % 6))
                    .data(Blob::new(format!("e-{i:05}")))
                    .build()
                    .unwrap()
            })
            .collect();
        let out = client
            .put_records()
            .stream_name(stream)
            .set_records(Some(entries))
            .send()
            .await
            .unwrap();
        assert_eq!(out.failed_record_count(), Some(0));
    }
}

/// A deterministic sequence of kill delays from `seed` (printed, to replay a run).
struct Delays(u64);

impl Delays {
    fn next_ms(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % 200
    }
}

/// Starts the example; its standard output lines are counted as `applied` / `already
/// applied` into `log`, the rest goes to the log file.
fn start(stream: &str, database: &Path, application: &str, log: &str) -> Child {
    let file = std::fs::File::create(support::logs_dir().join(log)).unwrap();
    support::examples::command("exactly_once")
        .args([stream, database.to_str().unwrap(), application, "1"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(file)
        .spawn()
        .expect("the example starts")
}

/// Reads the child's standard output to its end: (applied, already applied) counts (a
/// line may be lost to a kill right after its commit). `first` hears of the first `applied`.
fn count_lines(
    child: &mut Child,
    first: tokio::sync::oneshot::Sender<()>,
) -> tokio::task::JoinHandle<(usize, usize)> {
    let stdout = child.stdout.take().expect("piped");
    tokio::spawn(async move {
        let mut first = Some(first);
        let mut lines = BufReader::new(stdout).lines();
        let (mut applied, mut again) = (0, 0);
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("applied ") {
                applied += 1;
                if let Some(first) = first.take() {
                    let _ = first.send(());
                }
            } else if line.starts_with("already applied ") {
                again += 1;
            }
        }
        (applied, again)
    })
}

/// Every effect in the database: data → how many rows.
fn effects(database: &Path) -> BTreeMap<String, usize> {
    let db = rusqlite::Connection::open(database).unwrap();
    // The example may be committing right now: wait for its lock instead of failing.
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let mut query = db.prepare("SELECT data FROM effects").unwrap();
    let mut counts = BTreeMap::new();
    let rows = query.query_map([], |row| row.get::<_, Vec<u8>>(0)).unwrap();
    for data in rows {
        let data = String::from_utf8(data.unwrap()).unwrap();
        *counts.entry(data).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_random_moments_every_effect_is_in_the_database_exactly_once() {
    let client = support::kinesis_client();
    let stream = support::unique_name("exactly-once");
    support::create_stream(&client, &stream, 2).await;
    put_all(&client, &stream).await;
    let application = support::unique_name("exactly-once-app");
    let database = support::logs_dir().join(format!("{application}.db"));
    let _ = std::fs::remove_file(&database);
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill delays seeded with {seed}");
    let mut delays = Delays(seed);

    let (mut applied, mut again) = (0, 0);
    for run in 0..KILLS {
        let mut child = start(
            &stream,
            &database,
            &application,
            &format!("{application}-{run}.log"),
        );
        // Killed a random moment after it applied its first record of this run.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let counted = count_lines(&mut child, tx);
        tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .expect("each run makes progress")
            .expect("the example applies a record before it ends");
        tokio::time::sleep(Duration::from_millis(delays.next_ms())).await;
        child.kill().await.unwrap();
        let (a, g) = counted.await.unwrap();
        applied += a;
        again += g;
    }
    let done = effects(&database).len();
    eprintln!("after {KILLS} kills: {done} of {RECORDS} effects, {applied} applied");
    assert!(
        done < RECORDS,
        "the kills landed mid-stream ({done} of {RECORDS} done)"
    );

    // The last run goes to the end, then stops gracefully.
    let mut last = start(
        &stream,
        &database,
        &application,
        &format!("{application}-last.log"),
    );
    let counted = count_lines(&mut last, tokio::sync::oneshot::channel().0);
    support::eventually("every effect", Duration::from_secs(120), async || {
        effects(&database).len() == RECORDS
    })
    .await;
    let pid = last.id().expect("running");
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), last.wait())
        .await
        .expect("a graceful stop")
        .unwrap();
    assert!(status.success(), "{status}");
    let (a, g) = counted.await.unwrap();
    applied += a;
    again += g;

    let counts = effects(&database);
    let twice: Vec<(&String, &usize)> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "effects not exactly once: {twice:?}");
    let expected: Vec<String> = (0..RECORDS).map(|i| format!("e-{i:05}")).collect();
    assert_eq!(
        counts.keys().cloned().collect::<Vec<_>>(),
        expected,
        "no gap"
    );
    assert!(applied <= RECORDS, "{applied} applied");
    assert_eq!(
        again, 0,
        "no committed record was delivered again: each shard opened after its stored position"
    );
}
