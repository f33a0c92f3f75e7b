//! A bounded ZMTP 3.0 client for the two sockets the KV subscriber uses: SUB on the engine's PUB
//! socket and DEALER on its ROUTER replay socket, NULL security only.
//!
//! Why not the `zeromq` crate's sockets: its codec trusts the peer's frame header and reserves
//! the announced length before a byte of the body arrived (a frame announcing 2^61 bytes aborts
//! the process with `memory allocation failed`, which no supervisor catches), and it gathers a
//! multipart message without limit (1 MiB frames with MORE set grow memory for as long as the
//! peer sends them). An engine's KV stream is input from outside the gateway, so every length it
//! announces is checked against [`Limits`] before anything is kept, and a peer that exceeds
//! them is refused: the connection is closed, the refusal counted, and the subscriber reconnects
//! as after any other failure (the fallback records dispatches meanwhile).
//!
//! The wire facts (ZeroMQ RFC 23, ZMTP 3.0): a 64-byte greeting (`0xFF`, 8 padding bytes,
//! `0x7F`, version major and minor, a 20-byte mechanism name, the as-server byte, 31 zero
//! bytes); then frames, each a flags byte (bit 0 MORE, bit 1 LONG, bit 2 COMMAND) and a size,
//! one byte or, when LONG, eight bytes in network order; the NULL mechanism's handshake is one
//! READY command each way (a name of one length byte, then properties, each a name of one
//! length byte and a value of four length bytes), `Socket-Type` among them; a SUB socket
//! subscribes with a message whose first byte is 1, followed by the topic.
//!
//! The reading half is a pure decoder ([`Decoder`]) over the bytes received so far, so reading
//! is cancel-safe (every partial frame lives in the decoder, none in a future) and the decoder
//! can be checked over arbitrary input without a socket.

use bytes::{Buf, Bytes, BytesMut};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a peer may send. A vLLM batch is a few hundred kilobytes at most (one block's hashes
/// and token ids per stored block, a step's worth of blocks), so the defaults leave a wide
/// margin while bounding what one hostile peer can make the gateway hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame body accepted (a data frame; commands are held to [`MAX_COMMAND`]).
    pub max_frame: u64,
    /// Largest message accepted, all its frames together.
    pub max_message: u64,
    /// Most frames in one message (vLLM sends three; a ROUTER's reply may add a delimiter).
    pub max_frames: usize,
}

/// The subscriber's limits: 16 MiB per message and per frame, 16 frames.
pub const LIMITS: Limits = Limits {
    max_frame: 16 << 20,
    max_message: 16 << 20,
    max_frames: 16,
};

/// Largest command accepted (READY with its properties, PING, ERROR, …).
pub const MAX_COMMAND: u64 = 64 << 10;

/// How much is read from the socket at a time: the buffer holds at most one chunk beyond the
/// frame being assembled.
const CHUNK: usize = 64 << 10;

const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;
const GREETING_LEN: usize = 64;

/// Why a ZMTP session ended. [`ZmtpError::is_refusal`] tells a peer that broke the limits (the
/// refusals the subscriber counts) from one that failed otherwise.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZmtpError {
    /// The connection failed or was closed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection.
    #[error("the peer closed the connection")]
    Closed,
    /// The peer's greeting is not a ZMTP 3 greeting with the NULL mechanism.
    #[error("not a ZMTP 3 NULL-mechanism greeting: {0}")]
    Greeting(&'static str),
    /// The handshake failed: no READY, a socket type that cannot talk to ours, or an ERROR.
    #[error("ZMTP handshake failed: {0}")]
    Handshake(String),
    /// A frame announced more bytes than the limit.
    #[error("refused a ZMTP frame of {len} bytes (limit {limit})")]
    FrameTooLarge {
        /// Announced.
        len: u64,
        /// The limit it broke.
        limit: u64,
    },
    /// A message grew beyond the limit.
    #[error("refused a ZMTP message of more than {limit} bytes")]
    MessageTooLarge {
        /// The limit it broke.
        limit: u64,
    },
    /// A message had more frames than the limit.
    #[error("refused a ZMTP message of more than {limit} frames")]
    TooManyFrames {
        /// The limit it broke.
        limit: usize,
    },
    /// A command frame with MORE set (commands are single frames).
    #[error("a ZMTP command frame with MORE set")]
    BadCommand,
    /// The endpoint is not `tcp://host:port`.
    #[error("not a tcp://HOST:PORT endpoint: {0}")]
    Endpoint(String),
}

