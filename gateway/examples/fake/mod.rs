//! What the load and soak examples share: fast fake workers (a fixed non-streaming completion,
//! a vLLM-named `/metrics` page, `/health`), their KV event publishers (the gateway's own
//! vLLM-compatible publisher) and the gateway configuration with the chosen signals on.
// Each example uses its part of it.
#![allow(dead_code)]

pub mod args;

use axum::routing::{get, post};
use routelab_gateway::kv::publisher::{self, Publisher};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub const ANSWER: &str = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}"#;

pub const METRICS: &str = "vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"0\"} 0\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.2\nvllm:generation_tokens_total{engine=\"0\"} 1000\n";

/// The request both examples send (a chat completion of the model `m`).
pub const BODY: &str = r#"{"model":"m","messages":[{"role":"system","content":"You are brief."},{"role":"user","content":"Say ok."}],"max_tokens":16}"#;

/// Which of the production signals the gateway runs with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    /// Exact prompt tokens: the model has the vendored SmolLM2 tokenizer and chat template.
    pub tokens: bool,
    /// The policy mirrors each worker's KV event stream (`prefix_knowledge: kv-events`); each
    /// fake worker publishes a 32-block batch every 10 ms.
    pub kv: bool,
    /// The gateway polls each worker's `/metrics` every second.
    pub polls: bool,
}

impl Signals {
    pub const ALL: Signals = Signals {
        tokens: true,
        kv: true,
        polls: true,
    };

    /// `all`, `none`, or a comma-separated list of `tokens`, `kv`, `polls`.
    pub fn parse(s: &str) -> Result<Signals, String> {
        match s {
            "all" => return Ok(Signals::ALL),
            "none" => return Ok(Signals::default()),
            _ => {}
        }
        let mut out = Signals::default();
        for part in s.split(',') {
            match part.trim() {
                "tokens" => out.tokens = true,
                "kv" => out.kv = true,
                "polls" => out.polls = true,
                other => {
                    return Err(format!(
                        "--signals: unknown signal `{other}` (valid: all, none, or a comma-separated list of tokens, kv, polls)"
                    ));
                }
            }
        }
        Ok(out)
    }

