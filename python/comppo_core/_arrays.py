"""Input handling shared by every public function: array coercion and layouts.

Each public function first hands its arguments to its one entry in the Rust extension
(``_core``), which computes at once when they are in canonical form (see
``rust/bindings.rs``: NumPy arrays of float32 or float64, a bool mask, int64
``cu_seqlens``, float64 ``last_values``, all C-contiguous and aligned) and otherwise
returns None having touched nothing. Then the helpers here turn what the user passed
(NumPy arrays of other dtypes or strides, DLPack producers, array-likes; padded
``[B, T]`` + mask or packed ``[N]`` + ``cu_seqlens``) into that form, without copying
what already is in it, checking shapes and dtypes with messages that name the
argument, and the function makes the same call again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DTypeError, ParameterError, ShapeError

#: Float dtypes the kernels compute in directly.
KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


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
            raise DTypeError(
                f"{name}: expected an array on the CPU; its __dlpack__ export failed: {e}", argument=name
            ) from e
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise DTypeError(f"{name}: expected an array, got {type(x).__name__}", argument=name) from e
    if arr.dtype == object:
        raise DTypeError(f"{name}: expected a numeric array, got {type(x).__name__} of objects", argument=name)
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
    raise DTypeError(f"{name}: expected a float array (float16, float32 or float64), got dtype {dt}", argument=name)


@dataclass(frozen=True)
class Layout:
    """The layout of one call in canonical form: the token shape (``[B, T]`` padded,
    ``[N]`` packed), the packed layout's int64 ``cu_seqlens`` (None when padded), and
    the bool ``mask`` of the token shape, or None."""

    shape: tuple[int, ...]
    cu_seqlens: np.ndarray | None
    mask: np.ndarray | None

    @property
    def rows(self) -> int:
        return int(self.cu_seqlens.shape[0] - 1) if self.cu_seqlens is not None else self.shape[0]


def _as_cu_seqlens(cu: Any) -> np.ndarray:
    arr = as_numpy(cu, "cu_seqlens")
    if arr.ndim != 1:
        raise ShapeError(
            f"cu_seqlens: expected a 1-D array of B+1 offsets, got shape {arr.shape}", argument="cu_seqlens"
        )
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"cu_seqlens: expected int32 or int64 offsets, got dtype {arr.dtype}", argument="cu_seqlens")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ShapeError("cu_seqlens: offsets exceed int64", argument="cu_seqlens")
    return kernel_array(arr, np.int64)


def _as_mask(mask: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The mask as the kernels take it: a C-contiguous bool array of ``shape``; any
    other numeric mask becomes ``mask != 0`` (NaN counts as valid, as it is nonzero)."""
    arr = as_numpy(mask, "mask")
    if arr.shape != shape:
        raise ShapeError(f"mask: expected shape {shape} like the data, got {arr.shape}", argument="mask")
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"mask: expected a bool, integer or float array, got dtype {arr.dtype}", argument="mask")
    if arr.dtype != np.bool_:
        arr = arr != 0
    return kernel_array(arr)


def layout_of(primary: np.ndarray, name: str, mask: Any, cu_seqlens: Any) -> Layout:
    """Works out the layout from the first array argument, ``mask`` and ``cu_seqlens``."""
    shape = tuple(primary.shape)
    if cu_seqlens is None:
        if primary.ndim == 1:
            raise ShapeError(
                f"{name}: a 1-D array is the packed layout and needs cu_seqlens; for one sequence "
                f"pass a [1, T] array or cu_seqlens=[0, {shape[0]}]",
                argument=name,
            )
        if primary.ndim != 2:
            raise ShapeError(
                f"{name}: expected a 2-D [B, T] array (or 1-D [N] with cu_seqlens), got shape {shape}", argument=name
            )
        cu = None
    else:
        if primary.ndim != 1:
            raise ShapeError(f"{name}: with cu_seqlens expected a 1-D [N] array, got shape {shape}", argument=name)
        cu = _as_cu_seqlens(cu_seqlens)
    return Layout(shape=shape, cu_seqlens=cu, mask=None if mask is None else _as_mask(mask, shape))


