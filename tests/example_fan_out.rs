//! The spec's shipping example reading with enhanced fan-out
//! (`examples/kinesis_subscriptions_shards_fan_out.rs`, the built binary) live on the
//! emulators: it registers its consumer, and every shipment is handled once, each customer's
//! in order.

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use kinesis_dataflow::AwsKinesis;
use kinesis_dataflow::api::{ConsumerStatus, KinesisApi};
use tokio::io::{AsyncBufReadExt, BufReader};

const CUSTOMERS: usize = 6;
const PER_CUSTOMER: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shards_example_with_fan_out_handles_every_shipment_in_order() {
    let client = support::kinesis_client();
    support::create_stream(&client, "shipments", 2).await;
    let mut child = support::examples::command("kinesis_subscriptions_shards_fan_out")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the example starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The example reads new shards from the tip: publish once it holds both shards.
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut taken = 0;
        while taken < 2 {
            let line = lines.next_line().await.unwrap().expect("the example runs");
            taken += usize::from(line.contains("lease taken"));
        }
    })
    .await
    .expect("the example takes both shards");
    let api = Arc::new(AwsKinesis::new(client.clone()));
    let consumer = api
        .describe_stream_consumer("shipments", "shipping")
        .await
        .expect("the example registered its consumer");
    assert_eq!(consumer.status, ConsumerStatus::Active);

    for seq in 1..=PER_CUSTOMER {
        for c in 0..CUSTOMERS {
            let customer = format!("customer-{c}");
            let body = format!(r#"{{"customer":"{customer}","seq":{seq}}}"#);
            client
                .put_record()
                .stream_name("shipments")
                .partition_key(customer)
                .data(Blob::new(body.into_bytes()))
                .send()
                .await
                .unwrap();
        }
    }
    let mut handled: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let total = CUSTOMERS * PER_CUSTOMER as usize;
    let read = tokio::time::timeout(Duration::from_secs(90), async {
        while handled.values().map(Vec::len).sum::<usize>() < total {
            let line = lines.next_line().await.unwrap().expect("the example runs");
            if let Some((customer, seq)) = support::shipped::shipped_line(&line) {
                handled.entry(customer).or_default().push(seq);
            }
        }
    })
    .await;
    child.kill().await.unwrap();
    assert!(read.is_ok(), "every shipment in time; handled: {handled:?}");
    for c in 0..CUSTOMERS {
        assert_eq!(
            handled[&format!("customer-{c}")],
            (1..=PER_CUSTOMER).collect::<Vec<_>>(),
            "customer-{c}: every shipment once, in order"
        );
    }
}
