//! `examples/publish_keys.rs`: notes published each of the four ways (the key in the options
//! or the builder step, the `partition-key` header, the policy's fixed key, none) arrive with
//! that way's partition key, as the handler reads it (`Ctx<PartitionKey>`), and the records
//! of one key keep their order. In process (`TestApp`, one shard, the production publisher on
//! the in-memory transport) and live on the emulators (four shards).
#![forbid(unsafe_code)]

mod support;

#[allow(dead_code)]
mod example {
    include!("../examples/publish_keys.rs");
}

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use example::{AUDIT_KEY, NOTES, Note, Way};
use kinesis_dataflow::MemoryKinesis;
use kinesis_dataflow::broker::KinesisBroker;
use ruststream::runtime::HandlerOutcome;
use ruststream::testing::{InProcess, TestApp};
use ruststream::{Broker, ConnectedBroker};

// ---------------------------------------------------------------------------------------------
// What the example's handler logged

/// One `note` event of the example's handler: the note and where its record was.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shown {
    way: String,
    series: String,
    seq: u64,
    partition_key: String,
    shard: String,
}

/// The `note` events logged so far, in handling order.
fn shown() -> Vec<Shown> {
    support::events::events("note")
        .into_iter()
        .filter_map(|f| {
            Some(Shown {
                way: f.get("way")?.clone(),
                series: f.get("series")?.clone(),
                seq: f.get("seq")?.parse().ok()?,
                partition_key: f.get("partition_key")?.clone(),
                shard: f.get("shard")?.clone(),
            })
        })
        .collect()
}

/// Installs the recorder as this test binary's one global subscriber.
fn record_notes() {
    support::events::record_events();
}

/// The notes of this test (their series start with `prefix`) shown so far, in handling order.
fn shown_with(prefix: &str) -> Vec<Shown> {
    shown()
        .into_iter()
        .filter(|s| s.series.starts_with(prefix))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The notes and the checks

/// Four notes of two series each way, interleaved, every series named after `prefix`.
fn notes(prefix: &str) -> Vec<Note> {
    let mut out = Vec::new();
    for seq in 1..=4 {
        for way in Way::ALL {
            for name in ["ada", "bob"] {
                out.push(Note {
                    way,
                    series: format!("{prefix}-{}-{name}", way.as_str()),
                    seq,
                });
            }
        }
    }
    out
}

fn is_random_key(key: &str) -> bool {
    key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Every published note was shown once, with its way's key; each key's records kept their
/// publish order and their shard.
fn check(published: &[Note], shown: &[Shown]) {
    // Once each.
    let as_shown = |n: &Note| (n.way.as_str().to_owned(), n.series.clone(), n.seq);
    let mut want: Vec<_> = published.iter().map(as_shown).collect();
    let mut have: Vec<_> = shown
        .iter()
        .map(|s| (s.way.clone(), s.series.clone(), s.seq))
        .collect();
    want.sort();
    have.sort();
    assert_eq!(have, want, "every note shown once");

    // Each way's key.
    let named: BTreeSet<&str> = published.iter().map(|n| n.series.as_str()).collect();
    let mut random_keys = BTreeSet::new();
    for s in shown {
        match s.way.as_str() {
            "options" | "step" | "header" => assert_eq!(
                s.partition_key, s.series,
                "{s:?}: the key named per publish or in the header"
            ),
            "policy" => assert_eq!(s.partition_key, AUDIT_KEY, "{s:?}: the policy's key"),
            "random" => {
                assert!(
                    is_random_key(&s.partition_key) && !named.contains(s.partition_key.as_str()),
                    "{s:?}: a random key"
                );
                assert!(
                    random_keys.insert(s.partition_key.clone()),
                    "{s:?}: a fresh random key per record"
                );
            }
            other => panic!("unknown way {other}"),
        }
    }

    // Per key: the notes in publish order, all on one shard.
    let key_of: BTreeMap<(String, u64), &str> = shown
        .iter()
        .map(|s| ((s.series.clone(), s.seq), s.partition_key.as_str()))
        .collect();
    let mut by_key_published: BTreeMap<&str, Vec<(&str, u64)>> = BTreeMap::new();
    for n in published {
        let key = key_of[&(n.series.clone(), n.seq)];
        by_key_published
            .entry(key)
            .or_default()
            .push((n.series.as_str(), n.seq));
    }
    let mut by_key_shown: BTreeMap<&str, Vec<(&str, u64)>> = BTreeMap::new();
    let mut shards: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for s in shown {
        by_key_shown
            .entry(s.partition_key.as_str())
            .or_default()
            .push((s.series.as_str(), s.seq));
        shards
            .entry(s.partition_key.as_str())
            .or_default()
            .insert(s.shard.as_str());
    }
    assert_eq!(
        by_key_shown, by_key_published,
        "the records of each key in publish order"
    );
    for (key, on) in shards {
        assert_eq!(on.len(), 1, "the records of key {key} on one shard: {on:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

#[tokio::test(start_paused = true)]
async fn each_way_names_the_partition_key_in_process() {
    record_notes();
    let kinesis = MemoryKinesis::new();
    // Clones of the broker share the in-process world: the app and the producer meet there.
    let broker = KinesisBroker::in_memory(kinesis.clone());
    let tb = TestApp::start(example::service(broker.clone()))
        .await
        .expect("the app starts in process");
    let producer = broker
        .clone()
        .connect_in_process()
        .await
        .expect("the producer connects in process");

    let published = notes("proc");
    example::publish_notes(&producer, &published)
        .await
        .expect("every note is published");
    tb.settle().await.expect("every note is handled");

    // One shard in process: every note in publish order, each acked.
    let broker = tb.broker::<KinesisBroker>();
    let handled = broker.subscriber(NOTES);
    assert_eq!(handled.received::<Note>(), published);
    handled
        .assert_called(published.len())
        .settled(HandlerOutcome::ack());

    // The handler saw what the records carry.
    let shown = shown_with("proc-");
    let stored: Vec<String> = kinesis
        .records(NOTES, "shardId-000000000000")
        .expect("the notes stream has its one shard")
        .iter()
        .map(|r| r.partition_key().to_owned())
        .collect();
    assert_eq!(
        shown
            .iter()
            .map(|s| s.partition_key.clone())
            .collect::<Vec<_>>(),
        stored,
        "Ctx<PartitionKey> is the record's key"
    );
    check(&published, &shown);

    producer.shutdown().await.expect("the producer closes");
    tb.shutdown().await.expect("the app stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_way_names_the_partition_key_live() {
    record_notes();
    let application = support::unique_name("publish-keys");
    let broker = || support::live_broker(&application);
    let running = example::service(broker())
        .start()
        .await
        .expect("the app starts (and creates the four-shard stream and the lease table)");
    let producer = broker().connect().await.expect("the producer connects");

    let published = notes("live");
    example::publish_notes(&producer, &published)
        .await
        .expect("every note is published");

    let wait = Duration::from_secs(60);
    let deadline = tokio::time::Instant::now() + wait;
    while shown_with("live-").len() < published.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} notes shown after {wait:?}: {:?} (logs: {})",
            shown_with("live-").len(),
            published.len(),
            shown_with("live-"),
            support::logs_dir().display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown().await.expect("the app stops");
    producer.shutdown().await.expect("the producer closes");

    let shown = shown_with("live-");
    check(&published, &shown);
    let shards: BTreeSet<&str> = shown.iter().map(|s| s.shard.as_str()).collect();
    assert!(
        shards.len() > 1,
        "the keys spread over the four shards: {shards:?}"
    );
}
