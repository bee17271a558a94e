"""ctlplane.p2p against itself and the Python reference transport, both ways."""

from __future__ import annotations

import pytest

import ctlplane.p2p as p2p
from conftest import free_port, open_fds, thread_count, wait_for

MSG = {"type": "probe", "key": b"\x00\xffbin", "text": "str", "big": 2**64 - 1, "neg": -(2**63),
       "f": 1.5, "nested": [1, {"a": None, "b": True}], "empty": b""}


def node(kind: str):
    port = free_port()
    local_id = f"127.0.0.1:{port}"
    if kind == "ctl":
        return p2p.ZmqTransport(local_id, "127.0.0.1", port), local_id
    from p2p_reference import ZmqTransport as RefTransport

    return RefTransport(local_id, "127.0.0.1", port), local_id


def accept(transport, others=()):
    """Polls `transport` (and keeps `others` polled) until it accepts a connection."""
    got: list = []

    def step():
        for o in others:
            o.poll()
        got.extend(transport.poll())
        return got

    return wait_for(step)[0]


def drain(conn, transports, n=1):
    msgs: list = []

    def step():
        for t in transports:
            t.poll()
        msgs.extend(conn.recv())
        return len(msgs) >= n

    wait_for(step)
    return msgs


@pytest.mark.parametrize("a_kind,b_kind", [("ctl", "ctl"), ("ctl", "ref"), ("ref", "ctl")])
def test_round_trip_both_ways(a_kind, b_kind):
    a, a_id = node(a_kind)
    b, b_id = node(b_kind)
    try:
        out = a.connect(b_id)
        assert out.peer_id == b_id and out.alive
        out.send(MSG)
        inbound = accept(b, [a])
        assert inbound.peer_id == a_id
        assert drain(inbound, [b]) == [MSG]
        inbound.send({"reply": "hello", "n": 7})
        got = drain(out, [a, b])
        assert got == [{"reply": "hello", "n": 7}]
        assert type(got[0]["reply"]) is str
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("b_kind", ["ctl", "ref"])
def test_large_and_small_messages_alternate_intact(b_kind):
    """A frame past the copy threshold is handed to libzmq whole; the small ones around it
    are written through the reused send buffer. None may see another's bytes."""
    a, _ = node("ctl")
    b, b_id = node(b_kind)
    try:
        out = a.connect(b_id)
        sent = [{"i": 0, "blob": b"a" * 3}, {"i": 1, "blob": bytes(range(256)) * 400},
                {"i": 2, "blob": b"c"}, {"i": 3, "blob": b"d" * 20_000}, {"i": 4, "s": "x" * 40}]
        for msg in sent:
            out.send(msg)
        inbound = accept(b, [a])
        assert drain(inbound, [b], n=len(sent)) == sent
    finally:
        a.close()
        b.close()


def test_value_types_stay_as_msgspec_writes_them():
    a, a_id = node("ctl")
    b, b_id = node("ctl")
    try:
        a.connect(b_id).send(MSG)
        conn = accept(b, [a])
        msg = drain(conn, [b])[0]
        assert type(msg["key"]) is bytes and type(msg["text"]) is str and msg["big"] == 2**64 - 1
        with pytest.raises(OverflowError):
            conn.send({"too_big": 2**64})
        with pytest.raises(TypeError):
            conn.send({1: "non-str key"})
        with pytest.raises(TypeError):
            conn.send({"x": object()})
    finally:
        a.close()
        b.close()


