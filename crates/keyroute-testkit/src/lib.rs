//! Test support for keyroute's own tests (not published):
//!
//! - [`Etcd`]: a real etcd, the Debian package's binary (installed by `scripts/test.sh`), on free
//!   loopback ports, in a temporary directory, killed by pid when dropped;
//! - [`Cuttable`]: a TCP forwarder that a test can cut, to part a gateway from etcd while etcd
//!   keeps working;
//! - [`spawn_logged`]: a process whose log lines a test waits for (the `keyroute` binary's tests).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::io::{Read, Write};

use tokio::net::{TcpListener, TcpStream};

/// Spawns `cmd` with its standard error piped, and waits (20 s at most) for a line containing
/// each needle in turn. Returns the child, the lines that matched, and the receiver of every
/// later line (keep it: a process whose log reader is gone fails its next log write).
///
/// # Panics
///
/// If the process cannot be spawned, or a needle does not appear in time.
pub fn spawn_logged(cmd: &mut Command, needles: &[&str]) -> (Child, Vec<String>, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut child = cmd.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut matched = Vec::new();
    for needle in needles {
        loop {
            let wait = deadline.saturating_duration_since(std::time::Instant::now());
            let line = rx.recv_timeout(wait).unwrap_or_else(|_| panic!("no log line with '{needle}' in time"));
            if line.contains(needle) {
                matched.push(line);
                break;
            }
        }
    }
    (child, matched, rx)
}

/// The `addr=` value of a log line.
pub fn addr_in(line: &str) -> Option<SocketAddr> {
    line.split("addr=").nth(1).and_then(|s| s.split_whitespace().next()).and_then(|a| a.parse().ok())
}

/// Two distinct free ports: both listeners are held until both are chosen, so the kernel cannot
/// hand out the same port twice (which once gave etcd the same client and peer port).
fn free_port_pair() -> (u16, u16) {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let (a, b) = (bind(), bind());
    let port = |l: &std::net::TcpListener| l.local_addr().map(|a| a.port()).expect("a free port");
    (port(&a), port(&b))
}

/// An etcd server of its own.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    /// Its client address.
    pub client: SocketAddr,
    peer: SocketAddr,
    dir: PathBuf,
}

impl Etcd {
    /// Starts one and waits until it answers (at most 20 s).
    ///
    /// # Panics
    ///
    /// If `etcd` is not installed or does not start.
    pub fn start() -> Etcd {
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir =
            std::env::temp_dir().join(format!("keyroute-etcd-{}-{}", std::process::id(), COUNT.fetch_add(1, SeqCst)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd dir");
        let (client, peer) = free_port_pair();
        let mut e = Etcd {
            child: None,
            client: SocketAddr::from(([127, 0, 0, 1], client)),
            peer: SocketAddr::from(([127, 0, 0, 1], peer)),
            dir,
        };
        // A port chosen free can be taken by another test before etcd binds it: then etcd exits,
        // and it is started again on other ports (three times at most).
        for _ in 0..2 {
            if e.try_spawn() {
                return e;
            }
            e.kill();
            let _ = std::fs::remove_dir_all(e.dir.join("data"));
            let (client, peer) = free_port_pair();
            e.client = SocketAddr::from(([127, 0, 0, 1], client));
            e.peer = SocketAddr::from(([127, 0, 0, 1], peer));
        }
        e.spawn();
        e
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.client)
    }

    /// The data directory (removed on drop).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn spawn(&mut self) {
        if !self.try_spawn() {
            panic!("etcd did not start; the end of its log:\n{}", self.log_tail());
        }
    }

    /// The last lines of etcd's log (the directory is removed on drop, so failures print them).
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Starts etcd and waits until it answers: false if it exits first (a port taken).
    fn try_spawn(&mut self) -> bool {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("etcd.log")).expect("etcd log");
        let (client, peer) = (format!("http://{}", self.client), format!("http://{}", self.peer));
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd runs (the Debian package etcd-server; scripts/test.sh installs it)");
        self.child = Some(child);
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while !self.answers() {
            if self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(Some(_)))) {
                return false;
            }
            assert!(
                std::time::Instant::now() < until,
                "etcd did not answer within 20 s; the end of its log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Whether etcd answers a range request through its JSON gateway.
    fn answers(&self) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&self.client, Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let body = r#"{"key":"Lw=="}"#;
        let req = format!(
            "POST /v3/kv/range HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.client,
            body.len()
        );
        let mut resp = Vec::new();
        s.write_all(req.as_bytes()).is_ok() && s.read_to_end(&mut resp).is_ok() && resp.starts_with(b"HTTP/1.1 200")
    }

    /// Kills etcd (SIGKILL, by pid) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a new, empty etcd in its place (the same ports, its data gone): a cluster rebuilt
    /// from nothing, whose revisions start again.
    pub fn replace_with_empty(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(self.dir.join("data"));
        self.spawn();
    }

    /// Starts it again, on the same ports with the same data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP forwarder to `target` that can be cut (every connection dropped, new ones closed at
/// once) and restored.
#[derive(Debug)]
pub struct Cuttable {
    pub addr: SocketAddr,
    open: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Cuttable {
    /// Starts forwarding (on the current tokio runtime).
    pub async fn start(target: SocketAddr) -> Cuttable {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let open = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (o, cs) = (Arc::clone(&open), Arc::clone(&conns));
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = l.accept().await {
                if !o.load(SeqCst) {
                    continue; // dropped: closed at once
                }
                let t = tokio::spawn(async move {
                    if let Ok(mut out) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                cs.lock().expect("lock").push(t.abort_handle());
            }
        });
        Cuttable { addr, open, conns, accept }
    }

    /// Drops every connection; refuses new ones until restored.
    pub fn cut(&self) {
        self.open.store(false, SeqCst);
        for c in self.conns.lock().expect("lock").drain(..) {
            c.abort();
        }
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.open.store(true, SeqCst);
    }
}

impl Drop for Cuttable {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
