"""Models loaded from two threads at once all load whole: transformers builds a model on
the meta device, a switch that is process-wide, so without `llm.loading`'s lock a model
built in the other thread meanwhile kept meta tensors ("Cannot copy out of meta tensor").
A validation loads the candidate and the live model side by side (it rejected every
version of the main job, 2026-11-30)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from agentrl.llm.loading import load_policy, load_smollm2_tokenizer, tiny_causal_lm


def _saved_tiny(path: Path) -> dict[str, torch.Tensor]:
    tokenizer = load_smollm2_tokenizer()
    model = tiny_causal_lm(vocab_size=len(tokenizer), seed=3)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _load_side_by_side(load: Any, path: Path, rounds: int = 3) -> list[Any]:
    results: list[Any] = []

    def one() -> None:
        try:
            results.append(load(str(path)))
        except Exception as exc:  # what a validation got
            results.append(exc)

    for _ in range(rounds):
        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def test_two_threads_loading_at_once_both_get_the_saved_weights(tmp_path: Path) -> None:
    saved = _saved_tiny(tmp_path / "model")
    results = _load_side_by_side(load_policy, tmp_path / "model")
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:1]
    for policy in results:
        state = policy.model.state_dict()
        assert not any(t.is_meta for t in state.values())
        for name, tensor in saved.items():
            assert torch.equal(state[name], tensor), name
