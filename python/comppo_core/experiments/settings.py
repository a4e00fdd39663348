"""The settings of an experiment (``comppo-core compare``), typed: :class:`CompareSettings`.

An experiment runs every arm of :attr:`~CompareSettings.arms` on every reporting seed
``0 … n−1`` from paired warm starts, each run with the settings of
:attr:`~CompareSettings.base` (a :class:`~comppo_core.rl.TrainConfig`; its ``out`` is the
experiment's directory, its ``arm``, ``seed``, ``resume`` and ``eval_split`` are set per
run). With a :attr:`~CompareSettings.grid` every arm's setting is first chosen on the
tuning seeds, evaluated on the validation split (:mod:`comppo_core.experiments.tuning`).

:meth:`CompareSettings.resolved` applies the protocol's defaults (3 reporting seeds, or
:data:`~comppo_core.experiments.tuning.DEFAULT_REPORTING_SEEDS` with a grid;
:data:`~comppo_core.experiments.tuning.DEFAULT_TUNING_SEEDS` tuning seeds;
``validation_fraction`` :data:`~comppo_core.experiments.tuning.DEFAULT_VALIDATION_FRACTION`
with a grid unless given) and checks every setting, raising a
:class:`~comppo_core.errors.ParameterError` whose ``argument`` names it (``"arms"``,
``"seeds"``, ``"tuning_seeds"``, ``"jobs"``, ``"grid"``, ``"validation_fraction"``,
``"eval_every"``, ``"out"``, ``"engine"``, ``"launcher"``, ``"trl_config"``, or a TrainConfig
field); the message starts with that name.
Messages name the other settings as ``compare``'s flags do (``--out``, ``--resume``).

Imports no torch and no argparse.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import ParameterError
from ..options import ARM_NAMES
from ..rl.config import TrainConfig
from ..rl.core.arms import ARMS
from .grid import Grid
from .tuning import (
    DEFAULT_REPORTING_SEEDS,
    DEFAULT_TUNING_SEEDS,
    DEFAULT_VALIDATION_FRACTION,
    FIRST_TUNING_SEED,
    tuning_seeds,
)

__all__ = ["DEFAULT_ARMS", "DEFAULT_SEEDS", "OWN_FIELDS", "CompareSettings", "parse_arms"]

#: The arms an experiment runs by default: every arm but the diagnostics (``comppo_oracle``
#: needs a task that marks its pivotal tokens) and the baselines of other gate sources
#: (``comppo_policy_entropy``, ``comppo_token_nll``: ``--arms`` names them).
DEFAULT_ARMS: tuple[str, ...] = tuple(name for name in ARM_NAMES if ARMS[name].in_default_compare)

#: Reporting seeds without a grid when none are given.
DEFAULT_SEEDS = 3

#: The TrainConfig fields an experiment sets itself per run, and the setting to use instead
#: (``compare`` neither offers nor accepts their flags).
OWN_FIELDS: dict[str, str] = {
    "arm": "the arms are --arms",
    "seed": "the seeds are 0 … --seeds − 1",
    "eval_split": "compare evaluates its reported runs on the held-out split and --grid's tuning runs on the "
    "validation split",
}


def parse_arms(text: str) -> tuple[str, ...]:
    """The arms of a comma-separated list (``"grpo,comppo"``): each an arm of
    :data:`~comppo_core.options.ARM_NAMES`, once; else a ParameterError naming ``arms``."""
    arms = [a.strip() for a in text.split(",") if a.strip()]
    if not arms:
        raise ParameterError(
            f"arms: expected a comma-separated list of arms among {', '.join(ARM_NAMES)}, got {text!r}",
            argument="arms",
        )
    _check_arms(arms)
    return tuple(arms)


def _check_arms(arms: tuple[str, ...] | list[str]) -> None:
    if not arms:
        raise ParameterError(f"arms: expected at least one arm among {', '.join(ARM_NAMES)}, got none", argument="arms")
    for i, a in enumerate(arms):
        if a not in ARM_NAMES:
            raise ParameterError(f"arms: expected arms among {', '.join(ARM_NAMES)}, got {a!r}", argument="arms")
        if a in arms[:i]:
            raise ParameterError(f"arms: expected each arm once, got {a!r} twice", argument="arms")


def _count(name: str, n: int, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ParameterError(f"{name}: expected a number of {what} >= 1, got {n!r}", argument=name)


@dataclasses.dataclass(frozen=True)
class CompareSettings:
    """What an experiment runs (module docstring). Only ``base`` is required, and its
    ``out`` (the experiment's directory).

    Attributes:
      base: the settings every run shares; ``base.out`` is the experiment's directory.
      arms: the arms compared, in the order the tables list them.
      seeds: the number of reporting seeds ``0 … seeds−1``; None: :data:`DEFAULT_SEEDS`,
        or :data:`~comppo_core.experiments.tuning.DEFAULT_REPORTING_SEEDS` with a grid.
      grid: tune each arm over this grid first (:mod:`comppo_core.experiments.grid`).
      tuning_seeds: with a grid, the number of tuning seeds ``1000 …``; None: the default.
      validation_fraction: the validation split's share, given explicitly; None: the
        base's, or :data:`~comppo_core.experiments.tuning.DEFAULT_VALIDATION_FRACTION`
        with a grid.
      jobs: runs at once, each in a worker process of its own (1: one after another, here).
      warm_starts: another experiment's directory whose warm starts are copied where they
        were made with the same warm-start settings (read only).
      resume: continue the experiment in ``base.out`` (the same settings).
      overwrite: delete the experiment's own files in ``base.out`` and start again.
      preset: the name of the preset ``base`` came from, for ``results.md``.
      engine: ``"package"`` (:class:`~comppo_core.rl.Trainer`, in this process or ``jobs``
        workers) or ``"trl"`` (each run a :class:`~comppo_core.integrations.trl.CompPOTrainer`
        run in a process of its own: :mod:`comppo_core.experiments.trl_engine`).
      launcher: with ``engine="trl"``, the command each run is started under
        (``"accelerate launch --config_file F"``); None: ``python`` itself.
      trl_config: with ``engine="trl"``, a YAML/JSON file of the GRPOConfig/CompPOConfig
        fields compare does not set.
    """

    base: TrainConfig
    arms: tuple[str, ...] = DEFAULT_ARMS
    seeds: int | None = None
    grid: Grid | None = None
    tuning_seeds: int | None = None
    validation_fraction: float | None = None
    jobs: int = 1
    warm_starts: Path | None = None
    resume: bool = False
    overwrite: bool = False
    preset: str = "default"
    engine: str = "package"
    launcher: str | None = None
    trl_config: Path | None = None

    @property
    def out(self) -> Path:
        """The experiment's directory (``base.out``)."""
        if self.base.out is None:
            raise ParameterError("out: expected the output directory DIR, got none", argument="out")
        return Path(self.base.out)

    @property
    def n_seeds(self) -> int:
        """The number of reporting seeds (the default resolved)."""
        if self.seeds is not None:
            return self.seeds
        return DEFAULT_REPORTING_SEEDS if self.grid is not None else DEFAULT_SEEDS

    @property
    def tuning_seed_list(self) -> list[int]:
        """The tuning seeds ``1000, 1001, …`` (none without a grid)."""
        if self.grid is None:
            return []
        return tuning_seeds(DEFAULT_TUNING_SEEDS if self.tuning_seeds is None else self.tuning_seeds)

    def resolved(self) -> CompareSettings:
        """These settings checked (module docstring), with ``base`` set for the
        experiment: its first arm, seed 0, not resumed, the validation split resolved.
        A ParameterError naming the first setting at fault otherwise."""
        _check_arms(self.arms)
        if self.grid is None and self.tuning_seeds is not None:
            raise ParameterError(
                "tuning_seeds: only with --grid (the seeds a grid's settings are chosen on)", argument="tuning_seeds"
            )
        if self.seeds is not None:
            _count("seeds", self.seeds, "seeds")
        _count("jobs", self.jobs, "processes")
        if self.tuning_seeds is not None:
            _count("tuning_seeds", self.tuning_seeds, "tuning seeds")
        if self.grid is not None and self.n_seeds > FIRST_TUNING_SEED:
            raise ParameterError(
                f"seeds: expected at most {FIRST_TUNING_SEED} with --grid (disjoint from the tuning seeds), got "
                f"{self.n_seeds}",
                argument="seeds",
            )
        _ = self.out  # a ParameterError naming out when there is none
        self._check_engine()
        fixed: dict[str, object] = {"arm": self.arms[0], "seed": 0, "resume": False}
        if self.validation_fraction is not None:
            fixed["validation_fraction"] = self.validation_fraction
        elif self.grid is not None:
            fixed["validation_fraction"] = DEFAULT_VALIDATION_FRACTION
        base = self.base.replace(**fixed)
        if base.eval_every == 0:
            raise ParameterError(
                "eval_every: expected >= 1 (compare reports the held-out accuracy), got 0", argument="eval_every"
            )
        if self.grid is not None and not base.validation_fraction:
            raise ParameterError(
                "validation_fraction: expected > 0 with --grid (the settings are chosen on the validation split), "
                "got 0",
                argument="validation_fraction",
            )
        if self.engine == "trl":
            from .trl_engine import check_config

            for arm in self.arms:
                check_config(base.replace(arm=arm))
        return dataclasses.replace(self, base=base, arms=tuple(self.arms))

    def _check_engine(self) -> None:
        """The engine and its settings (a ParameterError naming the first at fault)."""
        from .trl_engine import ENGINES, parse_launcher

        if self.engine not in ENGINES:
            raise ParameterError(
                f"engine: expected one of {', '.join(ENGINES)}, got {self.engine!r}", argument="engine"
            )
        if self.engine == "package":
            for name in ("launcher", "trl_config"):
                if getattr(self, name) is not None:
                    raise ParameterError(f"{name}: only with --engine trl", argument=name)
            return
        if self.jobs != 1:
            raise ParameterError(
                "jobs: expected 1 with --engine trl (each run is a process of its own, or a launcher's processes; "
                "runs go one after another)",
                argument="jobs",
            )
        if self.warm_starts is not None:
            raise ParameterError(
                "warm_starts: not with --engine trl (every run starts from --model DIR)", argument="warm_starts"
            )
        parse_launcher(self.launcher)
        if self.trl_config is not None and not self.trl_config.is_file():
            raise ParameterError(
                f"trl_config: expected a YAML or JSON file, got {str(self.trl_config)!r}", argument="trl_config"
            )
