"""The tool-use learner on a tiny random model (seconds): constrained decoding only emits
what the reply schema allows, the warm start's samples are the solver's replies, every
stage runs and reports, held-out and training seeds never meet, and the checkpoint loads
in the gateway's local backend."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import pytest
import torch

from agentrl.envs.tooluse.agent_prompt import messages_for, response_schema
from agentrl.envs.tooluse.tasks import FAMILIES
from agentrl.learners.tooluse import (
    HELDOUT_OFFSET,
    ToolUseConfig,
    ToolUseLearner,
    demonstrations,
    group_advantages,
    resolve_device,
    rl_iteration,
)
from agentrl.learners.tooluse_decode import generate
from agentrl.learners.tooluse_episodes import EpisodeRecord, SchemaMatchers
from agentrl.llm.samples import render_prompt


def tiny_config(tmp_path: Path, **kw: object) -> ToolUseConfig:
    values: dict[str, object] = {
        "model": "tiny",
        "max_steps": 2,
        "max_new_tokens": 16,
        "threads": 0,
        "warm_tasks_per_family": 2,
        "warm_epochs": 1,
        "warm_batch_size": 4,
        "iterations": 1,
        "tasks_per_iteration": 3,
        "group_size": 2,
        "heldout_per_family": 2,
        "unseen_per_family": 1,
        "hint_samples": 1,
        "batch_size": 8,
        "out_dir": str(tmp_path / "run"),
    }
    values.update(kw)
    return ToolUseConfig(**values)  # type: ignore[arg-type]


def test_constrained_decoding_emits_only_schema_replies(smol_tokenizer) -> None:
    from agentrl.llm.loading import load_policy

    policy = load_policy("tiny", seed=0)
    matchers = SchemaMatchers(smol_tokenizer, int(policy.model.config.vocab_size))
    prompt = render_prompt(smol_tokenizer, messages_for("What is 12 + 30? Give the exact integer."))
    out = generate(
        policy.model.eval(),
        [prompt] * 3,
        [matchers.new() for _ in range(3)],
        temperature=1.0,
        max_new_tokens=600,
        eos_ids={int(smol_tokenizer.eos_token_id)},
        pad_id=int(smol_tokenizer.pad_token_id),
        generator=torch.Generator().manual_seed(0),
    )
    validator = jsonschema_rs.validator_for(response_schema())
    finished = [g for g in out if g.finish == "stop"]
    assert finished, [g.finish for g in out]
    for g in finished:
        text = smol_tokenizer.decode(g.ids, skip_special_tokens=True)
        assert validator.is_valid(json.loads(text)), text
        assert all(lp <= 0.0 for lp in g.logprobs) and len(g.logprobs) == len(g.ids)
    assert all(g.finish in ("stop", "length") for g in out)


def test_seeds_of_training_and_heldout_never_meet(tmp_path: Path) -> None:
    cfg = ToolUseConfig(heldout_per_family=40, warm_tasks_per_family=50, iterations=30)
    held = {s for _, s in cfg.heldout()}
    train = {s for _, s in cfg.warm_tasks()}
    train |= {s for it in range(cfg.iterations) for _, s in cfg.rl_tasks(it)}
    assert min(held) >= HELDOUT_OFFSET > max(train)
    assert len(cfg.heldout()) == 120
    fams = [f for f, _ in cfg.warm_tasks()]
    assert {fams.count(f) for f in set(fams)} == {50}  # balanced


def test_the_warm_start_covers_every_question_kind_of_each_family_evenly() -> None:
    # balanced across families alone, the first 24 data seeds held no "how many" question
    from collections import Counter

    from agentrl.envs.tooluse.tasks import generate_task, question_kind

    tasks = ToolUseConfig(warm_tasks_per_family=24).warm_tasks()
    assert len(tasks) == 72 and len(set(tasks)) == 72
    kinds = Counter(question_kind(generate_task(s, f)) for f, s in tasks)
    per_family = {f: [n for k, n in kinds.items() if k.startswith(f)] for f in FAMILIES}
    assert {f: len(v) for f, v in per_family.items()} == {
        "arithmetic": 4,
        "data": 6,
        "numbers": 4,
    }
    assert all(max(v) - min(v) <= 1 for v in per_family.values()), kinds
    assert ToolUseConfig(warm_tasks_per_family=0).warm_tasks() == []


def test_device_auto_is_the_gpu_when_there_is_one_and_a_missing_gpu_is_named() -> None:
    gpu = torch.cuda.is_available()
    assert resolve_device("auto") == ("cuda" if gpu else "cpu")
    assert resolve_device("cpu") == "cpu"
    if not gpu:
        with pytest.raises(ValueError, match="sees no GPU"):
            resolve_device("cuda:0")
    for path in Path("configs").glob("tooluse-*.yaml"):  # every shipped config loads
        ToolUseConfig.from_file(path)


def test_warm_start_samples_are_the_solvers_replies(tmp_path: Path) -> None:
    learner = ToolUseLearner(tiny_config(tmp_path))
    samples = demonstrations(learner, [("arithmetic", 3), ("numbers", 4)])
    assert len(samples) == 4  # two turns each
    tok = learner.tokenizer
    first = json.loads(tok.decode(samples[0].action_ids, skip_special_tokens=True))
    assert first["tool_name"] == "calculator"
    assert samples[0].action_ids[-1] == tok.eos_token_id
    answer = json.loads(tok.decode(samples[1].action_ids, skip_special_tokens=True))
    assert answer["tool_name"] == "response"
    # the second prompt shows the calculator's result as Agent Zero's user message
    assert "tool_result" in tok.decode(samples[1].prompt_ids)


def test_group_advantages_are_relative_within_a_task() -> None:
    eps = [EpisodeRecord("arithmetic", 1, group=0, success=s) for s in (True, False)]
    eps += [EpisodeRecord("data", 2, group=1, success=True) for _ in range(2)]
    adv = group_advantages(eps, bonus=0.0)
    assert adv[0] > 0 > adv[1]
    assert adv[2] == adv[3] == 0.0  # a group that all succeeded teaches nothing


@pytest.mark.parametrize("method", ["rejection", "grpo"])
def test_rl_iteration_runs(tmp_path: Path, method: str) -> None:
    learner = ToolUseLearner(tiny_config(tmp_path, rl_method=method))
    rec = rl_iteration(learner, 0)
    assert 0.0 <= rec["train_success"] <= 1.0
    assert set(rec) >= {"rollout_s", "update_s", "samples", "replayed", "cut_by_token_cap"}
    # the tiny random model fails every task: each is hinted (importance, the default)
    assert rec["hinted_tasks"] == 3 and rec["hinted_samples"] == 3


def test_every_stage_runs_and_the_checkpoint_loads_in_the_gateway(tmp_path: Path) -> None:
    import yaml

    from agentrl.evaluation.tooluse import bench_tooluse

    cfg = tiny_config(tmp_path)
    path = tmp_path / "tooluse-tiny.yaml"
    path.write_text(yaml.safe_dump({"kind": "tooluse", **cfg.model_dump(exclude={"out_dir"})}))
    pooled = bench_tooluse(path, 1, tmp_path / "bench", say=lambda _m: None)
    record = json.loads((tmp_path / "bench" / "tooluse_bench.json").read_text())["runs"][0]
    assert record["heldout_tasks"] == pooled["heldout_tasks"] == 6
    assert record["invalid_calls"] == 0  # structured outputs: no invalid call by construction
    for key in ("base", "start", "trained"):
        assert 0.0 <= record[f"{key}_heldout_success"] <= 1.0
        assert pooled[f"{key}_success"] == record[f"{key}_heldout_success"]
        for family in ("arithmetic", "data", "numbers"):
            assert f"{key}_{family}" in record
    for key in ("warm_start_s", "rl_s", "eval_s"):
        assert record[key] >= 0.0
    assert record["rl_iterations"] == 1
    # the unseen-phrasing pool, reported apart; hints and replay counted
    assert record["unseen_tasks"] == 3
    assert pooled["unseen_trained_success"] == record["unseen_trained_success"]
    for key in ("base", "start", "trained"):
        assert 0.0 <= record[f"unseen_{key}_success"] <= 1.0
    assert record["hints"] == "importance" and record["hinted_tasks"] >= 0
    assert (run_dir := tmp_path / "bench" / "seed-0" / "unseen_trained.jsonl").exists()
    assert all(json.loads(x)["pool"] == "unseen" for x in run_dir.read_text().splitlines())
    from agentrl.serving.local import LocalEngine

    engine = LocalEngine("tiny", seed=0)
    run = tmp_path / "bench" / "seed-0"
    engine.load_adapter("tooluse-v1", run / "checkpoints" / "final")
    engine.load_adapter("tooluse-v0", run / "checkpoints" / "warmstart")
    assert set(engine.adapters) == {"tooluse-v1", "tooluse-v0"}
    lines = (run / "heldout_trained.jsonl").read_text().splitlines()
    assert len(lines) == 6


def test_a_saved_version_is_measured_and_trained_with_its_own_adapters(tmp_path: Path) -> None:
    """`model: <checkpoint folder>` (a loop job's version or a warm start) keeps the saved
    adapters rather than wrapping fresh ones around them: what is measured is that version."""
    from peft import get_peft_model_state_dict

    first = ToolUseLearner(tiny_config(tmp_path / "a"))
    with torch.no_grad():
        for name, p in first.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
    folder = first.save("warmstart", {})
    again = ToolUseLearner(tiny_config(tmp_path / "b", model=folder, warm_start=False))
    saved, loaded = get_peft_model_state_dict(first.model), get_peft_model_state_dict(again.model)
    assert saved.keys() == loaded.keys() and saved
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert any(p.requires_grad for p in again.model.parameters())  # RL can go on from it
