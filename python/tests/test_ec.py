"""ctlplane.ec against ctlplane's own shard server and the Python reference peers."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
import zmq

import ctlplane.ec as ec
from conftest import free_port, open_fds, thread_count, wait_for

POOL_BASE = 0x7F00_0000_0000


def tid(i: int) -> str:
    return f"{i:032x}"


def mm(i: int) -> str:
    return f"{i:064x}"


def reserve_req(i: int, nbytes: int = 16384, shape=(64, 128), dtype: str = "float16") -> dict:
    return {"op": "reserve", "transfer_id": tid(i), "mm_hash": mm(i), "nbytes": nbytes,
            "shape": list(shape), "dtype": dtype}


@pytest.fixture
def shard(port):
    server = ec.ConsumerShardServer("127.0.0.1", port, 1 << 24, pool_base=POOL_BASE)
    server.start()
    yield server
    server.close()


@pytest.fixture
def client():
    c = ec.ControlClient(timeout_ms=5000)
    yield c
    c.close()


def addr_of(server) -> str:
    return f"tcp://127.0.0.1:{server.port}"


def test_make_cancel_request_flags_present_only_when_true():
    assert ec.make_cancel_request("t") == {"op": "cancel", "transfer_id": "t", "reservation_id": ""}
    assert ec.make_cancel_request("t", "r", abandon=True) == {
        "op": "cancel", "transfer_id": "t", "reservation_id": "r", "abandon": True}
    assert ec.make_cancel_request("t", refresh=True) == {
        "op": "cancel", "transfer_id": "t", "reservation_id": "", "refresh": True}
    # The frame's key order is 0.33.0's: op, transfer_id, reservation_id, then the flags.
    assert list(ec.make_cancel_request("t", "r", abandon=True, refresh=True)) == [
        "op", "transfer_id", "reservation_id", "abandon", "refresh"]
    with pytest.raises(TypeError):
        ec.make_cancel_request("t", "r", True)  # flags are keyword-only


def test_every_op_against_the_native_book(shard, client):
    addr = addr_of(shard)
    assert client.request(addr, {"op": "event_port"}) == shard.event_port
    assert client.request(addr, {"op": "peers"}) == {"ports": [shard.port]}
    assert client.discover_shards(addr) == [addr]

    granted = client.request(addr, reserve_req(1))
    assert granted["write"] is True and granted["ready"] is False
    assert granted["nbytes"] == 16384
    assert granted["dst_ptr"] >= POOL_BASE
    offset = granted["dst_ptr"] - POOL_BASE

    status = client.request(addr, {"op": "status", "transfer_id": tid(1)})
    assert status == shard.status(tid(1))
    assert status["mm_hash"] == mm(1) and status["ready"] is False and status["shape"] == [64, 128]
    assert status["dtype"] == "float16" and status["reservation_id"] == granted["reservation_id"]
    assert client.request(addr, {"op": "status", "transfer_id": tid(99)}) is None

    assert shard.take(tid(1), mm(1)) is None  # not READY yet
    done = client.request(addr, {"op": "complete", "transfer_id": tid(1),
                                 "reservation_id": granted["reservation_id"]})
    assert done == {"completed": True, "became_ready": True}
    assert shard.status(tid(1))["ready"] is True
    assert shard.take(tid(1), mm(1)) == (offset, 16384)

    batch = client.request(addr, {"op": "reserve_batch", "items": [reserve_req(2), reserve_req(3, dtype="nope")]})
    items = batch["items"]
    assert items[0]["ok"] is True and items[0]["result"]["write"] is True
    assert items[1]["ok"] is False and "dtype" in items[1]["error"]
    rid2 = items[0]["result"]["reservation_id"]
    comp = client.request(addr, {"op": "complete_batch", "items": [
        {"transfer_id": tid(2), "reservation_id": rid2},
        {"transfer_id": tid(2), "reservation_id": "0" * 32}]})
    assert comp["items"][0] == {"completed": True, "became_ready": True}
    assert comp["items"][1]["completed"] is False

    client.request(addr, reserve_req(4))
    assert client.request(addr, ec.make_cancel_request(tid(4))) == {"cancelled": True}
    assert client.request(addr, ec.make_cancel_request(tid(5), abandon=True))["cancelled"] in (True, False)

    shard.retire(mm(1))
    stats = shard.stats()
    assert stats["requests"] >= 10 and stats["error_replies"] >= 0


def test_drain_ready_hands_the_engine_every_ready_transfer_once(shard, client):
    addr = addr_of(shard)
    assert shard.drain_ready() == []
    writer = client.request(addr, reserve_req(10))
    follower = client.request(addr, {**reserve_req(11), "mm_hash": mm(10)})
    assert writer["write"] is True and follower["write"] is False
    assert shard.drain_ready() == []  # nothing is READY before the writer completes
    client.request(addr, {"op": "complete", "transfer_id": tid(10), "reservation_id": writer["reservation_id"]})
    # The follower's event goes out before its writer's, and drain_ready keeps that order.
    assert shard.drain_ready() == [tid(11), tid(10)]
    assert shard.drain_ready() == []
    # A writer no one follows (the common completion) is reported too.
    lone = client.request(addr, reserve_req(12))
    client.request(addr, {"op": "complete", "transfer_id": tid(12), "reservation_id": lone["reservation_id"]})
    assert shard.drain_ready() == [tid(12)]
    assert shard.stats()["ready_log_dropped"] == 0


def test_stats_count_live_records_apart_from_tombstones(shard, client):
    addr = addr_of(shard)
    granted = client.request(addr, reserve_req(20))
    census = {k: shard.stats()[k] for k in ("records", "tombstones", "writer_owned")}
    assert census == {"records": 1, "tombstones": 0, "writer_owned": 1}
    client.request(addr, {"op": "complete", "transfer_id": tid(20), "reservation_id": granted["reservation_id"]})
    census = {k: shard.stats()[k] for k in ("records", "tombstones", "writer_owned")}
    assert census == {"records": 1, "tombstones": 0, "writer_owned": 0}  # READY
    assert client.request(addr, ec.make_cancel_request(tid(20))) == {"cancelled": True}
    census = {k: shard.stats()[k] for k in ("records", "tombstones", "writer_owned")}
    assert census == {"records": 0, "tombstones": 1, "writer_owned": 0}


def test_server_errors_are_runtime_errors(shard, client):
    addr = addr_of(shard)
    with pytest.raises(RuntimeError, match="unknown control op"):
        client.request(addr, {"op": "frobnicate"})
    with pytest.raises(RuntimeError):
        client.request(addr, reserve_req(1, nbytes=3))  # size does not match shape
    # The socket survived an error reply.
    assert client.request(addr, {"op": "event_port"}) == shard.event_port


def test_payload_types_json_dumps_writes(shard, client):
    addr = addr_of(shard)
    # A float and a tuple go through the fallback / fast path and still mean the same.
    req = reserve_req(7)
    req["shape"] = (64, 128)
    req["extra"] = 1.5
    assert client.request(addr, req)["write"] is True
    with pytest.raises(TypeError):
        client.request(addr, {"op": "status", "transfer_id": object()})


def test_timeout_raises_and_is_caught_by_except_exception():
    c = ec.ControlClient(timeout_ms=100)
    dead = f"tcp://127.0.0.1:{free_port()}"
    try:
        with pytest.raises(Exception) as info:
            c.request(dead, {"op": "event_port"})
        assert isinstance(info.value, TimeoutError)
        assert c.discover_shards(dead) is None
    finally:
        c.close()


def test_event_inbox_receives_readiness(shard, client):
    addr = addr_of(shard)
    inbox = ec.EventInbox(client, executor=None)
    try:
        assert inbox.shard_count == 1
        assert inbox.drain(addr) == []
        granted = client.request(addr, reserve_req(1))
        client.request(addr, {"op": "complete", "transfer_id": tid(1), "reservation_id": granted["reservation_id"]})
        events: list = []
        wait_for(lambda: events.extend(inbox.drain(addr)) or events)
        ev = events[0]
        assert ev["transfer_id"] == tid(1) and ev["ready"] is True and ev["shard"] == shard.port
        assert ev["mm_hash"] == mm(1) and ev["reservation_id"] == granted["reservation_id"]
    finally:
        inbox.close()
        inbox.close()
    assert inbox.drain(addr) == []


def test_two_shard_topology_discovery(client):
    p1, p2 = free_port(), free_port()
    a = ec.ConsumerShardServer("127.0.0.1", p1, 1 << 20, peer_ports=[p1, p2])
    b = ec.ConsumerShardServer("127.0.0.1", p2, 1 << 20, peer_ports=[p1, p2])
    a.start()
    b.start()
    inbox = ec.EventInbox(client)
    try:
        base = f"tcp://127.0.0.1:{p1}"
        assert client.discover_shards(base) == [base, f"tcp://127.0.0.1:{p2}"]
        wait_for(lambda: inbox.drain(base) == [] and inbox.shard_count == 2)
        addr_b = f"tcp://127.0.0.1:{p2}"
        g = client.request(addr_b, reserve_req(3))
        client.request(addr_b, {"op": "complete", "transfer_id": tid(3), "reservation_id": g["reservation_id"]})
        events: list = []
        wait_for(lambda: events.extend(inbox.drain(base)) or events)
        assert events[0]["shard"] == p2
    finally:
        inbox.close()
        a.close()
        b.close()


def test_hostile_frames_while_serving(shard):
    ctx = zmq.Context()
    try:
        for frames in ([b"\xff\xfe"], [b"not json"], [b"[1, 2]"], [b'{"op": "reserve"}'], [b""],
                       [b'{"op": "status"}', b"second part"], [b"{" * 10000]):
            s = ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, 5000)
            s.connect(addr_of(shard))
            s.send_multipart(frames)
            reply = json.loads(s.recv())
            assert reply["ok"] is False and reply["error"], frames
            s.close()
        c = ec.ControlClient(5000)
        assert c.request(addr_of(shard), {"op": "event_port"}) == shard.event_port
        c.close()
    finally:
        ctx.term()


def test_start_fails_on_a_taken_port(shard):
    other = ec.ConsumerShardServer("127.0.0.1", shard.port, 1 << 20)
    with pytest.raises(RuntimeError, match="failed to bind"):
        other.start()
    other.close()


def test_close_is_idempotent_and_leaks_nothing():
    def cycle(i: int) -> None:
        server = ec.ConsumerShardServer("127.0.0.1", free_port(), 1 << 20)
        server.start()
        c = ec.ControlClient(2000)
        inbox = ec.EventInbox(c)
        addr = addr_of(server)
        inbox.drain(addr)
        g = c.request(addr, reserve_req(i))
        c.request(addr, {"op": "complete", "transfer_id": tid(i), "reservation_id": g["reservation_id"]})
        wait_for(lambda: inbox.drain(addr))  # subscribed, event received
        for closable in (inbox, inbox, c, c, server, server):
            closable.close()

    cycle(0)  # libzmq's lazily created resources, once
    fds, threads = open_fds(), thread_count()
    for i in range(1, 4):
        cycle(i)
    wait_for(lambda: open_fds() <= fds and thread_count() <= threads)


# --- against the Python reference peers ---------------------------------------------


def test_ctlplane_client_and_inbox_against_reference_server(client, port):
    from ec_reference import ConsumerControlServer, ToyReservations

    book = ToyReservations("10.0.0.5:1", 4096, 1 << 20)
    server = ConsumerControlServer("127.0.0.1", port, book.reserve, book.status, book.complete,
                                   book.cancel, book.reap)
    server.start()
    inbox = ec.EventInbox(client)
    try:
        addr = f"tcp://127.0.0.1:{port}"
        assert client.discover_shards(addr) == [addr]
        assert client.request(addr, {"op": "event_port"}) == server.event_port
        g = client.request(addr, reserve_req(1))
        assert g["write"] is True and g["dst_ptr"] == 4096
        assert client.request(addr, {"op": "status", "transfer_id": tid(1)})["ready"] is False
        assert inbox.drain(addr) == []
        assert client.request(addr, {"op": "complete", "transfer_id": tid(1),
                                     "reservation_id": g["reservation_id"]}) == {
            "completed": True, "became_ready": True}
        events: list = []
        wait_for(lambda: events.extend(inbox.drain(addr)) or events)
        assert events[0]["transfer_id"] == tid(1) and events[0]["shard"] == port
        assert client.request(addr, ec.make_cancel_request(tid(2), refresh=True)) == {"cancelled": True}
        with pytest.raises(RuntimeError, match="unknown control op"):
            client.request(addr, {"op": "nope"})
    finally:
        inbox.close()
        server.close()


def test_reference_client_against_native_book(shard):
    from ec_reference import ControlClient as RefClient, EventInbox as RefInbox

    ref = RefClient(timeout_ms=5000)
    inbox = RefInbox(ref)
    try:
        addr = addr_of(shard)
        assert ref.discover_shards(addr) == [addr]
        inbox.drain(addr)
        g = ref.request(addr, reserve_req(1))
        assert g["write"] is True and g["dst_ptr"] >= POOL_BASE
        assert ref.request(addr, {"op": "complete", "transfer_id": tid(1),
                                  "reservation_id": g["reservation_id"]})["became_ready"] is True
        events: list = []
        wait_for(lambda: events.extend(inbox.drain(addr)) or events)
        assert events[0]["transfer_id"] == tid(1)
        with pytest.raises(RuntimeError):
            ref.request(addr, {"op": "nope"})
    finally:
        inbox.close()
        ref.close()


def test_one_socket_per_thread(shard, client):
    addr = addr_of(shard)
    errors: list = []

    def worker(base: int) -> None:
        try:
            for i in range(20):
                assert client.request(addr, reserve_req(base + i))["write"] is True
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert shard.stats()["requests"] >= 80


def test_uuid_reservation_ids(shard, client):
    g = client.request(addr_of(shard), reserve_req(11))
    assert uuid.UUID(g["reservation_id"])


def _shutting_down(client, addr: str, i: int) -> bool:
    """Whether a repeated reserve of live writer `i` is refused: the book began its shutdown."""
    try:
        client.request(addr, reserve_req(i))
    except RuntimeError as e:
        assert "shutting down" in str(e)
        return True
    return False


def test_shutdown_waits_for_a_writer_and_releases_the_pool_once_it_completes(shard, client):
    addr = addr_of(shard)
    granted = client.request(addr, reserve_req(1))
    assert granted["write"] is True
    outcome: list[int] = []
    closer = threading.Thread(target=lambda: outcome.append(shard.shutdown(30.0)))
    closer.start()
    wait_for(lambda: _shutting_down(client, addr, 1))
    assert closer.is_alive(), "the close did not wait for the writer"
    done = client.request(addr, {"op": "complete", "transfer_id": tid(1),
                                 "reservation_id": granted["reservation_id"]})
    assert done["completed"] is True
    closer.join(timeout=20)
    assert outcome == [0]
    with pytest.raises(RuntimeError, match="not running"):
        shard.shutdown()


def test_shutdown_keeps_the_pool_registered_when_writers_outlast_the_wait(shard, client):
    addr = addr_of(shard)
    for i in (1, 2):
        assert client.request(addr, reserve_req(i))["write"] is True
    assert shard.shutdown(0.2) == 2
    with pytest.raises(ValueError, match="timeout_s"):
        ec.ConsumerShardServer("127.0.0.1", free_port(), 1 << 20).shutdown(-1.0)
