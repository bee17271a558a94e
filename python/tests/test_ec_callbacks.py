"""Callback mode: ctlplane's serving loop calling a consumer's Python callbacks."""

from __future__ import annotations

import json

import pytest
import zmq

import ctlplane.ec as ec
from conftest import free_port, open_fds, thread_count, wait_for


def tid(i: int) -> str:
    return f"{i:032x}"


def reserve_req(i: int, nbytes: int = 16384) -> dict:
    return {"op": "reserve", "transfer_id": tid(i), "mm_hash": f"{i:064x}", "nbytes": nbytes,
            "shape": [64, 128], "dtype": "float16"}


@pytest.fixture
def toy():
    from ec_reference import ToyReservations

    return ToyReservations("10.0.0.5:1", 4096, 1 << 20)


@pytest.fixture
def served(toy, port):
    server = ec.ConsumerControlServer("127.0.0.1", port, toy.reserve, toy.status, toy.complete, toy.cancel,
                                      toy.reap)
    assert server.event_port is None
    server.start()
    yield server, f"tcp://127.0.0.1:{port}"
    server.close()


def test_every_op_through_the_callbacks(served, toy):
    server, addr = served
    client = ec.ControlClient(5000)
    inbox = ec.EventInbox(client)
    try:
        assert client.request(addr, {"op": "event_port"}) == server.event_port
        assert client.discover_shards(addr) == [addr]
        assert inbox.drain(addr) == []
        g = client.request(addr, reserve_req(1))
        assert g["write"] is True and g["dst_ptr"] == 4096 and g["dst_session"] == "10.0.0.5:1"
        assert toy.status(tid(1)) == client.request(addr, {"op": "status", "transfer_id": tid(1)})
        assert client.request(addr, {"op": "complete", "transfer_id": tid(1),
                                     "reservation_id": g["reservation_id"]}) == {
            "completed": True, "became_ready": True}
        events: list = []
        wait_for(lambda: events.extend(inbox.drain(addr)) or events)
        assert events[0] == {"transfer_id": tid(1), **toy.status(tid(1)), "shard": server.port}
        batch = client.request(addr, {"op": "reserve_batch", "items": [reserve_req(2), reserve_req(3, nbytes=1)]})
        assert batch["items"][0]["ok"] is True
        assert batch["items"][1] == {"ok": False, "error": "shape and dtype do not match nbytes"}
        rid = batch["items"][0]["result"]["reservation_id"]
        comp = client.request(addr, {"op": "complete_batch", "items": [{"transfer_id": tid(2), "reservation_id": rid}]})
        assert comp == {"items": [{"completed": True, "became_ready": True}]}
        assert client.request(addr, ec.make_cancel_request(tid(9), abandon=True)) == {"cancelled": True}
        assert toy.status(tid(9)) is None
    finally:
        inbox.close()
        client.close()


def test_callback_exceptions_become_error_replies(port):
    calls = []

    def reserve(item):
        raise ValueError(f"no room for {item['transfer_id']}")

    def status(transfer_id):
        raise KeyError(transfer_id)

    def complete(transfer_id, reservation_id):
        return (True,)  # a bad tuple: unpacking fails as in the reference

    def cancel(transfer_id, reservation_id, abandon, refresh):
        calls.append((transfer_id, reservation_id, abandon, refresh))
        return abandon

    def reap():
        raise RuntimeError("reap keeps failing")  # logged; the server keeps serving

    server = ec.ConsumerControlServer("127.0.0.1", port, reserve, status, complete, cancel, reap)
    server.start()
    client = ec.ControlClient(5000)
    addr = f"tcp://127.0.0.1:{port}"
    try:
        with pytest.raises(RuntimeError, match=f"^no room for {tid(1)}$"):
            client.request(addr, reserve_req(1))
        with pytest.raises(RuntimeError, match="^'abc'$"):
            client.request(addr, {"op": "status", "transfer_id": "abc"})
        with pytest.raises(RuntimeError, match=r"^not enough values to unpack \(expected 2, got 1\)$"):
            client.request(addr, {"op": "complete", "transfer_id": "t", "reservation_id": "r"})
        with pytest.raises(RuntimeError, match="^unknown control op: 'x'$"):
            client.request(addr, {"op": "x"})
        assert client.request(addr, {"op": "cancel", "transfer_id": "t", "abandon": 1}) == {"cancelled": True}
        assert calls == [("t", "", True, False)]
        batch = client.request(addr, {"op": "reserve_batch", "items": [reserve_req(2)]})
        assert batch == {"items": [{"ok": False, "error": f"no room for {tid(2)}"}]}
    finally:
        client.close()
        server.close()


def test_hostile_frames_while_serving(served):
    server, addr = served
    ctx = zmq.Context()
    try:
        for frames in ([b"\xff\xfe"], [b"not json"], [b"[1, 2]"], [b'{"op": "reserve"}'], [b""],
                       [b'{"op": "status"}', b"second part"], [b"{" * 10000],
                       [b'{"op": "reserve_batch", "items": 5}']):
            s = ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, 5000)
            s.connect(addr)
            s.send_multipart(frames)
            reply = json.loads(s.recv())
            assert reply["ok"] is False and reply["error"], frames
            s.close()
    finally:
        ctx.term()
    c = ec.ControlClient(5000)
    assert c.request(addr, {"op": "event_port"}) == server.event_port
    c.close()


def test_bind_failure_and_close_idempotent(served, toy):
    server, _ = served
    other = ec.ConsumerControlServer("127.0.0.1", server.port, toy.reserve, toy.status, toy.complete, toy.cancel,
                                     toy.reap)
    with pytest.raises(RuntimeError, match="failed to bind"):
        other.start()
    other.close()
    other.close()


def test_no_leak_after_close(toy):
    def cycle() -> None:
        port = free_port()
        server = ec.ConsumerControlServer("127.0.0.1", port, toy.reserve, toy.status, toy.complete, toy.cancel,
                                          toy.reap)
        server.start()
        c = ec.ControlClient(5000)
        c.request(f"tcp://127.0.0.1:{port}", {"op": "peers"})
        c.close()
        server.close()
        server.close()

    cycle()
    fds, threads = open_fds(), thread_count()
    for _ in range(3):
        cycle()
    wait_for(lambda: open_fds() <= fds and thread_count() <= threads)
