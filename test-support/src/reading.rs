//! Reading a `Subscription` until an expected set of records came.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::Subscription;

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
            crate::logs_dir().display()
        );
    }
    got
}
