//! SDK clients and config builders for this process's emulators ([`crate::emulators`]), and the
//! broker face on them: [`crate::sdk`]'s functions with this process's endpoints filled in.
//! Each starts the emulator it needs on first use.
//!
//! SDK clients hold connection pools bound to the tokio runtime that first uses them: make a
//! fresh client in each test (they are cheap) rather than caching one in a static shared by
//! tests with different runtimes.

use kinesis_dataflow::DynamoLeaseStore;
use kinesis_dataflow::broker::KinesisBroker;

use crate::emulators::{dynamodb_endpoint, kinesis_endpoint};
use crate::sdk::{
    dynamodb_client_at, dynamodb_config_at, kinesis_client_at, kinesis_config_at, sdk_config,
};
use crate::streams::unique_name;

/// Kinesis service config builder pointed at this process's emulator (starts it if needed);
/// tweak it (retries, timeouts) before `build()`.
pub fn kinesis_config_builder() -> aws_sdk_kinesis::config::Builder {
    kinesis_config_at(&kinesis_endpoint())
}

/// DynamoDB service config builder pointed at this process's emulator (starts it if needed).
pub fn dynamodb_config_builder() -> aws_sdk_dynamodb::config::Builder {
    dynamodb_config_at(&dynamodb_endpoint())
}

/// A fresh Kinesis client for this process's emulator (starts it if needed).
pub fn kinesis_client() -> aws_sdk_kinesis::Client {
    kinesis_client_at(&kinesis_endpoint())
}

/// A fresh DynamoDB client for this process's emulator (starts it if needed).
pub fn dynamodb_client() -> aws_sdk_dynamodb::Client {
    dynamodb_client_at(&dynamodb_endpoint())
}

/// The broker face on this process's emulators, with a lease table of its own application.
pub fn live_broker(application: &str) -> KinesisBroker {
    KinesisBroker::new()
        .sdk_config(sdk_config())
        .kinesis_endpoint(kinesis_endpoint())
        .dynamodb_endpoint(dynamodb_endpoint())
        .application(application)
}

/// A lease store in a table of its own (`unique_name(prefix)`) on this process's DynamoDB
/// emulator; the library creates the table on first use.
pub fn lease_store(prefix: &str) -> DynamoLeaseStore {
    DynamoLeaseStore::new(dynamodb_client(), unique_name(prefix))
        .unwrap_or_else(|e| panic!("lease table {prefix:?}: {e}"))
}
