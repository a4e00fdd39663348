"""A run's tokenizer, as the trainer uses it and as it is saved beside a model: the layer below
:mod:`comppo_core.rl.models.gguf` and :mod:`comppo_core.rl.models.pretrained`, which both
read and write tokenizers through it (and :mod:`~comppo_core.rl.models.pretrained`
re-exports every name here).

* :class:`HFTokenizer` wraps a transformers tokenizer in the interface the trainer uses for
  the built-in :class:`~comppo_core.rl.tasks.addition.CharTokenizer` (``pad_token_id``,
  ``bos_token_id``, ``eos_token_id``, ``vocab_size``, ``encode_prompt``, ``decode``;
  :mod:`comppo_core.rl.models.pretrained` says how prompts are encoded);
* :func:`save_tokenizer` writes a run's tokenizer into a model directory, atomically;
* :data:`TOKENIZER_FILES`: what a directory holds when it holds a tokenizer;
* :func:`quiet_transformers`: transformers' progress bars off while a model is saved or loaded.

Imports no torch; transformers only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ...errors import ParameterError

__all__ = ["TOKENIZER_FILES", "HFTokenizer", "quiet_transformers", "save_tokenizer"]

#: Files one of which a directory must hold for ``AutoTokenizer`` to load from it offline.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


class HFTokenizer:
    """A transformers tokenizer in the trainer's tokenizer interface (module docstring)."""

    def __init__(self, tokenizer: Any, *, chat_template: bool = False, where: str = "model") -> None:
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        if not isinstance(eos, int):
            raise ParameterError(
                f"model: expected a tokenizer with an EOS token (responses end at it) in {where!r}, got eos_token_id={eos!r}",
                argument="model",
            )
        self.eos_token_id: int = eos
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = pad if isinstance(pad, int) else eos
        self.bos_token_id: int | None = tokenizer.bos_token_id
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise ParameterError(
                f"chat_template: the tokenizer in {where!r} has no chat template; encode the prompts as plain "
                "text (chat_template=False) or give the tokenizer one",
                argument="chat_template",
            )
        self.chat_template = bool(chat_template)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def encode_prompt(self, text: str) -> list[int]:
        """The ids of a prompt (module docstring)."""
        if self.chat_template:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """The ids of ``text`` without the tokenizer's special tokens, optionally after BOS
        (when it has one) and before EOS."""
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids + [self.eos_token_id] if add_eos else ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "hf",
            "name_or_path": str(getattr(self.tokenizer, "name_or_path", "")),
            "chat_template": self.chat_template,
        }


def save_tokenizer(tokenizer: Any, directory: str | Path) -> Path:
    """Write ``tokenizer`` into ``directory`` (created if missing) so that
    :func:`load_tokenizer` reads it back; returns the directory.

    ``tokenizer``: a :class:`~comppo_core.rl.tasks.addition.CharTokenizer` (saved as
    :meth:`~comppo_core.rl.tasks.addition.CharTokenizer.to_hf`), an :class:`HFTokenizer` (its
    wrapped tokenizer) or a ``transformers`` tokenizer. Call it beside the model's
    ``save_pretrained``, so the directory is a ``model=DIR`` of its own.

    The files are written to a temporary directory beside ``directory`` (same file
    system), then each moved into place with ``os.replace``, ``tokenizer.json`` last: a
    crash leaves no half-written file, and a directory with only part of the files
    fails to load with an error naming it rather than loading another tokenizer.
    Files of the same names are replaced; other files are left as they are."""
    from ..tasks.addition import CharTokenizer

    if isinstance(tokenizer, CharTokenizer):
        hf = tokenizer.to_hf()
    elif isinstance(tokenizer, HFTokenizer):
        hf = tokenizer.tokenizer
    elif callable(getattr(tokenizer, "save_pretrained", None)):
        hf = tokenizer
    else:
        raise ParameterError(
            f"tokenizer: expected a CharTokenizer, an HFTokenizer or a transformers tokenizer, got "
            f"{type(tokenizer).__name__}",
            argument="tokenizer",
        )
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tokenizer-", dir=target.parent))
    try:
        hf.save_pretrained(str(staging))
        for item in sorted(staging.iterdir(), key=lambda f: (f.name == "tokenizer.json", f.name)):
            os.replace(item, target / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' own progress bars ("Writing model shards", "Loading weights") off while
    saving and loading checkpoints, then back as they were."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
