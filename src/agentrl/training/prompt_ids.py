"""Token ids of many chat prompts and actions at once, identical to render-then-tokenise.

Why: rendering every turn's prompt with the jinja chat template and tokenising the whole
prompt again for each turn was most of the dataset loading time (a turn-k prompt repeats
every earlier message). Two exact shortcuts:

- Pieces (used when `_pieces_ok` holds): a ChatML template (SmolLM2's, see `CHATML`)
  renders a conversation as a head, one piece per message and a generation suffix, each
  starting with the `<|im_start|>` added token. A fast tokenizer splits text on added tokens
  before normalising or pre-tokenising, so when no added token can span the boundary
  between two pieces (none contains "\\n<"), has no strip/word flags and there is no
  normalizer, the ids of a prompt are the concatenation of its pieces' ids. Each distinct
  piece is tokenised once, in one batch, through the pre-token cache of
  `training.bpe_words` where the tokenizer has that shape (byte-level BPE: SmolLM2's).
- Otherwise each distinct prompt (by its messages) is rendered and tokenised once, in one
  batch: the straightforward path without the repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from agentrl.training.bpe_words import WordIds

Message = dict[str, str]

_SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# template text -> default system message added when the first message is not a system one
CHATML: dict[str, str] = {
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + _SMOLLM2_SYSTEM + "<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}": (
        _SMOLLM2_SYSTEM
    ),
}
START, END = "<|im_start|>", "<|im_end|>"


def render(tokenizer: Any, messages: list[Message]) -> str:
    """The prompt text as the model sees it (generation prompt added)."""
    if getattr(tokenizer, "chat_template", None):
        out: str = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return out
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + "assistant: "


def _pieces_ok(tokenizer: Any) -> bool:
    """Whether the pieces shortcut gives exactly the ids of the whole prompt (module doc)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or template not in CHATML:
        return False
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return False
    if getattr(tokenizer, "split_special_tokens", False) or backend.normalizer is not None:
        return False
    added = {str(a.content): a for a in tokenizer.added_tokens_decoder.values()}
    if START not in added or END not in added:
        return False
    return not any(
        a.lstrip or a.rstrip or a.single_word or a.normalized or "\n<" in text
        for text, a in added.items()
    )


def _split_actions_ok(tokenizer: Any) -> bool:
    """Whether "assistant\n" + an action that starts with a non-space character tokenises
    as the ids of "assistant\n" followed by the action's own ids: byte-level BPE over the
    GPT-2 split pattern without a prefix space ends a pre-token at that newline (the
    pattern has no look-behind, so the action's pre-tokens are its own) and BPE never
    merges across pre-tokens."""
    backend = tokenizer.backend_tokenizer
    pre, model = backend.pre_tokenizer, backend.model
    return (
        type(pre).__name__ == "ByteLevel"
        and not pre.add_prefix_space
        and bool(pre.use_regex)
        and type(model).__name__ == "BPE"
        and model.dropout is None
    )


def _encode(tokenizer: Any, texts: Sequence[str], fast: bool = False) -> list[list[int]]:
    """Ids of each text in one batch (`fast`: straight from the Rust tokenizer, no offsets)."""
    if not texts:
        return []
    if fast:
        if WordIds.supported(tokenizer):
            return WordIds(tokenizer).encode(texts)
        backend = tokenizer.backend_tokenizer
        batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
        return [e.ids for e in batch(list(texts), add_special_tokens=False)]
    ids: list[list[int]] = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [list(x) for x in ids]


