//! The configuration's secrets (`admin_token`): a type that never prints its value, and the
//! redaction of every error message about a configuration's text.

use routelab_policies::InputError;
use serde::Deserialize;

/// A secret from the configuration (`admin_token`): read as a plain string, never shown by
/// `Debug`, so printing a configuration or the settings with `{:?}` cannot leak it.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that must compare or register it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Secret {
        Secret::new(value)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

pub use crate::logging::REDACTED;
/// The configuration keys whose values are secrets.
const SECRET_KEYS: [&str; 1] = ["admin_token"];

/// The values given to secret keys in YAML `text`, as well as a scanner can tell without
/// parsing (the text may be the invalid document an error is about): `key: value`,
/// `key: "value"`, `key: 'value'`, also inside a flow mapping.
fn secret_values(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for key in SECRET_KEYS {
        for (at, _) in text.match_indices(key) {
            let rest = text[at + key.len()..].trim_start_matches(['"', '\'']);
            let Some(rest) = rest.trim_start_matches([' ', '\t']).strip_prefix(':') else {
                continue;
            };
            let rest = rest.trim_start_matches([' ', '\t']);
            let value = match rest.chars().next() {
                Some(q @ ('"' | '\'')) => rest[1..].split(q).next().unwrap_or(""),
                _ => {
                    let line = rest.lines().next().unwrap_or("");
                    // A plain scalar ends at a comment or, in a flow mapping, at `,` or `}`.
                    let end = line
                        .find(" #")
                        .into_iter()
                        .chain(line.find([',', '}']))
                        .min()
                        .unwrap_or(line.len());
                    line[..end].trim()
                }
            };
            if !value.is_empty() && !found.iter().any(|v| v == value) {
                found.push(value.to_string());
            }
        }
    }
    // Longest first, so that a value containing another is replaced whole.
    found.sort_by_key(|v| std::cmp::Reverse(v.len()));
    found
}

/// `text` with every secret value replaced and the rest of every line naming a secret key
/// after its `:` hidden.
fn redact_text(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for secret in secrets {
        out = out.replace(secret.as_str(), REDACTED);
    }
    let lines: Vec<String> = out
        .split('\n')
        .map(|line| {
            let Some(at) = SECRET_KEYS
                .iter()
                .filter_map(|k| line.find(k).map(|i| i + k.len()))
                .min()
            else {
                return line.to_string();
            };
            match line[at..].find(':') {
                Some(colon) if !line[at + colon + 1..].trim().is_empty() => {
                    format!("{}: {REDACTED}", &line[..at + colon])
                }
                _ => line.to_string(),
            }
        })
        .collect();
    lines.join("\n")
}

/// An error about configuration `text` with its secrets redacted in the message, the field,
/// what would be valid and the parser's snippet (all printed).
pub(crate) fn redact_error(mut e: InputError, text: &str) -> InputError {
    let secrets = secret_values(text);
    e.message = redact_text(&e.message, &secrets);
    e.field = redact_text(&e.field, &secrets);
    e.valid = e.valid.map(|v| redact_text(&v, &secrets).into_boxed_str());
    e.snippet = e
        .snippet
        .map(|s| redact_text(&s, &secrets).into_boxed_str());
    e
}
