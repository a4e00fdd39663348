"""Input handling shared by every public function: array coercion and layouts.

Turns what a user passes (NumPy arrays, DLPack producers, array-likes; padded
``[B, T]`` + mask or packed ``[N]`` + ``cu_seqlens``) into the flat, C-contiguous arrays
the Rust kernels take, without copying what is already in the right form, and checks
shapes and dtypes with messages that name the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DTypeError, ParameterError, ShapeError

#: Float dtypes the kernels compute in directly.
KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: Mask dtypes the kernels read directly; any other numeric mask becomes ``mask != 0``.
KERNEL_MASKS = tuple(np.dtype(t) for t in (np.bool_, np.uint8, np.int8, np.int32, np.int64, np.float32, np.float64))


def kernel_array(x: np.ndarray, dtype: Any = None) -> np.ndarray:
    """``x`` as the kernels read it: C-contiguous and aligned, of ``dtype`` when given.
    No copy when it already is; an unaligned view (say, into a byte buffer at an odd
    offset) is copied, as a strided one is."""
    return np.require(x, dtype=dtype, requirements=("C", "A"))


def as_numpy(x: Any, name: str) -> np.ndarray:
    """A NumPy view of ``x`` (NumPy array, ``__dlpack__`` producer or array-like)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__") and not isinstance(x, (list, tuple)):
        try:
            return np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError) as e:
            raise DTypeError(f"{name}: expected an array on the CPU; its __dlpack__ export failed: {e}") from e
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise DTypeError(f"{name}: expected an array, got {type(x).__name__}") from e
    if arr.dtype == object:
        raise DTypeError(f"{name}: expected a numeric array, got {type(x).__name__} of objects")
    return arr


def float_dtypes(x: np.ndarray, name: str) -> tuple[np.dtype, np.dtype]:
    """(compute dtype, output dtype) for a float input: float32/float64 are computed as
    they are, float16 is computed in float32 and returned as float16, integers and
    booleans are computed and returned in float64."""
    dt = x.dtype
    if dt in KERNEL_FLOATS:
        return dt, dt
    if dt == np.float16:
        return np.dtype(np.float32), dt
    if dt.kind in "biu":
        return np.dtype(np.float64), np.dtype(np.float64)
    raise DTypeError(f"{name}: expected a float array (float16, float32 or float64), got dtype {dt}")


@dataclass(frozen=True)
class Layout:
    """The layout of one call: the token shape, and either the padded grid or the
    packed ``cu_seqlens``; ``mask`` is flat and of a kernel mask dtype, or None."""

    shape: tuple[int, ...]
    grid: tuple[int, int]
    cu_seqlens: np.ndarray | None
    mask: np.ndarray | None

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def rows(self) -> int:
        return int(self.cu_seqlens.shape[0] - 1) if self.cu_seqlens is not None else self.grid[0]

    def kernel_args(self) -> dict[str, Any]:
        return {"mask": self.mask, "cu_seqlens": self.cu_seqlens, "shape": self.grid}


