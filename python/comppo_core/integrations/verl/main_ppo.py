"""``python -m comppo_core.integrations.verl.main_ppo <hydra overrides>``: verl's ``main_ppo`` running the recipe.

The same command line as ``python -m verl.trainer.main_ppo`` (every verl override works), with
the recipe's config (``conf/comppo_trainer.yaml``: verl's ``ppo_trainer`` plus the ``comppo`` block,
``trainer.v1.trainer_mode=comppo`` and ``algorithm.adv_estimator=comppo``, "the arm decides")::

    python -m comppo_core.integrations.verl.main_ppo comppo.arm=comppo comppo.tac.width=256 \\
        data.train_files=... actor_rollout_ref.model.path=... actor_rollout_ref.rollout.name=vllm ...

What it does before verl's ``main``:

1. :func:`comppo_core.integrations.verl.plugin.register` in this process (a missing dependency
   is an error now, before Ray starts);
2. ``VERL_USE_EXTERNAL_MODULES`` gains :data:`PLUGIN_MODULE`,
   here and in the Ray runtime environment's ``env_vars``, so every verl process (the TaskRunner,
   the workers) registers the engine and the trainer when it imports verl, with or without the
   ``verl.plugins`` entry point installed;
3. :func:`~comppo_core.integrations.verl.config.prepare_verl_config`: the ``comppo`` block
   validated and the verl settings its arm implies applied (a contradiction is an error naming
   the key);
4. a GGUF model (:data:`MODEL_PATH_KEYS` naming a ``.gguf`` file) converted once, in this
   process, into ``${trainer.default_local_dir}/model_from_gguf`` (a save_pretrained
   directory with its tokenizer: :func:`comppo_core.rl.models.gguf.gguf_as_directory`, reused
   when it holds the same file) and those keys pointed at it, since verl's workers load
   ``from_pretrained`` themselves. On several nodes that directory must be on a file system
   every node reads.

Then ``verl.trainer.main_ppo.main(config)`` (Hydra's pass-through of a composed config).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["CONFIG_DIR", "CONFIG_NAME", "MODEL_PATH_KEYS", "PLUGIN_MODULE", "main", "prepare", "run"]

#: the recipe's Hydra config, next to this module
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
CONFIG_NAME = "comppo_trainer"
_ENV = "VERL_USE_EXTERNAL_MODULES"
#: the plugin's module (importing it registers the engine and the trainer: not imported here)
#: (spelled out: run as ``python -m``, this module's ``__name__`` is ``"__main__"``)
PLUGIN_MODULE = "comppo_core.integrations.verl.plugin"
#: the verl keys that name a local model (step 4 of the module docstring)
MODEL_PATH_KEYS = (
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path",
    "critic.model.path",
    "critic.model.tokenizer_path",
)


def _with_plugin(value: str | None) -> str:
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    return ",".join(names if PLUGIN_MODULE in names else [*names, PLUGIN_MODULE])


def gguf_paths(select: Any, update: Any, local_dir: str) -> dict[str, str]:
    """Step 4 of the module docstring through ``select(key)`` and ``update(key, value)``
    (OmegaConf's, on the composed config): each :data:`MODEL_PATH_KEYS` value that is a GGUF
    file converted into ``local_dir/model_from_gguf`` and replaced by that directory; returns
    ``{key: directory}`` of the keys replaced."""
    from ...rl.models.gguf import gguf_as_directory, is_gguf_file

    replaced: dict[str, str] = {}
    for key in MODEL_PATH_KEYS:
        value = select(key)
        if isinstance(value, str) and value and is_gguf_file(os.path.expanduser(value)):
            directory = gguf_as_directory(
                os.path.expanduser(value), os.path.join(os.path.expanduser(local_dir), "model_from_gguf"), argument=key
            )
            update(key, str(directory))
            replaced[key] = str(directory)
    return replaced


def prepare(config: Any) -> Any:
    """The composed config made ready for verl's ``main`` (steps 2 to 4 of the module docstring); returns
    the :class:`~comppo_core.integrations.verl.config.CompPOConfig`. Sets ``VERL_USE_EXTERNAL_MODULES``
    in this process's environment."""
    from omegaconf import OmegaConf, open_dict  # type: ignore[import-not-found, unused-ignore]

    from .config import prepare_verl_config

    comppo = prepare_verl_config(config)
    os.environ[_ENV] = _with_plugin(os.environ.get(_ENV))
    key = f"ray_kwargs.ray_init.runtime_env.env_vars.{_ENV}"
    with open_dict(config):
        OmegaConf.update(config, key, _with_plugin(OmegaConf.select(config, key)), force_add=True)
        gguf_paths(
            lambda k: OmegaConf.select(config, k),
            lambda k, v: OmegaConf.update(config, k, v, force_add=True),
            str(OmegaConf.select(config, "trainer.default_local_dir") or "."),
        )
    return comppo


def run(config: Any) -> None:
    """The Hydra task: :func:`prepare`, then verl's ``main_ppo.main``."""
    from .plugin import register

    register()
    prepare(config)
    from verl.trainer import main_ppo as verl_main_ppo  # type: ignore[import-not-found]

    verl_main_ppo.main(config)


def main() -> None:
    """The command line (module docstring)."""
    import hydra  # type: ignore[import-not-found, unused-ignore]

    hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base=None)(run)()


if __name__ == "__main__":
    main()
