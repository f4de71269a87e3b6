//! `--to sequence:N`: the sequence number checked against the shard it is to apply to.

use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_kinesis::types::ShardIteratorType;

use crate::Failure;
use crate::aws::{Aws, Shard};

/// Whether a decimal sequence number is at most another.
fn seq_le(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
    (a.len(), a) <= (b.len(), b)
}

/// Checks that `seq` is a record of `shard`: within its range, and accepted by
/// GetShardIterator AT_SEQUENCE_NUMBER.
pub(super) async fn check_sequence(
    aws: &Aws,
    stream: &str,
    shard: &Shard,
    seq: &str,
) -> Result<(), Failure> {
    let out_of_range = |why: String| {
        Failure::usage(format!(
            "--to sequence:{seq} is not a record of shard `{}`: {why}",
            shard.id
        ))
    };
    if !seq_le(&shard.starting_sequence_number, seq) {
        return Err(out_of_range(format!(
            "the shard begins at {}",
            shard.starting_sequence_number
        )));
    }
    if let Some(end) = &shard.ending_sequence_number
        && !seq_le(seq, end)
    {
        return Err(out_of_range(format!("the shard ends at {end}")));
    }
    let checked = aws
        .kinesis
        .get_shard_iterator()
        .stream_name(stream)
        .shard_id(&shard.id)
        .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
        .starting_sequence_number(seq)
        .send()
        .await;
    match checked {
        Ok(_) => Ok(()),
        Err(err) if err.code() == Some("InvalidArgumentException") => Err(out_of_range(
            err.message().unwrap_or("refused by Kinesis").to_owned(),
        )),
        Err(err) => Err(Failure::failed(format!(
            "GetShardIterator on `{}` to check the sequence number failed: {}",
            shard.id,
            DisplayErrorContext(&err)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        assert!(seq_le("9", "10"));
        assert!(!seq_le("10", "9"));
        assert!(seq_le("0042", "42"));
        assert!(seq_le(
            "49590338271490256608559692538361571095921575989136588898",
            "49590338271490256608559692538361571095921575989136588899"
        ));
    }
}
