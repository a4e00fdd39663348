"""Packed-row equality figures (docs/hf.md, "Packed rows").

Run from the repository root: python benches/lab/packed_rows.py
(with another transformers on PYTHONPATH to measure it there). Prints, per model and attention,
the max abs difference packed vs separate (float32) of: log-probs with the model's own
attention, log-probs / concentration (worst of entropy, max, l2) / per-layer with the
probe, and the mixed-row error the checks prevent (attention_mask=ones).
"""

import sys

import torch
import transformers

sys.path.insert(0, "tests")
sys.path.insert(0, "tests/hf")
import test_packed_rows as t  # noqa: E402

from comppo_core import hf  # noqa: E402
from comppo_core.hf import lm  # noqa: E402

print("transformers", transformers.__version__, "torch", torch.__version__)
ids = t.packed_ids()
pos = lm.packed_position_ids(torch.tensor(t.CU))
for arch in t.ARCHS:
    for attn in t.ATTNS:
        model = t.model_for(arch, attn)
        plain = hf.score(model, ids, cu_seqlens=t.CU)
        sep = torch.cat([hf.score(model, s).logprobs[0] for s in t.separate(ids)])
        d_lp = t.max_diff(t.columns_of(plain.logprobs, plain.columns), sep)
        d_lp_probe = d_conc = d_per = 0.0
        for stat in t.STATS:
            got = hf.score(model, ids, cu_seqlens=t.CU, per_layer=True, statistic=stat)
            seps = [hf.score(model, s, per_layer=True, statistic=stat) for s in t.separate(ids)]
            d_lp_probe = max(d_lp_probe, t.max_diff(t.columns_of(got.logprobs, got.columns), torch.cat([s.logprobs[0] for s in seps])))
            d_conc = max(d_conc, t.max_diff(t.columns_of(got.concentration, got.columns), torch.cat([s.concentration[0] for s in seps])))
            d_per = max(d_per, t.max_diff(t.columns_of(got.per_layer, got.columns), torch.cat([s.per_layer[0] for s in seps])))
        with torch.no_grad():
            mixed = model(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids), use_cache=False).logits
            sepl = torch.cat([model(input_ids=s, use_cache=False).logits for s in t.separate(ids)], dim=1)
        print(f"{arch:6s} {attn:5s} logprobs(own attn) {d_lp:.2e}  logprobs(probe) {d_lp_probe:.2e}  "
              f"concentration {d_conc:.2e}  per_layer {d_per:.2e}  | mixed logits (mask=ones) {t.max_diff(mixed, sepl):.2f}")

# the TAC's inputs and values (the probe runs SDPA whatever the model's attention)
from comppo_core import rl  # noqa: E402
from comppo_core.rl.critics.inputs import packed_critic_inputs  # noqa: E402
from comppo_core.rl.critics.taps import TapRecorder  # noqa: E402

cu = torch.tensor(t.CU)
resp = torch.zeros(1, t.N - 1, dtype=torch.bool)
for i, k in enumerate((3, 4, 5)):
    resp[0, t.CU[i + 1] - 1 - k : t.CU[i + 1] - 1] = True
for arch in t.ARCHS:
    for temporal in ("none", "gru", "attention"):
        model = t.model_for(arch, "sdpa")
        torch.manual_seed(3)
        tac = rl.TransportAlignedCritic.for_model(model, taps=(0, 1), width=16, temporal=temporal, heads=2)
        with torch.no_grad():
            tac.head.weight.normal_()
            tac.head.bias.normal_()
        rec = TapRecorder(model, tac.taps)
        with rec, torch.no_grad():
            sc = hf.score(model, ids, cu_seqlens=cu, per_layer=True)
        inp = packed_critic_inputs(ids, cu, taps=rec.hidden, per_layer=sc.per_layer, concentration=sc.concentration,
                                   response_mask=resp & sc.columns)
        with torch.no_grad():
            values = lm.pack_columns(tac(inp), cu)
        spy = t._Recorder(tac)
        d = {"taps": 0.0, "per_layer": 0.0, "gates": 0.0}
        vals = []
        for i, s in enumerate(t.separate(ids)):
            L = s.shape[1]
            out = rl.forward(model, s, None, critic=spy, response_mask=lm.unpack_columns(resp, cu)[i : i + 1, : L - 1])
            vals.append(out.values[0])
            sep = spy.seen[-1]
            d["taps"] = max([d["taps"]] + [t.max_diff(inp.taps[k][i, :L], sep.taps[k][0]) for k in tac.taps])
            d["per_layer"] = max(d["per_layer"], t.max_diff(inp.per_layer[i, : L - 1], sep.per_layer[0]))
            d["gates"] = max(d["gates"], t.max_diff(inp.gates[i, : L - 1], sep.gates[0]))
        dv = t.max_diff(t.columns_of(values, sc.columns), torch.cat(vals))
        print(f"TAC {arch:6s} temporal={temporal:9s} taps {d['taps']:.2e}  per_layer {d['per_layer']:.2e}  "
              f"gates {d['gates']:.2e}  values {dv:.2e}")
