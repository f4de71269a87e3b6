//! The crate's examples as built binaries, started against this process's emulators.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::Command;

/// The built example `name` (`cargo test` builds the examples).
pub fn binary(name: &str) -> PathBuf {
    let path = super::target_dir()
        .join("debug")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples",
        path.display()
    );
    path
}

/// A command running example `name` with the standard AWS environment pointed at the
/// emulators, stdin closed and killed on drop.
pub fn command(name: &str) -> Command {
    let mut command = Command::new(binary(name));
    command
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_ENDPOINT_URL_KINESIS", super::kinesis_endpoint())
        .env("AWS_ENDPOINT_URL_DYNAMODB", super::dynamodb_endpoint())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}
