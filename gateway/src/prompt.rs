//! Just enough of an OpenAI request body to route it.
//!
//! - **Prompt rendering**: chat messages are concatenated as `<|role|>\n{content}\n` (text parts
//!   of array contents joined by newlines, other parts ignored); a completion's `prompt` string
//!   (or array of strings, joined by newlines) is used as is.
//! - **Token estimate**: `ceil(bytes / 4)` of the rendered prompt (≈4 bytes per token for
//!   English with BPE tokenizers). A completion prompt given as token ids counts them exactly.
//!   The router's context filter uses `prompt tokens + max_tokens` (when given), the same check
//!   an engine makes.
//! - **Prefix affinity**: the rendered prompt is cut into blocks of [`BLOCK_BYTES`] (≈512
//!   tokens) and chain-hashed (hash `i` covers blocks `0..=i`, FNV-1a 64); a trailing partial
//!   block is not hashed, since the next turn of a conversation changes it. At most
//!   [`MAX_BLOCKS`] hashes per request.

use serde::Deserialize;
use serde_json::Value;

/// Bytes of rendered prompt per estimated token.
pub const BYTES_PER_TOKEN: usize = 4;
/// Bytes per prefix block (≈512 tokens at [`BYTES_PER_TOKEN`]).
pub const BLOCK_BYTES: usize = 2048;
/// Most prefix blocks hashed per request (1 MiB of prompt).
pub const MAX_BLOCKS: usize = 512;

/// Which OpenAI endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
}

impl Endpoint {
    /// Request path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

#[derive(Deserialize)]
struct Body {
    model: Option<Value>,
    messages: Option<Value>,
    prompt: Option<Value>,
    max_tokens: Option<Value>,
    max_completion_tokens: Option<Value>,
    stream: Option<Value>,
}

/// What routing needs from a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// Requested model.
    pub model: String,
    /// Rendered prompt.
    pub prompt: String,
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    /// `max_tokens` (or `max_completion_tokens`), if given.
    pub max_tokens: Option<u32>,
    /// `stream: true`.
    pub stream: bool,
}

/// A request the gateway refuses with 400 (message for the client, offending parameter).
#[derive(Debug, Clone, PartialEq)]
pub struct BadRequest {
    /// What is wrong.
    pub message: String,
    /// The parameter, if one.
    pub param: Option<&'static str>,
}

fn bad(message: impl Into<String>, param: Option<&'static str>) -> BadRequest {
    BadRequest {
        message: message.into(),
        param,
    }
}

/// Parse a request body for `endpoint`.
pub fn parse(body: &[u8], endpoint: Endpoint) -> Result<Parsed, BadRequest> {
    let b: Body = serde_json::from_slice(body).map_err(|e| {
        bad(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    })?;
    let model = match b.model {
        Some(Value::String(m)) if !m.is_empty() => m,
        Some(_) => return Err(bad("`model` must be a non-empty string", Some("model"))),
        None => return Err(bad("you must provide a `model` parameter", Some("model"))),
    };
    let (prompt, exact_tokens) = match endpoint {
        Endpoint::Chat => (render_messages(b.messages)?, None),
        Endpoint::Completions => render_prompt(b.prompt)?,
    };
    let max_tokens = match b.max_tokens.or(b.max_completion_tokens) {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    bad(
                        "`max_tokens` must be a whole number ≥ 0",
                        Some("max_tokens"),
                    )
                })?,
        ),
    };
    let stream = match b.stream {
        None | Some(Value::Null) => false,
        Some(Value::Bool(s)) => s,
        Some(_) => return Err(bad("`stream` must be a boolean", Some("stream"))),
    };
    let prompt_tokens = exact_tokens.unwrap_or_else(|| estimate_tokens(prompt.len()));
    Ok(Parsed {
        model,
        prompt,
        prompt_tokens,
        max_tokens,
        stream,
    })
}

