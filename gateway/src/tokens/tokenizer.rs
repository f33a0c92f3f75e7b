//! One model's tokenizer and chat template: loaded with its size capped, a prompt rendered and
//! encoded as the engine would, and the cheap bound that refuses a prompt too long for every
//! window from its bytes alone.

use super::CountError;
use crate::prompt::{BadRequest, Endpoint, Framing, Parsed};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A loaded tokenizer and chat template.
pub struct ModelTokenizer {
    pub(super) tokenizer: tokenizers::Tokenizer,
    template: Option<minijinja::Environment<'static>>,
    bos: String,
    eos: String,
    source: String,
    bound: TokenBound,
}

/// Largest `tokenizer.json` read: the largest public ones (multilingual vocabularies of 256k
/// tokens) are about 35 MB; a file beyond this is not a tokenizer the gateway should hold.
pub const MAX_TOKENIZER_BYTES: u64 = 128 << 20;

/// Largest prompt text the gateway tokenizes (after rendering): 8 MiB. A count costs about
/// 3 s of CPU and 350 bytes of the tokenizer's working memory per byte of text (a
/// 4,000,000-digit prompt: 11.9 s and 1.37 GB), so beyond this the prompt is refused rather
/// than counted; below it, [`TokenBound`] refuses what cannot fit a window without counting.
pub const MAX_COUNT_BYTES: usize = 8 << 20;

/// A sound lower bound on the tokens a text encodes to, from its bytes alone, where the
/// tokenizer's shape allows one (else none: the prompt is counted).
///
/// For a BPE model with no normalizer (so the text reaches the pre-tokenizer unchanged) and no
/// fused unknown token, every token stands for at most `max_token_bytes` bytes of the text (the
/// longest vocabulary entry or added token, in UTF-8 bytes, which is at least the bytes it
/// stands for: a byte-level alphabet spends one or two UTF-8 bytes per byte), so a text of `b`
/// bytes is at least `ceil(b / max_token_bytes)` tokens. With a `Digits` pre-tokenizer that
/// splits digits individually (SmolLM2, …), every ASCII digit is a piece of its own and so at
/// least one token, unless an added token contains a digit (it would be matched first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenBound {
    /// The most bytes one token covers, when known.
    pub max_token_bytes: Option<usize>,
    /// Whether each ASCII digit is at least one token.
    pub digit_tokens: bool,
}

impl TokenBound {
    /// Read the bound's facts from a `tokenizer.json`'s text (none when it is not a shape the
    /// bound is sound for).
    pub fn of_json(json: &str) -> TokenBound {
        let Ok(v) = serde_json::from_str::<Value>(json) else {
            return TokenBound::default();
        };
        let model = &v["model"];
        let bpe = model["type"].as_str() == Some("BPE");
        let fused_unk = model["unk_token"].is_string() && model["fuse_unk"].as_bool() == Some(true);
        if !bpe || fused_unk || !v["normalizer"].is_null() {
            return TokenBound::default();
        }
        let added: Vec<&str> = v["added_tokens"]
            .as_array()
            .map(|a| a.iter().filter_map(|t| t["content"].as_str()).collect())
            .unwrap_or_default();
        let vocab_max = model["vocab"]
            .as_object()
            .map(|m| m.keys().map(String::len).max().unwrap_or(0))
            .unwrap_or(0);
        let longest = added.iter().map(|t| t.len()).fold(vocab_max, usize::max);
        if longest == 0 {
            return TokenBound::default();
        }
        fn splits_digits(p: &Value) -> bool {
            match p["type"].as_str() {
                Some("Digits") => p["individual_digits"].as_bool() == Some(true),
                Some("Sequence") => p["pretokenizers"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(splits_digits)),
                _ => false,
            }
        }
        TokenBound {
            // An unknown character (not fused) is one token of up to 4 bytes.
            max_token_bytes: Some(longest.max(4)),
            digit_tokens: splits_digits(&v["pre_tokenizer"])
                && !added.iter().any(|t| t.bytes().any(|b| b.is_ascii_digit())),
        }
    }

    /// The least number of tokens `text` can encode to (0 when no bound is known).
    pub fn tokens_at_least(&self, text: &str) -> u64 {
        self.of_bytes(text.len(), || count_digits(text))
    }

