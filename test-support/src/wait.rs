//! Waiting for a condition the code under test makes true.

use std::time::{Duration, Instant};

/// Polls `check` every `every` until it holds; an error once `patience` has passed without it.
///
/// # Errors
///
/// `"{what}: not within {patience:?}"` when `check` still fails after `patience`.
pub async fn wait_for(
    what: &str,
    patience: Duration,
    every: Duration,
    mut check: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + patience;
    while !check() {
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {patience:?}"));
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// Polls the asynchronous `check` (a read of a table, say) every 50 ms until it holds.
///
/// # Panics
///
/// Naming `what`, once `patience` has passed without it.
pub async fn eventually(what: &str, patience: Duration, mut check: impl AsyncFnMut() -> bool) {
    let held = tokio::time::timeout(patience, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(held.is_ok(), "never happened within {patience:?}: {what}");
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test]
    async fn returns_once_the_check_holds() {
        let calls = Cell::new(0);
        let check = || {
            calls.set(calls.get() + 1);
            calls.get() == 3
        };
        wait_for("three calls", Duration::from_secs(5), Duration::ZERO, check)
            .await
            .unwrap();
        assert_eq!(calls.get(), 3);
    }

    #[tokio::test]
    async fn names_what_never_came() {
        let patience = Duration::from_millis(30);
        let started = Instant::now();
        let err = wait_for("never", patience, Duration::from_millis(5), || false)
            .await
            .unwrap_err();
        assert_eq!(err, "never: not within 30ms");
        assert!(started.elapsed() >= patience);
    }
}
