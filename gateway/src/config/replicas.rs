//! The `replicas:` block: several gateway replicas share what each dispatches over a NATS bus
//! ([`crate::replicas`]).
//!
//! ```yaml
//! replicas:
//!   address: nats://127.0.0.1:4222   # the bus (plain TCP; an unreachable one is a run-time state)
//!   subject: routelab.replicas       # events go to <subject>.<name>; every replica listens on <subject>.*
//!   name: gw-a                       # this replica's identity, unique among the replicas (default: the host name)
//!   credentials_file: /etc/routelab/nats.creds   # optional: `token: …`, or `user: …` and `password: …`
//!   heartbeat_s: 1                   # how often this replica publishes its requests in flight
//!   peer_timeout_s: 5                # a peer silent this long is forgotten (its requests released)
//!   publish_queue: 8192              # events waiting for the bus; one more is dropped and counted
//!   spread_s: 0.01                   # hold each arriving request a random time up to this before routing it (0: never)
//! ```
//!
//! `spread_s`: replicas that receive requests at the same instant decide on the same view and,
//! a bus hop apart, would all pick the same worker. Each replica holds an arriving request a
//! uniform random time up to `spread_s` (only while the bus is up) so that their decisions are
//! ordered and most see the others' dispatches; the default is the simulator's
//! ([`routelab_policies::DEFAULT_REPLICA_SPREAD_S`], docs/replicas.md).
//!
//! Everything is checked without the network: `--check` reads the credentials file (a bad one
//! is an error naming its line, never its content), but never connects.

use super::secret::Secret;
use routelab_policies::InputError;
use routelab_policies::located::rule;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `replicas:` block as written.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReplicasConfig {
    /// The NATS server, `nats://host[:port]` (port 4222 when left out).
    #[serde(default = "default_address")]
    pub address: String,
    /// The subject prefix: this replica publishes on `<subject>.<name>` and listens on
    /// `<subject>.*`.
    #[serde(default = "default_subject")]
    pub subject: String,
    /// This replica's identity; none: the host name (`[A-Za-z0-9_-]`, other characters
    /// replaced by `_`).
    #[serde(default)]
    pub name: Option<String>,
    /// A file with the bus's credentials (`token: …`, or `user: …` and `password: …`),
    /// relative to the configuration file.
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// Seconds between two snapshots of this replica's requests in flight (also its heartbeat).
    #[serde(default = "default_heartbeat")]
    pub heartbeat_s: f64,
    /// A peer silent this long is forgotten: every request it had in flight is released here.
    #[serde(default = "default_peer_timeout")]
    pub peer_timeout_s: f64,
    /// Events that may wait for the bus; one more is dropped and counted (a request never
    /// waits on the bus).
    #[serde(default = "default_publish_queue")]
    pub publish_queue: u64,
    /// The longest random hold of an arriving request before it is routed, s (0: none).
    #[serde(default = "default_spread")]
    pub spread_s: f64,
}

fn default_address() -> String {
    "nats://127.0.0.1:4222".into()
}
fn default_subject() -> String {
    "routelab.replicas".into()
}
fn default_heartbeat() -> f64 {
    1.0
}
fn default_peer_timeout() -> f64 {
    5.0
}
fn default_publish_queue() -> u64 {
    8192
}
fn default_spread() -> f64 {
    routelab_policies::DEFAULT_REPLICA_SPREAD_S
}

/// Longest `spread_s`: a hold is paid by every request's time to first token.
pub const MAX_SPREAD_S: f64 = 1.0;

/// Longest replica name: it travels in every event.
pub const MAX_REPLICA_NAME: usize = 64;
/// Longest subject prefix.
pub const MAX_SUBJECT: usize = 200;
/// Largest `publish_queue`.
pub const MAX_PUBLISH_QUEUE: u64 = 1 << 20;
/// Largest credentials file read (a token or a user and password is a few hundred bytes).
const MAX_CREDENTIALS_BYTES: u64 = 64 * 1024;

/// How the replica authenticates to the bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// No credentials.
    None,
    /// `token: …`
    Token(Secret),
    /// `user: …` and `password: …`
    UserPassword { user: String, password: Secret },
}

