"""The experiment machinery (what ``comppo-core compare`` runs), as a library.

* :mod:`~comppo_core.experiments.settings`: :class:`~comppo_core.experiments.settings.CompareSettings`,
  the typed settings of an experiment (arms, seeds, grid, tuning seeds, validation split,
  jobs, warm starts, resume / overwrite, the base TrainConfig whose ``out`` is its directory);
* :mod:`~comppo_core.experiments.protocol`: :func:`~comppo_core.experiments.protocol.run_experiment`
  and :class:`~comppo_core.experiments.protocol.Experiment` (every check, then the tuning →
  choice → reporting sequence, the warm starts, the results), the directory's rules;
* :mod:`~comppo_core.experiments.runs`: the warm starts and runs, one after another or in
  worker processes, made, resumed or reused (:class:`~comppo_core.experiments.runs.Runner`);
* :mod:`~comppo_core.experiments.grid`, :mod:`~comppo_core.experiments.tuning`: the grid's
  syntax and points; the tuning seeds, the objective, the choice and the collapse rule;
* :mod:`~comppo_core.experiments.statistics`, :mod:`~comppo_core.experiments.report`: the
  paired Student-t intervals and the 2×2 interaction; ``results.md``, ``results.json``,
  ``curves.png``;

Errors are the package's (:class:`~comppo_core.errors.ParameterError`, whose ``argument``
names the setting). No module imports torch when imported (runs import it when they
train), nor the command line. This package imports none of its modules: import the one
you use, ``from comppo_core.experiments.protocol import run_experiment``.
"""