def encode_turns(
    tokenizer: Any, prompts: Sequence[list[Message]], actions: Sequence[str]
) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, action ids) for each (prompt messages, action text), without EOS."""
    uniq_actions = list(dict.fromkeys(actions))
    if _pieces_ok(tokenizer):
        return _by_pieces(tokenizer, prompts, actions, uniq_actions)
    keys = [tuple((m["role"], m["content"]) for m in p) for p in prompts]
    first: dict[tuple[tuple[str, str], ...], int] = {}
    for j, key in enumerate(keys):
        first.setdefault(key, j)
    texts = [render(tokenizer, prompts[j]) for j in first.values()]
    ids = _encode(tokenizer, texts + uniq_actions)
    by_key = dict(zip(first, ids, strict=False))
    by_action = dict(zip(uniq_actions, ids[len(texts) :], strict=True))
    return [by_key[k] for k in keys], [by_action[a] for a in actions]


def _by_pieces(
    tokenizer: Any,
    prompts: Sequence[list[Message]],
    actions: Sequence[str],
    uniq_actions: list[str],
) -> tuple[list[list[int]], list[list[int]]]:
    system = CHATML[tokenizer.chat_template]
    head = f"{START}system\n{system}{END}\n"
    gen = f"{START}assistant\n"
    by_text = set(uniq_actions)
    seen: dict[tuple[str, str], int] = {}
    for p in prompts:
        for m in p:
            key = (m["role"], m["content"])
            if key not in seen:
                seen[key] = len(seen)
    # an assistant piece whose content is also an action: its ids from the action's
    split = _split_actions_ok(tokenizer)
    derived = {
        key: j
        for key, j in seen.items()
        if split and key[0] == "assistant" and key[1][:1].strip() and key[1] in by_text
    }
    pieces = [f"{START}{r}\n{c}{END}\n" for (r, c) in seen if (r, c) not in derived]
    ids = _encode(tokenizer, [head, gen, f"{END}\n", *pieces, *uniq_actions], fast=True)
    head_ids, gen_ids, end_ids = ids[0], ids[1], ids[2]
    own = iter(ids[3 : 3 + len(pieces)])
    by_action = dict(zip(uniq_actions, ids[3 + len(pieces) :], strict=True))
    piece_ids = [
        [*gen_ids, *by_action[key[1]], *end_ids] if key in derived else next(own) for key in seen
    ]
    out: list[list[int]] = []
    for p in prompts:
        parts = [piece_ids[seen[(m["role"], m["content"])]] for m in p]
        if p and p[0]["role"] != "system":
            parts.insert(0, head_ids)
        parts.append(gen_ids)
        out.append(list(chain.from_iterable(parts)))
    return out, [by_action[a] for a in actions]


Turns = Sequence[tuple[str, str]]  # a dialogue: (user message, assistant action) per turn


def encode_dialogues(
    tokenizer: Any, dialogues: Sequence[Turns], wanted: Sequence[Sequence[bool]]
) -> list[list[tuple[list[int], list[int]] | None]]:
    """(prompt ids, action ids) of each wanted turn of each dialogue, None for the others.
    A turn's prompt is the dialogue up to it (earlier user messages and actions, then its
    own user message) with the generation prompt: what `encode_turns` gives for the same
    messages. Each prompt list is the caller's own; action lists can be shared between
    turns: copy one before changing it."""
    if not _pieces_ok(tokenizer):
        prompts: list[list[Message]] = []
        actions: list[str] = []
        for turns, want in zip(dialogues, wanted, strict=True):
            history: list[Message] = []
            for (user, action), w in zip(turns, want, strict=True):
                history.append({"role": "user", "content": user})
                if w:
                    prompts.append(list(history))
                    actions.append(action)
                history.append({"role": "assistant", "content": action})
        p_ids, a_ids = encode_turns(tokenizer, prompts, actions)
        flat = iter([(list(p), a) for p, a in zip(p_ids, a_ids, strict=True)])
        return [[next(flat) if w else None for w in want] for want in wanted]
    return _dialogues_by_pieces(tokenizer, dialogues, wanted)


def _dialogues_by_pieces(
    tokenizer: Any, dialogues: Sequence[Turns], wanted: Sequence[Sequence[bool]]
) -> list[list[tuple[list[int], list[int]] | None]]:
    """`encode_dialogues` by ChatML pieces (module doc): each distinct user message and
    action is tokenised once, and a prompt grows turn by turn from its dialogue's prefix."""
    system = CHATML[tokenizer.chat_template]
    users: dict[str, None] = {}
    actions: dict[str, None] = {}  # every action: its ids, and its assistant piece's
    lasts: list[int] = []
    for turns, want in zip(dialogues, wanted, strict=True):
        last = len(want) - 1
        while last >= 0 and not want[last]:
            last -= 1
        lasts.append(last)
        for user, action in turns[: last + 1] if last < len(turns) - 1 else turns:
            users[user] = None
            actions[action] = None
    split = _split_actions_ok(tokenizer)
    own = [a for a in actions if not (split and a[:1].strip())]  # pieces tokenised whole
    fixed = [f"{START}system\n{system}{END}\n", f"{START}assistant\n", f"{END}\n"]
    texts = [
        *fixed,
        *(f"{START}user\n{u}{END}\n" for u in users),
        *actions,
        *(f"{START}assistant\n{a}{END}\n" for a in own),
    ]
    ids = _encode(tokenizer, texts, fast=True)
    head_ids, gen_ids, end_ids = ids[:3]
    pos = 3 + len(users)
    user_ids = dict(zip(users, ids[3:pos], strict=True))
    action_ids = dict(zip(actions, ids[pos : pos + len(actions)], strict=True))
    piece_ids = dict(zip(own, ids[pos + len(actions) :], strict=True))
    out: list[list[tuple[list[int], list[int]] | None]] = []
    for turns, want, last in zip(dialogues, wanted, lasts, strict=True):
        prefix = list(head_ids)
        row: list[tuple[list[int], list[int]] | None] = []
        for k, ((user, action), w) in enumerate(zip(turns, want, strict=True)):
            if k > last:
                row.append(None)
                continue
            u = user_ids[user]
            row.append(([*prefix, *u, *gen_ids], action_ids[action]) if w else None)
            if k == last:
                continue
            prefix += u
            piece = piece_ids.get(action)
            if piece is None:  # "assistant\n" + action splits at the newline
                prefix += gen_ids
                prefix += action_ids[action]
                prefix += end_ids
            else:
                prefix += piece
        out.append(row)
    return out
