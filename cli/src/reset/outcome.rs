//! How a reset ended: what applying it did, each step that failed, and the command's result,
//! decided without I/O.

use crate::Failure;

/// How a reset ended, as `--json` says it (`outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// `--dry-run`: nothing written.
    DryRun,
    /// Every checkpoint already where asked: nothing written.
    NothingToChange,
    /// Refused because live instances hold leases to change (exit status 3): nothing written.
    Refused,
    /// Every change written, every lease released.
    Applied,
    /// A call failed (exit status 1): `written` says which rows were written before it.
    Failed,
}

impl Ending {
    /// The word `--json` gives it.
    pub(super) fn word(self) -> &'static str {
        match self {
            Self::DryRun => "dry_run",
            Self::NothingToChange => "nothing_to_change",
            Self::Refused => "refused",
            Self::Applied => "applied",
            Self::Failed => "failed",
        }
    }
}

/// What applying the reset did.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// The shards whose rows were written (the checkpoint moved, or the row of an earlier
    /// stream replaced), in the order written.
    pub(super) written: Vec<String>,
    /// Each step that failed.
    pub(super) failures: Vec<StepFailure>,
    /// Why the command fails (exit status 1 or 3); `None`: it succeeded.
    pub(super) failure: Option<Failure>,
}

impl Applied {
    /// How the reset ended: applied, refused (exit status 3: an instance took a lease
    /// meanwhile, without --force), or failed.
    pub(super) fn ending(&self) -> Ending {
        match &self.failure {
            None => Ending::Applied,
            Some(failure) if failure.code == 3 => Ending::Refused,
            Some(_) => Ending::Failed,
        }
    }

    /// The command's result.
    pub(super) fn result(self) -> Result<(), Failure> {
        self.failure.map_or(Ok(()), Err)
    }
}

/// One step of the reset that failed on one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StepFailure {
    /// The shard.
    pub(super) shard_id: String,
    /// `take`, `write` or `release`.
    pub(super) step: &'static str,
    /// What went wrong.
    pub(super) error: String,
}

/// A failed take, with what became of the leases taken before it.
pub(super) fn take_failed(failure: Failure, released: Result<(), String>) -> Failure {
    let leases = match released {
        Ok(()) => "the leases taken so far were released".to_owned(),
        Err(message) => {
            format!("{message}: those leases are free again once they expire (the lease duration)")
        }
    };
    Failure {
        message: format!("{}; no checkpoint was changed ({leases})", failure.message),
        ..failure
    }
}

/// The reset's result from a failed write (if any), the shards written and the releases.
pub(super) fn outcome(
    failed: Option<String>,
    written: &[String],
    released: Result<(), String>,
) -> Result<(), Failure> {
    if let Some(message) = failed {
        let before = if written.is_empty() {
            "none".to_owned()
        } else {
            written.join(", ")
        };
        return Err(Failure::failed(format!(
            "{message}; written before it: {before} (run the reset again to finish)"
        )));
    }
    released.map_err(|message| {
        Failure::failed(format!(
            "the checkpoints were written, but {message}; those leases are taken again once \
             they expire (the lease duration)"
        ))
    })
}

/// The releases as a result: the error names the leases that could not be released.
pub(super) fn released(failures: &[StepFailure]) -> Result<(), String> {
    if failures.is_empty() {
        return Ok(());
    }
    let shards: Vec<&str> = failures.iter().map(|f| f.shard_id.as_str()).collect();
    Err(format!("releasing {} failed", shards.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_is_said_before_a_failed_release() {
        let written = ["a".to_owned(), "b".to_owned()];
        let failed = outcome(Some("writing c failed".into()), &written, Err("x".into()));
        let failed = failed.unwrap_err();
        assert_eq!(failed.code, 1);
        assert!(
            failed.message.contains("writing c failed")
                && failed.message.contains("written before it: a, b"),
            "{}",
            failed.message
        );
        let none = outcome(Some("w".into()), &[], Ok(())).unwrap_err();
        assert!(
            none.message.contains("written before it: none"),
            "{}",
            none.message
        );
        let unreleased = outcome(None, &written, Err("releasing a failed".into())).unwrap_err();
        assert!(
            unreleased
                .message
                .contains("the checkpoints were written, but releasing a failed")
        );
        assert!(outcome(None, &written, Ok(())).is_ok());
        let take = take_failed(Failure::refused("held".into()), Ok(()));
        assert_eq!(take.code, 3, "a refused take stays a refusal");
        assert!(
            take.message.contains("no checkpoint was changed"),
            "{}",
            take.message
        );
    }
}
