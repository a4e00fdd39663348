"""Packed rows (several sequences end to end in one row, verl's ``NO_PADDING`` layout).

Scoring, the probe and the TAC's inputs on a packed row against the same sequences run
one by one: log-probs, every concentration statistic (mean and per layer) and the
critic's inputs and values agree within 1e-5 in float32, on a tiny Llama and a tiny
Qwen3 (a sliding window shorter than the sequences), under SDPA and eager attention. The
calls that would let the sequences attend to each other silently (an attention mask, a
cache) raise, and malformed ``cu_seqlens`` name the argument and the first offending
index.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import test_hf_probe as suite  # noqa: E402  (the probe tests' tiny models)

from comppo_core import hf  # noqa: E402
from comppo_core.errors import LayoutError, ParameterError, ShapeError  # noqa: E402
from comppo_core.hf import lm, online  # noqa: E402
from comppo_core.hf import statistics as hf_statistics  # noqa: E402

#: 3 sequences of 5, 7 and 8 tokens end to end (the README's packed example); Qwen3's
#: window (6) is shorter than two of them, so packing must keep the window per sequence
CU = (0, 5, 12, 20)
N = CU[-1]
ARCHS = ("llama", "qwen3")
ATTNS = ("sdpa", "eager")
STATS = ("entropy", "max", "l2")
TOL = 1e-5


def packed_ids(seed: int = 7, n: int = N) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, suite.VOCAB, (1, n), generator=g)


def model_for(arch: str, attn: str) -> Any:
    return suite.build(arch, attn=attn)


def separate(x: Any, cu: Any = CU) -> list[Any]:
    """Row 0 of a packed ``[1, N, ...]`` tensor cut into its sequences."""
    return [x[:, cu[i] : cu[i + 1]] for i in range(len(cu) - 1)]


def columns_of(packed: Any, columns: Any) -> Any:
    """The scored columns of a packed ``[1, N−1, ...]`` output, in order."""
    return packed[0][columns[0]]


def max_diff(a: Any, b: Any) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


# --------------------------------------------------------------------------- #
# hf.score
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("attn", ATTNS)
@pytest.mark.parametrize("arch", ARCHS)
def test_score_packed_equals_separate(arch: str, attn: str) -> None:
    model = model_for(arch, attn)
    ids = packed_ids()
    # log-probs alone: the model's own attention (sdpa or eager) runs
    plain = hf.score(model, ids, cu_seqlens=CU)
    assert plain.logprobs.shape == plain.columns.shape == (1, N - 1)
    assert int(plain.columns.sum()) == N - (len(CU) - 1)
    assert not bool(plain.columns[0, CU[1] - 1]) and not bool(plain.columns[0, CU[2] - 1])  # boundary columns
    assert torch.all(plain.logprobs[~plain.columns] == 0)
    sep_plain = torch.cat([hf.score(model, s).logprobs[0] for s in separate(ids)])
    assert max_diff(columns_of(plain.logprobs, plain.columns), sep_plain) <= TOL
    # with the probe: every statistic, mean and per layer
    for statistic in STATS:
        got = hf.score(model, ids, cu_seqlens=CU, per_layer=True, statistic=statistic)
        assert torch.equal(got.columns, plain.columns)
        seps = [hf.score(model, s, per_layer=True, statistic=statistic) for s in separate(ids)]
        assert got.concentration is not None and got.per_layer is not None
        assert max_diff(columns_of(got.logprobs, got.columns), torch.cat([s.logprobs[0] for s in seps])) <= TOL
        conc = columns_of(got.concentration, got.columns)
        sep_conc = torch.cat([s.concentration[0] for s in seps])  # type: ignore[index]
        assert max_diff(conc, sep_conc) <= TOL, statistic
        assert max_diff(columns_of(got.per_layer, got.columns), torch.cat([s.per_layer[0] for s in seps])) <= TOL  # type: ignore[index]
        assert sep_conc.std() > 0.02  # the statistic varies: the comparison is not vacuous
        assert torch.all(got.concentration[~got.columns] == 0)


def test_score_packed_shows_why_the_mask_must_go() -> None:
    """What the checks prevent: the same packed row with an all-ones attention mask (the
    check bypassed by calling the model directly) mixes the sequences."""
    model = model_for("llama", "sdpa")
    ids = packed_ids()
    pos = lm.packed_position_ids(torch.tensor(CU))
    with torch.no_grad():
        mixed = model(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids), use_cache=False).logits
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        sep = torch.cat([model(input_ids=s, use_cache=False).logits for s in separate(ids)], dim=1)
    assert max_diff(packed, sep) <= TOL
    assert max_diff(mixed[:, CU[1] :], sep[:, CU[1] :]) > 0.1  # the later sequences see the earlier ones


def test_position_ids_alone_and_several_packed_rows() -> None:
    """verl passes position_ids (no cu_seqlens): the same outputs, bit for bit; two rows
    packed differently score as their sequences."""
    model = model_for("qwen3", "sdpa")
    ids = packed_ids()
    pos = lm.packed_position_ids(torch.tensor(CU))
    by_cu = hf.score(model, ids, cu_seqlens=np.array(CU), concentration=True)
    by_pos = hf.score(model, ids, position_ids=pos, concentration=True)
    assert torch.equal(by_cu.logprobs, by_pos.logprobs) and torch.equal(by_cu.columns, by_pos.columns)
    assert by_cu.concentration is not None and by_pos.concentration is not None
    assert torch.equal(by_cu.concentration, by_pos.concentration)
    # cu_seqlens and matching position_ids together are accepted
    both = hf.score(model, ids, cu_seqlens=torch.tensor(CU), position_ids=pos)
    assert torch.equal(both.logprobs, by_cu.logprobs)

    cu2 = (0, 9, 20)
    ids2 = torch.cat([ids, packed_ids(seed=8)])
    pos2 = torch.cat([pos, lm.packed_position_ids(torch.tensor(cu2))])
    got = hf.score(model, ids2, position_ids=pos2, concentration=True)
    assert got.concentration is not None
    for row, cu in enumerate((CU, cu2)):
        cols = got.columns[row : row + 1]
        seps = [hf.score(model, s, concentration=True) for s in separate(ids2[row : row + 1], cu)]
        assert max_diff(columns_of(got.logprobs[row : row + 1], cols), torch.cat([s.logprobs[0] for s in seps])) <= TOL
        conc = columns_of(got.concentration[row : row + 1], cols)
        assert max_diff(conc, torch.cat([s.concentration[0] for s in seps])) <= TOL  # type: ignore[index]


def test_columns_feed_gae_in_the_packed_layout() -> None:
    """``x[columns]`` with :func:`column_cu_seqlens` is comppo_core's packed layout."""
    import comppo_core as cc

    model = model_for("llama", "sdpa")
    ids = packed_ids()
    got = hf.score(model, ids, cu_seqlens=CU, concentration=True)
    cu_cols = lm.column_cu_seqlens(torch.tensor(CU))
    assert cu_cols.tolist() == [0, 4, 10, 17]
    assert got.concentration is not None
    conc = columns_of(got.concentration, got.columns).numpy()
    gates = cc.gates_from_concentration(conc, cu_seqlens=cu_cols.numpy())
    rows = [hf.score(model, s, concentration=True).concentration for s in separate(ids)]
    for i, c in enumerate(rows):
        assert c is not None
        expect = cc.gates_from_concentration(c.numpy())
        assert np.abs(gates[cu_cols[i] : cu_cols[i + 1]] - expect[0]).max() <= 1e-5


