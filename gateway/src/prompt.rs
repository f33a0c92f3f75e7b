//! Just enough of an OpenAI request body to route it.
//!
//! - **Prompt rendering**: chat messages are concatenated as `<|role|>\n{content}\n` (text parts
//!   of array contents joined by newlines, other parts ignored); a completion's `prompt` string
//!   (or array of strings, joined by newlines) is used as is.
//! - **Token estimate**: `ceil(bytes / 4)` of the rendered prompt (≈4 bytes per token for
//!   English with BPE tokenizers). A completion prompt given as token ids counts them exactly.
//!   The router's context filter uses `prompt tokens + max_tokens` (when given), the same check
//!   an engine makes.
//! - **What is refused** (400), so that the gateway and an engine agree before a worker is
//!   chosen: a body that is not a JSON object, an empty `messages`, `max_tokens` (or
//!   `max_completion_tokens`) below 1 (vLLM's rule), and `n` other than 1 (the gateway routes
//!   one generation per request and accounts for one output). The emulator parses requests
//!   with this module, so it refuses the same.
//! - **Prefix affinity**: the rendered prompt is cut into blocks of [`BLOCK_BYTES`] (≈512
//!   tokens) and chain-hashed (hash `i` covers blocks `0..=i`, FNV-1a 64); a trailing partial
//!   block is not hashed, since the next turn of a conversation changes it. At most
//!   [`MAX_BLOCKS`] hashes per request.

use serde::Deserialize;
use serde_json::Value;

/// Bytes of rendered prompt per estimated token.
pub const BYTES_PER_TOKEN: usize = 4;
/// Bytes per prefix block: the router's block of tokens at [`BYTES_PER_TOKEN`].
pub const BLOCK_BYTES: usize = routelab_policies::PREFIX_BLOCK_TOKENS as usize * BYTES_PER_TOKEN;
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
    n: Option<Value>,
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
    // serde reads a struct from a JSON array too (fields by position): a six-element array
    // would pass as a request. A JSON text's first non-whitespace byte says what it is, so
    // anything not starting with `{` is refused before parsing.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(bad("the request body must be a JSON object", None));
    }
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
    let max_tokens = output_limit(b.max_tokens, "max_tokens")?;
    let max_completion_tokens = output_limit(b.max_completion_tokens, "max_completion_tokens")?;
    let max_tokens = max_tokens.or(max_completion_tokens);
    match b.n {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(n) => {
            return Err(bad(
                format!(
                    "`n` must be 1 (got {n}): the gateway routes one generation per request; send {n} requests instead"
                ),
                Some("n"),
            ));
        }
    }
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

/// An output-length limit (`max_tokens`, `max_completion_tokens`): absent, or a whole number
/// from 1 (an engine generates at least one token; vLLM refuses 0) to `u32::MAX`.
fn output_limit(v: Option<Value>, param: &'static str) -> Result<Option<u32>, BadRequest> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n >= 1)
            .map(Some)
            .ok_or_else(|| {
                bad(
                    format!(
                        "`{param}` must be a whole number from 1 to {} (got {v})",
                        u32::MAX
                    ),
                    Some(param),
                )
            }),
    }
}

/// `ceil(bytes / BYTES_PER_TOKEN)`, saturating.
pub fn estimate_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(BYTES_PER_TOKEN)).unwrap_or(u32::MAX)
}

fn render_messages(messages: Option<Value>) -> Result<String, BadRequest> {
    let Some(Value::Array(messages)) = messages else {
        return Err(bad("`messages` must be an array", Some("messages")));
    };
    if messages.is_empty() {
        // Nothing to answer: an engine would generate from an empty prompt until max_tokens.
        return Err(bad(
            "`messages` must contain at least one message",
            Some("messages"),
        ));
    }
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

    /// Regression (issue 13, defect 8): each of these passed and reached a worker.
    #[test]
    fn what_an_engine_would_refuse_is_refused_here() {
        // An array that serde would have read into the struct field by field.
        let e = parse(
            br#"["m",[{"content":"hi"}],null,4,null,false]"#,
            Endpoint::Chat,
        )
        .unwrap_err();
        assert!(e.message.contains("JSON object"), "{e:?}");
        assert!(parse(b"  \n 42", Endpoint::Chat).is_err());
        let e = parse(
            br#"{"model":"m","messages":[{"content":"hi"}],"max_tokens":0}"#,
            Endpoint::Chat,
        )
        .unwrap_err();
        assert_eq!(e.param, Some("max_tokens"));
        assert!(e.message.contains("from 1 to 4294967295"), "{e:?}");
        let e = parse(
            br#"{"model":"m","prompt":"x","max_completion_tokens":0}"#,
            Endpoint::Completions,
        )
        .unwrap_err();
        assert_eq!(e.param, Some("max_completion_tokens"));
        let e = parse(br#"{"model":"m","messages":[]}"#, Endpoint::Chat).unwrap_err();
        assert_eq!(e.param, Some("messages"));
        for n in ["2", "0", "\"1\"", "1.5"] {
            let body = format!(r#"{{"model":"m","prompt":"x","n":{n}}}"#);
            let e = parse(body.as_bytes(), Endpoint::Completions).unwrap_err();
            assert_eq!(e.param, Some("n"), "n = {n}");
        }
        for n in ["1", "null"] {
            let body = format!(r#"{{"model":"m","prompt":"x","n":{n},"max_tokens":1}}"#);
            let p = parse(body.as_bytes(), Endpoint::Completions).unwrap();
            assert_eq!(p.max_tokens, Some(1));
        }
        // Whitespace before the object is still JSON.
        assert!(
            parse(
                b" \r\n\t{\"model\":\"m\",\"prompt\":\"x\"}",
                Endpoint::Completions
            )
            .is_ok()
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