/// The block, validated and resolved ([`ReplicasConfig::settings`]).
#[derive(Debug, Clone)]
pub struct ReplicaSettings {
    /// `host:port` of the bus.
    pub server: String,
    pub subject: String,
    pub name: String,
    pub credentials: Credentials,
    pub heartbeat: Duration,
    pub peer_timeout: Duration,
    pub publish_queue: usize,
    /// The longest hold of an arriving request (zero: none).
    pub spread: Duration,
}

impl ReplicasConfig {
    /// Check the block without the network or the file system (`replicas.*` fields of `file`).
    pub fn validate(&self, file: &str) -> Result<(), InputError> {
        bus_address(&self.address).map_err(|why| {
            InputError::new(file, "replicas.address", why).valid(
                "nats://host:port, e.g. nats://127.0.0.1:4222 (credentials go in credentials_file)",
            )
        })?;
        check_subject(&self.subject).map_err(|why| {
            InputError::new(file, "replicas.subject", why)
                .valid("dot-separated tokens without spaces or wildcards, e.g. routelab.replicas")
        })?;
        if let Some(name) = &self.name {
            check_name(name).map_err(|why| {
                InputError::new(file, "replicas.name", why).valid(format!(
                    "1 to {MAX_REPLICA_NAME} letters, digits, `_` or `-`, unique among the replicas"
                ))
            })?;
        }
        let heartbeat =
            rule::period(self.heartbeat_s).map_err(|e| e.at_field(file, "replicas.heartbeat_s"))?;
        let timeout = rule::period(self.peer_timeout_s)
            .map_err(|e| e.at_field(file, "replicas.peer_timeout_s"))?;
        // A peer must miss at least one heartbeat before it is forgotten.
        if timeout < heartbeat * 2 {
            return Err(InputError::new(
                file,
                "replicas.peer_timeout_s",
                format!(
                    "{} s is shorter than two heartbeats ({} s each)",
                    self.peer_timeout_s, self.heartbeat_s
                ),
            )
            .valid("at least twice heartbeat_s"));
        }
        rule::whole(self.publish_queue as f64, 1, MAX_PUBLISH_QUEUE)
            .map_err(|e| e.at_field(file, "replicas.publish_queue"))?;
        if !(0.0..=MAX_SPREAD_S).contains(&self.spread_s) {
            return Err(InputError::new(
                file,
                "replicas.spread_s",
                format!("{} s is out of range", self.spread_s),
            )
            .valid(format!(
                "0 to {MAX_SPREAD_S} s (0: no hold; default {})",
                routelab_policies::DEFAULT_REPLICA_SPREAD_S
            )));
        }
        Ok(())
    }

    /// The block resolved: the name defaulted, the credentials file read (relative to `base`,
    /// the configuration's directory). A credentials file that cannot be read or is not one is
    /// an error at `replicas.credentials_file` naming the file and line, never its content.
    pub fn settings(&self, file: &str, base: &Path) -> Result<ReplicaSettings, InputError> {
        self.validate(file)?;
        let credentials = match &self.credentials_file {
            None => Credentials::None,
            Some(p) => {
                let path = if p.is_absolute() {
                    p.clone()
                } else {
                    base.join(p)
                };
                read_credentials(&path).map_err(|why| {
                    InputError::new(file, "replicas.credentials_file", why)
                        .valid("a readable file holding `token: …`, or `user: …` and `password: …`")
                })?
            }
        };
        Ok(ReplicaSettings {
            server: bus_address(&self.address).unwrap_or_default(),
            subject: self.subject.clone(),
            name: self.name.clone().unwrap_or_else(host_name),
            credentials,
            heartbeat: Duration::from_secs_f64(self.heartbeat_s),
            peer_timeout: Duration::from_secs_f64(self.peer_timeout_s),
            publish_queue: self.publish_queue as usize,
            spread: Duration::from_secs_f64(self.spread_s),
        })
    }
}

