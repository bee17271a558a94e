"""Drop-ins for vLLM 0.33.0's EC Mooncake control plane
(``vllm.distributed.ec_transfer.ec_connector.mooncake.control``).

``ControlClient``, ``EventInbox`` and ``make_cancel_request`` have the reference's
names, signatures and exception types. ``ConsumerControlServer`` is the callback
mode: ctlplane's serving loop calls the reference's five callbacks (and
``drain_ready``) where the reference does. ``ConsumerShardServer`` is the native-book
consumer shard server: ctlplane's core answers every request, so no request takes the
GIL; it is the mode ctlplane's simulator tests (see docs/python.md).
"""

from __future__ import annotations

from typing import Any

from ctlplane import _native
from ctlplane._native import ConsumerControlServer, ConsumerShardServer, ControlClient, EventInbox

ControlRequest = dict[str, Any]
ControlResponse = dict[str, Any]

__all__ = [
    "ConsumerControlServer",
    "ConsumerShardServer",
    "ControlClient",
    "ControlRequest",
    "ControlResponse",
    "EventInbox",
    "make_cancel_request",
]


def make_cancel_request(
    transfer_id: str,
    reservation_id: str = "",
    *,
    abandon: bool = False,
    refresh: bool = False,
) -> ControlRequest:
    """The ``cancel`` request: ``abandon`` and ``refresh`` are present only when true.

    Built by ctlplane's one cancel encoder (the frame the Rust producer and client send).
    """
    request: ControlRequest = _native.make_cancel_request(
        transfer_id, reservation_id, abandon=abandon, refresh=refresh
    )
    return request
