"""Shared helpers: OS-chosen ports, bounded waits, the Python reference peers."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

import pytest

INTEROP = Path(__file__).resolve().parents[2] / "tests" / "interop"
sys.path.insert(0, str(INTEROP))

T = TypeVar("T")


def free_port() -> int:
    """A port the OS just handed out (and released) on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(fn: Callable[[], T], timeout: float = 10.0, step: float = 0.005) -> T:
    """Polls `fn` until it returns something truthy, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(step)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def port() -> int:
    return free_port()
