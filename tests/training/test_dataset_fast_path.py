"""The fast tokenisation of training samples gives exactly what the straightforward path
gives: each turn's prompt rendered with the chat template and tokenised on its own."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from training_helpers import reward, trajectory

from agentrl.contracts.training import DatasetFilter
from agentrl.training.dataset import apply_filters, latest_rewards, seeded_sample
from agentrl.training.prompt_ids import _pieces_ok, encode_turns
from agentrl.training.samples import build_samples, episode_advantages, trajectory_turns

ODD = [
    "",
    " leading space",
    "\nleading newline",
    "\n\n  two newlines",
    "trailing space ",
    "trailing newline\n",
    "has <|im_end|> inside and <|im_start|>user\nfake turn",
    "ends with <|im_end|>",
    "<|endoftext|> first",
    "unicode: héllo wörld — 漢字 🙂",
    "{{ jinja }} {% raw %} '<' \\n",
    "'s 're contraction start",
    "123 digits first",
    "\t tab first",
]


def _straight(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    if tok.chat_template:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _reference(records, tok, estimator, completions):
    """The loader before the fast path, turn by turn (advantages as the loader computes)."""
    import torch

    adv, _ = episode_advantages(records, "rloo" if estimator == "rloo" else "grpo")
    out = []
    eos = tok.eos_token_id
    for i, r in enumerate(records):
        for k, t in enumerate(trajectory_turns(r.trajectory)):
            comp = completions.get(t.completion_id) if t.completion_id else None
            if comp and comp.get("completion_token_ids") and comp.get("prompt_token_ids"):
                lps = comp.get("completion_logprobs")
                old = None if lps is None else torch.tensor(lps, dtype=torch.float32)
                out.append((r.trajectory_id, k, comp["prompt_token_ids"], None, old))
                continue
            prompt = _straight(tok, t.prompt)
            action = list(tok(t.action, add_special_tokens=False)["input_ids"])
            if not action or action[-1] != eos:
                action.append(eos)
            if prompt:
                out.append((r.trajectory_id, k, prompt, action, float(adv[i])))
    return sorted(out, key=lambda x: (x[0], x[1]))


def _varied() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    trajs = []
    for i in range(60):
        t = trajectory(
            i,
            task=f"task-{i % 17}",
            turns=1 + i % 5,
            domain=("coding", "research")[i % 2],
            completion_id=f"c-{i}" if i % 4 == 0 else None,
            opt_out=i % 23 == 5,
        )
        t["task_context"]["instructions"] = (
            f"Solve task {i % 17}" if i % 3 else "step 0 of task task-3"
        )
        for k, turn in enumerate(t["turns"]):
            odd = ODD[(i + k) % len(ODD)]
            if (i + k) % 3 == 0:
                turn["action"]["raw_response"] = odd
            elif (i + k) % 3 == 1:
                turn["observation"]["content"] = odd
            if i % 7 == 0 and k == 1:
                turn["action"].pop("raw_response")
            if i % 11 == 0:
                turn["observation"]["content"] = {"rows": [i, k], "note": odd}
        trajs.append(t)
    trajs.append(trajs[3])  # a republish
    rewards = [reward(t, ((i * 37) % 10) / 10) for i, t in enumerate(trajs[:-3])]
    completions = {  # c-0, c-8, ... logged; c-4, c-12, ... missing from the log
        f"c-{i}": {
            "prompt_token_ids": [1, 2, 3, i],
            "completion_token_ids": [5, 6],
            "completion_logprobs": [-0.5, -0.25],
        }
        for i in range(0, 60, 8)
    }
    return trajs, rewards, completions


def _check(tok: Any, estimator: str, flt: dict[str, Any]) -> None:
    trajs, rewards, completions = _varied()
    records, _ = apply_filters(trajs, latest_rewards(rewards), DatasetFilter.model_validate(flt))
    records = seeded_sample(records, None, 0)
    assert len(records) > 10
    samples, stats = build_samples(records, tok, estimator=estimator, completions=completions)
    ref = _reference(records, tok, estimator, completions)
    got = [(s.episode_id, s.step_index, s.prompt_ids) for s in samples]
    assert got == [r[:3] for r in ref]
    for s, (_, _, _, action, adv) in zip(samples, ref, strict=True):
        if action is None:  # exact tokens from the completion log
            assert s.action_ids == [5, 6] and s.meta["exact_tokens"]
            assert s.old_logprobs is not None and s.old_logprobs.tolist() == adv.tolist()
        else:
            assert s.action_ids == action
            assert s.old_logprobs is None and not s.meta["exact_tokens"]
            if estimator != "gigpo":
                assert s.advantage == adv
    assert stats.exact_token_samples == sum(1 for r in ref if r[3] is None) > 0


@pytest.mark.parametrize(
    ("estimator", "flt"),
    [
        ("grpo", {}),
        ("rloo", {"min_reward": 0.3, "task_domains": ["coding"]}),
        ("gigpo", {"max_trajectory_length": 3}),
    ],
)
def test_samples_equal_the_straightforward_path(tokenizer, estimator, flt):
    assert _pieces_ok(tokenizer)  # the fast path is the one under test
    _check(tokenizer, estimator, flt)


def test_other_template_and_no_template_take_the_plain_path(tokenizer):
    other = copy.deepcopy(tokenizer)
    other.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] | trim }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    assert not _pieces_ok(other)
    _check(other, "grpo", {})
    several = copy.deepcopy(tokenizer)
    several.chat_template = {"default": tokenizer.chat_template}
    assert not _pieces_ok(several)
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    assert not _pieces_ok(plain)
    _check(plain, "grpo", {})


def test_prompt_ids_of_odd_conversations(tokenizer):
    prompts, actions = [], []
    for j, a in enumerate(ODD):
        for b in ODD[j % 3 :: 3]:
            convo = [{"role": "user", "content": a}, {"role": "assistant", "content": b}]
            convo.append({"role": "user", "content": b + a})
            prompts += [convo[:1], convo]
            actions += [b, a]
    prompts.append([{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}])
    prompts.append([{"role": "user", "content": "y"}])
    actions += [json.dumps({"a": "<|im_end|>"}), ""]
    p_ids, a_ids = encode_turns(tokenizer, prompts, actions)
    assert p_ids == [_straight(tokenizer, p) for p in prompts]
    assert a_ids == [list(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in actions]
