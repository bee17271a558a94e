"""vLLM's released P2P transport (ZmqTransport of the pinned release) as a peer of ctlplane.

The release's modules are read from its wheel at run time and never copied into this
repository. Only `vllm.logger` is stubbed (a standard `logging` logger); the transport and
its abstract base are the release's own code. The wheel is looked for in
$CTLPLANE_VLLM_CACHE (default ~/.cache/ctlplane/vllm-<version>/) and downloaded there with
`pip download --no-deps` when missing.

Modes (each prints `ready` once its ROUTER is bound, then JSON lines on stdout):

  echo        answer every message with itself on its sender's connection, until
              SIGTERM/SIGINT
  send-types  connect to --to, send the typed messages of tests/interop/p2p_peer.py and
              expect each back with identical types; print {"ok": ..., "received": n}
  fill        connect to --to (a peer that never reads) and send small messages until the
              transport refuses one; print {"sent": n, "error": type, "message": text}
  bench       start an echo peer (--peer release: this file's echo; --peer ctlplane:
              `<--ctlplane> p2p echo`), then time --count round trips of a --size byte
              message through this release transport; print {"round_trips": n,
              "seconds": s}
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import zmq

# The release this suite conforms to: moving to the next release is this one line.
VLLM_VERSION = "0.33.0"

_PACKAGE = "vllm.v1.kv_offload.tiering.p2p.control"
_MODULES = ("base", "zmq")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "interop"))
from p2p_peer import TYPED, same  # noqa: E402  (the interop suite's typed messages)

_stop = False


def _on_signal(*_: object) -> None:
    global _stop
    _stop = True


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "ctlplane" / f"vllm-{VLLM_VERSION}"
    return Path(os.environ.get("CTLPLANE_VLLM_CACHE", default))


def wheel() -> Path:
    """The cached wheel of the pinned release, downloaded once when missing."""
    cache = cache_dir()
    pattern = str(cache / f"vllm-{VLLM_VERSION}-*.whl")
    found = sorted(glob.glob(pattern))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", f"vllm=={VLLM_VERSION}", "-d", str(cache)],
            check=True,
            stdout=sys.stderr,
        )
        found = sorted(glob.glob(pattern))
    if not found:
        raise SystemExit(f"no vllm {VLLM_VERSION} wheel in {cache}")
    return Path(found[0])


def load_release() -> types.ModuleType:
    """Imports the release's `p2p/control/zmq.py` (and the `base.py` it builds on) from the
    wheel, under their own module names."""
    if f"{_PACKAGE}.zmq" in sys.modules:
        return sys.modules[f"{_PACKAGE}.zmq"]
    path = wheel()
    parts = _PACKAGE.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        pkg = types.ModuleType(name)
        pkg.__path__ = []
        sys.modules.setdefault(name, pkg)
    logger = types.ModuleType("vllm.logger")
    logger.init_logger = logging.getLogger  # type: ignore[attr-defined]
    sys.modules["vllm.logger"] = logger
    with zipfile.ZipFile(path) as z:
        for leaf in _MODULES:
            member = _PACKAGE.replace(".", "/") + f"/{leaf}.py"
            source = z.read(member).decode()
            name = f"{_PACKAGE}.{leaf}"
            module = types.ModuleType(name)
            module.__file__ = f"{path}/{member}"
            sys.modules[name] = module
            exec(compile(source, module.__file__, "exec"), module.__dict__)
    return sys.modules[f"{_PACKAGE}.zmq"]


def emit(obj: object) -> None:
    print(json.dumps(obj), flush=True)


class Node:
    """The release's transport and the connections it handed out."""

    def __init__(self, host: str, port: int) -> None:
        release = load_release()
        self.local_id = f"{host}:{port}"
        self.transport = release.ZmqTransport(self.local_id, host, port)
        self.conns: dict = {}
        self.poller = zmq.Poller()
        self.poller.register(self.transport._router, zmq.POLLIN)

    def connect(self, peer_id: str):
        conn = self.transport.connect(peer_id)
        self.conns[peer_id] = conn
        return conn

    def tick(self, wait_ms: int = 2) -> None:
        self.poller.poll(wait_ms)
        for conn in self.transport.poll():
            self.conns[conn.peer_id] = conn
        for peer_id in [p for p, c in self.conns.items() if not c.alive]:
            del self.conns[peer_id]

    def close(self) -> None:
        self.transport.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_echo(node: Node, args: argparse.Namespace) -> int:
    emit_ready()
    while not _stop:
        node.tick(10)
        for conn in list(node.conns.values()):
            for msg in conn.recv():
                conn.send(msg)
    return 0


