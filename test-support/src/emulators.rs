//! This process's emulators: one kinesis-local and one dynalite, started lazily on first use
//! (installing the npm packages when missing) and kept for the whole process, their logs in
//! [`logs_dir`]. Every function works from plain code and from inside any tokio runtime.
//!
//! The launchers' stdin pipes live in statics, so they stay open until the process exits,
//! which is what keeps the emulators alive; however the process ends, the emulators stop.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::launcher::{Emulator, Kind};
use crate::npm::ensure_npm_packages;
use crate::paths::logs_dir;

/// Installs the packages if needed and starts the emulator of `kind`.
fn start(kind: Kind) -> Result<Emulator, String> {
    ensure_npm_packages().map_err(|e| format!("{e} (logs: {})", logs_dir().display()))?;
    Emulator::start_blocking(kind, &logs_dir())
}

/// The emulator of `kind`, started on first use. A failed start is remembered, so later
/// callers fail fast with the same message instead of starting again.
fn emulator(kind: Kind) -> &'static Emulator {
    static KINESIS: OnceLock<Result<Emulator, String>> = OnceLock::new();
    static DYNAMODB: OnceLock<Result<Emulator, String>> = OnceLock::new();
    let cell = match kind {
        Kind::Kinesis => &KINESIS,
        Kind::DynamoDb => &DYNAMODB,
    };
    match cell.get_or_init(|| start(kind)) {
        Ok(emulator) => emulator,
        Err(message) => panic!("{message}"),
    }
}

/// `http://127.0.0.1:PORT` of this process's Kinesis emulator (started on first use).
pub fn kinesis_endpoint() -> String {
    emulator(Kind::Kinesis).endpoint().to_owned()
}

/// Port of the Kinesis emulator's TLS (HTTP/2) listener, which serves a self-signed
/// certificate.
pub fn kinesis_tls_port() -> u16 {
    emulator(Kind::Kinesis).tls_port()
}

/// `http://127.0.0.1:PORT` of this process's DynamoDB emulator (started on first use).
pub fn dynamodb_endpoint() -> String {
    emulator(Kind::DynamoDb).endpoint().to_owned()
}

/// Path of the Kinesis emulator's log file.
pub fn kinesis_log() -> PathBuf {
    emulator(Kind::Kinesis).log().to_path_buf()
}

/// Path of the DynamoDB emulator's log file.
pub fn dynamodb_log() -> PathBuf {
    emulator(Kind::DynamoDb).log().to_path_buf()
}

/// Panics (with the log tail) if an emulator that was started has died since.
pub fn assert_emulators_alive() {
    for kind in [Kind::Kinesis, Kind::DynamoDb] {
        let emulator = emulator(kind);
        if let Err(err) = emulator.check_alive() {
            panic!("{}", emulator.failure(&err));
        }
    }
}
