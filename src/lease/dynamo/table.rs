//! Table setup: the table name rules, and the DescribeTable / CreateTable of `prepare`.

use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TableDescription, TableStatus,
};

use super::DynamoLeaseStore;
use super::layout::KeyLayout;
use super::row::{KEY, SHARD, STREAM};
use crate::error::Operation;
use crate::lease::LeaseError;

/// The prefix of [`DynamoLeaseStore::default_table_name`].
pub(super) const DEFAULT_TABLE_PREFIX: &str = "kinesis-dataflow";
/// How long [`LeaseStore::prepare`] waits for a table to become usable.
///
/// [`LeaseStore::prepare`]: crate::lease::LeaseStore::prepare
const TABLE_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The first pause between two DescribeTable polls; it doubles up to [`TABLE_POLL_MAX`].
const TABLE_POLL_FIRST: Duration = Duration::from_millis(20);
/// The longest pause between two DescribeTable polls.
const TABLE_POLL_MAX: Duration = Duration::from_secs(1);

impl DynamoLeaseStore {
    /// Creates the table in `layout` when it is missing, then waits until it is usable (ACTIVE,
    /// or UPDATING). The library's lease tables are by-stream; a KCL table is single-key.
    pub(crate) async fn prepare_as(&self, layout: KeyLayout) -> Result<(), LeaseError> {
        self.do_prepare(layout).await
    }

    pub(super) async fn do_prepare(&self, layout: KeyLayout) -> Result<(), LeaseError> {
        let started = tokio::time::Instant::now();
        let mut pause = TABLE_POLL_FIRST;
        let mut created = false;
        loop {
            let status = self.describe_table().await?.map(|(status, _)| status);
            match &status {
                Some(status) if is_usable(status) => return Ok(()),
                // Missing: create it once, then wait for it (it may take a moment to show up
                // in DescribeTable, or another instance may be creating it too).
                None if !created => {
                    self.create_table(layout).await?;
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
                        "the table is not ACTIVE (nor UPDATING) after {} s (status: {status})",
                        TABLE_READY_TIMEOUT.as_secs()
                    ),
                    source: None,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(TABLE_POLL_MAX);
        }
    }

    /// The table's status and key layout (kept for every later call), `None` when it does
    /// not exist. Refuses a table whose key is neither layout's.
    pub(super) async fn describe_table(
        &self,
    ) -> Result<Option<(TableStatus, KeyLayout)>, LeaseError> {
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
                let layout = self.layout_of(table)?;
                let status = table
                    .table_status()
                    .cloned()
                    .unwrap_or_else(|| TableStatus::from("(no status)"));
                Ok(Some((status, layout)))
            }
            Err(err) if err.code() == Some("ResourceNotFoundException") => Ok(None),
            Err(err) => Err(self.error(call, err)),
        }
    }

    /// The table's key layout (kept), or the error that names the key found.
    fn layout_of(&self, table: &TableDescription) -> Result<KeyLayout, LeaseError> {
        if let Some(layout) = KeyLayout::of(table) {
            return Ok(*self.layout.get_or_init(|| layout));
        }
        let found: Vec<String> = table
            .key_schema()
            .iter()
            .map(|k| format!("{} ({})", k.attribute_name(), k.key_type().as_str()))
            .collect();
        Err(self.invalid(
            Operation::DescribeTable,
            &format!(
                "the table exists with key [{}], but a lease table is keyed by string partition \
                 key `{STREAM}` and sort key `{SHARD}` (or, created before, by string partition \
                 key `{KEY}` alone); name another table",
                found.join(", ")
            ),
        ))
    }

    async fn create_table(&self, layout: KeyLayout) -> Result<(), LeaseError> {
        let call = Operation::CreateTable;
        let invalid =
            |err: aws_sdk_dynamodb::error::BuildError| self.invalid(call, &err.to_string());
        let mut create = self.client.create_table().table_name(&*self.table);
        let keys: &[(&str, KeyType)] = match layout {
            KeyLayout::ByStream => &[(STREAM, KeyType::Hash), (SHARD, KeyType::Range)],
            KeyLayout::SingleKey => &[(KEY, KeyType::Hash)],
        };
        for (name, kind) in keys {
            let definition = AttributeDefinition::builder()
                .attribute_name(*name)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(invalid)?;
            let key = KeySchemaElement::builder()
                .attribute_name(*name)
                .key_type(kind.clone())
                .build()
                .map_err(invalid)?;
            create = create.attribute_definitions(definition).key_schema(key);
        }
        let created = create.billing_mode(BillingMode::PayPerRequest).send().await;
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

/// Whether a table of this status serves reads and writes: ACTIVE, and UPDATING (its settings
/// changing: capacity, indexes, streams, replicas), which DynamoDB serves as usual.
pub(super) fn is_usable(status: &TableStatus) -> bool {
    matches!(status, TableStatus::Active | TableStatus::Updating)
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
    fn active_and_updating_tables_are_usable() {
        assert!(is_usable(&TableStatus::Active));
        assert!(is_usable(&TableStatus::Updating));
        for status in [
            TableStatus::Creating,
            TableStatus::Deleting,
            TableStatus::Archiving,
            TableStatus::Archived,
            TableStatus::InaccessibleEncryptionCredentials,
            TableStatus::from("(no status)"),
        ] {
            assert!(!is_usable(&status), "{status:?}");
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
