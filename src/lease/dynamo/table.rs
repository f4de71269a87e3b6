//! Table setup: the table name rules, and the DescribeTable / CreateTable of `prepare`.

use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TableDescription, TableStatus,
};

use super::DynamoLeaseStore;
use super::row::KEY;
use crate::error::Operation;
use crate::lease::LeaseError;

/// The prefix of [`DynamoLeaseStore::default_table_name`].
pub(super) const DEFAULT_TABLE_PREFIX: &str = "kinesis-dataflow";
/// How long [`LeaseStore::prepare`] waits for a table to become ACTIVE.
///
/// [`LeaseStore::prepare`]: crate::lease::LeaseStore::prepare
const TABLE_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The first pause between two DescribeTable polls; it doubles up to [`TABLE_POLL_MAX`].
const TABLE_POLL_FIRST: Duration = Duration::from_millis(20);
/// The longest pause between two DescribeTable polls.
const TABLE_POLL_MAX: Duration = Duration::from_secs(1);

impl DynamoLeaseStore {
    pub(super) async fn do_prepare(&self) -> Result<(), LeaseError> {
        let started = tokio::time::Instant::now();
        let mut pause = TABLE_POLL_FIRST;
        let mut created = false;
        loop {
            let status = self.describe_table().await?;
            match &status {
                Some(TableStatus::Active) => return Ok(()),
                // Missing: create it once, then wait for it (it may take a moment to show up
                // in DescribeTable, or another instance may be creating it too).
                None if !created => {
                    self.create_table().await?;
                    created = true;
                    continue;
                }
                _ => {}
            }
            if started.elapsed() >= TABLE_READY_TIMEOUT {
                let status = status.as_ref().map_or("missing", TableStatus::as_str);
                return Err(LeaseError::Unavailable {
                    table: self.table.to_string(),
                    operation: Operation::DescribeTable,
                    message: format!(
                        "the table is not ACTIVE after {} s (status: {status})",
                        TABLE_READY_TIMEOUT.as_secs()
                    ),
                    source: None,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(TABLE_POLL_MAX);
        }
    }

    /// The table's status, `None` when it does not exist. Refuses a table whose key is not
    /// the lease table's.
    pub(super) async fn describe_table(&self) -> Result<Option<TableStatus>, LeaseError> {
        let call = Operation::DescribeTable;
        match self
            .client
            .describe_table()
            .table_name(&*self.table)
            .send()
            .await
        {
            Ok(out) => {
                let Some(table) = out.table() else {
                    return Err(self.invalid(call, "the answer holds no table description"));
                };
                self.check_key_schema(table)?;
                Ok(Some(
                    table
                        .table_status()
                        .cloned()
                        .unwrap_or_else(|| TableStatus::from("(no status)")),
                ))
            }
            Err(err) if err.code() == Some("ResourceNotFoundException") => Ok(None),
            Err(err) => Err(self.error(call, err)),
        }
    }

    fn check_key_schema(&self, table: &TableDescription) -> Result<(), LeaseError> {
        let keys = table.key_schema();
        let hash_key_is_ours = matches!(
            keys,
            [key] if key.attribute_name() == KEY && key.key_type() == &KeyType::Hash
        );
        let key_is_string = table.attribute_definitions().iter().any(|def| {
            def.attribute_name() == KEY && def.attribute_type() == &ScalarAttributeType::S
        });
        // An answer without key details (a minimal emulator) is given the benefit of the doubt.
        if keys.is_empty() || (hash_key_is_ours && key_is_string) {
            return Ok(());
        }
        let found: Vec<String> = keys
            .iter()
            .map(|k| format!("{} ({})", k.attribute_name(), k.key_type().as_str()))
            .collect();
        Err(self.invalid(
            Operation::DescribeTable,
            &format!(
                "the table exists with key [{}], but a lease table needs a string partition key \
                 `{KEY}` and no sort key; name another table",
                found.join(", ")
            ),
        ))
    }

    async fn create_table(&self) -> Result<(), LeaseError> {
        let call = Operation::CreateTable;
        let definition = AttributeDefinition::builder()
            .attribute_name(KEY)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(|err| self.invalid(call, &err.to_string()))?;
        let key = KeySchemaElement::builder()
            .attribute_name(KEY)
            .key_type(KeyType::Hash)
            .build()
            .map_err(|err| self.invalid(call, &err.to_string()))?;
        let created = self
            .client
            .create_table()
            .table_name(&*self.table)
            .attribute_definitions(definition)
            .key_schema(key)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => {
                tracing::info!(table = %self.table, "created the lease table");
                Ok(())
            }
            // Another instance created it (or is creating it) first.
            Err(err) if err.code() == Some("ResourceInUseException") => Ok(()),
            Err(err) => Err(self.error(call, err)),
        }
    }
}

/// Whether DynamoDB allows `c` in a table name.
pub(super) fn is_table_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// DynamoDB's rule for table names: 3 to 255 characters of `[a-zA-Z0-9_.-]`.
pub(super) fn validate_table_name(table: &str) -> Result<(), LeaseError> {
    let refuse = |reason: String| LeaseError::InvalidConfig {
        setting: "lease_table",
        value: format!("{table:?}"),
        reason,
    };
    if let Some(bad) = table.chars().find(|c| !is_table_name_char(*c)) {
        return Err(refuse(format!(
            "a DynamoDB table name may only hold a-z, A-Z, 0-9, `_`, `-` and `.`, not {bad:?}"
        )));
    }
    let len = table.len();
    if !(3..=255).contains(&len) {
        return Err(refuse(format!(
            "a DynamoDB table name is 3 to 255 characters long, not {len}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_follow_dynamodb_rules() {
        for ok in ["abc", "a.b-c_D9", &"x".repeat(255)] {
            validate_table_name(ok).unwrap();
        }
        for (bad, hint) in [
            ("ab", "not 2"),
            ("a b c", "' '"),
            ("tablé", "'é'"),
            ("", "not 0"),
            (&"x".repeat(256), "not 256"),
        ] {
            let err = validate_table_name(bad).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(&err, LeaseError::InvalidConfig { setting: "lease_table", value, .. }
                    if *value == format!("{bad:?}")),
                "{err:?}"
            );
            assert!(text.contains(hint), "{text}");
        }
    }

    #[test]
    fn default_table_names_are_valid() {
        assert_eq!(
            DynamoLeaseStore::default_table_name("app"),
            "kinesis-dataflow-app"
        );
        assert_eq!(
            DynamoLeaseStore::default_table_name("é app#1"),
            "kinesis-dataflow---app-1"
        );
        let long = DynamoLeaseStore::default_table_name(&"ü".repeat(400));
        assert_eq!(long.len(), 255);
        for name in [long, DynamoLeaseStore::default_table_name("")] {
            validate_table_name(&name).unwrap();
        }
    }
}