def test_chunked_and_unchunked_log_probs_agree_on_packed_rows() -> None:
    model = model_for("llama", "sdpa")
    ids = packed_ids()
    whole = hf.score(model, ids, cu_seqlens=CU, logprob_chunk=0)
    small = hf.score(model, ids, cu_seqlens=CU, logprob_chunk=3)
    assert torch.equal(whole.columns, small.columns)
    assert max_diff(whole.logprobs, small.logprobs) <= 1e-6
    assert torch.all(whole.logprobs[~whole.columns] == 0)


# --------------------------------------------------------------------------- #
# ConcentrationProbe on the model's own call
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("method", ["chunked", "fused"])
@pytest.mark.parametrize("arch", ARCHS)
def test_probe_packed_equals_separate(arch: str, method: str) -> None:
    """Every token's statistic, the last one of each sequence included (``n_t`` counts
    the sequence's own keys: its first token sees one key, concentration 1)."""
    model = model_for(arch, "sdpa")
    ids = packed_ids()
    pos = lm.packed_position_ids(torch.tensor(CU))
    for statistic in STATS if method == "chunked" else ("entropy", "l2"):
        kw: dict[str, Any] = {"method": method, "per_layer": True, "query_chunk": 4}
        with torch.no_grad(), hf.ConcentrationProbe(model, statistic, **kw) as probe:
            model(input_ids=ids, position_ids=pos, use_cache=False)
        seps = []
        for s in separate(ids):
            with torch.no_grad(), hf.ConcentrationProbe(model, statistic, **kw) as one:
                model(input_ids=s, use_cache=False)
            seps.append(one)
        assert max_diff(probe.concentration[0], torch.cat([p.concentration[0] for p in seps])) <= TOL, statistic
        assert max_diff(probe.per_layer[0], torch.cat([p.per_layer[0] for p in seps])) <= TOL, statistic
        if statistic != "l2":
            starts = torch.tensor(CU[:-1])
            assert torch.allclose(probe.concentration[0, starts], torch.ones(3))  # one visible key


