//! Errors by layer: [`WorkerError`] for setting a worker up (the public boundary), and
//! `RequestError` for one HTTP request, which never leaves the crate: it becomes a status code and
//! a JSON body.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use http::StatusCode;

/// Why a worker could not be set up, or images not generated.
///
/// A running worker does not fail: errors while serving are answered to the client (see the
/// crate documentation) and logged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A [`WorkerConfig`](crate::WorkerConfig) field (or a [`generate_images`](crate::generate_images)
    /// argument) is out of range.
    #[error("invalid worker config: {field} {reason}")]
    Config {
        /// The field or argument.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The listening socket could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's error.
        source: io::Error,
    },
    /// The image directory does not exist or cannot be read.
    #[error("image directory {}: {source}", path.display())]
    ImagesDir {
        /// The directory as configured.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// The cache directory cannot be created or scanned.
    #[error("cache directory {}: {source}", path.display())]
    CacheDir {
        /// The directory or file that failed.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// A generated image could not be written.
    #[error("cannot write image {}: {source}", path.display())]
    WriteImage {
        /// The file or directory that failed.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// A generated image could not be encoded.
    #[error("cannot encode image {}: {source}", path.display())]
    EncodeImage {
        /// The file that was being produced.
        path: PathBuf,
        /// The encoder's error.
        source: image::ImageError,
    },
    /// A background task panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Why one request failed; each variant is one status code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    /// 400: the request is malformed (bad size, bad image name).
    #[error("{0}")]
    BadRequest(String),
    /// 404: no such image or path.
    #[error("{0}")]
    NotFound(String),
    /// 405: the path exists, the method does not.
    #[error("method {0} not allowed; use GET or HEAD")]
    MethodNotAllowed(http::Method),
    /// 502: the source image exists but cannot be decoded.
    #[error("cannot decode source image {image}: {source}")]
    Undecodable { image: String, source: image::ImageError },
    /// 500: anything else.
    #[error("{0}")]
    Internal(String),
}

impl RequestError {
    /// The status code this error answers with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            RequestError::BadRequest(_) => StatusCode::BAD_REQUEST,
            RequestError::NotFound(_) => StatusCode::NOT_FOUND,
            RequestError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            RequestError::Undecodable { .. } => StatusCode::BAD_GATEWAY,
            RequestError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short machine-readable name for the JSON body.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            RequestError::BadRequest(_) => "bad_request",
            RequestError::NotFound(_) => "not_found",
            RequestError::MethodNotAllowed(_) => "method_not_allowed",
            RequestError::Undecodable { .. } => "undecodable_source",
            RequestError::Internal(_) => "internal",
        }
    }
}
