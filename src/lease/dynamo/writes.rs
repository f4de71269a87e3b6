//! The reads behind `get`, and the writes fenced on the owner and counter the caller last saw
//! (the Query or Scan behind `list` is in `inspect`).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, ReturnConsumedCapacity, ReturnValue,
};

use super::DynamoLeaseStore;
use super::errors::is_condition_failure;
use super::row::{COUNTER, OWNER, WRITTEN, now_ms, number, parse_row, to_item};
use crate::error::Operation;
use crate::lease::{Lease, LeaseError, unstorable};

/// The most keys one `BatchGetItem` call may name.
const BATCH_GET_KEYS: usize = 100;

/// The owner named in [`LeaseError::Lost`] when the caller's lease had no owner at all.
const NO_OWNER: &str = "(no owner)";

impl DynamoLeaseStore {
    pub(super) async fn do_list(&self, stream: &str) -> Result<Vec<Lease>, LeaseError> {
        let rows = self.list_with_write_times(stream).await?;
        Ok(rows.into_iter().map(|row| row.lease).collect())
    }

    /// Reads the named rows with `BatchGetItem` (consistent reads, 100 keys a call, keys the
    /// service left unprocessed asked for again). An id named twice is read once: the service
    /// refuses a call that names a key twice.
    pub(super) async fn do_get(
        &self,
        stream: &str,
        ids: &[String],
    ) -> Result<Vec<Lease>, LeaseError> {
        let call = Operation::BatchGetItem;
        let layout = self.key_layout().await?;
        let mut ids: Vec<&String> = ids.iter().collect();
        ids.sort_unstable();
        ids.dedup();
        let mut leases = Vec::new();
        for chunk in ids.chunks(BATCH_GET_KEYS) {
            let keys = chunk.iter().map(|id| layout.key(stream, id)).collect();
            let mut wanted = KeysAndAttributes::builder()
                .set_keys(Some(keys))
                .consistent_read(true)
                .build()
                .map_err(|err| self.invalid(call, &err.to_string()))?;
            loop {
                let answer = self
                    .client
                    .batch_get_item()
                    .request_items(&*self.table, wanted)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await
                    .map_err(|err| self.error(call, err))?;
                let rows = answer
                    .responses()
                    .and_then(|tables| tables.get(&*self.table))
                    .map_or(&[][..], Vec::as_slice);
                let consumed = answer.consumed_capacity().first();
                self.count_read(consumed, i32::try_from(rows.len()).unwrap_or(i32::MAX));
                for item in rows {
                    leases.push(parse_row(&self.table, call, item)?);
                }
                match answer
                    .unprocessed_keys
                    .and_then(|mut tables| tables.remove(&*self.table))
                {
                    Some(rest) if !rest.keys().is_empty() => wanted = rest,
                    _ => break,
                }
            }
        }
        leases.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        Ok(leases)
    }

    pub(super) async fn do_create(&self, lease: &Lease) -> Result<bool, LeaseError> {
        let call = Operation::PutItem;
        if let Some(why) = lease
            .checkpoint
            .as_ref()
            .and_then(|checkpoint| unstorable(lease, checkpoint))
        {
            return Err(self.invalid(call, &why));
        }
        let layout = self.key_layout().await?;
        let put = self
            .client
            .put_item()
            .table_name(&*self.table)
            .set_item(Some(to_item(lease, layout)))
            .condition_expression("attribute_not_exists(#key)")
            .expression_attribute_names("#key", layout.key_attribute())
            .send()
            .await;
        match put {
            Ok(_) => Ok(true),
            Err(err) if is_condition_failure(&err) => Ok(false),
            Err(err) => Err(self.error(call, err)),
        }
    }

    pub(super) async fn do_take(&self, lease: &Lease, owner: &str) -> Result<Lease, LeaseError> {
        let mut values = self.counter_values(lease, owner)?;
        values.push((":owner", AttributeValue::S(owner.to_owned())));
        let condition = match &lease.owner {
            None => "#counter = :expected AND attribute_not_exists(#owner)",
            Some(old) => {
                values.push((":old_owner", AttributeValue::S(old.clone())));
                "#counter = :expected AND #owner = :old_owner"
            }
        };
        self.update(
            lease,
            owner,
            "SET #owner = :owner, #counter = :counter, #written = :now",
            condition,
            &[
                ("#owner", OWNER),
                ("#counter", COUNTER),
                ("#written", WRITTEN),
            ],
            values,
        )
        .await
    }

