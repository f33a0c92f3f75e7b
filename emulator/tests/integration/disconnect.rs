//! A client that goes away mid-request: the emulator aborts the request in its engine model at
//! once, as vLLM does, so its batch slot is free for the others (issue 13, defect 4).
//!
//! The abandoned requests are sent over raw sockets so that "the client went away" is exactly a
//! closed TCP connection, with no client library's pooling in between.

use super::{EmulatorOptions, SERIAL, client, profile, serve};
use http_body_util::{BodyExt, Full};
use routelab_emulator::{Emulator, EngineSnapshot};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Poll `cond` every 10 ms for at most `limit`; panic with `what` if it never holds.
async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An emulator serving model `m` at 10× speed.
async fn emulator() -> Emulator {
    let mut opts = EmulatorOptions::new(profile("rtx-pro-6000-27b"));
    opts.speedup = 10.0;
    opts.model = "m".into();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve(listener, opts).await.unwrap()
}

fn chat(max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "tell me everything"}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

/// Send a chat request to the emulator on a fresh connection and return the open socket.
async fn send_raw(emu: &Emulator, body: &str) -> TcpStream {
    send_raw_to(emu.local_addr(), body).await
}

/// Send a chat request to `addr` on a fresh connection and return the open socket.
async fn send_raw_to(addr: SocketAddr, body: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    tcp
}

/// Read until the first SSE data event has arrived (the response has started streaming).
async fn read_first_event(tcp: &mut TcpStream) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !String::from_utf8_lossy(&seen).contains("data: ") {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed before the first event");
            seen.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("first event within 10 s");
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

fn counts(s: &EngineSnapshot) -> (u32, u32) {
    (s.in_flight, s.streams)
}

/// Eight long streams are read to their first event and dropped, one is left running: the eight
/// leave the engine at once, the ninth completes in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_streams_leave_the_engine_and_a_running_one_completes() {
    let _serial = SERIAL.lock().await;
    let emu = emulator().await;
    const ABANDONED: usize = 8;
    // 8,000 tokens at ≤ 106 tok/s each: minutes of model time, far beyond this test
    let mut sockets = Vec::new();
    for _ in 0..ABANDONED {
        sockets.push(send_raw(&emu, &chat(8000, true)).await);
    }
    // the one that stays: 500 tokens, a few seconds of wall time at 10×
    let url = format!("{}/v1/chat/completions", emu.base_url());
    let kept = tokio::spawn(async move {
        let req = hyper::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(chat(500, true))))
            .unwrap();
        let r = client().request(req).await.unwrap();
        let status = r.status().as_u16();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    });
    for tcp in &mut sockets {
        read_first_event(tcp).await;
    }
    wait_for(
        "all nine requests in the engine",
        Duration::from_secs(10),
        || emu.snapshot().in_flight == 9,
    )
    .await;

    drop(sockets);
    wait_for(
        "the eight abandoned requests to leave the engine",
        Duration::from_secs(3),
        || counts(&emu.snapshot()) == (1, 1),
    )
    .await;
    assert_eq!(emu.snapshot().counters.aborted, ABANDONED as u64);

    let (status, text) = tokio::time::timeout(Duration::from_secs(30), kept)
        .await
        .expect("the running request ends within 30 s")
        .unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "{}",
        &text[text.len().saturating_sub(300)..]
    );
    assert!(text.contains("\"completion_tokens\":500"), "no full usage");
    let content = text.matches("\"content\":\" ").count();
    assert_eq!(content, 500, "every token of the running request arrived");
    let s = emu.snapshot();
    assert_eq!(counts(&s), (0, 0));
    assert_eq!(
        (s.counters.completed, s.counters.aborted),
        (1, ABANDONED as u64)
    );
    emu.shutdown(Duration::from_secs(1)).await;
}

/// A non-streaming request whose client closes the connection while it is generating leaves
/// the engine too; `/emulator/stats` counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_non_streaming_request_leaves_the_engine() {
    let _serial = SERIAL.lock().await;
    let emu = emulator().await;
    let tcp = send_raw(&emu, &chat(8000, false)).await;
    wait_for("the request decoding", Duration::from_secs(10), || {
        emu.snapshot().decoding == 1
    })
    .await;
    drop(tcp);
    wait_for(
        "the abandoned request to leave the engine",
        Duration::from_secs(3),
        || counts(&emu.snapshot()) == (0, 0),
    )
    .await;
    let c = client();
    let req = hyper::Request::get(format!("{}/emulator/stats", emu.base_url()))
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .unwrap()
        .unwrap();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    let stats: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (&stats["in_flight"], &stats["aborted"], &stats["completed"]),
        (
            &serde_json::json!(0),
            &serde_json::json!(1),
            &serde_json::json!(0)
        ),
        "{stats}"
    );
    emu.shutdown(Duration::from_secs(1)).await;
}

/// The reproduction: 20 clients of a gateway in front of two emulators go away
/// mid-stream; the gateway drops its upstream streams and the emulators, seeing their clients
/// go, are idle again at once instead of generating for minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_leaving_a_gateway_mid_stream_leave_the_emulators_idle() {
    let _serial = SERIAL.lock().await;
    let emus = [emulator().await, emulator().await];
    let yaml = format!(
        "listen: 127.0.0.1:0\npolicy: seed-v1\nworkers:\n{}",
        emus.iter()
            .enumerate()
            .map(|(i, e)| format!(
                "  - {{name: e{i}, base_url: {}, model: m, context_window: 32768}}\n",
                e.base_url()
            ))
            .collect::<String>()
    );
    let cfg = routelab_gateway::GatewayConfig::from_yaml(&yaml, "test.yaml").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = routelab_gateway::start_on(cfg, listener).await.unwrap();
    let mut sockets = Vec::new();
    for _ in 0..20 {
        sockets.push(send_raw_to(gw.local_addr(), &chat(8000, true)).await);
    }
    for tcp in &mut sockets {
        read_first_event(tcp).await;
    }
    let busy = || emus.iter().map(|e| e.snapshot().in_flight).sum::<u32>();
    assert_eq!(busy(), 20, "every stream is generating");
    drop(sockets);
    wait_for(
        "both emulators idle after their clients left",
        Duration::from_secs(5),
        || emus.iter().all(|e| counts(&e.snapshot()) == (0, 0)),
    )
    .await;
    let aborted: u64 = emus.iter().map(|e| e.snapshot().counters.aborted).sum();
    assert_eq!(aborted, 20);
    drop(gw);
    for e in emus {
        e.shutdown(Duration::from_secs(1)).await;
    }
}
