//! Prompt tokens and prefix blocks: exact from a model's tokenizer when the configuration gives
//! one, else the byte estimate.
//!
//! ```yaml
//! models:
//!   - name: smollm2-135m                      # the model name requests carry
//!     tokenizer: tokenizers/smollm2/tokenizer.json   # a Hugging Face tokenizer.json
//!     chat_template: tokenizers/smollm2/chat_template.jinja  # optional (Jinja)
//! ```
//!
//! Paths are relative to the configuration file. **With a tokenizer** a chat request's messages
//! are rendered by the chat template (`messages`, `add_generation_prompt: true`, `bos_token`,
//! `eos_token`, and `raise_exception`, as vLLM renders them) and the text encoded without adding
//! special tokens (the template wrote them); without a template, the gateway's own rendering
//! ([`crate::prompt`]) is encoded. A completion's prompt string is encoded with the tokenizer's
//! special tokens; a prompt of token ids is taken as it is. Prompt tokens are then the engine's
//! count, and prefix blocks are chain hashes of [`PREFIX_BLOCK_TOKENS`] token ids
//! ([`block_keys`]) — whole multiples of an engine's block (vLLM's 16 tokens), so the router's
//! blocks line up with the blocks an engine announces in its KV events ([`crate::kv`]).
//! **Without one**, today's estimate: `ceil(bytes / 4)` tokens and 2,048-byte blocks
//! ([`crate::prompt::prefix_hashes`]), which are the same chain hash over 512 "byte tokens" of 4
//! bytes each ([`byte_tokens`]): an engine that announces such ids (the emulator without a
//! tokenizer) matches too, a real engine does not.

use crate::kv::translate::hash_token;
use crate::prompt::{self, BadRequest, Endpoint, MAX_BLOCKS, Parsed};
use routelab_policies::streams::FNV1A_OFFSET;
use routelab_policies::{InputError, PREFIX_BLOCK_TOKENS};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One model's tokenizer, as configured.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The model name requests carry.
    pub name: String,
    /// A Hugging Face `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// A Jinja chat template (the model's `chat_template`); none: the gateway's own rendering
    /// of chat messages is tokenized.
    #[serde(default)]
    pub chat_template: Option<PathBuf>,
}

/// Chain hashes of the whole [`PREFIX_BLOCK_TOKENS`]-token blocks of `ids` (at most
/// [`MAX_BLOCKS`]): hash `i` covers tokens `0..512 (i + 1)`, over each id's little-endian bytes.
pub fn block_keys(ids: &[u32]) -> Vec<u64> {
    let block = PREFIX_BLOCK_TOKENS as usize;
    let mut out = Vec::with_capacity((ids.len() / block).min(MAX_BLOCKS));
    let mut h = FNV1A_OFFSET;
    for chunk in ids.chunks_exact(block).take(MAX_BLOCKS) {
        for &id in chunk {
            h = hash_token(h, id);
        }
        out.push(h);
    }
    out
}

/// The estimate's "tokens": each whole 4 bytes of the rendered prompt as one little-endian id
/// (a trailing part is in no whole block, so it is left out). [`block_keys`] of them is
/// [`prompt::prefix_hashes`] of the bytes.
pub fn byte_tokens(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(prompt::BYTES_PER_TOKEN)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A prompt as the router sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prefix block keys.
    pub prefix: Vec<u64>,
    /// Whether `prompt_tokens` came from the model's tokenizer.
    pub exact: bool,
}

/// A loaded tokenizer and chat template.
pub struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
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
        let Some(per) = self.max_token_bytes else {
            return 0;
        };
        let bytes = text.len() as u64;
        if self.digit_tokens {
            let digits = text.bytes().filter(u8::is_ascii_digit).count() as u64;
            digits + (bytes - digits).div_ceil(per as u64)
        } else {
            bytes.div_ceil(per as u64)
        }
    }
}

