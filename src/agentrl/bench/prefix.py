"""`agentrl bench serving`'s prefix-caching part: what the local engine's automatic prefix
cache saves on Agent Zero's long system prompt.

Agent Zero's default system prompt is 5,408 SmolLM2 tokens and the same on every turn of
every chat; without reuse each turn paid its prefill (minutes on 2 busy cores). Figures:

- `prefix_hit_prefill_fraction`: a second request's prefill seconds over the first's, both
  opening a chat with the same 5,408-token system prompt (target <= 0.10);
- `agent_zero_two_turns_s_before` / `_after`: the wall time of a two-turn exchange (the
  first turn's answer and a tool result appended, as Agent Zero's history grows) with the
  prefix cache off and on.

The prompt is the real one when `--agent-zero-prompt FILE` gives it (Agent Zero's rendered
system prompt: `python -m agentrl.integrations.agent_zero.render_prompt A0_DIR FILE`, or the
shipped render `tests/integrations/agent_zero/data/agent_zero_system_prompt.md`, 4,958 tokens); otherwise a synthetic prompt of its size and shape (a role, a tool manual
with JSON examples) built here, cut to exactly `tokens` tokens. Decoding is greedy with a
short answer: the prefill is what is measured.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

AGENT_ZERO_TOKENS = 5408  # SmolLM2 tokens of Agent Zero's default system prompt (issue 51)
TOOLS = [
    ("response", "Answer the user and end the task.", {"text": "The result is 6."}),
    ("code_execution_tool", "Run Python, Node.js or terminal code.",
     {"runtime": "python", "session": 0, "code": "print(sum([1, 2, 3]))"}),
    ("call_subordinate", "Delegate a subtask to a subordinate agent.",
     {"profile": "", "message": "Research the topic.", "reset": "true"}),
    ("search_engine", "Search the web for the query.", {"query": "python sum list"}),
    ("memory_load", "Load memories similar to the query.", {"query": "user preferences"}),
    ("memory_save", "Save a memory for later.", {"text": "The user likes short answers."}),
    ("document_query", "Read a document and answer questions about it.",
     {"document": "https://example.com/doc.pdf", "queries": ["What is it about?"]}),
    ("scheduler", "Create, list or run scheduled tasks.", {"method": "list_tasks"}),
]  # fmt: skip


def synthetic_prompt(tokenizer: Any, tokens: int = AGENT_ZERO_TOKENS) -> str:
    """A system prompt of Agent Zero's shape, exactly `tokens` tokens long (re-tokenised)."""
    parts = [
        "# Agent Zero System Manual\n\n## Your role\nYou are Agent Zero, an autonomous JSON AI "
        "agent. You solve superior tasks using tools and subordinates. You follow the "
        "behavioural rules and instructions, execute code and actions yourself, and never "
        "just talk about solutions.\n\n## Communication\nRespond with valid JSON: thoughts, "
        "headline, tool_name, tool_args. No text before or after the JSON.\n"
    ]
    section = 0
    while len(tokenizer("".join(parts), add_special_tokens=False)["input_ids"]) < tokens + 64:
        for name, what, args in TOOLS:
            example = {
                "thoughts": [f"Step {section}: I need {name} for this.", "Then I answer."],
                "headline": f"Using {name} ({section})",
                "tool_name": name,
                "tool_args": args,
            }
            parts.append(
                f"\n### {name} (section {section})\n{what} Use it when the task needs it; "
                "check its result before you go on, and report problems honestly.\n"
                f"Usage:\n~~~json\n{json.dumps(example, indent=4)}\n~~~\n"
            )
        section += 1
    ids = tokenizer("".join(parts), add_special_tokens=False)["input_ids"][:tokens]
    return str(tokenizer.decode(ids))


