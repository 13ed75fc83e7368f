"""The bundled SmolLM2's tokenizer conversion is checked before it is cached."""

from __future__ import annotations

import copy

import pytest

from agentrl.errors import TrainingError
from agentrl.llm.loading import _check_converted


def test_a_correct_conversion_passes(smol_tokenizer) -> None:
    assert _check_converted(smol_tokenizer) is smol_tokenizer


def test_a_wrong_eos_is_refused_by_name(smol_tokenizer) -> None:
    """transformers 5.17 converts the GGUF with <|im_start|> as EOS (seen on a GPU host)."""
    broken = copy.deepcopy(smol_tokenizer)
    broken.eos_token = "<|im_start|>"
    with pytest.raises(TrainingError, match=r"converted the SmolLM2 GGUF tokenizer wrongly"):
        _check_converted(broken)
