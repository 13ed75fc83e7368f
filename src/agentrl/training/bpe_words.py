"""Token ids of many texts through a cache of pre-token ids, identical to the tokenizer's.

Why: a dataset's texts repeat the same words (JSON keys, tool names, common words), yet
the Rust tokenizer redoes the whole pipeline for every text and builds a full `Encoding`
per text: ~60 us per short agent action on the shared 2-core host, most of the dataset's
loading time. A byte-level BPE tokenizer (GPT-2 style: SmolLM2, Llama-3, Qwen2 use this
shape) without a normalizer splits a text at its added tokens, then into pre-tokens with
the GPT-2 regex, and runs BPE on each pre-token on its own: the ids of a text are the
concatenation of the ids of its pre-tokens. So each distinct pre-token goes through the
tokenizer's own BPE model once (`model.tokenize`, the same call the pipeline makes), and a
text is a regex split plus dictionary look-ups.

The split is done with Python's `re` only for ASCII text, where the regex classes are
exact (letters A-Za-z, digits 0-9, whitespace tab, LF, VT, FF, CR and space: the Oniguruma
classes the Rust pre-tokenizer uses agree there; 0x1c-0x1f are not whitespace for it).
Any other text, and every text of a tokenizer of another shape, goes to the Rust tokenizer
in one batch. `WordIds.supported` checks the shape.

A second cache sits above the pre-tokens: chunks of text between spaces. A space with no
other whitespace beside it always starts a pre-token (no pre-token but a run of whitespace
holds a space after its first character, and a run holding this space is the space alone),
and the split never looks past the next character, which is the space itself or the end in
both cases. So a text where no whitespace touches a space has the ids of its first chunk
followed by those of " " + each later chunk, and `text.split(" ")` finds the chunks. A
dataset's texts share most chunks (JSON keys, tool names, words), so a text is one C split
and a few look-ups (measured: 100,000 distinct agent actions 2.2 -> 0.6 s CPU on the warm
cache); a miss costs one regex split of the chunk.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, islice
from typing import Any

_S = r"[\t\n\x0b\x0c\r ]"
_NS = r"[^\t\n\x0b\x0c\r ]"
# The GPT-2 split (tokenizers' ByteLevel pre-tokenizer), restricted to ASCII text:
# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
SPLIT = re.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\t\n\x0b\x0c\r A-Za-z0-9]+"
    rf"|{_S}+(?!{_NS})|{_S}+"
)


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (ByteLevel), for the ASCII bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return {b: c for b, c in out.items() if b < 128}


BYTE_CHARS = _byte_chars()
# whitespace beside a space: such a text is split into pre-tokens whole, not into chunks
WS_BY_SPACE = re.compile(rf"{_S} | {_S}")


class _Filled(dict[str, list[int]]):
    """A dict that computes a missing entry with `fill` (dict look-ups stay in C)."""

    def __init__(self, fill: Callable[[str], list[int]]) -> None:
        super().__init__()
        self.fill = fill

    def __missing__(self, key: str) -> list[int]:
        value = self[key] = self.fill(key)
        return value


class WordIds:
    """Ids of texts for one tokenizer; the pre-token cache lives as long as the object."""

    def __init__(self, tokenizer: Any) -> None:
        backend = tokenizer.backend_tokenizer
        self.backend = backend
        self.model = backend.model
        tokenize = self.model.tokenize
        # pre-token -> ids (the tokenizer's own BPE model); chunk -> ids, first and later
        self.cache = _Filled(lambda w: [t.id for t in tokenize(w.translate(BYTE_CHARS))])
        self.heads = _Filled(self._words)
        self.tails = _Filled(lambda chunk: self._words(" " + chunk))
        added = sorted((str(a.content), int(i)) for i, a in tokenizer.added_tokens_decoder.items())
        self.added = dict(added)
        # leftmost-longest like the tokenizer's added-token matcher: longer first
        names = sorted(self.added, key=len, reverse=True)
        self.added_split = (
            re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        )
        # the quick "<" test before the added-token search holds when every one starts so
        self.odd_added = any(not name.startswith("<") for name in names)

    @staticmethod
    def supported(tokenizer: Any) -> bool:
        """Whether the ids are exactly those of the tokenizer (see the module doc)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not getattr(tokenizer, "is_fast", False):
            return False
        if getattr(tokenizer, "split_special_tokens", False) or backend.normalizer is not None:
            return False
        if backend.truncation is not None or backend.padding is not None:
            return False
        pre, model = backend.pre_tokenizer, backend.model
        if type(pre).__name__ != "ByteLevel" or pre.add_prefix_space or not pre.use_regex:
            return False
        if type(model).__name__ != "BPE" or model.dropout is not None:
            return False
        if model.continuing_subword_prefix or model.end_of_word_suffix:
            return False
        return not any(
            a.lstrip or a.rstrip or a.single_word or a.normalized or not str(a.content)
            for a in tokenizer.added_tokens_decoder.values()
        )

    def _segments(self, text: str) -> tuple[str | int, ...]:
        """The text split at added tokens: plain segments and the added tokens' ids."""
        assert self.added_split is not None
        parts = self.added_split.split(text)
        return tuple(self.added[part] if k % 2 else part for k, part in enumerate(parts) if part)

    def _words(self, text: str) -> list[int]:
        """Ids of a plain ASCII text (no added token) through the pre-token cache."""
        return list(chain.from_iterable(map(self.cache.__getitem__, SPLIT.findall(text))))

    def _plain(self, text: str) -> list[int]:
        """Ids of a plain ASCII text: by chunks between spaces where no whitespace touches a
        space (module doc), else pre-token by pre-token. The list is the caller's."""
        if WS_BY_SPACE.search(text):
            return self._words(text)
        parts = text.split(" ")
        ids = list(self.heads[parts[0]])
        if len(parts) > 1:
            ids.extend(chain.from_iterable(map(self.tails.__getitem__, islice(parts, 1, None))))
        return ids

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text (no special tokens added): ASCII texts from the caches, the rest
        from the Rust tokenizer in one batch."""
        split = self.added_split
        anywhere = self.odd_added
        plain = self._plain
        rust = [text for text in texts if not text.isascii()]
        done: Iterator[list[int]] = iter(())
        if rust:
            batch = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
            done = iter([e.ids for e in batch(rust, add_special_tokens=False)])
        out: list[list[int]] = []
        for text in texts:
            if not text.isascii():
                out.append(list(next(done)))
            elif split is not None and ("<" in text or anywhere) and split.search(text):
                ids: list[int] = []
                for seg in self._segments(text):
                    if isinstance(seg, int):
                        ids.append(seg)
                    else:
                        ids.extend(plain(seg))
                out.append(ids)
            else:
                out.append(plain(text))
        return out
