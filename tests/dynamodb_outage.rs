//! DynamoDB unreachable for longer than the lease duration, then back: every connection to the
//! lease table is dropped by the fault proxy (dynalite keeps running, so the table and its rows
//! survive, as they would on the service). The scenario and its checks are in
//! `tests/support/outage.rs`.

#![forbid(unsafe_code)]

mod support;

use std::sync::Arc;

use kinesis_dataflow::DynamoLeaseStore;
use support::proxy::{self, Fault, FaultProxy, Rule};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_stop_during_a_lease_table_outage_and_everything_arrives_after_it() {
    let dynamodb = FaultProxy::start(&support::dynamodb_endpoint()).await;
    let store = Arc::new(
        DynamoLeaseStore::new(
            aws_sdk_dynamodb::Client::from_conf(proxy::dynamodb_config_builder(&dynamodb).build()),
            support::unique_name("outage-leases"),
        )
        .unwrap(),
    );
    let outage = std::sync::Mutex::new(None);
    support::outage::lease_table_outage(
        "outage",
        store,
        async { *outage.lock().unwrap() = Some(dynamodb.add(Rule::any(Fault::Drop))) },
        async {
            if let Some(rule) = outage.lock().unwrap().take() {
                println!("outage: {} calls dropped", dynamodb.injected(rule));
                dynamodb.remove(rule);
            }
        },
    )
    .await;
}