impl ZmtpError {
    /// True when the peer broke a size limit (counted as a refusal, not a network failure).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            ZmtpError::FrameTooLarge { .. }
                | ZmtpError::MessageTooLarge { .. }
                | ZmtpError::TooManyFrames { .. }
                | ZmtpError::BadCommand
        )
    }
}

/// What the decoder produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Unit {
    /// A whole message (its frames).
    Message(Vec<Bytes>),
    /// A command: its name and body after the name.
    Command(Bytes, Bytes),
}

/// The reading half as a pure function of the bytes received: feed it with [`Decoder::buffer`]
/// and take units with [`Decoder::next_unit`]. It never holds more than one message's frames
/// (within [`Limits`]) plus the bytes not yet parsed, and never allocates a length a peer
/// announced before checking it.
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    buf: BytesMut,
    /// The frames of the message being assembled.
    frames: Vec<Bytes>,
    /// Their total size.
    size: u64,
}

impl Decoder {
    /// A decoder with these limits.
    pub fn new(limits: Limits) -> Decoder {
        Decoder {
            limits,
            buf: BytesMut::new(),
            frames: Vec::new(),
            size: 0,
        }
    }

    /// Bytes received but not yet parsed.
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes held (unparsed ones and the frames of the message being assembled).
    pub fn held(&self) -> u64 {
        self.buf.len() as u64 + self.size
    }

    /// The next whole unit, `Ok(None)` when more bytes are needed, or the refusal that ends the
    /// session.
    pub fn next_unit(&mut self) -> Result<Option<Unit>, ZmtpError> {
        loop {
            let Some(&flags) = self.buf.first() else {
                return Ok(None);
            };
            let (header, len) = if flags & FLAG_LONG != 0 {
                let Some(b) = self.buf.get(1..9) else {
                    return Ok(None);
                };
                (9, u64::from_be_bytes(b.try_into().expect("eight bytes")))
            } else {
                let Some(&b) = self.buf.get(1) else {
                    return Ok(None);
                };
                (2, u64::from(b))
            };
            let command = flags & FLAG_COMMAND != 0;
            // Checked as soon as the header is read, before the body is waited for.
            if command {
                if flags & FLAG_MORE != 0 || !self.frames.is_empty() {
                    return Err(ZmtpError::BadCommand);
                }
                if len > MAX_COMMAND {
                    return Err(ZmtpError::FrameTooLarge {
                        len,
                        limit: MAX_COMMAND,
                    });
                }
            } else {
                if len > self.limits.max_frame {
                    return Err(ZmtpError::FrameTooLarge {
                        len,
                        limit: self.limits.max_frame,
                    });
                }
                if self.size.saturating_add(len) > self.limits.max_message {
                    return Err(ZmtpError::MessageTooLarge {
                        limit: self.limits.max_message,
                    });
                }
                if self.frames.len() >= self.limits.max_frames {
                    return Err(ZmtpError::TooManyFrames {
                        limit: self.limits.max_frames,
                    });
                }
            }
            // `len` is within a limit that fits memory, so it fits a usize.
            let body = len as usize;
            if self.buf.len() < header + body {
                // Room for the rest of this frame only (bounded by the checks above).
                self.buf
                    .reserve((header + body - self.buf.len()).min(CHUNK));
                return Ok(None);
            }
            self.buf.advance(header);
            let mut body = self.buf.split_to(body).freeze();
            if command {
                let Some(&n) = body.first() else {
                    return Err(ZmtpError::Handshake("an empty command".into()));
                };
                let n = usize::from(n);
                if body.len() < 1 + n {
                    return Err(ZmtpError::Handshake("a command name past its frame".into()));
                }
                body.advance(1);
                let name = body.split_to(n);
                return Ok(Some(Unit::Command(name, body)));
            }
            self.size += len;
            self.frames.push(body);
            if flags & FLAG_MORE == 0 {
                self.size = 0;
                return Ok(Some(Unit::Message(std::mem::take(&mut self.frames))));
            }
        }
    }
}

