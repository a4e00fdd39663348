"""A local Hugging Face model and its tokenizer as the trainer's policy (``config.model``).

``load_policy(path)`` reads ``AutoModelForCausalLM`` (float32) from a local directory, or
from a GGUF file (:mod:`comppo_core.rl.models.gguf`: transformers' GGUF loader, rebuilt as a
plain model that saves with ``save_pretrained``), and :class:`HFTokenizer` wraps the
``AutoTokenizer`` saved beside it (a GGUF file's own) in the interface the
trainer uses for the built-in :class:`~comppo_core.rl.tasks.addition.CharTokenizer`:
``pad_token_id``, ``bos_token_id``, ``eos_token_id``, ``vocab_size``, ``encode_prompt``,
``decode``. Nothing is downloaded: a path that is neither a directory nor a GGUF file, a
directory without a tokenizer, or a tokenizer without an EOS token is a
:class:`~comppo_core.errors.ParameterError` naming ``model`` and the path.

Float32 whatever the run's ``dtype``: ``dtype="bfloat16"`` keeps float32 master weights (the
ones the optimiser steps) and runs the forwards under bfloat16 autocast.

Prompts are encoded with the tokenizer's own special tokens (``add_special_tokens=True``:
Llama's BOS, nothing for Qwen); with ``chat_template=True`` and a tokenizer that has a
chat template, the prompt is one user turn with the generation prompt appended
(``apply_chat_template(..., add_generation_prompt=True)``), encoded without adding
special tokens again (``chat_template=True`` with a tokenizer that has none is a
ParameterError naming ``chat_template``). A tokenizer without a pad token pads with EOS (the attention mask
marks the real tokens, and a response ends at its first EOS).

``save_tokenizer(tokenizer, directory)`` writes the run's tokenizer beside a saved model so
the directory is a ``model=DIR`` again: the built-in
:class:`~comppo_core.rl.tasks.addition.CharTokenizer` through
:meth:`~comppo_core.rl.tasks.addition.CharTokenizer.to_hf`, an :class:`HFTokenizer` through its
tokenizer's ``save_pretrained``. :func:`check_model_path` (also spelled
``check_model_directory``) makes the checks of :func:`load_tokenizer` that need no torch or
transformers (a command makes them first).

:class:`HFTokenizer`, :func:`save_tokenizer`, :data:`TOKENIZER_FILES` and
:func:`quiet_transformers` are defined in :mod:`comppo_core.rl.models.tokenizer` (below both this
module and :mod:`~comppo_core.rl.models.gguf`, which saves a GGUF file's tokenizer) and
re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import ParameterError
from .gguf import check_gguf_file, is_gguf_file, load_gguf_model, load_gguf_tokenizer
from .tokenizer import TOKENIZER_FILES, HFTokenizer, quiet_transformers, save_tokenizer

__all__ = [
    "TOKENIZER_FILES",
    "HFTokenizer",
    "check_model_directory",
    "check_model_path",
    "is_gguf_file",
    "load_policy",
    "load_tokenizer",
    "save_tokenizer",
]


def _directory(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise ParameterError(
            f"model: expected a local Hugging Face model directory, got {str(path)!r}, which does not exist (a "
            "model is a directory or a GGUF file)",
            argument="model",
        )
    return p


def check_model_path(path: str | Path) -> Path:
    """``path`` as a :class:`~pathlib.Path` if it is a GGUF file
    (:func:`~comppo_core.rl.models.gguf.check_gguf_file`: the magic bytes) or a directory
    holding one of the :data:`TOKENIZER_FILES`; else a
    :class:`~comppo_core.errors.ParameterError` naming ``model``. Imports nothing (no torch,
    no transformers). A training run's directory (``OUT`` of ``comppo-core train``) is
    refused with the model directories it holds: ``OUT/checkpoint/actor`` (its last
    checkpoint) and ``OUT/warmstart`` (where it started)."""
    if is_gguf_file(path):
        return check_gguf_file(path)
    p = _directory(path)
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        run = _run_models(p)
        if run is not None:
            raise ParameterError(
                f"model: expected a model directory, got {str(p)!r}, a training run's directory; its policy is {run}",
                argument="model",
            )
        raise ParameterError(
            f"model: expected a tokenizer in the model directory {str(p)!r} (one of {', '.join(TOKENIZER_FILES)}), "
            "found none; save it there with tokenizer.save_pretrained (the built-in character tokenizer: "
            "comppo_core.rl.models.pretrained.save_tokenizer)",
            argument="model",
        )
    return p


def _run_models(p: Path) -> str | None:
    """The model directories a training run's directory ``p`` holds, in words (None when
    ``p`` holds no run: no ``metrics.jsonl``, ``inputs.json`` or ``checkpoint``)."""
    if not any((p / name).exists() for name in ("metrics.jsonl", "inputs.json", "checkpoint")):
        return None
    found = [
        f"{str(p / sub)!r} ({what})"
        for sub, what in (("checkpoint/actor", "its last checkpoint"), ("warmstart", "where it started"))
        if (p / sub).is_dir()
    ]
    return " or ".join(found) if found else "in none of its files yet (no checkpoint/actor or warmstart)"


#: The former name of :func:`check_model_path` (it accepts a GGUF file too).
check_model_directory = check_model_path


def load_tokenizer(path: str | Path, *, chat_template: bool = False) -> HFTokenizer:
    """The tokenizer saved in the model directory ``path``, or the GGUF file ``path``'s own
    (with its chat template), wrapped (module docstring)."""
    p = check_model_path(path)
    if p.is_file():
        tok = load_gguf_tokenizer(p)
        tok.name_or_path = str(p)
        return HFTokenizer(tok, chat_template=chat_template, where=str(p))
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... by model type
        raise ParameterError(f"model: could not load the tokenizer in {str(p)!r}: {exc}", argument="model") from exc
    return HFTokenizer(tok, chat_template=chat_template, where=str(p))


def load_policy(path: str | Path, *, argument: str = "model") -> Any:
    """``AutoModelForCausalLM`` from the local directory ``path``, or the plain model of the
    GGUF file ``path`` (:func:`~comppo_core.rl.models.gguf.load_gguf_model`), float32 (the
    master weights of ``dtype="bfloat16"`` too: module docstring), in eval mode.

    The model's saved ``generation_config`` is replaced by a blank one: ``generate`` would
    otherwise apply its repetition penalty, banned or suppressed tokens and the like before
    the trainer's sampler, so rollouts would not be drawn from ``softmax(logits / T)``,
    the distribution the PPO ratio scores. ``argument`` names the setting in errors.
    """
    p = Path(path)
    if is_gguf_file(p):
        check_gguf_file(p, argument=argument)  # a missing file, or not GGUF: said before torch is imported
        from transformers import GenerationConfig

        model = load_gguf_model(p, argument=argument)
        model.generation_config = GenerationConfig()
        return model.eval()
    if not p.is_dir():
        what = "a local Hugging Face model directory" if argument == "model" else "a save_pretrained directory"
        raise ParameterError(f"{argument}: expected {what} or a GGUF file, got {str(path)!r}", argument=argument)
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32, local_files_only=True)
    except Exception as exc:  # OSError for missing weights, ValueError for an unknown architecture, ...
        raise ParameterError(
            f"{argument}: could not load a causal LM from {str(p)!r}: {exc}", argument=argument
        ) from exc
    model.generation_config = GenerationConfig()
    return model.eval()
