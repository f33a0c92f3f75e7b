//! One worker's configuration (`workers[]`, and the admin API's body): its names checked for
//! what logs, metrics labels and the admin page would show wrongly, its base URL, its cache.

use crate::error::WorkerError;
use crate::upstream::ApiKey;
use routelab_policies::located::rule;
use routelab_policies::{MAX_CACHE_BLOCKS, PREFIX_BLOCK_TOKENS, WorkerSpec};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// One worker.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Unique name.
    #[serde(deserialize_with = "checked_text")]
    pub name: String,
    /// Server root, e.g. `http://10.0.0.5:8000`; request paths (`/v1/chat/completions`) are
    /// appended to it.
    #[serde(deserialize_with = "checked_base_url")]
    pub base_url: String,
    /// The machine; probe cache and pins are keyed on (node, model). Default: the name.
    #[serde(default, deserialize_with = "checked_optional_text")]
    pub node: Option<String>,
    /// The model it serves.
    #[serde(deserialize_with = "checked_text")]
    pub model: String,
    /// One entry per GPU.
    #[serde(default)]
    pub gpu_names: Vec<String>,
    /// Largest context (prompt + max_tokens) the engine accepts, in tokens.
    pub context_window: u32,
    /// Engine launch arguments (a change is a new machine for the probe cache).
    #[serde(default)]
    pub launch_args: String,
    /// The engine's KV cache size in tokens, from its launch arguments or its start-up log
    /// (vLLM logs "GPU KV cache size: N tokens"). The policy's `approximate` prefix knowledge
    /// (the default) then believes the worker holds at most that many tokens of prompt
    /// prefixes; without it the worker shares the router's fleet-wide bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_tokens: Option<CacheTokens>,
    /// The engine's KV event stream (vLLM's ZeroMQ publisher), for `prefix_knowledge:
    /// kv-events` ([`crate::kv`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<crate::kv::KvEventsConfig>,
    /// A file holding the engine's API key (vLLM's and SGLang's `--api-key`), relative to the
    /// configuration file: sent as `Authorization: Bearer <key>` on every call to the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<PathBuf>,
    /// The key that file holds, once read ([`WorkerConfig::read_api_key`]); never written out.
    #[serde(skip)]
    pub api_key: Option<ApiKey>,
}

/// Largest API key file read: far above any real key (vLLM's are tens of bytes).
pub const MAX_API_KEY_BYTES: u64 = 4096;

/// Shortest key registered for redaction ([`crate::logging`]).
const MIN_REDACTED_KEY_CHARS: usize = 8;

/// The key in an API key file: one line (a final line break allowed), not empty, at most
/// [`MAX_API_KEY_BYTES`], visible ASCII. The error names the file and never quotes it.
fn read_api_key_file(path: &Path) -> Result<ApiKey, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    if !meta.is_file() {
        return Err(format!("`{shown}` is not a file"));
    }
    if meta.len() > MAX_API_KEY_BYTES {
        return Err(format!(
            "`{shown}` is {} bytes long, more than a key (at most {MAX_API_KEY_BYTES})",
            meta.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("`{shown}` is not UTF-8 text"))?;
    let key = text
        .strip_suffix('\n')
        .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if key.trim().is_empty() {
        return Err(format!("`{shown}` is empty"));
    }
    if key.contains(['\n', '\r']) {
        return Err(format!(
            "`{shown}` holds more than one line (line 2 is not part of a key)"
        ));
    }
    let api_key = ApiKey::bearer(key).map_err(|why| format!("the key in `{shown}` {why}"))?;
    // No log line carries it; should one ever quote it, redaction hides it. A key of a few
    // characters is left out: redaction would rewrite every line containing them.
    if key.len() >= MIN_REDACTED_KEY_CHARS {
        crate::logging::register_secret(key);
    }
    Ok(api_key)
}

/// Most KV cache tokens a worker may announce: the policy crate's largest per-worker record,
/// [`MAX_CACHE_BLOCKS`] blocks of [`PREFIX_BLOCK_TOKENS`] (about 2.1 billion tokens).
pub const MAX_CACHE_TOKENS: u64 = MAX_CACHE_BLOCKS as u64 * PREFIX_BLOCK_TOKENS as u64;

/// An engine's KV cache size in tokens, checked as it is read (whole, at least one prefix block
/// of [`PREFIX_BLOCK_TOKENS`], at most [`MAX_CACHE_TOKENS`]), so the file and the admin API
/// refuse a bad one alike, at its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct CacheTokens(u64);

impl CacheTokens {
    /// A size within the rule.
    pub fn new(tokens: f64) -> Result<CacheTokens, rule::Violation> {
        rule::whole(tokens, u64::from(PREFIX_BLOCK_TOKENS), MAX_CACHE_TOKENS).map(CacheTokens)
    }

    /// The tokens.
    pub fn tokens(self) -> u64 {
        self.0
    }

    /// Whole prefix blocks that fit.
    pub fn blocks(self) -> u32 {
        u32::try_from(self.0 / u64::from(PREFIX_BLOCK_TOKENS)).unwrap_or(u32::MAX)
    }
}

impl<'de> Deserialize<'de> for CacheTokens {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Read as a number so a fraction or a negative gets the rule's words, not serde's.
        let x = f64::deserialize(d)?;
        CacheTokens::new(x).map_err(serde::de::Error::custom)
    }
}