/// The two socket types the subscriber uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    /// Subscribes to a PUB (or XPUB) socket.
    Sub,
    /// Talks to a ROUTER (or DEALER, REP) socket.
    Dealer,
}

impl SocketType {
    fn name(self) -> &'static [u8] {
        match self {
            SocketType::Sub => b"SUB",
            SocketType::Dealer => b"DEALER",
        }
    }

    /// The peer types RFC 23 lets this type talk to.
    fn accepts(self, peer: &[u8]) -> bool {
        match self {
            SocketType::Sub => matches!(peer, b"PUB" | b"XPUB"),
            SocketType::Dealer => matches!(peer, b"ROUTER" | b"DEALER" | b"REP"),
        }
    }
}

/// Our greeting: ZMTP 3.0, NULL, as client.
fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// Check a peer's greeting: the signature, a major version of at least 3 (a peer must accept
/// higher versions and then speak its own, RFC 23), the NULL mechanism.
pub fn check_greeting(g: &[u8; GREETING_LEN]) -> Result<(), ZmtpError> {
    // libzmq checks only the low bit of the tenth byte; so do we.
    if g[0] != 0xFF || g[9] & 1 != 1 {
        return Err(ZmtpError::Greeting("no ZMTP signature"));
    }
    if g[10] < 3 {
        return Err(ZmtpError::Greeting("a ZMTP version before 3.0"));
    }
    let mech = &g[12..32];
    if &mech[..4] != b"NULL" || mech[4..].iter().any(|&b| b != 0) {
        return Err(ZmtpError::Greeting(
            "a security mechanism other than NULL (only NULL is supported)",
        ));
    }
    Ok(())
}

/// One frame's bytes (header and body).
fn put_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() > 255 {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

/// A READY command carrying our socket type.
fn ready(kind: SocketType) -> Vec<u8> {
    let mut body = vec![5u8];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(kind.name().len() as u32).to_be_bytes());
    body.extend_from_slice(kind.name());
    let mut out = Vec::new();
    put_frame(&mut out, FLAG_COMMAND, &body);
    out
}

/// A property's value in a READY command's body (after the name), if present and well formed.
pub fn property<'a>(mut props: &'a [u8], name: &[u8]) -> Result<Option<&'a [u8]>, ZmtpError> {
    let bad = || ZmtpError::Handshake("a malformed READY property".into());
    while let Some((&n, rest)) = props.split_first() {
        let n = usize::from(n);
        let key = rest.get(..n).ok_or_else(bad)?;
        let len = rest.get(n..n + 4).ok_or_else(bad)?;
        let len = u32::from_be_bytes(len.try_into().expect("four bytes")) as usize;
        let value = rest.get(n + 4..n + 4 + len).ok_or_else(bad)?;
        if key.eq_ignore_ascii_case(name) {
            return Ok(Some(value));
        }
        props = &rest[n + 4 + len..];
    }
    Ok(None)
}

/// One connection to a peer, after the handshake.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    decoder: Decoder,
}

