#!/usr/bin/env python3
"""Write the KV event fixtures the gateway's conformance test decodes
(gateway/tests/integration/kv_events.rs): batches encoded by msgspec from vLLM's own struct
definitions, sent through real ZeroMQ sockets by pyzmq, the frames recorded as they arrived.

Run it with ./regenerate.sh (it installs msgspec and pyzmq into a cached virtual environment);
the outputs are committed, so the tests need no Python.

Three encodings, as vLLM has published them (`vllm/distributed/kv_events.py`):
- v0.9: `array_like=True` structs; BlockStored(block_hashes, parent_block_hash, token_ids,
  block_size, lora_id), BlockRemoved(block_hashes); integer hashes.
- v0.11: `array_like=True`; `medium` appended to both, `data_parallel_rank` to the batch (the
  struct shape `examples/online_serving/kv_events_subscriber.py` decodes).
- current: plain (map) structs, the tag under "type"; `lora_name`, `extra_keys`, `group_idx`,
  `kv_cache_spec_*` appended; block hashes are bytes (`ExternalBlockHash = bytes | int`).

Each file holds the PUB frames `[topic, seq, payload]` in hex, the frames a DEALER received when
it asked the ROUTER replay socket for everything from sequence 2 (vLLM's `_service_replay`
answer), the events as plain JSON, and the router-level events the gateway must derive from the
token ids: FNV-1a 64 over each token id's 4 little-endian bytes, a key at every 512 tokens,
computed here independently of the Rust code.
"""
import hashlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional, Union

import msgspec
import zmq

ROUTER_BLOCK = 512
BLOCK_SIZE = 16
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1


def byte_tokens(text):
    """The gateway's estimate tokens: each 4 bytes of text as one little-endian id."""
    b = text.encode("ascii")
    return [int.from_bytes(b[i : i + 4], "little") for i in range(0, len(b) - len(b) % 4, 4)]


# Prompt A: 1,024 tokens; prompt B shares A's first 512 and then differs.
TEXT_A = "".join(f"a{i:06d}," for i in range(512))  # 4,096 bytes
TEXT_B = TEXT_A[:2048] + "".join(f"b{i:06d}," for i in range(256))
TOKENS_A = byte_tokens(TEXT_A)
TOKENS_B = byte_tokens(TEXT_B)
assert len(TOKENS_A) == len(TOKENS_B) == 1024


# --- vLLM v0.9 -------------------------------------------------------------------------------
class V09Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class V09Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class V09Stored(V09Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]


class V09Removed(V09Event, tag="BlockRemoved"):
    block_hashes: list[int]


class V09Cleared(V09Event, tag="AllBlocksCleared"):
    pass