    /// The least number of tokens a text of `bytes` bytes can encode to, `digits()` of them
    /// ASCII digits (asked only when this bound counts digits).
    fn of_bytes(&self, bytes: usize, digits: impl FnOnce() -> usize) -> u64 {
        let Some(per) = self.max_token_bytes else {
            return 0;
        };
        let bytes = bytes as u64;
        if self.digit_tokens {
            let digits = (digits() as u64).min(bytes);
            digits + (bytes - digits).div_ceil(per as u64)
        } else {
            bytes.div_ceil(per as u64)
        }
    }

    /// The least number of tokens the text an engine tokenizes for `parsed` encodes to, from
    /// the parsed prompt alone (no template rendered, nothing encoded): the prompt's bytes less
    /// the gateway's own chat markers ([`Framing`]), none for token ids. The rendered text holds
    /// every message's content (the template adds to it), and the bound only grows with bytes
    /// and digits, so this never exceeds [`TokenBound::tokens_at_least`] of the rendered text.
    pub fn prompt_at_least(&self, parsed: &Parsed) -> u64 {
        let (marker_bytes, marker_digits) = match parsed.framing {
            Framing::Ids => return 0,
            Framing::Bare => (0, 0),
            Framing::Markers { bytes, digits } => (bytes, digits),
        };
        let text = &parsed.prompt;
        self.of_bytes(text.len().saturating_sub(marker_bytes), || {
            count_digits(text).saturating_sub(marker_digits)
        })
    }
}

/// The refusal of a prompt at least `least` tokens (`bytes` bytes) long for a window of `w`.
fn beyond_window(
    least: u64,
    bytes: usize,
    parsed: &Parsed,
    w: u32,
    param: &'static str,
) -> CountError {
    CountError::TooLong(BadRequest {
        message: format!(
            "the prompt is at least {least} tokens ({bytes} bytes), more than the largest context window of model `{}` ({w} tokens)",
            parsed.model
        ),
        param: Some(param),
    })
}

/// The ASCII digits in `text`. Counted in runs of 255 bytes into a `u8`, which the compiler
/// turns into vector compares and adds: about ten times faster than a filtered count (1 ms
/// per MiB), and it runs on the executor for every large chat prompt
/// ([`ModelTokenizer::refuse_early`]): in issue 42's hostile run (four clients sending
/// 1 MiB prompts of digits) the filtered count was 18 % of the gateway's CPU samples, most of
/// the executor's own.
fn count_digits(text: &str) -> usize {
    text.as_bytes()
        .chunks(usize::from(u8::MAX))
        .map(|run| {
            let n = run
                .iter()
                .fold(0u8, |n, b| n + u8::from(b.is_ascii_digit()));
            usize::from(n)
        })
        .sum()
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("source", &self.source)
            .finish()
    }
}

const TEMPLATE: &str = "chat";

/// Why a model's tokenizer (or chat template) could not be loaded ([`ModelTokenizer::load`]);
/// the message names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// The tokenizer file cannot be read as a Hugging Face `tokenizer.json`.
    #[error("cannot load `{}` as a tokenizer.json: {error}", .path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// Why.
        error: tokenizers::Error,
    },
    /// The tokenizer file is larger than [`MAX_TOKENIZER_BYTES`] (or unreadable).
    #[error("cannot read `{}`: {why}", .path.display())]
    ReadTokenizer {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The chat template cannot be read.
    #[error("cannot read `{}`: {error}", .path.display())]
    ReadTemplate {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The chat template is not a Jinja template.
    #[error("`{}` is not a Jinja template: {error}", .path.display())]
    Template {
        /// The file.
        path: PathBuf,
        /// Why.
        error: minijinja::Error,
    },
}

impl TokenizerError {
    /// The model entry's field at fault: the chat template's errors are the template's, not
    /// the tokenizer's (a template that did not parse was once laid at `tokenizer`).
    pub fn field(&self) -> &'static str {
        match self {
            TokenizerError::ReadTemplate { .. } | TokenizerError::Template { .. } => {
                "chat_template"
            }
            TokenizerError::Tokenizer { .. } | TokenizerError::ReadTokenizer { .. } => "tokenizer",
        }
    }
}