async def _turn(engine: Any, messages: list[dict[str, Any]], max_tokens: int) -> tuple[Any, float]:
    from agentrl.serving.openai_types import ChatRequest

    before = engine.stats.decode.prefill_s
    gen = await engine.generate(
        None, ChatRequest(model="bench", messages=messages, max_tokens=max_tokens, temperature=0.0)
    )
    return gen, engine.stats.decode.prefill_s - before


async def _exchange(engine: Any, system: str, max_tokens: int, tag: str) -> dict[str, Any]:
    """Two turns of one chat: the question, then the tool's result after the model's answer."""
    chat: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"({tag}) Sum the list [1, 2, 3] in Python."},
    ]
    started = time.perf_counter()
    first, pre1 = await _turn(engine, chat, max_tokens)
    t1 = time.perf_counter() - started
    chat += [
        {"role": "assistant", "content": first.content or ""},
        {"role": "user", "content": '{"tool_name": "code_execution_tool", "tool_result": "6"}'},
    ]
    second, pre2 = await _turn(engine, chat, max_tokens)
    total = time.perf_counter() - started
    return {
        "s": round(total, 2),
        "turn_s": [round(t1, 2), round(total - t1, 2)],
        "prefill_s": [round(pre1, 2), round(pre2, 2)],
        "prompt_tokens": [first.prompt_tokens, second.prompt_tokens],
    }


async def prefix_run(
    model: str = "smollm2",
    prompt_file: str | None = None,
    tokens: int = AGENT_ZERO_TOKENS,
    max_tokens: int = 16,
) -> dict[str, Any]:
    """The prefix cache's figures on one engine (see the module's docstring)."""
    from agentrl.serving.local import PREFIX_CACHE_MB, LocalEngine
    from agentrl.serving.prefix_cache import PrefixCache

    load = os.getloadavg()
    engine = await asyncio.to_thread(LocalEngine, model, max_batch_size=8)
    if prompt_file:
        system, source = Path(prompt_file).read_text(), prompt_file
    else:
        system, source = synthetic_prompt(engine.tokenizer, tokens), "synthetic"
    await asyncio.to_thread(engine.use_prefix_cache, PrefixCache(0))  # before: no reuse
    before = await _exchange(engine, system, max_tokens, "before")
    cold = PrefixCache(int(PREFIX_CACHE_MB * 2**20))
    await asyncio.to_thread(engine.use_prefix_cache, cold)  # after: a cold cache
    after = await _exchange(engine, system, max_tokens, "after")
    # a new chat with the same system prompt: its prefill against the first chat's
    _, hit = await _turn(
        engine,
        [{"role": "system", "content": system}, {"role": "user", "content": "What time is it?"}],
        1,
    )
    first = after["prefill_s"][0]
    return {
        "model": model,
        "agent_zero_prompt": source,
        "agent_zero_prompt_tokens": len(
            engine.tokenizer(system, add_special_tokens=False)["input_ids"]
        ),
        "prefix_hit_prefill_fraction": round(hit / max(first, 1e-9), 4),
        "prefix_first_prefill_s": round(first, 2),
        "prefix_hit_prefill_s": round(hit, 3),
        "agent_zero_two_turns_s_before": before["s"],
        "agent_zero_two_turns_s_after": after["s"],
        "agent_zero_turn_s_before": before["turn_s"],
        "agent_zero_turn_s_after": after["turn_s"],
        "agent_zero_prefill_s_before": before["prefill_s"],
        "agent_zero_prefill_s_after": after["prefill_s"],
        "prefix_cache_mb": round(engine.prefixes.bytes / 2**20, 1),
        "answer_tokens": max_tokens,
        "load_at_start": [round(x, 2) for x in load],
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
    }


if __name__ == "__main__":  # python -m agentrl.bench.prefix [model] [prompt file]
    import sys

    args = sys.argv[1:]
    out = asyncio.run(
        prefix_run(args[0] if args else "smollm2", args[1] if len(args) > 1 else None)
    )
    print(json.dumps(out))
