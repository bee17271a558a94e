"""Drop-ins for vLLM 0.33.0's P2P KV-tiering control transport
(``vllm.v1.kv_offload.tiering.p2p.control.zmq``).

When vLLM is importable, ``ZmqTransport`` and ``ZmqConnection`` are registered as
virtual subclasses of its ``ControlTransport`` and ``ControlConnection`` ABCs.
"""

from __future__ import annotations

from ctlplane._native import ZmqConnection, ZmqTransport

__all__ = ["ZmqConnection", "ZmqTransport"]


def _register_with_vllm() -> None:
    try:
        from vllm.v1.kv_offload.tiering.p2p.control.base import (
            ControlConnection,
            ControlTransport,
        )
    except Exception:  # vLLM absent, or present but not importable here
        return
    ControlTransport.register(ZmqTransport)
    ControlConnection.register(ZmqConnection)


_register_with_vllm()
