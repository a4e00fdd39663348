"""torch.distributed for the trainer: the same step on one process or on N under ``torchrun``.

``torchrun --nproc-per-node N <a script that calls comppo_core.rl.train(config)>`` starts N
processes; each reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_ADDR``/``PORT``
from the environment and :meth:`Dist.setup` joins the process group (NCCL when the run
computes on CUDA, one GPU per process, ``cuda:LOCAL_RANK``; gloo on CPU). Without those
variables (or with ``WORLD_SIZE=1``) nothing is initialised and every collective below is
the identity, so one process runs exactly the code it ran before.

What a step does across ``W`` ranks (rank ``r``), with ``P = prompts_per_step`` (a
multiple of ``W``) and ``G = group_size``::

    prompts     every rank draws the same P prompts (the same NumPy stream) and keeps
                prompts r·P/W … (r+1)·P/W − 1, with their G samples: rows
                r·B/W … (r+1)·B/W − 1 of the global batch of B = P·G sequences
    layout      prompts left-padded to the widest prompt of the *global* batch (every rank
                knows all P prompts) and responses right-padded to the global longest
                (one all-reduce MAX), so column j means the same on every rank as in a
                one-process run
    sampling    per-row uniforms keyed by (seed, step, prompt index, sample index)
                (:mod:`comppo_core.rl.engine.sampling`): a row's sample does not depend on which
                rank draws it or on the other rows
    per row     generation, the verifier, the scoring forward, the reference, GAE (cc.gae
                is a per-row recursion), the causal gates: local
    batch-wide  cc.group_advantages, cc.masked_whiten, cc.controls (constant, shuffle,
                by_position), gate_normalize="batch", cc.credit_stats and every metric:
                computed on the rows of all ranks, gathered in rank order
                (:meth:`Dist.gather_rows`), which is the global batch in its
                one-process order, so the numbers are the one-process numbers
    update      every rank draws the same permutation of the B global rows; minibatch k is
                the same set of global rows as in one process, each rank holding its own;
                each rank's loss is its rows' share of the global minibatch's loss
                (token-mean: Σ_local ℓ / N_tokens(minibatch); the seq-mean modes: the same
                with rows), so the SUM of the ranks' gradients (one all-reduce, in buckets)
                is the gradient of the one-process minibatch; then identical clipping and
                identical AdamW steps on every rank
    outputs     rank 0 writes config.json, warmstart/, metrics.jsonl, checkpoint/ and
                summary.json; every rank reads a checkpoint on resume
    evaluation  the held-out problems split across ranks (contiguous), scores summed
    a failure   the rank whose step raised announces it and breaks the group; the others
                leave the collective they wait in at once (:meth:`Dist.stop_all`, below)

The parameters after k steps equal those of one process on the same global batch up to
float rounding (the loss of a minibatch is summed in a different order, and the per-row
forwards run in batches of a different size); ``tests/rl/test_rl_distributed.py`` pins it
with 2 gloo processes on CPU.

**When one rank fails.** The ranks run in lockstep, so an exception on one rank (a
verifier's error, a non-finite value only its rows hold) would leave the others waiting in
their next collective until the backend's timeout (30 minutes on gloo) unless its process
ends. :meth:`Dist.stop_all`, called by the trainer with the exception, (1) announces it:
``{"rank", "step", "error"}`` under one key of the process group's store (the first rank to
announce wins), (2) breaks the process group (``destroy_process_group``; NCCL: abort), also
one the caller created, since ranks that disagree on the next collective cannot use it
again, and (3) returns the exception to raise. A rank waiting in a collective sees its
peer's connection close at once; every collective here turns that error into
:class:`~comppo_core.rl.runs.interrupts.RankFailed` naming the announced rank, step and error
(waiting up to :data:`ANNOUNCE_WAIT_S` for the announcement; without one the backend's
error stands), and that rank in turn breaks its group, so a third rank waiting on it leaves
too. Nothing runs an extra collective: the step's cost is unchanged. No rank writes a
checkpoint on the way out: rank 0 writes one only after a step whose every collective
completed on every rank, so the kept checkpoint is the last state all ranks agreed on.
Under ``torchrun`` the agent also stops the survivors once the failing process exits. On
NCCL (not tried: no GPUs were lent to this work) a peer's kernel may not notice the abort;
then that peer ends when torchrun stops it or at NCCL's own timeout (10 minutes).

**Why not the ``DistributedDataParallel`` wrapper.** The gradient all-reduce is DDP's
(the same SUM all-reduce of the same buckets, without overlapping it with the backward),
written out because the wrapper does not fit the step: (1) :func:`comppo_core.rl.forward`
and the probe need the bare Hugging Face model (its config, ``set_attn_implementation``,
its decoder layers), which ``DistributedDataParallel`` hides behind ``.module``; (2) a
rank may hold no row of a minibatch (the permutation is global), and DDP's reducer
expects every rank to run a forward and a backward over every parameter; (3) the critic
warm-up steps train the critic alone, where DDP would wait for the actor's gradients.

**FSDP2 (``TrainConfig.fsdp``)**, for policies that do not fit one device:
:func:`shard_model` applies ``torch.distributed.fsdp.fully_shard`` to each decoder layer
and then the model, for the policy, its KL reference and a standard critic (the TAC is
small and stays replicated, all-reduced as above). What changes in the step:

* every ``generate`` runs with ``synced_gpus`` (the all-gathers sit in each forward, so a
  process whose responses ended early keeps stepping until all have);
* every process runs a forward and a backward for every minibatch: one without a row of it
  runs one of its rows with a zero loss (FSDP's collectives are in both);
* FSDP reduce-scatters the sharded gradients as the mean over processes; the step's loss
  shares want the sum, so :meth:`Dist.all_reduce_gradients` scales them by W instead of
  all-reducing them (``set_gradient_divide_factor(1.0)`` would say the same, but gloo
  refuses its ``PREMUL_SUM``);
* checkpoints hold the full state dicts (gathered with
  ``torch.distributed.checkpoint.state_dict``, a collective, and written by rank 0), in the
  same files as an unsharded run's; a resume reads them and shards them again;
* evaluation gives a process without a held-out problem one to answer and discard.

Proven on CPU (``tests/rl/test_rl_distributed.py``): 2 gloo processes with ``fsdp`` equal
one unsharded process on the same global batch, with the parameters asserted to be
DTensors; a resume continues exactly. Not tried on GPUs (NCCL, bf16 mixed precision).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ...errors import NonFiniteError, ParameterError
from ..runs.interrupts import RankFailed

__all__ = [
    "ANNOUNCE_WAIT_S",
    "BUCKET_BYTES",
    "Dist",
    "describe_error",
    "is_sharded",
    "resolve_device",
    "shard_bounds",
    "shard_model",
]

#: Bytes of gradients all-reduced in one call (DDP's default bucket is 25 MiB).
BUCKET_BYTES = 25 * 2**20

#: Seconds a rank whose collective failed waits for a peer's announcement of its error.
ANNOUNCE_WAIT_S = 2.0

#: Runs of this process (every rank builds its runs in the same order): a store key per run,
#: so an announcement of one run is never read by the next in the same process group.
_RUNS = itertools.count()


def resolve_device(spec: str, local_rank: int = 0) -> torch.device:
    """The device of ``spec``: ``"auto"`` is ``cuda:LOCAL_RANK`` when CUDA is available, else
    ``cpu``; ``"cuda"`` is ``cuda:LOCAL_RANK``; ``"cpu"`` and ``"cuda:N"`` are themselves."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cuda":
        spec = f"cuda:{local_rank}"
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise ParameterError(f"device: expected auto, cpu, cuda or cuda:N, got {spec!r}", argument="device") from None
    if device.type not in ("cpu", "cuda"):
        raise ParameterError(f"device: expected auto, cpu, cuda or cuda:N, got {spec!r}", argument="device")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ParameterError(
            f"device: expected a device this machine has, got {spec!r} without CUDA", argument="device"
        )
    return device


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[lo, hi)`` of rank ``rank``'s contiguous share of ``n`` items (the first ``n % W``
    ranks hold one more, as ``numpy.array_split``)."""
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


class Dist:
    """This process's place in the run: ``rank``, ``world_size`` and ``device``, and the
    collectives the trainer uses (all the identity when ``world_size == 1``).

    Build it with :meth:`setup`; :attr:`owns_group` says whether it initialised the
    process group (then :meth:`close` destroys it)."""

    def __init__(self, rank: int, world_size: int, device: torch.device, *, owns_group: bool = False) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.owns_group = owns_group
        #: the store key under which a failing rank announces its error (:meth:`stop_all`)
        self.failure_key = f"comppo_core/failure/{next(_RUNS)}" if world_size > 1 else ""

    @classmethod
    def setup(cls, device: str = "auto") -> Dist:
        """Join ``torch.distributed`` when the environment describes more than one process
        (``WORLD_SIZE > 1``, as ``torchrun`` sets it) or a group is already initialised;
        otherwise a one-process :class:`Dist`. The backend is NCCL for CUDA, gloo for CPU."""
        import torch.distributed as td

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if td.is_available() and td.is_initialized():
            dev = resolve_device(device, local_rank)
            if dev.type == "cuda":
                torch.cuda.set_device(dev)
            return cls(td.get_rank(), td.get_world_size(), dev)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        dev = resolve_device(device, local_rank)
        if world <= 1:
            return cls(0, 1, dev)
        if not td.is_available():
            raise ParameterError(
                f"device: WORLD_SIZE={world} asks for torch.distributed, which this torch build lacks",
                argument="device",
            )
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        td.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        return cls(td.get_rank(), td.get_world_size(), dev, owns_group=True)

    @property
    def is_main(self) -> bool:
        """Whether this process writes the outputs (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def close(self) -> None:
        """Destroy the process group if :meth:`setup` created it."""
        if self.owns_group:
            import torch.distributed as td

            if td.is_initialized():
                td.destroy_process_group()
            self.owns_group = False

    # ---- one rank's failure stops every rank (module docstring)

    def stop_all(self, exc: BaseException, *, step: int, kept: str) -> BaseException:
        """The exception to raise when ``exc`` ended this process's run at ``step``
        (``kept``: what is left of the run, :func:`comppo_core.rl.engine.checkpoint.describe_kept`).

        * one process: ``exc``; a :class:`~comppo_core.errors.NonFiniteError` restated with
          the step and ``kept``.
        * :class:`RankFailed` (another rank failed, seen in a collective): the process group
          is broken and the error restated with ``kept``.
        * any other exception, this rank's own failure: announced under :attr:`failure_key`
          (unless a rank announced first), the process group broken, and ``exc`` returned
          (a NonFiniteError restated with the step, this rank and ``kept``; another
          exception with a note saying the same, on Python ≥ 3.11)."""
        where = f"at step {step}"
        if not self.distributed:
            return (
                _restated(exc, f"{exc} {where}; training stopped, {kept}") if isinstance(exc, NonFiniteError) else exc
            )
        if isinstance(exc, RankFailed):
            self.abort()
            return RankFailed(f"{exc}; every rank stopped, {kept}", rank=exc.rank, step=exc.step, error=exc.error)
        self.announce(exc, step)
        self.abort()
        me = f"on rank {self.rank} of {self.world_size}"
        if isinstance(exc, NonFiniteError):
            return _restated(exc, f"{exc} {where} {me}; every rank stopped, {kept}")
        if isinstance(exc, Exception) and hasattr(exc, "add_note"):
            exc.add_note(f"comppo-core: raised {where} {me}; every rank stopped, {kept}")
        return exc

    def _store(self) -> Any:
        """The default process group's store, or None (no group, or a torch without it)."""
        try:
            from torch.distributed import distributed_c10d

            return distributed_c10d._get_default_store()
        except (ImportError, AttributeError, RuntimeError, ValueError):
            return None

    def announce(self, exc: BaseException, step: int) -> None:
        """Record ``exc`` as this rank's failure at ``step`` in the store, unless a rank
        announced one first (``compare_set`` on an absent key). Never raises."""
        store = self._store()
        if store is None:
            return
        value = json.dumps({"rank": self.rank, "step": step, "error": describe_error(exc)})
        with contextlib.suppress(Exception):
            store.compare_set(self.failure_key, "", value)

    def peer_failure(self, wait: float = ANNOUNCE_WAIT_S) -> RankFailed | None:
        """The failure another rank announced, as a :class:`RankFailed` (polling up to
        ``wait`` seconds for it), or None."""
        store = self._store() if self.distributed else None
        if store is None:
            return None
        deadline = time.monotonic() + wait
        try:
            while not store.check([self.failure_key]):
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)
            got = json.loads(store.get(self.failure_key))
        except Exception:  # a store that went away with the failing rank
            return None
        rank, step, error = int(got["rank"]), int(got["step"]), str(got["error"])
        if rank == self.rank:
            return None
        return RankFailed(
            f"rank {rank} of {self.world_size} failed at step {step}: {error}", rank=rank, step=step, error=error
        )

    def abort(self) -> None:
        """Break the process group, whoever created it, so that every rank waiting in a
        collective with this one fails at once (gloo: ``destroy_process_group``; NCCL:
        ``_abort_process_group``, which does not wait for the pending kernels). Never raises."""
        if not self.distributed:
            return
        import torch.distributed as td

        with contextlib.suppress(Exception):
            if td.is_initialized():
                if td.get_backend() == "nccl" and hasattr(td.distributed_c10d, "_abort_process_group"):
                    td.distributed_c10d._abort_process_group()
                else:
                    td.destroy_process_group()
        self.owns_group = False

    @contextlib.contextmanager
    def _collective(self) -> Iterator[None]:
        """Turn the backend's error of a collective into :class:`RankFailed` when another rank
        announced a failure (its process broke the group); else let it stand."""
        try:
            yield
        except RuntimeError as exc:
            failure = self.peer_failure()
            if failure is None:
                raise
            raise failure from exc

    # ---- collectives

    def _wire(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        """``x`` as the backend carries it: on the run's device for NCCL, bool as uint8."""
        dtype = x.dtype
        y = x.to(torch.uint8) if dtype == torch.bool else x
        return y.to(self.device).contiguous(), dtype

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along dim 0 in rank order (the global batch);
        ``x`` itself for one process. Every rank's ``x`` must have the same shape."""
        if not self.distributed:
            return x
        import torch.distributed as td

        y, dtype = self._wire(x)
        shapes = [torch.zeros(y.dim(), dtype=torch.long, device=self.device) for _ in range(self.world_size)]
        with self._collective():
            td.all_gather(shapes, torch.tensor(y.shape, dtype=torch.long, device=self.device))
        if any(not torch.equal(s, shapes[self.rank]) for s in shapes):
            got = [tuple(s.tolist()) for s in shapes]
            raise ParameterError(f"x: expected the same shape on every rank, got {got}", argument="x")
        parts = [torch.empty_like(y) for _ in range(self.world_size)]
        with self._collective():
            td.all_gather(parts, y)
        return torch.cat(parts).to(device=x.device, dtype=dtype)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of every rank's ``x`` (a new tensor; ``x`` for one process)."""
        return self._reduce(x, "sum")

    def max(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise maximum of every rank's ``x``."""
        return self._reduce(x, "max")

    def _reduce(self, x: torch.Tensor, op: str) -> torch.Tensor:
        if not self.distributed:
            return x
        import torch.distributed as td

        y, dtype = self._wire(x.clone())
        with self._collective():
            td.all_reduce(y, op=td.ReduceOp.SUM if op == "sum" else td.ReduceOp.MAX)
        return y.to(device=x.device, dtype=dtype)

    def max_int(self, value: int) -> int:
        """The largest of every rank's ``value``."""
        if not self.distributed:
            return value
        return int(self.max(torch.tensor([value], dtype=torch.long)).item())

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as td

            with self._collective():
                td.barrier()

    def broadcast_module(self, module: nn.Module | None) -> None:
        """Rank 0's parameters and buffers copied into every rank's ``module``."""
        if module is None or not self.distributed:
            return
        import torch.distributed as td

        with torch.no_grad(), self._collective():
            for t in [*module.parameters(), *module.buffers()]:
                y, _ = self._wire(t.data)
                td.broadcast(y, src=0)
                t.data.copy_(y.to(device=t.device, dtype=t.dtype))

    def all_reduce_gradients(self, params: Sequence[nn.Parameter], *, nonfinite: bool = False) -> int | None:
        """SUM-all-reduce the gradients of ``params`` in place, in buckets of
        :data:`BUCKET_BYTES`; returns the highest rank that reported ``nonfinite`` (None
        when none did): every rank learns it from the same all-reduce, so all stop together.

        A parameter with a gradient on some rank but not on this one (the rank held no row
        of the minibatch) gets a zero gradient first; one without a gradient on any rank
        keeps ``grad = None``, as in one process. A parameter FSDP2 shards (a DTensor) was
        reduced in the backward as the mean over ranks: its gradient is scaled by W to the
        sum instead (module docstring). One process: only returns 0 or None."""
        if not self.distributed:
            return 0 if nonfinite else None
        import torch.distributed as td

        first = float(self.rank + 1) if nonfinite else 0.0  # rank + 1: the MAX names a rank
        flags = torch.tensor([first] + [float(p.grad is not None) for p in params], device=self.device)
        with self._collective():
            td.all_reduce(flags, op=td.ReduceOp.MAX)
            present = flags[1:].bool().tolist()
            grads: list[torch.Tensor] = []
            for p, has in zip(params, present):
                if not has:
                    continue
                if is_sharded(p):
                    if p.grad is not None:
                        p.grad.mul_(self.world_size)
                    continue
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
            for bucket in _buckets(grads, BUCKET_BYTES):
                flat = torch.cat([g.reshape(-1) for g in bucket]).to(self.device)
                td.all_reduce(flat, op=td.ReduceOp.SUM)
                offset = 0
                for g in bucket:
                    n = g.numel()
                    g.copy_(flat[offset : offset + n].view_as(g))
                    offset += n
        return None if flags[0] == 0 else int(flags[0].item()) - 1


def is_sharded(p: torch.Tensor) -> bool:
    """Whether ``p`` is a DTensor (a parameter :func:`shard_model` sharded)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - a torch without DTensor
        return False
    return isinstance(p, DTensor)


def shard_model(module: nn.Module) -> nn.Module:
    """FSDP2 over the default process group: ``fully_shard`` each decoder layer (the classes
    its transformers models name in ``_no_split_modules``), then ``module`` itself; in place.
    Every process must hold the same weights before (they are broadcast first)."""
    from torch.distributed.fsdp import fully_shard

    layers: set[str] = set()
    for m in module.modules():
        layers.update(getattr(m, "_no_split_modules", None) or ())
    if not layers:
        raise ParameterError(
            f"fsdp: expected a transformers model that names its decoder layers (_no_split_modules), got "
            f"{type(module).__name__}",
            argument="fsdp",
        )
    for m in list(module.modules()):
        if m is not module and type(m).__name__ in layers:
            fully_shard(m)
    fully_shard(module)
    return module


def describe_error(exc: BaseException, limit: int = 2000) -> str:
    """``"ValueError: message"``, at most ``limit`` characters (an announcement's ``error``)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _restated(exc: NonFiniteError, message: str) -> NonFiniteError:
    """``exc`` with ``message``, its attributes kept (raised ``from exc``)."""
    return NonFiniteError(message, argument=exc.argument, row=exc.row, position=exc.position, index=exc.index)


def _buckets(tensors: Iterable[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Consecutive groups of tensors of one dtype and device, each at most ``limit`` bytes
    (a larger tensor is a bucket of its own)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        last = out[-1] if out else None
        if last is None or size + nbytes > limit or last[0].dtype != t.dtype or last[0].device != t.device:
            out.append([t])
            size = nbytes
        else:
            last.append(t)
            size += nbytes
    return out
