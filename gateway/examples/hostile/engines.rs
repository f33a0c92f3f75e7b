//! The hostile engines: a KV event peer that speaks ZMTP by hand (so it can send what no
//! ZeroMQ library would) and `/metrics` pages that lie, hang or never end, each behind a fake
//! worker that answers the load example's completions.

use bytes::Bytes;
use routelab_gateway::kv::wire::{self, Batch, BlockHash, Event};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// ---- A hostile ZMTP 3.0 peer (ZeroMQ RFC 23), NULL mechanism, written by hand so it can
// ---- send what no conforming library would.

pub(crate) const MORE: u8 = 0x01;
pub(crate) const LONG: u8 = 0x02;
pub(crate) const COMMAND: u8 = 0x04;

pub(crate) fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[12..16].copy_from_slice(b"NULL");
    g
}

pub(crate) fn put_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() < 256 {
        out.push(flags);
        out.push(body.len() as u8);
    } else {
        out.push(flags | LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(body);
}

pub(crate) fn ready(socket_type: &[u8]) -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type);
    let mut out = Vec::new();
    put_frame(&mut out, COMMAND, &body);
    out
}

/// One frame from the gateway (its READY, its subscription, a replay request): flags and body.
pub(crate) async fn read_frame(
    s: &mut (impl AsyncReadExt + Unpin),
) -> std::io::Result<(u8, Vec<u8>)> {
    let flags = s.read_u8().await?;
    let len = if flags & LONG != 0 {
        s.read_u64().await?
    } else {
        u64::from(s.read_u8().await?)
    };
    if len > 1 << 20 {
        return Err(std::io::Error::other("frame too large for a gateway's"));
    }
    let mut body = vec![0; len as usize];
    s.read_exact(&mut body).await?;
    Ok((flags, body))
}

pub(crate) async fn handshake(s: &mut TcpStream, socket_type: &[u8]) -> std::io::Result<()> {
    s.write_all(&greeting()).await?;
    let mut g = [0u8; 64];
    s.read_exact(&mut g).await?;
    s.write_all(&ready(socket_type)).await?;
    read_frame(s).await?; // the gateway's READY
    Ok(())
}

/// A message as vLLM publishes it, `[topic, seq, payload]` with vLLM's default empty topic;
/// a replay reply has the same shape, its first frame the empty delimiter.
pub(crate) fn message(seq: i64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_frame(&mut out, MORE, b"");
    put_frame(&mut out, MORE, &seq.to_be_bytes());
    put_frame(&mut out, 0, payload);
    out
}

/// A batch storing 32 fresh blocks (512 tokens) and removing none: unique hashes from `n`.
pub(crate) fn batch(worker: u64, n: u64) -> Vec<u8> {
    let base = ((n << 4) | worker) << 8;
    wire::encode(&Batch {
        ts: 0.0,
        events: vec![Event::BlockStored {
            block_hashes: (0..32).map(|j| BlockHash(base + j)).collect(),
            parent: None,
            token_ids: (0..512).map(|t| (t + n as u32) % 49_152).collect(),
            block_size: 16,
            lora_id: None,
            medium: Some("GPU".into()),
            group_idx: None,
        }],
        data_parallel_rank: None,
    })
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum KvMode {
    HugeFrame,
    EndlessMultipart,
    Backwards,
    EndlessReplay,
}

/// The endpoints of one hostile KV peer.
pub(crate) struct KvPeer {
    pub(crate) endpoint: String,
    pub(crate) replay: Option<String>,
}

pub(crate) async fn bind() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("tcp://{}", l.local_addr().unwrap());
    (l, url)
}

