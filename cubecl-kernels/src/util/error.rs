//! The error every launcher returns for a shape or argument its kernel cannot take, and the check
//! that builds it.

/// A shape or argument a kernel cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    pub value: String,
    pub rule: String,
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.value, self.rule)
    }
}

impl std::error::Error for KernelError {}

pub(crate) fn require(ok: bool, value: impl Into<String>, rule: impl Into<String>) -> Result<(), KernelError> {
    if ok {
        Ok(())
    } else {
        Err(KernelError {
            value: value.into(),
            rule: rule.into(),
        })
    }
}