def _as_cu_seqlens(cu: Any) -> np.ndarray:
    arr = as_numpy(cu, "cu_seqlens")
    if arr.ndim != 1:
        raise ShapeError(f"cu_seqlens: expected a 1-D array of B+1 offsets, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"cu_seqlens: expected int32 or int64 offsets, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ShapeError("cu_seqlens: offsets exceed int64")
    return kernel_array(arr, np.int64)


def _as_mask(mask: Any, shape: tuple[int, ...]) -> np.ndarray:
    arr = as_numpy(mask, "mask")
    if arr.shape != shape:
        raise ShapeError(f"mask: expected shape {shape} like the data, got {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"mask: expected a bool, integer or float array, got dtype {arr.dtype}")
    if arr.dtype not in KERNEL_MASKS:
        arr = arr != 0
    return kernel_array(arr).reshape(-1)


def layout_of(primary: np.ndarray, name: str, mask: Any, cu_seqlens: Any) -> Layout:
    """Works out the layout from the first array argument, ``mask`` and ``cu_seqlens``."""
    shape = tuple(primary.shape)
    if cu_seqlens is None:
        if primary.ndim == 1:
            raise ShapeError(
                f"{name}: a 1-D array is the packed layout and needs cu_seqlens; for one sequence "
                f"pass a [1, T] array or cu_seqlens=[0, {shape[0]}]"
            )
        if primary.ndim != 2:
            raise ShapeError(f"{name}: expected a 2-D [B, T] array (or 1-D [N] with cu_seqlens), got shape {shape}")
        grid = (shape[0], shape[1])
        cu = None
    else:
        if primary.ndim != 1:
            raise ShapeError(f"{name}: with cu_seqlens expected a 1-D [N] array, got shape {shape}")
        cu = _as_cu_seqlens(cu_seqlens)
        grid = (0, 0)
    flat_mask = None if mask is None else _as_mask(mask, shape)
    return Layout(shape=shape, grid=grid, cu_seqlens=cu, mask=flat_mask)


def flat_float(x: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``x`` as a flat C-contiguous array of ``dtype`` with the token shape ``shape``;
    no copy when it already is one."""
    arr = as_numpy(x, name)
    if arr.shape != shape:
        raise ShapeError(f"{name}: expected shape {shape} like the first array, got {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"{name}: expected a float array, got dtype {arr.dtype}")
    return kernel_array(arr, dtype).reshape(-1)


def per_row(x: Any, name: str, rows: int) -> np.ndarray | None:
    """An optional per-sequence ``[B]`` float array, as contiguous float64."""
    if x is None:
        return None
    arr = as_numpy(x, name)
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"{name}: expected a float array, got dtype {arr.dtype}")
    if arr.shape != (rows,):
        raise ShapeError(f"{name}: expected shape ({rows},), one value per sequence, got {arr.shape}")
    return kernel_array(arr, np.float64)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ParameterError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_unit(name: str, value: Any) -> float:
    """A scalar in [0, 1] (γ, λ)."""
    try:
        x = float(value)
    except (TypeError, ValueError) as e:
        raise ParameterError(f"{name}: expected a number in [0, 1], got {value!r}") from e
    if not 0.0 <= x <= 1.0:
        raise ParameterError(f"{name}: expected a number in [0, 1], got {x}")
    return x


def check_finite(name: str, value: Any) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError) as e:
        raise ParameterError(f"{name}: expected a finite number, got {value!r}") from e
    if not np.isfinite(x):
        raise ParameterError(f"{name}: expected a finite number, got {x}")
    return x


class Outputs:
    """Output buffers of one call: either fresh arrays, or the caller's ``out=`` arrays.

    The kernels write flat arrays of the compute dtype. When the output dtype differs
    (float16), they write into a float32 scratch array that :meth:`finish` casts into the
    returned (or the caller's) buffer.
    """

    def __init__(
        self,
        names: tuple[str, ...],
        shape: tuple[int, ...],
        compute: np.dtype,
        output: np.dtype,
        out: Any,
        inputs: tuple[np.ndarray | None, ...],
    ) -> None:
        self.shape, self.compute, self.output = shape, compute, output
        if out is None:
            self.final = [np.empty(shape, dtype=output) for _ in names]
        else:
            self.final = self._check_out(names, out, inputs)
        self.kernel = [
            a.reshape(-1) if a.dtype == compute else np.empty(a.size, dtype=compute) for a in self.final
        ]

    def _check_out(self, names: tuple[str, ...], out: Any, inputs: tuple[np.ndarray | None, ...]) -> list[np.ndarray]:
        if len(names) == 1 and isinstance(out, np.ndarray):
            out = (out,)
        if not isinstance(out, (tuple, list)) or len(out) != len(names):
            raise ParameterError(f"out: expected a tuple of {len(names)} arrays ({', '.join(names)}), got {out!r:.80}")
        bufs = []
        for name, buf in zip(names, out):
            arg = f"out ({name})"
            if not isinstance(buf, np.ndarray):
                raise DTypeError(f"{arg}: expected a NumPy array, got {type(buf).__name__}")
            if buf.shape != self.shape:
                raise ShapeError(f"{arg}: expected shape {self.shape}, got {buf.shape}")
            if buf.dtype != self.output:
                raise DTypeError(f"{arg}: expected dtype {self.output} (the output dtype), got {buf.dtype}")
            if not (buf.flags.c_contiguous and buf.flags.aligned and buf.flags.writeable):
                raise ShapeError(f"{arg}: expected a writeable, aligned C-contiguous array")
            for other in [*bufs, *(i for i in inputs if i is not None)]:
                if np.may_share_memory(buf, other):
                    raise ShapeError(f"{arg}: shares memory with an input or another output; pass separate buffers")
            bufs.append(buf)
        return bufs

    def finish(self) -> list[np.ndarray]:
        for final, flat in zip(self.final, self.kernel):
            if final.dtype != self.compute:
                final.reshape(-1)[...] = flat
        return self.final