/// Why a prompt was not counted.
#[derive(Debug, Clone, PartialEq)]
pub enum CountError {
    /// The request cannot be tokenized (a 400).
    Bad(BadRequest),
    /// The prompt cannot fit the model's largest window, shown from its bytes (a 400,
    /// `context_length_exceeded`), or is beyond [`MAX_COUNT_BYTES`].
    TooLong(BadRequest),
    /// The counting threads for large prompts are all taken and their queue is full, or the
    /// count waited past its deadline (a 503 with `Retry-After`).
    Busy(String),
}

impl From<BadRequest> for CountError {
    fn from(b: BadRequest) -> CountError {
        CountError::Bad(b)
    }
}

impl CountError {
    /// The answer to the client.
    pub fn into_api(self) -> crate::error::ApiError {
        use crate::error::ApiError;
        match self {
            CountError::Bad(b) => ApiError::bad_request(b.message, b.param),
            CountError::TooLong(b) => ApiError {
                param: b.param,
                code: "context_length_exceeded",
                ..ApiError::bad_request(b.message, b.param)
            },
            CountError::Busy(why) => ApiError {
                retry_after_s: Some(1),
                ..ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "service_unavailable_error",
                    "counting_busy",
                    why,
                )
            },
        }
    }
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

    fn environment(text: String) -> Result<minijinja::Environment<'static>, minijinja::Error> {
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
        let param = match ep {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        };
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
                return Err(CountError::TooLong(BadRequest {
                    message: format!(
                        "the prompt is at least {least} tokens ({} bytes), more than the largest context window of model `{}` ({w} tokens)",
                        text.len(),
                        parsed.model
                    ),
                    param: Some(param),
                }));
            }
        }
        Ok(self.encode(&text, special)?)
    }

    /// The bound this tokenizer allows ([`TokenBound`]).
    pub fn bound(&self) -> TokenBound {
        self.bound
    }
}

