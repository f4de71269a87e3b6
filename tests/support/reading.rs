//! Helpers for tests that drive a `Subscription` directly: the fast test settings (from the
//! test-support crate), reading until an expected set of records came (from there too), and
//! logging the deliveries of several instances.

use futures::StreamExt;
use kinesis_dataflow::{MemoryKinesis, Subscription};

// `support::reading::fast` and `support::reading::read_until`, as the tests spell them; not
// every test binary uses them.
#[allow(unused_imports)]
pub use kinesis_dataflow_test_support::{fast, read_until};

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

/// One delivery as an instance's loop saw it, when it was handed out.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When the loop got it.
    pub at: tokio::time::Instant,
    /// Which instance.
    pub instance: &'static str,
    /// Its shard.
    pub shard: String,
    /// Its data, as text.
    pub payload: String,
}

/// Deliveries of several instances, in the order their loops got them.
pub type Log = std::sync::Arc<std::sync::Mutex<Vec<Seen>>>;

/// Reads `sub` until it ends, noting each delivery in `log` as it is handed out and acking it.
pub async fn log_until_end(mut sub: Subscription, instance: &'static str, log: Log) {
    while let Some(item) = sub.next().await {
        if let Ok(d) = item {
            log.lock().unwrap().push(Seen {
                at: tokio::time::Instant::now(),
                instance,
                shard: d.shard_id().to_owned(),
                payload: String::from_utf8_lossy(d.data()).into_owned(),
            });
            d.ack();
        }
    }
}
