//! The one error type of burn-lowp.
//!
//! Every public function that takes user input (shapes, tensors, files, recipe fields) returns
//! `Result<_, LowpError>`. Messages name the tensor, the offending value and the rule it breaks, so
//! that a user reading one line knows what to change.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LowpError {
    /// A tensor's shape breaks a format's or an operation's rule.
    #[error("tensor `{tensor}`: {value} breaks the rule: {rule}")]
    Shape {
        tensor: String,
        value: String,
        rule: String,
    },

    /// A tensor's element type is not one the operation accepts.
    #[error("tensor `{tensor}`: dtype {dtype} is not supported ({supported})")]
    Dtype {
        tensor: String,
        dtype: String,
        supported: String,
    },

    /// A named tensor is not present in a file.
    #[error("tensor `{tensor}` not found in {file} (it holds: {available})")]
    MissingTensor {
        tensor: String,
        file: String,
        available: String,
    },

    /// An option or argument has a value the operation cannot take.
    #[error("{what} = {value}: {rule}")]
    InvalidArgument {
        what: String,
        value: String,
        rule: String,
    },

    /// A file could not be read, parsed or written.
    #[error("{path}: {message}")]
    File { path: String, message: String },

    /// A multi-process run cannot start or go on: a rank disagrees, dies or times out, or a
    /// collective fails (`dist`). The message names the ranks involved.
    #[error("distributed run: {message}")]
    Distributed { message: String },
}

impl LowpError {
    pub fn shape(tensor: impl Into<String>, value: impl ToString, rule: impl Into<String>) -> Self {
        LowpError::Shape {
            tensor: tensor.into(),
            value: value.to_string(),
            rule: rule.into(),
        }
    }

    pub fn invalid(what: impl Into<String>, value: impl ToString, rule: impl Into<String>) -> Self {
        LowpError::InvalidArgument {
            what: what.into(),
            value: value.to_string(),
            rule: rule.into(),
        }
    }

    pub fn distributed(message: impl ToString) -> Self {
        LowpError::Distributed {
            message: message.to_string(),
        }
    }

    pub fn file(path: impl AsRef<std::path::Path>, message: impl ToString) -> Self {
        LowpError::File {
            path: path.as_ref().display().to_string(),
            message: message.to_string(),
        }
    }
}

pub type Result<T> = std::result::Result<T, LowpError>;
