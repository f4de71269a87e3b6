//! Helpers for tests that drive a `Subscription` directly: the fast test settings (from the
//! test-support crate), and reading until an expected set of records came.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::{MemoryKinesis, Subscription};

// `support::reading::fast`, as the tests spell it; not every test binary uses it.
#[allow(unused_imports)]
pub use kinesis_dataflow_test_support::fast;

/// Writes the records `from..from + count` of `stream` on the in-memory transport, each
/// `tag:ordinal` under the key `key-<ordinal % keys>`; returns their payloads in order.
pub fn write_tagged(
    memory: &MemoryKinesis,
    stream: &str,
    tag: &str,
    from: usize,
    count: usize,
    keys: usize,
) -> Vec<String> {
    (from..from + count)
        .map(|i| {
            let data = format!("{tag}:{i:05}");
            memory
                .put(stream, &format!("key-{}", i % keys), data.clone())
                .unwrap();
            data
        })
        .collect()
}

/// Reads (acking each delivery) until every payload of `expected` came, or panics after
/// `timeout` naming what is missing. Returns every delivery as (partition key, payload), in
/// delivery order.
pub async fn read_until(
    sub: &mut Subscription,
    expected: &BTreeSet<String>,
    what: &str,
    timeout: Duration,
) -> Vec<(String, String)> {
    let mut got = Vec::new();
    let mut seen = BTreeSet::new();
    let done = tokio::time::timeout(timeout, async {
        while !expected.is_subset(&seen) {
            match sub.next().await {
                Some(Ok(d)) => {
                    let payload = String::from_utf8_lossy(d.data()).into_owned();
                    seen.insert(payload.clone());
                    got.push((d.partition_key().to_owned(), payload));
                    d.ack();
                }
                Some(Err(e)) => eprintln!("{what}: {e}"),
                None => panic!("{what}: the subscription ended"),
            }
        }
    })
    .await;
    if done.is_err() {
        let missing: Vec<&String> = expected.difference(&seen).collect();
        panic!(
            "{what}: {} of {} expected records never came: {missing:?} (logs: {})",
            missing.len(),
            expected.len(),
            super::logs_dir().display()
        );
    }
    got
}