def test_duplicate_live_connect_asserts_and_dead_one_is_replaced():
    a, _ = node("ctl")
    b, b_id = node("ctl")
    try:
        first = a.connect(b_id)
        with pytest.raises(AssertionError, match="already exists"):
            a.connect(b_id)
        first.mark_dead()
        assert not first.alive
        with pytest.raises(RuntimeError, match=f"ZmqConnection: send on closed connection to {b_id}"):
            first.send({"x": 1})
        second = a.connect(b_id)
        assert second.alive and not first.alive
        first.close()  # the old handle never touches the new connection
        assert second.alive
        second.close()
        second.close()
        assert not second.alive
        with pytest.raises(RuntimeError, match="send on closed connection"):
            second.send({"x": 1})
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("restarted_kind", ["ctl", "ref"])
def test_restart_detection_and_first_message_after_reconnect(restarted_kind):
    a, a_id = node("ctl")
    b, b_id = node(restarted_kind)
    port = int(b_id.rsplit(":", 1)[1])
    try:
        out = a.connect(b_id)
        out.send({"hello": 1})
        inbound = accept(b, [a])
        drain(inbound, [b])
        inbound.send({"ack": 1})
        drain(out, [a, b])
        b.close()  # the peer goes away: the monitor's disconnect kills the connection
        wait_for(lambda: a.poll() is not None and not out.alive)
        # The peer restarts on the same address.
        if restarted_kind == "ctl":
            b = p2p.ZmqTransport(b_id, "127.0.0.1", port)
        else:
            from p2p_reference import ZmqTransport as RefTransport

            b = RefTransport(b_id, "127.0.0.1", port)
        again = a.connect(b_id)
        again.send({"first": "after reconnect"})
        inbound2 = accept(b, [a])
        assert drain(inbound2, [b]) == [{"first": "after reconnect"}]
        # And the restarted peer reaches us on our surviving ROUTER.
        inbound2.send({"back": True})
        assert drain(again, [a, b]) == [{"back": True}]
    finally:
        a.close()
        b.close()


def test_inbound_peer_restart_is_a_new_connection():
    a, a_id = node("ctl")
    b, b_id = node("ctl")
    try:
        b_out = b.connect(a_id)
        b_out.send({"n": 1})
        first = accept(a, [b])
        drain(first, [a])
        # a's DEALER back to b is connected once b hears from it: only a connected link
        # reports the disconnect that follows.
        first.send({"ack": 1})
        drain(b_out, [a, b])
        b.close()
        wait_for(lambda: a.poll() is not None and not first.alive)
        b = p2p.ZmqTransport(b_id, "127.0.0.1", int(b_id.rsplit(":", 1)[1]))
        b.connect(a_id).send({"n": 2})
        second = accept(a, [b])
        assert drain(second, [a]) == [{"n": 2}]
        assert not first.alive and first.recv() == []
    finally:
        a.close()
        b.close()


def test_full_send_queue_raises_connection_error():
    a, _ = node("ctl")
    # Nobody listens on this port: the DEALER queues until its high-water mark.
    conn = a.connect(f"127.0.0.1:{free_port()}")
    try:
        payload = {"pad": b"x" * 64}
        with pytest.raises(ConnectionError, match="send queue to .* is full"):
            for _ in range(200_000):
                conn.send(payload)
    finally:
        a.close()


def test_close_idempotent_and_no_leak():
    def cycle() -> None:
        a, a_id = node("ctl")
        b, b_id = node("ctl")
        a.connect(b_id).send({"x": 1})
        conn = accept(b, [a])
        drain(conn, [b])
        for t in (a, a, b, b):
            t.close()
        assert not conn.alive
        assert a.poll() == [] and conn.recv() == []

    cycle()
    fds, threads = open_fds(), thread_count()
    for _ in range(3):
        cycle()
    wait_for(lambda: open_fds() <= fds and thread_count() <= threads)


def test_virtual_subclasses_when_vllm_importable():
    try:
        from vllm.v1.kv_offload.tiering.p2p.control.base import ControlConnection, ControlTransport
    except Exception:
        pytest.skip("vllm is not importable here")
    assert issubclass(p2p.ZmqTransport, ControlTransport)
    assert issubclass(p2p.ZmqConnection, ControlConnection)


