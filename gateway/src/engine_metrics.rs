//! Engine load figures from a worker's Prometheus `/metrics`, for the rules that read engine
//! reports (`least-load`): vLLM's, SGLang's and llama.cpp's names, read into the policy crate's
//! [`EngineReport`] the simulator feeds the same rules.
//!
//! | report field | vLLM | SGLang | llama.cpp |
//! |---|---|---|---|
//! | KV in use (fraction) | `vllm:kv_cache_usage_perc` (before 0.10: `vllm:gpu_cache_usage_perc`) | `sglang:token_usage` | `llamacpp:kv_cache_usage_ratio` when present, else 0 |
//! | running tokens | KV in use × the worker's `cache_tokens`; without it running requests × mean prompt | `sglang:num_used_tokens` | KV in use × `cache_tokens`; else running × mean prompt |
//! | queued prompt tokens | `vllm:num_requests_waiting` × mean prompt | `sglang:num_queue_reqs` × mean prompt | `llamacpp:requests_deferred` × mean prompt |
//! | generation tok/s | per-request decode speed × running requests: Δ(`vllm:request_generation_tokens_sum` − `_count`) ÷ Δ `vllm:request_decode_time_seconds_sum`; without them Δ `vllm:generation_tokens_total` ÷ Δt | `sglang:gen_throughput` | Δ `llamacpp:tokens_predicted_total` ÷ Δ `llamacpp:tokens_predicted_seconds_total` × `requests_processing` |
//!
//! Running requests are `vllm:num_requests_running`, `sglang:num_running_reqs`,
//! `llamacpp:requests_processing`. The mean prompt is Δ prompt tokens ÷ Δ requests between polls
//! (`vllm:request_prompt_tokens_sum` / `_count`; `sglang:prompt_tokens_total` /
//! `sglang:num_requests_total`; `llamacpp:prompt_tokens_total` over `llamacpp:n_decode_total`
//! is not a request count, so llama.cpp's mean prompt is the lifetime `prompt_tokens_total` ÷
//! the gateway's own count of requests sent), or the lifetime mean before two polls, or, before
//! the engine has finished any request, the mean prompt the gateway itself sent the worker (a
//! queue behind the first requests is not empty for want of a finished one). Families
//! with several series (one per engine or model label) are summed; gauges that are fractions
//! are averaged. Δt is policy time, so an emulation at `clock_scale: K` reads model-time rates.

use routelab_policies::EngineReport;
use std::collections::HashMap;

/// Which engine's names a `/metrics` page uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// `vllm:*`
    Vllm,
    /// `sglang:*`
    Sglang,
    /// `llamacpp:*`
    Llamacpp,
}

impl Engine {
    /// The name shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Llamacpp => "llamacpp",
        }
    }
}

/// One scrape, reduced to what a report needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scrape {
    /// Whose names.
    pub engine: Engine,
    /// Requests running.
    pub running: f64,
    /// Requests waiting.
    pub waiting: f64,
    /// KV in use, 0 to 1, when the engine says.
    pub kv_used: Option<f64>,
    /// Tokens in the KV cache, when the engine says (SGLang).
    pub used_tokens: Option<f64>,
    /// Generation tok/s, when the engine says (SGLang).
    pub gen_tok_s: Option<f64>,
    /// Counter: output tokens generated.
    pub generation_total: Option<f64>,
    /// Counter: prompt tokens.
    pub prompt_total: Option<f64>,
    /// Counter: requests whose prompt was counted.
    pub requests_total: Option<f64>,
    /// Counter: tokens generated in decode steps (the first token of each request, which its
    /// prefill makes, left out where the engine says how many requests finished).
    pub decode_tokens: Option<f64>,
    /// Counter: seconds requests spent decoding (summed over requests).
    pub decode_seconds: Option<f64>,
}

/// Sum the series of each family (`name{labels} value`); comment and malformed lines are
/// skipped, as a Prometheus scraper skips what it cannot read.
fn families(text: &str) -> HashMap<&str, (f64, u32)> {
    let mut out: HashMap<&str, (f64, u32)> = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => (&line[..i], &line[i..]),
            None => continue,
        };
        let rest = match rest.strip_prefix('{') {
            Some(r) => match r.rfind('}') {
                Some(j) => &r[j + 1..],
                None => continue,
            },
            None => rest,
        };
        let Some(v) = rest.split_whitespace().next() else {
            continue;
        };
        let v = match v {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse::<f64>() {
                Ok(x) => x,
                Err(_) => continue,
            },
        };
        if !v.is_finite() {
            continue;
        }
        let e = out.entry(name).or_insert((0.0, 0));
        e.0 += v;
        e.1 += 1;
    }
    out
}