def token_array(x: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``x`` as a C-contiguous, aligned array of ``dtype`` and the token shape ``shape``;
    no copy when it already is one."""
    arr = as_numpy(x, name)
    if arr.shape != shape:
        raise ShapeError(f"{name}: expected shape {shape} like the first array, got {arr.shape}", argument=name)
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"{name}: expected a float array, got dtype {arr.dtype}", argument=name)
    return kernel_array(arr, dtype)


def per_row(x: Any, name: str, rows: int) -> np.ndarray | None:
    """An optional per-sequence ``[B]`` float array, as contiguous float64."""
    if x is None:
        return None
    arr = as_numpy(x, name)
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"{name}: expected a float array, got dtype {arr.dtype}", argument=name)
    if arr.shape != (rows,):
        raise ShapeError(f"{name}: expected shape ({rows},), one value per sequence, got {arr.shape}", argument=name)
    return kernel_array(arr, np.float64)


def check_unit(name: str, value: Any) -> float:
    """A scalar in [0, 1] (γ, λ)."""
    try:
        x = float(value)
    except (TypeError, ValueError) as e:
        raise ParameterError(f"{name}: expected a number in [0, 1], got {value!r}", argument=name) from e
    if not 0.0 <= x <= 1.0:
        raise ParameterError(f"{name}: expected a number in [0, 1], got {x}", argument=name)
    return x


def check_finite(name: str, value: Any) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError) as e:
        raise ParameterError(f"{name}: expected a finite number, got {value!r}", argument=name) from e
    if not np.isfinite(x):
        raise ParameterError(f"{name}: expected a finite number, got {x}", argument=name)
    return x


def kernel_result(result: Any, fn: str) -> Any:
    """``result`` of a ``_core`` entry called with arguments this module made canonical;
    None there would mean the two disagree on what canonical is."""
    if result is None:
        raise RuntimeError(f"comppo_core internal error: _core.{fn} refused arguments in canonical form")
    return result


class Outputs:
    """The ``out=`` of one call: the caller's arrays, checked, or fresh ones.

    The kernels write arrays of the compute dtype. When the output dtype is the compute
    dtype, :attr:`kernel` is what the ``_core`` entry takes as ``out``: the caller's
    arrays, or None for fresh ones it allocates. When it differs (float16 computed in
    float32), :attr:`kernel` is None and :meth:`finish` casts the kernel's float32
    results into the caller's arrays, or into fresh arrays of the output dtype.
    """

    def __init__(
        self,
        names: tuple[str, ...],
        shape: tuple[int, ...],
        compute: np.dtype,
        output: np.dtype,
        out: Any,
        inputs: tuple[Any, ...],
    ) -> None:
        self.output = output
        self.given = None if out is None else self._check_out(names, shape, out, inputs)
        self.kernel = self.given if output == compute and self.given is not None else None

    def _check_out(
        self, names: tuple[str, ...], shape: tuple[int, ...], out: Any, inputs: tuple[Any, ...]
    ) -> tuple[np.ndarray, ...]:
        if len(names) == 1 and isinstance(out, np.ndarray):
            out = (out,)
        if not isinstance(out, (tuple, list)) or len(out) != len(names):
            raise ParameterError(
                f"out: expected a tuple of {len(names)} arrays ({', '.join(names)}), got {out!r:.80}", argument="out"
            )
        arrays = [i for i in inputs if isinstance(i, np.ndarray)]
        bufs: list[np.ndarray] = []
        for name, buf in zip(names, out):
            arg = f"out ({name})"
            if not isinstance(buf, np.ndarray):
                raise DTypeError(f"{arg}: expected a NumPy array, got {type(buf).__name__}", argument=arg)
            if buf.shape != shape:
                raise ShapeError(f"{arg}: expected shape {shape}, got {buf.shape}", argument=arg)
            if buf.dtype != self.output:
                raise DTypeError(
                    f"{arg}: expected dtype {self.output} (the output dtype), got {buf.dtype}", argument=arg
                )
            if not (buf.flags.c_contiguous and buf.flags.aligned and buf.flags.writeable):
                raise ShapeError(f"{arg}: expected a writeable, aligned C-contiguous array", argument=arg)
            for other in [*bufs, *arrays]:
                if np.may_share_memory(buf, other):
                    raise ShapeError(
                        f"{arg}: shares memory with an input or another output; pass separate buffers", argument=arg
                    )
            bufs.append(buf)
        return tuple(bufs)

    def finish(self, results: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """The call's results from the kernel's ``results``, in the output dtype."""
        if results[0].dtype == self.output:
            return results
        if self.given is None:
            return tuple(r.astype(self.output) for r in results)
        for final, r in zip(self.given, results):
            final[...] = r
        return self.given
