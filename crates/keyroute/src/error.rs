use std::fmt;

/// The one error type of the placement library.
///
/// Every fallible constructor returns it; lookups never fail (an empty table answers `None`).
/// Match on [`Error::kind`] to handle a category; the message says what was wrong and with what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// The category of an [`Error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A node name was empty.
    EmptyName,
    /// Two nodes in one set have the same name.
    DuplicateName,
    /// A parameter was out of its range (a vnode count of 0, a negative epsilon, ...).
    InvalidParameter,
    /// A node specification string could not be parsed.
    InvalidSpec,
    /// The table would be larger than its limit (too many ring points, slots, buckets).
    TooLarge,
    /// The strategy cannot honour the request (for example, weights other than 0 and 1 for jump).
    Unsupported,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }

    pub(crate) fn invalid_parameter(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidParameter, message)
    }

    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
