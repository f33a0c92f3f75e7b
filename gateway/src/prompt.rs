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
//!   chosen: a body that is not a JSON object, nested deeper than [`MAX_JSON_DEPTH`], an empty
//!   `messages`, `max_tokens` (or `max_completion_tokens`) below 1 (vLLM's rule), and `n` other
//!   than 1 (the gateway routes one generation per request and accounts for one output).
//!   Whole numbers may be written as floats (`5.0`, `1e3`), as the engines read them. The
//!   emulator parses requests with this module, so it refuses the same.
//! - **Output limit**: on the chat endpoint `max_completion_tokens` wins over `max_tokens` when
//!   both are sent, as in vLLM and SGLang; the completions endpoint reads `max_tokens` only.
//! - **Prefix affinity**: the rendered prompt is cut into blocks of [`BLOCK_BYTES`] (≈512
//!   tokens) and chain-hashed (hash `i` covers blocks `0..=i`, FNV-1a 64); a trailing partial
//!   block is not hashed, since the next turn of a conversation changes it. At most
//!   [`MAX_BLOCKS`] hashes per request.

use routelab_policies::streams::{FNV1A_OFFSET, fnv1a_extend};
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

    /// The body field that holds the prompt (what an error about the prompt names).
    pub fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
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
    user: Option<Value>,
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
    /// The output limit the engine will read (`max_completion_tokens`, else `max_tokens`, on
    /// the chat endpoint; `max_tokens` on the completions one), if given.
    pub max_tokens: Option<u32>,
    /// `stream: true`.
    pub stream: bool,
    /// The OpenAI `user` field (an end-user id), a session key ([`crate::session`]).
    pub user: Option<String>,
    /// What of `prompt` is not text an engine tokenizes (for a bound from its bytes).
    pub framing: Framing,
}

/// What of [`Parsed::prompt`] is not the text an engine tokenizes, so that a lower bound on its
/// tokens can be taken from the bytes of the rest ([`crate::tokens`]) before any count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Framing {
    /// All of it is (a completion's prompt, strings joined by newlines as the engine joins them).
    #[default]
    Bare,
    /// The gateway's own role markers around chat messages (`<|role|>\n` … `\n`): this many
    /// bytes, this many of them ASCII digits. An engine renders the messages with its own
    /// template instead, which prints every message's content.
    Markers {
        /// Bytes of the markers.
        bytes: usize,
        /// ASCII digits among them (a role may hold digits).
        digits: usize,
    },
    /// Token ids written out (`1,2,3`): no text at all.
    Ids,
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
    // serde skips a field it does not know without a depth limit: a 100,000-deep array in an
    // unknown field passed here and reached the engine's own parser.
    if let Some(depth) = too_deep(body) {
        return Err(bad(
            format!(
                "the request body nests arrays and objects {depth} levels deep; at most {MAX_JSON_DEPTH}"
            ),
            None,
        ));
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
    let (prompt, exact_tokens, framing) = match endpoint {
        Endpoint::Chat => {
            let (prompt, framing) = render_messages(b.messages)?;
            (prompt, None, framing)
        }
        Endpoint::Completions => {
            let (prompt, ids) = render_prompt(b.prompt)?;
            let framing = if ids.is_some() {
                Framing::Ids
            } else {
                Framing::Bare
            };
            (prompt, ids, framing)
        }
    };
    let max_tokens = output_limit(b.max_tokens, "max_tokens")?;
    let max_completion_tokens = output_limit(b.max_completion_tokens, "max_completion_tokens")?;
    // The engines' reading when both are sent: `max_completion_tokens` wins on the chat
    // endpoint (OpenAI deprecated `max_tokens` for it), and the completions endpoint has only
    // `max_tokens` (vLLM's `OpenAIServing._validate_input`, vllm/entrypoints/openai/engine/
    // serving.py: `request.max_completion_tokens or request.max_tokens` for chat,
    // `max_tokens` otherwise; SGLang's `ChatCompletionRequest.to_sampling_params`,
    // python/sglang/srt/entrypoints/openai/protocol.py: `max_new_tokens =
    // self.max_completion_tokens or self.max_tokens`, and its `CompletionRequest` has no
    // `max_completion_tokens`). The context filter must use the limit the engine will.
    let max_tokens = match endpoint {
        Endpoint::Chat => max_completion_tokens.or(max_tokens),
        Endpoint::Completions => max_tokens,
    };
    match b.n {
        None | Some(Value::Null) => {}
        Some(n) if whole_number(&n) == Some(1) => {}
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
    let user = match b.user {
        None | Some(Value::Null) => None,
        Some(Value::String(u)) => Some(u),
        Some(_) => return Err(bad("`user` must be a string", Some("user"))),
    };
    let prompt_tokens = exact_tokens.unwrap_or_else(|| estimate_tokens(prompt.len()));
    Ok(Parsed {
        user,
        model,
        prompt,
        prompt_tokens,
        max_tokens,
        stream,
        framing,
    })
}

/// A JSON number that is a whole number ≥ 0, written as an integer or as a float (`5.0`,
/// `1e3`), as the engines read their integer fields: vLLM's and SGLang's request models are
/// pydantic models in lax mode, whose `int` takes a float with no fractional part and refuses
/// one with a fraction (pydantic's conversion table). (Lax mode also takes numeric strings and
/// booleans; the gateway refuses those, which errs on the side of an answer the engine would
/// have given rather than a limit it would read differently.)
fn whole_number(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let x = v.as_f64()?;
    // Below 2^64 and integral: exact as a u64.
    (x >= 0.0 && x.fract() == 0.0 && x < 18_446_744_073_709_551_616.0).then_some(x as u64)
}

/// An output-length limit (`max_tokens`, `max_completion_tokens`): absent, or a whole number
/// ([`whole_number`]) from 1 (an engine generates at least one token; vLLM refuses 0) to
/// `u32::MAX`.
fn output_limit(v: Option<Value>, param: &'static str) -> Result<Option<u32>, BadRequest> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => whole_number(&v)
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

/// Deepest nesting of arrays and objects accepted in a request body: serde_json's own limit
/// for the values it builds, far above what a chat request needs.
pub const MAX_JSON_DEPTH: usize = 128;

/// The depth reached if `body` nests arrays and objects deeper than [`MAX_JSON_DEPTH`]. One pass
/// over the bytes, skipping strings (brackets in them do not count); the JSON itself is checked
/// by the parser afterwards.
fn too_deep(body: &[u8]) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Some(depth);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// `ceil(bytes / BYTES_PER_TOKEN)`, saturating.
pub fn estimate_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(BYTES_PER_TOKEN)).unwrap_or(u32::MAX)
}

