# Hand-written stub of the compiled module (rust/bindings.rs); checked against the
# built module by `python -m mypy.stubtest comppo_core._core`.
# The public, documented API is in comppo_core/__init__.py: these functions take flat,
# C-contiguous arrays prepared by comppo_core._arrays and write into preallocated outputs.

import numpy as np
import numpy.typing as npt

__all__ = [
    "NUM_THREADS_ENV",
    "broadcast",
    "credit_stats",
    "gae",
    "gae_plain",
    "gates_from_concentration",
    "gates_from_concentration_plain",
    "get_num_threads",
    "group_advantages",
    "group_advantages_plain",
    "masked_whiten",
    "masked_whiten_in_place",
    "masked_whiten_plain",
    "set_num_threads",
    "td_targets",
    "td_targets_plain",
]

NUM_THREADS_ENV: str

def gae(
    rewards: npt.NDArray[np.floating],
    values: npt.NDArray[np.floating],
    advantages: npt.NDArray[np.floating],
    returns: npt.NDArray[np.floating],
    *,
    mask: npt.NDArray[np.generic] | None,
    gates: npt.NDArray[np.floating] | None,
    cu_seqlens: npt.NDArray[np.int64] | None,
    shape: tuple[int, int],
    gamma: float,
    lam: float,
    lam_critic: float,
    last_values: npt.NDArray[np.float64] | None,
    drop_masked_rewards: bool,
) -> None: ...
def gae_plain(
    rewards: object,
    values: object,
    mask: object,
    cu_seqlens: object,
    gates: object,
    last_values: object,
    out: object,
    gamma: object,
    lam: object,
    lam_critic: object,
    masked_rewards: object,
) -> tuple[npt.NDArray[np.floating], npt.NDArray[np.floating]] | None: ...
def td_targets(
    rewards: npt.NDArray[np.floating],
    values: npt.NDArray[np.floating],
    out: npt.NDArray[np.floating],
    *,
    mask: npt.NDArray[np.generic] | None,
    gates: npt.NDArray[np.floating] | None,
    cu_seqlens: npt.NDArray[np.int64] | None,
    shape: tuple[int, int],
    gamma: float,
    last_values: npt.NDArray[np.float64] | None,
) -> None: ...
def td_targets_plain(
    rewards: object,
    values: object,
    mask: object,
    cu_seqlens: object,
    gates: object,
    last_values: object,
    gamma: object,
) -> npt.NDArray[np.floating] | None: ...
def gates_from_concentration(
    concentration: npt.NDArray[np.floating],
    out: npt.NDArray[np.floating],
    *,
    mask: npt.NDArray[np.generic] | None,
    cu_seqlens: npt.NDArray[np.int64] | None,
    shape: tuple[int, int],
    low: float,
    high: float,
    sharpness: float,
    normalize: str,
    center: float,
    scale: float,
    invert: bool,
) -> None: ...
def gates_from_concentration_plain(
    conc: object,
    mask: object,
    cu_seqlens: object,
    low: object,
    high: object,
    sharpness: object,
    normalize: object,
    center: object,
    scale: object,
    invert: object,
) -> npt.NDArray[np.floating] | None: ...
def group_advantages(
    scores: npt.NDArray[np.float64],
    groups: npt.NDArray[np.int64],
    out: npt.NDArray[np.float64],
    *,
    method: str,
    eps: float,
    singleton: str,
) -> None: ...
def group_advantages_plain(
    scores: object, groups: object, method: object, eps: object, singleton: object
) -> npt.NDArray[np.float64] | None: ...
def broadcast(
    per_sequence: npt.NDArray[np.floating],
    out: npt.NDArray[np.floating],
    *,
    mask: npt.NDArray[np.generic] | None,
    cu_seqlens: npt.NDArray[np.int64] | None,
    shape: tuple[int, int],
) -> None: ...
def masked_whiten(
    x: npt.NDArray[np.floating],
    out: npt.NDArray[np.floating],
    *,
    mask: npt.NDArray[np.generic] | None,
    cu_seqlens: npt.NDArray[np.int64] | None,
    shape: tuple[int, int],
    shift_mean: bool,
    eps: float,
) -> None: ...
def masked_whiten_in_place(
    x: npt.NDArray[np.floating],
    *,
    mask: npt.NDArray[np.generic] | None,
    cu_seqlens: npt.NDArray[np.int64] | None,
    shape: tuple[int, int],
    shift_mean: bool,
    eps: float,
) -> None: ...
def masked_whiten_plain(
    x: object,
    mask: object,
    cu_seqlens: object,
    shift_mean: object,
    eps: object,
    out: object,
) -> npt.NDArray[np.floating] | None: ...
def credit_stats(
    x: npt.NDArray[np.floating],
    *,
    mask: npt.NDArray[np.generic] | None,
    cu_seqlens: npt.NDArray[np.int64] | None,
    shape: tuple[int, int],
) -> dict[str, float]: ...
def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
