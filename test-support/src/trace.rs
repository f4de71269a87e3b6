//! The library's tracing in the test output.

/// Sends the library's tracing to the test output, filtered by `RUST_LOG` (nothing when it is
/// unset). Safe to call from every test; the first call of the process installs it.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
