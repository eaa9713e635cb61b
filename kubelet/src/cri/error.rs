use std::time::Duration;

pub use tonic::Code;

/// A failed runtime call. `operation` is the CRI method, e.g. `CreateContainer`.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("CRI endpoint {endpoint:?}: only unix sockets are supported")]
    Endpoint { endpoint: String },
    /// The sandbox, container or image does not exist (any more).
    #[error("CRI {operation}: not found: {message}")]
    NotFound {
        operation: &'static str,
        message: String,
    },
    #[error("CRI {operation} failed ({code:?}): {message}")]
    Status {
        operation: &'static str,
        code: Code,
        message: String,
    },
    #[error("CRI {operation} did not answer within {timeout:?}")]
    Timeout {
        operation: &'static str,
        timeout: Duration,
    },
    /// The runtime answered with something the CRI does not allow.
    #[error("CRI {operation}: bad {field} in the answer: {value:?}")]
    InvalidResponse {
        operation: &'static str,
        field: &'static str,
        value: String,
    },
}

impl CriError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// The call ran out of time: ours (`Timeout`) or, for `ExecSync`, the
    /// command's own timeout, which containerd reports as DeadlineExceeded.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. }
                | Self::Status {
                    code: Code::DeadlineExceeded,
                    ..
                }
        )
    }

    pub(crate) fn from_status(operation: &'static str, status: tonic::Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::NotFound => Self::NotFound { operation, message },
            code => Self::Status {
                operation,
                code,
                message,
            },
        }
    }
}

pub type Result<T, E = CriError> = std::result::Result<T, E>;
