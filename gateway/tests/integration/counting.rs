//! The counting lanes under load: what the bytes alone refuse never waits for a lane.

use crate::fake::FakeWorker;
use crate::harness::*;
use hyper::{Method, StatusCode};
use std::time::Duration;

/// A gateway whose model `m` has SmolLM2's tokenizer and chat template and a 32k window.
async fn counted_gateway(w: &FakeWorker) -> Gateway {
    let d = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../data/tokenizers/smollm2-135m-instruct");
    let models = format!(
        "health: {{interval_s: 0}}\nmodels:\n  - {{name: m, tokenizer: \"{}\", chat_template: \"{}\"}}",
        d.join("tokenizer.json").display(),
        d.join("chat_template.jinja").display(),
    );
    serve("seed-v3", &models, &[worker("w", &w.url, "m", &[], 32_768)]).await
}

/// Words of pseudo-random letters (the tokenizer's word cache cannot shortcut them): slow to
/// count, and their bytes do not show that they exceed the window.
fn letters(bytes: usize, seed: u64) -> String {
    let mut x = seed | 1;
    let mut out = String::with_capacity(bytes + 16);
    while out.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = 2 + (x % 9) as usize;
        for i in 0..len {
            out.push(char::from(b'a' + ((x >> (5 * i)) % 26) as u8));
        }
        out.push(' ');
    }
    out
}

/// Issue 42's hostile run: 32 % of the 1 MiB digit prompts got 503 `counting_busy`, because
/// the bound that proves them too long ran only on the large lane, behind its queue of 2. With
/// that lane taken and its queue full (large prompts of letters, which must be counted; one
/// of them refused 503 shows it), each 1 MiB digit prompt is still a 400
/// `context_length_exceeded`, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_its_bytes_prove_too_long_is_a_400_whatever_the_lanes_load() {
    let w = FakeWorker::start(0.0).await;
    let gateway = counted_gateway(&w).await;
    let Gateway { chat, .. } = &gateway;
    // One large-lane thread on 2 cores, two places in its queue: six fillers over-fill it.
    let fillers: Vec<_> = (0..6)
        .map(|i| {
            let (chat, body) = (
                chat.clone(),
                chat_body("m", &letters(768 << 10, i + 1), 4, false),
            );
            tokio::spawn(async move {
                send(&client(), Method::POST, &chat, None, body)
                    .await
                    .status
            })
        })
        .collect();
    let mut fillers = fillers;
    let mut refused = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while refused == 0 && std::time::Instant::now() < deadline {
        let mut left = Vec::new();
        for f in fillers {
            if f.is_finished() {
                let status = f.await.unwrap();
                refused += usize::from(status == StatusCode::SERVICE_UNAVAILABLE);
            } else {
                left.push(f);
            }
        }
        fillers = left;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(refused > 0, "the large lane was never full");
    assert!(
        !fillers.is_empty(),
        "the fillers were all done before the test"
    );
    let digits = "7".repeat(1 << 20);
    let started = std::time::Instant::now();
    let answers = futures_join(
        (0..4)
            .map(|_| {
                let (chat, body) = (chat.clone(), chat_body("m", &digits, 4, false));
                tokio::spawn(async move { send(&client(), Method::POST, &chat, None, body).await })
            })
            .collect(),
    )
    .await;
    for a in &answers {
        let e = assert_openai_error(a, 400);
        assert_eq!(e["code"], "context_length_exceeded", "{e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("at least 1048576 tokens"),
            "{e}"
        );
    }
    // Still counting the letters: the refusals did not wait for the lane.
    assert!(
        fillers.iter().any(|f| !f.is_finished()),
        "the lane emptied while the digits waited ({:?})",
        started.elapsed()
    );
    for f in fillers {
        let _ = f.await;
    }
    assert_eq!(w.requests(), 0, "nothing reached the worker");
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<Answer>>) -> Vec<Answer> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}
