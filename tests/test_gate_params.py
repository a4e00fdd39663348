"""One ``GateParams`` for the gate mapping (``comppo_core.gate_params``): its checks are
those of ``gates_from_concentration``, and every layer that took the seven keywords
(Arrow, Ray, ``hf``, the CLI) also takes one GateParams, giving the same gates; both at
once is an error naming the keyword."""

from __future__ import annotations

import argparse
import itertools
import pickle
from typing import Any

import numpy as np
import pytest

import comppo_core as cc
from comppo_core.commands import _argtypes
from comppo_core.gate_params import DEFAULTS, GateParams, from_keywords

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
            "normalize": "sequence",
            "center": 0.0,
            "scale": 1.0,
            "invert": False,
        }
    )
    q = GateParams(
        low=0.2, high=0.7, sharpness=np.float32(3.0), normalize="none", center=1, scale=0.5, invert=np.bool_(True)
    )
    assert q.as_kwargs() == {
        "low": 0.2,
        "high": 0.7,
        "sharpness": 3.0,
        "normalize": "none",
        "center": 1.0,
        "scale": 0.5,
        "invert": True,
    }
    assert type(q.sharpness) is float and type(q.invert) is bool
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
        ({"normalize": "z"}, "normalize", "normalize: expected one of 'sequence', 'batch', 'none', got 'z'"),
        ({"normalize": "none", "scale": 0.0}, "scale", "scale: expected a finite number > 0, got 0.0"),
        ({"normalize": "none", "center": float("nan")}, "center", "center: expected a finite number, got nan"),
        ({"invert": 1}, "invert", "invert: expected a bool, got 1"),
    ],
)
def test_bad_values_name_the_field(kwargs: dict[str, Any], argument: str, message: str) -> None:
    with pytest.raises(cc.ParameterError) as info:
        GateParams(**kwargs)
    assert info.value.argument == argument and str(info.value) == message


def test_accepts_what_the_kernel_accepts() -> None:
    """On a grid of values the dataclass and ``gates_from_concentration`` agree on what is
    allowed (center and scale matter only to normalize="none", as in the kernel)."""
    grid = itertools.product(
        (0.0, 0.5, 1.0, 1.5),  # low
        (0.4, 1.0),  # high
        (-2.0, 0.0, float("inf")),  # sharpness
        ("sequence", "batch", "none"),
        (0.0, float("inf")),  # center
        (1.0, 0.0, -1.0),  # scale
    )
    for low, high, sharpness, normalize, center, scale in grid:
        kw = {
            "low": low,
            "high": high,
            "sharpness": sharpness,
            "normalize": normalize,
            "center": center,
            "scale": scale,
        }
        try:
            cc.gates_from_concentration(C, mask=M, **kw)
            kernel_ok = True
        except cc.ParameterError:
            kernel_ok = False
        try:
            p = GateParams(**kw)
            ok = True
        except cc.ParameterError:
            ok = False
        assert ok == kernel_ok, kw
        if ok:
            np.testing.assert_array_equal(
                cc.gates_from_concentration(C, mask=M, **p.as_kwargs()), cc.gates_from_concentration(C, mask=M, **kw)
            )


def test_gates_from_concentration_takes_params() -> None:
    assert cc.GateParams is GateParams and "GateParams" in cc.__all__
    p = GateParams(low=0.2, high=0.8, sharpness=-3.0, normalize="none", center=0.4, scale=0.25, invert=True)
    want = cc.gates_from_concentration(C, mask=M, **p.as_kwargs())
    np.testing.assert_array_equal(cc.gates_from_concentration(C, mask=M, params=p), want)
    cu = np.array([0, 3, 8])
    np.testing.assert_array_equal(
        cc.gates_from_concentration(C.ravel(), cu_seqlens=cu, params=p),
        cc.gates_from_concentration(C.ravel(), cu_seqlens=cu, **p.as_kwargs()),
    )
    np.testing.assert_array_equal(cc.gates_from_concentration(C, params=GateParams()), cc.gates_from_concentration(C))
    with pytest.raises(cc.ParameterError) as info:
        cc.gates_from_concentration(C, params=p, low=0.5)
    assert info.value.argument == "low"
    assert (
        str(info.value)
        == "low: the gate mapping is given twice, as params= and as the keyword low; pass one or the other"
    )
    with pytest.raises(cc.ParameterError) as info:
        cc.gates_from_concentration(C, params=p.as_kwargs())  # type: ignore[arg-type]
    assert info.value.argument == "params"


def test_from_keywords() -> None:
    p = GateParams(low=0.5, sharpness=2.0)
    assert from_keywords(None, {**DEFAULTS, "low": 0.5, "sharpness": 2.0}) == p
    assert from_keywords(p, dict(DEFAULTS)) is p
    with pytest.raises(cc.ParameterError) as info:
        from_keywords(p, {**DEFAULTS, "high": 0.8, "invert": True}, name="gate_params")
    assert info.value.argument == "high"
    assert str(info.value) == (
        "high: the gate mapping is given twice, as gate_params= and as the keywords high, invert; pass one or the other"
    )
    with pytest.raises(cc.ParameterError) as info:
        from_keywords({"low": 0.5}, dict(DEFAULTS))  # type: ignore[arg-type]
    assert info.value.argument == "params" and "expected a comppo_core.GateParams, got dict" in str(info.value)


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
# The layers: GateParams or the keywords, the same gates
# --------------------------------------------------------------------------- #

