//! The OpenAI wire format the emulator speaks: request parsing and response rendering.
//!
//! Requests are read the way the gateway reads them ([`routelab_gateway::prompt::parse`]: the
//! same prompt rendering, the same `bytes / 4` token estimate, the same 2,048-byte prefix
//! blocks), so the emulator's engine sees the prompt the gateway routed on. Extensions:
//!
//! - `prompt_tokens` (integer): the prompt length in tokens, used instead of the estimate
//!   (load generators and tests that want an exact figure);
//! - `min_tokens`, `ignore_eos` (vLLM): accepted and checked (`min_tokens ≤ max_tokens`). The
//!   emulator has no end-of-sequence model, so it **always generates exactly `max_tokens`**
//!   tokens, with or without them (`finish_reason: "length"`).

use routelab_gateway::prompt::{self, Endpoint};
use serde_json::Value;

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GenRequest {
    pub model: String,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub stream: bool,
    pub include_usage: bool,
    /// Prefix block keys of the prompt (the engine's 512-token blocks): chain hashes of the
    /// token ids, or of the rendered prompt's 2,048-byte blocks without a tokenizer (the same
    /// keys the gateway computes, [`routelab_gateway::tokens`]).
    pub blocks: Vec<u64>,
    /// The prompt's token ids when asked for (to publish KV events): the tokenizer's, or the
    /// estimate's byte tokens.
    pub ids: Option<std::sync::Arc<[u32]>>,
}

/// A 400 with its message and parameter.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Invalid {
    pub message: String,
    pub param: Option<&'static str>,
}

fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Invalid {
    Invalid {
        message: message.into(),
        param,
    }
}

fn opt_u32(v: &Value, key: &'static str) -> Result<Option<u32>, Invalid> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| invalid(format!("`{key}` must be a whole number ≥ 0"), Some(key))),
    }
}

/// Parse a request body for `endpoint`; `default_max_tokens` applies when the body has none.
/// With a `tokenizer` the prompt is counted and keyed by its token ids, as the gateway does
/// with the same tokenizer; `want_ids` keeps the ids (for KV events).
pub(crate) fn parse(
    body: &[u8],
    endpoint: Endpoint,
    default_max_tokens: u32,
    tokenizer: Option<&routelab_gateway::tokens::ModelTokenizer>,
    want_ids: bool,
) -> Result<GenRequest, Invalid> {
    use routelab_gateway::tokens::{block_keys, byte_tokens};
    let p = prompt::parse(body, endpoint).map_err(|b| invalid(b.message, b.param))?;
    let (counted, blocks, ids) = match tokenizer {
        Some(t) => {
            let ids = t
                .ids(body, endpoint, &p)
                .map_err(|b| invalid(b.message, b.param))?;
            let n = u32::try_from(ids.len()).unwrap_or(u32::MAX);
            (n, block_keys(&ids), want_ids.then(|| ids.into()))
        }
        None => (
            p.prompt_tokens,
            prompt::prefix_hashes(p.prompt.as_bytes()),
            want_ids.then(|| byte_tokens(p.prompt.as_bytes()).into()),
        ),
    };
    let v: Value = serde_json::from_slice(body).map_err(|e| invalid(e.to_string(), None))?;
    let output = p.max_tokens.unwrap_or(default_max_tokens);
    if output == 0 {
        return Err(invalid(
            "`max_tokens` must be at least 1",
            Some("max_tokens"),
        ));
    }
    if let Some(min) = opt_u32(&v, "min_tokens")?
        && min > output
    {
        return Err(invalid(
            format!("`min_tokens` ({min}) must be at most `max_tokens` ({output})"),
            Some("min_tokens"),
        ));
    }
    if let Some(x) = v.get("ignore_eos")
        && !x.is_boolean()
        && !x.is_null()
    {
        return Err(invalid(
            "`ignore_eos` must be a boolean",
            Some("ignore_eos"),
        ));
    }
    let prompt_tokens = opt_u32(&v, "prompt_tokens")?.unwrap_or(counted);
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(GenRequest {
        model: p.model,
        prompt_tokens,
        output_tokens: output,
        stream: p.stream,
        include_usage,
        blocks,
        ids,
    })
}

