//! Issue 42's hostile engine side: a KV-event peer that announces a 2^61-byte frame or an
//! endless multipart message, a sequence that goes backwards, a replay socket that never sends
//! its end marker, and a tokenizer-backed model sent a prompt that cannot fit its window. Each
//! is the probe's input; each must be refused, counted and visible, and the gateway must keep
//! serving.

use crate::harness::*;
use hyper::Method;
use routelab_gateway::kv::wire::{self, Batch, BlockHash, Event};
use routelab_gateway::tokens::byte_tokens;
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Accept one ZMTP 3.0 connection as a `kind` socket (`PUB`, `ROUTER`): greetings, READY both
/// ways. Written from RFC 23's facts, as a hostile engine would.
async fn zmtp_accept(l: &TcpListener, kind: &[u8]) -> TcpStream {
    let (mut s, _) = l.accept().await.unwrap();
    let mut g = [0u8; 64];
    s.read_exact(&mut g).await.unwrap();
    let mut mine = [0u8; 64];
    mine[0] = 0xFF;
    mine[9] = 0x7F;
    mine[10] = 3;
    mine[12..16].copy_from_slice(b"NULL");
    mine[32] = 1;
    s.write_all(&mine).await.unwrap();
    let mut body = vec![5u8];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(kind.len() as u32).to_be_bytes());
    body.extend_from_slice(kind);
    s.write_all(&[0x04, body.len() as u8]).await.unwrap();
    s.write_all(&body).await.unwrap();
    // Their READY (a short command).
    let (flags, _) = read_frame(&mut s).await;
    assert_eq!(flags & 0x04, 0x04, "the subscriber's READY first");
    s
}

async fn read_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let flags = s.read_u8().await.unwrap();
    let len = if flags & 0x02 != 0 {
        s.read_u64().await.unwrap()
    } else {
        u64::from(s.read_u8().await.unwrap())
    };
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await.unwrap();
    (flags, body)
}

fn frame(more: bool, body: &[u8]) -> Vec<u8> {
    let mut v = vec![u8::from(more) | 0x02];
    v.extend_from_slice(&(body.len() as u64).to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// `[topic, seq, payload]` as vLLM's PUB socket sends it.
fn batch_message(seq: i64, payload: &[u8]) -> Vec<u8> {
    let mut v = frame(true, b"");
    v.extend(frame(true, &seq.to_be_bytes()));
    v.extend(frame(false, payload));
    v
}

/// A PUB socket that, on every connection, takes the subscription and then runs `then`.
async fn hostile_pub<F, Fut>(then: F) -> String
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let mut s = zmtp_accept(&l, b"PUB").await;
            let (_, sub) = read_frame(&mut s).await;
            assert_eq!(sub.first(), Some(&1), "a subscription message");
            then(s).await;
        }
    });
    endpoint
}

fn kv_worker(name: &str, url: &str, endpoint: &str, replay: Option<&str>) -> String {
    let mut w = worker(name, url, "m", &[], 65536);
    w.push_str(&format!(
        "    kv_events: {{endpoint: \"{endpoint}\"{}, heartbeat_s: 0.1}}\n",
        replay.map_or(String::new(), |r| format!(", replay_endpoint: \"{r}\""))
    ));
    w
}

async fn kv(c: &HttpClient, base: &str) -> Value {
    admin_worker(c, base, "a").await["signals"]["kv_events"].clone()
}

async fn metrics(c: &HttpClient, base: &str) -> String {
    send(c, Method::GET, &format!("{base}/metrics"), None, "")
        .await
        .text()
}

