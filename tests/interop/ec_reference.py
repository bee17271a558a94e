"""The Python side of the EC control channel, written from ctlplane's behaviour reference.

ConsumerControlServer, ControlClient and EventInbox follow vLLM's Mooncake EC connector
(`control.py`) line for line, minus the CUDA device handling. `ToyReservations` is a
minimal in-memory reservation manager so the server has something to serve.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Executor, Future
from typing import Any, Callable

import zmq

logger = logging.getLogger("ec_reference")

_MAX_PENDING_EVENTS = 4096
_RESERVATION_REAP_INTERVAL_SECONDS = 1


def make_zmq_path(scheme: str, host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"{scheme}://[{host}]:{port}"
    return f"{scheme}://{host}:{port}"


class ConsumerControlServer:
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
        drain_ready: Callable[[], list[str]] = lambda: [],
    ) -> None:
        self.host = host
        self.port = port
        self.peer_ports = peer_ports or [port]
        self.event_port: int | None = None
        self._reserve = reserve
        self._status = status
        self._complete = complete
        self._cancel = cancel
        self._reap = reap
        self._drain_ready = drain_ready
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._startup_error: Exception | None = None

    def start(self) -> None:
        def loop() -> None:
            context = zmq.Context()
            socket = context.socket(zmq.REP)
            event_socket = context.socket(zmq.PUSH)
            socket.setsockopt(zmq.IPV6, 1)
            event_socket.setsockopt(zmq.IPV6, 1)
            pending_events: deque[dict[str, Any]] = deque()

            def queue_event(event: dict[str, Any]) -> None:
                event["shard"] = self.port
                if len(pending_events) >= _MAX_PENDING_EVENTS:
                    pending_events.popleft()
                pending_events.append(event)

            def queue_ready(transfer_id: str) -> None:
                status = self._status(transfer_id)
                if status is not None:
                    queue_event({"transfer_id": transfer_id, **status})

            last_reap_at = time.monotonic()
            socket.setsockopt(zmq.RCVTIMEO, 100)
            try:
                socket.bind(make_zmq_path("tcp", self.host, self.port))
                event_socket.bind(make_zmq_path("tcp", self.host, 0))
                self.event_port = int(event_socket.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
            except Exception as e:
                self._startup_error = e
                self._started.set()
                socket.close(linger=0)
                event_socket.close(linger=0)
                context.term()
                return
            self._started.set()
            try:
                while not self._stop.is_set():
                    while pending_events:
                        try:
                            event_socket.send_json(pending_events[0], flags=zmq.DONTWAIT)
                        except zmq.Again:
                            break
                        pending_events.popleft()
                    now = time.monotonic()
                    if now - last_reap_at >= _RESERVATION_REAP_INTERVAL_SECONDS:
                        self._reap()
                        last_reap_at = now
                    try:
                        request = socket.recv_json()
                    except zmq.Again:
                        continue
                    except Exception:
                        socket.send_json({"ok": False, "error": "malformed control request"})
                        continue
                    try:
                        op = request.get("op")
                        result: Any = None
                        if op in ("reserve", "reserve_batch"):
                            items = request["items"] if op == "reserve_batch" else [request]
                            results = []
                            for item in items:
                                try:
                                    reserved = self._reserve(item)
                                    results.append({"ok": True, "result": reserved})
                                    if reserved.get("ready"):
                                        queue_ready(str(item["transfer_id"]))
                                except Exception as exc:
                                    results.append({"ok": False, "error": str(exc)})
                            if op == "reserve_batch":
                                result = {"items": results}
                            elif not results[0]["ok"]:
                                raise RuntimeError(results[0]["error"])
                            else:
                                result = results[0]["result"]
                        elif op == "status":
                            result = self._status(str(request["transfer_id"]))
                        elif op == "event_port":
                            result = self.event_port
                        elif op == "peers":
                            result = {"ports": self.peer_ports}
                        elif op in ("complete", "complete_batch"):
                            items = request["items"] if op == "complete_batch" else [request]
                            completions = []
                            for item in items:
                                transfer_id = str(item["transfer_id"])
                                accepted, became_ready = self._complete(transfer_id, str(item["reservation_id"]))
                                for ready_id in self._drain_ready():
                                    queue_ready(ready_id)
                                completions.append({"completed": accepted, "became_ready": became_ready})
                                if not became_ready:
                                    continue
                                queue_ready(transfer_id)
                            result = {"items": completions} if op == "complete_batch" else completions[0]
                        elif op == "cancel":
                            result = {
                                "cancelled": self._cancel(
                                    str(request["transfer_id"]),
                                    str(request.get("reservation_id", "")),
                                    bool(request.get("abandon", False)),
                                    bool(request.get("refresh", False)),
                                )
                            }
                        else:
                            raise ValueError(f"unknown control op: {op!r}")
                        socket.send_json({"ok": True, "result": result})
                    except Exception as e:
                        socket.send_json({"ok": False, "error": str(e)})
            finally:
                socket.close(linger=0)
                event_socket.close(linger=0)
                context.term()

        self._thread = threading.Thread(target=loop, name="ec-mooncake-control", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout=5):
            raise RuntimeError("EC Mooncake control channel failed to start")
        if self._startup_error is not None:
            raise RuntimeError("EC Mooncake control channel failed to bind") from self._startup_error

    def close(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None


class ControlClient:
    def __init__(self, timeout_ms: int) -> None:
        self._context = zmq.Context()
        self._timeout_ms = timeout_ms
        self._local = threading.local()
        self._topologies: dict[str, list[str]] = {}
        self._closed = False

    def _sockets(self) -> dict[str, zmq.Socket]:
        sockets = getattr(self._local, "sockets", None)
        if sockets is None:
            sockets = {}
            self._local.sockets = sockets
        return sockets

    def _discard(self, addr: str) -> None:
        socket = self._sockets().pop(addr, None)
        if socket is not None:
            socket.close(linger=0)

    def _exchange(self, addr: str, payload: dict) -> dict:
        sockets = self._sockets()
        socket = sockets.get(addr)
        if socket is None:
            socket = self._context.socket(zmq.REQ)
            socket.setsockopt(zmq.IPV6, 1)
            socket.setsockopt(zmq.RCVTIMEO, self._timeout_ms)
            socket.setsockopt(zmq.SNDTIMEO, self._timeout_ms)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(addr)
            sockets[addr] = socket
        try:
            socket.send_json(payload)
            response = socket.recv_json()
        except Exception:
            self._discard(addr)
            raise
        assert isinstance(response, dict)
        return response

    def request(self, addr: str, payload: dict) -> Any:
        response = self._exchange(addr, payload)
        if not response.get("ok"):
            raise RuntimeError(response.get("error", "EC control request failed"))
        return response.get("result")

    def discover_shards(self, base_addr: str) -> list[str] | None:
        if base_addr in self._topologies:
            return self._topologies[base_addr]
        try:
            reply = self.request(base_addr, {"op": "peers"})
            ports = reply.get("ports") if isinstance(reply, dict) else None
            if not isinstance(ports, list) or not ports:
                raise ValueError("invalid or empty peer list")
            prefix = base_addr.rsplit(":", 1)[0]
            shards = [f"{prefix}:{int(port)}" for port in ports]
        except Exception:
            return None
        self._topologies[base_addr] = shards
        return shards

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._context.destroy(linger=0)


class EventInbox:
    def __init__(self, client: ControlClient, executor: Executor | None = None) -> None:
        self._client = client
        self._executor = executor
        self._discovery: Future | None = None
        self._context: zmq.Context | None = None
        self._socket: zmq.Socket | None = None
        self._closed = False
        self.shard_count = 1

    def _endpoints(self, base_addr: str) -> list[str] | None:
        shards = self._client.discover_shards(base_addr)
        if shards is None:
            return None
        endpoints = []
        for addr in shards:
            try:
                event_port = self._client.request(addr, {"op": "event_port"})
                address, _ = addr.rsplit(":", 1)
                endpoints.append(f"{address}:{int(event_port)}")
            except Exception:
                return None
        return endpoints

    def _connect(self, base_addr: str) -> None:
        if self._socket is not None or self._closed:
            return
        if self._executor is None:
            self._install(self._endpoints(base_addr))
            return
        if self._discovery is None:
            self._discovery = self._executor.submit(self._endpoints, base_addr)
            return
        if not self._discovery.done():
            return
        discovery, self._discovery = self._discovery, None
        try:
            self._install(discovery.result())
        except Exception:
            pass

    def _install(self, endpoints: list[str] | None) -> None:
        if not endpoints or self._closed:
            return
        context = zmq.Context()
        socket = context.socket(zmq.PULL)
        socket.setsockopt(zmq.IPV6, 1)
        for endpoint in endpoints:
            socket.connect(endpoint)
        self._context = context
        self._socket = socket
        self.shard_count = len(endpoints)

    def drain(self, base_addr: str) -> list[dict[str, Any]]:
        self._connect(base_addr)
        if self._socket is None:
            return []
        events = []
        while True:
            try:
                events.append(self._socket.recv_json(flags=zmq.DONTWAIT))
            except zmq.Again:
                return events
            except zmq.ZMQError:
                return events
            except (ValueError, UnicodeError):
                pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if self._context is not None:
            self._context.term()


_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int32": 4, "int64": 8}


class ToyReservations:
    """A minimal reservation manager: writers, completion, cancel, status. No followers."""

    def __init__(self, session: str, base: int, pool_bytes: int) -> None:
        self._lock = threading.RLock()
        self._session = session
        self._base = base
        self._next = 0
        self._pool = pool_bytes
        self._records: dict[str, dict[str, Any]] = {}

    def reserve(self, item: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            transfer_id = str(item["transfer_id"])
            mm_hash = str(item["mm_hash"])
            nbytes = int(item["nbytes"])
            shape = [int(x) for x in item["shape"]]
            dtype = str(item["dtype"])
            if dtype not in _ITEMSIZE:
                raise ValueError(f"Unsupported torch dtype string: {dtype!r}")
            count = 1
            for d in shape:
                count *= d
            if count * _ITEMSIZE[dtype] != nbytes:
                raise ValueError("shape and dtype do not match nbytes")
            rec = self._records.get(transfer_id)
            if rec is not None:
                if rec["state"] == "CANCELLED":
                    return {"reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": nbytes,
                            "write": False, "ready": False, "cancelled": True}
                return {"reservation_id": rec["reservation_id"], "dst_session": self._session,
                        "dst_ptr": rec["dst_ptr"], "nbytes": nbytes, "write": False,
                        "ready": rec["state"] == "READY", "cached": False}
            aligned = max(256, (nbytes + 255) // 256 * 256)
            if self._next + aligned > self._pool:
                raise RuntimeError("EC consumer buffer pool is full")
            rec = {"mm_hash": mm_hash, "reservation_id": uuid.uuid4().hex, "state": "WRITING",
                   "nbytes": nbytes, "shape": shape, "dtype": dtype, "dst_ptr": self._base + self._next}
            self._next += aligned
            self._records[transfer_id] = rec
            return {"reservation_id": rec["reservation_id"], "dst_session": self._session,
                    "dst_ptr": rec["dst_ptr"], "nbytes": nbytes, "write": True, "ready": False, "cached": False}

    def status(self, transfer_id: str) -> dict[str, Any] | None:
        with self._lock:
            rec = self._records.get(transfer_id)
            if rec is None or rec["state"] == "CANCELLED":
                return None
            return {"mm_hash": rec["mm_hash"], "ready": rec["state"] == "READY",
                    "reservation_id": rec["reservation_id"], "nbytes": rec["nbytes"],
                    "shape": rec["shape"], "dtype": rec["dtype"]}

    def complete(self, transfer_id: str, reservation_id: str) -> tuple[bool, bool]:
        with self._lock:
            rec = self._records.get(transfer_id)
            if rec is None or rec["reservation_id"] != reservation_id:
                return (False, False)
            if rec["state"] == "READY":
                return (True, False)
            if rec["state"] != "WRITING":
                return (False, False)
            rec["state"] = "READY"
            return (True, True)

    def cancel(self, transfer_id: str, reservation_id: str, abandon: bool, refresh: bool) -> bool:
        with self._lock:
            rec = self._records.get(transfer_id)
            if rec is not None and reservation_id and rec["reservation_id"] != reservation_id:
                return False
            if rec is None:
                self._records[transfer_id] = {"mm_hash": "", "reservation_id": "", "state": "CANCELLED",
                                              "nbytes": 0, "shape": [], "dtype": "", "dst_ptr": 0}
                return True
            rec["state"] = "CANCELLED"
            return True

    def reap(self) -> int:
        return 0