def run_send_types(node: Node, args: argparse.Namespace) -> int:
    emit_ready()
    conn = node.connect(args.to)
    for msg in TYPED:
        conn.send(msg)
    got: list = []
    deadline = time.monotonic() + args.timeout
    while len(got) < len(TYPED) and time.monotonic() < deadline and not _stop:
        node.tick()
        got.extend(conn.recv())
    mismatch = [i for i, (a, b) in enumerate(zip(TYPED, got)) if not same(a, b)]
    ok = len(got) == len(TYPED) and not mismatch
    emit({"ok": ok, "received": len(got), "mismatch": mismatch})
    return 0 if ok else 1


def run_fill(node: Node, args: argparse.Namespace) -> int:
    emit_ready()
    conn = node.connect(args.to)
    msg = {"type": "lookup", "kv_request_id": "fill", "keys": [b"\x00" * 8], "round_seq": 0}
    sent = 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            conn.send(msg)
        except Exception as exc:  # the release raises ConnectionError
            emit({"sent": sent, "error": type(exc).__name__, "message": str(exc)})
            return 0
        sent += 1
    emit({"sent": sent, "error": None, "message": None})
    return 1


def run_bench(node: Node, args: argparse.Namespace) -> int:
    port = free_port()
    if args.peer == "ctlplane":
        cmd = [args.ctlplane, "p2p", "echo", "--port", str(port)]
    else:
        cmd = [sys.executable, __file__, "echo", "--port", str(port)]
    peer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = peer.stdout.readline() if peer.stdout else ""
        if line.strip() != "ready":
            raise SystemExit(f"echo peer did not start: {line!r}")
        to = f"127.0.0.1:{port}"
        conn = node.connect(to)
        msg = {"type": "lookup", "kv_request_id": "bench", "blob": b"\xa5" * args.size}
        started = time.monotonic()
        deadline = started + args.timeout
        for _ in range(args.count):
            conn.send(msg)
            got: list = []
            while not got:
                if time.monotonic() > deadline:
                    raise SystemExit("echo peer stopped answering")
                node.tick(1)
                got = conn.recv()
            if not same(got[0], msg):
                raise SystemExit("echo differs")
        emit({"peer": args.peer, "round_trips": args.count, "seconds": time.monotonic() - started})
    finally:
        peer.send_signal(signal.SIGTERM)
        try:
            peer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            peer.kill()
    return 0


def emit_ready() -> None:
    print("ready", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["echo", "send-types", "fill", "bench"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="ROUTER port (0: a free one)")
    p.add_argument("--to", help="peer id host:port")
    p.add_argument("--timeout", type=float, default=15.0)
    p.add_argument("--peer", choices=["ctlplane", "release"], default="release")
    p.add_argument("--ctlplane", default="ctlplane", help="the ctlplane binary (bench --peer ctlplane)")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--size", type=int, default=32 * 1024)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    node = Node(args.host, args.port or free_port())
    try:
        return {"echo": run_echo, "send-types": run_send_types, "fill": run_fill, "bench": run_bench}[args.mode](
            node, args
        )
    finally:
        node.close()


if __name__ == "__main__":
    sys.exit(main())
