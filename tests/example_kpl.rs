//! The spec's shipping example with de-aggregation on
//! (`examples/kinesis_subscriptions_shards_kpl.rs`, the built binary) live on the emulators,
//! fed by AWS's own aggregation library: every shipment of every aggregate is handled once,
//! each customer's in order.

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use kinesis_dataflow_test_support::kpl::reference_aggregate;
use tokio::io::{AsyncBufReadExt, BufReader};

const CUSTOMERS: usize = 6;
const PER_CUSTOMER: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shards_example_with_deaggregation_handles_every_aggregated_shipment_in_order() {
    let client = support::kinesis_client();
    support::create_stream(&client, "shipments", 2).await;
    let mut child = support::examples::command("kinesis_subscriptions_shards_kpl")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the example starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The example reads new shards from the tip: produce once it holds both shards.
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut taken = 0;
        while taken < 2 {
            let line = lines.next_line().await.unwrap().expect("the example runs");
            taken += usize::from(line.contains("lease taken"));
        }
    })
    .await
    .expect("the example takes both shards");
    // Each customer's shipments in aggregates of up to 7, put under the customer's key.
    for c in 0..CUSTOMERS {
        let customer = format!("customer-{c}");
        let shipments: Vec<_> = (1..=PER_CUSTOMER)
            .map(|seq| {
                let body = format!(r#"{{"customer":"{customer}","seq":{seq}}}"#);
                (customer.clone(), None, body.into_bytes())
            })
            .collect();
        for chunk in shipments.chunks(7) {
            for (key, data) in reference_aggregate(chunk) {
                client
                    .put_record()
                    .stream_name("shipments")
                    .partition_key(key)
                    .data(Blob::new(data))
                    .send()
                    .await
                    .unwrap();
            }
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
