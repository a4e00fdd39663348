"""The gate sources of the policy's uncertainty (``policy_entropy``, ``token_nll``) and ``gate_direction``.

Each statistic is pinned against a plain reference from the model's full logits
(``torch.distributions.Categorical``, ``log_softmax``), its gates against the package's gate
mapping of that reference, the default gates against causality, and the arms through the
trainer. ``gate_direction`` is pinned on diagnosis files, good and bad, and on old configs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rl_tiny import TINY_SETTINGS  # noqa: E402

import comppo_core as cc  # noqa: E402
from comppo_core.errors import ParameterError, ShapeError  # noqa: E402
from comppo_core.rl import step  # noqa: E402
from comppo_core.rl.config import TrainConfig, recommended_direction, upgrade_fields  # noqa: E402
from comppo_core.rl.core.arms import ARMS  # noqa: E402
from comppo_core.rl.core.gate_sources import GATE_SOURCES, POLICY_STATISTICS  # noqa: E402
from comppo_core.rl.core.policy_forward import forward, policy_entropy  # noqa: E402
from comppo_core.rl.critics.tac import TransportAlignedCritic, causal_gates  # noqa: E402
from comppo_core.rl.engine.trainer import Trainer  # noqa: E402
from comppo_core.rl.gate_direction import config_task_record  # noqa: E402

B, T, VOCAB = 4, 12, 40
TAU = 0.7
PARAMS = cc.GateParams(low=0.5, normalize="sequence")  # the whole-row z-score unless causal
#: the arms whose gates are the policy's uncertainty, by statistic
UNCERTAINTY_ARMS = {"policy_entropy": "comppo_policy_entropy", "token_nll": "comppo_token_nll"}


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def actor(request: Any, tiny_lm: Any) -> Any:
    return tiny_lm(request.param, vocab=VOCAB, layers=2)


@pytest.fixture(scope="module")
def batch() -> dict[str, Any]:
    """Left-padded prompts, responses of different lengths right-padded after them."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.bool)
    am[1, :2] = False
    am[3, :3] = False
    am[2, 10:] = False
    ids = ids.masked_fill(~am, 2)
    resp = torch.zeros(B, T - 1, dtype=torch.bool)
    resp[:, 5:] = True
    resp &= am[:, :-1] & am[:, 1:]
    return {"ids": ids, "am": am, "resp": resp}


def reference_statistics(actor: Any, ids: Any, am: Any) -> tuple[Any, Any]:
    """``(H, logprob)`` ``[B, T−1]`` from the model's full logits at τ: the next-token entropy
    (``Categorical.entropy``) and the sampled token's log-probability (``log_softmax``)."""
    with torch.no_grad():
        pos = (am.long().cumsum(-1) - 1).clamp(min=0)
        logits = actor(input_ids=ids, attention_mask=am.long(), position_ids=pos).logits[:, :-1].double() / TAU
    entropy = torch.distributions.Categorical(logits=logits).entropy()
    logprob = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return entropy, logprob


@pytest.mark.parametrize("statistic", POLICY_STATISTICS)
@pytest.mark.parametrize("causal", [True, False])
def test_uncertainty_gates_are_the_mapping_of_the_reference(
    statistic: str, causal: bool, actor: Any, batch: dict[str, Any]
) -> None:
    ids, am, resp = batch["ids"], batch["am"], batch["resp"]
    entropy, logprob = reference_statistics(actor, ids, am)
    signal = -entropy if statistic == "policy_entropy" else logprob  # −u: an uncertain token, a low gate
    out = forward(
        actor, ids, am, response_mask=resp, temperature=TAU, gate_params=PARAMS, causal=causal,
        policy_statistic=statistic,
    )  # fmt: skip
    assert out.gate_statistic is not None and out.gates is not None
    assert float((out.gate_statistic.double() - signal)[resp].abs().max()) < 1e-5
    assert torch.all(out.gate_statistic[~resp] == 0)
    ref = signal.float().masked_fill(~resp, 0.0)
    if causal:
        want = causal_gates(ref, resp, PARAMS)
    else:
        want = torch.as_tensor(cc.gates_from_concentration(ref, mask=resp, params=PARAMS), dtype=torch.float32)
    assert torch.allclose(out.gates, want, atol=2e-6, rtol=0)
    assert torch.all(out.gates[~resp] == 1.0)
    # an uncertain token gets a low gate: the gates fall as the statistic u rises (per row, causal or not)
    inverted = forward(
        actor, ids, am, response_mask=resp, temperature=TAU, gate_params=dataclasses.replace(PARAMS, invert=True),
        causal=causal, policy_statistic=statistic,
    )  # fmt: skip
    assert inverted.gates is not None
    mirror = torch.where(resp, (PARAMS.low + PARAMS.high) - out.gates, 1.0)
    assert torch.allclose(inverted.gates, mirror, atol=1e-6, rtol=0)
    # the log-probs and the probe are the plain forward's, bit for bit
    plain = forward(actor, ids, am, response_mask=resp, temperature=TAU, gate_params=PARAMS, causal=causal)
    assert torch.equal(plain.logprobs, out.logprobs) and torch.equal(plain.concentration, out.concentration)


