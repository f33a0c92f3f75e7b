//! A request's session: the key that says which requests continue one conversation, hashed for
//! the router ([`routelab_policies::RouteRequest::session`]), as the simulator knows the
//! session of each request it generates or replays.
//!
//! The key comes from the first source of the configuration's `sessions.sources` that has
//! one: a header the client sets (`sessions.header`, e.g. `x-session-id`), the OpenAI `user`
//! field of the body, or the prompt's prefix hash chain (the chain key of its first
//! `sessions.prefix_blocks` blocks: every later turn of a conversation starts with the same
//! blocks, but so does every conversation behind one long shared system prompt). A key that is
//! given but empty or longer than `sessions.max_key_bytes` is refused with a 400 naming the
//! header or field: a client that sends a session key means it, and a key silently dropped
//! would route its conversation as if it had none.

use routelab_policies::InputError;
use routelab_policies::located::rule;
use routelab_policies::streams::fnv1a;
use serde::Deserialize;

/// The default `sessions.max_key_bytes`: a UUID, an e-mail or a user id fit many times over.
pub const DEFAULT_MAX_KEY_BYTES: u64 = 256;
/// Largest `sessions.max_key_bytes`.
pub const MAX_KEY_BYTES: u64 = 4096;
/// The default `sessions.prefix_blocks`: 2 blocks (1,024 tokens at the router's 512-token
/// blocks) cover a system prompt and the start of the first message.
pub const DEFAULT_PREFIX_BLOCKS: u64 = 2;
/// Largest `sessions.prefix_blocks`.
pub const MAX_PREFIX_BLOCKS: u64 = 1024;

/// Where a session key may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionSource {
    /// The header named by `sessions.header`.
    Header,
    /// The OpenAI `user` field of the body.
    User,
    /// The prompt's prefix hash chain.
    Prefix,
}

impl SessionSource {
    const NAMES: &'static str = "header, user, prefix";
}

/// The `sessions` block.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// The sources in the order tried. Default: `[header, user, prefix]` when a header is
    /// named, else `[user, prefix]`; `[]` turns sessions off.
    pub sources: Option<Vec<SessionSource>>,
    /// The header carrying the session key (none: the `header` source is not available).
    pub header: Option<String>,
    /// Longest key accepted, bytes (a longer one is a 400).
    pub max_key_bytes: f64,
    /// Prefix blocks whose chain key is the `prefix` source's key.
    pub prefix_blocks: f64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            sources: None,
            header: None,
            max_key_bytes: DEFAULT_MAX_KEY_BYTES as f64,
            prefix_blocks: DEFAULT_PREFIX_BLOCKS as f64,
        }
    }
}

/// The validated `sessions` block, as the request path reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sessions {
    sources: Vec<SessionSource>,
    header: Option<axum::http::HeaderName>,
    max_key_bytes: usize,
    prefix_blocks: usize,
}

/// A session key the gateway refuses (a 400 for the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} must be a non-empty session key of at most {max} bytes (got {got} bytes)")]
pub struct BadSessionKey {
    /// The header or field (`header x-session-id`, `user`).
    pub what: String,
    /// The parameter to name in the answer (`user` for the body field).
    pub param: Option<&'static str>,
    /// Its length.
    pub got: usize,
    /// The cap.
    pub max: usize,
}

impl SessionsConfig {
    /// Validate (`file` names the configuration in errors).
    pub fn validate(&self, file: &str) -> Result<Sessions, InputError> {
        let whole = |field: &str, x: f64, max: u64| {
            rule::whole(x, 1, max)
                .map(|n| n as usize)
                .map_err(|e| e.at_field(file, field))
        };
        let max_key_bytes = whole("sessions.max_key_bytes", self.max_key_bytes, MAX_KEY_BYTES)?;
        let prefix_blocks = whole(
            "sessions.prefix_blocks",
            self.prefix_blocks,
            MAX_PREFIX_BLOCKS,
        )?;
        let header = match &self.header {
            None => None,
            Some(h) => Some(
                axum::http::HeaderName::from_bytes(h.as_bytes())
                    .ok()
                    .filter(|_| !h.is_empty())
                    .ok_or_else(|| {
                        InputError::new(
                            file,
                            "sessions.header",
                            format!("`{h}` is not an HTTP header name"),
                        )
                        .valid("a header name such as x-session-id (letters, digits, - and _)")
                    })?,
            ),
        };
        let sources = match &self.sources {
            Some(s) => s.clone(),
            None if header.is_some() => vec![
                SessionSource::Header,
                SessionSource::User,
                SessionSource::Prefix,
            ],
            None => vec![SessionSource::User, SessionSource::Prefix],
        };
        for (i, s) in sources.iter().enumerate() {
            if sources[..i].contains(s) {
                return Err(InputError::new(
                    file,
                    format!("sessions.sources[{i}]"),
                    format!("`{s:?}` is listed twice").to_lowercase(),
                )
                .valid(format!("each of {} at most once", SessionSource::NAMES)));
            }
            if *s == SessionSource::Header && header.is_none() {
                return Err(InputError::new(
                    file,
                    format!("sessions.sources[{i}]"),
                    "`header` is listed but no `sessions.header` names the header",
                )
                .valid("a `sessions.header: x-session-id` beside it, or no `header` source"));
            }
        }
        Ok(Sessions {
            sources,
            header,
            max_key_bytes,
            prefix_blocks,
        })
    }
}

