//! Streamed answers (SSE): the scan that counts a stream's events and picks up its final
//! usage, the body that passes a worker's stream through frame by frame, and the output tokens
//! of a buffered answer.

use super::flight::Flight;
use super::relay::{StallTimer, stalled};
use crate::error::ApiError;
use crate::prompt;
use crate::reqlog::LogStatus;
use crate::upstream::error_chain;
use bytes::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use serde::Deserialize;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

#[derive(Deserialize)]
struct UsageOnly {
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    completion_tokens: Option<u32>,
    #[serde(default)]
    prompt_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct ChoicesOnly {
    #[serde(default)]
    choices: Vec<serde_json::Value>,
}

/// A non-streaming response's `usage.completion_tokens`.
fn usage_tokens(body: &[u8]) -> Option<u32> {
    match serde_json::from_slice(body) {
        Ok(UsageOnly {
            usage:
                Some(Usage {
                    completion_tokens: Some(n),
                    ..
                }),
        }) => Some(n),
        _ => None,
    }
}

/// Output tokens of a non-streaming response: `usage.completion_tokens`, else the text's
/// bytes / 4.
pub(super) fn output_tokens_of_json(body: &[u8]) -> u32 {
    if let Some(n) = usage_tokens(body) {
        return n;
    }
    let Ok(c) = serde_json::from_slice::<ChoicesOnly>(body) else {
        return 0;
    };
    let bytes: usize = c
        .choices
        .iter()
        .map(|ch| {
            ch.get("text")
                .or_else(|| ch.get("message").and_then(|m| m.get("content")))
                .and_then(serde_json::Value::as_str)
                .map_or(0, str::len)
        })
        .sum();
    prompt::estimate_tokens(bytes)
}

/// Counts SSE `data:` events and content events, and picks up a final `usage`.
#[derive(Debug, Default)]
pub(crate) struct SseScan {
    carry: Vec<u8>,
    data_events: u32,
    /// Events that carry output text (one token each, as engines stream).
    content_events: u32,
    usage: Option<u32>,
    /// The final usage's `prompt_tokens`, if it had one.
    usage_prompt: Option<u32>,
    /// The stream's `data: [DONE]` passed.
    done: bool,
}

/// True if an SSE `data:` payload carries output text: a non-empty `"content"` (chat) or
/// `"text"` (completions) string, compact or with spaces after the colon (as Python's `json`
/// writes it). Recognised without a JSON parse: content events are the bulk of a stream.
pub fn is_content_event(payload: &[u8]) -> bool {
    [&b"\"content\":"[..], &b"\"text\":"[..]].iter().any(|key| {
        payload
            .windows(key.len())
            .position(|w| w == *key)
            .is_some_and(|i| {
                let mut rest = payload[i + key.len()..]
                    .iter()
                    .skip_while(|b| b.is_ascii_whitespace());
                rest.next() == Some(&b'"') && rest.next().is_some_and(|&b| b != b'"')
            })
    })
}

/// Longest partial line kept between chunks.
const MAX_CARRY: usize = 1 << 20;

impl SseScan {
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while let Some(pos) = chunk.iter().position(|&b| b == b'\n') {
            if self.carry.is_empty() {
                self.line(&chunk[..pos]);
            } else {
                let mut line = std::mem::take(&mut self.carry);
                line.extend_from_slice(&chunk[..pos]);
                self.line(&line);
                line.clear();
                self.carry = line;
            }
            chunk = &chunk[pos + 1..];
        }
        if self.carry.len() + chunk.len() <= MAX_CARRY {
            self.carry.extend_from_slice(chunk);
        } else {
            self.carry.clear();
        }
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(payload) = line.strip_prefix(b"data:") else {
            return;
        };
        let payload = payload.trim_ascii();
        if payload == b"[DONE]" {
            self.done = true;
            return;
        }
        self.data_events += 1;
        if is_content_event(payload) {
            self.content_events += 1;
        }
        if payload
            .windows(b"\"completion_tokens\"".len())
            .any(|w| w == b"\"completion_tokens\"")
            && let Ok(UsageOnly {
                usage:
                    Some(Usage {
                        completion_tokens: Some(n),
                        prompt_tokens,
                    }),
            }) = serde_json::from_slice(payload)
        {
            self.usage = Some(n);
            self.usage_prompt = prompt_tokens;
        }
    }

    /// Events that carried output text so far (one token each, as engines stream).
    pub(crate) fn content_events(&self) -> u32 {
        self.content_events
    }

    /// Whether the stream's `data: [DONE]` passed.
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// The final `usage.completion_tokens` if the stream had one, else the data events.
    pub fn output_tokens(&self) -> u32 {
        self.usage.unwrap_or(self.data_events)
    }

    /// The final `usage.prompt_tokens` if the stream had one (the engine's own count).
    pub(crate) fn prompt_tokens(&self) -> Option<u32> {
        self.usage_prompt
    }

    /// The request log's output tokens: the final usage, else the content events, else (no
    /// event came) none.
    pub fn logged_output(&self) -> Option<u32> {
        self.usage
            .or((self.data_events > 0).then_some(self.content_events))
    }
}

