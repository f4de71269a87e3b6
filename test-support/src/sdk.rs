//! SDK configuration and clients for an emulator at a given endpoint: a fixed region, dummy
//! credentials, and the endpoint set on the service config (the process environment is never
//! read or changed). Those for this process's emulators are in [`crate::clients`]; this module
//! imports no other of the crate, so the launcher can use it without a cycle.
//!
//! SDK clients hold connection pools bound to the tokio runtime that first uses them: make a
//! fresh client in each test (they are cheap) rather than caching one in a static shared by
//! tests with different runtimes.

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_kinesis::config::{Credentials, SharedCredentialsProvider};

/// The region every client and the Kinesis emulator use.
pub const REGION: &str = "us-east-1";

/// Shared SDK config: region `us-east-1`, static dummy credentials `test`/`test`, latest
/// behavior version. Has no endpoint: use [`crate::kinesis_client`] / [`crate::dynamodb_client`]
/// (this process's emulators), [`kinesis_client_at`] / [`dynamodb_client_at`], [`sdk_config_at`], or
/// set `endpoint_url` on the service config yourself.
pub fn sdk_config() -> SdkConfig {
    SdkConfig::builder()
        .region(Region::new(REGION))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "test",
            "test",
            None,
            None,
            "kinesis-dataflow-tests",
        )))
        .behavior_version(BehaviorVersion::latest())
        .build()
}

/// [`sdk_config`] with `endpoint` as the endpoint of every service built from it.
pub fn sdk_config_at(endpoint: &str) -> SdkConfig {
    sdk_config().into_builder().endpoint_url(endpoint).build()
}

/// Kinesis service config builder pointed at `endpoint`; tweak it (retries, timeouts) before
/// `build()`.
pub fn kinesis_config_at(endpoint: &str) -> aws_sdk_kinesis::config::Builder {
    aws_sdk_kinesis::config::Builder::from(&sdk_config()).endpoint_url(endpoint)
}

/// DynamoDB service config builder pointed at `endpoint`.
pub fn dynamodb_config_at(endpoint: &str) -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::from(&sdk_config()).endpoint_url(endpoint)
}

/// A fresh Kinesis client for the emulator at `endpoint`.
pub fn kinesis_client_at(endpoint: &str) -> aws_sdk_kinesis::Client {
    aws_sdk_kinesis::Client::from_conf(kinesis_config_at(endpoint).build())
}

/// A fresh DynamoDB client for the emulator at `endpoint`.
pub fn dynamodb_client_at(endpoint: &str) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(dynamodb_config_at(endpoint).build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_has_the_region_and_an_endpoint_only_when_asked() {
        let plain = sdk_config();
        assert_eq!(plain.region().map(|r| r.as_ref()), Some(REGION));
        assert_eq!(plain.endpoint_url(), None);
        assert!(plain.credentials_provider().is_some());
        let at = sdk_config_at("http://127.0.0.1:4566");
        assert_eq!(at.endpoint_url(), Some("http://127.0.0.1:4566"));
        assert_eq!(at.region().map(|r| r.as_ref()), Some(REGION));
    }
}
