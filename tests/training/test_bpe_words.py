"""Ids through the pre-token cache are exactly the Rust tokenizer's, on texts built to hit
every branch of the GPT-2 split (contractions, runs of whitespace before words, control
characters, digits after letters, added tokens inside text) and on non-ASCII text."""

from __future__ import annotations

import copy
import random
from typing import Any

from agentrl.training.bpe_words import WS_BY_SPACE, WordIds

PIECES = [
    "a", "Z", "word", " word", "  word", "\tword", "9", "123", " 45", "x1", "1x",
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'x", "''", "'", " 's", "s'",
    " ", "  ", "   ", "\n", "\n\n", " \n", "\n ", "\r\n", "\t", "\x0b", "\x0c", "\x1c",
    "\x1f", "\x00", "\x7f", "!", " !", "?!", " (\"", ")\"}}", "{", "<", ">", "<|", "|>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_end", "im_end|>", "<repo_name>",
    "<<|im_end|>>", "_", "__init__", "-", "--", "#", "\\", "\\n", "é", "漢字", "🙂", "ü ",
    " \u00a0", "\u2003x",
]  # fmt: skip


def _texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = ["", " ", "\n", "<|im_end|>", "plain text", "x" * 300, " " * 40 + "y"]
    for _ in range(n):
        out.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 14))))
    return out


def _rust(tok: Any, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]


def test_ids_equal_the_rust_tokenizer(tokenizer):
    assert WordIds.supported(tokenizer)
    texts = _texts(0, 3000)
    words = WordIds(tokenizer)
    assert words.encode(texts) == _rust(tokenizer, texts)
    again = _texts(1, 500)  # a second call on the warm cache
    assert words.encode(again) == _rust(tokenizer, again)
    assert any(t.isascii() for t in texts) and not all(t.isascii() for t in texts)


def test_every_ascii_character_in_every_position(tokenizer):
    chars = [chr(c) for c in range(128)]
    texts = [a + b + c for a in chars for b in (" ", "x", "'", "\n", "9") for c in chars[::3]]
    texts += [f"{a}{a}s {a}'ll{a}" for a in chars]
    assert WordIds(tokenizer).encode(texts) == _rust(tokenizer, texts)


def test_other_tokenizer_shapes_are_refused(tokenizer):
    prefixed = copy.deepcopy(tokenizer)
    prefixed.backend_tokenizer.pre_tokenizer.add_prefix_space = True
    assert not WordIds.supported(prefixed)
    from tokenizers import normalizers

    normalised = copy.deepcopy(tokenizer)
    normalised.backend_tokenizer.normalizer = normalizers.NFKC()
    assert not WordIds.supported(normalised)
    truncating = copy.deepcopy(tokenizer)
    truncating.backend_tokenizer.enable_truncation(8)
    assert not WordIds.supported(truncating)


def test_chunks_between_spaces_give_the_same_ids(tokenizer):
    """Texts split at spaces with no whitespace beside them (the chunk cache) and texts
    where whitespace touches a space (pre-token path), twice: cold and warm caches."""
    rng = random.Random(7)
    words = [p for p in PIECES if p.isascii() and " " not in p] + ["", "x", "'s", "12", "?!"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 9))) for _ in range(3000)]
    texts += [" lead", "trail ", " both ", "a 's b", "x  y", "x \ny", "x\n y", "x\t y"]
    texts += ['{"thoughts": ["think"], "tool_name": "code_exe", "tool_args": {"code": "1"}}']
    assert any(not WS_BY_SPACE.search(t) and " " in t for t in texts)
    assert any(WS_BY_SPACE.search(t) for t in texts)
    ids = WordIds(tokenizer)
    assert ids.encode(texts) == _rust(tokenizer, texts)
    assert ids.heads and ids.tails  # the chunk path ran
    assert ids.encode(texts[::-1]) == _rust(tokenizer, texts[::-1])