def _forged_dial_back(**options) -> bool:
    """A DEALER from 127.0.0.2 claims the identity of a plain TCP listener on 127.0.0.1 and
    sends one well-formed message; returns whether the node then dialled the listener."""
    import socket

    import msgspec
    import zmq

    port = free_port()
    transport = p2p.ZmqTransport(f"127.0.0.1:{port}", "127.0.0.1", port, **options)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, f"127.0.0.1:{listener.getsockname()[1]}".encode())
    dealer.connect(f"tcp://127.0.0.2:0;127.0.0.1:{port}")
    dealer.send(msgspec.msgpack.encode({"type": "connect", "node": "x"}))
    dialled = False
    try:
        # Bounded: poll the node for up to 1.5 s, stopping at the first dial.
        def step():
            nonlocal dialled
            transport.poll()
            try:
                conn, _ = listener.accept()
                conn.close()
                dialled = True
            except BlockingIOError:
                pass
            return dialled

        try:
            wait_for(step, timeout=1.5)
        except AssertionError:
            pass
    finally:
        dealer.close()
        ctx.term()
        listener.close()
        transport.close()
    return dialled


def test_a_forged_identity_is_not_dialled_back_unless_the_check_is_off_or_allows_it():
    assert not _forged_dial_back()
    assert _forged_dial_back(peer_check="off")
    with pytest.raises(ValueError, match="unknown peer check"):
        p2p.ZmqTransport("127.0.0.1:1", "127.0.0.1", free_port(), peer_check="trusting")
    with pytest.raises(ValueError, match="invalid peer allowlist entry"):
        p2p.ZmqTransport("127.0.0.1:1", "127.0.0.1", free_port(), peer_allow=["not an address"])


def _msgpack_corpus() -> list:
    """Values at every msgpack width boundary, as a tiering node may send them."""
    ints = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1,
            -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
    strs = ["", "é", "x" * 31, "x" * 32, "x" * 255, "x" * 256, "x" * 65535, "x" * 65536, "\u2603" * 20]
    blobs = [b"", b"\x00", b"b" * 255, b"b" * 256, b"b" * 65536]
    values = [{"v": v} for v in ints + strs + blobs]
    values += [{"f": 1.5}, {"f": -0.0}, {"f": float("inf")}, {"n": None, "t": True, "F": False}]
    values += [{"a": list(range(15))}, {"a": list(range(16))}, {"a": tuple(range(3))}, {"b": bytearray(b"ba")}]
    values += [{f"k{i}": i for i in range(15)}, {f"k{i}": i for i in range(16)}, {"d": {"e": [{"f": [b"g"]}]}}]
    return values


def test_frames_are_byte_for_byte_what_msgspec_writes_and_reads():
    """Every frame ctlplane sends is msgspec's encoding of the dict, and every msgspec
    frame received reads back as msgspec decodes it (tuples as lists, bytearray as bytes)."""
    import msgspec
    import zmq

    corpus = _msgpack_corpus()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVTIMEO, 10_000)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    port = free_port()
    transport = p2p.ZmqTransport(f"127.0.0.1:{port}", "127.0.0.1", port)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, f"127.0.0.1:{rport}".encode())
    try:
        out = transport.connect(f"127.0.0.1:{rport}")
        for value in corpus:
            out.send(value)
        for value in corpus:
            identity, payload = router.recv_multipart()
            assert identity == f"127.0.0.1:{port}".encode()
            assert payload == msgspec.msgpack.encode(value), value
        dealer.connect(f"tcp://127.0.0.1:{port}")
        for value in corpus:
            dealer.send(msgspec.msgpack.encode(value))
        got: list = []

        def step():
            transport.poll()
            got.extend(out.recv())
            return len(got) >= len(corpus)

        wait_for(step)
        assert got == [msgspec.msgpack.decode(msgspec.msgpack.encode(v)) for v in corpus]
    finally:
        transport.close()
        dealer.close()
        router.close()
        ctx.term()