@pytest.mark.skipif(not online.available(), reason="needs Triton")
@pytest.mark.skipif(not online.interpreting(), reason="TRITON_INTERPRET is not set (tests/gpu checks CUDA)")
def test_online_kernel_reads_the_packed_mask() -> None:
    """The online (Triton) kernel takes the block-diagonal mask tile by tile (mask mode)."""
    model = model_for("qwen3", "sdpa")
    ids = packed_ids()
    pos = lm.packed_position_ids(torch.tensor(CU))
    for statistic in STATS:
        with torch.no_grad(), hf.ConcentrationProbe(model, statistic, method="online") as probe:
            model(input_ids=ids, position_ids=pos, use_cache=False)
        seps = []
        for s in separate(ids):
            with torch.no_grad(), hf.ConcentrationProbe(model, statistic, method="chunked") as one:
                model(input_ids=s, use_cache=False)
            seps.append(one.concentration[0])
        assert max_diff(probe.concentration[0], torch.cat(seps)) <= TOL, statistic


# --------------------------------------------------------------------------- #
# Calls that would mix the sequences
# --------------------------------------------------------------------------- #


def test_packed_row_with_a_mask_or_a_cache_raises() -> None:
    model = model_for("llama", "sdpa")
    ids = packed_ids()
    pos = lm.packed_position_ids(torch.tensor(CU))
    ones = torch.ones_like(ids)
    with pytest.raises(ParameterError, match=r"attention_mask: position_ids restart at \(row 0, position 5\)") as e:
        hf.score(model, ids, ones, position_ids=pos)
    assert (e.value.argument, e.value.row, e.value.position) == ("attention_mask", 0, 5)
    with pytest.raises(ParameterError, match="attention_mask: expected None with cu_seqlens") as e:
        hf.score(model, ids, ones, cu_seqlens=CU)
    assert e.value.argument == "attention_mask"
    with pytest.raises(ParameterError, match="attention_mask=None"):
        hf.logprobs_and_concentration(model, ids, ones, position_ids=pos)

    calls = {
        "attention_mask": {"attention_mask": ones, "use_cache": False},
        "use_cache": {"use_cache": True},
    }
    for argument, kwargs in calls.items():
        with pytest.raises(ParameterError, match=f"{argument}: position_ids restart") as e:
            with torch.no_grad(), hf.ConcentrationProbe(model):
                model(input_ids=ids, position_ids=pos, **kwargs)
        assert (e.value.argument, e.value.row, e.value.position) == (argument, 0, 5)
    # use_cache left to the config (True): caught where the attention runs
    assert model.config.use_cache
    with pytest.raises(ParameterError, match="use_cache: position_ids restart at .* layer 0's attention") as e:
        with torch.no_grad(), hf.ConcentrationProbe(model):
            model(input_ids=ids, position_ids=pos)
    assert e.value.argument == "use_cache"
    assert model.config._attn_implementation == "sdpa"  # restored after the errors
    # the same row, called as transformers wants it, records
    with torch.no_grad(), hf.ConcentrationProbe(model) as probe:
        model(input_ids=ids, position_ids=pos, use_cache=False)
    assert probe.passes == 1