/// The gateway still answers a request (the process did not abort).
async fn still_serving(c: &HttpClient, base: &str) {
    let body = serde_json::json!({"model": "m", "prompt": "hi", "max_tokens": 1}).to_string();
    let r = send(
        c,
        Method::POST,
        &format!("{base}/v1/completions"),
        None,
        body,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Defect 1 (critical): a peer that completes the handshake and announces a 2^61-byte frame
/// aborted the process (`memory allocation failed` in the ZeroMQ codec). Now the frame header
/// alone is refused, the session ends, the refusal is counted, and the gateway serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_announcing_two_to_the_61_bytes_is_refused_and_counted() {
    let endpoint = hostile_pub(|mut s| async move {
        let mut header = vec![0x02u8];
        header.extend_from_slice(&(1u64 << 61).to_be_bytes());
        let _ = s.write_all(&header).await;
        // Hold the connection: the refusal must come from the header alone.
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let [a] = fakes(0.0).await;
    let gateway = serve(
        "equal/p2c/raw/none/kv-events",
        "",
        &[kv_worker("a", &a.url, &endpoint, None)],
    )
    .await;
    let Gateway { base, c, .. } = &gateway;
    wait_for("a refusal", Duration::from_secs(15), async || {
        let st = kv(c, base).await;
        st["refused"].as_u64().unwrap_or(0) >= 1
            && st["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("refused"))
    })
    .await;
    let st = kv(c, base).await;
    assert!(
        st["last_error"]
            .as_str()
            .unwrap()
            .contains("refused a ZMTP frame of 2305843009213693952 bytes"),
        "{st}"
    );
    let m = metrics(c, base).await;
    assert!(
        m.contains("routelab_worker_kv_events_refused_total{worker=\"a\",model=\"m\"} "),
        "{m}"
    );
    still_serving(c, base).await;
}

/// Defect 3: an endless multipart message (1 MiB frames, MORE set) grew memory without bound
/// while the stream read `live`. Now the message is refused at its limit (16 MiB) and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_multipart_message_is_refused_at_the_message_limit() {
    let endpoint = hostile_pub(|mut s| async move {
        let f = frame(true, &vec![7u8; 1 << 20]);
        // 64 MiB at most per connection, four times the limit.
        for _ in 0..64 {
            if s.write_all(&f).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let [a] = fakes(0.0).await;
    let gateway = serve(
        "equal/p2c/raw/none/kv-events",
        "",
        &[kv_worker("a", &a.url, &endpoint, None)],
    )
    .await;
    let Gateway { base, c, .. } = &gateway;
    wait_for("a refusal", Duration::from_secs(15), async || {
        let st = kv(c, base).await;
        st["refused"].as_u64().unwrap_or(0) >= 1
            && st["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("refused"))
    })
    .await;
    let st = kv(c, base).await;
    assert!(
        st["last_error"]
            .as_str()
            .unwrap()
            .contains("refused a ZMTP message of more than 16777216 bytes"),
        "{st}"
    );
    still_serving(c, base).await;
}

/// A batch that stores the first router block (512 byte tokens) of `prompt` on the engine.
fn stores_first_block_of(prompt: &str) -> Vec<u8> {
    let ids = byte_tokens(&prompt.as_bytes()[..2048]);
    wire::encode(&Batch {
        ts: 0.0,
        events: vec![Event::BlockStored {
            block_hashes: (1..=32).map(BlockHash).collect(),
            parent: None,
            token_ids: ids,
            block_size: 16,
            lora_id: None,
            medium: Some("GPU".into()),
            group_idx: None,
        }],
        data_parallel_rank: None,
    })
}

fn empty_batch() -> Vec<u8> {
    wire::encode(&Batch {
        ts: 0.0,
        events: vec![],
        data_parallel_rank: None,
    })
}

/// Defect 4: a sequence that goes backwards (an engine restart without a replay endpoint:
/// numbers start at 0 again; or a batch at `i64::MAX`, after which the next replay asked from
/// `i64::MIN`) froze the mirror: every later batch was dropped as applied and the dead engine's
/// blocks were still believed. Now it is a new stream: the mirror is cleared, counted
/// (`resets`), and the new engine's batches apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_that_goes_backwards_starts_a_new_stream() {
    let prompt = "x".repeat(2100);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
    let endpoint = hostile_pub(move |mut s| {
        let rx = rx.clone();
        async move {
            while let Some(m) = rx.lock().await.recv().await {
                if s.write_all(&m).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let [a] = fakes(0.0).await;
    let gateway = serve(
        "equal/p2c/raw/none/kv-events",
        "",
        &[kv_worker("a", &a.url, &endpoint, None)],
    )
    .await;
    let Gateway { base, c, .. } = &gateway;
    wait_for("live", Duration::from_secs(10), async || {
        kv(c, base).await["state"] == "live"
    })
    .await;
    let url = format!("{base}/v1/completions");
    let body = serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 1}).to_string();
    let believed = async || {
        let r = send(c, Method::POST, &url, None, body.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.headers[routelab_gateway::proxy::BELIEVED_CACHED_HEADER]
            .to_str()
            .unwrap()
            .to_string()
    };
    // The old engine stores the prompt's block at sequence 5.
    tx.send(batch_message(5, &stores_first_block_of(&prompt)))
        .unwrap();
    wait_for("batch 5", Duration::from_secs(10), async || {
        kv(c, base).await["last_seq"] == 5
    })
    .await;
    assert_eq!(believed().await, "512");
    // It restarts: its sequence starts at 0 again, with an empty cache.
    tx.send(batch_message(0, &empty_batch())).unwrap();
    wait_for("the reset", Duration::from_secs(10), async || {
        kv(c, base).await["resets"] == 1
    })
    .await;
    let st = kv(c, base).await;
    assert_eq!(
        (st["last_seq"].as_i64(), st["state"].as_str()),
        (Some(0), Some("live")),
        "{st}"
    );
    assert_eq!(
        believed().await,
        "0",
        "the dead engine's block is forgotten"
    );
    // A batch at i64::MAX, then the engine counts from 0 again: nothing overflows, and the
    // new engine's block is believed (it was dropped as "already applied" before).
    tx.send(batch_message(i64::MAX, &empty_batch())).unwrap();
    wait_for("batch i64::MAX", Duration::from_secs(10), async || {
        kv(c, base).await["last_seq"] == i64::MAX
    })
    .await;
    tx.send(batch_message(0, &stores_first_block_of(&prompt)))
        .unwrap();
    wait_for("the second reset", Duration::from_secs(10), async || {
        kv(c, base).await["resets"] == 2
    })
    .await;
    wait_for("batch 0 applied", Duration::from_secs(10), async || {
        kv(c, base).await["last_seq"] == 0
    })
    .await;
    assert_eq!(believed().await, "512");
    let m = metrics(c, base).await;
    assert!(
        m.contains("routelab_worker_kv_events_resets_total{worker=\"a\",model=\"m\"} 2"),
        "{m}"
    );
}

/// Defect 8: a replay socket that answers forever without its end marker held the live stream
/// (not read meanwhile) while the stream said `live`. Now a replay has a total deadline (ten
/// heartbeats, at least 2 s): the stream goes down saying why, and reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_without_an_end_marker_ends_at_its_deadline() {
    let endpoint = hostile_pub(|_s| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
    })
    .await;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let replay = format!("tcp://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let mut s = zmtp_accept(&l, b"ROUTER").await;
            tokio::spawn(async move {
                // Whatever is asked, answer batch 0 again and again, never the end marker.
                let mut m = frame(true, b"");
                m.extend_from_slice(&batch_message(0, &empty_batch())[9..]);
                loop {
                    if s.write_all(&m).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
        }
    });
    let [a] = fakes(0.0).await;
    let gateway = serve(
        "equal/p2c/raw/none/kv-events",
        "",
        &[kv_worker("a", &a.url, &endpoint, Some(&replay))],
    )
    .await;
    let Gateway { base, c, .. } = &gateway;
    wait_for(
        "the replay's deadline",
        Duration::from_secs(20),
        async || {
            kv(c, base).await["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("the replay did not end within"))
        },
    )
    .await;
    still_serving(c, base).await;
}
