"""One actor update of the verl recipe's engine against the package's own update: max |diff|.

For each case of ``tests/integrations/verl_recipe/test_verl_losses.py`` (loss aggregation, KL loss,
the TAC's own lr, value clip) and both batch layouts (the legacy padded rows, the v1
TransferQueue's nested fields): verl 0.9.1's FSDP2 engine with the CompPO engine and
``comppo_actor_loss`` (CPU, one gloo process, float32, tiny Llama) against ``rl.step.score`` +
``rl.step.minibatch_loss`` + ``torch.optim.AdamW`` on the same batch. Prints the max |diff| of the
gradients (actor, TAC) and of the parameters after the step, and how much the ratio, dual and value
clips bound. ``MUTATE=vf_coef|value_clip|dual_clip|kl|critic_lr`` changes the package side, to see
the comparison fail.

Run (an environment with ``comppo-core[verl]``; from the repository root)::

    OMP_NUM_THREADS=1 PYTHONPATH=python python benches/lab/verl_update_figures.py
"""

import functools
import os
import sys
import tempfile

sys.path[:0] = ["tests", "tests/integrations/verl_recipe"]
import test_verl_losses as T
import torch
from verl_cpu import (
    TAU,
    as_no_padding,
    comppo_engine_with,
    cpu_process_group,
    full_state,
    rollout,
    tiny_llama,
    transfer_queue_batch,
)

import comppo_core as cc
from comppo_core import rl
from comppo_core.integrations.verl import engine as E
from comppo_core.integrations.verl.losses import comppo_actor_loss

mutate = os.environ.get("MUTATE", "")
torch.set_num_threads(1)
with cpu_process_group():
    path = tempfile.mkdtemp() + "/tiny"
    hf = tiny_llama(path)
    for case, (over, lk, clr) in T.CASES.items():
        for layout in ("padded", "transfer_queue"):
            config = T.actor_config(**over)
            params = cc.GateParams(low=0.2)
            eng = comppo_engine_with(
                path, E.EngineSettings(tac=T.TAC, gate_params=params, critic_lr=clr), optimizer={"lr": T.LR}
            )
            names = [n for n, _ in eng.module.named_parameters()]
            before = full_state(eng.module)
            tac_state = {k[11:]: v for k, v in before.items() if k.startswith("comppo_tac.")}
            batch = rollout()
            cu = torch.nn.functional.pad((batch["attention_mask"] != 0).sum(1).cumsum(0), (1, 0))
            t = rl.TransportAlignedCritic.for_model(hf, **T.TAC)
            t.load_state_dict(tac_state)
            extra = T.update_batch(hf, t.eval(), batch, cu)
            meta = dict(
                comppo_probe=True,
                use_remove_padding=True,
                use_dynamic_bsz=False,
                micro_batch_size_per_gpu=2,
                use_fused_kernels=False,
                calculate_entropy=False,
                temperature=TAU,
                global_batch_size=4,
            )
            full = {**batch, **extra}
            td = as_no_padding(full, **meta) if layout == "padded" else transfer_queue_batch(full, **meta)
            with eng.train_mode():
                out = eng.train_batch(td, loss_function=functools.partial(comppo_actor_loss, config=config, **lk))
                grads = {n: p.grad.full_tensor() for n, p in eng.module.named_parameters()}
            vf, clip = lk["vf_coef"], lk["cliprange_value"]
            if mutate == "vf_coef":
                vf = vf * 1.01
            if mutate == "value_clip":
                clip = None if clip is not None else 0.2
            s = T.loss_settings(config, vf, clip)
            if mutate == "dual_clip":
                s = rl.step.LossSettings(**{**s.__dict__, "dual_clip": None})
            if mutate == "kl":
                s = rl.step.LossSettings(**{**s.__dict__, "kl_coef": 0.0})
            if mutate == "critic_lr":
                clr = None
            hand, stats = T.package_update(hf, tac_state, batch, extra, cu, s, params, eng.optimizer, clr)
            ga = max(float((grads[n] - hand[n].grad).abs().max()) for n in names if n.startswith("comppo_tac."))
            gp = max(float((grads[n] - hand[n].grad).abs().max()) for n in names if not n.startswith("comppo_tac."))
            gmax = max(float(hand[n].grad.abs().max()) for n in names)
            after = {n: p.full_tensor().detach() for n, p in eng.module.named_parameters()}
            pa = max(float((after[n] - hand[n].detach()).abs().max()) for n in names if n.startswith("comppo_tac."))
            pp = max(float((after[n] - hand[n].detach()).abs().max()) for n in names if not n.startswith("comppo_tac."))
            eps = eng.optimizer.defaults["eps"]
            pc = max(
                float(torch.where(hand[n].grad.abs() >= 100 * eps, after[n] - hand[n].detach(), 0.0).abs().max())
                for n in names
            )
            mv = max(float((after[n] - before[n]).abs().max()) for n in names)
            print(
                f"{case:34s} {layout:15s} grad actor {gp:.1e} TAC {ga:.1e} (max|g| {gmax:.2f})  params actor {pp:.1e} TAC {pa:.1e} conditioned {pc:.1e} (moved {mv:.1e}) clipfrac {stats['clipfrac']:.2f} vclip {stats['value_clipfrac']:.2f} lower {out['metrics']['actor/pg_clipfrac_lower'].aggregate():.2f}",
                flush=True,
            )
