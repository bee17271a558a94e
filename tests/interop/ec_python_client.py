"""A Python producer and scheduler against a ctlplane consumer, written from the reference.

Usage: ec_python_client.py --addr tcp://127.0.0.1:PORT --tp N
Exercises every op through the reference ControlClient, subscribes with the reference
EventInbox, checks what a Python peer would see, and prints one JSON line with the
findings. Exits non-zero on the first mismatch.
"""

import argparse
import json
import sys
import time
import uuid

import zmq

from ec_reference import ControlClient, EventInbox


def check(cond: bool, what: str) -> None:
    if not cond:
        print(json.dumps({"ok": False, "failed": what}), flush=True)
        sys.exit(1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--addr", required=True)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    client = ControlClient(timeout_ms=5000)
    shards = client.discover_shards(args.addr)
    check(shards is not None and len(shards) == args.tp, f"discover_shards -> {shards}")

    inbox = EventInbox(client)  # no executor: discovery inline, as the reference tests do
    check(inbox.drain(args.addr) == [], "first drain is empty")
    check(inbox.shard_count == args.tp, f"shard_count {inbox.shard_count}")

    transfer_id = uuid.uuid4().hex
    mm_hash = uuid.uuid4().hex + uuid.uuid4().hex
    spec = {"transfer_id": transfer_id, "mm_hash": mm_hash, "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}
    reservations = {}
    for shard in shards:
        res = client.request(shard, {"op": "reserve", **spec})
        check(isinstance(res, dict), "reserve result is a dict")
        check(res["write"] is True and res["ready"] is False and res["cached"] is False, f"reserve flags {res}")
        check(len(res["reservation_id"]) == 32 and isinstance(res["dst_ptr"], int), f"reserve ids {res}")
        check(list(res) == ["reservation_id", "dst_session", "dst_ptr", "nbytes", "write", "ready", "cached"],
              f"reserve key order {list(res)}")
        reservations[shard] = res["reservation_id"]
        status = client.request(shard, {"op": "status", "transfer_id": transfer_id})
        check(status["ready"] is False and status["shape"] == [64, 128], f"status {status}")

    batch = client.request(shards[0], {"op": "reserve_batch", "items": [
        {**spec, "transfer_id": uuid.uuid4().hex, "mm_hash": "other"},
        {**spec, "transfer_id": "bad", "nbytes": 3},
    ]})
    check(batch["items"][0]["ok"] is True, f"batch item 0 {batch}")
    check(batch["items"][1] == {"ok": False, "error": "shape and dtype do not match nbytes"}, f"batch item 1 {batch}")

    for shard in shards:
        done = client.request(shard, {"op": "complete_batch", "items": [
            {"transfer_id": transfer_id, "reservation_id": reservations[shard]}]})
        check(done == {"items": [{"completed": True, "became_ready": True}]}, f"complete_batch {done}")

    events = []
    deadline = time.monotonic() + 10
    while len(events) < args.tp and time.monotonic() < deadline:
        events.extend(inbox.drain(args.addr))
        time.sleep(0.01)
    check(len(events) == args.tp, f"events from every shard: {events}")
    ports = sorted(int(s.rsplit(":", 1)[1]) for s in shards)
    check(sorted(e["shard"] for e in events) == ports, f"event shard tags {events}")
    check(all(list(e)[0] == "transfer_id" and list(e)[-1] == "shard" for e in events), "event key order")

    cancel = client.request(shards[0], {"op": "cancel", "transfer_id": "never-reserved", "reservation_id": ""})
    check(cancel == {"cancelled": True}, f"cancel before reserve {cancel}")
    late = client.request(shards[0], {"op": "reserve", **spec, "transfer_id": "never-reserved"})
    check(late.get("cancelled") is True and late["write"] is False, f"reserve after cancel {late}")
    wrong = client.request(shards[0], {"op": "cancel", "transfer_id": transfer_id, "reservation_id": "0" * 32,
                                       "abandon": True})
    check(wrong == {"cancelled": False}, f"cancel with a wrong id {wrong}")

    try:
        client.request(shards[0], {"op": "nonsense"})
        check(False, "unknown op must fail")
    except RuntimeError as e:
        check(str(e) == "unknown control op: 'nonsense'", f"unknown op text {e}")

    # A raw REQ sends an undecodable frame: the shard answers and keeps serving.
    ctx = zmq.Context()
    raw = ctx.socket(zmq.REQ)
    raw.setsockopt(zmq.RCVTIMEO, 5000)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(shards[-1])
    raw.send(b"{not json")
    reply = raw.recv()
    check(json.loads(reply) == {"ok": False, "error": "malformed control request"}, f"malformed reply {reply!r}")
    raw.close(linger=0)
    ctx.term()
    check(client.request(shards[-1], {"op": "peers"}) == {"ports": ports}, "peers after a malformed frame")

    inbox.close()
    client.close()
    print(json.dumps({"ok": True, "shards": len(shards), "events": len(events)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