def test_packed_rows_through_a_peft_wrapper() -> None:
    """PEFT calls the transformers model's ``forward`` directly (no hooks on it): the
    checks still fire (on its base model's call), and a correct call scores per sequence."""
    pytest.importorskip("peft")
    from comppo_core.rl.models.lora import add_adapter

    wrapped = add_adapter(model_for("llama", "sdpa"), rank=4, alpha=8.0, modules="q_proj,v_proj", seed=1).eval()
    ids = packed_ids()
    pos = lm.packed_position_ids(torch.tensor(CU))
    for argument, kwargs in (("attention_mask", {"attention_mask": torch.ones_like(ids)}), ("use_cache", {})):
        with pytest.raises(ParameterError, match=f"{argument}: position_ids restart") as e:
            with torch.no_grad(), hf.ConcentrationProbe(wrapped):
                wrapped(input_ids=ids, position_ids=pos, **kwargs)
        assert e.value.argument == argument
    got = hf.score(wrapped, ids, cu_seqlens=CU, concentration=True)
    seps = [hf.score(wrapped, s, concentration=True) for s in separate(ids)]
    assert got.concentration is not None
    assert max_diff(columns_of(got.logprobs, got.columns), torch.cat([s.logprobs[0] for s in seps])) <= TOL
    assert max_diff(columns_of(got.concentration, got.columns), torch.cat([s.concentration[0] for s in seps])) <= TOL  # type: ignore[index]


def test_padded_rows_are_not_packed() -> None:
    """Padding with generate's positions (padding at 1, real tokens 0, 1, ...) or the
    package's (cumsum − 1) is not a packed row: nothing raises, nothing changes."""
    model = model_for("llama", "sdpa")
    ids, am = suite.batch("both")
    gen_pos = (am.cumsum(-1) - 1).masked_fill(am == 0, 1)
    a = hf.score(model, ids, am, position_ids=gen_pos, concentration=True)
    b = hf.score(model, ids, am, concentration=True)
    assert torch.equal(a.columns, lm.scored_columns(am))
    assert torch.equal(a.logprobs, b.logprobs)
    with torch.no_grad(), hf.ConcentrationProbe(model) as probe:
        model(input_ids=ids, attention_mask=am, position_ids=gen_pos)  # the config's cache too
    assert probe.passes == 1
    starts = lm.sequence_starts(gen_pos, am)
    assert not bool(starts.any())
    # the same positions without the mask do restart (transformers would pack them)
    assert bool(lm.sequence_starts(gen_pos).any())


# --------------------------------------------------------------------------- #
# cu_seqlens and position_ids checks
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("cu", "index", "message"),
    [
        ([0, 5, 3, 20], 2, "expected non-decreasing offsets, got 3 after 5 (first offending index 2)"),
        ([0, 5, 12, 21], 3, "expected to end at N = 20 (the packed row's length, input_ids [1, N]), got 21"),
        ([0, 5, 12, 19], 3, "expected to end at N = 20"),
        ([1, 5, 20], 0, "expected to start at 0, got 1 (first offending index 0)"),
    ],
)
def test_bad_cu_seqlens_name_the_first_offending_index(cu: list[int], index: int, message: str) -> None:
    model = model_for("llama", "sdpa")
    with pytest.raises(LayoutError, match=re.escape(f"cu_seqlens: {message}")) as e:
        hf.score(model, packed_ids(), cu_seqlens=cu)
    assert (e.value.argument, e.value.index) == ("cu_seqlens", index)


