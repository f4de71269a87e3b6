//! Spans: a handler's work instrumented with `Delivery::span()` logs inside the shard reader's
//! span (stream and shard), itself inside the subscription's; and reading hundreds of records
//! logs nothing per record at info level or above. On the in-memory transport.

use std::io::Write;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kinesis_dataflow::{KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription};
use tracing::Instrument;

/// Every line the fmt layer writes.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_logs_inside_its_shard_span_and_nothing_per_record_is_above_debug() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    const RECORDS: usize = 400;
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 2).unwrap();
    for i in 0..RECORDS {
        kinesis
            .put("orders", &format!("customer-{i}"), format!("order {i}"))
            .unwrap();
    }
    let mut orders = Subscription::builder(
        Arc::new(kinesis),
        Arc::new(MemoryLeaseStore::new()),
        "orders",
    )
    .owner("spans")
    .application("billing")
    .start_at(KinesisPosition::horizon())
    .start()
    .await
    .unwrap();
    let before_handling = lines.text().lines().count();
    let mut handled_on = Vec::new();
    for _ in 0..RECORDS {
        let delivery = orders.next().await.unwrap().unwrap();
        let shard = delivery.shard_id().to_owned();
        let span = delivery.span();
        let log = handled_on.len() < 4 || !handled_on.contains(&shard);
        async {
            if log {
                tracing::info!(handler = true, "handled");
            }
            delivery.ack();
        }
        .instrument(span)
        .await;
        handled_on.push(shard);
    }
    let text = lines.text();
    let handler_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("handler=true"))
        .collect();
    assert!(!handler_lines.is_empty());
    for line in &handler_lines {
        assert!(
            line.contains("subscription{application=billing stream=orders owner=spans}")
                && line.contains("shard{stream=orders shard=shardId-00000000000"),
            "a handler's line names its subscription and shard: {line}"
        );
    }
    let shards_named: std::collections::BTreeSet<&str> = handler_lines
        .iter()
        .filter_map(|l| l.split("shard=").nth(1)?.split('}').next())
        .collect();
    assert_eq!(shards_named.len(), 2, "both shards: {handler_lines:#?}");

    // The library's own lines while 400 records were read and acked: a handful, not one a
    // record.
    let library_lines = text
        .lines()
        .skip(before_handling)
        .filter(|l| !l.contains("handler=true"))
        .count();
    assert!(
        library_lines < 20,
        "{library_lines} library lines at info or above while handling {RECORDS} records:\n{text}"
    );
    orders.shutdown().await;
}