/// A worker's SSE stream, passed through frame by frame as it arrives. The first frame is the
/// request's first token for the router; the end completes it; a broken or stalled upstream
/// stream ends with an SSE error event (`data: {"error": {...}}`), never a silent truncation
/// nor a client left waiting. Dropped early (client gone), it frees the worker's slot and the
/// upstream connection closes.
pub(super) struct SseBody {
    inner: Incoming,
    flight: Flight,
    scan: SseScan,
    done: bool,
    stall: StallTimer,
    /// The drain deadline ([`crate::drain`]).
    drain: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl SseBody {
    /// The worker's stream `inner`, for `flight`, timed by `stall`.
    pub(super) fn new(inner: Incoming, flight: Flight, stall: StallTimer) -> SseBody {
        SseBody {
            drain: flight.shared.drain.reached(),
            inner,
            flight,
            scan: SseScan::default(),
            done: false,
            stall,
        }
    }
}

impl http_body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.drain.as_mut().poll(cx).is_ready() {
            // The shutdown's drain deadline: the gateway ends the stream, not the worker nor
            // the client; the client hears why before its connection closes.
            this.done = true;
            this.flight
                .log_end(LogStatus::DrainCut, this.scan.logged_output());
            this.flight.abandon();
            let err = ApiError::shutting_down(
                "the gateway is shutting down: the stream was cut at its drain deadline (server.drain_timeout_s)",
            );
            return Poll::Ready(Some(Ok(Frame::data(err.sse_event()))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this.stall.poll_stalled(cx).is_pending() {
                    return Poll::Pending;
                }
                // The worker went silent: the request failed (slot freed, health told), and
                // the client hears so now rather than waiting for a worker that may never
                // send again. Ending the body drops the upstream connection.
                this.done = true;
                this.flight
                    .log_end(LogStatus::Timeout, this.scan.logged_output());
                this.flight.fail(false);
                let err = stalled(
                    &this.flight.name,
                    this.stall.idle,
                    this.flight.first_token_at.is_some(),
                );
                Poll::Ready(Some(Ok(Frame::data(err.sse_event()))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref()
                    && !d.is_empty()
                {
                    this.flight.first_byte();
                    let before = this.scan.content_events;
                    this.scan.feed(d);
                    this.flight.tokens(this.scan.content_events - before);
                    this.stall.chunk();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.done = true;
                this.flight
                    .log_end(LogStatus::UpstreamError, this.scan.logged_output());
                this.flight.fail(false);
                let chain = error_chain(&e);
                crate::logging::log(
                    "stream_broken",
                    &[("worker", &this.flight.name), ("error", &chain)],
                );
                let err = ApiError::upstream(format!(
                    "the worker's stream broke after the first byte: {chain}"
                ));
                Poll::Ready(Some(Ok(Frame::data(err.sse_event()))))
            }
            Poll::Ready(None) => {
                this.done = true;
                this.flight
                    .complete(this.scan.output_tokens(), this.scan.logged_output());
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

impl Drop for SseBody {
    /// Dropped before the worker's body ended. After `data: [DONE]` passed, the response was
    /// whole (a client may close as soon as it reads `[DONE]`, before the body's end is
    /// polled): it completed. Before, the client went away mid-stream; the log keeps what it
    /// got.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.scan.done {
            self.flight
                .complete(self.scan.output_tokens(), self.scan.logged_output());
        } else {
            self.flight
                .log_end(LogStatus::ClientGone, self.scan.logged_output());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_scan_counts_events_across_chunk_boundaries() {
        let mut s = SseScan::default();
        s.feed(b"data: {\"a\":1}\n\ndata: {\"b\"");
        s.feed(b":2}\n\nda");
        s.feed(b"ta: [DONE]\n\n");
        assert_eq!(s.output_tokens(), 2);
        s.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":17}}\r\n\r\n");
        assert_eq!(s.output_tokens(), 17);
    }

    /// Content events are the ones with output text: not a chat stream's role event (empty
    /// content), its finish event, nor the usage event.
    #[test]
    fn sse_scan_counts_content_events_for_the_log_and_the_curve() {
        let mut s = SseScan::default();
        assert_eq!(s.logged_output(), None);
        s.feed(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
        assert_eq!(s.logged_output(), Some(0));
        s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\" sea\"}}]}\n\ndata: {\"choices\":[{\"text\":\" sky\"}]}\n\n");
        s.feed(b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n");
        assert_eq!((s.content_events, s.data_events), (2, 4));
        assert_eq!(s.logged_output(), Some(2));
        s.feed(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":9}}\n\n");
        assert_eq!(s.logged_output(), Some(9));
        assert!(!s.done);
        s.feed(b"data: [DONE]\n\n");
        assert!(s.done);
        assert!(!is_content_event(br#"{"choices":[{"text":""}]}"#));
        // Spaces after the colon (Python's json) count the same; an empty string still not.
        assert!(is_content_event(
            br#"{"choices": [{"delta": {"content": " sea"}}]}"#
        ));
        assert!(!is_content_event(
            br#"{"choices": [{"delta": {"content": ""}}]}"#
        ));
        assert!(!is_content_event(
            br#"{"choices": [{"delta": {"content": null}}]}"#
        ));
    }

    #[test]
    fn json_output_tokens() {
        assert_eq!(
            output_tokens_of_json(br#"{"usage":{"completion_tokens":9}}"#),
            9
        );
        assert_eq!(
            output_tokens_of_json(br#"{"choices":[{"message":{"content":"12345678"}}]}"#),
            2
        );
        assert_eq!(output_tokens_of_json(b"nope"), 0);
    }
}