/// Read a `/metrics` page; `None` when it carries none of the three engines' names.
pub fn parse(text: &str) -> Option<Scrape> {
    let f = families(text);
    let sum = |n: &str| f.get(n).map(|&(s, _)| s);
    let mean = |n: &str| f.get(n).map(|&(s, c)| s / f64::from(c.max(1)));
    let first = |names: &[&str]| names.iter().find_map(|n| sum(n));
    if sum("vllm:num_requests_running").is_some() || sum("vllm:num_requests_waiting").is_some() {
        return Some(Scrape {
            engine: Engine::Vllm,
            running: sum("vllm:num_requests_running").unwrap_or(0.0),
            waiting: sum("vllm:num_requests_waiting").unwrap_or(0.0),
            kv_used: mean("vllm:kv_cache_usage_perc").or_else(|| mean("vllm:gpu_cache_usage_perc")),
            used_tokens: None,
            gen_tok_s: None,
            generation_total: first(&["vllm:generation_tokens_total", "vllm:generation_tokens"]),
            prompt_total: first(&["vllm:request_prompt_tokens_sum", "vllm:prompt_tokens_total"]),
            requests_total: sum("vllm:request_prompt_tokens_count"),
            decode_tokens: match (
                sum("vllm:request_generation_tokens_sum"),
                sum("vllm:request_generation_tokens_count"),
            ) {
                (Some(t), Some(n)) => Some(t - n),
                _ => None,
            },
            decode_seconds: sum("vllm:request_decode_time_seconds_sum"),
        });
    }
    if sum("sglang:num_running_reqs").is_some() || sum("sglang:num_queue_reqs").is_some() {
        return Some(Scrape {
            engine: Engine::Sglang,
            running: sum("sglang:num_running_reqs").unwrap_or(0.0),
            waiting: sum("sglang:num_queue_reqs").unwrap_or(0.0),
            kv_used: mean("sglang:token_usage"),
            used_tokens: sum("sglang:num_used_tokens"),
            gen_tok_s: sum("sglang:gen_throughput"),
            generation_total: sum("sglang:generation_tokens_total"),
            prompt_total: sum("sglang:prompt_tokens_total"),
            requests_total: sum("sglang:num_requests_total"),
            decode_tokens: None,
            decode_seconds: None,
        });
    }
    if f.keys().any(|k| k.starts_with("llamacpp:")) {
        return Some(Scrape {
            engine: Engine::Llamacpp,
            running: sum("llamacpp:requests_processing").unwrap_or(0.0),
            waiting: sum("llamacpp:requests_deferred").unwrap_or(0.0),
            kv_used: mean("llamacpp:kv_cache_usage_ratio"),
            used_tokens: sum("llamacpp:kv_cache_tokens"),
            gen_tok_s: None,
            generation_total: sum("llamacpp:tokens_predicted_total"),
            prompt_total: sum("llamacpp:prompt_tokens_total"),
            requests_total: None,
            decode_tokens: sum("llamacpp:tokens_predicted_total"),
            decode_seconds: sum("llamacpp:tokens_predicted_seconds_total"),
        });
    }
    None
}

/// Most requests an engine may report running or waiting: far beyond any one engine's batch
/// and queue (vLLM's default `max_num_seqs` is 256 to 1024).
pub const MAX_REQUESTS: f64 = 1e6;
/// Most tokens an engine may report holding: beyond any accelerator's KV cache.
pub const MAX_TOKENS: f64 = 1e10;
/// Most output tokens per second an engine may report: a whole 8-GPU node is tens of
/// thousands; one sample of 1e300 used to draw all traffic and keep it.
pub const MAX_TOK_S: f64 = 1e6;
/// Largest counter value read: a counter beyond it has lost integer precision as an `f64`
/// (2^53 is about 9e15) and its differences mean nothing.
pub const MAX_COUNTER: f64 = 1e15;

