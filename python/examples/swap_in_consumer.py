"""A vLLM-style EC consumer that swaps vLLM's control plane for ctlplane's.

Usage: swap_in_consumer.py [--tp N]

The consumer below is written against vLLM 0.33.0's
`vllm.distributed.ec_transfer.ec_connector.mooncake.control`. The only change is the
import: `from ctlplane.ec import ...` instead of `from vllm...mooncake.control import ...`.
Each TP rank serves a `ConsumerControlServer` over its own reservation manager (here the
toy manager of ctlplane's Python reference peers); then the Python reference producer
(tests/interop/ec_python_client.py) runs against it unchanged and must exit 0.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

# from vllm.distributed.ec_transfer.ec_connector.mooncake.control import (
#     ConsumerControlServer, ControlClient, EventInbox)
from ctlplane.ec import ConsumerControlServer, ControlClient, EventInbox

INTEROP = Path(__file__).resolve().parents[2] / "tests" / "interop"
sys.path.insert(0, str(INTEROP))
from ec_reference import ToyReservations  # noqa: E402  (the consumer's reservation manager)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        # Ascending, as a replica's ranks take consecutive ports upward.
        return sorted(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    ports = free_ports(args.tp)
    servers = []
    for rank, port in enumerate(ports):
        book = ToyReservations("127.0.0.1:0", 0x7F00_0000_0000 + rank * (1 << 30), 64 << 20)
        server = ConsumerControlServer(
            "127.0.0.1", port, book.reserve, book.status, book.complete, book.cancel, book.reap,
            peer_ports=ports,
        )
        server.start()
        servers.append(server)
    # The scheduler side of the same engine uses the swapped-in client and inbox too.
    client = ControlClient(timeout_ms=5000)
    inbox = EventInbox(client)
    base = f"tcp://127.0.0.1:{ports[0]}"
    assert client.discover_shards(base) == [f"tcp://127.0.0.1:{p}" for p in ports]
    inbox.drain(base)
    try:
        producer = subprocess.run(
            [sys.executable, str(INTEROP / "ec_python_client.py"), "--addr", base, "--tp", str(args.tp)],
            capture_output=True, text=True, timeout=120,
        )
        sys.stdout.write(producer.stdout)
        sys.stderr.write(producer.stderr)
        return producer.returncode
    finally:
        inbox.close()
        client.close()
        for server in servers:
            server.close()


if __name__ == "__main__":
    sys.exit(main())
