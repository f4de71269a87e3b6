//! Nothing to use: this package exists so that `cargo test -p kinesis-dataflow-core-check`
//! builds the dataflow core with its default features off (no broker face, no RustStream) and
//! runs the core's pipeline example against it (`tests/core_pipeline.rs`).
#![forbid(unsafe_code)]
