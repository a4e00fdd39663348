"""One ``GateParams`` for the gate mapping (``comppo_core.gate_params``): its checks are
those of the kernel, and it is the only way every layer (the array API, Arrow, Ray,
``hf``, the CLI) takes the mapping: the seven loose keywords of 0.1 are refused
(``TypeError``), and anything but a GateParams is an error naming the argument."""

from __future__ import annotations

import argparse
import itertools
import pickle
from typing import Any

import numpy as np
import pytest

import comppo_core as cc
from comppo_core import _core, gate_params
from comppo_core.commands import _argtypes
from comppo_core.gate_params import DEFAULTS, GateParams, as_gate_params
from comppo_core.options import NORMALIZE_MODES

C = np.array([[0.1, 0.5, 0.2, 0.9], [0.3, 0.3, 0.7, 0.0]])
M = np.array([[True, True, True, False], [True, True, True, True]])


def test_defaults_and_kwargs() -> None:
    p = GateParams()
    assert (
        p.as_kwargs()
        == DEFAULTS
        == {
            "low": 0.9,
            "high": 1.0,
            "sharpness": 1.0,
            "normalize": "causal",
            "center": 0.0,
            "scale": 1.0,
            "invert": False,
            "min_spread": 0.0,
        }
    )
    q = GateParams(
        low=0.2, high=0.7, sharpness=np.float32(3.0), normalize="none", center=1, scale=0.5, invert=np.bool_(True),
        min_spread=np.float32(0.25),
    )  # fmt: skip
    assert q.as_kwargs() == {
        "low": 0.2,
        "high": 0.7,
        "sharpness": 3.0,
        "normalize": "none",
        "center": 1.0,
        "scale": 0.5,
        "invert": True,
        "min_spread": 0.25,
    }
    assert type(q.sharpness) is float and type(q.invert) is bool and type(q.min_spread) is float
    assert GateParams(**q.as_kwargs()) == q
    assert pickle.loads(pickle.dumps(q)) == q
    assert GateParams.constant(0.95) == GateParams(low=0.95, high=0.95)


@pytest.mark.parametrize(
    ("kwargs", "argument", "message"),
    [
        ({"low": 1.5}, "low", "low: expected a number in [0, 1], got 1.5"),
        ({"high": -0.1}, "high", "high: expected a number in [0, 1], got -0.1"),
        ({"low": 0.9, "high": 0.5}, "low", "low: expected low <= high (high = 0.5), got 0.9"),
        ({"sharpness": float("inf")}, "sharpness", "sharpness: expected a finite number, got inf"),
        ({"sharpness": "2"}, "sharpness", "sharpness: expected a finite number, got '2'"),
        ({"low": True}, "low", "low: expected a finite number, got True"),
        ({"normalize": "z"}, "normalize", "normalize: expected one of 'causal', 'sequence', 'batch', 'none', got 'z'"),
        ({"normalize": "none", "scale": 0.0}, "scale", "scale: expected a finite number > 0, got 0.0"),
        ({"normalize": "none", "center": float("nan")}, "center", "center: expected a finite number, got nan"),
        ({"invert": 1}, "invert", "invert: expected a bool, got 1"),
        ({"min_spread": -0.01}, "min_spread", "min_spread: expected a finite number >= 0, got -0.01"),
        ({"min_spread": float("nan")}, "min_spread", "min_spread: expected a finite number, got nan"),
        ({"min_spread": None}, "min_spread", "min_spread: expected a finite number, got None"),
    ],
)
def test_bad_values_name_the_field(kwargs: dict[str, Any], argument: str, message: str) -> None:
    with pytest.raises(cc.ParameterError) as info:
        GateParams(**kwargs)
    assert info.value.argument == argument and str(info.value) == message


def _kernel(p: dict[str, Any]) -> np.ndarray | None:
    """The compiled kernel on canonical arrays with the mapping ``p``: its result, or None
    where it refuses the values (a ParameterError, or no result for a non-finite value)."""
    try:
        result: np.ndarray | None = _core.gates_from_concentration(
            C, M, None, p["low"], p["high"], p["sharpness"], p["normalize"], p["center"], p["scale"], False,
            p["min_spread"],
        )  # fmt: skip
    except cc.ParameterError:
        return None
    return result


def test_accepts_what_the_kernel_accepts() -> None:
    """On a grid of values the dataclass and the kernel agree on what is allowed (center
    and scale matter only to normalize="none", as in the kernel), and
    ``gates_from_concentration(params=p)`` is the kernel's result for those values."""
    grid = itertools.product(
        (0.0, 0.5, 1.0, 1.5),  # low
        (0.4, 1.0),  # high
        (-2.0, 0.0, float("inf")),  # sharpness
        NORMALIZE_MODES,
        (0.0, float("inf")),  # center
        (1.0, 0.0, -1.0),  # scale
        (0.0, 0.1, -1e-9, float("inf")),  # min_spread
    )
    for low, high, sharpness, normalize, center, scale, min_spread in grid:
        kw = {
            "low": low,
            "high": high,
            "sharpness": sharpness,
            "normalize": normalize,
            "center": center,
            "scale": scale,
            "min_spread": min_spread,
        }
        kernel = _kernel(kw)
        try:
            p = GateParams(**kw)  # type: ignore[arg-type]
            ok = True
        except cc.ParameterError:
            ok = False
        assert ok == (kernel is not None), kw
        if ok:
            assert kernel is not None
            np.testing.assert_array_equal(cc.gates_from_concentration(C, mask=M, params=p), kernel)


