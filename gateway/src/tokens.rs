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

impl ModelTokenizer {
    /// Load a tokenizer (and template). Errors say which file and why.
    pub fn load(
        tokenizer: &Path,
        chat_template: Option<&Path>,
    ) -> Result<ModelTokenizer, TokenizerError> {
        let tk = tokenizers::Tokenizer::from_file(tokenizer).map_err(|error| {
            TokenizerError::Tokenizer {
                path: tokenizer.to_path_buf(),
                error,
            }
        })?;
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
        let v: Value = serde_json::from_slice(body).map_err(|e| BadRequest {
            message: e.to_string(),
            param: None,
        })?;
        match ep {
            Endpoint::Chat => match &self.template {
                Some(env) => {
                    let text = render_chat(env, &v, &self.bos, &self.eos)?;
                    self.encode(&text, false)
                }
                None => self.encode(&parsed.prompt, false),
            },
            Endpoint::Completions => match v.get("prompt") {
                Some(Value::Array(items)) if items.iter().all(Value::is_u64) => Ok(items
                    .iter()
                    .filter_map(Value::as_u64)
                    .map(|x| u32::try_from(x).unwrap_or(u32::MAX))
                    .collect()),
                _ => self.encode(&parsed.prompt, true),
            },
        }
    }
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

/// The threads that count prompts for the request path: one per core, started at the first
/// count, ending when the last clone of the [`Tokenizers`] goes. Counts used to run on tokio's
/// blocking pool, where every count that found no idle thread started one more (up to 512): a
/// stall of a few milliseconds at 400 req/s left the pool a dozen threads larger, kept alive by
/// the next counts, each with its own glibc malloc arena holding the tokenizer's garbage, and
/// the gateway's RSS rose a step at every stall (+0.11 MiB/min over a 29-minute soak, with the
/// live heap flat). Counting is pure CPU work, so more threads than cores would not finish a
/// count any sooner; a bound on counts at once was not enough (the pool still grew, by the
/// threads that had finished a count but were not yet idle again).
#[derive(Debug)]
struct Counting {
    threads: usize,
    queue: std::sync::OnceLock<Result<std::sync::mpsc::Sender<CountJob>, String>>,
    /// The threads that ran a count (for the tests).
    #[cfg(test)]
    seen: std::sync::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
}

type CountJob = Box<dyn FnOnce() + Send>;

impl Counting {
    fn new(threads: usize) -> Counting {
        Counting {
            threads: threads.max(1),
            queue: std::sync::OnceLock::new(),
            #[cfg(test)]
            seen: Default::default(),
        }
    }

    /// Run `job` on one of the threads (started now if this is the first job); why not, if
    /// they could not be started.
    fn run(&self, job: CountJob) -> Result<(), String> {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<CountJob>();
            let rx = Arc::new(std::sync::Mutex::new(rx));
            for i in 0..self.threads {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("routelab-count-{i}"))
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
            Ok(tx)
        });
        match queue {
            Ok(tx) => tx
                .send(job)
                .map_err(|_| "the counting threads are gone".to_string()),
            Err(e) => Err(e.clone()),
        }
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
    /// threads, one per core ([`Counting`]), so it never holds one of the executor's threads;
    /// the estimate runs in place.
    pub async fn count_async(
        &self,
        body: bytes::Bytes,
        ep: Endpoint,
        parsed: &Parsed,
    ) -> Result<Counted, BadRequest> {
        let Some(t) = self.models.get(&parsed.model) else {
            return Ok(estimate(parsed));
        };
        let (t, p) = (t.clone(), parsed.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        #[cfg(test)]
        let counting = self.counting.clone();
        let job = Box::new(move || {
            // The request went away while its count waited: nothing to count for.
            if tx.is_closed() {
                return;
            }
            #[cfg(test)]
            counting
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(std::thread::current().id());
            let _ = tx.send(exact(&t, &body, ep, &p));
        });
        let failed = |why: String| BadRequest {
            message: format!("the prompt could not be tokenized: {why}"),
            param: None,
        };
        self.counting.run(job).map_err(failed)?;
        rx.await
            .unwrap_or_else(|_| Err(failed("the count panicked".to_string())))
    }
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
        // Long enough (a few ms each) that 32 counts started together overlap.
        let words = "the quick brown fox jumps over the lazy dog ".repeat(2_000);
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
                    set.spawn(async move { t.count_async(body, Endpoint::Chat, &parsed).await });
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
