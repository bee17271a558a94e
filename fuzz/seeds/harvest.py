#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/seeds/.

EC frames come from the golden sessions (tests/tests/ec_golden.rs): its Python round-trip
test is run with tee-python.sh standing in for python3, which records every request,
reply and event. P2P frames are the W1 messages as msgspec encodes them (needs the
interop virtualenv's msgspec). Run from the workspace root:

    .venv/bin/python fuzz/seeds/harvest.py
"""
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEEDS = ROOT / "fuzz" / "seeds"


def put(target, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


def golden_frames():
    with tempfile.NamedTemporaryFile(suffix=".frames", delete=False) as f:
        path = f.name
    env = dict(os.environ, CTLPLANE_PYTHON=str(SEEDS / "tee-python.sh"), SEED_FRAMES=path)
    subprocess.run(
        ["cargo", "test", "-q", "-p", "ctlplane-tests", "--test", "ec_golden", "python_json_round_trips_every_frame"],
        cwd=ROOT, env=env, check=True)
    frames = []
    for line in pathlib.Path(path).read_text().splitlines():
        kind, _, hexdata = line.partition(" ")
        frames.append((kind, bytes.fromhex(hexdata)))
    os.unlink(path)
    return frames


def main():
    frames = golden_frames()
    for kind, frame in frames:
        if kind == "request":
            put("ec_request", frame)
        elif kind == "event":
            # ec_event's first byte: one shard, no waiting request; then two shards.
            put("ec_event", b"\x00" + frame)
            put("ec_event", b"\x09" + frame)
    import msgspec  # from the interop virtualenv

    enc = msgspec.msgpack.encode
    connect = {"type": "connect", "peer_id": "10.0.0.2:5710", "agent_metadata": b"\x01\x02",
               "base_addr": 4096, "num_blocks": 8, "block_len": 256, "config_fingerprint": "fp",
               "hash_seed": "0"}
    messages = [
        connect,
        {"type": "connect_ack", "peer_id": "10.0.0.2:5710"},
        {"type": "disconnect"},
        {"type": "lookup", "kv_request_id": "r1", "keys": [b"\x00" * 8], "round_seq": 1},
        {"type": "lookup_resp", "kv_request_id": "r1", "keys": [b"\x00" * 8], "hits": [True]},
        {"type": "fetch", "kv_request_id": "r1", "keys": [b"\x00" * 8, b"\x01" * 8], "block_indexes": [0, 7],
         "round_seq": 2},
        {"type": "transfer_done", "kv_request_id": "r1", "success": True, "round_seq": 2},
        {"type": "abort_fetch", "kv_request_id": "r1", "round_seq": 3},
        {"type": "abort_ack", "kv_request_id": "r1", "round_seq": 2**64 - 1},
        {"type": "gossip", "x": [None, 1.5, -2**63, {"k": "v"}]},
    ]
    for m in messages:
        put("p2p_msgpack", enc(m))
    print(f"{len(frames)} golden frames, {len(messages)} P2P messages")


if __name__ == "__main__":
    sys.exit(main())
