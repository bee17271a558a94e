"""Benchmarks of the ctlplane Python package (see docs/performance.md, section "[py]").

    python ctlplane_bench.py reserve N     # N reserve round trips, for callgrind
    python ctlplane_bench.py p2p SECONDS   # P2P send+poll+recv rate, ctlplane vs reference

`reserve`: ctlplane's ControlClient sends N `reserve` requests (distinct 32-hex transfer
ids and 64-hex mm_hashes, 64x128 float16) to a ConsumerShardServer serving in the same
process over loopback TCP: the twin of tests/interop/ec_bench.py, which does the same
with the Python reference pair. Count instructions per round trip with

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python ctlplane_bench.py reserve 200
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python ctlplane_bench.py reserve 400

and take (I(400) - I(200)) / 200, which cancels start-up and imports.

`p2p`: two transports in one process, one loop: A sends a message to B, B polls and
receives it, for SECONDS each, first with ctlplane's transports and then with the
reference's (tests/interop/p2p_reference.py), printing messages/s of both.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import ctlplane.ec as ec
import ctlplane.p2p as p2p

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "interop"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reserve(n: int) -> None:
    port = free_port()
    server = ec.ConsumerShardServer("127.0.0.1", port, 1 << 40)
    server.start()
    client = ec.ControlClient(timeout_ms=5000)
    addr = f"tcp://127.0.0.1:{port}"
    client.request(addr, {"op": "event_port"})  # connects the REQ socket; cancels out
    started = time.perf_counter()
    for i in range(n):
        result = client.request(
            addr,
            {
                "op": "reserve",
                "transfer_id": f"{i:032x}",
                "mm_hash": f"{i:064x}",
                "nbytes": 16384,
                "shape": [64, 128],
                "dtype": "float16",
            },
        )
        assert result["write"] is True
    elapsed = time.perf_counter() - started
    print(f"{n} reserves in {elapsed:.3f}s ({n / elapsed:.0f}/s); {server.stats()['requests']} requests served",
          flush=True)
    # Tearing down is no part of a round trip (and the reference's twin skips it too).
    os._exit(0)


def p2p_rate(make, seconds: float) -> float:
    pa, pb = free_port(), free_port()
    a = make(f"127.0.0.1:{pa}", "127.0.0.1", pa)
    b = make(f"127.0.0.1:{pb}", "127.0.0.1", pb)
    try:
        out = a.connect(f"127.0.0.1:{pb}")
        out.send({"seq": -1})
        inbound = None
        while inbound is None:
            new = b.poll()
            inbound = new[0] if new else None
        inbound.recv()
        msg = {"type": "block", "seq": 0, "key": b"k" * 32, "peer": "127.0.0.1:1"}
        done = 0
        started = time.perf_counter()
        end = started + seconds
        while time.perf_counter() < end:
            for _ in range(100):
                msg["seq"] = done
                out.send(msg)
                got = ()
                while not got:
                    b.poll()
                    got = inbound.recv()
                done += len(got)
        return done / (time.perf_counter() - started)
    finally:
        a.close()
        b.close()


def p2p_bench(seconds: float) -> None:
    from p2p_reference import ZmqTransport as RefTransport

    ctl = p2p_rate(p2p.ZmqTransport, seconds)
    ref = p2p_rate(RefTransport, seconds)
    print(f"ctlplane {ctl:,.0f} msg/s; reference {ref:,.0f} msg/s; ratio {ctl / ref:.2f}x", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("reserve", "p2p"):
        sys.exit(__doc__)
    if sys.argv[1] == "reserve":
        reserve(int(sys.argv[2]))
    else:
        p2p_bench(float(sys.argv[2]))
