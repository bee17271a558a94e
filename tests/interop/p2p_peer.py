"""A Python P2P peer (the reference transport of p2p_reference.py) for the Rust interop tests.

Usage: p2p_peer.py MODE --host H --port P [options]

  echo       answer every message with the same message on its sender's connection; one
             JSON line per message on stdout describing its exact Python types;
             `--hello TO --tag N` first connects to TO and sends {"type": "hello", "tag": N}
  send-types connect to --to, send TYPED, expect each echoed back with identical types;
             print {"ok": ..., "received": n} and exit 0 only if all matched
  handshake  run a W1 HandshakeSession (with --connect TO: outbound, else the first inbound
             peer); print {"event": "session_ready", ...} when ready and
             {"event": "dead", ...} when the session dies; exit 0 if it was ready
  blast      connect to --to, send --count small messages as fast as pyzmq allows, then
             wait for {"type": "done"}; print {"sent": n, "seconds": s}

Every mode prints `ready` once its ROUTER is bound and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

import zmq

from p2p_reference import HandshakeSession, LocalRegion, ZmqConnection, ZmqTransport

TYPED = [
    {
        "type": "fetch",
        "kv_request_id": "req-1",
        "keys": [b"\x00\x01\xff" * 12, b""],
        "block_indexes": [0, 7, 2**31 - 1],
        "round_seq": 0,
    },
    {
        "type": "ints",
        "u64max": 2**64 - 1,
        "i64min": -(2**63),
        "neg": -1,
        "neg33": -33,
        "u8": 200,
        "u16": 65535,
        "u32": 2**32,
        "zero": 0,
    },
    {"type": "strs", "ascii": "hello", "unicode": "h\u00e9llo \u2713 \u65e5\u672c", "empty": "", "long": "x" * 300, "nul": "\x00\x01"},
    {"type": "nested", "m": {"inner": [1, [b"\x02", {"deep": True}], False], "e": {}}, "l": [[], {}], "flags": [True, False]},
    {"type": "bin", "small": b"\x01", "big": bytes(range(256)) * 2, "float": 1.5, "none": None},
]

BLAST_MESSAGE = {"type": "lookup", "kv_request_id": "req-000001", "keys": [b"\x00" * 8], "round_seq": 7}

_stop = False


def _on_signal(*_: object) -> None:
    global _stop
    _stop = True


def describe(v: object) -> object:
    """The exact Python type of every node, as JSON (the Rust side builds the same)."""
    t = type(v)
    if t is bool:
        return {"bool": v}
    if t is int:
        return {"int": str(v)}
    if t is str:
        return {"str": v}
    if t is bytes:
        return {"bytes": v.hex()}
    if t is float:
        return {"float": repr(v)}
    if v is None:
        return {"none": None}
    if t is list:
        return {"list": [describe(x) for x in v]}
    if t is dict:
        return {"dict": [[k if type(k) is str else repr(k), describe(x)] for k, x in v.items()]}
    return {"other": t.__name__}


def same(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def emit(obj: object) -> None:
    print(json.dumps(obj), flush=True)


class Peer:
    """A transport plus the connections it handed out, driven by one loop."""

    def __init__(self, host: str, port: int) -> None:
        self.local_id = f"{host}:{port}"
        self.transport = ZmqTransport(self.local_id, host, port)
        self.conns: dict[str, ZmqConnection] = {}
        self.poller = zmq.Poller()
        self.poller.register(self.transport._router, zmq.POLLIN)
        emit_ready()

    def connect(self, peer_id: str) -> ZmqConnection:
        conn = self.transport.connect(peer_id)
        self.conns[peer_id] = conn
        return conn

    def tick(self, wait_ms: int = 2) -> list[ZmqConnection]:
        self.poller.poll(wait_ms)
        new = list(self.transport.poll())
        for conn in new:
            self.conns[conn.peer_id] = conn
        for peer_id in [p for p, c in self.conns.items() if not c.alive]:
            del self.conns[peer_id]
        return new

    def close(self) -> None:
        self.transport.close()


def emit_ready() -> None:
    print("ready", flush=True)


def run_echo(peer: Peer, args: argparse.Namespace) -> int:
    if args.hello:
        peer.connect(args.hello).send({"type": "hello", "tag": args.tag, "from": peer.local_id})
    while not _stop:
        peer.tick()
        for conn in list(peer.conns.values()):
            for msg in conn.recv():
                emit({"from": conn.peer_id, "types": describe(msg)})
                print(f"echo {conn.peer_id}: {msg!r:.200}", file=sys.stderr, flush=True)
                conn.send(msg)
    return 0


def run_send_types(peer: Peer, args: argparse.Namespace) -> int:
    conn = peer.connect(args.to)
    for msg in TYPED:
        conn.send(msg)
    got: list = []
    deadline = time.monotonic() + args.timeout
    while len(got) < len(TYPED) and time.monotonic() < deadline and not _stop:
        peer.tick()
        got.extend(conn.recv())
    mismatch = [i for i, (a, b) in enumerate(zip(TYPED, got)) if not same(a, b)]
    ok = len(got) == len(TYPED) and not mismatch
    emit({"ok": ok, "received": len(got), "mismatch": mismatch})
    return 0 if ok else 1


def run_handshake(peer: Peer, args: argparse.Namespace) -> int:
    region = LocalRegion(
        agent_metadata=b"py-agent\x00\xff",
        base_addr=0x7F00_0000_0000,
        num_blocks=64,
        block_len=args.block_len,
        config_fingerprint="fp-1",
        hash_seed="0",
    )
    session: HandshakeSession | None = None
    if args.connect:
        session = HandshakeSession(args.connect, peer.local_id, region, peer.connect(args.connect))
    was_ready = False
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and not _stop:
        for conn in peer.tick():
            if session is None:
                session = HandshakeSession(conn.peer_id, peer.local_id, region, conn)
        if session is None:
            continue
        session.poll()
        if session.ready and not was_ready:
            was_ready = True
            emit({"event": "session_ready", "peer_connect": describe(session.remote_connect)})
        if session.death is not None:
            emit({"event": "dead", "reason": session.death, "was_ready": was_ready})
            return 0 if was_ready else 1
    emit({"event": "timeout", "was_ready": was_ready})
    return 1


def run_blast(peer: Peer, args: argparse.Namespace) -> int:
    conn = peer.connect(args.to)
    start = time.perf_counter()
    for _ in range(args.count):
        conn.send(BLAST_MESSAGE)
    seconds = time.perf_counter() - start
    deadline = time.monotonic() + args.timeout
    done = False
    while not done and time.monotonic() < deadline and not _stop:
        peer.tick(20)
        done = any(m.get("type") == "done" for m in conn.recv())
    emit({"sent": args.count, "seconds": seconds, "done": done})
    return 0 if done else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["echo", "send-types", "handshake", "blast"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--to")
    parser.add_argument("--hello")
    parser.add_argument("--tag", type=int, default=0)
    parser.add_argument("--connect")
    parser.add_argument("--block-len", type=int, default=256)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    peer = Peer(args.host, args.port)
    try:
        run = {"echo": run_echo, "send-types": run_send_types, "handshake": run_handshake, "blast": run_blast}
        return run[args.mode](peer, args)
    finally:
        peer.close()


if __name__ == "__main__":
    sys.exit(main())
