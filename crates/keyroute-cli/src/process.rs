//! What every long-running subcommand shares: logging, the async runtime, the shutdown signal.

use anyhow::{Context, Result};

use crate::Usage;

pub fn init_logging(filter: &str) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| Usage(format!("--log: {e}")))?;
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
    Ok(())
}

pub fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let rt = match threads {
        Some(0) => return Err(Usage("--threads: must be at least 1".into()).into()),
        Some(1) => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
        None => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
    };
    rt.context("starting the async runtime")
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = term => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown signal received");
}