/// A figure on an engine's page that no engine can report: the page is not used (a failed
/// poll, counted and shown with this message), so the router keeps the last plausible report
/// until it ages out.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("implausible {field} = {value} (valid: {valid})")]
pub struct Implausible {
    /// What the figure is (its role in the report; the engine's name for it is in the table
    /// above).
    pub field: &'static str,
    /// As read (a sum over the family's series).
    pub value: f64,
    /// The range accepted.
    pub valid: &'static str,
}

/// Check every figure of a scrape against what an engine can report ([`Implausible`]).
pub fn check(sc: &Scrape) -> Result<(), Implausible> {
    let within = |field: &'static str, v: Option<f64>, max: f64, valid: &'static str| match v {
        Some(value) if !(0.0..=max).contains(&value) => Err(Implausible {
            field,
            value,
            valid,
        }),
        _ => Ok(()),
    };
    within(
        "running requests",
        Some(sc.running),
        MAX_REQUESTS,
        "0 to 1e6",
    )?;
    within(
        "waiting requests",
        Some(sc.waiting),
        MAX_REQUESTS,
        "0 to 1e6",
    )?;
    // A fraction averaged over series; a little above 1 is rounding, far above is not.
    within("KV cache usage", sc.kv_used, 1.01, "a fraction, 0 to 1")?;
    within("KV cache tokens", sc.used_tokens, MAX_TOKENS, "0 to 1e10")?;
    within(
        "generation throughput",
        sc.gen_tok_s,
        MAX_TOK_S,
        "0 to 1e6 tokens/s",
    )?;
    for (field, v) in [
        ("generated tokens counter", sc.generation_total),
        ("prompt tokens counter", sc.prompt_total),
        ("requests counter", sc.requests_total),
        ("decode tokens counter", sc.decode_tokens),
        ("decode seconds counter", sc.decode_seconds),
    ] {
        within(field, v, MAX_COUNTER, "0 to 1e15")?;
    }
    Ok(())
}

/// What the gateway has sent a worker so far, as it stood when the poll was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sent {
    /// Requests (llama.cpp's mean prompt divides the engine's prompt tokens by it).
    pub requests: u64,
    /// Their prompt tokens (the mean prompt before the engine has finished any request).
    pub prompt_tokens: u64,
}

