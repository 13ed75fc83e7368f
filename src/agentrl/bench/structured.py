"""`agentrl bench structured`: what structured outputs cost and deliver on the local backend.

The same model and prompts (one per generated JSON Schema: "answer with JSON matching ...")
decoded twice through `LocalEngine.generate`, batched as the gateway batches them: under the
schema (response_format json_schema) and free. Figures: `valid_fraction` (constrained answers
that parse and validate), `overhead_fraction` (added wall time per generated token; the free
run is capped at each request's constrained length so both decode the same amount),
`compile_p50_ms` / `compile_p99_ms` (request -> compiled matcher, uncached), and the grammar's own share of the decode loop (masks and matcher steps, timed in the loop:
the figure the machine's load does not move).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from typing import Any

from agentrl.bench.options import StructuredBench

SCALARS = ("integer", "enum", "boolean", "string", "array", "nullable")


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object schema whose every answer is short (bounded strings, ranges, items), so a
    random model finishes within the token cap too."""
    props: dict[str, Any] = {}
    for i in range(rng.randint(1, 4)):
        kind = rng.choice(SCALARS + (("object",) if depth < 1 else ()))
        name = f"{rng.choice(['id', 'name', 'count', 'ok', 'tags', 'kind', 'note'])}_{i}"
        if kind == "integer":
            low = rng.randint(-50, 50)
            props[name] = {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
        elif kind == "enum":
            props[name] = {"enum": rng.sample(["red", "green", "blue", "up", "down", "yes"], 3)}
        elif kind == "boolean":
            props[name] = {"type": "boolean"}
        elif kind == "string":
            props[name] = {"type": "string", "maxLength": rng.randint(1, 12)}
        elif kind == "array":
            props[name] = {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 99},
                "maxItems": rng.randint(1, 3),
            }
        elif kind == "nullable":
            props[name] = {
                "anyOf": [{"type": "null"}, {"type": "integer", "minimum": 0, "maximum": 9}]
            }
        else:
            props[name] = random_schema(rng, depth + 1)
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def _request(schema: dict[str, Any], constrained: bool, max_tokens: int) -> Any:
    from agentrl.serving.openai_types import ChatRequest

    ask = "Answer only with a JSON object that matches this JSON Schema:\n" + json.dumps(schema)
    extra: dict[str, Any] = {}
    if constrained:
        extra["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        }
    return ChatRequest(
        model="bench",
        messages=[{"role": "user", "content": ask}],
        temperature=0,
        max_tokens=max_tokens,
        **extra,
    )


def _valid(text: str | None, schema: dict[str, Any]) -> bool:
    import jsonschema_rs

    try:
        return bool(jsonschema_rs.is_valid(schema, json.loads(text or "")))
    except ValueError:
        return False


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _decode(engine: Any, requests: list[Any]) -> tuple[list[Any], float]:
    # each side prefills its prompts: the engine keeps a finished row's K/V for the next
    # turn, so the free run of the same prompts skipped their prefill and the constrained
    # run, decoded first, paid it alone (measured: "overhead" 0.354 with the grammar at 0.6 %)
    engine.prefixes.clear()
    started = time.perf_counter()
    gens = await asyncio.gather(*[engine.generate(None, r) for r in requests])
    return list(gens), time.perf_counter() - started


def run_structured_bench(
    model: str = "smollm2",
    n_schemas: int = 200,
    max_tokens: int = 160,
    batch: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    from agentrl.serving import structured
    from agentrl.serving.local import LocalEngine

    tiny = (
        {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2} if model == "tiny" else None
    )
    engine = LocalEngine(
        model, seed=seed, tiny_kwargs=tiny, max_batch_size=batch, default_max_tokens=max_tokens
    )
    rng = random.Random(seed)
    schemas = [random_schema(rng) for _ in range(n_schemas)]

    t0 = time.perf_counter()
    engine.grammars.lltokenizer()
    tokenizer_ms = (time.perf_counter() - t0) * 1000
    compile_ms = []
    structured.constraint_for(_request(schemas[0], True, max_tokens))  # imports
    for s in schemas:  # request -> compiled matcher (fills the cache the decode uses)
        started = time.perf_counter()
        constraint = structured.constraint_for(_request(s, True, max_tokens))
        assert constraint is not None
        asyncio.run(engine.grammars.matcher(constraint))
        compile_ms.append((time.perf_counter() - started) * 1000)

    async def both() -> tuple[list[Any], float, list[Any], float, float]:
        """Each batch of prompts decoded constrained, then free (capped at the constrained
        lengths): alternating batch by batch, a change of machine load between two long runs
        cannot pass for overhead (a drift within a batch still can: the grammar's own share
        of the decode, measured in the loop, is the figure load does not move)."""
        await _decode(engine, [_request(schemas[0], True, 8), _request(schemas[0], False, 8)])
        cons: list[Any] = []
        free: list[Any] = []
        t_c = t_f = grammar_s = 0.0
        for start in range(0, len(schemas), batch):
            part = schemas[start : start + batch]
            before = structured.GRAMMAR_SECONDS[0]
            got, t = await _decode(engine, [_request(s, True, max_tokens) for s in part])
            grammar_s += structured.GRAMMAR_SECONDS[0] - before
            caps = [max(1, g.completion_tokens) for g in got]
            plain, t2 = await _decode(
                engine, [_request(s, False, c) for s, c in zip(part, caps, strict=True)]
            )
            cons, free, t_c, t_f = cons + got, free + plain, t_c + t, t_f + t2
            ok = sum(_valid(g.content, x) for g, x in zip(cons, schemas, strict=False))
            n_c, n_f = (
                sum(g.completion_tokens for g in cons),
                sum(g.completion_tokens for g in free),
            )
            print(
                f"{len(cons)}/{len(schemas)} schemas: valid {ok}, overhead "
                f"{(t_c / max(1, n_c)) / (t_f / max(1, n_f)) - 1:.3f}, grammar "
                f"{grammar_s / t_c:.4f}",
                file=sys.stderr,
                flush=True,
            )
        return cons, t_c, free, t_f, grammar_s

    cons, t_c, free, t_f, grammar_s = asyncio.run(both())
    n_c = sum(g.completion_tokens for g in cons)
    n_f = sum(g.completion_tokens for g in free)
    per_c, per_f = t_c / max(1, n_c), t_f / max(1, n_f)
    valid = sum(_valid(g.content, s) for g, s in zip(cons, schemas, strict=True))
    return {
        "model": model,
        "schemas": n_schemas,
        "batch": batch,
        "max_tokens": max_tokens,
        "valid_fraction": valid / n_schemas,
        "free_valid_fraction": sum(_valid(g.content, s) for g, s in zip(free, schemas, strict=True))
        / n_schemas,
        "constrained_tokens": n_c,
        "free_tokens": n_f,
        "constrained_ms_per_token": per_c * 1000,
        "free_ms_per_token": per_f * 1000,
        "overhead_fraction": per_c / per_f - 1.0,
        "grammar_fraction_of_decode": grammar_s / t_c,
        "compile_p50_ms": statistics.median(compile_ms),
        "compile_p99_ms": _pct(compile_ms, 0.99),
        "tokenizer_ms": tokenizer_ms,
    }


def print_structured_bench(**kwargs: Any) -> dict[str, Any]:
    out = run_structured_bench(**kwargs)
    for key, value in out.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{key:>28}  {shown}")
    print(json.dumps(out))
    return out


def command(cfg: StructuredBench) -> None:
    """`agentrl bench structured`."""
    print_structured_bench(**cfg.model_dump())
