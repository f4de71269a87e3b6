//! The long-running examples stopped as a supervisor stops them, live on the emulators: the
//! `consumer` and `relay` binaries get SIGTERM (what Kubernetes, ECS and systemd send) or
//! SIGINT (Ctrl-C), exit on their own with success, and leave no lease owned and no worker row
//! behind; a copy started again at once reads what was written while none ran. The times
//! (signal to exit, restart to the first new record) are printed, not judged.

mod support;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::primitives::Blob;
use futures::StreamExt;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore, ShardStream, StartingPoint};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

/// A hang guard for each step.
const PATIENCE: Duration = Duration::from_secs(60);

fn start(name: &str, args: &[&str], log: &str) -> Child {
    let stderr = std::fs::File::create(support::logs_dir().join(log)).unwrap();
    support::examples::command(name)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("the example starts")
}

/// Sends `signal` (`TERM`, `INT`) to the child.
fn send(child: &Child, signal: &str) {
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Signals the child and waits for it to exit on its own, with success; returns how long
/// that took.
async fn stop(child: &mut Child, signal: &str) -> Duration {
    let sent = Instant::now();
    send(child, signal);
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .unwrap_or_else(|_| panic!("it exits after SIG{signal}"))
        .unwrap();
    assert!(
        status.success(),
        "exits by itself, with success, on SIG{signal}: {status}"
    );
    sent.elapsed()
}

/// The rows the stopped instance left in the application's lease table: shard leases still
/// owned, and worker rows (the roster row `worker:` names whoever moved it last and stays).
async fn left_behind(application: &str, stream: &str) -> Vec<String> {
    let table = DynamoLeaseStore::default_table_name(application);
    let store = DynamoLeaseStore::new(support::dynamodb_client(), table).unwrap();
    store
        .list(stream)
        .await
        .unwrap()
        .into_iter()
        .filter(|row| {
            let worker = row.shard_id.starts_with("worker:") && row.shard_id != "worker:";
            worker || (row.shard_id.starts_with("shardId-") && row.owner.is_some())
        })
        .map(|row| format!("{} ({:?})", row.shard_id, row.owner))
        .collect()
}

async fn put(client: &aws_sdk_kinesis::Client, stream: &str, data: String, key: String) {
    client
        .put_record()
        .stream_name(stream)
        .partition_key(key)
        .data(Blob::new(data))
        .send()
        .await
        .unwrap();
}

/// An order the consumer counts as paid.
fn order(i: usize) -> String {
    format!(r#"{{"id":"o-{i}","amount_cents":{i},"status":"paid"}}"#)
}

/// Orders handled, summed over the consumer's batch lines.
fn handled(line: &str) -> usize {
    line.strip_prefix("batch of ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Reads the consumer's stdout until `count` orders were handled; returns how long it took.
async fn handle_orders(child: &mut Child, count: usize) -> Duration {
    let began = Instant::now();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = 0;
    tokio::time::timeout(PATIENCE, async {
        while seen < count {
            let line = lines.next_line().await.unwrap().expect("the consumer runs");
            seen += handled(&line);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{seen} of {count} orders handled"));
    assert_eq!(seen, count, "each order once");
    // Keep reading stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    began.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_stops_cleanly_on_sigterm_and_sigint_and_a_restart_reads_on() {
    let client = support::kinesis_client();
    let stream = support::unique_name("orders");
    support::create_stream(&client, &stream, 2).await;
    let application = support::unique_name("consumer-signals");
    for i in 0..40 {
        put(&client, &stream, order(i), format!("c-{}", i % 5)).await;
    }
    let args = [stream.as_str(), application.as_str()];
    let mut first = start("consumer", &args, "consumer-signals-1.log");
    handle_orders(&mut first, 40).await;
    let term = stop(&mut first, "TERM").await;
    assert_eq!(
        left_behind(&application, &stream).await,
        Vec::<String>::new()
    );

    // Written while nothing runs; a copy started at once reads it.
    for i in 40..60 {
        put(&client, &stream, order(i), format!("c-{}", i % 5)).await;
    }
    let mut second = start("consumer", &args, "consumer-signals-2.log");
    let restart = handle_orders(&mut second, 20).await;
    let int = stop(&mut second, "INT").await;
    assert_eq!(
        left_behind(&application, &stream).await,
        Vec::<String>::new()
    );
    eprintln!(
        "consumer: SIGTERM to exit {term:?}, SIGINT to exit {int:?}, restart to the 20 new orders {restart:?}"
    );
}

/// The data relayed to `stream` so far (one shard).
async fn relayed(stream: &str) -> BTreeSet<String> {
    let api: kinesis_dataflow::api::SharedKinesis =
        Arc::new(AwsKinesis::new(support::kinesis_client()));
    let mut reader = ShardStream::builder(api, stream, "shardId-000000000000")
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let mut out = BTreeSet::new();
    while let Ok(Some(Ok(record))) =
        tokio::time::timeout(Duration::from_millis(1500), reader.next()).await
    {
        out.insert(String::from_utf8_lossy(record.data()).into_owned());
    }
    out
}

/// Waits until every record `from..to` of the source is in the destination; returns how long
/// it took.
async fn relayed_up_to(destination: &str, from: usize, to: usize) -> Duration {
    let began = Instant::now();
    let wanted: BTreeSet<String> = (from..to).map(|i| format!("relayed:r{i:04}")).collect();
    let done = tokio::time::timeout(PATIENCE, async {
        while !wanted.is_subset(&relayed(destination).await) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(done.is_ok(), "records {from}..{to} relayed");
    began.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_stops_cleanly_on_sigint_and_sigterm_and_a_restart_reads_on() {
    let client = support::kinesis_client();
    let source = support::unique_name("relay-src");
    let destination = support::unique_name("relay-dst");
    support::create_stream(&client, &source, 2).await;
    support::create_stream(&client, &destination, 1).await;
    let application = support::unique_name("relay-signals");
    for i in 0..30 {
        put(&client, &source, format!("r{i:04}"), format!("k-{}", i % 4)).await;
    }
    let args = [source.as_str(), destination.as_str(), application.as_str()];
    let mut first = start("relay", &args, "relay-signals-1.log");
    relayed_up_to(&destination, 0, 30).await;
    let int = stop(&mut first, "INT").await;
    assert_eq!(
        left_behind(&application, &source).await,
        Vec::<String>::new()
    );

    for i in 30..45 {
        put(&client, &source, format!("r{i:04}"), format!("k-{}", i % 4)).await;
    }
    let mut second = start("relay", &args, "relay-signals-2.log");
    let restart = relayed_up_to(&destination, 30, 45).await;
    let term = stop(&mut second, "TERM").await;
    assert_eq!(
        left_behind(&application, &source).await,
        Vec::<String>::new()
    );
    eprintln!(
        "relay: SIGINT to exit {int:?}, SIGTERM to exit {term:?}, restart to the 15 new records {restart:?}"
    );
}
