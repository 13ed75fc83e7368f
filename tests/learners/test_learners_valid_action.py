"""The valid-action learner: exact renormalised log-probs, and learning that can be seen.

A 2x2 lake ("SG" / "HH"): from the start, "right" reaches the goal, "down" falls into a
hole, "up"/"left" bump into a wall (and the episode goes on). After a few updates the policy's probability of "right" at
the start must have risen clearly, for every algorithm. A tiny random Llama (real
transformers, real peft) keeps it to seconds.
"""

from __future__ import annotations

import pytest
import torch

from agentrl.learners.valid_action import (
    HELDOUT_OFFSET,
    MOVES,
    Learner,
    PromptCache,
    ValidActionConfig,
    evaluate_heldout,
    rollout,
    train_on_env,
)
from agentrl.llm.choices import UpperLayerScorer, choice_logprobs, render_prompt, score_choices

BOARD = {"size": 2, "desc": ["SG", "HH"]}


def tiny_config(algorithm: str, **kw: object) -> ValidActionConfig:
    base: dict[str, object] = {
        "model": "tiny",
        "algorithm": algorithm,
        "env_kwargs": BOARD,
        "max_steps": 4,
        "lora_layers": 1,
        "maps_per_iteration": 2,
        "episodes_per_map": 8,
        "iterations": 12,
        "learning_rate": 3e-2,
        "entropy_coef": 0.0,
        "heldout_seeds": 2,
        "eval_every": 0,
        "save_adapter": False,
        "epochs": 2,
    }
    base.update(kw)
    return ValidActionConfig(**base)  # type: ignore[arg-type]


def p_right_at_start(learner: Learner) -> float:
    from agentrl.learners.valid_action import make_env

    env = make_env(learner.config)
    text = learner.cache.prompt(env.reset(0)["text"])
    with torch.no_grad():
        return float(learner.scorer.logprobs([text])[0, MOVES.index("right")].exp())


@pytest.mark.parametrize("algorithm", ["gigpo", "grpo", "rloo", "ppo"])
def test_probability_of_the_rewarded_move_rises(algorithm: str) -> None:
    cfg = tiny_config(algorithm)
    learner = Learner(cfg)
    before = p_right_at_start(learner)
    result = train_on_env(cfg, learner=learner)
    after = p_right_at_start(learner)
    assert after > before + 0.2, (algorithm, before, after)
    assert result.trained.invalid_action_rate == 0.0


