"""A minimal stand-in for `torch`, installed only when torch is absent.

vLLM's consumer modules use torch for dtypes and for views into the registered receive
slab. This stub gives them exactly that much: the dtype table (names, aliases, item
sizes), a CPU slab tensor whose `narrow`/`view`/`data_ptr` follow torch's rules and
error texts, and no-op CUDA hooks. Nothing here is vLLM's code.
"""

from __future__ import annotations

import math
import sys
import types

SLAB_BASE = 0x7F00_0000_0000

# (name, itemsize, aliases): torch 2.14's dtypes.
_DTYPES = [
    ("float16", 2, ["half"]), ("bfloat16", 2, []), ("float32", 4, ["float"]),
    ("float64", 8, ["double"]), ("float8_e4m3fn", 1, []), ("float8_e4m3fnuz", 1, []),
    ("float8_e5m2", 1, []), ("float8_e5m2fnuz", 1, []), ("float8_e8m0fnu", 1, []),
    ("float4_e2m1fn_x2", 1, []), ("int8", 1, []), ("uint8", 1, []), ("int16", 2, ["short"]),
    ("uint16", 2, []), ("int32", 4, ["int"]), ("uint32", 4, []), ("int64", 8, ["long"]),
    ("uint64", 8, []), ("bool", 1, []), ("complex32", 4, ["chalf"]),
    ("complex64", 8, ["cfloat"]), ("complex128", 16, ["cdouble"]), ("quint8", 1, []),
    ("qint8", 1, []), ("qint32", 4, []), ("quint4x2", 1, []), ("quint2x4", 1, []),
    ("bits1x8", 1, []), ("bits2x4", 1, []), ("bits4x2", 1, []), ("bits8", 1, []),
    ("bits16", 2, []),
] + [(f"uint{n}", 1, []) for n in range(1, 8)] + [(f"int{n}", 1, []) for n in range(1, 8)]


class dtype:
    def __init__(self, name: str, itemsize: int) -> None:
        self.name = name
        self.itemsize = itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class device:
    def __init__(self, spec: str = "cpu", index: int | None = None) -> None:
        self.type = str(spec).split(":")[0]
        self.index = index


def _infer(shape: tuple[int, ...], numel: int) -> tuple[int, ...]:
    """torch's `infer_size`, with its error texts."""
    infer, newsize = None, 1
    for i, d in enumerate(shape):
        if d == -1:
            if infer is not None:
                raise RuntimeError("only one dimension can be inferred")
            infer = i
        elif d >= 0:
            newsize *= d
        else:
            raise RuntimeError(f"invalid shape dimension {d}")
    if numel == newsize or (infer is not None and newsize > 0 and numel % newsize == 0):
        if infer is not None:
            if newsize == 0:
                raise RuntimeError(
                    f"cannot reshape tensor of {numel} elements into shape {list(shape)} because the "
                    "unspecified dimension size -1 can be any value and is ambiguous"
                )
            shape = shape[:infer] + (numel // newsize,) + shape[infer + 1 :]
        return tuple(shape)
    raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")


class Tensor:
    def __init__(self, offset: int, shape: tuple[int, ...], dt: dtype, dev: device) -> None:
        self._offset = offset
        self.shape = tuple(shape)
        self.dtype = dt
        self.device = dev

    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel() * self.dtype.itemsize

    def data_ptr(self) -> int:
        # torch gives an empty tensor a null pointer.
        return 0 if self.numel() == 0 else SLAB_BASE + self._offset

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
        if length < 0:
            raise RuntimeError("narrow(): length must be non-negative.")
        return Tensor(self._offset + start * self.dtype.itemsize, (length,), self.dtype, self.device)

    def view(self, what) -> "Tensor":
        if isinstance(what, dtype):
            size = self.nbytes // what.itemsize
            return Tensor(self._offset, (size,), what, self.device)
        return Tensor(self._offset, _infer(tuple(what), self.numel()), self.dtype, self.device)

    def copy_(self, other, non_blocking: bool = False) -> "Tensor":
        return self


class OutOfMemoryError(RuntimeError):
    pass


class Event:
    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True


def empty(size: int, dtype: dtype, device: device) -> Tensor:
    return Tensor(0, (int(size),), dtype, device)


def install() -> types.ModuleType:
    """Registers the stub as `torch` (only if the real one is absent)."""
    try:
        import torch  # noqa: F401

        return sys.modules["torch"]
    except ImportError:
        pass
    mod = types.ModuleType("torch")
    for name, size, aliases in _DTYPES:
        dt = dtype(name, size)
        setattr(mod, name, dt)
        for alias in aliases:
            setattr(mod, alias, dt)
    mod.nan = float("nan")
    mod.inf = float("inf")
    for attr in ("dtype", "device", "Tensor", "Event", "OutOfMemoryError", "empty"):
        setattr(mod, attr, globals()[attr])
    mod.accelerator = types.SimpleNamespace(set_device_index=lambda i: None, current_stream=lambda d=None: None)
    mod.cuda = types.SimpleNamespace(Stream=lambda device=None: None, stream=None)
    sys.modules["torch"] = mod
    return mod
