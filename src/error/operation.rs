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
    /// `RegisterStreamConsumer` (enhanced fan-out).
    RegisterStreamConsumer,
    /// `DescribeStreamConsumer` (enhanced fan-out).
    DescribeStreamConsumer,
    /// `DeregisterStreamConsumer` (enhanced fan-out).
    DeregisterStreamConsumer,
    /// `SubscribeToShard` (enhanced fan-out).
    SubscribeToShard,
    /// DynamoDB `DescribeTable` (the lease table).
    DescribeTable,
    /// DynamoDB `CreateTable`.
    CreateTable,
    /// DynamoDB `Scan`.
    Scan,
    /// DynamoDB `Query`.
    Query,
    /// DynamoDB `BatchGetItem`.
    BatchGetItem,
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
            Self::RegisterStreamConsumer => "RegisterStreamConsumer",
            Self::DescribeStreamConsumer => "DescribeStreamConsumer",
            Self::DeregisterStreamConsumer => "DeregisterStreamConsumer",
            Self::SubscribeToShard => "SubscribeToShard",
            Self::DescribeTable => "DescribeTable",
            Self::CreateTable => "CreateTable",
            Self::Scan => "Scan",
            Self::Query => "Query",
            Self::BatchGetItem => "BatchGetItem",
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
            | Self::Query
            | Self::BatchGetItem
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

/// An error and its sources in one short line (`dispatch failure: io error: connection
/// refused`): each `Display`, repeated ones left out, at most 300 characters. The SDK's
/// `DisplayErrorContext` prints `Debug` renderings as well, several hundred characters a line;
/// the whole chain stays reachable through `source()`.
pub(crate) fn brief(error: &(dyn std::error::Error + 'static)) -> String {
    chain(error, Some(300))
}

/// An error and its sources on one line, repeated ones left out, cut at `limit` characters.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static), limit: Option<usize>) -> String {
    let mut line = String::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty() && !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        next = e.source();
    }
    if let Some(limit) = limit.filter(|limit| line.len() > *limit) {
        let cut = (0..=limit)
            .rev()
            .find(|i| line.is_char_boundary(*i))
            .unwrap_or(0);
        line.truncate(cut);
        line.push('…');
    }
    line
}

#[cfg(test)]
mod tests {
    use super::brief;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn brief_joins_the_chain_without_repeats_and_stays_short() {
        let chain = Layer(
            "dispatch failure",
            Some(Box::new(Layer(
                "io error",
                Some(Box::new(Layer("io error", None))),
            ))),
        );
        assert_eq!(brief(&chain), "dispatch failure: io error");
        let long = Layer(Box::leak("x".repeat(1000).into_boxed_str()), None);
        assert!(brief(&long).chars().count() <= 301);
    }
}