/// `nats://host[:port]` → `host:port`, or why not.
fn bus_address(address: &str) -> Result<String, String> {
    let Some(rest) = address.strip_prefix("nats://") else {
        return Err(if address.contains("://") {
            format!("`{address}` is not a nats:// address (TLS and WebSocket are not built in)")
        } else {
            format!("`{address}` has no nats:// scheme")
        });
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        // The address is logged and shown: a password in it would leak.
        return Err("holds user information; put credentials in credentials_file".into());
    }
    if rest.contains(['/', '?', '#', ',']) || rest.chars().any(char::is_whitespace) {
        return Err(format!("`{address}` is not one host[:port]"));
    }
    let (host, port) = match rest.rsplit_once(':') {
        // A bracketed IPv6 literal without a port has `:` inside the brackets only.
        Some((h, p)) if !p.contains(']') => (h, p.parse::<u16>().ok().filter(|&p| p > 0)),
        _ => (rest, Some(4222)),
    };
    match port {
        Some(port) if !host.is_empty() => Ok(format!("{host}:{port}")),
        Some(_) => Err(format!("`{address}` has no host")),
        None => Err(format!("`{address}` has no port from 1 to 65535")),
    }
}

/// A NATS subject prefix we may publish under.
fn check_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() || subject.len() > MAX_SUBJECT {
        return Err(format!("must be 1 to {MAX_SUBJECT} bytes"));
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Err(format!("`{subject}` has an empty token"));
        }
        if token
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '*' || c == '>')
        {
            return Err(format!(
                "`{subject}` holds a space, a control character or a wildcard"
            ));
        }
    }
    Ok(())
}

/// A replica name: the last token of the subjects it publishes on.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_REPLICA_NAME {
        return Err(format!("must be 1 to {MAX_REPLICA_NAME} bytes"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "`{}` holds a character other than A-Z, a-z, 0-9, `_`, `-`",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// This host's name as a replica name (a pod's name in Kubernetes).
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String = raw
        .trim()
        .chars()
        .take(MAX_REPLICA_NAME)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "gateway".into()
    } else {
        name
    }
}

/// The credentials file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredentials {
    token: Option<Secret>,
    user: Option<String>,
    password: Option<Secret>,
}

