"""The verl recipe's old-log-prob pass against ``comppo_core.rl.forward``: max |diff| per output.

verl 0.9.1's FSDP2 engine with the CompPO engine (``integrations/verl/engine.py``), on CPU in one
gloo process (``tests/verl_cpu.py``'s test-only CPU platform), float32, a tiny random Llama, the
rollout of ``tests/verl_cpu.py`` (4 sequences, 2 micro-batches); the TAC's head randomised so that
its values are not 0. Each line: log-probs, concentration, gates and TAC values on the response
columns, against ``rl.forward`` on the same rows packed (``cu_seqlens``) / padded.

Run (an environment with ``comppo-core[verl]``; from the repository root)::

    OMP_NUM_THREADS=1 PYTHONPATH=python python benches/lab/verl_old_log_prob_figures.py

``tests/integrations/verl_recipe/test_verl_engine.py::test_old_log_prob_pass_equals_rl_forward``
pins the same comparison at 1e-5; this prints the figures docs/verl.md quotes.
"""

import sys
import tempfile

import torch

sys.path.insert(0, "tests")
from verl_cpu import TAU, cpu_process_group, new_engine, old_log_prob_batch, padded_to_packed, rollout, tiny_llama

import comppo_core as cc
from comppo_core import rl
from comppo_core.integrations.verl import engine as E
from comppo_core.integrations.verl.layout import from_nested_columns, response_columns

torch.set_num_threads(1)
TAC = {"taps": (0, 2), "width": 16, "temporal": "gru"}
with cpu_process_group(), tempfile.TemporaryDirectory() as tmp:
    hf = tiny_llama(tmp + "/m")
    E.register_engine()
    for normalize, causal in [("causal", False), ("sequence", False), ("sequence", True)]:
        params = cc.GateParams(low=0.2, normalize=normalize)
        E.configure_engine(E.EngineSettings(tac=TAC, gate_params=params, causal=causal))
        eng = new_engine(tmp + "/m", model_type=E.MODEL_TYPE)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in eng.module.comppo_tac.head.parameters():
                p.copy_(
                    torch.distributed.tensor.distribute_tensor(
                        torch.randn(tuple(p.shape), generator=g), p.device_mesh, p.placements
                    )
                )
        batch = rollout()
        td = old_log_prob_batch(batch, comppo_probe=True)
        with eng.eval_mode():
            out = eng.infer_batch(td, loss_function=None)["model_output"]
        ids = td["input_ids"].values()[None]
        cu = td["input_ids"].offsets().long()
        resp = response_columns(cu, batch["response_mask"], batch["attention_mask"])
        tac = rl.TransportAlignedCritic.for_model(hf, **TAC)
        tac.load_state_dict({k: v.full_tensor() for k, v in eng.module.comppo_tac.state_dict().items()})
        tac.eval()
        pr = torch.cat([torch.zeros_like(batch["prompts"][:, 1:]), batch["response_mask"]], 1) != 0
        kw = dict(temperature=TAU, critic=tac, gate_params=params, causal=causal)
        pk = rl.forward(hf, ids, None, cu_seqlens=cu, response_mask=resp, **kw)
        pd = rl.forward(hf, batch["input_ids"], batch["attention_mask"], response_mask=pr, **kw)
        row = []
        for name, key, a, b in [
            ("log-probs", "log_probs", pk.logprobs, pd.logprobs),
            ("concentration", "concentration", pk.concentration, pd.concentration),
            ("gates", "comp_gates", pk.gates, pd.gates),
            ("values", "values", pk.values, pd.values),
        ]:
            got = from_nested_columns(out[key], cu)
            d1 = float((got[resp].double() - a[resp].double()).abs().max())
            d2 = float((got[resp].double() - padded_to_packed(b, batch["attention_mask"])[resp].double()).abs().max())
            row.append(f"{name} {d1:.1e}/{d2:.1e}")
        print(
            f"normalize={normalize} causal={causal} ({int(resp.sum())} response cols, gates<0.99: {int((pk.gates[resp] < 0.99).sum())}): "
            + "; ".join(row)
        )