def test_linear_lr_schedule_anneals_toward_zero() -> None:
    cfg = tiny_config("grpo", lr_schedule="linear", iterations=4, learning_rate=1e-2)
    learner = Learner(cfg)
    batch = rollout(cfg, learner.logprob_fn(), learner.cache, [0], 4)
    seen = []
    for it in range(4):
        learner.update(batch, it)
        seen.append(learner.optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([1e-2, 7.5e-3, 5e-3, 2.5e-3])
    flat = Learner(tiny_config("grpo", learning_rate=1e-2))
    flat.update(batch, 3)
    assert flat.optimizer.param_groups[0]["lr"] == 1e-2  # constant: the default


def test_rollout_and_trainer_logprobs_agree() -> None:
    """Behaviour log-probs recorded in the rollout equal the trainer's recomputation (fp32)."""
    cfg = tiny_config("grpo", lora_layers=1)
    learner = Learner(cfg)
    with torch.no_grad():  # move the adapter off zero so the check is not trivial
        for p in learner.params:
            p.add_(0.05 * torch.randn_like(p))
    learner.cache.new_version()
    batch = rollout(cfg, learner.logprob_fn(), learner.cache, [0, 1], 4)
    texts = [s.text for s in batch.steps]
    fresh = learner.scorer.logprobs(texts)  # a different batch composition than the rollout
    for s, row in zip(batch.steps, fresh, strict=True):
        assert abs(float(row[s.action]) - s.logp) < 1e-5
    # The cached-trunk path equals the full model's renormalised scores.
    full = choice_logprobs(learner.policy.model, learner.tokenizer, texts[:5], list(MOVES))
    for a, b in zip(full, fresh[:5], strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_multi_token_choices_share_the_prompt_cache() -> None:
    """KV-shared scoring of multi-token candidates equals scoring each sequence whole."""
    from agentrl.llm.loading import load_policy

    pm = load_policy("tiny")
    prompt = [{"role": "user", "content": "Pick one."}]
    choices = ["go up now", "down", "walk left please"]
    got = torch.tensor(score_choices(pm.model, pm.tokenizer, [prompt], choices)[0])
    text = render_prompt(pm.tokenizer, prompt)
    pid = pm.tokenizer(text, add_special_tokens=False)["input_ids"]
    whole = []
    with torch.no_grad():
        for c in choices:
            cid = pm.tokenizer(c, add_special_tokens=False)["input_ids"]
            logp = torch.log_softmax(pm.model(torch.tensor([pid + cid])).logits[0].float(), -1)
            whole.append(sum(logp[len(pid) - 1 + k, t] for k, t in enumerate(cid)))
    ref = torch.stack(whole)
    ref = ref - torch.logsumexp(ref, 0)
    assert torch.allclose(got, ref, atol=1e-5)
    assert abs(float(got.exp().sum()) - 1.0) < 1e-5


def test_heldout_seeds_never_overlap_training_seeds() -> None:
    cfg = ValidActionConfig(iterations=500, maps_per_iteration=8, heldout_seeds=50)
    train = {s for it in range(cfg.iterations) for s in cfg.train_seeds(it)}
    assert not train & set(cfg.heldout())
    assert min(cfg.heldout()) >= HELDOUT_OFFSET
    with pytest.raises(ValueError, match="overlap"):
        evaluate_heldout(lambda t: torch.zeros(len(t), 4), cfg, [3], PromptCache(None))


def test_scorer_rejects_multi_token_choices() -> None:
    from agentrl.llm.loading import load_policy

    pm = load_policy("tiny")
    with pytest.raises(ValueError, match="single tokens"):
        UpperLayerScorer(pm.model, pm.tokenizer, ["go up now", "down"], 1)


def test_shared_prefix_path_equals_the_whole_prompt_path() -> None:
    """Running the system prompt once per call (the fast path) changes neither the log-probs
    nor the gradients; a prompt without that prefix in the same batch takes the whole path."""
    from agentrl.learners.valid_action import make_env

    results = {}
    for share in (True, False):
        learner = Learner(tiny_config("grpo", share_prefix=share))
        torch.manual_seed(1)
        with torch.no_grad():
            for p in learner.params:
                p.add_(0.05 * torch.randn_like(p))
        assert bool(learner.scorer.prefix_ids) is share
        env = make_env(learner.config)
        texts = []
        for seed in range(3):
            texts.append(learner.cache.prompt(env.reset(seed)["text"]))
            texts.append(learner.cache.prompt(env.step("down")[0]["text"]))
        texts.append(render_prompt(learner.tokenizer, [{"role": "user", "content": "Go on."}]))
        logp = learner.scorer.logprobs(texts)
        logp[:, MOVES.index("right")].sum().backward()
        grads = torch.cat([p.grad.flatten() for p in learner.params if p.grad is not None])
        results[share] = (logp.detach(), grads)
        full = torch.stack(
            choice_logprobs(learner.policy.model, learner.tokenizer, texts, list(MOVES))
        )
        assert torch.allclose(logp.detach(), full.detach(), atol=1e-5)
        reordered = learner.scorer.logprobs(texts[::-1]).detach().flip(0)
        assert torch.allclose(reordered, logp.detach(), atol=1e-6)
    assert torch.allclose(results[True][0], results[False][0], atol=1e-5)
    assert torch.allclose(results[True][1], results[False][1], rtol=1e-4, atol=1e-6)
