//! `keyroute serve` and `keyroute worker`: process glue (runtime, logging, signals) around the
//! gateway and worker libraries.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use keyroute_server::{Config, Gateway, GatewayHandle};

use crate::Usage;
use crate::cli::{ServeArgs, WorkerArgs};
use crate::process::{init_logging, runtime, shutdown_signal};

/// How often each gateway thread gives freed memory back (see `give_back_memory`): a thread's
/// collect walks its pages, a few microseconds each time.
const TRIM_EVERY: Duration = Duration::from_secs(2);

pub fn serve(args: &ServeArgs) -> Result<()> {
    let config = Config::load(&args.config).map_err(|e| Usage(e.to_string()))?;
    for w in &config.warnings {
        eprintln!("warning: {w}");
    }
    if args.check {
        println!(
            "{}: ok ({} listener(s), {} pool(s), {} worker(s))",
            args.config.display(),
            config.listeners.len(),
            config.pools.len(),
            config.pools.iter().map(|p| p.workers.len()).sum::<usize>()
        );
        return Ok(());
    }
    init_logging(&args.log)?;
    // --watch also watches the certificate files: a renewed certificate reloads by itself.
    let certificates: Vec<std::path::PathBuf> = config
        .listeners
        .iter()
        .filter_map(|l| l.http())
        .flat_map(|h| h.tls.iter().flat_map(|c| [c.cert.clone(), c.key.clone()]))
        .collect();
    let threads = match args.threads {
        Some(0) => return Err(Usage("--threads: must be at least 1".into()).into()),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // Bind on a runtime of its own; then one runtime per thread serves (each with its own
    // listening sockets, SO_REUSEPORT, and its own upstream connections).
    let gateway = runtime(Some(1))?.block_on(async {
        let gateway = Gateway::bind(config).await.context("starting the gateway")?;
        for addr in gateway.local_addrs() {
            tracing::info!(%addr, "listening");
        }
        tracing::info!(addr = %gateway.admin_addr(), threads, "admin API listening");
        anyhow::Ok(gateway)
    })?;
    let gateway = gateway.trim_memory(TRIM_EVERY, crate::give_back_memory);
    let handle = gateway.handle();
    let (path, watch) = (args.config.clone(), args.watch);
    let shutdown = async move {
        // Polled on the first thread's runtime: the reloaders run there.
        spawn_reloaders(handle, path, watch, certificates);
        shutdown_signal().await;
    };
    gateway.run_threads(threads, shutdown).context("serving")?;
    Ok(())
}

async fn reload(handle: &GatewayHandle, path: &Path, why: &str) {
    // Off the request threads: a big table takes a while to build.
    match handle.reload_file_off_thread(path).await {
        Ok(()) => tracing::info!(file = %path.display(), trigger = why, "reloaded"),
        Err(e) => {
            tracing::error!(file = %path.display(), trigger = why, error = %e, "reload refused; the old configuration serves on")
        }
    }
}

fn spawn_reloaders(handle: GatewayHandle, path: std::path::PathBuf, watch: bool, also: Vec<std::path::PathBuf>) {
    #[cfg(unix)]
    {
        let (handle, path) = (handle.clone(), path.clone());
        let reopener = handle.clone();
        tokio::spawn(async move {
            let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
            while hup.recv().await.is_some() {
                // logrotate's `postrotate` sends SIGHUP (or USR1, as for NGINX): the access logs
                // are reopened whether or not the reload applies.
                handle.reopen_logs();
                reload(&handle, &path, "SIGHUP").await;
            }
        });
        tokio::spawn(async move {
            let usr1 = tokio::signal::unix::SignalKind::user_defined1();
            let Ok(mut usr1) = tokio::signal::unix::signal(usr1) else { return };
            while usr1.recv().await.is_some() {
                tracing::info!("SIGUSR1: reopening the access logs");
                reopener.reopen_logs();
            }
        });
    }
    if watch {
        tokio::spawn(async move {
            let one = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            let stamp = |p: &Path| (one(p), also.iter().map(|a| one(a)).collect::<Vec<_>>());
            let mut last = stamp(&path);
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = stamp(&path);
                if now != last {
                    last = now;
                    reload(&handle, &path, "file changed").await;
                }
            }
        });
    }
}

pub fn worker(args: &WorkerArgs) -> Result<()> {
    init_logging(&args.log)?;
    if let Some(n) = args.generate {
        let names = keyroute_worker::generate_images(&args.images, n, 1024, 768, 1)
            .with_context(|| format!("generating images into {}", args.images.display()))?;
        tracing::info!(count = names.len(), dir = %args.images.display(), "generated source images");
    }
    let config = keyroute_worker::WorkerConfig {
        name: args.name.clone(),
        images: args.images.clone(),
        cache_dir: args.cache_dir.clone(),
        cache_bytes: args.cache_bytes,
        slowdown: args.slowdown,
        slots: args.slots,
        cost_ms: args.cost_ms,
        ..keyroute_worker::WorkerConfig::default()
    };
    let rt = runtime(None)?;
    rt.block_on(async {
        let worker = keyroute_worker::Worker::bind(args.listen, config).await.map_err(|e| match e {
            keyroute_worker::WorkerError::Config { .. } | keyroute_worker::WorkerError::ImagesDir { .. } => {
                anyhow::Error::new(Usage(e.to_string()))
            }
            other => anyhow::Error::new(other),
        })?;
        tracing::info!(addr = %worker.local_addr(), name = %args.name, "worker listening");
        let Some(url) = &args.register else {
            worker.run(shutdown_signal()).await.context("serving")?;
            return Ok(());
        };
        // Registered: join once listening; on SIGTERM drain (still serving), leave, then stop.
        let r = &args.registration;
        let registrar = std::sync::Arc::new(crate::members::worker_registrar(url, &args.name, worker.local_addr(), r)?);
        let stats = worker.stats();
        let (grace, limit) = (Duration::from_millis(r.drain_grace_ms), Duration::from_millis(r.drain_timeout_ms));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let keeper = {
            let registrar = std::sync::Arc::clone(&registrar);
            tokio::spawn(async move { registrar.keep(|| async { true }, Duration::from_secs(3600), stop_rx).await })
        };
        let shutdown = async move {
            shutdown_signal().await;
            let _ = stop_tx.send(true);
            let _ = keeper.await;
            // Work the gateways send (thumbnails and bad requests), not their health checks.
            let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            let requests = || load(&stats.hits) + load(&stats.misses) + load(&stats.errors);
            if let Err(e) = registrar.leave(requests, grace, limit).await {
                tracing::warn!(error = %e, "could not leave the registry; the lease expires by itself");
            }
        };
        worker.run(shutdown).await.context("serving")?;
        Ok(())
    })
}

/// `keyroute from-nutcracker`: a nutcracker YAML file as keyroute's configuration, on stdout.
pub fn from_nutcracker(args: &crate::cli::FromNutcrackerArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file).map_err(|e| Usage(format!("{}: {e}", args.file.display())))?;
    let toml = keyroute_server::config::from_nutcracker(&text, &args.file.display().to_string(), args.admin)
        .map_err(|errors| Usage(errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")))?;
    use std::io::Write as _;
    std::io::stdout().lock().write_all(toml.as_bytes())?;
    Ok(())
}
