//! The harness kinesis-dataflow's integration tests (`tests/`, through `tests/support`) and its
//! end-to-end harnesses (`benches/e2e`, `benches/failover`) share: real wire-protocol emulators
//! for Kinesis (kinesis-local) and DynamoDB (dynalite) from `harness/`, SDK clients for them,
//! streams, waits, and the fast test timings.
//!
//! The modules import one another one way only: `emulators` → `launcher` → `sdk`, and
//! `clients` → `emulators`, `sdk`, `streams`.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`paths`] | the repository, `harness/`, Cargo's target directory, this process's [`logs_dir`] and [`log_tail`] |
//! | [`npm`] | [`ensure_npm_packages`]: `npm ci` in `harness/` under a cross-process lock when the emulators are missing |
//! | [`launcher`] | one [`Emulator`] through `harness/launch.js` on a [`free_port`], started and stopped at will (`benches/failover`) |
//! | [`emulators`] | this process's emulators, started lazily and kept for its life: [`kinesis_endpoint`], [`dynamodb_endpoint`], their logs, [`assert_emulators_alive`] |
//! | [`sdk`] | [`sdk_config`] (region, dummy credentials), service config builders and clients for an endpoint |
//! | [`clients`] | service config builders and clients for this process's emulators, [`lease_store`], [`live_broker`] |
//! | [`streams`] | [`unique_name`], [`create_stream`], [`wait_active`], [`create_stream_shards`], [`list_shards`], [`wait_table_active`] |
//! | [`reading`] | [`read_until`]: read a `Subscription` until the expected records came |
//! | [`wait`] | [`wait_for`]: poll a condition with a patience |
//! | [`timings`] | [`fast`]: a `SubscriptionBuilder` with the fast test timings |
//! | [`trace`] | [`init_tracing`]: the library's tracing in the test output |
//!
//! The functions and types are re-exported at the crate root (the timings' constants stay in
//! [`timings`]). Made for tests: the functions of [`emulators`] and [`clients`] start this
//! process's emulators on first use, and the functions of [`streams`] without a `Result` panic
//! with a message naming the logs; the benches use [`Emulator`], the `*_at` clients and the functions that return a `Result`.
//! Every function works from plain `#[test]`s and from `#[tokio::test]`s of any flavor.
//!
//! ```no_run
//! use kinesis_dataflow_test_support::{create_stream, kinesis_client, unique_name};
//!
//! # async fn example() {
//! let client = kinesis_client(); // starts kinesis-local on first use
//! let stream = unique_name("reads"); // "<prefix>-<pid>-<n>"
//! let arn = create_stream(&client, &stream, 2).await; // waits for ACTIVE
//! # let _ = arn;
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod clients;
pub mod emulators;
pub mod kpl;
pub mod launcher;
pub mod npm;
pub mod paths;
pub mod reading;
pub mod sdk;
pub mod streams;
pub mod timings;
pub mod trace;
pub mod wait;

pub use clients::{
    dynamodb_client, dynamodb_config_builder, kinesis_client, kinesis_config_builder, lease_store,
    live_broker,
};
pub use emulators::{
    assert_emulators_alive, dynamodb_endpoint, dynamodb_log, kinesis_endpoint, kinesis_log,
    kinesis_tls_port,
};
pub use launcher::{Emulator, Kind, free_port};
pub use npm::ensure_npm_packages;
pub use paths::{harness_dir, log_tail, logs_dir, repo_root, target_dir};
pub use reading::read_until;
pub use sdk::{
    REGION, dynamodb_client_at, dynamodb_config_at, kinesis_client_at, kinesis_config_at,
    sdk_config, sdk_config_at,
};
pub use streams::{
    create_stream, create_stream_shards, create_table_keyed_by, list_shards, unique_name,
    wait_active, wait_table_active,
};
pub use timings::fast;
pub use trace::init_tracing;
pub use wait::{eventually, wait_for};
