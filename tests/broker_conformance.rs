//! The framework's conformance suites, run against the broker on the in-memory transport
//! (the same calls run against the emulators in `tests/broker_live.rs`).

mod support;

use kinesis_dataflow::MemoryKinesis;
use kinesis_dataflow::broker::KinesisBroker;
use support::suites;

fn broker() -> KinesisBroker {
    KinesisBroker::in_memory(MemoryKinesis::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_in_memory() {
    suites::lifecycle_suite(broker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_handle_closes_in_memory() {
    suites::shared_handle_closes(broker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_in_memory() {
    suites::shutdown_flushes(broker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlement_in_memory() {
    suites::settlement_suite(broker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_moves_in_memory() {
    suites::broker_moves(broker(), broker().create_missing_streams(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_order_in_memory() {
    suites::keyed_order(broker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_options_in_memory() {
    suites::publish_options(broker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_in_memory() {
    suites::batches(broker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeking_in_memory() {
    suites::seeking(broker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_seeking_in_memory() {
    suites::batch_seeking(broker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeking_unknown_position_in_memory() {
    suites::seeking_unknown_position(broker()).await;
}
