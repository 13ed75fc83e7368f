"""`encode_dialogues` (prompts grown turn by turn from a dialogue's prefix, only the wanted
turns) gives each turn the ids of its whole prompt rendered with the chat template and
tokenised on its own, on the ChatML pieces path and on the plain path."""

from __future__ import annotations

import copy
import random

from agentrl.training.prompt_ids import _pieces_ok, encode_dialogues

TEXTS = ["hi", " lead", "\nnl", "", "tail ", "a <|im_end|> b", "héllo 漢", '{"x": 1}', "x\n\n"]


def _dialogues(seed: int) -> tuple[list[list[tuple[str, str]]], list[list[bool]]]:
    rng = random.Random(seed)
    dialogues, wanted = [], []
    for _ in range(40):
        n = rng.randint(0, 5)
        dialogues.append([(rng.choice(TEXTS), rng.choice(TEXTS)) for _ in range(n)])
        wanted.append([rng.random() < 0.6 for _ in range(n)])
    return dialogues, wanted


def _expected(tok, dialogues, wanted):
    out = []
    for turns, want in zip(dialogues, wanted, strict=True):
        row, history = [], []
        for (user, action), w in zip(turns, want, strict=True):
            history.append({"role": "user", "content": user})
            if w:  # rendered with the template and tokenised whole
                text = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
                p = tok(text, add_special_tokens=False)["input_ids"]
                row.append((list(p), list(tok(action, add_special_tokens=False)["input_ids"])))
            else:
                row.append(None)
            history.append({"role": "assistant", "content": action})
        out.append(row)
    return out


def test_dialogues_equal_whole_prompts(tokenizer):
    assert _pieces_ok(tokenizer)
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert not _pieces_ok(plain)
    for tok in (tokenizer, plain):
        dialogues, wanted = _dialogues(7)
        got = encode_dialogues(tok, dialogues, wanted)
        assert got == _expected(tok, dialogues, wanted)
        assert sum(x is None for row in got for x in row) > 10
