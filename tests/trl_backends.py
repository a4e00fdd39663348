"""The sharded backends ``CompPOTrainer`` is tested under on CPU (2 gloo processes):
DDP, DeepSpeed ZeRO-2, ZeRO-3 and FSDP2 (tests/integrations/test_trl_backends.py, launched
per backend with tests/trl_sharded_worker.py).

* :func:`write_accelerate_config`: the ``accelerate launch`` config of a backend, for CPU;
* :func:`launch`: ``accelerate launch`` of a script under a backend, in a clean environment;
  :func:`run_single`: the same script as one plain process (the reference);
* :func:`use_fsdp_on_cpu`: the patch that makes accelerate run FSDP on CPU at all (in the
  worker, before the Trainer is built; the package has no such thing);
* :func:`backend_facts`: what really ran (so a silent fallback to DDP fails a test);
* :func:`full_parameters`: full CPU copies of a module's parameters under any backend.

DeepSpeed runs on CPU through its CPU accelerator over gloo when installed without its
prebuilt ops (the ``[deepspeed]`` extra: ``pip install ".[deepspeed]"``); it JIT-compiles one op at the
first launch, which needs ``ninja`` on ``PATH`` and a C++ compiler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

#: The backends, in the order the tests run them.
BACKENDS = ("ddp", "zero2", "zero3", "fsdp2")

#: tests/, for ``import trl_tiny`` / ``import trl_backends`` in the launched scripts.
TESTS = Path(__file__).resolve().parent


def _deepspeed_json(stage: int) -> dict[str, Any]:
    """A DeepSpeed config whose ``"auto"`` values HF Trainer fills from its arguments (batch
    sizes, accumulation, clipping); no ``optimizer`` section, so DeepSpeed wraps the
    Trainer's own ``torch.optim.AdamW`` (no compiled DeepSpeed optimiser, same maths as one
    process)."""
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": False, "contiguous_gradients": True}
    if stage == 3:
        zero.update(
            stage3_gather_16bit_weights_on_model_save=True,  # full weights in each checkpoint
            stage3_param_persistence_threshold=0,  # partition every parameter, even the tiny ones
            stage3_prefetch_bucket_size=0,
        )
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "zero_optimization": zero,
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


def write_accelerate_config(backend: str, path: Path, num_processes: int) -> Path:
    """Write the ``accelerate launch`` config of ``backend`` (one of :data:`BACKENDS`) for
    ``num_processes`` CPU processes to ``path`` (a YAML file; ZeRO's DeepSpeed JSON beside it)
    and return ``path``.

    ``ddp`` is written as accelerate's ``MULTI_GPU`` type: that is the type whose launcher
    is torchrun (a ``MULTI_CPU`` config launches one process unless mpirun is set up); with
    ``use_cpu: true`` the Trainer then runs ``MULTI_CPU`` over gloo, which the tests assert.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "compute_environment: LOCAL_MACHINE",
        "debug: false",
        "machine_rank: 0",
        "num_machines: 1",
        f"num_processes: {num_processes}",
        "use_cpu: true",
        "rdzv_backend: static",
        "same_network: true",
        "main_training_function: main",
        "downcast_bf16: 'no'",
        "tpu_use_cluster: false",
        "tpu_use_sudo: false",
    ]
    if backend in ("zero2", "zero3"):
        # with a DeepSpeed JSON, accelerate refuses a mixed_precision beside it: the JSON's
        # bf16/fp16 sections (both off) say it
        pass
    else:
        lines.append('mixed_precision: "no"')
    if backend == "ddp":
        lines += ["distributed_type: MULTI_GPU", "gpu_ids: all"]
    elif backend in ("zero2", "zero3"):
        ds = path.with_suffix(".deepspeed.json")
        ds.write_text(json.dumps(_deepspeed_json(int(backend[-1])), indent=2))
        lines += [
            "distributed_type: DEEPSPEED",
            "deepspeed_config:",
            f"  deepspeed_config_file: {ds}",
            "  zero3_init_flag: false",
        ]
    else:  # fsdp2
        lines += [
            "distributed_type: FSDP",
            "fsdp_config:",
            "  fsdp_version: 2",
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",  # the model's _no_split_modules
            "  fsdp_reshard_after_forward: true",
            "  fsdp_offload_params: false",
            "  fsdp_cpu_ram_efficient_loading: false",
            "  fsdp_state_dict_type: FULL_STATE_DICT",
            "  fsdp_activation_checkpointing: false",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    """The launched processes' environment: tests/ on ``PYTHONPATH``, the venv's ``bin/``
    first on ``PATH`` (ninja), one thread, nothing downloaded, warnings off."""
    paths = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    bin_dir = str(Path(sys.executable).parent)  # ninja, for DeepSpeed's JIT-compiled op
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "PYTHONWARNINGS": "ignore",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }


def run_single(
    script: str | os.PathLike[str], args: list[str], *, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python script args``: one plain process, no launcher and no process group
    (accelerate's ``distributed_type`` NO), in :func:`launch`'s environment."""
    cmd = [sys.executable, str(script), *args]
    return subprocess.run(cmd, env=_environment(env), capture_output=True, text=True, timeout=timeout)


def launch(
    backend: str,
    script: str | os.PathLike[str],
    args: list[str],
    *,
    processes: int = 2,
    port: int,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    config_dir: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``accelerate launch`` ``script args`` on ``processes`` CPU processes under ``backend``
    (its config written to ``config_dir``, default the directory of the first argument
    that is a path, else the current directory); output captured, never raises on failure."""
    if config_dir is None:
        config_dir = Path(args[0]) if args and not args[0].startswith("-") else Path.cwd()
    config_dir.mkdir(parents=True, exist_ok=True)
    config = write_accelerate_config(backend, config_dir / f"accelerate-{backend}-{processes}.yaml", processes)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(config),
        "--num_processes", str(processes),
        "--main_process_port", str(port),
        str(script), *args,
    ]  # fmt: skip
    return subprocess.run(cmd, env=_environment(env), capture_output=True, text=True, timeout=timeout)


def use_fsdp_on_cpu() -> None:
    """Make accelerate run FSDP on CPU when launched with an FSDP config.

    accelerate only turns FSDP on for accelerator devices: ``AcceleratorState.__init__``
    sets ``distributed_type = FSDP`` in its ``MULTI_GPU``/``MULTI_XPU``/... branch, and a
    CPU run (``use_cpu``, as every test here is) is ``MULTI_CPU``, so an FSDP config silently
    runs as DDP (``DistributedDataParallel`` around the model, no warning). This wraps
    ``AcceleratorState.__init__``: when ``ACCELERATE_USE_FSDP=true`` (what ``accelerate
    launch`` sets for an FSDP config) and the state came out ``MULTI_CPU``, it sets the FSDP
    type and plugin as accelerate's own branch does, and FSDP2's ``fully_shard`` then runs
    over gloo (DTensor parameters). Call it in the launched process before the Trainer is
    built; without the variable it does nothing. Test-only: the package has no such patch.
    """
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "_fsdp_on_cpu", False):
        return

    def __init__(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    __init__._fsdp_on_cpu = True  # type: ignore[attr-defined]
    AcceleratorState.__init__ = __init__  # type: ignore[method-assign]


# ---- what ran


def _unwrap(module: Any) -> Any:
    """The module inside DDP / a DeepSpeedEngine (FSDP2 shards the module in place)."""
    while hasattr(module, "module") and isinstance(module.module, torch.nn.Module):
        module = module.module
    return module


def _is_dtensor(p: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without DTensor
        return False
    return isinstance(p, DTensor)


def sharding_facts(module: Any) -> dict[str, Any]:
    """How ``module``'s parameters are held on this process: the full and local value counts,
    whether ZeRO-3 partitions them (``ds_numel`` above the local share) and whether they are
    DTensors (FSDP2)."""
    params = list(_unwrap(module).parameters())
    full = local = 0
    partitioned = False
    for p in params:
        if hasattr(p, "ds_numel"):  # ZeRO-3: p.data is empty, the shard is p.ds_tensor
            full += int(p.ds_numel)
            mine = int(p.ds_tensor.numel()) if getattr(p, "ds_tensor", None) is not None else int(p.numel())
            local += mine
            partitioned = partitioned or mine < int(p.ds_numel)
        elif _is_dtensor(p):
            full += int(p.numel())
            local += int(p.to_local().numel())
        else:
            full += int(p.numel())
            local += int(p.numel())
    return {
        "parameters": len(params),
        "numel": full,
        "local_numel": local,
        "zero3_partitioned": partitioned,
        "dtensor": bool(params) and all(_is_dtensor(p) for p in params),
        "wrapper": type(module).__name__,
    }


def backend_facts(trainer: Any) -> dict[str, Any]:
    """What really ran under ``trainer``: accelerate's ``distributed_type``, the process
    count, torch.distributed's backend, DeepSpeed's ZeRO stage, the type of
    ``trainer.model_wrapped``, and :func:`sharding_facts` of the actor and, when it is a
    value model accelerate prepared (a standard-critic arm), of ``trainer.critic``."""
    acc = trainer.accelerator
    dist = torch.distributed
    kind = acc.distributed_type
    stage = None
    if str(getattr(kind, "value", kind)) == "DEEPSPEED":
        plugin = acc.state.deepspeed_plugin
        stage = int(plugin.deepspeed_config["zero_optimization"]["stage"])
    critic = getattr(trainer, "critic", None)
    critic_facts = None
    # the TAC lives outside accelerate; a standard critic is a prepared model
    if critic is not None and not _is_tac(acc, critic):
        critic_facts = sharding_facts(critic)
    return {
        "distributed_type": str(getattr(kind, "value", kind)),
        "num_processes": int(acc.num_processes),
        "group": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
        "zero_stage": stage,
        "model_wrapped": type(trainer.model_wrapped).__name__,
        "zero_optimizer": _zero_optimizer(trainer.model_wrapped),
        "actor": sharding_facts(trainer.model_wrapped),
        "critic": critic_facts,
    }


def _zero_optimizer(engine: Any) -> str | None:
    """The type of a DeepSpeedEngine's ZeRO optimiser (``DeepSpeedZeroOptimizer`` for
    stages 1–2, ``DeepSpeedZeroOptimizer_Stage3``); None for any other wrapper."""
    inner = getattr(engine, "optimizer", None)
    return type(inner).__name__ if inner is not None and type(engine).__name__ == "DeepSpeedEngine" else None


def _is_tac(accelerator: Any, critic: Any) -> bool:
    from comppo_core.rl.critics.tac import TransportAlignedCritic

    return isinstance(accelerator.unwrap_model(critic), TransportAlignedCritic) or isinstance(
        critic, TransportAlignedCritic
    )


@torch.no_grad()
def full_parameters(module: Any) -> list[torch.Tensor]:
    """Full (unsharded) CPU float copies of ``module``'s parameters, in ``parameters()``
    order, under any backend: DDP and DeepSpeedEngine wrappers unwrapped, ZeRO-3's
    partitions gathered (``deepspeed.zero.GatheredParameters``), FSDP2's DTensors through
    ``full_tensor()``. Collective where the parameters are sharded: every process calls it."""
    params = list(_unwrap(module).parameters())
    if any(hasattr(p, "ds_numel") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return [p.detach().clone().float().cpu() for p in params]
    out = []
    for p in params:
        t = p.full_tensor() if _is_dtensor(p) else p
        out.append(t.detach().clone().float().cpu())
    return out
