"""The dataset's samples equal a straightforward reference kept here, field by field:
every turn's prompt rendered with the chat template and tokenised on its own, the action
tokenised on its own plus EOS, the logged tokens where the completion log has them, and
the advantages (episode and GiGPO per turn) from the advantage functions fed per turn.

The data mixes what the job meets: grouped and single attempts over two domains, turns with
and without a completion id (found in the log, missing from it, constrained, cancelled),
identical observations across a group's attempts (GiGPO anchors), 1 to 4 turns, ASCII and
non-ASCII text, an opted-out trajectory and a republished one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from training_helpers import reward, trajectory

from agentrl.advantages import gigpo_advantages
from agentrl.contracts.training import DatasetFilter
from agentrl.training.dataset import apply_filters, latest_rewards, seeded_sample
from agentrl.training.samples import build_samples, episode_advantages, trajectory_turns


def _data() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    trajs = []
    for i in range(48):
        grouped = i < 36  # 12 tasks x 3 attempts, then 12 single attempts
        task = f"task-{i // 3}" if grouped else None
        t = trajectory(
            i,
            task=task,
            turns=1 + i % 4,
            domain=("coding", "research")[i % 2],
            completion_id=f"c-{i}" if i % 3 == 0 else None,
            opt_out=i == 40,
        )
        for k, turn in enumerate(t["turns"]):
            if grouped and k == 1:  # the same observation in every attempt: an anchor
                turn["observation"]["content"] = f"shared state of {task}"
            if i % 5 == 0:
                turn["action"]["raw_response"] = f"réponse {i}.{k} — ok"
            if i % 7 == 0 and k == 0:
                turn["action"].pop("raw_response")
        trajs.append(t)
    trajs.append(dict(trajs[4]))  # republished
    scores = [((i * 37) % 10) / 10 for i in range(48)]
    rewards = [reward(t, s) for t, s in zip(trajs, scores, strict=False)]
    comp: dict[str, Any] = {}
    for i in range(0, 48, 3):
        if i % 9 == 3:
            continue  # named by the turn, missing from the log
        row: dict[str, Any] = {
            "prompt_token_ids": [1, 2, i],
            "completion_token_ids": [5, 6, 7],
            "completion_logprobs": [-0.5, -0.25, -1.0],
        }
        if i % 9 == 6:
            row.update(constrained=True, schema_hash="s1")
        if i % 12 == 0:
            row["finish_reason"] = "cancelled"
        comp[f"c-{i}"] = row
    return trajs, rewards, comp


def _reference(records, tok, estimator: str, completions: dict[str, Any]) -> list[tuple]:
    adv, grouped = episode_advantages(records, "rloo" if estimator == "rloo" else "grpo")
    turns = [trajectory_turns(r.trajectory) for r in records]
    step: dict[tuple[int, int], float] = {}
    if estimator == "gigpo":
        gids, eids, anchors, rewards, ep, where = [], [], [], [], [], []
        for i, r in enumerate(records):
            if not grouped[i]:
                continue
            for k, t in enumerate(turns[i]):
                gids.append(r.task_id)
                eids.append(r.trajectory_id)
                anchors.append(t.anchor)
                rewards.append(r.score if k == len(turns[i]) - 1 else 0.0)
                ep.append(r.score)
                where.append((i, k))
        res = gigpo_advantages(
            gids, eids, anchors, rewards, ep, gamma=0.95, omega=1.0, combine="additive"
        )
        step = {ik: float(a) for ik, a in zip(where, res.advantages, strict=True)}
    eos = tok.eos_token_id
    out = []
    for i, r in enumerate(records):
        for k, t in enumerate(turns[i]):
            a = step.get((i, k), float(adv[i]))
            comp = completions.get(t.completion_id) if t.completion_id else None
            if comp and comp.get("completion_token_ids") and comp.get("prompt_token_ids"):
                lps = None if comp.get("constrained") else comp["completion_logprobs"]
                out.append(
                    (r.trajectory_id, k, comp["prompt_token_ids"], comp["completion_token_ids"],
                     a, lps, True)
                )  # fmt: skip
                continue
            text = tok.apply_chat_template(t.prompt, tokenize=False, add_generation_prompt=True)
            prompt = list(tok(text, add_special_tokens=False)["input_ids"])
            action = list(tok(t.action, add_special_tokens=False)["input_ids"])
            if not action or action[-1] != eos:
                action.append(eos)
            out.append((r.trajectory_id, k, prompt, action, a, None, False))
    return sorted(out, key=lambda x: (x[0], x[1]))


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo"])
def test_samples_equal_the_reference(tokenizer, estimator):
    trajs, rewards, completions = _data()
    records, _ = apply_filters(trajs, latest_rewards(rewards), DatasetFilter())
    records = seeded_sample(records, None, 3)
    samples, stats = build_samples(records, tokenizer, estimator=estimator, completions=completions)
    ref = _reference(records, tokenizer, estimator, completions)
    assert len(samples) == len(ref) > 90
    for s, (tid, k, prompt, action, adv, lps, exact) in zip(samples, ref, strict=True):
        assert (s.episode_id, s.step_index) == (tid, k)
        assert s.prompt_ids == prompt
        assert s.action_ids == action
        assert s.advantage == pytest.approx(adv, abs=1e-12)
        assert s.meta["exact_tokens"] is exact
        if lps is None:
            assert s.old_logprobs is None
        else:
            assert np.allclose(s.old_logprobs.numpy(), lps)
    assert stats.exact_token_samples == sum(1 for r in ref if r[6]) > 5
    assert len({s.advantage for s in samples}) > 10