fn render_messages(messages: Option<Value>) -> Result<(String, Framing), BadRequest> {
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
    let (mut marker_bytes, mut marker_digits) = (0, 0);
    for m in &messages {
        let Value::Object(m) = m else {
            return Err(bad("each message must be an object", Some("messages")));
        };
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        // `<|`, the role, `|>\n`, and the closing `\n`.
        marker_bytes += role.len() + 6;
        marker_digits += role.bytes().filter(u8::is_ascii_digit).count();
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
    Ok((
        out,
        Framing::Markers {
            bytes: marker_bytes,
            digits: marker_digits,
        },
    ))
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

/// Chain hashes of the prompt's full [`BLOCK_BYTES`] blocks (at most [`MAX_BLOCKS`]).
pub fn prefix_hashes(prompt: &[u8]) -> Vec<u64> {
    let mut out = Vec::with_capacity((prompt.len() / BLOCK_BYTES).min(MAX_BLOCKS));
    let mut h = FNV1A_OFFSET;
    for block in prompt.chunks_exact(BLOCK_BYTES).take(MAX_BLOCKS) {
        h = fnv1a_extend(h, block);
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

    /// Regression (issue 30, hardening 8): with both limits sent, `max_tokens` won, so a small
    /// `max_tokens` beside a large `max_completion_tokens` passed the context filter while the
    /// engine generated up to the large one; and whole-number floats were refused.
    #[test]
    fn the_engines_reading_of_the_output_limit() {
        let chat = |extra: &str| {
            parse(
                format!(r#"{{"model":"m","messages":[{{"content":"hi"}}]{extra}}}"#).as_bytes(),
                Endpoint::Chat,
            )
        };
        let p = chat(r#","max_tokens":4,"max_completion_tokens":9000"#).unwrap();
        assert_eq!(p.max_tokens, Some(9000));
        let p = chat(r#","max_completion_tokens":9000,"max_tokens":4"#).unwrap();
        assert_eq!(p.max_tokens, Some(9000));
        assert_eq!(chat(r#","max_tokens":4"#).unwrap().max_tokens, Some(4));
        // The completions endpoint has no `max_completion_tokens` in either engine.
        let p = parse(
            br#"{"model":"m","prompt":"x","max_tokens":4,"max_completion_tokens":9000}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(p.max_tokens, Some(4));
        for (given, read) in [("5.0", 5), ("1e3", 1000), ("1E+3", 1000), ("7", 7)] {
            let p = chat(&format!(r#","max_tokens":{given}"#)).unwrap();
            assert_eq!(p.max_tokens, Some(read), "{given}");
            let p = chat(&format!(r#","max_completion_tokens":{given},"n":1.0"#)).unwrap();
            assert_eq!(p.max_tokens, Some(read), "{given}");
        }
        for bad in ["5.5", "0.0", "-1.0", "1e10", "\"5\"", "true"] {
            let e = chat(&format!(r#","max_tokens":{bad}"#)).unwrap_err();
            assert_eq!(e.param, Some("max_tokens"), "{bad}");
        }
        assert_eq!(chat(r#","n":2.0"#).unwrap_err().param, Some("n"));
    }

    /// Regression (issue 30, hardening 10): a 100,000-deep array in a field the gateway does
    /// not read was forwarded to the engine.
    #[test]
    fn bodies_nested_too_deep_are_refused() {
        let deep = |n: usize| {
            format!(
                r#"{{"model":"m","messages":[{{"content":"hi"}}],"extra":{}{}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        let e = parse(deep(100_000).as_bytes(), Endpoint::Chat).unwrap_err();
        assert!(e.message.contains("at most 128"), "{e:?}");
        // The body's object is the first level.
        assert!(parse(deep(MAX_JSON_DEPTH - 1).as_bytes(), Endpoint::Chat).is_ok());
        assert!(parse(deep(MAX_JSON_DEPTH).as_bytes(), Endpoint::Chat).is_err());
        // Brackets inside strings do not count, escaped quotes included.
        let text = format!(
            r#"{{"model":"m","messages":[{{"content":"\"{}"}}]}}"#,
            "[".repeat(500)
        );
        assert!(parse(text.as_bytes(), Endpoint::Chat).is_ok());
    }
}