/// A tokenizer file's text, refused beyond [`MAX_TOKENIZER_BYTES`] before it is read.
fn read_capped(path: &Path) -> Result<String, TokenizerError> {
    use std::io::Read as _;
    let err = |why: String| TokenizerError::ReadTokenizer {
        path: path.to_path_buf(),
        why,
    };
    let f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut text = String::new();
    // `take` holds the read to the cap even if the file grows (or is not a regular file).
    f.take(MAX_TOKENIZER_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| err(e.to_string()))?;
    if text.len() as u64 > MAX_TOKENIZER_BYTES {
        return Err(err(format!(
            "larger than {} MiB (a tokenizer.json is at most a few tens of MiB)",
            MAX_TOKENIZER_BYTES >> 20
        )));
    }
    Ok(text)
}

impl ModelTokenizer {
    /// Load a tokenizer (and template). Errors say which file and why.
    pub fn load(
        tokenizer: &Path,
        chat_template: Option<&Path>,
    ) -> Result<ModelTokenizer, TokenizerError> {
        let json = read_capped(tokenizer)?;
        let tk = tokenizers::Tokenizer::from_bytes(json.as_bytes()).map_err(|error| {
            TokenizerError::Tokenizer {
                path: tokenizer.to_path_buf(),
                error,
            }
        })?;
        let bound = TokenBound::of_json(&json);
        drop(json);
        let template = match chat_template {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|error| TokenizerError::ReadTemplate {
                        path: p.to_path_buf(),
                        error,
                    })?;
                Some(
                    Self::environment(text).map_err(|error| TokenizerError::Template {
                        path: p.to_path_buf(),
                        error,
                    })?,
                )
            }
            None => None,
        };
        // The usual names of the begin / end tokens a template may print.
        let special = |names: &[&str]| {
            names
                .iter()
                .find(|n| tk.token_to_id(n).is_some())
                .map(|s| (*s).to_string())
                .unwrap_or_default()
        };
        Ok(ModelTokenizer {
            bos: special(&["<|im_start|>", "<s>", "<|begin_of_text|>", "<bos>"]),
            eos: special(&[
                "<|im_end|>",
                "</s>",
                "<|end_of_text|>",
                "<eos>",
                "<|endoftext|>",
            ]),
            tokenizer: tk,
            template,
            bound,
            source: format!(
                "{}{}",
                tokenizer.display(),
                chat_template.map_or(String::new(), |t| format!(" + {}", t.display()))
            ),
        })
    }

    pub(super) fn environment(
        text: String,
    ) -> Result<minijinja::Environment<'static>, minijinja::Error> {
        let mut env = minijinja::Environment::new();
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned(TEMPLATE, text)?;
        Ok(env)
    }

    /// Where it was loaded from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether a chat template is loaded.
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// Encode text (`special`: let the tokenizer add its special tokens).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, BadRequest> {
        #[cfg(test)]
        ENCODED.with(|n| n.set(n.get() + 1));
        self.tokenizer
            .encode_fast(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| BadRequest {
                message: format!("the prompt could not be tokenized: {e}"),
                param: None,
            })
    }

    /// The token ids of a request as the engine would compute them.
    pub fn ids(&self, body: &[u8], ep: Endpoint, parsed: &Parsed) -> Result<Vec<u32>, BadRequest> {
        match self.input(body, ep, parsed)? {
            Input::Ids(ids) => Ok(ids),
            Input::Text(text, special) => self.encode(&text, special),
        }
    }

    /// What the engine would tokenize: the rendered text (and whether special tokens are
    /// added), or the ids a completion gave.
    fn input(&self, body: &[u8], ep: Endpoint, parsed: &Parsed) -> Result<Input, BadRequest> {
        let v: Value = serde_json::from_slice(body).map_err(|e| BadRequest {
            message: e.to_string(),
            param: None,
        })?;
        Ok(match ep {
            Endpoint::Chat => match &self.template {
                Some(env) => Input::Text(render_chat(env, &v, &self.bos, &self.eos)?, false),
                None => Input::Text(parsed.prompt.clone(), false),
            },
            Endpoint::Completions => match v.get("prompt") {
                Some(Value::Array(items)) if items.iter().all(Value::is_u64) => Input::Ids(
                    items
                        .iter()
                        .filter_map(Value::as_u64)
                        .map(|x| u32::try_from(x).unwrap_or(u32::MAX))
                        .collect(),
                ),
                _ => Input::Text(parsed.prompt.clone(), true),
            },
        })
    }

    /// [`ModelTokenizer::ids`], refusing without encoding a text beyond [`MAX_COUNT_BYTES`] or
    /// one whose [`TokenBound`] exceeds `window` (the largest context window among the model's
    /// workers, when known).
    pub fn ids_within(
        &self,
        body: &[u8],
        ep: Endpoint,
        parsed: &Parsed,
        window: Option<u32>,
    ) -> Result<Vec<u32>, CountError> {
        let param = ep.prompt_param();
        let (text, special) = match self.input(body, ep, parsed)? {
            Input::Ids(ids) => return Ok(ids),
            Input::Text(t, special) => (t, special),
        };
        if text.len() > MAX_COUNT_BYTES {
            return Err(CountError::TooLong(BadRequest {
                message: format!(
                    "the prompt is {} bytes; the gateway counts prompts of at most {} MiB",
                    text.len(),
                    MAX_COUNT_BYTES >> 20
                ),
                param: Some(param),
            }));
        }
        if let Some(w) = window {
            let least = self.bound.tokens_at_least(&text);
            if least > u64::from(w) {
                return Err(beyond_window(least, text.len(), parsed, w, param));
            }
        }
        Ok(self.encode(&text, special)?)
    }

    /// A prompt refused before it is rendered or queued for a count: the bound of its parsed
    /// text ([`TokenBound::prompt_at_least`]) exceeds `window`, the largest context window of
    /// its model. Costs one pass over the prompt's bytes, and only for a body longer than the
    /// window in bytes (each token is at least one byte of the body).
    pub fn refuse_early(
        &self,
        body_len: usize,
        ep: Endpoint,
        parsed: &Parsed,
        window: Option<u32>,
    ) -> Result<(), CountError> {
        let Some(w) = window else { return Ok(()) };
        if body_len as u64 <= u64::from(w) {
            return Ok(());
        }
        let least = self.bound.prompt_at_least(parsed);
        if least > u64::from(w) {
            return Err(beyond_window(
                least,
                parsed.prompt.len(),
                parsed,
                w,
                ep.prompt_param(),
            ));
        }
        Ok(())
    }

    /// The bound this tokenizer allows ([`TokenBound`]).
    pub fn bound(&self) -> TokenBound {
        self.bound
    }
}

