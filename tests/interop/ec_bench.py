"""Reserve round trips through the Python reference, for instruction counting.

Usage: ec_bench.py reserve N

The reference ControlClient sends N `reserve` requests (distinct 32-hex transfer ids and
64-hex mm_hashes, 64x128 float16, the frame ctlplane's Rust client sends) to the
reference ConsumerControlServer backed by ToyReservations, serving on a thread of the
same process over loopback TCP. This is the Python twin of
`zmq-backend/examples/reserve_roundtrip.rs`; count it with

    valgrind --tool=callgrind .venv/bin/python tests/interop/ec_bench.py reserve 200
    valgrind --tool=callgrind .venv/bin/python tests/interop/ec_bench.py reserve 400

and take (I(400) - I(200)) / 200, which cancels interpreter start-up and imports.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from ec_reference import ConsumerControlServer, ControlClient, ToyReservations


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reserve(n: int) -> None:
    book = ToyReservations("10.0.0.5:15417", 0, 1 << 40)
    port = free_port()
    server = ConsumerControlServer("127.0.0.1", port, book.reserve, book.status, book.complete, book.cancel, book.reap)
    server.start()
    client = ControlClient(timeout_ms=5000)
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
    print(f"{n} reserves in {elapsed:.3f}s; {len(book._records)} live reservations", flush=True)
    # Tearing down is no part of a round trip (and the Rust twin skips it too).
    os._exit(0)


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "reserve"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    if mode != "reserve":
        print(f"unknown mode {mode!r}: reserve", file=sys.stderr)
        return 2
    reserve(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