P = GateParams(low=0.3, high=0.9, sharpness=2.0, normalize="batch", invert=True)


def test_arrow() -> None:
    pa = pytest.importorskip("pyarrow")
    from comppo_core import arrow

    rows = [[0.1, 0.5, 0.2], [0.3], [0.7, 0.0, 0.4, 0.4]]
    conc = pa.chunked_array([pa.array(rows[:1], pa.list_(pa.float64())), pa.array(rows[1:], pa.list_(pa.float64()))])
    by_kw = arrow.gates_from_concentration(conc, **P.as_kwargs())
    assert arrow.gates_from_concentration(conc, params=P).to_pylist() == by_kw.to_pylist()
    flat = np.concatenate([np.asarray(r) for r in rows])
    cu = np.array([0, 3, 4, 8])
    want = cc.gates_from_concentration(flat, cu_seqlens=cu, **P.as_kwargs())  # batch over all chunks
    np.testing.assert_allclose(np.concatenate([np.asarray(r) for r in by_kw.to_pylist()]), want, rtol=1e-12)
    with pytest.raises(cc.ParameterError, match=r"^sharpness: the gate mapping is given twice, as params="):
        arrow.gates_from_concentration(conc, params=P, sharpness=3.0)

    zeros = pa.chunked_array([pa.array([[0.0] * len(r) for r in rows], pa.list_(pa.float64()))])
    t = pa.table({"rewards": zeros, "values": zeros, "c": conc.combine_chunks()})
    a = arrow.compute_advantages(t, concentration_col="c", gate_params=P)
    b = arrow.compute_advantages(t, concentration_col="c", **P.as_kwargs())
    assert a.equals(b)
    with pytest.raises(cc.ParameterError) as info:
        arrow.compute_advantages(t, concentration_col="c", gate_params=P, low=0.5)
    assert info.value.argument == "low" and "as gate_params=" in str(info.value)
    with pytest.raises(cc.ParameterError) as info:
        arrow.compute_advantages(t, concentration_col="c", low=0.95, high=0.5)
    assert info.value.argument == "low"


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
    cc_ray.compute_advantages(ds, concentration_col="c", low=0.3, sharpness=2.0)
    options = ds.calls[-1]["fn_kwargs"]
    assert options["gate_params"] == GateParams(low=0.3, sharpness=2.0)
    assert not set(DEFAULTS) & set(options)  # the seven keywords travel as the one value
    cc_ray.compute_advantages(ds, concentration_col="c", gate_params=GateParams(low=0.4))
    assert ds.calls[-1]["fn_kwargs"]["gate_params"] == GateParams(low=0.4)
    n = len(ds.calls)
    with pytest.raises(cc.ParameterError) as info:
        cc_ray.compute_advantages(ds, concentration_col="c", low=0.9, high=0.2)
    assert info.value.argument == "low"
    with pytest.raises(cc.ParameterError) as info:
        cc_ray.compute_advantages(ds, concentration_col="c", gate_params=GateParams(), invert=True)
    assert info.value.argument == "invert"
    assert len(ds.calls) == n  # nothing was scheduled


def test_hf_pipeline() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from comppo_core import hf

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 32, (2, 8))
    rm = torch.zeros(2, 8, dtype=torch.long)
    rm[:, 3:] = 1
    p = GateParams(low=0.4, high=0.9, sharpness=3.0)
    a = hf.comp_gae_batch(model, ids, None, rm, torch.tensor([1.0, -1.0]), gate_params=p)
    b = hf.comp_gae_batch(model, ids, None, rm, torch.tensor([1.0, -1.0]), low=0.4, high=0.9, sharpness=3.0)
    assert torch.equal(a.gates, b.gates) and torch.equal(a.advantages, b.advantages)
    assert float(a.gates[a.mask].min()) < 0.9  # the mapping was applied
    with pytest.raises(cc.ParameterError) as info:
        hf.comp_gae_batch(model, ids, None, rm, torch.ones(2), gate_params=p, normalize="none")
    assert info.value.argument == "normalize"


def test_from_keywords_reads_only_the_seven_names_of_a_scope() -> None:
    """Callers pass their ``locals()``: other entries (the data, ``params`` itself) are ignored."""

    def call(conc: object, low: float = 0.9, params: GateParams | None = None, **rest: object) -> GateParams:
        high, sharpness, normalize, center, scale, invert = 1.0, 1.0, "sequence", 0.0, 1.0, False
        return from_keywords(params, locals())

    assert call([1.0], low=0.5) == GateParams(low=0.5)
    assert call([1.0], params=GateParams(high=0.95)) == GateParams(high=0.95)
    with pytest.raises(cc.ParameterError, match="low: the gate mapping is given twice"):
        call([1.0], low=0.5, params=GateParams())