/// The prompt's token ids as this emulator's engine counts them, for vLLM's `POST /tokenize`
/// and `POST /v1/{chat/,}completions/render`: a body with `messages` is read as a chat request,
/// one with `prompt` as a completion; `model` may be left out (vLLM's tokenize request makes it
/// optional) and is then `model`. The ids are the tokenizer's when the emulator has one, else
/// the estimate's byte tokens ([`routelab_gateway::tokens::byte_tokens`]): the very ids its KV
/// events announce, so a router that keys prefixes by them sees the engine's sharing.
pub(crate) fn prompt_ids(
    body: &[u8],
    model: &str,
    tokenizer: Option<&routelab_gateway::tokens::ModelTokenizer>,
) -> Result<Vec<u32>, Invalid> {
    use routelab_gateway::tokens::byte_tokens;
    let mut v: Value = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("the body is not JSON: {e}"), None))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(invalid("the request body must be a JSON object", None));
    };
    let endpoint = if obj.contains_key("messages") {
        Endpoint::Chat
    } else if obj.contains_key("prompt") {
        Endpoint::Completions
    } else {
        return Err(invalid(
            "give `prompt` (a string) or `messages` (a chat)",
            Some("prompt"),
        ));
    };
    obj.entry("model")
        .or_insert_with(|| Value::String(model.to_string()));
    let body = serde_json::to_vec(&v).map_err(|e| invalid(e.to_string(), None))?;
    let p = prompt::parse(&body, endpoint).map_err(|b| invalid(b.message, b.param))?;
    match tokenizer {
        Some(t) => t
            .ids(&body, endpoint, &p)
            .map_err(|b| invalid(b.message, b.param)),
        None => Ok(byte_tokens(p.prompt.as_bytes())),
    }
}

/// Token texts, [`prompt::BYTES_PER_TOKEN`] bytes each (so a client's bytes-per-token estimate
/// counts them right).
const WORDS: [&str; 8] = [
    " sea", " sun", " sky", " and", " the", " red", " low", " far",
];

/// The text of output token `i`.
pub(crate) fn token_text(i: u32) -> &'static str {
    WORDS[i as usize % WORDS.len()]
}

/// Renders the chunks of one response.
#[derive(Debug, Clone)]
pub(crate) struct Renderer {
    pub endpoint: Endpoint,
    pub id: String,
    /// The model name as a JSON string (quoted and escaped).
    pub model_json: String,
    pub created: u64,
}

impl Renderer {
    fn head(&self, object: &str) -> String {
        format!(
            r#"{{"id":"{}","object":"{object}","created":{},"model":{}"#,
            self.id, self.created, self.model_json
        )
    }

    fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        }
    }

    /// The first event of a chat stream (role, empty content); nothing for completions.
    pub fn push_role(&self, out: &mut String) {
        if self.endpoint == Endpoint::Chat {
            out.push_str("data: ");
            out.push_str(&self.head(self.chunk_object()));
            out.push_str(r#","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#);
            out.push_str("\n\n");
        }
    }

    /// One content event for token `i`.
    pub fn push_token(&self, out: &mut String, i: u32) {
        out.push_str("data: ");
        out.push_str(&self.head(self.chunk_object()));
        let t = token_text(i);
        match self.endpoint {
            Endpoint::Chat => {
                out.push_str(r#","choices":[{"index":0,"delta":{"content":""#);
                out.push_str(t);
                out.push_str(r#""},"logprobs":null,"finish_reason":null}]}"#);
            }
            Endpoint::Completions => {
                out.push_str(r#","choices":[{"index":0,"text":""#);
                out.push_str(t);
                out.push_str(r#"","logprobs":null,"finish_reason":null}]}"#);
            }
        }
        out.push_str("\n\n");
    }

    /// The final events: finish reason, usage (if asked), `[DONE]`.
    pub fn push_end(&self, out: &mut String, usage: Option<&Usage>) {
        out.push_str("data: ");
        out.push_str(&self.head(self.chunk_object()));
        match self.endpoint {
            Endpoint::Chat => out.push_str(
                r#","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}"#,
            ),
            Endpoint::Completions => out.push_str(
                r#","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}"#,
            ),
        }
        out.push_str("\n\n");
        if let Some(u) = usage {
            out.push_str("data: ");
            out.push_str(&self.head(self.chunk_object()));
            out.push_str(r#","choices":[],"usage":"#);
            out.push_str(&u.json());
            out.push_str("}\n\n");
        }
        out.push_str("data: [DONE]\n\n");
    }

    /// A whole non-streaming response.
    pub fn full(&self, usage: &Usage) -> String {
        let mut text =
            String::with_capacity(usage.completion_tokens as usize * prompt::BYTES_PER_TOKEN);
        for i in 0..usage.completion_tokens {
            text.push_str(token_text(i));
        }
        let text = serde_json::Value::String(text).to_string();
        let mut out = match self.endpoint {
            Endpoint::Chat => {
                let mut s = self.head("chat.completion");
                s.push_str(r#","choices":[{"index":0,"message":{"role":"assistant","content":"#);
                s.push_str(&text);
                s.push_str(r#"},"logprobs":null,"finish_reason":"length"}]"#);
                s
            }
            Endpoint::Completions => {
                let mut s = self.head("text_completion");
                s.push_str(r#","choices":[{"index":0,"text":"#);
                s.push_str(&text);
                s.push_str(r#","logprobs":null,"finish_reason":"length"}]"#);
                s
            }
        };
        out.push_str(r#","usage":"#);
        out.push_str(&usage.json());
        out.push('}');
        out
    }
}

/// OpenAI `usage`, with vLLM's `prompt_tokens_details.cached_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
}

impl Usage {
    fn json(&self) -> String {
        format!(
            r#"{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{},"prompt_tokens_details":{{"cached_tokens":{}}}}}"#,
            self.prompt_tokens,
            self.completion_tokens,
            u64::from(self.prompt_tokens) + u64::from(self.completion_tokens),
            self.cached_tokens
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_honours_the_extensions() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],
            "max_tokens":7,"min_tokens":7,"ignore_eos":true,"stream":true,
            "stream_options":{"include_usage":true}}"#;
        let r = parse(body, Endpoint::Chat, 16, None, false).unwrap();
        assert_eq!(r.model, "m");
        // "<|user|>\nabcdefgh\n" = 18 bytes -> 5 tokens, as the gateway estimates
        assert_eq!((r.prompt_tokens, r.output_tokens), (5, 7));
        assert!(r.stream && r.include_usage);
        let body = br#"{"model":"m","prompt":"x","prompt_tokens":1234}"#;
        let r = parse(body, Endpoint::Completions, 16, None, false).unwrap();
        assert_eq!(
            (r.prompt_tokens, r.output_tokens, r.stream),
            (1234, 16, false)
        );
        let bad = br#"{"model":"m","prompt":"x","max_tokens":4,"min_tokens":5}"#;
        assert_eq!(
            parse(bad, Endpoint::Completions, 16, None, false)
                .unwrap_err()
                .param,
            Some("min_tokens")
        );
        let zero = br#"{"model":"m","prompt":"x","max_tokens":0}"#;
        assert!(parse(zero, Endpoint::Completions, 16, None, false).is_err());
    }

    #[test]
    fn chunks_are_valid_json_events() {
        for endpoint in [Endpoint::Chat, Endpoint::Completions] {
            let r = Renderer {
                endpoint,
                id: "x-1".into(),
                model_json: "\"m\\\"q\"".into(),
                created: 5,
            };
            let mut s = String::new();
            r.push_role(&mut s);
            r.push_token(&mut s, 0);
            r.push_token(&mut s, 1);
            let usage = Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: 0,
            };
            r.push_end(&mut s, Some(&usage));
            let events: Vec<&str> = s
                .split("\n\n")
                .filter(|e| !e.is_empty())
                .map(|e| e.strip_prefix("data: ").unwrap())
                .collect();
            assert_eq!(events.last(), Some(&"[DONE]"));
            for e in &events[..events.len() - 1] {
                let v: Value = serde_json::from_str(e).unwrap();
                assert_eq!(v["model"], "m\"q");
            }
            let v: Value = serde_json::from_str(events[events.len() - 2]).unwrap();
            assert_eq!(v["usage"]["completion_tokens"], 2);
            let full: Value = serde_json::from_str(&r.full(&usage)).unwrap();
            assert_eq!(full["usage"]["total_tokens"], 5);
        }
    }
}
