"""Issue 50.8: the converted model lives in one documented place that every data dir (and
every working directory) shares: `$AGENTRL_MODELS_DIR`, else `$AGENTRL_CACHE_DIR/models`,
else `$XDG_CACHE_HOME/agentrl/models`, else `~/.cache/agentrl/models`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.core.cachedirs import cache_home, models_home


def test_the_cache_follows_xdg_and_its_overrides(tmp_path: Path) -> None:
    home = Path.home()
    assert models_home({}) == home / ".cache" / "agentrl" / "models"
    assert models_home({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "agentrl" / "models"
    # XDG: a relative path is invalid and ignored
    assert cache_home({"XDG_CACHE_HOME": "rel/dir"}) == home / ".cache" / "agentrl"
    env = {"XDG_CACHE_HOME": str(tmp_path), "AGENTRL_CACHE_DIR": str(tmp_path / "c")}
    assert models_home(env) == tmp_path / "c" / "models"
    env["AGENTRL_MODELS_DIR"] = str(tmp_path / "m")
    assert models_home(env) == tmp_path / "m"


def test_two_data_dirs_and_two_working_dirs_share_one_conversion(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`agentrl up --data-dir D` from two directories finds one converted model (it used to
    convert into `./.agentrl/models` under the working directory)."""
    from agentrl.core.settings import get_settings
    from agentrl.llm.loading import SMOLLM2_DIRNAME, smollm2_dir

    monkeypatch.delenv("AGENTRL_MODELS_DIR", raising=False)
    monkeypatch.delenv("AGENTRL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    seen = set()
    try:
        for cwd, data in (("a", "d1"), ("b", "d2")):
            (tmp_path / cwd).mkdir()
            monkeypatch.chdir(tmp_path / cwd)
            monkeypatch.setenv("AGENTRL_DATA_DIR", str(tmp_path / data))
            get_settings.cache_clear()
            seen.add(smollm2_dir(tmp_path / data))
            seen.add(smollm2_dir())
    finally:
        get_settings.cache_clear()
    assert seen == {tmp_path / "xdg" / "agentrl" / "models" / SMOLLM2_DIRNAME}
    assert not any(p.name == ".agentrl" for p in tmp_path.rglob("*")), os.listdir(tmp_path)


def test_llama_cpp_rotary_permutation_is_undone() -> None:
    """llama.cpp stores Q and K permuted for its rotary kernel; `_unpermute` is its inverse
    (llama.cpp's convert_hf_to_gguf permute, written out here)."""
    import torch

    from agentrl.llm.loading import _unpermute

    def permute(w: torch.Tensor, heads: int) -> torch.Tensor:  # llama.cpp's
        return (
            w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape)
        )

    w = torch.arange(24 * 5, dtype=torch.float32).reshape(24, 5)
    for heads in (1, 3, 6):
        assert (_unpermute(permute(w, heads).numpy(), heads) == w.numpy()).all()


def test_the_bundled_gguf_maps_onto_every_llama_weight() -> None:
    """The direct GGUF reader (about 5 s instead of transformers' ~110 s on 2 busy cores;
    equal bit for bit when measured) names and shapes every weight a LlamaForCausalLM has.
    The Llama's dimensions come from the GGUF's metadata, read by hand here (llama.cpp's
    keys, as transformers maps them): transformers' `AutoConfig` of a GGUF parses the
    whole vocabulary and merges too (~9 of the test's ~15 CPU-s at load 13)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.llm.loading import gguf_llama_state_dict, gguf_metadata, smollm2_gguf_path

    path = smollm2_gguf_path()
    meta = gguf_metadata(path)
    assert meta["general.architecture"] == "llama"
    heads = meta["llama.attention.head_count"]
    config = LlamaConfig(
        vocab_size=meta["llama.vocab_size"],
        hidden_size=meta["llama.embedding_length"],
        intermediate_size=meta["llama.feed_forward_length"],
        num_hidden_layers=meta["llama.block_count"],
        num_attention_heads=heads,
        num_key_value_heads=meta["llama.attention.head_count_kv"],
        head_dim=meta.get("llama.rope.dimension_count", meta["llama.embedding_length"] // heads),
        # SmolLM2's GGUF has no output.weight: the head is the embedding (what transformers
        # infers the same way)
        tie_word_embeddings=True,
    )
    weights = gguf_llama_state_dict(path, config.num_attention_heads, config.num_key_value_heads)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    assert {k: v.shape for k, v in weights.items()} == expected
    # a NaN or an infinity anywhere makes the sum non-finite (weights this small cannot
    # overflow it): one pass, no boolean copy of 135M values (2.2 of the test's 17 CPU-s)
    assert all(v.dtype == torch.float32 and torch.isfinite(v.sum()) for v in weights.values())