def test_the_gates_fall_as_the_uncertainty_rises(actor: Any, batch: dict[str, Any]) -> None:
    """Whole-row z-score: within a row, the token with the highest entropy has the lowest gate."""
    ids, am, resp = batch["ids"], batch["am"], batch["resp"]
    entropy, _ = reference_statistics(actor, ids, am)
    out = forward(
        actor, ids, am, response_mask=resp, temperature=TAU, gate_params=PARAMS, causal=False,
        policy_statistic="policy_entropy",
    )  # fmt: skip
    assert out.gates is not None
    for b in range(B):
        h, g = entropy[b][resp[b]], out.gates[b][resp[b]]
        assert int(h.argmax()) == int(g.argmin()) and int(h.argmin()) == int(g.argmax())


def test_policy_entropy_is_chunked_without_changing_it(actor: Any, batch: dict[str, Any]) -> None:
    head = actor.get_output_embeddings()
    hidden = torch.randn(7, head.weight.shape[1], generator=torch.Generator().manual_seed(0))
    whole = policy_entropy(hidden, head, temperature=TAU, chunk_tokens=100)
    ref = torch.distributions.Categorical(logits=head(hidden).double() / TAU).entropy()
    assert whole.dtype == torch.float32 and torch.allclose(whole.double(), ref, atol=1e-5, rtol=0)
    for chunk in (1, 3):  # the same up to the float32 rounding of the head's matmul
        assert torch.allclose(policy_entropy(hidden, head, temperature=TAU, chunk_tokens=chunk), whole, atol=1e-6)
    capped = policy_entropy(hidden, head, temperature=TAU, chunk_tokens=3, post=lambda z: torch.tanh(z / 2) * 2)
    want = torch.distributions.Categorical(logits=(torch.tanh(head(hidden) / 2) * 2).double() / TAU).entropy()
    assert torch.allclose(capped.double(), want, atol=1e-5, rtol=0)
    assert policy_entropy(hidden[:0], head, chunk_tokens=4).shape == (0,)


def test_a_masked_vocabulary_entry_adds_nothing_to_the_entropy() -> None:
    """A −inf logit is a token of probability 0: its term is 0 (not 0·(−inf) = NaN)."""

    def head(h: Any) -> Any:
        z = torch.zeros(h.shape[0], 4)
        z[:, 0] = -math.inf
        return z

    h = policy_entropy(torch.zeros(2, 3), head, chunk_tokens=1)
    assert torch.allclose(h, torch.full((2,), math.log(3.0)))


def test_policy_entropy_refuses_bad_arguments() -> None:
    head = torch.nn.Linear(3, 5)
    with pytest.raises(ShapeError, match="hidden: expected a 2-D float tensor"):
        policy_entropy(torch.zeros(2, 2, 3), head, chunk_tokens=1)
    with pytest.raises(ParameterError, match="chunk_tokens"):
        policy_entropy(torch.zeros(2, 3), head, chunk_tokens=0)
    with pytest.raises(ParameterError, match="temperature"):
        policy_entropy(torch.zeros(2, 3), head, chunk_tokens=1, temperature=0.0)


def test_forward_refuses_an_unknown_policy_statistic(actor: Any, batch: dict[str, Any]) -> None:
    with pytest.raises(ParameterError, match="policy_statistic: expected one of 'policy_entropy', 'token_nll'"):
        forward(actor, batch["ids"], batch["am"], policy_statistic="entropy")


