"""The bundled SmolLM2's tokenizer conversion is checked before it is cached."""

from __future__ import annotations

import copy

import pytest

from agentrl.core.errors import TrainingError
from agentrl.llm.loading import _check_converted


def test_a_correct_conversion_passes(smol_tokenizer) -> None:
    assert _check_converted(smol_tokenizer) is smol_tokenizer


def test_a_wrong_eos_is_refused_by_name(smol_tokenizer) -> None:
    """transformers 5.17 converts the GGUF with <|im_start|> as EOS (seen on a GPU host)."""
    broken = copy.deepcopy(smol_tokenizer)
    broken.eos_token = "<|im_start|>"
    with pytest.raises(TrainingError, match=r"converted the SmolLM2 GGUF tokenizer wrongly"):
        _check_converted(broken)


def test_a_loops_jobs_load_the_base_its_gateway_converted(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """`agentrl loop` hands its jobs the folder its own process converts SmolLM2 into (a
    fresh clone's first job converted a second copy into the loop's data dir: 28 s); a
    process with `AGENTRL_MODELS_DIR` looks there. The default is the user cache, the same
    for every data dir (issue 50.8: each new data dir converted again, 6.5 min)."""
    from agentrl.app.loop import LoopConfig, loop_environment
    from agentrl.core.settings import get_settings
    from agentrl.llm.loading import SMOLLM2_DIRNAME, smollm2_dir

    monkeypatch.delenv("AGENTRL_MODELS_DIR", raising=False)
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AGENTRL_DATA_DIR", str(tmp_path / "process"))
    get_settings.cache_clear()
    try:
        env = loop_environment(LoopConfig())
        assert env["AGENTRL_MODELS_DIR"] == str((tmp_path / "cache" / "models").resolve())
        assert "AGENTRL_MODELS_DIR" not in loop_environment(LoopConfig.quick())  # tiny model
        shared = tmp_path / "cache" / "models" / SMOLLM2_DIRNAME
        assert smollm2_dir() == shared and smollm2_dir(tmp_path / "x") == shared
        monkeypatch.setenv("AGENTRL_DATA_DIR", str(tmp_path / "job"))
        monkeypatch.setenv("AGENTRL_MODELS_DIR", str(tmp_path / "elsewhere"))
        get_settings.cache_clear()
        assert smollm2_dir() == tmp_path / "elsewhere" / SMOLLM2_DIRNAME
    finally:
        get_settings.cache_clear()
