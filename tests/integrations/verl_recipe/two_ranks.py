"""One CompPO actor update on verl's FSDP2 engine in N CPU processes (gloo), for test_verl_losses.py.

Run by ``torchrun --standalone --nproc_per_node N two_ranks.py MODEL OUT``: every rank builds
the CompPO engine (a TAC, its head randomised with the same seed everywhere) on the tiny
Llama saved at ``MODEL``, takes its share of the 4-sequence rollout of tests/verl_cpu.py
(rank r of N: rows ``r·4/N .. (r+1)·4/N``, as verl's dispatch splits a batch over data-parallel
ranks), and runs one ``train_batch`` with ``comppo_actor_loss``. verl normalises the loss by
the global token count (all-reduced) times ``dp_size`` and FSDP2 averages the gradients
over the ranks (the TAC's unit reduce-scatters its own), so the gradients and the step are
those of one process on all 4 rows. Rank 0 writes every parameter's full gradient and
value after the step, and the world size, to ``OUT`` (``torch.save``).
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/: verl_cpu

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl_cpu import (
        UPDATE_META,
        CPUPlatform,
        actor_config,
        as_no_padding,
        comppo_engine_with,
        rollout,
        update_fields,
    )

#: the TAC and settings of the run (as test_verl_losses.py's)
TAC = {"taps": (0, 2), "width": 16, "temporal": "gru"}


def main(model: str, out: str) -> None:
    from verl.plugin.platform import platform_manager

    from comppo_core.integrations.verl import engine as comppo_engine
    from comppo_core.integrations.verl.losses import comppo_actor_loss

    torch.set_num_threads(1)
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"  # verl registers its engines for cuda/npu only
    platform_manager.set_platform(CPUPlatform())
    torch.distributed.init_process_group("gloo")  # rank and world size from torchrun
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    try:
        engine = comppo_engine_with(
            model, comppo_engine.EngineSettings(tac=TAC, critic_lr=3e-2, tac_seed=0), optimizer={"lr": 1e-2}
        )
        batch = rollout()
        batch |= update_fields(batch)  # drawn for all 4 rows, as one process draws them
        rows = slice(rank * 4 // world, (rank + 1) * 4 // world)
        td = as_no_padding({k: v[rows] for k, v in batch.items()}, **(UPDATE_META | {"comppo_probe": True}))
        loss_fn = functools.partial(comppo_actor_loss, config=actor_config(), cliprange_value=0.2)
        with engine.train_mode():
            engine.train_batch(td, loss_function=loss_fn)
            grads = {n: p.grad.full_tensor() for n, p in engine.module.named_parameters()}
        params = {n: p.full_tensor().detach() for n, p in engine.module.named_parameters()}
        if rank == 0:
            torch.save({"world_size": world, "grads": grads, "params": params}, out)
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
