"""torch tensors in, torch tensors out (docs/design.md §6), without importing torch eagerly.

The public functions are written over NumPy arrays. :func:`tensor_io` wraps one so
that when its first array argument is a torch tensor, every tensor argument is
turned into a NumPy array and every array result back into a tensor of the first
argument's dtype and device:

* CPU tensors are shared without copies both ways (``Tensor.numpy()`` and
  ``torch.from_numpy``), except bfloat16, which NumPy lacks: it is computed in
  float32 and the result cast back.
* CUDA tensors travel through pinned host memory with exactly one device→host and
  one host→device copy per call: all tensor inputs are packed into one byte buffer
  on the device, copied to the host in one go, and the results packed the same way
  for the way back.
* Inputs with ``requires_grad`` are read through ``detach()``; outputs never carry
  grad. Tensors on different devices, or a device that is neither CPU nor CUDA, are
  a :class:`~comppo_core.errors.DTypeError`.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .errors import DTypeError

__all__ = ["is_tensor", "tensor_io"]

F = TypeVar("F", bound=Callable[..., Any])

#: Byte alignment of each array inside the packed transfer buffers.
_ALIGN = 64


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _check_devices(tensors: dict[str, Any]) -> Any:
    devices = {name: t.device for name, t in tensors.items()}
    first_name, device = next(iter(devices.items()))
    for name, d in devices.items():
        if d != device:
            raise DTypeError(f"{name}: expected a tensor on {device} like {first_name}, got one on {d}", argument=name)
    if device.type not in ("cpu", "cuda"):
        raise DTypeError(f"{first_name}: tensors on {device} are not supported (CPU or CUDA only)", argument=first_name)
    return device


def _to_numpy_cpu(t: Any) -> np.ndarray:
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.resolve_conj().resolve_neg().numpy()


def _from_numpy(x: Any, like: Any) -> Any:
    """``x`` (a NumPy array) as a tensor following ``like`` (dtype for floats, device)."""
    import torch

    if not isinstance(x, np.ndarray):
        return x
    t = torch.from_numpy(x)
    if like.dtype == torch.bfloat16 and t.is_floating_point():
        t = t.to(torch.bfloat16)
    return t


class _CudaTransfer:
    """Packs tensors into one device buffer, copies it to pinned host memory once,
    and unpacks NumPy views; then the same the other way for the results."""

    def __init__(self, tensors: dict[str, Any], device: Any) -> None:
        import torch

        self.device = device
        parts, self.layout = [], []
        offset = 0
        for name, t in tensors.items():
            t = t.detach()
            if t.dtype == torch.bfloat16:
                t = t.float()
            t = t.contiguous()
            nbytes = t.numel() * t.element_size()
            parts.append(t.view(-1).view(torch.uint8))
            self.layout.append((name, offset, nbytes, t.dtype, tuple(t.shape)))
            offset += nbytes
            pad = -offset % _ALIGN  # every part starts aligned for its dtype view
            if pad:
                parts.append(torch.zeros(pad, dtype=torch.uint8, device=device))
                offset += pad
        packed = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
        self.host = torch.empty(packed.numel(), dtype=torch.uint8, pin_memory=True)
        self.host.copy_(packed, non_blocking=True)
        torch.cuda.current_stream(device).synchronize()

    def arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for name, offset, nbytes, dtype, shape in self.layout:
            t = self.host[offset : offset + nbytes].view(dtype).view(shape)
            out[name] = t.numpy()
        return out

    def back(self, results: list[np.ndarray], like: Any) -> list[Any]:
        import torch

        total = sum(r.nbytes + -r.nbytes % _ALIGN for r in results)
        host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        hv = host.numpy()
        spans, offset = [], 0
        for r in results:
            hv[offset : offset + r.nbytes] = np.ascontiguousarray(r).view(np.uint8).reshape(-1)
            spans.append((offset, r.nbytes, r.dtype, r.shape))
            offset += r.nbytes + -r.nbytes % _ALIGN
        dev = host.to(self.device, non_blocking=True)
        outs = []
        for offset, nbytes, dtype, shape in spans:
            t = dev[offset : offset + nbytes].view(torch.from_numpy(np.empty(0, dtype)).dtype).view(shape)
            if like.dtype == torch.bfloat16 and t.is_floating_point():
                t = t.to(torch.bfloat16)
            outs.append(t)
        return outs


def _map_results(result: Any, convert: Callable[[list[np.ndarray]], list[Any]]) -> Any:
    """Applies ``convert`` to the arrays in ``result`` (an array, a tuple of arrays or a
    NamedTuple of arrays; anything else is returned unchanged)."""
    if isinstance(result, np.ndarray):
        return convert([result])[0]
    if isinstance(result, tuple) and result and all(isinstance(r, np.ndarray) for r in result):
        converted = convert(list(result))
        return type(result)(*converted) if hasattr(result, "_fields") else tuple(converted)
    return result


def tensor_io(*array_params: str) -> Callable[[F], F]:
    """Makes a NumPy-level public function accept and return torch tensors.

    ``array_params`` names the parameters that may hold arrays; the first one present
    as a tensor decides the kind, dtype and device of the results.
    """

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            torch = sys.modules.get("torch")
            if torch is None:
                return fn(*args, **kwargs)
            # No tensor anywhere among the arguments (the NumPy calls of a PPO loop that
            # imports torch): skip binding the signature, which costs more than the rest
            # of a small call.
            tensor = torch.Tensor
            if not any(isinstance(a, tensor) for a in args) and not any(isinstance(v, tensor) for v in kwargs.values()):
                return fn(*args, **kwargs)
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return fn(*args, **kwargs)  # let the function report its own misuse
            tensors = {n: bound.arguments[n] for n in array_params if is_tensor(bound.arguments.get(n))}
            if not tensors:
                return fn(*args, **kwargs)
            first = next(iter(tensors.values()))
            lead = next((n for n in array_params if n in bound.arguments and bound.arguments[n] is not None), None)
            if lead not in tensors:
                raise DTypeError(
                    f"{next(iter(tensors))}: expected a NumPy array like {lead}, got a torch tensor; "
                    "pass all arrays of a call as tensors or all as arrays",
                    argument=next(iter(tensors)),
                )
            device = _check_devices(tensors)
            if "out" in bound.arguments and bound.arguments["out"] is not None:
                raise DTypeError(
                    "out: preallocated outputs are supported for NumPy arrays only, not torch tensors", argument="out"
                )
            if device.type == "cpu":
                for name, t in tensors.items():
                    bound.arguments[name] = _to_numpy_cpu(t)
                result = fn(*bound.args, **bound.kwargs)
                return _map_results(result, lambda rs: [_from_numpy(r, first) for r in rs])
            transfer = _CudaTransfer(tensors, device)
            bound.arguments.update(transfer.arrays())
            result = fn(*bound.args, **bound.kwargs)
            return _map_results(result, lambda rs: transfer.back(rs, first))

        return wrapper  # type: ignore[return-value]

    return decorate
