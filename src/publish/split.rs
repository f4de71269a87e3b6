//! Splitting the outcome of one publish made of several (a collected batch) into each one's
//! outcome: a pure function over data.

use crate::error::KinesisError;
use crate::error::{FailedRecord, FirstOfKey, PublishFailure};
use crate::record::Published;

/// The outcome of each publish of a batch whose records were, in order, `lengths[0]` records
/// of the first publish, `lengths[1]` of the second, and so on. A publish whose records were
/// all written gets their places even when others of the batch failed; one with records not
/// written gets a [`PublishFailure`] about its own records, with positions counted within it.
/// An error about the whole batch (nothing written) goes to every publish.
pub(crate) fn split(
    outcome: Result<Vec<Published>, KinesisError>,
    lengths: &[usize],
) -> Vec<Result<Vec<Published>, KinesisError>> {
    match outcome {
        Ok(mut places) => {
            let mut out = Vec::with_capacity(lengths.len());
            for &n in lengths.iter().rev() {
                out.push(Ok(places.split_off(places.len() - n)));
            }
            out.reverse();
            out
        }
        Err(KinesisError::PublishFailed(failure)) => split_failure(*failure, lengths),
        Err(error) => lengths.iter().map(|_| Err(error.clone())).collect(),
    }
}

fn split_failure(
    failure: PublishFailure,
    lengths: &[usize],
) -> Vec<Result<Vec<Published>, KinesisError>> {
    let PublishFailure {
        stream,
        attempts,
        mut published,
        failed,
        last_code,
        last_message,
        stopped_early,
    } = failure;
    let mut failed = failed.into_iter().peekable();
    let mut start = 0;
    let mut out = Vec::with_capacity(lengths.len());
    for &n in lengths {
        let end = start + n;
        let places: Vec<Option<Published>> = published.drain(..n).collect();
        let mut mine = Vec::new();
        // Within this publish, the first record not written of each key: the one the later
        // ones of that key are behind (the batch-wide one may belong to an earlier publish).
        let mut first_of_key = FirstOfKey::new();
        while let Some(record) = failed.next_if(|f| f.index < end) {
            let index = record.index - start;
            let behind = first_of_key.behind(record.record.partition_key.clone(), index);
            mine.push(FailedRecord {
                index,
                behind,
                ..record
            });
        }
        out.push(if mine.is_empty() {
            Ok(places.into_iter().flatten().collect())
        } else {
            Err(KinesisError::PublishFailed(Box::new(PublishFailure {
                stream: stream.clone(),
                attempts,
                published: places,
                failed: mine,
                last_code: last_code.clone(),
                last_message: last_message.clone(),
                stopped_early,
            })))
        });
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::publish::OutgoingRecord;

    fn place(n: usize) -> Published {
        Published {
            shard_id: "shardId-000000000000".into(),
            sequence_number: n.to_string(),
            sub_sequence_number: None,
        }
    }

    #[test]
    fn places_go_to_their_publishes_in_order() {
        let places = (0..6).map(place).collect();
        let out = split(Ok(places), &[1, 3, 2]);
        let got: Vec<Vec<String>> = out
            .into_iter()
            .map(|o| o.unwrap().into_iter().map(|p| p.sequence_number).collect())
            .collect();
        assert_eq!(got, [vec!["0"], vec!["1", "2", "3"], vec!["4", "5"]]);
    }

    #[test]
    fn a_failure_is_told_only_to_the_publishes_it_touched_counted_within_each() {
        let record = |key: &str| OutgoingRecord::new(key.to_owned(), Bytes::from_static(b"x"));
        let failure = PublishFailure {
            stream: "orders".into(),
            attempts: 8,
            // Publishes of 2, 2 and 1 records: record 2 (the second's first) failed, record
            // 3 (same key) was held behind it, record 4 (third publish, same key) too.
            published: vec![Some(place(0)), Some(place(1)), None, None, None],
            failed: vec![
                FailedRecord {
                    index: 2,
                    record: record("k"),
                    last_error: None,
                    behind: None,
                    maybe_stored: false,
                },
                FailedRecord {
                    index: 3,
                    record: record("k"),
                    last_error: None,
                    behind: Some(2),
                    maybe_stored: false,
                },
                FailedRecord {
                    index: 4,
                    record: record("k"),
                    last_error: None,
                    behind: Some(2),
                    maybe_stored: false,
                },
            ],
            last_code: "ProvisionedThroughputExceededException".into(),
            last_message: "slow down".into(),
            stopped_early: false,
        };
        let out = split(
            Err(KinesisError::PublishFailed(Box::new(failure))),
            &[2, 2, 1],
        );
        assert_eq!(out[0].as_ref().unwrap().len(), 2);
        let Err(KinesisError::PublishFailed(second)) = &out[1] else {
            panic!("the second publish failed: {:?}", out[1]);
        };
        assert_eq!(second.total(), 2);
        assert_eq!(
            second
                .failed
                .iter()
                .map(|f| (f.index, f.behind))
                .collect::<Vec<_>>(),
            [(0, None), (1, Some(0))]
        );
        let Err(KinesisError::PublishFailed(third)) = &out[2] else {
            panic!("the third publish failed: {:?}", out[2]);
        };
        assert_eq!((third.failed[0].index, third.failed[0].behind), (0, None));
        assert_eq!(third.last_code, "ProvisionedThroughputExceededException");
    }

    #[test]
    fn a_record_behind_one_of_an_earlier_publish_is_behind_the_first_of_its_own() {
        let record = |key: &str| OutgoingRecord::new(key.to_owned(), Bytes::from_static(b"x"));
        let unwritten = |index: usize, behind: Option<usize>| FailedRecord {
            index,
            record: record("k"),
            last_error: None,
            behind,
            maybe_stored: false,
        };
        // Publishes of 1 and 2 records, one key, nothing written: batch-wide, records 1 and 2
        // are behind record 0, which belongs to the first publish.
        let failure = PublishFailure {
            stream: "orders".into(),
            attempts: 1,
            published: vec![None, None, None],
            failed: vec![
                unwritten(0, None),
                unwritten(1, Some(0)),
                unwritten(2, Some(0)),
            ],
            last_code: "InternalFailure".into(),
            last_message: "try again".into(),
            stopped_early: true,
        };
        let out = split(Err(KinesisError::PublishFailed(Box::new(failure))), &[1, 2]);
        let Err(KinesisError::PublishFailed(second)) = &out[1] else {
            panic!("the second publish failed: {:?}", out[1]);
        };
        assert_eq!(
            second
                .failed
                .iter()
                .map(|f| (f.index, f.behind))
                .collect::<Vec<_>>(),
            [(0, None), (1, Some(0))]
        );
    }

    #[test]
    fn an_error_about_the_whole_batch_goes_to_every_publish() {
        let error = KinesisError::StreamNotFound {
            operation: crate::error::Operation::PutRecords,
            stream: "orders".into(),
            region: "eu-west-1".into(),
            source: None,
        };
        let out = split(Err(error), &[1, 1]);
        assert!(
            out.iter()
                .all(|o| matches!(o, Err(KinesisError::StreamNotFound { .. })))
        );
    }
}
