//! The relay example (`examples/relay.rs`, the built binary) live on the emulators, killed
//! with SIGKILL in the middle of its work and started again: every record of stream A ends up
//! in stream B under its new key, and each key's records come in A's order (counting each
//! record's first appearance in B). A record appears twice only if it was in B already when
//! the relay was killed (stored, not yet checkpointed on A); the count is printed.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::{AwsKinesis, ShardStream, StartingPoint};
use tokio::process::Child;

const KEYS: usize = 6;
const FIRST: usize = 150;
const SECOND: usize = 150;

fn start(source: &str, destination: &str, application: &str, log: &str) -> Child {
    let file = std::fs::File::create(support::logs_dir().join(log)).unwrap();
    support::examples::command("relay")
        .args([source, destination, application])
        .env("RUST_LOG", "info")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("the example starts")
}

async fn publish(client: &aws_sdk_kinesis::Client, stream: &str, from: usize, count: usize) {
    for i in from..from + count {
        client
            .put_record()
            .stream_name(stream)
            .partition_key(format!("key-{}", i % KEYS))
            .data(Blob::new(format!("{}:{i:05}", i % KEYS)))
            .send()
            .await
            .unwrap();
    }
}

/// Everything in B so far, in order: (partition key, data).
async fn read_all(api: &SharedKinesis, stream: &str) -> Vec<(String, String)> {
    let mut reader = ShardStream::builder(api.clone(), stream, "shardId-000000000000")
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let mut out = Vec::new();
    while let Ok(Some(Ok(record))) =
        tokio::time::timeout(Duration::from_millis(1500), reader.next()).await
    {
        out.push((
            record.partition_key().to_owned(),
            String::from_utf8_lossy(record.data()).into_owned(),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_relay_started_again_relays_every_record_in_key_order() {
    let client = support::kinesis_client();
    let source = support::unique_name("relay-a");
    let destination = support::unique_name("relay-b");
    support::create_stream(&client, &source, 2).await;
    support::create_stream(&client, &destination, 1).await;
    let api: SharedKinesis = Arc::new(AwsKinesis::new(client.clone()));
    let application = support::unique_name("relay");

    publish(&client, &source, 0, FIRST).await;
    let mut first = start(
        &source,
        &destination,
        &application,
        &format!("{application}-1.log"),
    );
    // Killed while it works: once some of A is in B, while more is being written to A.
    tokio::time::timeout(Duration::from_secs(60), async {
        while read_all(&api, &destination).await.len() < FIRST / 3 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the relay makes progress");
    let writing = {
        let client = client.clone();
        let source = source.clone();
        tokio::spawn(async move { publish(&client, &source, FIRST, SECOND).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.kill().await.unwrap();
    // A PutRecords call the emulator received before the kill may still be stored after it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at_kill: HashSet<String> = read_all(&api, &destination)
        .await
        .into_iter()
        .map(|(_, data)| data)
        .collect();
    writing.await.unwrap();

    let mut second = start(
        &source,
        &destination,
        &application,
        &format!("{application}-2.log"),
    );
    let expected: Vec<String> = (0..FIRST + SECOND)
        .map(|i| format!("relayed:{}:{i:05}", i % KEYS))
        .collect();
    let relayed = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let relayed = read_all(&api, &destination).await;
            let seen: HashSet<&str> = relayed.iter().map(|(_, d)| d.as_str()).collect();
            if expected.iter().all(|d| seen.contains(d.as_str())) {
                return relayed;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect("every record of A reaches B after the restart");
    second.kill().await.unwrap();

    // Each key's records, by first appearance in B, come in A's order, under the new key.
    let mut firsts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut seen = HashSet::new();
    let mut duplicates = Vec::new();
    for (key, data) in &relayed {
        let field = data
            .trim_start_matches("relayed:")
            .split(':')
            .next()
            .unwrap();
        assert_eq!(key, &format!("customer-{field}"), "re-keyed: {data}");
        if seen.insert(data.clone()) {
            firsts.entry(key.clone()).or_default().push(data.clone());
        } else {
            duplicates.push(data.clone());
        }
    }
    eprintln!(
        "{} duplicates in B of {} records (B held {} when the relay was killed)",
        duplicates.len(),
        FIRST + SECOND,
        at_kill.len()
    );
    for data in &duplicates {
        assert!(
            at_kill.contains(data),
            "{data} twice, but it was not in B when the relay was killed"
        );
    }
    for (key, datas) in &firsts {
        let mut sorted = datas.clone();
        sorted.sort();
        assert_eq!(datas, &sorted, "{key} in A's order");
    }
    assert_eq!(seen.len(), FIRST + SECOND, "nothing else in B");
}
