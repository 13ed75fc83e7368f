"""HFAgentPolicy on a tiny random Llama with SmolLM2's real tokenizer and chat template."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from agentrl.llm.loading import load_smollm2_tokenizer, tiny_causal_lm
from agentrl.rollout import Message
from agentrl.rollout.policies import HFAgentPolicy


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    tokenizer = load_smollm2_tokenizer()
    model = tiny_causal_lm(vocab_size=len(tokenizer), seed=1).eval()
    return model, tokenizer


def observations(n: int) -> list[list[Message]]:
    # Different lengths, so the batch really is left-padded.
    return [
        [
            Message(role="system", content="Answer with a move."),
            Message(role="user", content="grid " + "# " * (3 * i + 1)),
        ]
        for i in range(n)
    ]


def recompute(model: Any, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of `tokens` after `prompt` from one unpadded forward pass."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


async def test_concurrent_calls_become_one_batch_with_exact_logprobs(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    policy = HFAgentPolicy(model, tokenizer, max_new_tokens=12, temperature=0.8, seed=0)
    obs = observations(6)
    results = await asyncio.gather(*(policy.get_action(o) for o in obs))
    assert policy.stats.batch_sizes == [6]
    for o, (action, raw, log_probs, value) in zip(obs, results, strict=True):
        assert value is None and log_probs is not None
        assert log_probs["prompt_ids"] == policy.encode(o)
        assert 1 <= len(log_probs["tokens"]) <= 12
        assert len(log_probs["token_logprobs"]) == len(log_probs["tokens"])
        assert log_probs["sum"] == pytest.approx(sum(log_probs["token_logprobs"]))
        assert raw == tokenizer.decode(log_probs["tokens"], skip_special_tokens=True)
        assert action["type"] in ("text", "invalid")
        # Left padding did not change what the model computed for this row.
        expected = recompute(model, log_probs["prompt_ids"], log_probs["tokens"], 0.8)
        torch.testing.assert_close(
            torch.tensor(log_probs["token_logprobs"]), expected, atol=1e-4, rtol=0
        )
    # The prompt went through the chat template.
    text = tokenizer.decode(results[0][2]["prompt_ids"])
    assert text.startswith("<|im_start|>system\nAnswer with a move.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")


async def test_max_batch_size_splits_and_one_at_a_time_mode(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    policy = HFAgentPolicy(model, tokenizer, max_new_tokens=4, max_batch_size=3)
    await asyncio.gather(*(policy.get_action(o) for o in observations(8)))
    assert policy.stats.batch_sizes == [3, 3, 2]
    single = HFAgentPolicy(model, tokenizer, max_new_tokens=4, max_batch_size=1)
    await asyncio.gather(*(single.get_action(o) for o in observations(4)))
    assert single.stats.batch_sizes == [1, 1, 1, 1]


async def test_late_calls_within_max_wait_join_the_batch(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    policy = HFAgentPolicy(model, tokenizer, max_new_tokens=2, max_wait_ms=300)
    obs = observations(3)

    async def late(o: list[Message], delay: float) -> Any:
        await asyncio.sleep(delay)
        return await policy.get_action(o)

    await asyncio.gather(late(obs[0], 0.0), late(obs[1], 0.05), late(obs[2], 0.1))
    assert policy.stats.batch_sizes == [3]
    eager = HFAgentPolicy(model, tokenizer, max_new_tokens=2, max_wait_ms=0)
    await asyncio.gather(*(eager.get_action(o) for o in obs))  # all queued at once
    assert eager.stats.batch_sizes == [3]


async def test_greedy_batched_equals_unbatched_and_stop_tokens(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    obs = observations(4)
    batched = HFAgentPolicy(model, tokenizer, max_new_tokens=8, temperature=0.0)
    together = await asyncio.gather(*(batched.get_action(o) for o in obs))
    alone = HFAgentPolicy(model, tokenizer, max_new_tokens=8, temperature=0.0, max_batch_size=1)
    separate = [await alone.get_action(o) for o in obs]
    for a, b in zip(together, separate, strict=True):
        assert a[2]["tokens"] == b[2]["tokens"]
        assert a[2]["finish_reason"] == "length" and len(a[2]["tokens"]) == 8
        assert a[2]["sum"] == pytest.approx(b[2]["sum"], abs=1e-4)
    # Declare the third greedy token a stop token: generation ends there, and includes it.
    tokens = together[0][2]["tokens"]
    stop = tokens[2]
    cut = tokens.index(stop) + 1
    stopper = HFAgentPolicy(
        model, tokenizer, max_new_tokens=8, temperature=0.0, stop_token_ids=[stop]
    )
    _, _, lp, _ = await stopper.get_action(obs[0])
    assert lp["tokens"] == tokens[:cut] and lp["finish_reason"] == "stop"


async def test_seeded_sampling_replays(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    obs = observations(3)
    runs = []
    for _ in range(2):
        policy = HFAgentPolicy(model, tokenizer, max_new_tokens=6, seed=7)
        out = await asyncio.gather(*(policy.get_action(o) for o in obs))
        runs.append([r[2]["tokens"] for r in out])
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) == 3


async def test_too_long_prompt_and_generate_failure_are_policy_errors(
    tiny: tuple[Any, Any],
) -> None:
    from agentrl.rollout import PolicyError

    model, tokenizer = tiny
    policy = HFAgentPolicy(model, tokenizer, max_new_tokens=4)
    too_long = [Message(role="user", content="x " * 3000)]  # beyond 2048 positions
    with pytest.raises(PolicyError, match="exceeds the model's context of 2048"):
        await policy.get_action(too_long)
    clipped = HFAgentPolicy(model, tokenizer, max_new_tokens=4, max_prompt_tokens=100)
    _, _, lp, _ = await clipped.get_action(too_long)
    assert len(lp["prompt_ids"]) == 100
    # A model whose vocabulary is smaller than the tokenizer's fails inside generate: every
    # caller of that batch gets a PolicyError, and the batcher lives on.
    small = tiny_causal_lm(vocab_size=300, seed=0).eval()
    broken = HFAgentPolicy(small, tokenizer, max_new_tokens=2)
    results = await asyncio.gather(
        *(broken.get_action(o) for o in observations(2)), return_exceptions=True
    )
    assert all(isinstance(r, PolicyError) and "generate failed" in str(r) for r in results)
    # The batcher lives on: the next call is served (and fails the same way), not hung.
    with pytest.raises(PolicyError, match="IndexError"):
        await asyncio.wait_for(broken.get_action(observations(1)[0]), timeout=30)
    assert broken.stats.calls == 0


async def test_shared_prefix_prefill_changes_nothing_but_cost(tiny: tuple[Any, Any]) -> None:
    """A group's prompts share the task prompt and first observation; prefilling that once
    must give the same tokens and log-probs as prefilling every row in full, and as
    transformers' own generate."""
    model, tokenizer = tiny
    system = Message(role="system", content="Rules of the game: " + "push boxes. " * 30)
    first = Message(role="user", content="#####\n#P_X#\n#####")
    obs = [
        [system, first],
        [system, first],  # identical prompts (every group's first step)
        [
            system,
            first,
            Message(role="assistant", content="up"),
            Message(role="user", content="no"),
        ],
        [
            system,
            first,
            Message(role="assistant", content="left left"),
            Message(role="user", content="ok"),
        ],
    ]
    kwargs = {"max_new_tokens": 6, "temperature": 0.0}
    shared = HFAgentPolicy(model, tokenizer, **kwargs)  # type: ignore[arg-type]
    prompts = [shared.encode(o) for o in obs]
    assert shared._shared_prefix(prompts) >= 60
    a = shared.generate(prompts)
    b = HFAgentPolicy(model, tokenizer, share_prefix=False, **kwargs).generate(prompts)  # type: ignore[arg-type]
    c = HFAgentPolicy(model, tokenizer, use_hf_generate=True, **kwargs).generate(prompts)  # type: ignore[arg-type]
    for x, y, z, p in zip(a, b, c, prompts, strict=True):
        assert x[0] == y[0] == z[0]
        torch.testing.assert_close(torch.tensor(x[1]), torch.tensor(y[1]), atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(x[1]), torch.tensor(z[1]), atol=1e-4, rtol=0)
        expected = recompute(model, p, x[0], 1.0)
        torch.testing.assert_close(torch.tensor(x[1]), expected, atol=1e-4, rtol=0)
    # Sampling through the shared prefix: log-probs still match a plain forward pass.
    sampled = HFAgentPolicy(model, tokenizer, max_new_tokens=6, temperature=0.7, seed=3)
    for (tokens, logps, _), p in zip(sampled.generate(prompts), prompts, strict=True):
        expected = recompute(model, p, tokens, 0.7)
        torch.testing.assert_close(torch.tensor(logps), expected, atol=1e-4, rtol=0)


async def test_tiny_model_served_over_http_batches_concurrent_requests(
    tiny: tuple[Any, Any],
) -> None:
    """OpenAIAgentPolicy -> real HTTP -> policy_responder -> HFAgentPolicy: a tiny
    OpenAI-compatible model server whose concurrent requests are generated as one batch."""
    from agentrl.bench.testing_server import ScriptedOpenAIServer, policy_responder
    from agentrl.rollout.policies import OpenAIAgentPolicy

    model, tokenizer = tiny
    local = HFAgentPolicy(model, tokenizer, max_new_tokens=5, max_wait_ms=300, seed=1)
    with ScriptedOpenAIServer(responder=policy_responder(local)) as server:
        remote = OpenAIAgentPolicy("tiny", base_url=server.base_url, temperature=1.0)
        results = await asyncio.gather(*(remote.get_action(o) for o in observations(4)))
    assert local.stats.batch_sizes == [4]
    for action, raw, log_probs, _ in results:
        assert log_probs is not None and len(log_probs["token_logprobs"]) == 5
        assert log_probs["usage"]["completion_tokens"] == 5
        assert all(lp <= 0.0 for lp in log_probs["token_logprobs"])
        assert action["type"] in ("text", "invalid") and raw is not None
