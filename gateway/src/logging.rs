//! The gateway's one log format: structured lines on stderr (`ts=… event=… key=value`,
//! logfmt), with every registered secret replaced by `<redacted>` whatever a caller passes.
//! At the bottom of the floor plan: every part of the gateway logs, and this imports nothing
//! of the gateway's but the redaction marker.

use std::sync::RwLock;

/// What replaces a secret in every message the gateway prints.
pub const REDACTED: &str = "<redacted>";

/// Secrets (the admin token) of every gateway started in this process: [`log`] never prints
/// them, whatever a caller passes.
static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Never print `secret` in a log line.
pub(crate) fn register_secret(secret: &str) {
    if secret.is_empty() {
        return;
    }
    let mut secrets = SECRETS.write().unwrap_or_else(|p| p.into_inner());
    if !secrets.iter().any(|s| s == secret) {
        secrets.push(secret.to_string());
    }
}

/// Write one structured log line to stderr: `ts=<unix s> event=<event> key=value ...`
/// (logfmt; values with spaces or quotes are quoted). Registered secrets are replaced by
/// `<redacted>`.
pub fn log(event: &str, fields: &[(&str, &str)]) {
    eprintln!("{}", log_line(event, fields));
}

fn log_line(event: &str, fields: &[(&str, &str)]) -> String {
    use std::fmt::Write as _;
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut line = format!("ts={ts:.3} event={event}");
    for (k, v) in fields {
        if v.is_empty() {
            continue;
        }
        if v.contains(|c: char| c.is_whitespace() || c == '"' || c == '=') {
            let _ = write!(line, " {k}={v:?}");
        } else {
            let _ = write!(line, " {k}={v}");
        }
    }
    let secrets = SECRETS.read().unwrap_or_else(|p| p.into_inner());
    for secret in secrets.iter() {
        if line.contains(secret.as_str()) {
            line = line.replace(secret.as_str(), REDACTED);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_never_show_a_registered_secret() {
        register_secret("s3cr3t-for-the-log-test");
        let line = log_line(
            "auth_failed",
            &[
                ("header", "Bearer s3cr3t-for-the-log-test"),
                ("peer", "127.0.0.1:9"),
            ],
        );
        assert!(!line.contains("s3cr3t"), "{line}");
        assert!(line.contains("<redacted>"), "{line}");
        assert!(line.contains("peer=127.0.0.1:9"), "{line}");
    }
}
