"""Loads the EC consumer and client of a released vLLM wheel, for conformance tests.

The wheel is downloaded on first use (`pip download --no-deps vllm==<VERSION>`) into
`$CTLPLANE_VLLM_CACHE` (default `~/.cache/ctlplane/vllm-<VERSION>`); its Mooncake EC
modules are imported straight from the wheel at test time and never copied into the
repository. Only what cannot run here is stubbed: torch when it is absent
(`torch_stub.py`), the Mooncake transfer engine, vLLM's logger and network helpers, and
any other vLLM module those files import but the consumer never calls.
"""

from __future__ import annotations

import glob
import importlib.abc
import importlib.util
import logging
import os
import subprocess
import sys
import types
import zipfile

# The release under test: the one line to change to move to the next one.
VERSION = "0.33.0"

PACKAGE = "vllm.distributed.ec_transfer.ec_connector.mooncake"
# Modules of the package executed from the wheel; the rest of vLLM is stubbed.
REAL = {"control", "reservation", "memory", "worker", "config", "metadata", "producer"}


def cache_dir() -> str:
    default = os.path.join(os.path.expanduser("~"), ".cache", "ctlplane", f"vllm-{VERSION}")
    return os.environ.get("CTLPLANE_VLLM_CACHE", default)


def wheel_path() -> str:
    """The cached wheel, downloaded when missing."""
    directory = cache_dir()
    found = sorted(glob.glob(os.path.join(directory, f"vllm-{VERSION}-*.whl")))
    if found:
        return found[0]
    os.makedirs(directory, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"vllm=={VERSION}", "-d", directory],
        check=True,
    )
    found = sorted(glob.glob(os.path.join(directory, f"vllm-{VERSION}-*.whl")))
    if not found:
        raise RuntimeError(f"pip download left no vllm-{VERSION} wheel in {directory}")
    return found[0]


class _Permissive(types.ModuleType):
    """A stand-in module: any attribute is a placeholder class."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, value)
        return value


class _Transfer:
    """The Mooncake engine stand-in: registration succeeds, the session is fixed."""

    session = "127.0.0.1:0"

    def __init__(self, *args, **kwargs) -> None:
        pass

    def local_session(self) -> str:
        return self.session

    def register_memory(self, tensor) -> int:
        return 0

    def unregister_memory(self, tensor) -> bool:
        return True


def _make_zmq_path(scheme: str, host: str, port: int | None = None) -> str:
    if port is None:
        return f"{scheme}://{host}"
    if ":" in host:
        return f"{scheme}://[{host}]:{port}"
    return f"{scheme}://{host}:{port}"


class _WheelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, wheel: str) -> None:
        self.zip = zipfile.ZipFile(wheel)
        self.names = set(self.zip.namelist())

    def find_spec(self, fullname, path, target=None):
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        name = spec.name
        if name == "vllm.logger":
            mod = types.ModuleType(name)
            mod.init_logger = logging.getLogger
            return mod
        if name == "vllm.utils.network_utils":
            mod = types.ModuleType(name)
            mod.make_zmq_path = _make_zmq_path
            mod.get_ip = lambda: "127.0.0.1"
            return mod
        if name == f"{PACKAGE}.transfer":
            mod = types.ModuleType(name)
            mod.MooncakeTransfer = _Transfer
            mod.ensure_mooncake_available = lambda: None
            return mod
        leaf = name.rsplit(".", 1)[-1]
        if name.startswith(PACKAGE + ".") and leaf in REAL:
            return types.ModuleType(name)
        return _Permissive(name)

    def exec_module(self, module):
        name = module.__name__
        leaf = name.rsplit(".", 1)[-1]
        module.__path__ = []
        if name.startswith(PACKAGE + ".") and leaf in REAL:
            source = self.zip.read(name.replace(".", "/") + ".py")
            module.__file__ = f"{self.zip.filename}/{name.replace('.', '/')}.py"
            exec(compile(source, module.__file__, "exec"), module.__dict__)


def load():
    """Installs torch (or its stub) and the wheel importer; returns the three modules."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import torch_stub

    torch_stub.install()
    if not any(isinstance(f, _WheelFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _WheelFinder(wheel_path()))
    import importlib

    control = importlib.import_module(f"{PACKAGE}.control")
    memory = importlib.import_module(f"{PACKAGE}.memory")
    reservation = importlib.import_module(f"{PACKAGE}.reservation")
    worker = importlib.import_module(f"{PACKAGE}.worker")
    return control, memory, reservation, worker


def start_consumer(port: int, pool_bytes: int, host: str = "127.0.0.1"):
    """The release's own consumer shard (TP 1) on `port`, served by its control thread."""
    control, memory, reservation, worker = load()
    import torch

    transfer = _Transfer()
    pool = memory.ConsumerMemoryPool(pool_bytes, transfer)
    pool.prepare(torch.device("cpu"))
    manager = reservation.ConsumerReservationManager(pool, 300.0, 1 << 16)
    shard = worker.ECMooncakeWorker.__new__(worker.ECMooncakeWorker)
    shard._reservations = manager
    shard._transfer = transfer
    server = control.ConsumerControlServer(
        host,
        port,
        shard._reserve_push_destination,
        shard._push_status,
        manager.complete,
        manager.cancel,
        manager.expire,
        peer_ports=[port],
        device=torch.device("cpu"),
        drain_ready=manager.drain_ready,
    )
    server.start()
    return server
