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
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod counting;
mod tokenizer;

use counting::Counting;
pub use counting::{COUNT_WAIT, LARGE_QUEUE, SMALL_BODY, SMALL_QUEUE};
pub use tokenizer::{
    MAX_COUNT_BYTES, MAX_TOKENIZER_BYTES, ModelTokenizer, TokenBound, TokenizerError,
};

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

/// Every configured model's tokenizer.
#[derive(Debug, Default, Clone)]
pub struct Tokenizers {
    models: HashMap<String, Arc<ModelTokenizer>>,
    /// Shared by clones: one set of counting threads per gateway.
    counting: Arc<Counting>,
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
            let loaded = ModelTokenizer::load(&tk, tmpl.as_deref()).map_err(|e| {
                InputError::new(origin, format!("models[{i}].{}", e.field()), e.to_string())
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

    /// Parse `body` as a request to `ep`: a body up to [`SMALL_BODY`] on the caller's thread
    /// (the executor, where it takes microseconds), a larger one on a reading thread
    /// ([`Counting::read`]), or here after all when those are all taken.
    pub async fn parse(&self, body: &bytes::Bytes, ep: Endpoint) -> Result<Parsed, BadRequest> {
        if body.len() <= SMALL_BODY {
            return prompt::parse(body, ep);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let b = body.clone();
        let job: counting::CountJob = Box::new(move || {
            let _ = tx.send(prompt::parse(&b, ep));
        });
        match self.counting.read(job) {
            Ok(()) => rx.await.unwrap_or_else(|_| {
                Err(BadRequest {
                    message: "the request could not be read: its parse panicked".to_string(),
                    param: None,
                })
            }),
            Err(_) => prompt::parse(body, ep),
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
        // Refused from the parsed prompt's bytes before it waits for a lane: a prompt that
        // cannot fit is a 400 whatever the lanes' load, never a 503 behind the large lane's
        // queue (issue 42's hostile run: 32 % of the 1 MiB prompts got `counting_busy`).
        t.refuse_early(body.len(), ep, parsed, window)?;
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
    use serde_json::Value;

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

        /// The bound taken from the parsed prompt before any count (the gateway's role markers
        /// left out) is never above the exact count of what the engine tokenizes: chats
        /// rendered by SmolLM2's template (roles with digits too), completions as strings or
        /// arrays of strings, and token ids (no bound).
        #[test]
        fn the_parsed_prompt_bound_never_exceeds_the_exact_count(
            messages in prop::collection::vec(
                (prop_oneof![Just("user"), Just("assistant"), Just("system"), Just("r2d2")],
                 prop::collection::vec(piece(), 0..30)),
                1..5,
            ),
        ) {
            let t = templated();
            let bound = t.bound();
            let chat: Vec<Value> = messages
                .iter()
                .map(|(role, p)| serde_json::json!({"role": role, "content": p.concat()}))
                .collect();
            let texts: Vec<String> = messages.iter().map(|(_, p)| p.concat()).collect();
            for (ep, body) in [
                (Endpoint::Chat, serde_json::json!({"model": "m", "messages": chat})),
                (Endpoint::Completions, serde_json::json!({"model": "m", "prompt": texts.concat()})),
                (Endpoint::Completions, serde_json::json!({"model": "m", "prompt": texts})),
            ] {
                let body = body.to_string();
                let parsed = prompt::parse(body.as_bytes(), ep).unwrap();
                let least = bound.prompt_at_least(&parsed);
                let n = t.ids(body.as_bytes(), ep, &parsed).unwrap().len() as u64;
                prop_assert!(least <= n, "bound {} > exact {} for {}", least, n, body);
            }
            let ids = br#"{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12]}"#;
            let parsed = prompt::parse(ids, Endpoint::Completions).unwrap();
            prop_assert_eq!(bound.prompt_at_least(&parsed), 0);
        }
    }

    fn templated() -> &'static ModelTokenizer {
        static T: std::sync::OnceLock<ModelTokenizer> = std::sync::OnceLock::new();
        T.get_or_init(|| {
            let dir = smollm2();
            ModelTokenizer::load(
                &dir.join("tokenizer.json"),
                Some(&dir.join("chat_template.jinja")),
            )
            .unwrap()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::tokenizer::{ENCODED, render_chat};
    use super::*;
    use serde_json::Value;

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
        // A large prompt whose parsed text alone shows it cannot fit is refused at once with
        // the 400 it deserves, not the lane's 503 (it never waits for the lane): a chat of
        // 1 MiB of digits, as issue 42's hostile clients send, and a completion.
        let digits = "7".repeat(1 << 20);
        for (ep, body) in [
            (
                Endpoint::Chat,
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": digits}]}),
            ),
            (
                Endpoint::Completions,
                serde_json::json!({"model": "m", "prompt": digits}),
            ),
        ] {
            let body = bytes::Bytes::from(body.to_string());
            let parsed = prompt::parse(&body, ep).unwrap();
            let e = rt
                .block_on(t.count_async(body, ep, &parsed, Some(32_768)))
                .unwrap_err();
            let CountError::TooLong(b) = &e else {
                panic!("{e:?}")
            };
            assert!(
                b.message.contains("at least 1048576 tokens"),
                "{}",
                b.message
            );
            assert_eq!(b.param, Some(ep.prompt_param()));
            assert_eq!(e.into_api().status.as_u16(), 400);
        }
        // Without a window (no live worker says one), the same prompt waits for the lane.
        let body =
            bytes::Bytes::from(serde_json::json!({"model": "m", "prompt": digits}).to_string());
        let parsed = prompt::parse(&body, Endpoint::Completions).unwrap();
        let e = rt
            .block_on(t.count_async(body, Endpoint::Completions, &parsed, None))
            .unwrap_err();
        assert!(matches!(e, CountError::Busy(_)), "{e:?}");
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
