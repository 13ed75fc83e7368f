"""The tool-use agent's prompt, reply schema and scripted solutions: every scripted episode
succeeds in the real environment (sandboxed code_exe included), fits the token cap, and is
accepted token by token by the structured-outputs grammar of `response_schema`."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema_rs
import pytest

from agentrl.envs.tooluse import ToolUseEnv, solver
from agentrl.envs.tooluse.agent_prompt import (
    SYSTEM_PROMPT,
    THOUGHT_CHARS,
    TOOLS,
    Turn,
    messages_for,
    response_schema,
)
from agentrl.envs.tooluse.solver import SolvedEpisode, answer_from, solve_episode
from agentrl.envs.tooluse.tasks import FAMILIES

REPLY_TOKEN_CAP = 256  # agentrl.learners.tooluse's max_new_tokens per turn
SEEDS = 120  # 300 took 51 s of the suite (one sandboxed process per code run)


@pytest.fixture(scope="module")
def tokenizer():
    from agentrl.llm.loading import load_smollm2_tokenizer

    return load_smollm2_tokenizer()


def _solve_many(family: str, seeds: range) -> list[SolvedEpisode]:
    def run(chunk: list[int]) -> list[SolvedEpisode]:
        env = ToolUseEnv(family=family, max_steps=4)
        return [solve_episode(env, s) for s in chunk]

    chunks = [list(seeds)[i::4] for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        return [ep for part in pool.map(run, chunks) for ep in part]


@pytest.fixture(scope="module")
def solved() -> dict[str, list[SolvedEpisode]]:
    return {family: _solve_many(family, range(SEEDS)) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_scripted_solutions_succeed_in_the_environment(
    solved: dict[str, list[SolvedEpisode]], family: str, tokenizer
) -> None:
    episodes = solved[family]
    assert len(episodes) == SEEDS
    failed = [ep.seed for ep in episodes if not ep.success]
    assert failed == [], f"{family}: scripted solutions failed on seeds {failed[:10]}"
    longest = max(
        len(tokenizer(t.reply, add_special_tokens=False)["input_ids"])
        for ep in episodes
        for t in ep.turns
    )
    assert longest + 1 <= REPLY_TOKEN_CAP  # + EOS
    assert all(len(ep.turns) == 2 for ep in episodes)
    assert all(ep.turns[-1].tool_name == "response" for ep in episodes)


def test_scripted_replies_fit_the_schema_token_by_token(
    solved: dict[str, list[SolvedEpisode]], tokenizer
) -> None:
    from agentrl.serving.structured import Constraint, GrammarCompiler, _json_grammar, spec_hash

    schema = response_schema()
    validator = jsonschema_rs.validator_for(schema)
    compiler = GrammarCompiler(tokenizer, len(tokenizer))
    start = compiler.compile(Constraint("json_schema", _json_grammar(schema), spec_hash(schema)))
    for family in FAMILIES:
        for ep in solved[family][:15]:
            for turn in ep.turns:
                assert validator.is_valid(json.loads(turn.reply)), turn.reply
                matcher = start.deep_copy()
                ids = tokenizer(turn.reply, add_special_tokens=False)["input_ids"]
                assert all(matcher.consume_token(i) for i in ids), (turn.reply, matcher.get_error())
                assert matcher.consume_token(tokenizer.eos_token_id) and matcher.is_stopped()


def test_schema_ties_arguments_to_the_named_tool() -> None:
    validator = jsonschema_rs.validator_for(response_schema())
    good = {"thoughts": ["x"], "tool_name": "calculator", "tool_args": {"expression": "1+2"}}
    assert validator.is_valid(good)
    wrong_args = {**good, "tool_args": {"code": "1+2"}}
    assert not validator.is_valid(wrong_args)
    two_thoughts = {**good, "thoughts": ["a", "b"]}
    assert not validator.is_valid(two_thoughts)
    long_thought = {**good, "thoughts": ["x" * (THOUGHT_CHARS + 1)]}
    assert not validator.is_valid(long_thought)
    assert validator.is_valid({**good, "thoughts": ["x" * THOUGHT_CHARS]})
    for thought in (solver.THOUGHT_CALC, solver.THOUGHT_CODE, solver.THOUGHT_ANSWER):
        assert validator.is_valid({**good, "thoughts": [thought]})
    unknown_tool = {**good, "tool_name": "search_engine"}
    assert not validator.is_valid(unknown_tool)
    assert validator.is_valid({**good, "headline": "Computing"})


def test_prompt_lists_the_tools_and_offers_nothing_to_copy() -> None:
    for tool in TOOLS:
        assert f"### {tool}" in SYSTEM_PROMPT
    for field in ("thoughts", "headline", "tool_name", "tool_args"):
        assert f"{field}:" in SYSTEM_PROMPT
    # no example arguments: no expressions, no code, no JSON values the model could copy
    assert not re.search(r"\d\s*[-+*/]\s*\d|print\(|[{}\[\]]", SYSTEM_PROMPT)


def test_messages_show_tool_results_as_agent_zero_does() -> None:
    history = [Turn('{"a": 1}', "calculator: 1+2 = 3", "calculator")]
    msgs = messages_for("What is 1+2?", history)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[1]["content"] == "What is 1+2?"
    assert json.loads(msgs[3]["content"]) == {
        "tool_name": "calculator",
        "tool_result": "calculator: 1+2 = 3",
    }


def test_long_tool_output_is_cut_to_head_and_tail() -> None:
    from agentrl.envs.tooluse.agent_prompt import RESULT_CHARS, tool_result_message

    long = "Traceback\n" + "x" * 5000 + "\nValueError: the end"
    shown = json.loads(tool_result_message("code_exe", long)["content"])["tool_result"]
    assert len(shown) < RESULT_CHARS + 60
    assert shown.startswith("Traceback") and shown.endswith("ValueError: the end")
    short = "calculator: 1+2 = 3"
    assert json.loads(tool_result_message("calculator", short)["content"])["tool_result"] == short


@pytest.mark.parametrize(
    ("result", "answer"),
    [
        ("calculator: (1 - 2) * 3 = -3\n(Steps left: 3. Finish with the response tool.)", "-3"),
        ("code_exe exit code 0\nstdout:\n12.5\n\n(Steps left: 3. Finish.)", "12.5"),
        ("code_exe exit code 0\nstdout:\nOslo\n", "Oslo"),
    ],
)
def test_answer_is_read_off_the_tool_output(result: str, answer: str) -> None:
    assert answer_from(result) == answer


def _lines(question: str) -> list[str]:
    """The question's table lines, cells joined by ',' (a CSV line as it is, a markdown
    row's cells stripped), the markdown rule left out."""
    out = []
    for line in question.splitlines():
        if line.startswith("|") and not set(line) <= set("|-"):
            out.append(",".join(c.strip() for c in line.strip().strip("|").split("|")))
        elif line.count(",") == 2 and " " not in line:
            out.append(line)
    return out