    pub fn describe(self) -> String {
        let on: Vec<&str> = [
            (self.tokens, "exact tokens"),
            (self.kv, "KV event streams"),
            (self.polls, "metrics polls"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| *name)
        .collect();
        if on.is_empty() {
            "off".to_string()
        } else {
            on.join(", ")
        }
    }
}

/// [`ANSWER`] streamed (what the gateway's burst probes ask for): one content event, the usage,
/// `[DONE]`.
pub const STREAMED: &str = concat!(
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1,\"total_tokens\":13}}\n\n",
    "data: [DONE]\n\n",
);

/// Start one fake worker on loopback; its base URL. It answers at once: [`ANSWER`], or
/// [`STREAMED`] to a request with `"stream":true` (so the gateway's probes succeed, as they do
/// against a healthy engine, and are not retried every minute).
pub async fn fake_worker() -> String {
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(|body: bytes::Bytes| async move {
                const STREAM: &[u8] = b"\"stream\":true";
                if body.windows(STREAM.len()).any(|w| w == STREAM) {
                    ([("content-type", "text/event-stream")], STREAMED)
                } else {
                    ([("content-type", "application/json")], ANSWER)
                }
            }),
        )
        .route("/metrics", get(|| async { METRICS }))
        .route("/health", get(|| async { "ok" }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let l = axum::serve::ListenerExt::tap_io(l, |t| {
        let _ = t.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    url
}

/// The fake fleet: `n` workers, each with a KV event publisher when `signals.kv`.
pub struct Fleet {
    pub workers: Vec<String>,
    pub publishers: Arc<Vec<Publisher>>,
}

impl Fleet {
    pub async fn start(n: usize, signals: Signals) -> Fleet {
        let mut workers = Vec::new();
        let mut publishers = Vec::new();
        for _ in 0..n {
            workers.push(fake_worker().await);
            if signals.kv {
                publishers.push(
                    publisher::start("127.0.0.1", "", publisher::DEFAULT_BUFFER)
                        .await
                        .unwrap(),
                );
            }
        }
        Fleet {
            workers,
            publishers: Arc::new(publishers),
        }
    }

    /// The gateway configuration for this fleet with `signals` on, listening on `listen`.
    pub fn config(&self, listen: &str, signals: Signals) -> String {
        let mut yaml = format!("listen: {listen}\nhealth: {{interval_s: 5}}\n");
        if signals.tokens {
            let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../data/tokenizers/smollm2-135m-instruct");
            yaml += &format!(
                "models:\n  - {{name: m, tokenizer: \"{}\", chat_template: \"{}\"}}\n",
                d.join("tokenizer.json").display(),
                d.join("chat_template.jinja").display()
            );
        }
        yaml += if signals.kv {
            "policy: probe/p2c:higher-weight/capacity/none/kv-events\n"
        } else {
            "policy: probe/p2c:higher-weight/capacity/none\n"
        };
        if signals.polls {
            yaml += "engine_metrics: {poll: on, interval_s: 1}\n";
        }
        yaml += "workers:\n";
        for (i, w) in self.workers.iter().enumerate() {
            yaml +=
                &format!("  - {{name: w{i}, base_url: \"{w}\", model: m, context_window: 32768");
            if let Some(p) = self.publishers.get(i) {
                yaml += &format!(
                    ", kv_events: {{endpoint: \"{}\", replay_endpoint: \"{}\"}}",
                    p.endpoint(),
                    p.replay_endpoint()
                );
            }
            yaml += "}\n";
        }
        yaml
    }

    /// Each worker's engine: a 512-token chain stored and evicted again, one batch every
    /// 10 ms (as an engine publishes one per step). Runs until aborted.
    pub fn publish(&self) -> tokio::task::JoinHandle<()> {
        let publishers = self.publishers.clone();
        tokio::spawn(async move {
            use routelab_gateway::kv::wire::{Batch, BlockHash, Event};
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            for round in 0u64.. {
                tick.tick().await;
                for (w, p) in publishers.iter().enumerate() {
                    let base = (round * 64 + w as u64) << 8;
                    let hashes: Vec<BlockHash> = (0..32).map(|j| BlockHash(base + j)).collect();
                    p.publish(&Batch {
                        ts: 0.0,
                        events: vec![
                            Event::BlockStored {
                                block_hashes: hashes.clone(),
                                parent: None,
                                token_ids: (0..512).map(|t| (t + round as u32) % 49_152).collect(),
                                block_size: 16,
                                lora_id: None,
                                medium: Some("GPU".into()),
                                group_idx: None,
                            },
                            Event::BlockRemoved {
                                block_hashes: hashes,
                                medium: Some("GPU".into()),
                                group_idx: None,
                            },
                        ],
                        data_parallel_rank: None,
                    });
                }
            }
        })
    }
}

/// Print the lines of the gateway's `/metrics` at `addr` that `keep` picks, one per line;
/// nothing when it does not answer (within `within`, when given: the wait for its answer's
/// head). What the soak and hostile examples show of the gateway's counters at the end.
pub async fn print_metrics(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
    addr: &str,
    within: Option<Duration>,
    keep: impl Fn(&str) -> bool,
) {
    use http_body_util::BodyExt;
    let req = hyper::Request::get(format!("http://{addr}/metrics"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("a valid request");
    let answer = match within {
        Some(t) => tokio::time::timeout(t, client.request(req))
            .await
            .ok()
            .and_then(Result::ok),
        None => client.request(req).await.ok(),
    };
    if let Some(r) = answer
        && let Ok(m) = r.into_body().collect().await
    {
        for line in String::from_utf8_lossy(&m.to_bytes())
            .lines()
            .filter(|l| keep(l))
        {
            println!("{line}");
        }
    }
}

/// A process's resident set and its peak, in KiB, and its threads (`VmRSS`, `VmHWM`,
/// `Threads` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?, field("Threads:")?))
}

/// The process named `comm` (as `/proc/<pid>/comm` has it: at most 15 bytes) among `root` and
/// its descendants.
pub fn find_process(root: u32, comm: &str) -> Option<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parent_of.push((pid, ppid));
        }
    }
    let mut family = vec![root];
    let mut i = 0;
    while i < family.len() {
        let p = family[i];
        family.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    family.into_iter().find(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == comm)
    })
}

/// Start the gateway binary `gateway` (under the command `wrap`, when given) with `config`, its
/// log written to `log`; the child, the address its `started` line names, and the process id
/// of the gateway itself (under a wrapper, the process named like the binary among the
/// command's descendants). On failure the child is killed and the error says why.
pub fn spawn_gateway(
    gateway: &Path,
    wrap: &[String],
    config: &Path,
    log: &Path,
) -> Result<(std::process::Child, String, u32), String> {
    use std::io::BufRead;
    let mut cmd = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = std::process::Command::new(program);
            c.args(args).arg(gateway);
            c
        }
        None => std::process::Command::new(gateway),
    };
    let mut child = cmd
        .arg("--config")
        .arg(config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", gateway.display()))?;
    // Its log goes to a file; the `started` line tells the address it listens on.
    let (addr_tx, addr_rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("piped");
    let mut file =
        std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    std::thread::spawn(move || {
        use std::io::Write;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("event=started")
                && let Some(a) = line
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix("listen="))
            {
                let _ = addr_tx.send(a.to_string());
            }
            let _ = writeln!(file, "{line}");
        }
    });
    let Ok(addr) = addr_rx.recv_timeout(Duration::from_secs(60)) else {
        let _ = child.kill();
        return Err(format!(
            "the gateway did not start within 60 s; its log: {}",
            log.display()
        ));
    };
    let comm: String = gateway
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("routelab-gateway")
        .chars()
        .take(15)
        .collect();
    let Some(pid) = find_process(child.id(), &comm) else {
        let _ = child.kill();
        return Err(format!(
            "no process named {comm} under the gateway's command"
        ));
    };
    Ok((child, addr, pid))
}