/// Read a credentials file; the error names the file and, for a parse error, the line, and
/// never quotes what the file holds.
fn read_credentials(path: &Path) -> Result<Credentials, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    if !meta.is_file() || meta.len() > MAX_CREDENTIALS_BYTES {
        return Err(format!(
            "`{shown}` is not a file of at most {MAX_CREDENTIALS_BYTES} bytes"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    let raw: RawCredentials = routelab_policies::located::parse_yaml(&text, &shown.to_string())
        .map_err(|e| {
            // The parser's message and snippet may quote a secret: keep only where.
            let at = e.line.map(|l| format!(" at line {l}")).unwrap_or_default();
            let field = if e.field.is_empty() {
                String::new()
            } else {
                format!(" (field `{}`)", e.field)
            };
            format!("`{shown}` is not a credentials file{at}{field}")
        })?;
    let nonempty = |s: &Secret| !s.expose().trim().is_empty();
    match raw {
        RawCredentials {
            token: Some(t),
            user: None,
            password: None,
        } if nonempty(&t) => Ok(Credentials::Token(t)),
        RawCredentials {
            token: None,
            user: Some(u),
            password: Some(p),
        } if !u.trim().is_empty() && nonempty(&p) => Ok(Credentials::UserPassword {
            user: u,
            password: p,
        }),
        _ => Err(format!(
            "`{shown}` must hold either a non-empty `token`, or a non-empty `user` and `password`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(yaml: &str) -> ReplicasConfig {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn addresses_are_nats_host_port_without_user_information() {
        assert_eq!(
            bus_address("nats://127.0.0.1:4222").unwrap(),
            "127.0.0.1:4222"
        );
        assert_eq!(bus_address("nats://bus").unwrap(), "bus:4222");
        assert_eq!(bus_address("nats://[::1]:5000/").unwrap(), "[::1]:5000");
        assert_eq!(bus_address("nats://[::1]").unwrap(), "[::1]:4222");
        for bad in [
            "127.0.0.1:4222",
            "tls://h:1",
            "nats://u:p@h:1",
            "nats://h:0",
            "nats://h:99999",
            "nats://h:x",
            "nats://:4222",
            "nats://a:1,nats://b:2",
            "nats://h:1/path",
        ] {
            assert!(bus_address(bad).is_err(), "{bad}");
        }
        let e = bus_address("nats://me:hunter2@h:1").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn subjects_and_names_are_checked() {
        assert!(check_subject("routelab.replicas").is_ok());
        for bad in ["", "a..b", "a.*", "a.>", "a b", ".a", "a."] {
            assert!(check_subject(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("gw-a_1").is_ok());
        for bad in ["", "a.b", "a b", "é", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let h = host_name();
        assert!(check_name(&h).is_ok(), "{h}");
    }

    #[test]
    fn the_block_has_its_defaults_and_located_errors() {
        let c = block("{}");
        c.validate("g.yaml").unwrap();
        let s = c.settings("g.yaml", Path::new(".")).unwrap();
        assert_eq!(s.server, "127.0.0.1:4222");
        assert_eq!(s.subject, "routelab.replicas");
        assert_eq!(s.credentials, Credentials::None);
        assert_eq!(s.heartbeat, Duration::from_secs(1));
        assert_eq!(s.publish_queue, 8192);
        assert_eq!(
            s.spread,
            Duration::from_millis(10),
            "the simulator's default"
        );
        for (yaml, field) in [
            ("spread_s: -0.001", "replicas.spread_s"),
            ("spread_s: 2", "replicas.spread_s"),
            ("spread_s: .nan", "replicas.spread_s"),
            ("address: http://h:1", "replicas.address"),
            ("subject: \"a.*\"", "replicas.subject"),
            ("name: \"a.b\"", "replicas.name"),
            ("heartbeat_s: 0", "replicas.heartbeat_s"),
            ("peer_timeout_s: .nan", "replicas.peer_timeout_s"),
            (
                "{heartbeat_s: 2, peer_timeout_s: 3}",
                "replicas.peer_timeout_s",
            ),
            ("publish_queue: 0", "replicas.publish_queue"),
        ] {
            let e = block(yaml).validate("g.yaml").unwrap_err();
            assert_eq!(e.field, field, "{yaml}: {e}");
            assert!(e.valid.is_some() || e.message.contains("expected"), "{e}");
        }
    }

    #[test]
    fn credentials_files_are_read_and_never_quoted() {
        let dir = std::env::temp_dir().join(format!("routelab-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).unwrap();
            ReplicasConfig {
                credentials_file: Some(name.into()),
                ..block("{}")
            }
        };
        let c = write("token", "token: hunter2-token\n");
        let s = c.settings("g.yaml", &dir).unwrap();
        assert_eq!(
            s.credentials,
            Credentials::Token(Secret::new("hunter2-token"))
        );
        assert!(!format!("{s:?}").contains("hunter2"));
        let c = write("user", "user: gw\npassword: \"hunter2 pw\"\n");
        assert_eq!(
            c.settings("g.yaml", &dir).unwrap().credentials,
            Credentials::UserPassword {
                user: "gw".into(),
                password: Secret::new("hunter2 pw")
            }
        );
        for (name, text, says) in [
            (
                "both",
                "token: hunter2-a\nuser: u\npassword: hunter2-b\n",
                "either",
            ),
            ("nopass", "user: u\n", "either"),
            ("empty", "token: \"\"\n", "either"),
            ("typo", "tokn: hunter2-typo\n", "line 1"),
            (
                "garbage",
                "token: [hunter2-list\n",
                "not a credentials file",
            ),
        ] {
            let e = write(name, text).settings("g.yaml", &dir).unwrap_err();
            let shown = format!("{e} {e:?}");
            assert_eq!(e.field, "replicas.credentials_file", "{shown}");
            assert!(shown.contains(says), "{name}: {shown}");
            assert!(!shown.contains("hunter2"), "{name}: {shown}");
        }
        let missing = ReplicasConfig {
            credentials_file: Some("missing".into()),
            ..block("{}")
        };
        let e = missing.settings("g.yaml", &dir).unwrap_err();
        assert!(e.message.contains("cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