def test_cu_seqlens_shapes_and_positions() -> None:
    model = model_for("llama", "sdpa")
    ids = packed_ids()
    for bad, match in (([[0, 20]], "a 1-D array"), ([0], "a 1-D array"), ([0.0, 20.0], "integer offsets")):
        with pytest.raises(LayoutError, match=f"cu_seqlens: expected {match}") as e:
            hf.score(model, ids, cu_seqlens=bad)
        assert e.value.argument == "cu_seqlens"
    with pytest.raises(ShapeError, match=r"input_ids: with cu_seqlens expected one packed row \[1, N\]"):
        hf.score(model, ids.view(2, 10), cu_seqlens=[0, 10])
    pos = lm.packed_position_ids(torch.tensor(CU)).clone()
    pos[0, 13] = 5
    with pytest.raises(ParameterError, match=r"position_ids: .* got 5 instead of 1 \(first offending index 13\)") as e:
        hf.score(model, ids, cu_seqlens=CU, position_ids=pos)
    assert (e.value.argument, e.value.index) == ("position_ids", 13)
    with pytest.raises(ShapeError, match="position_ids: expected"):
        hf.score(model, ids, position_ids=pos[:, :-1])
    cu_t = torch.tensor(CU)
    before = cu_t.clone()
    hf.score(model, ids, cu_seqlens=cu_t)
    assert torch.equal(cu_t, before)  # inputs never modified


def test_empty_sequences_and_helpers() -> None:
    cu = torch.tensor([0, 3, 3, 4, 8])  # an empty sequence and a one-token one
    pos = lm.packed_position_ids(cu)
    assert pos.tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    assert lm.sequence_starts(pos)[0].nonzero().flatten().tolist() == [3, 4]
    assert lm.column_cu_seqlens(cu).tolist() == [0, 2, 2, 2, 5]
    x = torch.arange(7.0)[None, :, None]  # [1, N−1, 1]
    rows = lm.unpack_columns(x, cu)
    assert rows.shape == (4, 3, 1)
    assert rows[..., 0].tolist() == [[0, 1, 0], [0, 0, 0], [0, 0, 0], [4, 5, 6]]
    back = lm.pack_columns(rows, cu)
    assert back[0, :, 0].tolist() == [0, 1, 0, 0, 4, 5, 6]  # columns 2 and 3 score the next sequence
    tokens = lm.unpack_tokens(torch.arange(8.0)[None], cu)
    assert tokens.tolist() == [[0, 1, 2, 0], [0, 0, 0, 0], [3, 0, 0, 0], [4, 5, 6, 7]]
    model = model_for("llama", "sdpa")
    ids = packed_ids(n=8)
    got = hf.score(model, ids, cu_seqlens=cu, concentration=True)
    assert got.columns[0].tolist() == [True, True, False, False, True, True, True]
    last = hf.score(model, ids[:, 4:], concentration=True)
    assert max_diff(got.logprobs[0, 4:], last.logprobs[0]) <= TOL


# --------------------------------------------------------------------------- #
# The TAC's inputs
# --------------------------------------------------------------------------- #


class _Recorder(torch.nn.Module):
    """A critic that records the inputs rl.forward hands it, then runs the TAC."""

    def __init__(self, tac: Any) -> None:
        super().__init__()
        self.tac = tac
        self.taps = tac.taps
        self.seen: list[Any] = []

    def forward(self, inputs: Any) -> Any:
        self.seen.append(inputs)
        return self.tac(inputs)


