//! A `nats-server` child process on loopback, for the tests of gateway replicas sharing their
//! dispatches over NATS (the gateway's own and the emulator's real-process run).
//!
//! The tests skip, saying so, when the binary is missing ([`NatsServer::binary_or_skip`]):
//! the Debian package `nats-server` installs it in `/usr/sbin`, which is not on every user's
//! `PATH`. The server listens on a free loopback port with its HTTP monitor on another (its
//! `/varz` counts the bytes and messages in and out), can be killed and started again on the
//! same ports (a lost bus and its return), and is killed when dropped (also when a test panics).

use crate::{COMMAND_TIMEOUT, which};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where Debian's package puts the binary (outside a non-root user's `PATH`).
const DEBIAN_BINARY: &str = "/usr/sbin/nats-server";

/// A `nats-server` on 127.0.0.1, killed when dropped.
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    monitor: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl NatsServer {
    /// The `nats-server` binary: on `PATH`, else Debian's.
    pub fn binary() -> Option<PathBuf> {
        which("nats-server").or_else(|| {
            let sbin = PathBuf::from(DEBIAN_BINARY);
            sbin.is_file().then_some(sbin)
        })
    }

    /// The binary, or `None` after printing that `test` is skipped and why.
    pub fn binary_or_skip(test: &str) -> Option<PathBuf> {
        let found = NatsServer::binary();
        if found.is_none() {
            eprintln!(
                "SKIPPED {test}: no nats-server binary (Debian package nats-server; scripts/test installs it)"
            );
        }
        found
    }

    /// Start `binary` with extra `args` (e.g. `--user`, `--pass`) on free loopback ports and
    /// wait until it accepts connections. Panics when it does not within
    /// [`COMMAND_TIMEOUT`].
    pub async fn start(binary: PathBuf, args: &[&str]) -> NatsServer {
        let mut n = NatsServer {
            binary,
            port: free_port(),
            monitor: free_port(),
            args: args.iter().map(|a| a.to_string()).collect(),
            child: None,
        };
        n.restart().await;
        n
    }

    /// Its client URL, `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Start it (again, on the same ports) and wait until it accepts connections.
    pub async fn restart(&mut self) {
        let child = Command::new(&self.binary)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-m", &self.monitor.to_string()])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", self.binary.display()));
        self.child = Some(child);
        let addr = format!("127.0.0.1:{}", self.port);
        let deadline = tokio::time::Instant::now() + COMMAND_TIMEOUT;
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "nats-server does not accept connections on {addr} within {COMMAND_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Kill it (SIGKILL: the bus is lost, not shut down politely). Nothing if not running.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The monitor's `/varz`: `in_bytes`, `out_bytes`, `in_msgs`, `out_msgs` (since this
    /// start), connections…. Panics when the monitor does not answer with JSON within
    /// [`COMMAND_TIMEOUT`].
    pub async fn varz(&self) -> Value {
        let url = format!("http://127.0.0.1:{}/varz", self.monitor);
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let get = async {
            let uri: hyper::Uri = url.parse().expect("a valid URL");
            let r = client.get(uri).await.ok()?;
            let body = r.into_body().collect().await.ok()?.to_bytes();
            serde_json::from_slice::<Value>(&body).ok()
        };
        tokio::time::timeout(COMMAND_TIMEOUT, get)
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("no JSON from {url} within {COMMAND_TIMEOUT:?}"))
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port free now (another process may take it before the server binds it; the
/// server's start then fails loudly rather than silently joining someone else's).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    l.local_addr().expect("its address").port()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server starts, counts what goes through it, dies when killed and comes back on the
    /// same port (skipped without the binary).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn it_starts_counts_and_restarts_on_the_same_port() {
        let Some(bin) = NatsServer::binary_or_skip("testkit nats") else {
            return;
        };
        let mut n = NatsServer::start(bin, &[]).await;
        let url = n.url();
        let v = n.varz().await;
        assert_eq!(v["port"].as_u64(), Some(u64::from(n.port)), "{v}");
        assert!(v["in_bytes"].is_u64(), "{v}");
        let addr = url.trim_start_matches("nats://").to_string();
        n.kill();
        assert!(tokio::net::TcpStream::connect(&addr).await.is_err());
        n.restart().await;
        assert_eq!(n.url(), url);
        assert!(tokio::net::TcpStream::connect(&addr).await.is_ok());
    }
}