/// Longest worker name, node or model, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Why a name, node or model cannot be shown as it is (in log lines, metric labels, the admin
/// page): a control character (a line break forges a log line) or a bidirectional formatting
/// character (it reorders what a reader sees: `U+202E` turns `a-evil` around), or too long.
/// The reason says what would be valid.
pub(crate) fn text_problem(text: &str) -> Option<String> {
    const VALID: &str =
        "valid: printable text without control or bidirectional-formatting characters";
    let bidi = |c: char| matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    if let Some(c) = text.chars().find(|&c| c.is_control() || bidi(c)) {
        let kind = if c.is_control() {
            "a control character"
        } else {
            "a bidirectional-formatting character"
        };
        return Some(format!("contains {kind} (U+{:04X}); {VALID}", u32::from(c)));
    }
    // A name is a path segment of the admin API (`/admin/workers/{name}`), and clients and
    // proxies resolve `.` and `..` segments away: such a worker could not be reached there.
    if text == "." || text == ".." {
        return Some(format!(
            "`{text}` cannot be a path segment of /admin/workers/{{name}}; valid: any other printable text"
        ));
    }
    (text.len() > MAX_NAME_BYTES)
        .then(|| format!("is {} bytes long; at most {MAX_NAME_BYTES}", text.len()))
}

// The worker fields are checked as they are read, so that the file and the admin API refuse a
// bad one alike, the file at its line ([`WorkerConfig::validate`] applies the same rules to a
// configuration built in code).
fn checked_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let text = String::deserialize(d)?;
    match text_problem(&text) {
        Some(reason) => Err(serde::de::Error::custom(reason)),
        None => Ok(text),
    }
}

fn checked_optional_text<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(text) => match text_problem(&text) {
            Some(reason) => Err(serde::de::Error::custom(reason)),
            None => Ok(Some(text)),
        },
        None => Ok(None),
    }
}

fn checked_base_url<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let url = String::deserialize(d)?;
    crate::upstream::BaseUrl::parse(&url).map_err(serde::de::Error::custom)?;
    Ok(url)
}

impl WorkerConfig {
    /// Check the fields a router cannot.
    pub fn validate(&self) -> Result<(), WorkerError> {
        let name = || self.name.clone();
        if self.name.trim().is_empty() {
            return Err(WorkerError::EmptyName);
        }
        for (field, text) in [
            ("name", Some(&self.name)),
            ("node", self.node.as_ref()),
            ("model", Some(&self.model)),
        ] {
            if let Some(reason) = text.and_then(|t| text_problem(t)) {
                return Err(WorkerError::Text {
                    name: name(),
                    field,
                    reason,
                });
            }
        }
        if self.model.trim().is_empty() {
            return Err(WorkerError::EmptyModel { name: name() });
        }
        if self.context_window == 0 {
            return Err(WorkerError::ZeroContextWindow { name: name() });
        }
        crate::upstream::BaseUrl::parse(&self.base_url).map_err(|error| WorkerError::BaseUrl {
            name: name(),
            error,
        })?;
        if self.api_key_file.is_some() != self.api_key.is_some() {
            return Err(WorkerError::ApiKey {
                name: name(),
                reason: "was not read (WorkerConfig::read_api_key)".into(),
            });
        }
        if let Some(kv) = &self.kv_events {
            kv.validate().map_err(|error| WorkerError::KvEvents {
                name: name(),
                error,
            })?;
        }
        Ok(())
    }

    /// Read the worker's `api_key_file` (relative to `base`, the configuration's directory),
    /// if it names one and it was not read yet. The error names the file, never its content.
    pub fn read_api_key(&mut self, base: &Path) -> Result<(), WorkerError> {
        let Some(file) = &self.api_key_file else {
            return Ok(());
        };
        if self.api_key.is_some() {
            return Ok(());
        }
        let path = if file.is_absolute() {
            file.clone()
        } else {
            base.join(file)
        };
        let key = read_api_key_file(&path).map_err(|reason| WorkerError::ApiKey {
            name: self.name.clone(),
            reason,
        })?;
        self.api_key = Some(key);
        Ok(())
    }

    /// The policy crate's view of the worker.
    pub fn spec(&self) -> WorkerSpec {
        WorkerSpec {
            name: self.name.clone(),
            node: self.node.clone().unwrap_or_else(|| self.name.clone()),
            model: self.model.clone(),
            gpu_names: self.gpu_names.clone(),
            context_window: self.context_window,
            launch_args: self.launch_args.clone(),
            cache_blocks: self.cache_tokens.map(CacheTokens::blocks),
        }
    }
}
