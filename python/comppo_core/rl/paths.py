"""A run's paths, checked before anything is imported or loaded: :func:`check_paths`.

``comppo-core train`` checks its run's settings with it, an experiment the settings its
runs share, so that a bad ``out``, ``model``, ``init_from`` or task file is a
:class:`~comppo_core.errors.ParameterError` naming its setting at once. It reads a
:class:`~comppo_core.rl.config.TrainConfig`, the model files
(:mod:`comppo_core.rl.models.gguf`, :mod:`comppo_core.rl.models.tokenizer`) and the task
registry, and sits above them (and above :mod:`comppo_core.rl.runs.run_dir`, whose
:func:`~comppo_core.rl.runs.run_dir.check_out` is its rule for ``out``). Imports no torch.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ParameterError
from .models.gguf import check_gguf_file, gguf_metadata, is_gguf_file
from .models.tokenizer import TOKENIZER_FILES
from .runs.run_dir import check_out
from .tasks import task_entry

if TYPE_CHECKING:
    from .config import TrainConfig

__all__ = ["check_paths"]


def check_paths(config: TrainConfig, *, overwrite: bool) -> None:
    """The run's paths, checked before anything is imported or loaded: ``out`` (not a file;
    a run there only with resume or overwrite), ``model`` (a directory with a tokenizer, or
    a GGUF file: its magic bytes; either with a chat template for ``chat_template``),
    ``init_from`` (a directory), ``task`` (a file); ``report_to``'s package installed. A
    ParameterError naming the setting otherwise."""
    if config.out is not None:
        check_out(config.out, resume=config.resume, overwrite=overwrite)
    if config.model is not None and is_gguf_file(config.model):
        check_gguf_file(config.model)
        if config.chat_template and not gguf_metadata(config.model, ("tokenizer.chat_template",)):
            raise ParameterError(
                f"chat_template: the GGUF file {config.model!r} has no chat template (tokenizer.chat_template); "
                "drop --chat-template to encode prompts as plain text",
                argument="chat_template",
            )
    elif config.model is not None and not Path(config.model).is_dir():
        raise ParameterError(
            f"model: expected a local model directory or a GGUF file, got {config.model!r}", argument="model"
        )
    if config.init_from is not None and not Path(config.init_from).is_dir():
        raise ParameterError(
            f"init_from: expected a local model directory, got {config.init_from!r}", argument="init_from"
        )
    if config.model is not None and not is_gguf_file(config.model):
        model = Path(config.model)
        if not any((model / f).is_file() for f in TOKENIZER_FILES):
            raise ParameterError(
                f"model: expected a tokenizer in {config.model!r} (one of {', '.join(TOKENIZER_FILES)}), found none",
                argument="model",
            )
        if config.chat_template and not _has_chat_template(model):
            raise ParameterError(
                f"chat_template: the tokenizer in {config.model!r} has no chat template; drop --chat-template to "
                "encode prompts as plain text",
                argument="chat_template",
            )
    package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(config.report_to)
    if package is not None and importlib.util.find_spec(package) is None:
        raise ParameterError(
            f"report_to: {config.report_to!r} needs the {package} package: pip install 'comppo-core[{package}]'",
            argument="report_to",
        )
    suffix = task_entry(config.task).file_suffix
    if suffix is not None and not Path(config.task).is_file():
        raise ParameterError(
            f"task: expected a {suffix.lstrip('.').upper()} file, got {config.task!r}, which is not a file",
            argument="task",
        )


def _has_chat_template(model: Path) -> bool:
    """Whether the tokenizer files in ``model`` carry a chat template (transformers keeps it
    in tokenizer_config.json or in chat_template.jinja / chat_template.json)."""
    if (model / "chat_template.jinja").is_file() or (model / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((model / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False