@pytest.mark.parametrize("temporal", ["none", "gru", "attention"])
@pytest.mark.parametrize("arch", ARCHS)
def test_tac_inputs_packed_equal_separate(arch: str, temporal: str) -> None:
    from comppo_core import rl
    from comppo_core.rl.critics.inputs import packed_critic_inputs
    from comppo_core.rl.critics.taps import TapRecorder

    model = model_for(arch, "sdpa")
    torch.manual_seed(3)
    tac = rl.TransportAlignedCritic.for_model(model, taps=(0, 1), width=16, temporal=temporal, heads=2)
    with torch.no_grad():
        tac.head.weight.normal_()  # the head starts at 0: every value would be 0
        tac.head.bias.normal_()
    ids = packed_ids()
    cu = torch.tensor(CU)
    # response: the last 3, 4 and 5 columns of the sequences (packed columns)
    resp = torch.zeros(1, N - 1, dtype=torch.bool)
    for i, k in enumerate((3, 4, 5)):
        resp[0, CU[i + 1] - 1 - k : CU[i + 1] - 1] = True
    recorder = TapRecorder(model, tac.taps)
    with recorder, torch.no_grad():
        scored = hf.score(model, ids, cu_seqlens=cu, per_layer=True)
    inputs = packed_critic_inputs(
        ids,
        cu,
        taps=recorder.hidden,
        per_layer=scored.per_layer,
        concentration=scored.concentration,
        response_mask=resp & scored.columns,
    )
    with torch.no_grad():
        values = lm.pack_columns(tac(inputs), cu)
    assert values.shape == (1, N - 1)

    spy = _Recorder(tac)
    expected_values = []
    for i, s in enumerate(separate(ids)):
        r = lm.unpack_columns(resp, cu)[i : i + 1, : s.shape[1] - 1]
        out = rl.forward(model, s, None, critic=spy, response_mask=r)
        expected_values.append(out.values[0])  # type: ignore[index]
        sep = spy.seen[-1]
        length = s.shape[1]
        assert torch.equal(inputs.input_ids[i, :length], sep.input_ids[0])
        assert torch.equal(inputs.attention_mask[i, :length], sep.attention_mask[0])
        assert not bool(inputs.attention_mask[i, length:].any())
        assert torch.equal(inputs.position_ids[i, :length], sep.position_ids[0])
        assert torch.equal(inputs.columns[i, : length - 1], sep.columns[0])
        assert torch.equal(inputs.response_mask[i, : length - 1], sep.response_mask[0])
        for layer in tac.taps:  # hidden states up to ~15 here: 1e-5 relative to their scale (~10 float32 ulp)
            scale = max(1.0, float(sep.taps[layer].abs().max()))
            assert max_diff(inputs.taps[layer][i, :length], sep.taps[layer][0]) <= TOL * scale
        assert max_diff(inputs.per_layer[i, : length - 1], sep.per_layer[0]) <= TOL  # type: ignore[index]
        assert max_diff(inputs.gates[i, : length - 1], sep.gates[0]) <= TOL
        assert bool((sep.gates[0][sep.response_mask[0]] < 1).any())  # the gates are not all 1
    expect = torch.cat(expected_values)
    assert max_diff(columns_of(values, scored.columns), expect) <= TOL
    assert expect.std() > 1e-3  # the values vary: the comparison is not vacuous
    assert torch.all(values[~scored.columns] == 0)


def test_packed_critic_inputs_checks() -> None:
    from comppo_core.rl.critics.inputs import packed_critic_inputs

    ids = packed_ids()
    with pytest.raises(LayoutError, match="cu_seqlens: expected non-decreasing"):
        packed_critic_inputs(ids, [0, 9, 4, 20], taps={}, per_layer=None, concentration=None)
    with pytest.raises(ShapeError, match=r"input_ids: expected one packed row \[1, N\]"):
        packed_critic_inputs(ids.view(2, 10), [0, 20], taps={}, per_layer=None, concentration=None)
    with pytest.raises(ShapeError, match=r"per_layer: expected a packed row \[1, 19, ...\]"):
        packed_critic_inputs(ids, CU, taps={}, per_layer=torch.zeros(1, N, 2), concentration=None)
    got = packed_critic_inputs(ids, CU, taps={}, per_layer=None, concentration=None)
    assert got.gates.shape == (3, 7) and torch.all(got.gates == 1)


def test_statistics_with_a_block_diagonal_mask() -> None:
    """head_mean_concentration on a hand-built packed mask: n_t counts the sequence's own keys."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, N, 8, generator=g) * 2
    k = torch.randn(1, 2, N, 8, generator=g) * 2
    seg = torch.repeat_interleave(torch.arange(3), torch.tensor(CU[1:]) - torch.tensor(CU[:-1]))
    t = torch.arange(N)
    mask = ((t[None, :] <= t[:, None]) & (seg[None, :] == seg[:, None]))[None, None]
    for statistic in STATS:
        for method in ("chunked", "fused") if statistic != "max" else ("chunked",):
            got = hf_statistics.head_mean_concentration(q, k, mask, statistic=statistic, method=method)
            parts = [
                hf_statistics.head_mean_concentration(
                    q[:, :, a:b], k[:, :, a:b], None, statistic=statistic, method="chunked"
                )
                for a, b in zip(CU[:-1], CU[1:])
            ]
            assert max_diff(got, torch.cat(parts, dim=1)) <= TOL, (statistic, method)
