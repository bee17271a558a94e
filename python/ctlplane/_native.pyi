"""Type stubs of ctlplane's native module (PyO3); see ctlplane.ec and ctlplane.p2p."""

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, Callable

def make_cancel_request(
    transfer_id: str, reservation_id: str = "", *, abandon: bool = False, refresh: bool = False
) -> dict[str, Any]:
    """The ``cancel`` request from ctlplane's one cancel encoder (flags present only when true)."""

class ControlClient:
    """Control requests over reusable REQ sockets, one per (calling thread, address)."""

    def __init__(self, timeout_ms: int) -> None: ...
    def request(self, addr: str, payload: dict[str, Any]) -> Any:
        """The reply's ``result``; ``RuntimeError(error)`` when the server says not ok,
        ``TimeoutError`` when no reply comes within ``timeout_ms`` (the socket is
        discarded). Releases the GIL while waiting."""
    def discover_shards(self, base_addr: str) -> list[str] | None:
        """Every shard's control address, or None (not cached) when not reported."""
    def close(self) -> None:
        """Closes every socket. Idempotent."""

class EventInbox:
    """A consumer's readiness events, read without ever blocking."""

    def __init__(self, client: ControlClient, executor: Executor | None = None) -> None: ...
    @property
    def shard_count(self) -> int:
        """Shards subscribed to; 1 until subscribed."""
    def drain(self, base_addr: str) -> list[dict[str, Any]]:
        """Events queued so far; the first call only starts subscribing."""
    def close(self) -> None:
        """Stops discovery and the subscription. Idempotent."""

class ConsumerControlServer:
    """The reference's callback-mode consumer control server, served by ctlplane's loop.

    The callbacks run on ctlplane's serving thread (with the GIL taken for each call);
    their exceptions become ``{"ok": false, "error": str(exc)}`` replies."""

    host: str
    port: int
    peer_ports: list[int]
    def __init__(
        self,
        host: str,
        port: int,
        reserve: Callable[[dict[str, Any]], dict[str, Any]],
        status: Callable[[str], dict[str, Any] | None],
        complete: Callable[[str, str], tuple[bool, bool]],
        cancel: Callable[[str, str, bool, bool], bool],
        reap: Callable[[], int],
        peer_ports: list[int] | None = None,
        device: Any = None,
        drain_ready: Callable[[], list[str]] | None = None,
    ) -> None: ...
    @property
    def event_port(self) -> int | None:
        """The PUSH port of readiness events; None until started."""
    def start(self) -> None:
        """Binds and serves; ``RuntimeError`` when it cannot."""
    def close(self) -> None:
        """Stops serving and frees both ports. Idempotent."""

class ConsumerShardServer:
    """A consumer shard server whose reservation book is ctlplane's core."""

    def __init__(
        self,
        host: str,
        port: int,
        pool_bytes: int,
        *,
        pool_base: int = 0,
        peer_ports: list[int] | None = None,
        ttl_s: float = 300.0,
    ) -> None: ...
    @property
    def port(self) -> int: ...
    @property
    def peer_ports(self) -> list[int]: ...
    @property
    def event_port(self) -> int | None:
        """The PUSH port of readiness events; None until started."""
    def start(self) -> None:
        """Binds and serves on ctlplane's thread; ``RuntimeError`` when it cannot."""
    def close(self) -> None:
        """Stops serving and frees both ports. Idempotent."""
    def shutdown(self, timeout_s: float = 30.0) -> int:
        """Worker close with writers in flight: refuses new reserves, serves on while the
        writers drain (up to ``timeout_s``), then closes. Returns the writers left: 0 when
        the pool may be released, more when it must stay registered. ``RuntimeError`` when
        not running."""
    def status(self, transfer_id: str) -> dict[str, Any] | None:
        """What the ``status`` op answers."""
    def take(self, transfer_id: str, mm_hash: str) -> tuple[int, int] | None:
        """``(offset, nbytes)`` of a READY tensor in the pool, or None."""
    def drain_ready(self) -> list[str]:
        """Transfer ids turned READY since the last call (writers and their followers),
        in the order their readiness events went out."""
    def retire(self, mm_hash: str) -> None:
        """The encoder cache dropped ``mm_hash``: its region may be reused."""
    def stats(self) -> dict[str, int]:
        """The shard's counters."""

class ZmqConnection:
    """A message channel to one peer; messages are dicts (msgpack as msgspec)."""

    peer_id: str
    @property
    def alive(self) -> bool: ...
    def send(self, msg: dict[str, Any]) -> None:
        """Never blocks. ``RuntimeError`` on a dead connection, ``ConnectionError``
        when the peer's send queue is full."""
    def recv(self) -> Sequence[dict[str, Any]]:
        """Every message received since the last call."""
    def mark_dead(self) -> None:
        """Liveness only; the transport releases the sockets at its next poll."""
    def close(self) -> None:
        """Releases the sockets now. Idempotent."""

class ZmqTransport:
    """One node's P2P control transport: a ROUTER and one DEALER per peer."""

    def __init__(
        self,
        local_id: str,
        host: str,
        port: int,
        *,
        peer_check: str = "strict",
        peer_allow: Sequence[str] = (),
    ) -> None:
        """Binds the ROUTER. ``peer_check`` (``"strict"``, ``"allowlist"``, ``"off"``) and
        ``peer_allow`` (``host:port`` or CIDR entries) decide which inbound identities are
        dialled back; ``ValueError`` for an unknown mode or a bad entry."""
    @property
    def local_id(self) -> str: ...
    @property
    def port(self) -> int: ...
    def connect(self, peer_id: str) -> ZmqConnection:
        """A new outbound connection; ``AssertionError`` if a live one exists."""
    def poll(self) -> Sequence[ZmqConnection]:
        """Processes pending I/O; returns newly accepted inbound connections."""
    def close(self) -> None:
        """Closes every connection and the ROUTER. Idempotent."""
