"""verl's plugin entry point for the recipe: registers the CompPO engine and the ``comppo`` trainer mode.

Importing this module calls :func:`register`: the engine
(:func:`~comppo_core.integrations.verl.engine.register_engine`, ``model_type="comppo_language_model"``)
and the trainer (:func:`~comppo_core.integrations.verl.trainer.register_trainer`,
``trainer.v1.trainer_mode=comppo``). Both are idempotent. verl 0.9.1 imports the modules named in
``VERL_USE_EXTERNAL_MODULES`` (comma-separated) when ``verl`` is imported, in every process: the
driver, the TaskRunner and each Ray worker. :mod:`~comppo_core.integrations.verl.main_ppo` sets it
(and passes it to Ray's runtime environment); with verl's own ``main_ppo``, set it yourself
(docs/verl.md).

comppo_core does not declare this module as a ``verl.plugins`` entry point, which verl would
import at every ``import verl`` (``VERL_USE_EXTERNAL_PLUGINS=auto``): then every program that
imports verl with comppo_core installed, a user of the GAE drop-in too, would import verl's
trainer stack and, without ``verl[verl-core]``, log the error below. A project that wants it
declares ``[project.entry-points."verl.plugins"] comppo = "comppo_core.integrations.verl.plugin"``.

verl skips an entry point that raises, logging it at debug level only; so a failure here is
logged at ERROR (with what to install) before it propagates. The verl modules are imported inside
:func:`register`, after ``verl/__init__`` has defined what they need.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["PLUGIN_MODULE", "register"]

logger = logging.getLogger(__name__)

#: this module's name: the value for ``VERL_USE_EXTERNAL_MODULES``
PLUGIN_MODULE = __name__


def register() -> tuple[Any, Any]:
    """Registers the CompPO engine and the ``comppo`` trainer in this process (idempotent); returns
    ``(CompPOEngine, CompPOTrainer)``.

    Raises:
      ImportError: verl, or a dependency of verl's v1 trainer (``transfer_queue``, ``fastapi``,
        ``uvicorn``: ``pip install "verl[verl-core]"``), is missing.
    """
    from .engine import register_engine
    from .trainer import register_trainer

    return register_engine(), register_trainer()


def _load() -> None:
    """What importing this module does: :func:`register`, loudly on failure."""
    try:
        register()
    except Exception as exc:
        logger.error(
            "comppo_core's verl plugin (%s) could not register the CompPO engine and the 'comppo' trainer: %s: %s. "
            "The recipe needs verl>=0.9.1,<0.10 with its v1 trainer's dependencies (pip install 'verl[verl-core]').",
            PLUGIN_MODULE,
            type(exc).__name__,
            exc,
        )
        raise


_load()