#[cfg(test)]
thread_local! {
    /// Texts this thread encoded (the tests check that a refusal encoded nothing).
    pub(super) static ENCODED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

enum Input {
    Ids(Vec<u32>),
    Text(String, bool),
}

/// Render chat messages with the model's template, text parts of array contents joined by
/// newlines (what vLLM hands a template that expects string contents).
pub(super) fn render_chat(
    env: &minijinja::Environment<'static>,
    body: &Value,
    bos: &str,
    eos: &str,
) -> Result<String, BadRequest> {
    let mut messages = body.get("messages").cloned().unwrap_or(Value::Null);
    if let Value::Array(ms) = &mut messages {
        for m in ms.iter_mut() {
            if let Some(Value::Array(parts)) = m.get("content") {
                let text = parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n");
                m["content"] = Value::String(text);
            }
        }
    }
    let tmpl = env.get_template(TEMPLATE).map_err(|e| BadRequest {
        message: e.to_string(),
        param: None,
    })?;
    tmpl.render(minijinja::context! {
        messages => minijinja::Value::from_serialize(&messages),
        add_generation_prompt => true,
        bos_token => bos,
        eos_token => eos,
        tools => body.get("tools").map(minijinja::Value::from_serialize),
    })
    .map_err(|e| BadRequest {
        message: format!("the chat template refused the messages: {e}"),
        param: Some("messages"),
    })
}

#[cfg(test)]
mod digit_tests {
    use super::count_digits;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// The vectorised count equals the plain one, over lengths across many 255-byte runs
        /// (all digits included: a run of 255 digits must not overflow its `u8`) and any text.
        #[test]
        fn the_digit_count_is_the_filtered_count(
            text in prop_oneof!["[0-9]{0,2000}", "[0-9a é中🙂\n]{0,1500}", any::<String>()],
        ) {
            prop_assert_eq!(count_digits(&text), text.bytes().filter(u8::is_ascii_digit).count());
        }
    }

    #[test]
    fn a_mebibyte_of_digits_counts_whole() {
        let text = "7".repeat(1 << 20);
        assert_eq!(count_digits(&text), 1 << 20);
        assert_eq!(count_digits(&format!("{text}x")), 1 << 20);
    }
}