@pytest.mark.parametrize("statistic", POLICY_STATISTICS)
def test_default_uncertainty_gates_read_only_the_prefix(statistic: str, actor: Any, batch: dict[str, Any]) -> None:
    """Changing the tokens from column k on (those that columns ≥ k score) moves no gate
    before k under the defaults (the running z-score); the whole-row z-score does move them."""
    ids, am, resp = batch["ids"], batch["am"], batch["resp"]
    arm = ARMS[UNCERTAINTY_ARMS[statistic]]
    k = 7
    changed = ids.clone()
    after = torch.zeros_like(ids, dtype=torch.bool)
    after[:, k + 1 :] = True
    after &= am
    changed = torch.where(after, (ids + 5) % (VOCAB - 3) + 3, ids)
    before = resp.clone()
    before[:, k:] = False
    moved = {}
    for causal in (True, False):
        settings = step.ScoringSettings(gate_params=PARAMS, temperature=TAU, causal=causal)
        g1 = step.score(actor, None, ids, am, resp, arm=arm, settings=settings).gates
        g2 = step.score(actor, None, changed, am, resp, arm=arm, settings=settings).gates
        assert g1 is not None and g2 is not None
        assert float((g1 - g2)[resp & ~before].abs().max()) > 1e-4  # the change reaches the gates after k
        moved[causal] = float((g1 - g2)[before].abs().max())
    assert moved[True] == 0.0 and moved[False] > 1e-4


@pytest.mark.parametrize("statistic", POLICY_STATISTICS)
def test_the_critic_never_reads_the_uncertainty_gates(statistic: str, actor: Any, batch: dict[str, Any]) -> None:
    """A TAC reads the concentration's causal gate features in every arm: the values of the
    uncertainty arms are those of ``comppo``, bit for bit, while Comp-GAE's gates differ."""
    ids, am, resp = batch["ids"], batch["am"], batch["resp"]
    torch.manual_seed(0)
    critic = TransportAlignedCritic.for_model(actor, width=16)
    with torch.no_grad():
        for p in critic.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    settings = step.ScoringSettings(gate_params=PARAMS, temperature=TAU, causal=True)
    plain = step.score(actor, critic, ids, am, resp, arm=ARMS["comppo"], settings=settings)
    other = step.score(actor, critic, ids, am, resp, arm=ARMS[UNCERTAINTY_ARMS[statistic]], settings=settings)
    assert plain.values is not None and other.values is not None
    assert torch.equal(plain.values, other.values) and torch.equal(plain.logprobs, other.logprobs)
    assert plain.gates is not None and other.gates is not None and not torch.equal(plain.gates, other.gates)
    # and the update's forward computes no gates of its own
    update = step.score(
        actor, critic, ids, am, resp, arm=ARMS[UNCERTAINTY_ARMS[statistic]], settings=settings, grad=True
    )
    assert update.values is not None and torch.equal(update.values.detach(), plain.values)


def test_the_uncertainty_arms_are_baselines_outside_the_default_compare() -> None:
    for statistic, name in UNCERTAINTY_ARMS.items():
        arm = ARMS[name]
        assert arm.critic == "tac" and arm.gates == statistic and GATE_SOURCES[statistic].policy_statistic == statistic
        assert not arm.in_default_compare and not arm.diagnostic and arm.gate_source.directed
        assert arm.reads_routing  # its TAC reads the probe; the gates themselves need none
        assert not arm.gate_source.reads_concentration and arm.replaces_gates
    assert [n for n, a in ARMS.items() if not a.in_default_compare] == ["comppo_oracle", *UNCERTAINTY_ARMS.values()]
    assert ARMS["comppo"].constant_gate_arm == "tac_fixed" and ARMS["comp_gae"].constant_gate_arm == "ppo_fixed"
    assert ARMS["grpo"].constant_gate_arm is None


def _tiny(**changes: Any) -> TrainConfig:
    return TrainConfig(**{**TINY_SETTINGS, "steps": 1, "eval_size": 4, "eval_every": 0, "device": "cpu", **changes})


@pytest.mark.parametrize("arm", list(UNCERTAINTY_ARMS.values()))
def test_an_uncertainty_arm_trains_a_step_deterministically(arm: str) -> None:
    def run() -> tuple[dict[str, Any], dict[str, Any]]:
        trainer = Trainer(_tiny(arm=arm))
        try:
            row = trainer.step(0)
        finally:
            trainer.dist.close()
        state = {f"actor.{k}": v.clone() for k, v in trainer.actor.state_dict().items()}
        assert trainer.critic is not None
        state.update({f"critic.{k}": v.clone() for k, v in trainer.critic.state_dict().items()})
        return {k: v for k, v in row.items() if not k.startswith("time_")}, state

    (row1, state1), (row2, state2) = run(), run()
    assert row1 == row2 and row1["arm"] == arm and row1["actor_updated"] is True
    assert isinstance(row1["gate_mean"], float) and 0.9 <= row1["gate_min"] <= row1["gate_max"] <= 1.0
    assert row1["gate_min"] < row1["gate_max"]  # the gates vary by token
    assert state1.keys() == state2.keys() and all(torch.equal(state1[k], state2[k]) for k in state1)


