//! The error of moving checkpoints between a KCL lease table and the library's
//! ([`kcl`](crate::kcl)).

use super::{KinesisError, LeaseError};

/// Why an import from, or an export to, a KCL lease table did not happen. Nothing is written
/// in any of these cases except [`KclError::Lease`] and [`KclError::Kinesis`] during the
/// writes, which say how far they got.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum KclError {
    /// The KCL table does not exist.
    #[error(
        "KCL lease table `{table}` does not exist; check --kcl-table (a KCL application's \
         lease table is named after the application)"
    )]
    TableNotFound {
        /// The table name.
        table: String,
    },

    /// The table exists but does not hold KCL leases.
    #[error("table `{table}` is not a KCL lease table: {why}")]
    NotKclTable {
        /// The table name.
        table: String,
        /// What gave it away.
        why: String,
    },

    /// The KCL table holds no lease of the stream.
    #[error("KCL lease table `{table}` holds no lease of stream `{stream}`: {detail}")]
    NoRows {
        /// The table name.
        table: String,
        /// The stream name.
        stream: String,
        /// What the table does hold.
        detail: String,
    },

    /// A lease row the KCL could not have written.
    #[error("KCL lease table `{table}`, row `{row}`: attribute `{attribute}` {problem}")]
    MalformedRow {
        /// The table name.
        table: String,
        /// The row's `leaseKey`.
        row: String,
        /// The attribute at fault.
        attribute: String,
        /// What is wrong with it.
        problem: String,
    },

    /// Shards whose position the other side cannot hold, and no `unprocessed_from` was given.
    #[error(
        "{} hold no position: {}; say where their unprocessed records begin with \
         --unprocessed-from (horizon, latest or timestamp:<RFC 3339>)",
        if shards.len() == 1 { "1 shard" } else { "some shards" },
        shards.iter().map(|(s, why)| format!("{s} ({why})")).collect::<Vec<_>>().join(", ")
    )]
    NeedsPosition {
        /// Each shard, with why its position cannot be carried over.
        shards: Vec<(String, String)>,
    },

    /// A KCL worker still writes leases of the stream (renews, takes or creates them).
    #[error(
        "a KCL worker is alive: {} of KCL lease table `{table}` written within {failover_ms} ms \
         (the KCL's failover time); stop the KCL application first (or let it release its \
         leases), or pass --force if you know it is stopped; nothing was written",
        leases.iter().map(|(k, o)| format!("`{k}` (owner `{o}`)")).collect::<Vec<_>>().join(", ")
    )]
    KclWorkersAlive {
        /// The table name.
        table: String,
        /// Each lease written while it was watched, with its owner.
        leases: Vec<(String, String)>,
        /// How long the table was watched.
        failover_ms: u64,
    },

    /// Instances of the application still hold leases.
    #[error(
        "instances of the application are live: {} in lease table `{table}` written within \
         {lease_duration_ms} ms; stop them first (a graceful stop releases the leases); \
         nothing was written",
        owners.iter().map(|(o, rows)| format!("`{o}` ({})", rows.join(", "))).collect::<Vec<_>>().join("; ")
    )]
    InstancesLive {
        /// The application's lease table.
        table: String,
        /// Each live owner, with the rows it wrote.
        owners: Vec<(String, Vec<String>)>,
        /// How long the table was watched.
        lease_duration_ms: u64,
    },

    /// A row changed between the read and the write: a KCL worker or an instance is writing
    /// the table. The rows written before it stay written; run the command again.
    #[error(
        "row `{row}` of table `{table}` changed since it was read: a KCL worker or an instance \
         of the application is writing the table; stop it and run the command again (the rows \
         written before this one hold their new positions)"
    )]
    RowChanged {
        /// The table name.
        table: String,
        /// The row's `leaseKey` (or shard id).
        row: String,
    },

    /// A call to the lease table (the application's or the KCL's) failed.
    #[error(transparent)]
    Lease(#[from] LeaseError),

    /// A call to Kinesis failed.
    #[error(transparent)]
    Kinesis(#[from] KinesisError),
}

/// What kind of [`KclError`] it is: what the `kinesis-dataflow kcl` commands exit with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KclErrorKind {
    /// Bad input: a table, stream, row or position at fault (exit status 2), the
    /// application's lease table with another key or a malformed row included.
    Input,
    /// Refused while live workers or instances hold leases (exit status 3).
    Refused,
    /// A call failed (exit status 1).
    Failed,
}

impl KclError {
    /// The message with every source under it, on one line (the SDK's cause of a failed
    /// call included).
    #[must_use]
    pub fn report(&self) -> String {
        super::operation::chain(self, None)
    }

    /// What kind of error it is.
    #[must_use]
    pub fn kind(&self) -> KclErrorKind {
        match self {
            Self::TableNotFound { .. }
            | Self::NotKclTable { .. }
            | Self::NoRows { .. }
            | Self::MalformedRow { .. }
            | Self::NeedsPosition { .. }
            | Self::Lease(
                LeaseError::TableNotFound { .. }
                | LeaseError::Invalid { .. }
                | LeaseError::InvalidConfig { .. },
            )
            | Self::Kinesis(
                KinesisError::StreamNotFound { .. } | KinesisError::InvalidArgument { .. },
            ) => KclErrorKind::Input,
            Self::KclWorkersAlive { .. } | Self::InstancesLive { .. } | Self::RowChanged { .. } => {
                KclErrorKind::Refused
            }
            Self::Lease(_) | Self::Kinesis(_) => KclErrorKind::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Operation;

    #[test]
    fn a_changed_row_reads_as_one_sentence() {
        let changed = KclError::RowChanged {
            table: "orders-kcl".to_owned(),
            row: "shardId-000000000000".to_owned(),
        }
        .to_string();
        assert!(!changed.contains("  "), "{changed}");
        assert!(
            changed.contains("an instance of the application"),
            "{changed}"
        );
    }

    #[test]
    fn a_bad_application_table_is_bad_input() {
        let invalid = KclError::Lease(LeaseError::Invalid {
            table: "orders".to_owned(),
            operation: Operation::Scan,
            message: "lease row `s0`: attribute `leaseCounter` is S, expected N".to_owned(),
            source: None,
        });
        assert_eq!(invalid.kind(), KclErrorKind::Input);
        let unavailable = KclError::Lease(LeaseError::Unavailable {
            table: "orders".to_owned(),
            operation: Operation::Scan,
            message: "throttled".to_owned(),
            source: None,
        });
        assert_eq!(unavailable.kind(), KclErrorKind::Failed);
    }
}
