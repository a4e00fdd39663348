"""A run's paths, checked before anything heavy is imported or loaded: :func:`check_paths`.

``comppo-core train`` checks one run's, an experiment (:mod:`comppo_core.experiments.protocol`)
the shared settings of all its runs, so that a bad path is refused at once, naming its
setting, before torch is imported or anything is written.

Imports no torch.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ..errors import ParameterError
from ..rl.config import TrainConfig
from ..rl.runs import run_dir

__all__ = ["check_paths"]


def check_paths(config: TrainConfig, *, overwrite: bool) -> None:
    """The run's paths, checked before anything is imported or loaded: ``out`` (not a file;
    a run there only with resume or overwrite), ``model`` and ``init_from`` (directories;
    ``model`` with a tokenizer, and a chat template for ``chat_template``), ``task`` (a
    file); ``report_to``'s package installed. A ParameterError naming the setting otherwise."""
    from ..rl.models.pretrained import TOKENIZER_FILES

    if config.out is not None:
        run_dir.check_out(config.out, resume=config.resume, overwrite=overwrite)
    for name in ("model", "init_from"):
        path = getattr(config, name)
        if path is not None and not Path(path).is_dir():
            raise ParameterError(f"{name}: expected a local model directory, got {path!r}", argument=name)
    if config.model is not None:
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
    if config.task.endswith(".jsonl") and not Path(config.task).is_file():
        raise ParameterError(f"task: expected a JSONL file, got {config.task!r}, which is not a file", argument="task")


def _has_chat_template(model: Path) -> bool:
    """Whether the tokenizer files in ``model`` carry a chat template (transformers keeps it
    in tokenizer_config.json or in chat_template.jinja / chat_template.json)."""
    if (model / "chat_template.jinja").is_file() or (model / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((model / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False