# --------------------------------------------------------------------------- gate_direction


def _diagnosis(tmp_path: Path, data: Any, name: str = "diagnosis.json") -> str:
    """A diagnosis.json of ``data``; a dict without ``settings`` records the default config's
    task (``TrainConfig()``'s, the task these tests' configs train), as ``diagnose`` does."""
    path = tmp_path / name
    if isinstance(data, dict) and "settings" not in data:
        data = {**data, "settings": {"task": config_task_record(TrainConfig())}}
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_gate_direction_applies_a_diagnosis_to_each_arms_gates(tmp_path: Path) -> None:
    path = _diagnosis(
        tmp_path,
        {"direction": "inverted", "directions": {"policy_entropy": "as_is", "token_nll": "inverted"}, "auc": {}},
    )
    want = {
        "comppo": "inverted",
        "comp_gae": "inverted",
        "comppo_shuffle": "inverted",
        "tac_fixed": "inverted",
        "comppo_policy_entropy": "as_is",
        "comppo_token_nll": "inverted",
        "grpo": "inverted",
    }
    for arm, direction in want.items():
        config = TrainConfig(arm=arm, gate_direction=path)
        assert config.gate_direction.startswith(path + "#sha256=") and config.applied_gate_direction == direction, arm
        assert config.gate_params.invert is (direction == "inverted")
        # another arm of the same settings (compare's base.replace(arm=...)) reads its own recommendation
        assert config.replace(arm="comppo_policy_entropy").applied_gate_direction == "as_is"
    # a saved config reads it back
    config = TrainConfig(arm="comppo", gate_direction=path)
    assert TrainConfig.from_json(config.to_json()) == config


def test_gate_direction_keywords_and_the_path_stored_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert TrainConfig(arm="comppo", gate_direction="inverted").gate_params.invert is True
    assert TrainConfig(arm="comppo").gate_params.invert is False
    assert TrainConfig(arm="tac_fixed", gate_direction="none").gate_params.invert is False
    _diagnosis(tmp_path, {"direction": "as_is"})
    monkeypatch.chdir(tmp_path)
    config = TrainConfig(arm="comppo", gate_direction="diagnosis.json")
    path, _, digest = config.gate_direction.partition("#sha256=")
    assert path == str(tmp_path / "diagnosis.json")
    assert digest == hashlib.sha256((tmp_path / "diagnosis.json").read_bytes()).hexdigest()


def test_a_diagnosis_rewritten_since_the_settings_were_made_is_refused(tmp_path: Path) -> None:
    """The settings pin the diagnosis's contents: a resumed run (config.json read back) or a
    compare's next run (``replace``) refuses a file rewritten since, instead of switching the
    gates' direction silently; the same contents are accepted wherever they are read back."""
    path = _diagnosis(tmp_path, {"direction": "as_is"})
    config = TrainConfig(arm="comppo", gate_direction=path)
    again = TrainConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again.gate_direction == config.gate_direction and again.gate_params.invert is False
    _diagnosis(tmp_path, {"direction": "inverted"})  # diagnose --overwrite, say
    for remade in (lambda: TrainConfig.from_dict(config.to_dict()), lambda: config.replace(arm="tac_fixed")):
        with pytest.raises(ParameterError, match="changed since these settings were made") as info:
            remade()
        assert info.value.argument == "gate_direction"
    assert TrainConfig(arm="comppo", gate_direction=path).gate_params.invert is True  # a new run reads it anew


def test_no_direction_is_refused_for_gates_with_one_naming_what_to_run(tmp_path: Path) -> None:
    path = _diagnosis(tmp_path, {"direction": "none", "directions": {"policy_entropy": "none"}})
    for arm, instead in (("comppo", "tac_fixed"), ("comp_gae", "ppo_fixed"), ("comppo_policy_entropy", "tac_fixed")):
        for value in (path, "none"):
            with pytest.raises(ParameterError, match=f"run {instead} .*instead") as info:
                TrainConfig(arm=arm, gate_direction=value)
            assert info.value.argument == "gate_direction"
    for arm in ("tac_fixed", "ppo_fixed", "grpo", "ppo", "comppo_oracle"):  # gates without a direction
        assert TrainConfig(arm=arm, gate_direction=path).gate_params.invert is False