@pytest.mark.parametrize("pool", ["train", "unseen"])
def test_the_shown_data_program_copies_the_table_in_the_order_shown(pool: str) -> None:
    """`data_program(task, "shown")` (issue 52, s33): the header and every cell as the
    question shows them, in its order, so writing the program is a copy, not the canonical
    form's reordering of every row (the light warm start never wrote a right canonical
    table at temperature 1). A CSV or markdown table's lines, cell for cell, are the
    program's header and rows."""
    import ast

    from agentrl.envs.tooluse.tasks import generate_task

    checked = 0
    for seed in range(80):
        task = generate_task(seed, "data", pool)
        lines = _lines(task.question)
        if not lines:  # rows as sentences: the canonical order is the order shown
            continue
        head, rows = solver.data_program(task, "shown").split("\n")[:2]
        assert head.startswith("C=[") and rows.startswith("R=[")
        header = list(ast.literal_eval(head[2:]))
        assert header == list(task.spec["columns"])
        # each cell as printed ("0.80", not 0.8): the literal's text holds it verbatim
        written = [",".join(c.strip("'") for c in r.split(",")) for r in _tuples(rows)]
        assert [",".join(header), *written] == lines, task.question
        checked += 1
    assert checked >= 15
    canonical = solver.data_program(generate_task(13, "data"), "canonical")
    assert canonical.startswith("R=[") and "C=[" not in canonical
    task = generate_task(13, "data")  # the warm start's form stays the default
    assert solver.first_reply(task) == solver.first_reply(task, "canonical")


def _tuples(literal: str) -> list[str]:
    """'[(a,b),(c,d)]' -> ['a,b', 'c,d'] (the literal's text, cells as written)."""
    return re.findall(r"\(([^()]*)\)", literal)


@pytest.mark.parametrize("pool", ["train", "unseen"])
def test_shown_data_programs_succeed_and_fit_the_token_cap(pool: str, tokenizer) -> None:
    env = ToolUseEnv(family="data", max_steps=4, pool=pool)
    for seed in range(10):
        ep = solve_episode(env, seed, "shown")
        assert ep.success, (seed, ep.turns[0].reply)
        assert "C=[" in ep.turns[0].reply
        n = len(tokenizer(ep.turns[0].reply, add_special_tokens=False)["input_ids"])
        assert n + 1 <= REPLY_TOKEN_CAP
    with pytest.raises(ValueError, match="data program form"):
        solver.data_program(env.task, "sorted")  # type: ignore[arg-type]
