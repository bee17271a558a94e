"""Benchmarks of the ctlplane Python package (see docs/performance.md, section "Python package").

    python ctlplane_bench.py reserve N     # N reserve round trips, for callgrind
    python ctlplane_bench.py reserve-callback N  # the same against callback mode
    python ctlplane_bench.py p2p SECONDS   # P2P send+poll+recv rate, ctlplane vs reference

`reserve`: ctlplane's ControlClient sends N `reserve` requests (distinct 32-hex transfer
ids and 64-hex mm_hashes, 64x128 float16) to a ConsumerShardServer serving in the same
process over loopback TCP: the twin of tests/interop/ec_bench.py, which does the same
with the Python reference pair. Count instructions per round trip with

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python ctlplane_bench.py reserve 200
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python ctlplane_bench.py reserve 400

and take (I(400) - I(200)) / 200, which cancels start-up and imports. `reserve-callback`
serves the same requests with the callback-mode ConsumerControlServer over the Python
reference peers' toy reservation manager (tests/interop/ec_reference.py).

`p2p`: two transports in one process, one loop: A sends 500 messages to B, then B polls
and receives until all 500 arrived, again and again; only the sending and the
polling + receiving are timed (see `p2p_rate`). ctlplane's transports and the reference's
(tests/interop/p2p_reference.py) take turns, three rounds each over SECONDS in all;
it prints the median messages/s of both and the ratio of each pair.
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


def reserve(n: int, callbacks: bool = False) -> None:
    port = free_port()
    if callbacks:
        from ec_reference import ToyReservations

        book = ToyReservations("10.0.0.5:15417", 0, 1 << 40)
        server = ec.ConsumerControlServer("127.0.0.1", port, book.reserve, book.status, book.complete, book.cancel,
                                          book.reap)
    else:
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
    print(f"{n} reserves in {elapsed:.3f}s ({n / elapsed:.0f}/s)", flush=True)
    # Tearing down is no part of a round trip (and the reference's twin skips it too).
    os._exit(0)


WINDOW = 500
"""Messages per round: below the ROUTER's receive high-water mark (1,000), so a round
never waits on flow control."""


def p2p_rate(make, seconds: float) -> float:
    """Messages per second of the calling thread's own work: each round A sends WINDOW
    messages, the I/O threads carry them while the caller sleeps 20 ms (not counted), then
    B polls and receives until all of them are in. Only the send loop and the poll + recv
    loop are timed, so the figure is what the transport costs the Python thread per
    message (the GIL holder in a tiering node), not one loopback hop's latency, which is
    libzmq's for both transports."""
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
        busy = 0.0
        while busy < seconds:
            started = time.perf_counter()
            for i in range(WINDOW):
                msg["seq"] = i
                out.send(msg)
            sent = time.perf_counter()
            time.sleep(0.02)
            draining = time.perf_counter()
            got = 0
            while got < WINDOW:
                b.poll()
                got += len(inbound.recv())
            busy += (sent - started) + (time.perf_counter() - draining)
            done += got
        return done / busy
    finally:
        a.close()
        b.close()


def p2p_bench(seconds: float) -> None:
    from p2p_reference import ZmqTransport as RefTransport

    # Alternated, so that a change in the machine's load falls on both.
    ctl, ref = [], []
    for _ in range(3):
        ctl.append(p2p_rate(p2p.ZmqTransport, seconds / 3))
        ref.append(p2p_rate(RefTransport, seconds / 3))
    ratios = sorted(c / r for c, r in zip(ctl, ref))
    print(
        f"ctlplane {sorted(ctl)[1]:,.0f} msg/s, reference {sorted(ref)[1]:,.0f} msg/s (medians of 3); "
        f"ratio per pair {', '.join(f'{x:.2f}x' for x in ratios)}",
        flush=True,
    )


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("reserve", "reserve-callback", "p2p"):
        sys.exit(__doc__)
    if sys.argv[1].startswith("reserve"):
        reserve(int(sys.argv[2]), callbacks=sys.argv[1] == "reserve-callback")
    else:
        p2p_bench(float(sys.argv[2]))