def test_gates_from_concentration_takes_params() -> None:
    assert cc.GateParams is GateParams and "GateParams" in cc.__all__
    p = GateParams(low=0.2, high=0.8, sharpness=-3.0, normalize="none", center=0.4, scale=0.25, invert=True)
    want = _core.gates_from_concentration(C, M, None, 0.2, 0.8, -3.0, "none", 0.4, 0.25, True)
    np.testing.assert_array_equal(cc.gates_from_concentration(C, mask=M, params=p), want)
    cu = np.array([0, 3, 8])
    np.testing.assert_array_equal(
        cc.gates_from_concentration(C.ravel(), cu_seqlens=cu, params=p),
        _core.gates_from_concentration(C.ravel(), None, cu, 0.2, 0.8, -3.0, "none", 0.4, 0.25, True),
    )
    np.testing.assert_array_equal(cc.gates_from_concentration(C, params=GateParams()), cc.gates_from_concentration(C))
    with pytest.raises(TypeError, match="unexpected keyword argument 'low'"):
        cc.gates_from_concentration(C, params=p, low=0.5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'low'"):
        cc.gates_from_concentration(C, low=0.5)  # type: ignore[call-arg]
    with pytest.raises(cc.ParameterError) as info:
        cc.gates_from_concentration(C, params=p.as_kwargs())  # type: ignore[arg-type]
    assert info.value.argument == "params"
    assert str(info.value) == "params: expected a comppo_core.GateParams, got dict"


def test_as_gate_params() -> None:
    """The one check every layer applies to its ``params=`` / ``gate_params=``."""
    p = GateParams(low=0.5, sharpness=2.0)
    assert as_gate_params(p) is p
    assert as_gate_params(None) == GateParams()
    with pytest.raises(cc.ParameterError) as info:
        as_gate_params({"low": 0.5}, "gate_params")  # type: ignore[arg-type]
    assert info.value.argument == "gate_params"
    assert str(info.value) == "gate_params: expected a comppo_core.GateParams, got dict"
    with pytest.raises(cc.ParameterError, match="^params: expected a comppo_core.GateParams, got float$"):
        as_gate_params(0.5)  # type: ignore[arg-type]
    # the keyword rule of 0.1 (params= or the seven keywords) is gone
    assert not hasattr(gate_params, "from_keywords") and "as_gate_params" in gate_params.__all__


def test_cli_flags_make_one_gate_params() -> None:
    parser = argparse.ArgumentParser(prog="t")
    none = dict.fromkeys(DEFAULTS)
    assert _argtypes.gate_params(argparse.Namespace(**none), parser) == GateParams()
    args = argparse.Namespace(**{**none, "high": 0.95, "sharpness": 2.0, "invert": True})
    assert _argtypes.gate_params(args, parser) == GateParams(high=0.95, sharpness=2.0, invert=True)
    assert _argtypes.gate_params(argparse.Namespace(low=0.5, high=1.0), parser) == GateParams(
        low=0.5
    )  # only some flags
    with pytest.raises(SystemExit):
        _argtypes.gate_params(argparse.Namespace(low=0.9, high=0.5), parser)


# --------------------------------------------------------------------------- #
# The layers: one GateParams, the keywords refused
# --------------------------------------------------------------------------- #

P = GateParams(low=0.3, high=0.9, sharpness=2.0, normalize="batch", invert=True)


def test_arrow() -> None:
    pa = pytest.importorskip("pyarrow")
    from comppo_core import arrow

    rows = [[0.1, 0.5, 0.2], [0.3], [0.7, 0.0, 0.4, 0.4]]
    conc = pa.chunked_array([pa.array(rows[:1], pa.list_(pa.float64())), pa.array(rows[1:], pa.list_(pa.float64()))])
    gates = arrow.gates_from_concentration(conc, params=P)
    flat = np.concatenate([np.asarray(r) for r in rows])
    cu = np.array([0, 3, 4, 8])
    want = cc.gates_from_concentration(flat, cu_seqlens=cu, params=P)  # batch over all chunks
    np.testing.assert_allclose(np.concatenate([np.asarray(r) for r in gates.to_pylist()]), want, rtol=1e-12)
    assert (
        arrow.gates_from_concentration(conc).to_pylist()
        == arrow.gates_from_concentration(conc, params=GateParams()).to_pylist()
    )
    with pytest.raises(TypeError, match="unexpected keyword argument 'sharpness'"):
        arrow.gates_from_concentration(conc, params=P, sharpness=3.0)  # type: ignore[call-arg]
    with pytest.raises(cc.ParameterError) as info:
        arrow.gates_from_concentration(conc, params=P.as_kwargs())  # type: ignore[arg-type]
    assert info.value.argument == "params"

    rewards, values = np.linspace(-1.0, 1.0, 8), np.linspace(0.5, -0.2, 8)
    column = [pa.ListArray.from_arrays(pa.array(cu, pa.int32()), pa.array(x)) for x in (rewards, values)]
    t = pa.table({"rewards": column[0], "values": column[1], "c": conc.combine_chunks()})
    a = arrow.compute_advantages(t, concentration_col="c", gate_params=P)
    adv, _ = cc.gae(rewards, values, cu_seqlens=cu, gates=want)
    np.testing.assert_allclose(a["advantages"].combine_chunks().values.to_numpy(), adv, rtol=1e-12)
    plain = arrow.compute_advantages(t, gates_col=None)
    assert not np.allclose(plain["advantages"].combine_chunks().values.to_numpy(), adv)  # the gates mattered
    with pytest.raises(TypeError, match="unexpected keyword argument 'low'"):
        arrow.compute_advantages(t, concentration_col="c", gate_params=P, low=0.5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'low'"):
        arrow.compute_advantages(t, concentration_col="c", low=0.95, high=0.5)  # type: ignore[call-arg]
    with pytest.raises(cc.ParameterError) as info:
        arrow.compute_advantages(t, concentration_col="c", gate_params={"low": 0.5})  # type: ignore[arg-type]
    assert info.value.argument == "gate_params"


class _FakeDataset:
    """What ``comppo_core.ray.compute_advantages`` calls on a dataset, recorded."""

    def __init__(self, schema: Any) -> None:
        self._schema = schema
        self.calls: list[dict[str, Any]] = []

    def schema(self) -> Any:
        return self._schema

    def map_batches(self, fn: Any, **kwargs: Any) -> _FakeDataset:
        self.calls.append(kwargs)
        return self


def test_ray_checks_on_the_driver_and_ships_one_gate_params() -> None:
    pa = pytest.importorskip("pyarrow")
    cc_ray = pytest.importorskip("comppo_core.ray")

    schema = pa.schema(
        [("rewards", pa.list_(pa.float32())), ("values", pa.list_(pa.float32())), ("c", pa.list_(pa.float32()))]
    )
    ds = _FakeDataset(schema)
    p = GateParams(low=0.3, sharpness=2.0)
    cc_ray.compute_advantages(ds, concentration_col="c", gate_params=p)
    options = ds.calls[-1]["fn_kwargs"]
    assert options["gate_params"] is p
    assert not set(DEFAULTS) & set(options)  # the mapping travels as the one value
    n = len(ds.calls)
    with pytest.raises(TypeError, match="unexpected keyword argument 'low'"):
        cc_ray.compute_advantages(ds, concentration_col="c", low=0.9, high=0.2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'invert'"):
        cc_ray.compute_advantages(ds, concentration_col="c", gate_params=GateParams(), invert=True)
    with pytest.raises(cc.ParameterError) as info:
        cc_ray.compute_advantages(ds, concentration_col="c", gate_params={"low": 0.3})
    assert info.value.argument == "gate_params"
    assert len(ds.calls) == n  # nothing was scheduled


def test_hf_pipeline(tiny_lm: Any) -> None:
    import torch

    from comppo_core import hf

    model = tiny_lm("llama", hidden=16, intermediate=32, heads=2, kv_heads=1, max_positions=32, init=None)
    ids = torch.randint(3, 32, (2, 8))  # torch's RNG as tiny_lm left it (seeded with 0)
    rm = torch.zeros(2, 7, dtype=torch.long)  # response columns [B, T-1]: tokens 3.. of each row
    rm[:, 2:] = 1
    p = GateParams(low=0.4, high=0.9, sharpness=3.0)
    a = hf.comp_gae_batch(model, ids, None, rm, torch.tensor([1.0, -1.0]), gate_params=p)
    want = cc.gates_from_concentration(a.concentration, mask=a.mask, params=p)
    assert torch.equal(a.gates, want)  # the mapping applied is p's
    assert float(a.gates[a.mask].min()) < 0.9
    with pytest.raises(TypeError, match="unexpected keyword argument 'low'"):
        hf.comp_gae_batch(model, ids, None, rm, torch.ones(2), low=0.4, high=0.9, sharpness=3.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'normalize'"):
        hf.comp_gae_batch(model, ids, None, rm, torch.ones(2), gate_params=p, normalize="none")
    with pytest.raises(cc.ParameterError) as info:
        hf.comp_gae_batch(model, ids, None, rm, torch.ones(2), gate_params=p.as_kwargs())
    assert info.value.argument == "gate_params"
