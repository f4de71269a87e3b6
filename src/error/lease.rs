//! The lease store's error.

use super::{ErrorSource, Operation};

/// What a lease store can answer instead of a result.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The row changed since the caller read it: another instance took, renewed or released
    /// the lease. A holder that gets this has lost the lease and must stop reading the shard.
    #[error(
        "lease on shard `{shard}` of stream `{stream}` changed under `{owner}` (another instance \
         holds it now, or it expired); stop reading the shard and take it again later"
    )]
    Lost {
        /// The stream name.
        stream: String,
        /// The shard id.
        shard: String,
        /// The owner this instance writes as.
        owner: String,
    },

    /// The lease table does not exist and could not be created.
    #[error(
        "lease table `{table}` does not exist ({operation}); let the store create it \
         (permission dynamodb:CreateTable) or create it with a string partition key `leaseKey`"
    )]
    TableNotFound {
        /// The table name.
        table: String,
        /// The call that failed.
        operation: Operation,
    },

    /// A call was denied.
    #[error(
        "{operation} on lease table `{table}` was denied: {message}; grant the IAM action \
         `{}` on the table's ARN", operation.iam_action()
    )]
    AccessDenied {
        /// The table name.
        table: String,
        /// The call that failed.
        operation: Operation,
        /// The service's explanation.
        message: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// The service refused the request itself (a bad table name, a malformed expression).
    #[error("{operation} on lease table `{table}` was refused: {message}")]
    Invalid {
        /// The table name.
        table: String,
        /// The call that failed.
        operation: Operation,
        /// The service's explanation.
        message: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// A transient failure (throttling, 5xx, a dropped connection): retry later.
    #[error("{operation} on lease table `{table}` failed: {message}; it is retried")]
    Unavailable {
        /// The table name.
        table: String,
        /// The call that failed.
        operation: Operation,
        /// What the service or the transport said.
        message: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// A setting was refused before any call was made.
    #[error("invalid setting `{setting}` = {value}: {reason}")]
    InvalidConfig {
        /// The setting's name.
        setting: &'static str,
        /// The refused value.
        value: String,
        /// What is allowed.
        reason: String,
    },
}

impl LeaseError {
    /// True when the same call may succeed later.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// True when the lease was lost to another writer.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::Lost { .. })
    }
}
