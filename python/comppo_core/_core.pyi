# Hand-written stub of the compiled module (rust/bindings.rs); checked against the
# built module by `python -m mypy.stubtest comppo_core._core`.
# The public, documented API is in comppo_core/__init__.py. Each function here is the one
# entry of a public function: given its arguments in canonical form (NumPy arrays as the
# kernels read them; see comppo_core._arrays) it returns the result, and for anything
# else it returns None having touched nothing, for the Python layer to convert.

import numpy as np
import numpy.typing as npt

__all__ = [
    "BUFFER_CACHE_ENV",
    "NUM_THREADS_ENV",
    "__version__",
    "broadcast",
    "buffer_cache",
    "credit_stats",
    "gae",
    "gates_from_concentration",
    "get_num_threads",
    "group_advantages",
    "masked_whiten",
    "set_num_threads",
    "simd_path",
    "td_targets",
]

NUM_THREADS_ENV: str
BUFFER_CACHE_ENV: str
#: The crate's version, from Cargo.toml (the one place it is written).
__version__: str

def gae(
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
    rewards: object,
    values: object,
    mask: object,
    cu_seqlens: object,
    gates: object,
    last_values: object,
    gamma: object,
) -> npt.NDArray[np.floating] | None: ...

# normalize: "causal", "sequence", "batch" or "none" (GateParams.normalize; any other
# value, or one that is not a str, gives None). The default lives in GateParams.
# min_spread: GateParams.min_spread (None or left out: 0, no floor).
def gates_from_concentration(
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
    min_spread: object = None,
) -> npt.NDArray[np.floating] | None: ...
def group_advantages(
    scores: object, groups: object, method: object, eps: object, singleton: object
) -> npt.NDArray[np.float64] | None: ...
def broadcast(per_sequence: object, mask: object, cu_seqlens: object) -> npt.NDArray[np.floating] | None: ...
def masked_whiten(
    x: object,
    mask: object,
    cu_seqlens: object,
    shift_mean: object,
    eps: object,
    out: object,
) -> npt.NDArray[np.floating] | None: ...
def credit_stats(x: object, mask: object, cu_seqlens: object) -> dict[str, float] | None: ...
def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def buffer_cache() -> tuple[int, int]: ...
def simd_path() -> str: ...
