//! What a failed call was ([`Operation`]) and what failed underneath it ([`ErrorSource`]):
//! shared by the crate's error and the lease store's.

use std::fmt;
use std::sync::Arc;

/// The error underneath a failed call (the AWS SDK's), kept as the [`source`] of the crate's
/// error. Shared, so [`KinesisError`](super::KinesisError) stays `Clone`.
///
/// [`source`]: std::error::Error::source
pub type ErrorSource = Arc<dyn std::error::Error + Send + Sync>;

/// The Kinesis or DynamoDB operation an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `ListShards`.
    ListShards,
    /// `GetShardIterator`.
    GetShardIterator,
    /// `GetRecords`.
    GetRecords,
    /// `PutRecords`.
    PutRecords,
    /// `CreateStream`.
    CreateStream,
    /// `DescribeStreamSummary`.
    DescribeStreamSummary,
    /// `SplitShard`.
    SplitShard,
    /// `MergeShards`.
    MergeShards,
    /// DynamoDB `DescribeTable` (the lease table).
    DescribeTable,
    /// DynamoDB `CreateTable`.
    CreateTable,
    /// DynamoDB `Scan`.
    Scan,
    /// DynamoDB `PutItem`.
    PutItem,
    /// DynamoDB `UpdateItem`.
    UpdateItem,
    /// DynamoDB `DeleteItem`.
    DeleteItem,
}

impl Operation {
    /// The operation's name as the service spells it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ListShards => "ListShards",
            Self::GetShardIterator => "GetShardIterator",
            Self::GetRecords => "GetRecords",
            Self::PutRecords => "PutRecords",
            Self::CreateStream => "CreateStream",
            Self::DescribeStreamSummary => "DescribeStreamSummary",
            Self::SplitShard => "SplitShard",
            Self::MergeShards => "MergeShards",
            Self::DescribeTable => "DescribeTable",
            Self::CreateTable => "CreateTable",
            Self::Scan => "Scan",
            Self::PutItem => "PutItem",
            Self::UpdateItem => "UpdateItem",
            Self::DeleteItem => "DeleteItem",
        }
    }

    /// The service the operation belongs to, as IAM names it: `kinesis` or `dynamodb`.
    #[must_use]
    pub fn service(self) -> &'static str {
        match self {
            Self::DescribeTable
            | Self::CreateTable
            | Self::Scan
            | Self::PutItem
            | Self::UpdateItem
            | Self::DeleteItem => "dynamodb",
            _ => "kinesis",
        }
    }

    /// The IAM action a caller needs for this operation.
    #[must_use]
    pub fn iam_action(self) -> String {
        format!("{}:{}", self.service(), self.as_str())
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
