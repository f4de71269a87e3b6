//! # The guide
//!
//! How to use the library, one chapter per concern. Each chapter is a file in `docs/guide/`
//! of the repository, compiled here so its code is tested with the crate's doctests. The
//! README is the short front door; RELIABILITY.md (each guarantee and the test that checks
//! it) and docs/ARCHITECTURE.md (how the modules fit) are at the repository's root.
//!
//! | chapter | what it covers |
//! |---|---|
//! | [`reading`] | one shard as a `Stream`, and the reader's rules |
//! | [`subscriptions`] | every shard, shared between instances; leases, sharing, failover, stopping; where each shard opens |
//! | [`settling`] | settling deliveries, poison records, the at-least-once contract, and exactly-once effects |
//! | [`publishing`] | `Publisher`, pipelines that publish, collecting and aggregating |
//! | [`kpl`] | KPL-aggregated records, read and written |
//! | [`fan_out`] | enhanced fan-out (SubscribeToShard), HTTP/2 |
//! | [`several_streams`] | several streams in one subscription |
//! | [`metrics_and_tracing`] | the metrics, the spans, and what is logged at each level |
//! | [`cli`] | the `kinesis-dataflow` command-line tool: `status`, `workers`, `reset`, `kcl` |
//! | [`kcl_migration`] | moving from the KCL and back: `kcl import` / `kcl export`, and [`Migration`](crate::kcl::Migration) |
#![cfg_attr(
    feature = "broker",
    doc = "| [`broker_face`] | the RustStream broker face (the `broker` feature) |"
)]
#![cfg_attr(
    not(feature = "broker"),
    doc = "| `broker_face` | the RustStream broker face (the `broker` feature, off in this build) |"
)]
//! | [`iam`] | the minimal IAM policy, and which role needs what |
//! | [`operations`] | adding it to a service, features, endpoints and emulators, the lease table, tests |

#[doc = include_str!("../docs/guide/reading.md")]
pub mod reading {}

#[doc = include_str!("../docs/guide/subscriptions.md")]
pub mod subscriptions {}

#[doc = include_str!("../docs/guide/settling.md")]
pub mod settling {}

#[doc = include_str!("../docs/guide/publishing.md")]
pub mod publishing {}

#[doc = include_str!("../docs/guide/kpl.md")]
pub mod kpl {}

#[doc = include_str!("../docs/guide/fan_out.md")]
pub mod fan_out {}

#[doc = include_str!("../docs/guide/several_streams.md")]
pub mod several_streams {}

#[doc = include_str!("../docs/guide/metrics_and_tracing.md")]
pub mod metrics_and_tracing {}

#[doc = include_str!("../docs/guide/cli.md")]
pub mod cli {}

#[doc = include_str!("../docs/guide/kcl_migration.md")]
pub mod kcl_migration {}

#[cfg(feature = "broker")]
#[doc = include_str!("../docs/guide/broker_face.md")]
pub mod broker_face {}

#[doc = include_str!("../docs/guide/iam.md")]
pub mod iam {}

#[doc = include_str!("../docs/guide/operations.md")]
pub mod operations {}