/// `ceil(bytes / BYTES_PER_TOKEN)`, saturating.
pub fn estimate_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(BYTES_PER_TOKEN)).unwrap_or(u32::MAX)
}

fn render_messages(messages: Option<Value>) -> Result<String, BadRequest> {
    let Some(Value::Array(messages)) = messages else {
        return Err(bad("`messages` must be an array", Some("messages")));
    };
    let mut out = String::new();
    for m in &messages {
        let Value::Object(m) = m else {
            return Err(bad("each message must be an object", Some("messages")));
        };
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        match m.get("content") {
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Array(parts)) => {
                let mut first = true;
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        if !first {
                            out.push('\n');
                        }
                        out.push_str(t);
                        first = false;
                    }
                }
            }
            _ => {}
        }
        out.push('\n');
    }
    Ok(out)
}

fn render_prompt(prompt: Option<Value>) -> Result<(String, Option<u32>), BadRequest> {
    match prompt {
        Some(Value::String(s)) => Ok((s, None)),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => Ok((
            items
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n"),
            None,
        )),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
            // Token ids: exact count; hash their text for affinity.
            let text = items
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(",");
            Ok((text, Some(u32::try_from(items.len()).unwrap_or(u32::MAX))))
        }
        Some(_) => Err(bad(
            "`prompt` must be a string, an array of strings or an array of token ids",
            Some("prompt"),
        )),
        None => Err(bad("you must provide a `prompt` parameter", Some("prompt"))),
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x100_0000_01b3;

/// Chain hashes of the prompt's full [`BLOCK_BYTES`] blocks (at most [`MAX_BLOCKS`]).
pub fn prefix_hashes(prompt: &[u8]) -> Vec<u64> {
    let mut out = Vec::with_capacity((prompt.len() / BLOCK_BYTES).min(MAX_BLOCKS));
    let mut h = FNV_OFFSET;
    for block in prompt.chunks_exact(BLOCK_BYTES).take(MAX_BLOCKS) {
        for &b in block {
            h = (h ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
        out.push(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_rendering_and_estimate() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url"}]}],
            "max_tokens":7,"stream":true}"#;
        let p = parse(body, Endpoint::Chat).unwrap();
        assert_eq!(p.prompt, "<|system|>\nbe brief\n<|user|>\nhi\n");
        assert_eq!(p.prompt_tokens, estimate_tokens(p.prompt.len()));
        assert_eq!((p.max_tokens, p.stream), (Some(7), true));
    }

    #[test]
    fn completions_prompt_forms() {
        let p = parse(
            br#"{"model":"m","prompt":"abcdefgh"}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!((p.prompt_tokens, p.stream), (2, false));
        let p = parse(br#"{"model":"m","prompt":[1,2,3]}"#, Endpoint::Completions).unwrap();
        assert_eq!(p.prompt_tokens, 3);
        assert!(parse(br#"{"model":"m"}"#, Endpoint::Completions).is_err());
    }

    #[test]
    fn bad_bodies() {
        assert!(parse(b"{not json", Endpoint::Chat).is_err());
        assert_eq!(
            parse(br#"{"messages":[]}"#, Endpoint::Chat)
                .unwrap_err()
                .param,
            Some("model")
        );
        assert!(parse(br#"{"model":"m","messages":"x"}"#, Endpoint::Chat).is_err());
        assert!(
            parse(
                br#"{"model":"m","messages":[],"max_tokens":-1}"#,
                Endpoint::Chat
            )
            .is_err()
        );
    }

    #[test]
    fn prefix_chain() {
        let a = vec![b'a'; BLOCK_BYTES * 2 + 10];
        let mut b = a.clone();
        b[BLOCK_BYTES + 5] = b'b';
        let (ha, hb) = (prefix_hashes(&a), prefix_hashes(&b));
        assert_eq!(ha.len(), 2);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        assert!(prefix_hashes(&a[..BLOCK_BYTES - 1]).is_empty());
    }
}
