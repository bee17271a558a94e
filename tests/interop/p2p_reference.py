"""The Python side of the P2P control transport, written from ctlplane's behaviour reference.

`ZmqTransport` / `ZmqConnection` follow vLLM's KV-tiering `control/zmq.py` at the T1
lineage (merged #49823) line for line: one ROUTER, one DEALER per peer with a monitor PAIR,
heartbeat options, sweep-first `poll`, `msgspec.msgpack` frames. `HandshakeSession` is the
W1 session's handshake only (p2p-behaviour.md §2.3): each side announces itself with a Connect, a valid
Connect is answered with a ConnectAck, and the session is ready on the peer's Ack.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import zmq
import zmq.utils.monitor

logger = logging.getLogger("p2p_reference")

_HEARTBEAT_IVL_MS = 2000
_HEARTBEAT_TIMEOUT_MS = 10000
_HEARTBEAT_TTL_MS = 10000

_EMPTY_INBOX: tuple = ()
_EMPTY_NEW_CONNECTIONS: tuple = ()


def _tcp_addr(host: str, port: int | str) -> str:
    return "tcp://" + host + ":" + str(port)


def _apply_heartbeat(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, _HEARTBEAT_TTL_MS)


@dataclass
class _Sockets:
    dealer: zmq.Socket
    monitor: zmq.Socket


class ZmqConnection:
    """Bidirectional message channel to a single remote peer."""

    def __init__(self, peer_id: str, sockets: _Sockets) -> None:
        self.peer_id = peer_id
        self._sockets = sockets
        self._dead = False
        self._closed = False
        self._inbox: list[dict] = []

    def send(self, msg: dict) -> None:
        if not self.alive:
            raise RuntimeError(f"ZmqConnection: send on closed connection to {self.peer_id}")
        data = msgspec.msgpack.encode(msg)
        self._sockets.dealer.send(data)

    def recv(self) -> Sequence[dict]:
        if not self._inbox:
            return _EMPTY_INBOX
        msgs = self._inbox
        self._inbox = []
        return msgs

    @property
    def alive(self) -> bool:
        return not (self._dead or self._closed)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._dead = True
        logger.info("ZmqConnection: closing connection to %s", self.peer_id)
        self._sockets.monitor.close()
        self._sockets.dealer.close()

    def enqueue(self, msg: dict) -> None:
        self._inbox.append(msg)

    def mark_dead(self) -> None:
        self._dead = True

    @property
    def monitor_socket(self) -> zmq.Socket:
        return self._sockets.monitor


class ZmqTransport:
    """ROUTER for inbound traffic, one DEALER per peer for outbound; content agnostic."""

    def __init__(self, local_id: str, host: str, port: int) -> None:
        self._local_id = local_id
        self._closed = False
        self._connections: dict[str, ZmqConnection] = {}
        self._pending_inbound: list[tuple[str, dict]] = []
        self._monitor_seq = 0
        self._zmq_ctx = zmq.Context()
        self._router: zmq.Socket = self._zmq_ctx.socket(zmq.ROUTER)
        _apply_heartbeat(self._router)
        bind_addr = _tcp_addr(host, port)
        self._router.bind(bind_addr)
        logger.info("ZmqTransport %s: ROUTER bound on %s", self._local_id, bind_addr)

    def connect(self, peer_id: str) -> ZmqConnection:
        existing = self._connections.get(peer_id)
        if existing is not None:
            assert not existing.alive, f"ZmqConnection to {peer_id} already exists"
            logger.info("ZmqTransport %s: retiring dead connection to %s before reconnect", self._local_id, peer_id)
            self._connections.pop(peer_id).close()
        return self._open_connection(peer_id, direction="outbound")

    def poll(self) -> Sequence[ZmqConnection]:
        self._sweep_dead_connections()
        self._recv_router()
        self._check_monitors()
        self._sweep_dead_connections()
        new_connections: list[ZmqConnection] | None = None
        for sender_id, msg in self._pending_inbound:
            conn = self._connections.get(sender_id)
            if conn is None:
                logger.info("ZmqTransport %s: accepting INBOUND connection from %s", self._local_id, sender_id)
                conn = self._open_connection(sender_id, direction="inbound")
                if new_connections is None:
                    new_connections = []
                new_connections.append(conn)
            conn.enqueue(msg)
        self._pending_inbound.clear()
        return new_connections if new_connections is not None else _EMPTY_NEW_CONNECTIONS

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.close()
        self._zmq_ctx.destroy(linger=0)

    def _open_connection(self, peer_id: str, direction: str = "outbound") -> ZmqConnection:
        host, port_str = peer_id.rsplit(":", 1)
        dealer_addr = _tcp_addr(host, port_str)
        dealer = self._zmq_ctx.socket(zmq.DEALER)
        _apply_heartbeat(dealer)
        dealer.identity = self._local_id.encode()
        safe_id = peer_id.replace(":", "-").replace("/", "-")
        monitor_addr = f"inproc://p2p-monitor-{safe_id}-{self._monitor_seq}"
        self._monitor_seq += 1
        dealer.monitor(monitor_addr, zmq.EVENT_DISCONNECTED)
        monitor_sock = self._zmq_ctx.socket(zmq.PAIR)
        monitor_sock.connect(monitor_addr)
        dealer.connect(dealer_addr)
        conn = ZmqConnection(peer_id, _Sockets(dealer=dealer, monitor=monitor_sock))
        self._connections[peer_id] = conn
        logger.info("ZmqTransport %s: %s connection established to %s", self._local_id, direction, peer_id)
        return conn

    def _sweep_dead_connections(self) -> None:
        for pid in [p for p, c in self._connections.items() if not c.alive]:
            self._connections.pop(pid).close()

    def _recv_router(self) -> None:
        while True:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError as exc:
                logger.warning("ZmqTransport %s: recv error: %s", self._local_id, exc)
                break
            if len(frames) != 2:
                logger.warning("ZmqTransport %s: dropping message with %d frames (expected 2)", self._local_id, len(frames))
                continue
            identity, data = frames
            sender_id = identity.decode()
            try:
                msg = msgspec.msgpack.decode(data)
            except Exception as exc:
                logger.warning("ZmqTransport %s: failed to decode message from %s: %s", self._local_id, sender_id, exc)
                continue
            conn = self._connections.get(sender_id)
            if conn is not None:
                conn.enqueue(msg)
            else:
                self._pending_inbound.append((sender_id, msg))

    def _check_monitors(self) -> None:
        for conn in self._connections.values():
            if not conn.alive:
                continue
            try:
                event = zmq.utils.monitor.recv_monitor_message(conn.monitor_socket, zmq.NOBLOCK)
            except zmq.Again:
                continue
            except zmq.ZMQError as exc:
                logger.warning("ZmqTransport %s: monitor error for peer %s: %s", self._local_id, conn.peer_id, exc)
                continue
            if event["event"] == zmq.EVENT_DISCONNECTED:
                conn.mark_dead()


# --- W1 session handshake (p2p-behaviour.md §2.1-2.3) -------------------------------------------------

TYPE_KEY = "type"


def _require(msg: dict, field: str, kind: type, name: str) -> object:
    value = msg.get(field)
    if not isinstance(value, kind):
        raise ValueError(f"{name}: field {field!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


@dataclass
class LocalRegion:
    agent_metadata: bytes
    base_addr: int
    num_blocks: int
    block_len: int
    config_fingerprint: str
    hash_seed: str


class HandshakeSession:
    """One peer's W1 session, handshake and send gating only."""

    def __init__(self, peer_id: str, local_id: str, region: LocalRegion, conn: ZmqConnection) -> None:
        self.peer_id = peer_id
        self.local_id = local_id
        self.region = region
        self.conn = conn
        self.ready = False
        self.remote_connect: dict | None = None
        self.death: str | None = None
        self._send(
            {
                TYPE_KEY: "connect",
                "peer_id": local_id,
                "agent_metadata": region.agent_metadata,
                "base_addr": region.base_addr,
                "num_blocks": region.num_blocks,
                "block_len": region.block_len,
                "config_fingerprint": region.config_fingerprint,
                "hash_seed": region.hash_seed,
            }
        )

    @property
    def alive(self) -> bool:
        return self.conn.alive

    def _send(self, msg: dict) -> None:
        try:
            self.conn.send(msg)
        except Exception as exc:
            logger.warning("send to %s failed: %s", self.peer_id, exc)
            self._die(f"send failed: {exc}")

    def _die(self, reason: str) -> None:
        if self.death is None:
            self.death = reason
        self.conn.mark_dead()

    def poll(self) -> None:
        for msg in self.conn.recv():
            if not self.conn.alive:
                break
            try:
                self._dispatch(msg)
            except ValueError as exc:
                logger.warning("protocol error from %s: %s", self.peer_id, exc)
                self._send({TYPE_KEY: "disconnect"})
                self._die(f"protocol error: {exc}")
        if not self.conn.alive:
            self._die("connection lost")

    def _dispatch(self, msg: object) -> None:
        kind = msg.get(TYPE_KEY) if isinstance(msg, dict) else None
        if kind == "connect":
            if self.ready:
                raise ValueError("duplicate connect after handshake")
            _require(msg, "peer_id", str, "ConnectMsg")
            _require(msg, "agent_metadata", bytes, "ConnectMsg")
            for field in ("base_addr", "num_blocks", "block_len"):
                _require(msg, field, int, "ConnectMsg")
            _require(msg, "hash_seed", str, "ConnectMsg")
            if msg["block_len"] != self.region.block_len:
                raise ValueError(f"block_len mismatch: local {self.region.block_len} vs remote {msg['block_len']}")
            remote_fp = msg.get("config_fingerprint", "")
            if remote_fp and self.region.config_fingerprint and remote_fp != self.region.config_fingerprint:
                raise ValueError("config fingerprint mismatch")
            if msg["hash_seed"] != self.region.hash_seed:
                raise ValueError("hash_seed mismatch")
            self.remote_connect = msg
            self._send({TYPE_KEY: "connect_ack", "peer_id": self.local_id})
        elif kind == "connect_ack":
            _require(msg, "peer_id", str, "ConnectAckMsg")
            self.ready = True
        elif kind == "disconnect":
            self._die("peer sent disconnect")
        else:
            logger.warning("ignoring message of unknown type from %s: %r", self.peer_id, msg)