impl Default for Sessions {
    fn default() -> Self {
        SessionsConfig::default()
            .validate("<default>")
            .expect("the defaults are valid")
    }
}

impl Sessions {
    /// The session of a request: the hash of the first key its sources give, `None` when none
    /// gives one. `user` is the body's `user` field as given (already checked to be a string),
    /// `prefix` the prompt's block chain keys.
    pub fn of(
        &self,
        headers: &axum::http::HeaderMap,
        user: Option<&str>,
        prefix: &[u64],
    ) -> Result<Option<u64>, BadSessionKey> {
        for source in &self.sources {
            let key = match source {
                SessionSource::Header => {
                    let name = self.header.as_ref().expect("validated: a header is named");
                    match headers.get(name) {
                        None => continue,
                        Some(v) => self.checked(v.as_bytes(), format!("header {name}"), None)?,
                    }
                }
                SessionSource::User => match user {
                    None => continue,
                    Some(u) => self.checked(u.as_bytes(), "user".into(), Some("user"))?,
                },
                SessionSource::Prefix => match prefix.get(self.prefix_blocks - 1) {
                    // A chain key already covers every block before it.
                    Some(&k) => return Ok(Some(k)),
                    None => continue,
                },
            };
            return Ok(Some(key));
        }
        Ok(None)
    }

    fn checked(
        &self,
        key: &[u8],
        what: String,
        param: Option<&'static str>,
    ) -> Result<u64, BadSessionKey> {
        if key.is_empty() || key.len() > self.max_key_bytes {
            return Err(BadSessionKey {
                what,
                param,
                got: key.len(),
                max: self.max_key_bytes,
            });
        }
        Ok(fnv1a(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(yaml: &str) -> Result<Sessions, InputError> {
        let cfg: SessionsConfig = routelab_policies::located::parse_yaml(yaml, "g.yaml").unwrap();
        cfg.validate("g.yaml")
    }

    #[test]
    fn the_first_source_with_a_key_wins() {
        let s = sessions("{ header: x-session-id }").unwrap();
        let mut h = axum::http::HeaderMap::new();
        let prefix = [11, 22, 33];
        // The prefix chain's second block when nothing else is given.
        assert_eq!(s.of(&h, None, &prefix), Ok(Some(22)));
        assert_eq!(s.of(&h, None, &prefix[..1]), Ok(None));
        let by_user = s.of(&h, Some("alice"), &prefix).unwrap();
        assert_eq!(by_user, Some(fnv1a(b"alice")));
        h.insert("x-session-id", "conv-7".parse().unwrap());
        assert_eq!(s.of(&h, Some("alice"), &prefix), Ok(Some(fnv1a(b"conv-7"))));
        // Sessions off.
        let off = sessions("{ sources: [] }").unwrap();
        assert_eq!(off.of(&h, Some("alice"), &prefix), Ok(None));
    }

    #[test]
    fn an_empty_or_huge_key_is_refused_by_name() {
        let s = sessions("{ header: x-session-id, max_key_bytes: 8 }").unwrap();
        let mut h = axum::http::HeaderMap::new();
        h.insert("x-session-id", "".parse().unwrap());
        let e = s.of(&h, None, &[]).unwrap_err();
        assert_eq!((e.got, e.max, e.param), (0, 8, None));
        assert!(e.to_string().contains("header x-session-id"), "{e}");
        h.insert("x-session-id", "123456789".parse().unwrap());
        assert_eq!(s.of(&h, None, &[]).unwrap_err().got, 9);
        let e = s
            .of(&axum::http::HeaderMap::new(), Some(""), &[])
            .unwrap_err();
        assert_eq!(e.param, Some("user"));
    }

    #[test]
    fn bad_blocks_are_located() {
        for (yaml, field) in [
            ("{ max_key_bytes: 0 }", "sessions.max_key_bytes"),
            ("{ max_key_bytes: 5000 }", "sessions.max_key_bytes"),
            ("{ prefix_blocks: 1.5 }", "sessions.prefix_blocks"),
            ("{ header: 'x session' }", "sessions.header"),
            ("{ header: '' }", "sessions.header"),
            ("{ sources: [header] }", "sessions.sources[0]"),
            ("{ sources: [user, user] }", "sessions.sources[1]"),
        ] {
            let e = sessions(yaml).unwrap_err();
            assert_eq!(e.field, field, "{yaml}: {e}");
        }
    }
}