/// Turn a scrape (and the one before it, `prev_s` seconds of policy time earlier) into a
/// report. `cache_tokens`: the worker's configured KV cache size; `sent`: what the gateway has
/// sent the worker.
pub fn report(
    now: &Scrape,
    prev: Option<(&Scrape, f64)>,
    cache_tokens: Option<u64>,
    sent: Sent,
) -> EngineReport {
    let delta = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if a >= b => Some(a - b),
        _ => None, // absent, or a counter reset (engine restart)
    };
    let mean_prompt = {
        let windowed = prev.and_then(|(p, _)| {
            let dt = delta(now.prompt_total, p.prompt_total)?;
            let dn = delta(now.requests_total, p.requests_total)?;
            (dn > 0.0).then(|| dt / dn)
        });
        let lifetime_requests = now
            .requests_total
            .or((sent.requests > 0).then_some(sent.requests as f64));
        windowed
            .or_else(|| {
                let n = lifetime_requests.filter(|&n| n > 0.0)?;
                Some(now.prompt_total? / n)
            })
            // No request finished yet (the engine's counters are 0): what the gateway sent.
            .filter(|&m| m > 0.0)
            .or_else(|| {
                (sent.requests > 0).then(|| sent.prompt_tokens as f64 / sent.requests as f64)
            })
    }
    .unwrap_or(0.0);
    let kv = now.kv_used.unwrap_or(0.0).clamp(0.0, 1.0);
    let running_tokens = match (now.used_tokens, cache_tokens) {
        (Some(t), _) => t,
        (None, Some(c)) if now.kv_used.is_some() => kv * c as f64,
        _ => now.running * mean_prompt,
    };
    // The aggregate rate while generating, as the simulator reports it (per-request decode
    // speed × sequences decoding): a per-request speed from the decode counters (over the
    // window, else over the engine's life) times the requests running. Without decode counters,
    // the output counter's rate over the window (which an idle stretch lowers).
    let per_request = {
        let windowed = prev.and_then(|(p, _)| {
            let t = delta(now.decode_tokens, p.decode_tokens)?;
            let s = delta(now.decode_seconds, p.decode_seconds)?;
            (s > 0.0).then(|| t / s)
        });
        windowed.or_else(|| {
            let s = now.decode_seconds.filter(|&s| s > 0.0)?;
            Some(now.decode_tokens? / s)
        })
    };
    let generation_tok_s = now.gen_tok_s.unwrap_or_else(|| match per_request {
        Some(v) => v * now.running,
        None => prev
            .and_then(|(p, dt_s)| {
                let d = delta(now.generation_total, p.generation_total)?;
                (dt_s > 0.0).then(|| d / dt_s)
            })
            .unwrap_or(0.0),
    });
    // Products and ratios of plausible figures may still not be (a rate over a window of a
    // microsecond): tokens are held to what an engine can hold, and a rate beyond any engine's
    // is no rate (0: the router keeps its last plausible one).
    let tokens = |x: f64| {
        if x.is_finite() {
            x.clamp(0.0, MAX_TOKENS).round() as u64
        } else {
            0
        }
    };
    EngineReport {
        kv_used_fraction: kv,
        queued_prompt_tokens: tokens(now.waiting * mean_prompt),
        running_tokens: tokens(running_tokens),
        generation_tok_s: if generation_tok_s.is_finite() && generation_tok_s <= MAX_TOK_S {
            generation_tok_s.max(0.0)
        } else {
            0.0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 5000.0
vllm:request_prompt_tokens_count{engine="0",model_name="m"} 10.0
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="m"} 10.0
"#;

    /// The probe's gauges: a waiting count of 1e30 and a throughput of 1e300 are refused as
    /// implausible (the poll fails, counted, and the last report ages out), and a report made
    /// from figures that pass is held to what an engine can hold.
    #[test]
    fn implausible_gauges_are_refused_and_reports_are_bounded() {
        let huge = VLLM.replace(
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0",
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1e30",
        );
        let e = check(&parse(&huge).unwrap()).unwrap_err();
        assert_eq!(e.field, "waiting requests");
        assert!(e.to_string().contains("1e6"), "{e}");
        let sg =
            "sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:gen_throughput 1e300\n";
        let e = check(&parse(sg).unwrap()).unwrap_err();
        assert_eq!(e.field, "generation throughput");
        let neg = "sglang:num_running_reqs -5\n";
        assert!(check(&parse(neg).unwrap()).is_err());
        assert!(check(&parse(VLLM).unwrap()).is_ok());
        // A mean prompt times a plausible queue, beyond any cache: held to MAX_TOKENS.
        let mut a = parse(VLLM).unwrap();
        a.waiting = MAX_REQUESTS;
        a.prompt_total = Some(MAX_COUNTER);
        let r = report(&a, None, None, Sent::default());
        assert_eq!(r.queued_prompt_tokens, MAX_TOKENS as u64);
        // A rate over a vanishing window is no rate.
        let b = Scrape {
            generation_total: a.generation_total.map(|g| g + 1e9),
            ..a
        };
        let mut a2 = a;
        a2.decode_tokens = None;
        let b2 = Scrape {
            decode_tokens: None,
            running: 0.0,
            ..b
        };
        let r = report(&b2, Some((&a2, 1e-6)), None, Sent::default());
        assert_eq!(r.generation_tok_s, 0.0);
    }

    #[test]
    fn vllm_names_become_a_report() {
        let a = parse(VLLM).unwrap();
        assert_eq!(
            (a.engine, a.running, a.waiting, a.kv_used),
            (Engine::Vllm, 4.0, 2.0, Some(0.25))
        );
        // First poll: lifetime mean prompt 500; KV × cache size.
        let r = report(&a, None, Some(100_000), Sent::default());
        assert_eq!(r.queued_prompt_tokens, 1000);
        assert_eq!(r.running_tokens, 25_000);
        assert_eq!(r.generation_tok_s, 0.0, "a rate needs two polls");
        let b = parse(
            &VLLM
                .replace("1000.0", "3000.0")
                .replace("5000.0", "5300.0")
                .replace(
                    "count{engine=\"0\",model_name=\"m\"} 10.0",
                    "count{engine=\"0\",model_name=\"m\"} 11.0",
                ),
        )
        .unwrap();
        let r = report(&b, Some((&a, 10.0)), None, Sent::default());
        assert_eq!(r.generation_tok_s, 200.0);
        // Windowed mean prompt 300; no cache size: running requests × mean prompt.
        assert_eq!((r.queued_prompt_tokens, r.running_tokens), (600, 1200));
    }

    #[test]
    fn vllms_rate_is_per_request_decode_speed_times_requests_running() {
        let page = |tokens: f64, n: f64, secs: f64| {
            format!(
                "vllm:num_requests_running 4\nvllm:generation_tokens_total 99999\n\
                 vllm:request_generation_tokens_sum {tokens}\nvllm:request_generation_tokens_count {n}\n\
                 vllm:request_decode_time_seconds_sum {secs}\n"
            )
        };
        // Lifetime: (1010 - 10) decode tokens over 20 s = 50 tok/s per request, x 4 running.
        let a = parse(&page(1010.0, 10.0, 20.0)).unwrap();
        assert_eq!(
            report(&a, None, None, Sent::default()).generation_tok_s,
            200.0
        );
        // Window: (2020 - 20) - (1010 - 10) = 1000 tokens over 10 s = 100 tok/s, x 4.
        let b = parse(&page(2020.0, 20.0, 30.0)).unwrap();
        assert_eq!(
            report(&b, Some((&a, 10.0)), None, Sent::default()).generation_tok_s,
            400.0
        );
    }

    #[test]
    fn sglang_and_llamacpp_names_are_read() {
        let s = parse("sglang:num_running_reqs{tp_rank=\"0\"} 5\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\nsglang:num_used_tokens 4096\nsglang:gen_throughput 812.5\n").unwrap();
        let r = report(&s, None, None, Sent::default());
        assert_eq!(s.engine, Engine::Sglang);
        assert_eq!(
            (r.kv_used_fraction, r.running_tokens, r.generation_tok_s),
            (0.5, 4096, 812.5)
        );
        let l1 = parse("llamacpp:prompt_tokens_total 900\nllamacpp:prompt_seconds_total 1.5\nllamacpp:tokens_predicted_total 100\nllamacpp:tokens_predicted_seconds_total 2\nllamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n").unwrap();
        let l2 = parse("llamacpp:prompt_tokens_total 900\nllamacpp:tokens_predicted_total 600\nllamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n").unwrap();
        let sent = Sent {
            requests: 3,
            prompt_tokens: 1_200,
        };
        let r = report(&l2, Some((&l1, 5.0)), None, sent);
        assert_eq!(l2.engine, Engine::Llamacpp);
        assert_eq!(
            (r.generation_tok_s, r.queued_prompt_tokens, r.running_tokens),
            (100.0, 300, 600)
        );
    }

    #[test]
    fn before_the_engine_finished_a_request_the_queue_is_priced_at_what_the_gateway_sent() {
        // SGLang's counters count finished requests: none yet, one waiting.
        let s = parse("sglang:num_running_reqs 2\nsglang:num_queue_reqs 1\nsglang:num_used_tokens 3000\nsglang:prompt_tokens_total 0\nsglang:num_requests_total 0\n").unwrap();
        let sent = Sent {
            requests: 3,
            prompt_tokens: 4_500,
        };
        assert_eq!(report(&s, None, None, sent).queued_prompt_tokens, 1_500);
        assert_eq!(
            report(&s, None, None, Sent::default()).queued_prompt_tokens,
            0,
            "nothing sent, nothing known"
        );
        // Once one finished, the engine's own mean.
        let t = parse("sglang:num_running_reqs 2\nsglang:num_queue_reqs 1\nsglang:prompt_tokens_total 800\nsglang:num_requests_total 1\n").unwrap();
        assert_eq!(report(&t, None, None, sent).queued_prompt_tokens, 800);
    }

    #[test]
    fn a_counter_reset_gives_no_rate_and_other_pages_are_not_engines() {
        let a = parse("vllm:num_requests_running 1\nvllm:generation_tokens_total 500\n").unwrap();
        let b = parse("vllm:num_requests_running 1\nvllm:generation_tokens_total 20\n").unwrap();
        assert_eq!(
            report(&b, Some((&a, 1.0)), None, Sent::default()).generation_tok_s,
            0.0
        );
        assert!(parse("# nothing\nprocess_cpu_seconds_total 3\nbroken{ 1\n").is_none());
        assert!(parse("").is_none());
    }
}