impl Connection {
    /// Connect to `tcp://host:port` and complete the handshake as `kind`, all within `timeout`.
    pub async fn connect(
        endpoint: &str,
        kind: SocketType,
        limits: Limits,
        timeout: Duration,
    ) -> Result<Connection, ZmtpError> {
        let addr = endpoint
            .strip_prefix("tcp://")
            .ok_or_else(|| ZmtpError::Endpoint(endpoint.to_string()))?;
        let handshake = async {
            let stream = TcpStream::connect(addr).await?;
            let _ = stream.set_nodelay(true);
            let mut c = Connection {
                stream,
                decoder: Decoder::new(limits),
            };
            c.handshake(kind).await?;
            Ok(c)
        };
        tokio::time::timeout(timeout, handshake)
            .await
            .map_err(|_| {
                ZmtpError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connecting to {endpoint} timed out"),
                ))
            })?
    }

    async fn handshake(&mut self, kind: SocketType) -> Result<(), ZmtpError> {
        self.stream.write_all(&greeting()).await?;
        let mut g = [0u8; GREETING_LEN];
        self.stream.read_exact(&mut g).await?;
        check_greeting(&g)?;
        self.stream.write_all(&ready(kind)).await?;
        match self.recv_unit().await? {
            Unit::Command(name, body) if &name[..] == b"READY" => {
                let peer = property(&body, b"Socket-Type")?
                    .ok_or_else(|| ZmtpError::Handshake("READY without a Socket-Type".into()))?;
                if !kind.accepts(peer) {
                    return Err(ZmtpError::Handshake(format!(
                        "a {} socket cannot talk to a {} socket",
                        String::from_utf8_lossy(kind.name()),
                        String::from_utf8_lossy(peer)
                    )));
                }
                Ok(())
            }
            Unit::Command(name, body) if &name[..] == b"ERROR" => {
                let reason = body.get(1..).unwrap_or_default();
                Err(ZmtpError::Handshake(format!(
                    "the peer refused: {}",
                    String::from_utf8_lossy(reason)
                )))
            }
            _ => Err(ZmtpError::Handshake("the peer sent no READY".into())),
        }
    }

    /// Subscribe (a SUB socket) to messages whose first frame starts with `topic`.
    pub async fn subscribe(&mut self, topic: &[u8]) -> Result<(), ZmtpError> {
        let mut body = Vec::with_capacity(1 + topic.len());
        body.push(1);
        body.extend_from_slice(topic);
        self.send(&[&body]).await
    }

    /// Send one message.
    pub async fn send(&mut self, frames: &[&[u8]]) -> Result<(), ZmtpError> {
        let mut out = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            let more = if i + 1 < frames.len() { FLAG_MORE } else { 0 };
            put_frame(&mut out, more, f);
        }
        self.stream.write_all(&out).await?;
        Ok(())
    }

    async fn recv_unit(&mut self) -> Result<Unit, ZmtpError> {
        loop {
            if let Some(u) = self.decoder.next_unit()? {
                return Ok(u);
            }
            let buf = self.decoder.buffer();
            buf.reserve(CHUNK);
            // `read_buf` is cancel-safe: a cancelled read received nothing.
            if self.stream.read_buf(buf).await? == 0 {
                return Err(ZmtpError::Closed);
            }
        }
    }

    /// The next message (commands after the handshake are answered or skipped). Cancel-safe:
    /// a partial message stays in the decoder for the next call.
    pub async fn recv(&mut self) -> Result<Vec<Bytes>, ZmtpError> {
        loop {
            match self.recv_unit().await? {
                Unit::Message(m) => return Ok(m),
                Unit::Command(name, body) if &name[..] == b"ERROR" => {
                    return Err(ZmtpError::Handshake(format!(
                        "the peer closed with an error: {}",
                        String::from_utf8_lossy(body.get(1..).unwrap_or_default())
                    )));
                }
                // PING, SUBSCRIBE, … : a 3.0 peer sends none; a later one's are not ours to
                // answer (we announced 3.0, so a conforming peer speaks 3.0 to us).
                Unit::Command(..) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        put_frame(&mut v, flags, body);
        v
    }

    #[test]
    fn a_multipart_message_decodes_across_any_split() {
        let mut bytes = frame(FLAG_MORE, b"");
        bytes.extend(frame(FLAG_MORE, &7i64.to_be_bytes()));
        bytes.extend(frame(0, &[9u8; 300]));
        for cut in 0..bytes.len() {
            let mut d = Decoder::new(LIMITS);
            d.buffer().extend_from_slice(&bytes[..cut]);
            assert_eq!(d.next_unit().unwrap(), None, "cut {cut}");
            d.buffer().extend_from_slice(&bytes[cut..]);
            let Some(Unit::Message(m)) = d.next_unit().unwrap() else {
                panic!("no message at cut {cut}");
            };
            assert_eq!(m.len(), 3);
            assert_eq!(&m[2][..], &[9u8; 300]);
            assert_eq!(d.held(), 0);
        }
    }

    /// The probe's frame: a long frame announcing 2^61 bytes is refused from its header alone.
    #[test]
    fn a_frame_announcing_two_to_the_61_bytes_is_refused_from_its_header() {
        let mut d = Decoder::new(LIMITS);
        d.buffer().extend_from_slice(&[FLAG_LONG]);
        d.buffer().extend_from_slice(&(1u64 << 61).to_be_bytes());
        let e = d.next_unit().unwrap_err();
        assert!(
            matches!(e, ZmtpError::FrameTooLarge { len, .. } if len == 1 << 61),
            "{e}"
        );
        assert!(e.is_refusal());
        assert!(d.buffer().capacity() < 1 << 20);
    }

    /// The probe's endless multipart message: 1 MiB frames with MORE set are refused once the
    /// message passes its limit, never held beyond it.
    #[test]
    fn an_endless_multipart_message_is_refused_at_the_message_limit() {
        let limits = Limits {
            max_frame: 1 << 20,
            max_message: 4 << 20,
            max_frames: 1000,
        };
        let mut d = Decoder::new(limits);
        let f = frame(FLAG_MORE, &vec![0u8; 1 << 20]);
        let mut refused = None;
        for i in 0..10 {
            d.buffer().extend_from_slice(&f);
            match d.next_unit() {
                Ok(None) => assert!(d.held() <= limits.max_message + f.len() as u64),
                Ok(Some(u)) => panic!("a unit from an endless message: {u:?}"),
                Err(e) => {
                    refused = Some((i, e));
                    break;
                }
            }
        }
        let (i, e) = refused.expect("refused");
        assert_eq!(i, 4, "the fifth MiB breaks the 4 MiB limit");
        assert!(matches!(e, ZmtpError::MessageTooLarge { .. }), "{e}");
    }

    #[test]
    fn greetings_and_ready_properties_are_checked() {
        assert!(check_greeting(&greeting()).is_ok());
        let mut g = greeting();
        g[10] = 2;
        assert!(check_greeting(&g).is_err());
        let mut g = greeting();
        g[12..17].copy_from_slice(b"PLAIN");
        assert!(check_greeting(&g).is_err());
        let r = ready(SocketType::Dealer);
        let mut d = Decoder::new(LIMITS);
        d.buffer().extend_from_slice(&r);
        let Some(Unit::Command(name, body)) = d.next_unit().unwrap() else {
            panic!()
        };
        assert_eq!(&name[..], b"READY");
        assert_eq!(
            property(&body, b"socket-type").unwrap(),
            Some(&b"DEALER"[..])
        );
        assert!(property(&[11, b'S'], b"x").is_err());
        assert!(SocketType::Sub.accepts(b"PUB") && !SocketType::Sub.accepts(b"ROUTER"));
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    /// A frame as a hostile peer may send it: any flags, any announced length (most small, some
    /// near the limits, some absurd), any body no longer than what is announced.
    fn hostile_frame() -> impl Strategy<Value = Vec<u8>> {
        let len = prop_oneof![
            0u64..300,
            (LIMITS.max_frame - 2)..(LIMITS.max_frame + 2),
            any::<u64>(),
            Just(1u64 << 61),
        ];
        (any::<u8>(), len, prop::collection::vec(any::<u8>(), 0..600)).prop_map(
            |(flags, len, mut body)| {
                let mut v = Vec::new();
                if flags & FLAG_LONG != 0 || len > 255 {
                    v.push(flags | FLAG_LONG);
                    v.extend_from_slice(&len.to_be_bytes());
                } else {
                    v.push(flags);
                    v.push(len as u8);
                }
                body.truncate(len.min(600) as usize);
                v.extend(body);
                v
            },
        )
    }

    proptest! {
        /// Whatever frames a peer sends, in whatever pieces: the decoder yields units or one
        /// refusal, never panics, never holds more than a message's limit plus one read, and
        /// after a refusal it is done (the session ends).
        #[test]
        fn any_frames_decode_or_are_refused_within_the_limits(
            frames in prop::collection::vec(hostile_frame(), 0..12),
            cuts in prop::collection::vec(1usize..700, 1..8),
        ) {
            let bytes: Vec<u8> = frames.concat();
            let mut d = Decoder::new(LIMITS);
            let mut at = 0;
            let mut cut = cuts.iter().cycle();
            let mut refused = false;
            'feed: while at < bytes.len() {
                let n = (*cut.next().unwrap()).min(bytes.len() - at);
                d.buffer().extend_from_slice(&bytes[at..at + n]);
                at += n;
                loop {
                    match d.next_unit() {
                        Ok(Some(Unit::Message(m))) => {
                            prop_assert!(m.len() <= LIMITS.max_frames);
                            let size: usize = m.iter().map(Bytes::len).sum();
                            prop_assert!(size as u64 <= LIMITS.max_message);
                        }
                        Ok(Some(Unit::Command(_, body))) => {
                            prop_assert!(body.len() as u64 <= MAX_COMMAND);
                        }
                        Ok(None) => break,
                        Err(e) => {
                            refused = true;
                            // Every refusal is a named one (counted by the subscriber), or a
                            // malformed command (a handshake error, also counted as a failure).
                            prop_assert!(e.is_refusal() || matches!(e, ZmtpError::Handshake(_)), "{}", e);
                            break 'feed;
                        }
                    }
                }
                prop_assert!(d.held() <= LIMITS.max_message + 700 + 9);
                // The buffer never reserves an announced length beyond one chunk ahead.
                prop_assert!(d.buffer().capacity() <= LIMITS.max_message as usize + 2 * CHUNK + 700);
            }
            let announced_huge = frames.iter().any(|f| f[0] & FLAG_LONG != 0
                && u64::from_be_bytes(f[1..9].try_into().unwrap()) > LIMITS.max_frame);
            // A frame announcing more than the limit is refused once its header is read (if
            // nothing before it ended the session).
            if announced_huge && at == bytes.len() {
                let first_huge = frames.iter().position(|f| f[0] & FLAG_LONG != 0
                    && u64::from_be_bytes(f[1..9].try_into().unwrap()) > LIMITS.max_frame).unwrap();
                let whole_before = frames[..first_huge].iter().all(|f| {
                    let len = if f[0] & FLAG_LONG != 0 {
                        u64::from_be_bytes(f[1..9].try_into().unwrap())
                    } else {
                        u64::from(f[1])
                    };
                    let header = if f[0] & FLAG_LONG != 0 { 9 } else { 2 };
                    f.len() as u64 == header + len
                });
                if whole_before {
                    prop_assert!(refused, "a frame over the limit was not refused");
                }
            }
        }
    }
}