#[cfg(test)]
thread_local! {
    /// Texts this thread encoded (the tests check that a refusal encoded nothing).
    static ENCODED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

enum Input {
    Ids(Vec<u32>),
    Text(String, bool),
}

/// Render chat messages with the model's template, text parts of array contents joined by
/// newlines (what vLLM hands a template that expects string contents).
fn render_chat(
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

/// Every configured model's tokenizer.
#[derive(Debug, Default, Clone)]
pub struct Tokenizers {
    models: HashMap<String, Arc<ModelTokenizer>>,
    /// Shared by clones: one set of counting threads per gateway.
    counting: Arc<Counting>,
}

/// The threads that count prompts for the request path, in two lanes, started at the first
/// count and ending when the last clone of the [`Tokenizers`] goes.
///
/// One thread per core counts small prompts (bodies up to [`SMALL_BODY`]); a separate half of
/// the cores (at least one thread) counts large ones, behind a queue of [`LARGE_QUEUE`] per
/// thread: a few clients sending megabyte prompts then take the large lane only, and a short
/// request is counted as soon as a small-lane thread is free (the probe's "hello" waited 6-10 s
/// behind four 1 MB prompts when both shared one queue). A large prompt that finds the queue
/// full, or whose count waited more than [`COUNT_WAIT`], is answered 503 with `Retry-After`.
///
/// Why fixed threads at all: counts used to run on tokio's blocking pool, where every count
/// that found no idle thread started one more (up to 512): a stall of a few milliseconds at 400
/// req/s left the pool a dozen threads larger, each with its own glibc malloc arena holding the
/// tokenizer's garbage, and the gateway's RSS rose a step at every stall (+0.11 MiB/min over a
/// 29-minute soak, with the live heap flat).
#[derive(Debug)]
struct Counting {
    threads: usize,
    small: std::sync::OnceLock<Result<Lane, String>>,
    large: std::sync::OnceLock<Result<Lane, String>>,
    /// The threads that ran a count (for the tests).
    #[cfg(test)]
    seen: std::sync::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
}

/// Bodies up to this many bytes count in the small lane (a 64 KiB prompt is about 16k tokens,
/// a few milliseconds of counting).
pub const SMALL_BODY: usize = 64 << 10;
/// Large counts waiting per large-lane thread before a large prompt is refused.
pub const LARGE_QUEUE: usize = 2;
/// Small counts waiting before a small prompt is refused (the bodies are held by their
/// requests anyway; this bounds the queue, not the memory).
pub const SMALL_QUEUE: usize = 4096;
/// Longest a count may wait for a thread before it is refused instead of started.
pub const COUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

type CountJob = Box<dyn FnOnce() + Send>;

/// One lane's queue (its threads end when it is dropped).
#[derive(Debug)]
struct Lane(std::sync::mpsc::SyncSender<CountJob>);

impl Lane {
    fn start(name: &str, threads: usize, queue: usize) -> Result<Lane, String> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<CountJob>(queue);
        let rx = Arc::new(std::sync::Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("routelab-count-{name}-{i}"))
                .spawn(move || {
                    loop {
                        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok(job) = next else { return };
                        // A count that panics fails its request (its answer is dropped
                        // unsent), not the thread.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .map_err(|e| format!("cannot start a counting thread: {e}"))?;
        }
        Ok(Lane(tx))
    }
}

impl Counting {
    fn new(threads: usize) -> Counting {
        Counting {
            threads: threads.max(1),
            small: std::sync::OnceLock::new(),
            large: std::sync::OnceLock::new(),
            #[cfg(test)]
            seen: Default::default(),
        }
    }

    /// Run `job` on a thread of the lane for a body of `body_len` bytes (started now if this is
    /// the lane's first job); why not, when the lane is full or could not be started.
    fn run(&self, body_len: usize, job: CountJob) -> Result<(), CountError> {
        let lane = if body_len <= SMALL_BODY {
            self.small
                .get_or_init(|| Lane::start("small", self.threads, SMALL_QUEUE))
        } else {
            let n = (self.threads / 2).max(1);
            self.large
                .get_or_init(|| Lane::start("large", n, n * LARGE_QUEUE))
        };
        let lane = lane.as_ref().map_err(|e| CountError::Busy(e.clone()))?;
        lane.0.try_send(job).map_err(|e| match e {
            std::sync::mpsc::TrySendError::Full(_) => CountError::Busy(format!(
                "every thread counting {} prompts is busy and its queue is full; retry shortly",
                if body_len <= SMALL_BODY {
                    "small"
                } else {
                    "large"
                }
            )),
            std::sync::mpsc::TrySendError::Disconnected(_) => {
                CountError::Busy("the counting threads are gone".to_string())
            }
        })
    }
}

impl Default for Counting {
    /// One thread per core.
    fn default() -> Counting {
        Counting::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

impl Tokenizers {
    /// Load the configured models' tokenizers; paths relative to `base` (the configuration's
    /// directory). Errors are located at `models[i].tokenizer` / `.chat_template` of `origin`.
    pub fn load(
        models: &[ModelConfig],
        base: &Path,
        origin: &str,
    ) -> Result<Tokenizers, InputError> {
        let mut out = Tokenizers::default();
        for (i, m) in models.iter().enumerate() {
            if out.models.contains_key(&m.name) {
                return Err(InputError::new(
                    origin,
                    format!("models[{i}].name"),
                    format!("model `{}` is listed twice", m.name),
                )
                .valid("one entry per model name"));
            }
            let tk = base.join(&m.tokenizer);
            let tmpl = m.chat_template.as_ref().map(|t| base.join(t));
            let field = match (&tmpl, tmpl.as_ref().is_some_and(|t| !t.is_file())) {
                (Some(_), true) => "chat_template",
                _ => "tokenizer",
            };
            let loaded = ModelTokenizer::load(&tk, tmpl.as_deref()).map_err(|e| {
                InputError::new(origin, format!("models[{i}].{field}"), e.to_string())
                    .valid("a Hugging Face tokenizer.json (and a Jinja chat template), relative to the configuration file")
            })?;
            out.models.insert(m.name.clone(), Arc::new(loaded));
        }
        Ok(out)
    }

    /// The model's tokenizer, if configured.
    pub fn get(&self, model: &str) -> Option<&Arc<ModelTokenizer>> {
        self.models.get(model)
    }

    /// How the gateway counts the model's prompts, in words (for `/admin` and `--check`).
    pub fn describe(&self, model: &str) -> String {
        match self.models.get(model) {
            Some(t) => format!("exact ({})", t.source()),
            None => format!(
                "estimate (bytes / {} and {}-byte prefix blocks; no tokenizer configured)",
                prompt::BYTES_PER_TOKEN,
                prompt::BLOCK_BYTES
            ),
        }
    }

    /// Prompt tokens and prefix blocks of a parsed request.
    pub fn count(&self, body: &[u8], ep: Endpoint, parsed: &Parsed) -> Result<Counted, BadRequest> {
        match self.models.get(&parsed.model) {
            Some(t) => exact(t, body, ep, parsed),
            None => Ok(estimate(parsed)),
        }
    }

    /// [`Tokenizers::count`] for the request path: a tokenizer's work (a short chat takes
    /// 0.1-0.25 ms here: BPE behind the pure-Rust regex pre-tokenizer) runs on the counting
    /// threads ([`Counting`]: a lane for small prompts, another for large ones, bounded queues,
    /// a wait deadline), so it never holds one of the executor's threads; the estimate runs in
    /// place. `window`, the largest context window among the model's workers, lets a prompt
    /// that cannot fit be refused from its bytes without counting ([`TokenBound`]).
    pub async fn count_async(
        &self,
        body: bytes::Bytes,
        ep: Endpoint,
        parsed: &Parsed,
        window: Option<u32>,
    ) -> Result<Counted, CountError> {
        let Some(t) = self.models.get(&parsed.model) else {
            return Ok(estimate(parsed));
        };
        let (t, p) = (t.clone(), parsed.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        #[cfg(test)]
        let counting = self.counting.clone();
        let body_len = body.len();
        let queued = std::time::Instant::now();
        let job = Box::new(move || {
            // The request went away while its count waited: nothing to count for.
            if tx.is_closed() {
                return;
            }
            if queued.elapsed() > COUNT_WAIT {
                let _ = tx.send(Err(CountError::Busy(format!(
                    "the prompt waited more than {} s to be counted; retry shortly",
                    COUNT_WAIT.as_secs()
                ))));
                return;
            }
            #[cfg(test)]
            counting
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(std::thread::current().id());
            let _ = tx.send(exact_within(&t, &body, ep, &p, window));
        });
        self.counting.run(body_len, job)?;
        rx.await.unwrap_or_else(|_| {
            Err(CountError::Bad(BadRequest {
                message: "the prompt could not be tokenized: the count panicked".to_string(),
                param: None,
            }))
        })
    }
}

fn exact_within(
    t: &ModelTokenizer,
    body: &[u8],
    ep: Endpoint,
    parsed: &Parsed,
    window: Option<u32>,
) -> Result<Counted, CountError> {
    let ids = t.ids_within(body, ep, parsed, window)?;
    Ok(Counted {
        prompt_tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
        prefix: block_keys(&ids),
        exact: true,
    })
}

fn exact(
    t: &ModelTokenizer,
    body: &[u8],
    ep: Endpoint,
    parsed: &Parsed,
) -> Result<Counted, BadRequest> {
    let ids = t.ids(body, ep, parsed)?;
    Ok(Counted {
        prompt_tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
        prefix: block_keys(&ids),
        exact: true,
    })
}

fn estimate(parsed: &Parsed) -> Counted {
    Counted {
        prompt_tokens: parsed.prompt_tokens,
        prefix: prompt::prefix_hashes(parsed.prompt.as_bytes()),
        exact: false,
    }
}

/// Where relative paths of a configuration loaded from `origin` start: its directory when it
/// names a file, else the working directory.
pub fn config_base(origin: &str) -> PathBuf {
    let p = Path::new(origin);
    match p.parent() {
        Some(d) if p.is_file() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod props {
    use super::tests::smollm2;
    use super::*;
    use proptest::prelude::*;

    fn tokenizer() -> &'static ModelTokenizer {
        static T: std::sync::OnceLock<ModelTokenizer> = std::sync::OnceLock::new();
        T.get_or_init(|| ModelTokenizer::load(&smollm2().join("tokenizer.json"), None).unwrap())
    }

    /// Pieces a prompt is made of: digits, words, spaces and newlines, punctuation, multi-byte
    /// characters, special tokens, long runs of one character.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9]{1,12}",
            "[a-zA-Z]{1,12}",
            "[ \n\t]{1,4}",
            "[!-/:-@]{1,6}",
            Just("é中🙂".to_string()),
            Just("<|im_start|>".to_string()),
            Just("<|endoftext|>".to_string()),
            (1usize..300).prop_map(|n| "-".repeat(n)),
            (1usize..300).prop_map(|n| " ".repeat(n)),
            (1usize..200).prop_map(|n| "ab".repeat(n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The bound a prompt is refused on is never above its exact count, over lengths from
        /// empty to a few thousand bytes and every kind of piece (with and without the
        /// tokenizer's special tokens).
        #[test]
        fn the_byte_bound_never_exceeds_the_exact_count(
            pieces in prop::collection::vec(piece(), 0..120),
        ) {
            let text: String = pieces.concat();
            let t = tokenizer();
            let least = t.bound().tokens_at_least(&text);
            for special in [false, true] {
                let n = t.encode(&text, special).unwrap().len() as u64;
                prop_assert!(least <= n, "bound {} > exact {} for {:?}", least, n, text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn smollm2() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/tokenizers/smollm2-135m-instruct")
    }

    #[test]
    fn byte_tokens_key_the_same_blocks_as_the_byte_hash() {
        for n in [0usize, 2047, 2048, 2049, 5000, 6144] {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
            assert_eq!(
                block_keys(&byte_tokens(&bytes)),
                prompt::prefix_hashes(&bytes),
                "{n}"
            );
        }
    }

    #[test]
    fn the_vendored_smollm2_tokenizer_counts_a_chat_as_its_template_renders_it() {
        let dir = smollm2();
        let t = ModelTokenizer::load(
            &dir.join("tokenizer.json"),
            Some(&dir.join("chat_template.jinja")),
        )
        .unwrap();
        let body = br#"{"model":"smol","messages":[{"role":"user","content":"What is 2+2?"}]}"#;
        let parsed = prompt::parse(body, Endpoint::Chat).unwrap();
        let ids = t.ids(body, Endpoint::Chat, &parsed).unwrap();
        // The template adds SmolLM's default system turn: <|im_start|> (1) opens each turn,
        // <|im_end|> (2) closes it; digits are tokens of their own.
        assert_eq!(ids[0], 1);
        assert_eq!(
            ids.iter().filter(|&&i| i == 1).count(),
            3,
            "system, user, assistant"
        );
        assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2);
        let text = t.tokenizer.decode(&ids, false).unwrap();
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
        assert!(text.contains("What is 2+2?"), "{text}");
        let two = t.tokenizer.token_to_id("2").unwrap();
        assert_eq!(ids.iter().filter(|&&i| i == two).count(), 2);
        // A completion prompt adds nothing (SmolLM2 has no BOS post-processor).
        let body = br#"{"model":"smol","prompt":"hello world"}"#;
        let parsed = prompt::parse(body, Endpoint::Completions).unwrap();
        assert_eq!(
            t.ids(body, Endpoint::Completions, &parsed).unwrap().len(),
            2
        );
    }

    /// The soak's RSS step at every stall came from the blocking pool growing by a thread (and
    /// a malloc arena) per count that found no idle thread: counts now run on a fixed set of
    /// threads, however many requests arrive together, and each still gets its answer.
    #[test]
    fn counts_run_on_one_thread_per_core_however_many_arrive_together() {
        let dir = smollm2();
        let models = vec![ModelConfig {
            name: "m".into(),
            tokenizer: dir.join("tokenizer.json"),
            chat_template: Some(dir.join("chat_template.jinja")),
        }];
        let mut t = Tokenizers::load(&models, Path::new("."), "gw.yaml").unwrap();
        t.counting = Arc::new(Counting::new(2));
        // Long enough (a few ms each) that 32 counts started together overlap, and small enough
        // (under SMALL_BODY) for the small lane, whose queue takes them all.
        let words = "the quick brown fox jumps over the lazy dog ".repeat(1_400);
        let body = bytes::Bytes::from(
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": words}]})
                .to_string(),
        );
        let parsed = prompt::parse(&body, Endpoint::Chat).unwrap();
        let want = t
            .count(&body, Endpoint::Chat, &parsed)
            .unwrap()
            .prompt_tokens;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        for _ in 0..2 {
            let counted = rt.block_on(async {
                let mut set = tokio::task::JoinSet::new();
                for _ in 0..32 {
                    let (t, body, parsed) = (t.clone(), body.clone(), parsed.clone());
                    set.spawn(
                        async move { t.count_async(body, Endpoint::Chat, &parsed, None).await },
                    );
                }
                set.join_all().await
            });
            assert_eq!(counted.len(), 32);
            for c in counted {
                assert_eq!(c.unwrap().prompt_tokens, want);
            }
        }
        let threads = t.counting.seen.lock().unwrap().len();
        assert!(
            (1..=2).contains(&threads),
            "64 counts ran on {threads} threads, not at most 2"
        );
    }

    fn smol() -> ModelTokenizer {
        let dir = smollm2();
        ModelTokenizer::load(
            &dir.join("tokenizer.json"),
            Some(&dir.join("chat_template.jinja")),
        )
        .unwrap()
    }

    /// Defect 2's probe: a 4,000,000-digit prompt to a model with a 32k window cost 11.9 s of
    /// CPU and 1.37 GB before its refusal. SmolLM2 splits digits one by one, so the bytes alone
    /// show at least 4,000,000 tokens: refused without encoding anything.
    #[test]
    fn a_four_million_digit_prompt_is_refused_from_its_bytes_without_counting() {
        let t = smol();
        assert_eq!(
            t.bound(),
            TokenBound {
                max_token_bytes: Some(162),
                digit_tokens: true
            }
        );
        for ep in [Endpoint::Completions, Endpoint::Chat] {
            let digits = "7".repeat(4_000_000);
            let body = match ep {
                Endpoint::Completions => serde_json::json!({"model": "m", "prompt": digits}),
                Endpoint::Chat => serde_json::json!({"model": "m", "messages": [{"role": "user", "content": digits}]}),
            }
            .to_string();
            let parsed = prompt::parse(body.as_bytes(), ep).unwrap();
            let before = ENCODED.with(|n| n.get());
            let e = t
                .ids_within(body.as_bytes(), ep, &parsed, Some(32_768))
                .unwrap_err();
            assert_eq!(ENCODED.with(|n| n.get()), before, "nothing was encoded");
            let CountError::TooLong(b) = &e else {
                panic!("{e:?}")
            };
            assert!(b.message.contains("at least 400"), "{}", b.message);
            assert!(b.message.contains("(32768 tokens)"), "{}", b.message);
            let api = e.into_api();
            assert_eq!(
                (api.status.as_u16(), api.code),
                (400, "context_length_exceeded")
            );
        }
        // Beyond the byte cap, whatever the window.
        let text = "a ".repeat(MAX_COUNT_BYTES / 2 + 1);
        let body = serde_json::json!({"model": "m", "prompt": text}).to_string();
        let parsed = prompt::parse(body.as_bytes(), Endpoint::Completions).unwrap();
        let e = t
            .ids_within(body.as_bytes(), Endpoint::Completions, &parsed, None)
            .unwrap_err();
        assert!(matches!(e, CountError::TooLong(_)), "{e:?}");
        // A prompt that fits is counted as before.
        let body = br#"{"model":"m","prompt":"hello 12345"}"#;
        let parsed = prompt::parse(body, Endpoint::Completions).unwrap();
        assert_eq!(
            t.ids_within(body, Endpoint::Completions, &parsed, Some(32_768))
                .unwrap(),
            t.ids(body, Endpoint::Completions, &parsed).unwrap()
        );
    }

    /// A tokenizer whose shape gives no sound bound (a normalizer may shrink the text; a fused
    /// unknown token covers any run) gets none.
    #[test]
    fn no_bound_where_it_would_not_be_sound() {
        let with = |patch: &str| TokenBound::of_json(patch);
        let base = r#"{"normalizer":null,"pre_tokenizer":null,"added_tokens":[],"model":{"type":"BPE","vocab":{"abc":0},"merges":[]}}"#;
        assert_eq!(with(base).max_token_bytes, Some(4));
        assert_eq!(
            with(&base.replace(r#""normalizer":null"#, r#""normalizer":{"type":"NFC"}"#)),
            TokenBound::default()
        );
        assert_eq!(
            with(&base.replace(r#""BPE""#, r#""WordPiece""#)),
            TokenBound::default()
        );
        assert_eq!(
            with(&base.replace(
                r#""merges":[]"#,
                r#""merges":[],"unk_token":"<unk>","fuse_unk":true"#
            )),
            TokenBound::default()
        );
        assert_eq!(TokenBound::default().tokens_at_least("anything"), 0);
    }

    /// Defect 2's queue: four 1 MB prompts kept a "hello" waiting 6-10 s. Large prompts now
    /// have their own lane behind a bounded queue: with every large-lane thread held and its
    /// queue full, a further large prompt is refused (503) and a small one is still counted.
    #[test]
    fn large_prompts_cannot_hold_up_small_ones_and_their_queue_is_bounded() {
        let dir = smollm2();
        let models = vec![ModelConfig {
            name: "m".into(),
            tokenizer: dir.join("tokenizer.json"),
            chat_template: None,
        }];
        let mut t = Tokenizers::load(&models, Path::new("."), "gw.yaml").unwrap();
        t.counting = Arc::new(Counting::new(2));
        // One large-lane thread (half of 2), two waiting places: three large jobs that block
        // until released fill it.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(std::sync::Mutex::new(held));
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        for i in 0..3 {
            let (held, started_tx) = (held.clone(), started_tx.clone());
            t.counting
                .run(
                    SMALL_BODY + 1,
                    Box::new(move || {
                        let _ = started_tx.send(());
                        let _ = held.lock().unwrap().recv();
                    }),
                )
                .unwrap();
            if i == 0 {
                // The lane's thread holds the first; the next two wait in its queue.
                started.recv().unwrap();
            }
        }
        let refused = t.counting.run(SMALL_BODY + 1, Box::new(|| {}));
        let Err(CountError::Busy(why)) = refused else {
            panic!("a fourth large count was queued")
        };
        assert!(why.contains("large"), "{why}");
        assert_eq!(CountError::Busy(why).into_api().status.as_u16(), 503);
        let body = bytes::Bytes::from_static(br#"{"model":"m","prompt":"hello"}"#);
        let parsed = prompt::parse(&body, Endpoint::Completions).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let c = rt
            .block_on(t.count_async(body, Endpoint::Completions, &parsed, Some(32_768)))
            .unwrap();
        assert_eq!(c.prompt_tokens, 1);
        for _ in 0..3 {
            release.send(()).unwrap();
        }
    }

    #[test]
    fn a_template_that_raises_is_a_400_naming_messages() {
        let env = ModelTokenizer::environment(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}".into(),
        )
        .unwrap();
        let body: Value =
            serde_json::from_str(r#"{"messages":[{"role":"assistant","content":"x"}]}"#).unwrap();
        let e = render_chat(&env, &body, "", "").unwrap_err();
        assert_eq!(e.param, Some("messages"));
        assert!(e.message.contains("first must be user"), "{}", e.message);
    }

    #[test]
    fn a_bad_tokenizer_path_is_located_at_its_field() {
        let m = vec![ModelConfig {
            name: "m".into(),
            tokenizer: "nope/tokenizer.json".into(),
            chat_template: None,
        }];
        let e = Tokenizers::load(&m, Path::new("/nonexistent"), "gw.yaml").unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("models[0].tokenizer") && s.contains("nope/tokenizer.json"),
            "{s}"
        );
    }
}
