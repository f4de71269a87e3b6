//! Test harness shared by the integration tests (use it with `mod support;`).
//!
//! The generic part (the emulators of `harness/` started once per test process, SDK
//! configuration and clients, unique names, streams, waits, the fast test timings) is the
//! `kinesis-dataflow-test-support` crate in `test-support/`, shared with `benches/e2e` and
//! `benches/failover`, and re-exported here whole: `support::kinesis_client()`,
//! `support::create_stream(..)`, `support::logs_dir()`, ... The modules below are the tests'
//! own.
#![allow(dead_code)]

pub mod cutoff;
pub mod events;
pub mod examples;
pub mod outage;
pub mod proxy;
pub mod reading;
pub mod shipped;
pub mod slow;
pub mod suites;
pub mod unknown;

pub use kinesis_dataflow_test_support::*;
