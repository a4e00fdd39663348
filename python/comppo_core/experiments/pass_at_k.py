"""pass@k by the unbiased estimator of Chen et al. (2021), exactly; torch-free: the public
name of :mod:`comppo_core.rl.engine.pass_at_k`, where it is defined.

It is defined in ``rl`` because the held-out evaluation (:mod:`comppo_core.rl.engine.evaluation`,
which ``comppo-core evaluate --samples`` runs) computes it, and ``rl`` imports nothing of
``experiments`` (the layers of docs/architecture.md, enforced by ``lint-imports``).
"""

from __future__ import annotations

from ..rl.engine.pass_at_k import PASS_REWARD, macro, pass_at_k, pass_at_k_exact, pass_ks, passed, task_summary

__all__ = ["PASS_REWARD", "macro", "pass_at_k", "pass_at_k_exact", "pass_ks", "passed", "task_summary"]