@pytest.mark.parametrize(
    "content, arm, message",
    [
        (None, "comppo", "(?i)no such file"),
        ("{not json", "comppo", "parse error at line 1"),
        ("[1, 2]", "comppo", "a JSON object with 'direction'"),
        ({"auc": {}}, "comppo", "expected 'direction' to be one of 'as_is', 'inverted', 'none', got None"),
        ({"direction": "up"}, "comppo", "got 'up'"),
        ({"direction": "as_is"}, "comppo_token_nll", "recommends no direction for the token_nll gates"),
        ({"direction": "as_is", "directions": {"token_nll": 1}}, "comppo_token_nll", "got 1"),
        ({"direction": "as_is", "recommendation": {"statistic": "max"}}, "comppo", "statistic 'max'.*--statistic"),
        ({"direction": "as_is", "statistic": "l2"}, "tac_fixed", "statistic 'l2'"),
    ],
)
def test_a_bad_diagnosis_is_refused_naming_gate_direction(content: Any, arm: str, message: str, tmp_path: Path) -> None:
    path = str(tmp_path / "missing.json") if content is None else _diagnosis(tmp_path, content)
    with pytest.raises(ParameterError, match=message) as info:
        TrainConfig(arm=arm, gate_direction=path)
    assert info.value.argument == "gate_direction" and str(info.value).startswith("gate_direction: ")


@pytest.mark.parametrize("value", ["", "  ", 1, None])
def test_a_gate_direction_that_is_not_a_string_is_refused(value: Any) -> None:
    with pytest.raises(ParameterError, match="gate_direction: expected one of 'as_is', 'inverted', 'none'"):
        TrainConfig(gate_direction=value)


def test_recommended_direction_of_a_keyword_reads_no_file() -> None:
    assert recommended_direction("inverted", "comppo_token_nll") == "inverted"


def test_a_diagnosis_of_the_runs_statistic_applies(tmp_path: Path) -> None:
    path = _diagnosis(tmp_path, {"direction": "inverted", "recommendation": {"statistic": "max"}})
    assert TrainConfig(arm="comppo", statistic="max", gate_direction=path).gate_params.invert is True
    assert TrainConfig(arm="grpo", gate_direction=path).applied_gate_direction == "inverted"  # reads no gates


def test_an_old_config_without_gate_direction_loads_with_its_direction(tmp_path: Path) -> None:
    for invert, direction in ((True, "inverted"), (False, "as_is")):
        data = json.loads(TrainConfig(arm="comppo", steps=3).to_json())
        del data["gate_direction"]
        data["gate_invert"] = invert  # a config.json written before gate_direction
        config = TrainConfig.from_json(json.dumps(data))
        assert config.gate_direction == direction and config.gate_params.invert is invert and config.steps == 3
    data = json.loads(TrainConfig().to_json())
    del data["gate_direction"]  # older still: neither field
    assert TrainConfig.from_dict(data).gate_direction == "as_is"
    assert upgrade_fields({"gate_invert": True, "steps": 2}) == {"gate_direction": "inverted", "steps": 2}
    with pytest.raises(ParameterError, match="gate_invert: True means gate_direction='inverted'") as info:
        TrainConfig.from_dict({"gate_invert": True, "gate_direction": "as_is"})
    assert info.value.argument == "gate_invert"
    with pytest.raises(ParameterError, match="gate_invert: expected a bool"):
        TrainConfig.from_dict({"gate_invert": "yes"})
    with pytest.raises(ParameterError, match="gate_invert: False means gate_direction='as_is'"):
        with pytest.warns(DeprecationWarning):
            TrainConfig(gate_invert=False, gate_direction="inverted")


def test_the_python_keyword_gate_invert_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="gate_direction='inverted'"):
        config = TrainConfig(arm="comppo", gate_invert=True)
    assert config.gate_direction == "inverted" and config.gate_params.invert is True
    assert config.replace(steps=2).gate_direction == "inverted"
    assert "gate_invert" not in config.to_dict()


def test_gate_direction_is_a_flag(tmp_path: Path) -> None:
    import argparse

    path = _diagnosis(tmp_path, {"direction": "inverted"})
    parser = TrainConfig.add_arguments(argparse.ArgumentParser())
    config = TrainConfig.from_args(parser.parse_args(["--arm", "comppo", "--gate-direction", path]))
    assert config.gate_direction.startswith(path + "#sha256=") and config.gate_params.invert is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--gate-invert"])  # replaced by --gate-direction inverted
