"""A Python EC consumer (reference ConsumerControlServer per TP rank) for Rust clients.

Usage: ec_python_consumer.py --host 127.0.0.1 --port P --tp N
Prints one line per shard (`shard rank=R control=... events=...`), then `ready`, and serves
until its standard input closes or it is terminated.
"""

import argparse
import signal
import sys
import threading

from ec_reference import ConsumerControlServer, ToyReservations, make_zmq_path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    ports = [args.port + r for r in range(args.tp)]
    servers = []
    for rank, port in enumerate(ports):
        book = ToyReservations(f"{args.host}:0", 0x7F00_0000_0000 + rank * (1 << 30), 64 << 20)
        server = ConsumerControlServer(
            args.host, port, book.reserve, book.status, book.complete, book.cancel, book.reap, peer_ports=ports
        )
        server.start()
        servers.append(server)
        print(
            f"shard rank={rank} control={make_zmq_path('tcp', args.host, port)} "
            f"events={make_zmq_path('tcp', args.host, server.event_port)}",
            flush=True,
        )
    print("ready", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    for server in servers:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
