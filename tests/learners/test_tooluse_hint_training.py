"""Hints where every sample failed, and the replay (issue 52), on a tiny random model:
the hint is in the context the hinted samples were drawn from and never in the prompt a
training step uses; the importance ratio and the distillation advantage are 1 and 0 where
the two contexts are the same; the replay and the family balance weigh families equally."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.envs.tooluse.agent_prompt import Turn, messages_for
from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner, hint_round
from agentrl.learners.tooluse_hints import (
    TokenItem,
    _logprobs,
    balance,
    distill_items,
    importance_items,
    token_coefficients,
    train_items,
)
from agentrl.learners.tooluse_replay import Replay
from agentrl.llm.samples import render_prompt

SECRET = "Hint: SECRET-7731 read the table first."


def tiny(tmp_path: Path, **kw: object) -> ToolUseLearner:
    values: dict[str, object] = {
        "model": "tiny", "max_steps": 2, "max_new_tokens": 16, "threads": 0,
        "warm_start": False, "iterations": 1, "tasks_per_iteration": 3, "group_size": 2,
        "heldout_per_family": 1, "unseen_per_family": 0, "batch_size": 8,
        "out_dir": str(tmp_path / "run"),
    }  # fmt: skip
    values.update(kw)
    return ToolUseLearner(ToolUseConfig(**values))  # type: ignore[arg-type]


def _no_secret(tok, ids: list[int]) -> bool:  # type: ignore[no-untyped-def]
    return "SECRET-7731" not in tok.decode(ids)


def test_hints_never_leak_into_the_hint_free_training_context(tmp_path: Path) -> None:
    learner = tiny(tmp_path)
    tok = learner.tokenizer
    tasks = [("arithmetic", 5), ("data", 6)]
    hinted = learner.play(tasks, 1.0, hints=[SECRET, SECRET])
    for ep in hinted:
        history: list[Turn] = []
        for t in ep.turns:
            assert not _no_secret(tok, t.prompt_ids)  # sampled with the hint in context
            assert t.free_prompt_ids == render_prompt(tok, messages_for(ep.question, history))
            assert _no_secret(tok, t.train_prompt_ids)
            if t.result is not None:
                history.append(Turn(t.text, t.result, t.tool_name))
        ep.success = True  # as if the hinted sample had solved it: what would be trained
        for t in ep.turns:  # (the tiny random model's replies run to the token cap)
            t.finish = "stop"
    items = importance_items(hinted)
    assert items and all(_no_secret(tok, it.prompt_ids) for it in items)
    assert all(not _no_secret(tok, it.hinted_prompt_ids or []) for it in items)
    # distillation: the failed hint-free samples' own tokens; the teacher alone sees the hint
    plain = learner.play(tasks, 1.0)
    hints = {(ep.family, ep.seed): SECRET for ep in plain}
    items = distill_items(tok, plain, hints)
    assert len(items) == sum(len(ep.turns) for ep in plain)
    assert all(_no_secret(tok, it.prompt_ids) for it in items)
    assert all(not _no_secret(tok, it.hinted_prompt_ids or []) for it in items)
    own = [list(t.prompt_ids) for ep in plain for t in ep.turns]
    assert [it.prompt_ids for it in items] == own


@pytest.mark.parametrize("mode", ["importance", "distill"])
def test_a_hint_round_trains_only_hint_free_prompts(tmp_path: Path, mode: str) -> None:
    """The tiny model fails every task: each is hinted; whatever is trained is hint-free."""
    learner = tiny(tmp_path, hints=mode, hint_samples=2)
    tok = learner.tokenizer
    learner.set_corrections({("arithmetic", 100_000): "SECRET-7731 use the calculator"})
    tasks = learner.config.rl_tasks(0)
    batch = [t for t in tasks for _ in range(2)]
    episodes = learner.play(batch, 1.0, groups=[j for j in range(3) for _ in range(2)])
    assert not any(ep.success for ep in episodes)
    out = hint_round(learner, tasks, episodes)
    assert out["hinted_tasks"] == 3 and out["corrections_used"] == 1
    assert all(_no_secret(tok, it.prompt_ids) for it in out["items"])
    if mode == "distill":
        assert out["items"] and any(not _no_secret(tok, it.hinted_prompt_ids or [])
                                    for it in out["items"])  # fmt: skip
    else:
        assert out["hinted_samples"] == 6


def test_ratio_is_one_and_advantage_zero_where_the_contexts_agree(tmp_path: Path) -> None:
    learner = tiny(tmp_path)
    tok = learner.tokenizer
    prompt = render_prompt(tok, messages_for("What is 2 + 3?"))
    hinted = render_prompt(tok, messages_for(f"What is 2 + 3?\n\n{SECRET}"))
    action = tok('{"thoughts": ["x"], "tool_name": "response"}', add_special_tokens=False)
    ids = list(action["input_ids"])
    same = [TokenItem(prompt, ids, "arithmetic", m, hinted_prompt_ids=prompt)
            for m in ("importance", "distill")]  # fmt: skip
    lp = _logprobs(learner.trainer, same, hinted=False, grad=False)
    other = _logprobs(learner.trainer, same, hinted=True, grad=False)
    assert torch.allclose(token_coefficients(same[0], lp[0], other[0], 2.0), torch.ones(len(ids)))
    assert torch.allclose(token_coefficients(same[1], lp[1], other[1], 2.0), torch.zeros(len(ids)))
    # with a hint in the other context the weights move, and stay within the clip
    moved = TokenItem(prompt, ids, "arithmetic", "importance", hinted_prompt_ids=hinted)
    lp2 = _logprobs(learner.trainer, [moved], hinted=False, grad=False)[0]
    oth = _logprobs(learner.trainer, [moved], hinted=True, grad=False)[0]
    coef = token_coefficients(moved, lp2, oth, 10.0)
    assert not torch.allclose(coef, torch.ones(len(ids))) and float(coef.max()) <= 10.0
    assert float(token_coefficients(moved, lp2, oth, 1.0).max()) <= 1.0
    before = [p.detach().clone() for p in learner.model.parameters() if p.requires_grad]
    stats = train_items(learner.trainer, [moved], batch_size=4)
    assert stats["steps"] == 1 and stats["tokens"] == len(ids)
    after = [p for p in learner.model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_the_replay_and_the_balance_weigh_families_equally() -> None:
    replay = Replay(capacity_per_family=3)
    for k in range(10):
        replay.add("arithmetic", [TokenItem([1, 2], [3 + k], "arithmetic")])
    replay.add("data", [TokenItem([1], [9], "data"), TokenItem([1, 9, 2], [8], "data")], "warm")
    assert len(replay) == 4 and replay.added == {"own": 10, "warm": 1}  # 3 kept of 10
    drawn = replay.sample(2, torch.Generator().manual_seed(0))
    fams = [it.family for it in drawn]
    assert fams.count("arithmetic") == 2 and fams.count("data") == 4  # 2 episodes each
    assert {it.action_ids[0] for it in drawn if it.family == "arithmetic"} <= {10, 11, 12}
    with pytest.raises(ValueError, match="verified successes"):
        replay.add("data", [TokenItem([1], [2], "data", "distill", hinted_prompt_ids=[1])])
    items = [TokenItem([1], [2], "arithmetic") for _ in range(6)] + [TokenItem([1], [2], "data")]
    balance(items)
    total = {f: sum(it.weight for it in items if it.family == f) for f in ("arithmetic", "data")}
    assert total["arithmetic"] == pytest.approx(total["data"]) == pytest.approx(3.5)


def test_a_bare_yaml_off_turns_hints_off(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kind: tooluse\nhints: off\n")  # YAML reads `off` as false
    assert ToolUseConfig.from_file(cfg).hints == "off"
    assert ToolUseConfig().hints == "importance"
    with pytest.raises(ValueError, match="hints"):
        ToolUseConfig(hints="sometimes")  # type: ignore[arg-type]