/// Serve one PUB connection as `mode`; returns when the gateway goes away.
pub(crate) async fn serve_pub(mut s: TcpStream, mode: KvMode, worker: u64) -> std::io::Result<()> {
    handshake(&mut s, b"PUB").await?;
    let (mut r, mut w) = s.into_split();
    // Drain what the gateway sends (its subscription); note when it closes.
    let closed = tokio::spawn(async move {
        let mut sink = vec![0u8; 4096];
        while matches!(r.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    let result = async {
        match mode {
            KvMode::HugeFrame => {
                let mut out = vec![LONG];
                out.extend_from_slice(&(1u64 << 61).to_be_bytes());
                out.extend_from_slice(&[0u8; 64 << 10]);
                w.write_all(&out).await?;
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            KvMode::EndlessMultipart => {
                let mut first = Vec::new();
                put_frame(&mut first, MORE, b"");
                w.write_all(&first).await?;
                let mut chunk = Vec::new();
                put_frame(&mut chunk, MORE, &vec![0x5a; 1 << 20]);
                loop {
                    w.write_all(&chunk).await?;
                }
            }
            KvMode::Backwards | KvMode::EndlessReplay => {
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                for n in 0u64.. {
                    tick.tick().await;
                    let seq = match mode {
                        KvMode::Backwards if n % 1000 == 999 => i64::MAX,
                        KvMode::Backwards => (n % 300) as i64,
                        _ => 2 * n as i64 + 1,
                    };
                    w.write_all(&message(seq, &batch(worker, n))).await?;
                }
            }
        }
        Ok::<(), std::io::Error>(())
    }
    .await;
    closed.abort();
    result
}

/// Serve one replay (ROUTER) connection: answer each request with batches forever, never the
/// end marker, one every millisecond.
pub(crate) async fn serve_endless_replay(mut s: TcpStream, worker: u64) -> std::io::Result<()> {
    handshake(&mut s, b"ROUTER").await?;
    loop {
        // A request: frames up to one without MORE; its last is the start sequence.
        let mut start = 0i64;
        loop {
            let (flags, body) = read_frame(&mut s).await?;
            if let Some(seq) = wire::seq_of(&body) {
                start = seq;
            }
            if flags & MORE == 0 && flags & COMMAND == 0 {
                break;
            }
        }
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        for k in 0u64.. {
            tick.tick().await;
            let seq = start.saturating_add(k as i64);
            s.write_all(&message(seq, &batch(worker, 1 << 30 | k)))
                .await?;
        }
    }
}

pub(crate) async fn kv_peer(mode: KvMode, worker: u64) -> KvPeer {
    let (l, endpoint) = bind().await;
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(serve_pub(s, mode, worker));
        }
    });
    let replay = if matches!(mode, KvMode::EndlessReplay) {
        let (l, url) = bind().await;
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(serve_endless_replay(s, worker));
            }
        });
        Some(url)
    } else {
        None
    };
    KvPeer { endpoint, replay }
}

// ---- Hostile `/metrics` pages.

#[derive(Clone, Copy, Debug)]
pub(crate) enum MetricsMode {
    /// The fake workers' ordinary page (`--engines benign`).
    Benign,
    HugeGauges,
    HugeRate,
    Hangs,
    Endless,
}

pub(crate) async fn metrics_page(mode: MetricsMode) -> axum::response::Response {
    use axum::response::IntoResponse;
    match mode {
        MetricsMode::Benign => crate::fake::METRICS.into_response(),
        MetricsMode::HugeGauges => "vllm:num_requests_running{engine=\"0\"} 1e30\n\
             vllm:num_requests_waiting{engine=\"0\"} 1e30\n\
             vllm:kv_cache_usage_perc{engine=\"0\"} 1e30\n\
             vllm:generation_tokens_total{engine=\"0\"} 1e300\n"
            .into_response(),
        MetricsMode::HugeRate => {
            "sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:gen_throughput 1e300\n"
                .into_response()
        }
        MetricsMode::Hangs => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            "".into_response()
        }
        MetricsMode::Endless => {
            let line = "vllm:num_requests_running{engine=\"0\"} 1\n";
            let chunk = Bytes::from(line.repeat((64 << 10) / line.len()));
            let stream = futures_util::stream::unfold(chunk, |c| async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Some((Ok::<Bytes, std::io::Error>(c.clone()), c))
            });
            axum::body::Body::from_stream(stream).into_response()
        }
    }
}

/// A fake worker (the load example's answers) with a hostile `/metrics`; its base URL.
pub(crate) async fn worker(metrics: MetricsMode) -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(|body: Bytes| async move {
                const STREAM: &[u8] = b"\"stream\":true";
                if body.windows(STREAM.len()).any(|w| w == STREAM) {
                    (
                        [("content-type", "text/event-stream")],
                        crate::fake::STREAMED,
                    )
                } else {
                    ([("content-type", "application/json")], crate::fake::ANSWER)
                }
            }),
        )
        .route("/metrics", get(move || metrics_page(metrics)))
        .route("/health", get(|| async { "ok" }));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let l = axum::serve::ListenerExt::tap_io(l, |t| {
        let _ = t.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    url
}