    pub(super) async fn do_delete(&self, lease: &Lease) -> Result<(), LeaseError> {
        let call = Operation::DeleteItem;
        let layout = self.key_layout().await?;
        let (condition, names, values) = fenced_on(lease);
        let delete = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .set_key(Some(layout.key(&lease.stream, &lease.shard_id)))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values));
        match delete.send().await {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Err(lost(lease)),
            Err(err) => Err(self.error(call, err)),
        }
    }

    /// Puts `new` in place of `old` with one PutItem, fenced on `old`'s owner and counter as a
    /// delete is; the row written has `old`'s key and the next counter.
    pub(super) async fn do_replace(&self, old: &Lease, new: &Lease) -> Result<Lease, LeaseError> {
        let call = Operation::PutItem;
        if let Some(why) = (new.checkpoint.as_ref()).and_then(|c| unstorable(new, c)) {
            return Err(self.invalid(call, &why));
        }
        let Some(counter) = old.counter.checked_add(1) else {
            let why = format!(
                "the counter of shard `{}` of stream `{}` cannot grow past u64::MAX",
                old.shard_id, old.stream
            );
            return Err(self.invalid(call, &why));
        };
        let written = Lease {
            stream: old.stream.clone(),
            shard_id: old.shard_id.clone(),
            counter,
            ..new.clone()
        };
        let layout = self.key_layout().await?;
        let (condition, names, values) = fenced_on(old);
        let put = self
            .client
            .put_item()
            .table_name(&*self.table)
            .set_item(Some(to_item(&written, layout)))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values));
        match put.send().await {
            Ok(_) => Ok(written),
            Err(err) if is_condition_failure(&err) => Err(lost(old)),
            Err(err) => Err(self.error(call, err)),
        }
    }

    /// A write by the holder: conditional on `lease.owner` (which must be set) and the counter.
    pub(super) async fn update_held(
        &self,
        lease: &Lease,
        expression: &str,
        extra_name: Option<(&'static str, &'static str)>,
        extra_value: Option<(&'static str, AttributeValue)>,
    ) -> Result<Lease, LeaseError> {
        let Some(me) = lease.owner.as_deref() else {
            return Err(LeaseError::Lost {
                stream: lease.stream.clone(),
                shard: lease.shard_id.clone(),
                owner: NO_OWNER.to_owned(),
            });
        };
        let mut values = self.counter_values(lease, me)?;
        values.push((":me", AttributeValue::S(me.to_owned())));
        values.extend(extra_value);
        let mut names = vec![
            ("#owner", OWNER),
            ("#counter", COUNTER),
            ("#written", WRITTEN),
        ];
        names.extend(extra_name);
        self.update(
            lease,
            me,
            expression,
            "#owner = :me AND #counter = :expected",
            &names,
            values,
        )
        .await
    }

    /// `:expected` (the caller's counter), `:counter` (the next one) and `:now`.
    fn counter_values(
        &self,
        lease: &Lease,
        writer: &str,
    ) -> Result<Vec<(&'static str, AttributeValue)>, LeaseError> {
        let Some(next) = lease.counter.checked_add(1) else {
            return Err(self.invalid(
                Operation::UpdateItem,
                &format!(
                    "the counter of shard `{}` of stream `{}` cannot grow past u64::MAX (writer \
                     `{writer}`)",
                    lease.shard_id, lease.stream
                ),
            ));
        };
        Ok(vec![
            (":expected", number(lease.counter)),
            (":counter", number(next)),
            (":now", number(now_ms())),
        ])
    }

    /// One conditional UpdateItem returning the row as written; a failed condition is
    /// [`LeaseError::Lost`] naming `writer`.
    async fn update(
        &self,
        lease: &Lease,
        writer: &str,
        expression: &str,
        condition: &str,
        names: &[(&'static str, &'static str)],
        values: Vec<(&'static str, AttributeValue)>,
    ) -> Result<Lease, LeaseError> {
        let call = Operation::UpdateItem;
        let layout = self.key_layout().await?;
        let names = names
            .iter()
            .map(|(alias, name)| ((*alias).to_owned(), (*name).to_owned()))
            .collect();
        let values = values
            .into_iter()
            .map(|(alias, value)| (alias.to_owned(), value))
            .collect();
        let updated = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(layout.key(&lease.stream, &lease.shard_id)))
            .update_expression(expression)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match updated {
            Ok(out) => match out.attributes() {
                Some(row) => parse_row(&self.table, call, row),
                None => Err(self.invalid(call, "the answer holds no attributes (ALL_NEW)")),
            },
            Err(err) if is_condition_failure(&err) => Err(LeaseError::Lost {
                stream: lease.stream.clone(),
                shard: lease.shard_id.clone(),
                owner: writer.to_owned(),
            }),
            Err(err) => Err(self.error(call, err)),
        }
    }
}

/// The condition of a write fenced on the owner and counter in `lease` (a row nobody held:
/// still nobody's), with its names and values.
fn fenced_on(
    lease: &Lease,
) -> (
    &'static str,
    HashMap<String, String>,
    HashMap<String, AttributeValue>,
) {
    let names = HashMap::from([
        ("#counter".to_owned(), COUNTER.to_owned()),
        ("#owner".to_owned(), OWNER.to_owned()),
    ]);
    let mut values = HashMap::from([(":expected".to_owned(), number(lease.counter))]);
    let condition = match &lease.owner {
        None => "#counter = :expected AND attribute_not_exists(#owner)",
        Some(owner) => {
            values.insert(":owner".to_owned(), AttributeValue::S(owner.clone()));
            "#counter = :expected AND #owner = :owner"
        }
    };
    (condition, names, values)
}

/// [`LeaseError::Lost`] for a fenced write on `lease` whose condition failed.
fn lost(lease: &Lease) -> LeaseError {
    LeaseError::Lost {
        stream: lease.stream.clone(),
        shard: lease.shard_id.clone(),
        owner: lease.owner.clone().unwrap_or_else(|| NO_OWNER.to_owned()),
    }
}