# --- vLLM v0.11 ------------------------------------------------------------------------------
class V11Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class V11Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class V11Stored(V11Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class V11Removed(V11Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str]


class V11Cleared(V11Event, tag="AllBlocksCleared"):
    pass


# --- vLLM now (plain structs) ----------------------------------------------------------------
ExternalBlockHash = Union[bytes, int]


class NowBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class NowEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class NowStored(NowEvent, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class NowRemoved(NowEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: Optional[str]
    group_idx: Optional[int] = None


class NowCleared(NowEvent, tag="AllBlocksCleared"):
    pass


# --- one engine's story ----------------------------------------------------------------------
def story(version, rng):
    """Batches: A's first 512 tokens, A's second 512 (in two events), B's second half, A's tail
    evicted, (current only: a CPU-tier copy and a second KV group, both to be skipped), then
    everything cleared."""
    if version == "current":
        h = lambda: hashlib.sha256(rng.randbytes(16)).digest()  # noqa: E731
    else:
        h = lambda: rng.getrandbits(64)  # noqa: E731  (some above 2^63: unsigned in msgpack)
    a = [h() for _ in range(64)]
    b = [h() for _ in range(32)]

    def stored(hashes, parent, tokens, **kw):
        if version == "v0.9":
            return V09Stored(hashes, parent, tokens, BLOCK_SIZE, None)
        if version == "v0.11":
            return V11Stored(hashes, parent, tokens, BLOCK_SIZE, None, kw.get("medium", "GPU"))
        return NowStored(hashes, parent, tokens, BLOCK_SIZE, None, kw.get("medium", "GPU"), None, group_idx=kw.get("group_idx"))

    def removed(hashes):
        if version == "v0.9":
            return V09Removed(hashes)
        if version == "v0.11":
            return V11Removed(hashes, "GPU")
        return NowRemoved(hashes, "GPU")

    cleared = {"v0.9": V09Cleared, "v0.11": V11Cleared, "current": NowCleared}[version]()
    batch = {"v0.9": V09Batch, "v0.11": V11Batch, "current": NowBatch}[version]
    extra = {} if version == "v0.9" else {"data_parallel_rank": 0}
    t = 1_760_000_000.0
    events = [
        [stored(a[:32], None, TOKENS_A[:512])],
        [stored(a[32:48], a[31], TOKENS_A[512:768]), stored(a[48:], a[47], TOKENS_A[768:])],
        [stored(b, a[31], TOKENS_B[512:])],
        [removed([a[63], a[62], a[61], a[60]])],
    ]
    if version == "current":
        events.append([stored([h()], None, TOKENS_A[:16], medium="CPU"), stored([h()], None, TOKENS_A[:16], group_idx=1)])
    events.append([cleared])
    return [batch(t + i * 0.01, ev, **extra) for i, ev in enumerate(events)]


def plain(event):
    """An event as plain JSON: its tag and its fields (bytes in hex)."""
    out = {"type": type(event).__struct_config__.tag}
    for f in event.__struct_fields__:
        v = getattr(event, f)
        if isinstance(v, list):
            v = [x.hex() if isinstance(x, bytes) else x for x in v]
        elif isinstance(v, bytes):
            v = v.hex()
        out[f] = v
    return out


class Router:
    """The router-level events the gateway must derive (an independent re-keying)."""

    def __init__(self):
        self.placed = {}
        self.holders = {}

    @staticmethod
    def key(x):
        return x.hex() if isinstance(x, bytes) else x

    def apply(self, e):
        out = []
        tag = type(e).__struct_config__.tag
        medium = getattr(e, "medium", None)
        group = getattr(e, "group_idx", None)
        if medium not in (None, "GPU") or group not in (None, 0):
            return out
        if tag == "AllBlocksCleared":
            self.placed.clear()
            self.holders.clear()
            return [{"all_cleared": True}]
        if tag == "BlockRemoved":
            for bh in e.block_hashes:
                p = self.placed.pop(self.key(bh), None)
                for k in (p or {}).get("keys", []):
                    self.holders[k] -= 1
                    if self.holders[k] == 0:
                        del self.holders[k]
                        out.append({"removed": str(k)})
            return out
        if e.parent_block_hash is None:
            end, state, last = 0, FNV_OFFSET, None
        else:
            p = self.placed[self.key(e.parent_block_hash)]
            end, state, last = p["end"], p["state"], p["last"]
        for i, bh in enumerate(e.block_hashes):
            keys = []
            for tid in e.token_ids[i * e.block_size : (i + 1) * e.block_size]:
                for byte in tid.to_bytes(4, "little"):
                    state = ((state ^ byte) * FNV_PRIME) & MASK
                end += 1
                if end % ROUTER_BLOCK == 0:
                    self.holders[state] = self.holders.get(state, 0) + 1
                    if self.holders[state] == 1:
                        out.append({"stored": str(state), "parent": None if last is None else str(last)})
                    keys.append(state)
                    last = state
            self.placed[self.key(bh)] = {"end": end, "state": state, "last": last, "keys": keys}
        return out


def through_zmq(topic, payloads, replay_from):
    """Send the payloads as vLLM's publisher does and record what a SUB and a DEALER receive."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = ctx.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    time.sleep(0.5)  # the slow joiner: let the subscription reach the publisher
    for seq, p in enumerate(payloads):
        pub.send_multipart((topic, seq.to_bytes(8, "big"), p))
    got = []
    while len(got) < len(payloads):
        if not sub.poll(5000):
            sys.exit("the SUB socket received too little")
        got.append(sub.recv_multipart())
    router = ctx.socket(zmq.ROUTER)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{rport}")
    dealer.send_multipart((b"", replay_from.to_bytes(8, "big")))
    client_id, empty, start = router.recv_multipart()  # vLLM insists on these three frames
    start = int.from_bytes(start, "big")
    for seq, p in enumerate(payloads):
        if seq >= start:
            router.send_multipart((client_id, b"", seq.to_bytes(8, "big"), p))
    router.send_multipart((client_id, b"", (-1).to_bytes(8, "big", signed=True), b""))
    replay = []
    while True:
        if not dealer.poll(5000):
            sys.exit("the DEALER received no end of replay")
        frames = dealer.recv_multipart()
        replay.append(frames)
        if frames[-1] == b"":
            break
    for s in (pub, sub, router, dealer):
        s.close(linger=0)
    ctx.term()
    return got, replay


def main():
    here = Path(__file__).resolve().parent
    for version, topic in (("v0.9", b""), ("v0.11", b"kv-events"), ("current", b"")):
        rng = random.Random(f"routelab-kv-events-{version}")
        batches = story(version, rng)
        payloads = [msgspec.msgpack.encode(b) for b in batches]
        frames, replay = through_zmq(topic, payloads, 2)
        router = Router()
        doc = {
            "source": f"vLLM {version} KVEventBatch, encoded by msgspec {msgspec.__version__}, "
            f"sent through pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()})",
            "topic": topic.decode(),
            "frames": [[f.hex() for f in m] for m in frames],
            "replay_from": 2,
            "replay": [[f.hex() for f in m] for m in replay],
            "batches": [
                {
                    "ts": b.ts,
                    "data_parallel_rank": getattr(b, "data_parallel_rank", None),
                    "events": [plain(e) for e in b.events],
                    "router": [x for e in b.events for x in router.apply(e)],
                }
                for b in batches
            ],
            "prompts": {"a": TEXT_A, "b": TEXT_B},
        }
        out = here / f"{version}.json"
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{out.name}: {len(frames)} batches, {len(replay)} replay messages")


if __name__ == "__main__":
    main()
