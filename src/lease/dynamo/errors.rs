//! How a failed DynamoDB call becomes a [`LeaseError`].

use std::sync::Arc;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

use super::DynamoLeaseStore;
use crate::error::{ErrorSource, Operation};
use crate::lease::LeaseError;

impl DynamoLeaseStore {
    pub(super) fn invalid(&self, call: Operation, message: &str) -> LeaseError {
        LeaseError::Invalid {
            table: self.table.to_string(),
            operation: call,
            message: message.to_owned(),
            source: None,
        }
    }

    pub(crate) fn error<E>(&self, call: Operation, err: SdkError<E, HttpResponse>) -> LeaseError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let failure = match &err {
            SdkError::ServiceError(service) => Failure::Service {
                code: service.err().code().map(str::to_owned),
                status: service.raw().status().as_u16(),
                message: service
                    .err()
                    .message()
                    .filter(|m| !m.is_empty())
                    .map_or_else(|| crate::error::brief(&err), str::to_owned),
            },
            SdkError::ConstructionFailure(_) => Failure::Request(crate::error::brief(&err)),
            _ => Failure::Transport(crate::error::brief(&err)),
        };
        let source: ErrorSource = Arc::new(err);
        classify(&self.table, call, failure, Some(source))
    }
}

/// How a call failed, before it is mapped onto [`LeaseError`].
#[derive(Debug)]
enum Failure {
    /// The service answered with an error.
    Service {
        code: Option<String>,
        status: u16,
        message: String,
    },
    /// The request could not be built (nothing was sent).
    Request(String),
    /// Nothing usable came back: a dispatch failure, a timeout, an unreadable answer.
    Transport(String),
}

pub(super) fn is_condition_failure<E: ProvideErrorMetadata>(
    err: &SdkError<E, HttpResponse>,
) -> bool {
    err.code() == Some("ConditionalCheckFailedException")
}

/// What a DynamoDB error code means for the lease store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NoTable,
    Denied,
    Transient,
    Refused,
}

/// The meaning of an error `code` answered with HTTP `status`.
fn kind(code: &str, status: u16) -> Kind {
    match code {
        "ResourceNotFoundException" => Kind::NoTable,
        "AccessDeniedException"
        | "AccessDenied"
        | "UnrecognizedClientException"
        | "InvalidClientTokenId"
        | "InvalidSignatureException"
        | "IncompleteSignatureException"
        | "MissingAuthenticationTokenException"
        | "ExpiredTokenException"
        | "ExpiredToken" => Kind::Denied,
        "ProvisionedThroughputExceededException"
        | "ThrottlingException"
        | "Throttling"
        | "RequestLimitExceeded"
        | "LimitExceededException"
        | "InternalServerError"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "ServiceUnavailableException"
        | "TransactionConflictException"
        | "ResourceInUseException"
        | "RequestTimeout"
        | "RequestTimeoutException" => Kind::Transient,
        _ if status >= 500 => Kind::Transient,
        // ValidationException (a bad table name, a reserved word in an expression), a
        // SerializationException, or anything else the service refused for good.
        _ => Kind::Refused,
    }
}

/// Maps a failed call onto the store's error.
fn classify(
    table: &str,
    operation: Operation,
    failure: Failure,
    source: Option<ErrorSource>,
) -> LeaseError {
    let table = table.to_owned();
    let (kind, message) = match failure {
        Failure::Service {
            code,
            status,
            message,
        } => {
            let code = code.unwrap_or_default();
            let described = if code.is_empty() {
                format!("HTTP {status}: {message}")
            } else {
                format!("{code}: {message}")
            };
            (kind(&code, status), described)
        }
        Failure::Request(message) => (Kind::Refused, message),
        Failure::Transport(message) => (Kind::Transient, message),
    };
    #[rustfmt::skip]
    let error = match kind {
        Kind::NoTable => LeaseError::TableNotFound { table, operation },
        Kind::Denied => LeaseError::AccessDenied { table, operation, message, source },
        Kind::Transient => LeaseError::Unavailable { table, operation, message, source },
        Kind::Refused => LeaseError::Invalid { table, operation, message, source },
    };
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(code: &str, status: u16) -> Failure {
        Failure::Service {
            code: Some(code.to_owned()),
            status,
            message: "the service said no".to_owned(),
        }
    }

    #[test]
    fn errors_are_classified() {
        let t = "leases";
        let cases = [
            (service("ResourceNotFoundException", 400), "TableNotFound"),
            (service("AccessDeniedException", 400), "AccessDenied"),
            (service("UnrecognizedClientException", 400), "AccessDenied"),
            (service("ExpiredTokenException", 400), "AccessDenied"),
            (service("ValidationException", 400), "Invalid"),
            (service("SerializationException", 400), "Invalid"),
            (
                service("ProvisionedThroughputExceededException", 400),
                "Unavailable",
            ),
            (service("ThrottlingException", 400), "Unavailable"),
            (service("RequestLimitExceeded", 400), "Unavailable"),
            (service("InternalServerError", 500), "Unavailable"),
            (service("SomethingNew", 503), "Unavailable"),
            (service("SomethingNew", 400), "Invalid"),
            (
                Failure::Transport("connection refused".into()),
                "Unavailable",
            ),
            (Failure::Request("bad input".into()), "Invalid"),
        ];
        for (failure, expected) in cases {
            let described = format!("{failure:?}");
            let err = classify(t, Operation::UpdateItem, failure, None);
            let kind = format!("{err:?}");
            assert!(kind.starts_with(expected), "{described} -> {kind}");
            let text = err.to_string();
            assert!(text.contains("`leases`"), "{text}");
            assert!(text.contains("UpdateItem"), "{text}");
        }
        let cause: ErrorSource = Arc::new(std::io::Error::other("the SDK's error"));
        let denied = classify(
            t,
            Operation::Scan,
            service("AccessDeniedException", 400),
            Some(cause),
        );
        assert!(
            matches!(&denied, LeaseError::AccessDenied { operation: Operation::Scan, message, .. }
                if message.contains("the service said no")),
            "{denied:?}"
        );
        assert!(denied.to_string().contains("dynamodb:Scan"), "{denied}");
        let source = std::error::Error::source(&denied).map(ToString::to_string);
        assert_eq!(
            source.as_deref(),
            Some("the SDK's error"),
            "the cause is kept"
        );
        let invalid = classify(
            t,
            Operation::CreateTable,
            service("ValidationException", 400),
            None,
        );
        let text = invalid.to_string();
        assert!(
            text.contains("CreateTable")
                && text.contains("ValidationException: the service said no"),
            "{text}"
        );
    }
}
