"""The tool-use generator's two pools (issue 52): training phrases every kind many ways;
the unseen pool asks with wordings, table layouts and kinds the training generator never
produces, so a model (or a matcher) that learned the training templates fails it. Checked
by construction (the template sets) and by sampling (thousands of generated questions)."""

from __future__ import annotations

import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentrl.envs.tooluse import ToolUseEnv
from agentrl.envs.tooluse.phrasings import longest_literal, template_regex, templates
from agentrl.envs.tooluse.solver import solve_episode
from agentrl.envs.tooluse.tasks import FAMILIES, generate_task, question_kind
from agentrl.learners.tooluse import HELDOUT_OFFSET, ToolUseConfig

TRAIN_SAMPLES = 1500  # per family: training seeds and held-out seeds alike
UNSEEN_SAMPLES = 300  # per family


@pytest.fixture(scope="module")
def train_questions() -> list[str]:
    seeds = [
        *range(TRAIN_SAMPLES // 2),
        *range(HELDOUT_OFFSET, HELDOUT_OFFSET + TRAIN_SAMPLES // 2),
    ]
    return [generate_task(s, f).question for f in FAMILIES for s in seeds]


@pytest.fixture(scope="module")
def unseen_questions() -> list[str]:
    return [
        generate_task(HELDOUT_OFFSET + s, f, "unseen").question
        for f in FAMILIES
        for s in range(UNSEEN_SAMPLES)
    ]


def test_the_pools_templates_are_disjoint_by_construction() -> None:
    train, unseen = templates("train"), templates("unseen")
    assert train and unseen
    assert not set(train) & set(unseen)
    assert not set(train.values()) & set(unseen.values())
    # the training generator says each kind many ways: >= 3 wordings of every kind
    per_kind = Counter(k.rsplit("/", 1)[0] for k in train if "/q/" in k)
    assert per_kind and min(per_kind.values()) >= 3, per_kind
    with pytest.raises(ValueError, match="pool"):
        templates("both")


def test_no_training_question_matches_an_unseen_template(train_questions: list[str]) -> None:
    for tid, text in templates("unseen").items():
        literal = longest_literal(text)
        assert len(literal) >= 12, (tid, literal)
        assert not any(literal in q for q in train_questions), (tid, literal)
        rx = template_regex(text)
        hit = next((q for q in train_questions if rx.search(q)), None)
        assert hit is None, (tid, hit)


def test_a_training_template_matcher_fails_the_unseen_pool(
    train_questions: list[str], unseen_questions: list[str]
) -> None:
    """A matcher of every training template recognises every training question and no
    unseen one: what only matches templates cannot read the unseen pool."""
    matchers = [template_regex(t) for t in templates("train").values()]
    own = [template_regex(t) for t in templates("unseen").values()]
    assert all(any(m.search(q) for m in matchers) for q in train_questions[::7])
    assert all(any(m.search(q) for m in own) for q in unseen_questions)
    caught = [q for q in unseen_questions if any(m.search(q) for m in matchers)]
    assert caught == []


def test_the_unseen_pool_asks_kinds_training_never_asks() -> None:
    train = {question_kind(generate_task(s, f)) for f in FAMILIES for s in range(600)}
    unseen = Counter(
        question_kind(generate_task(HELDOUT_OFFSET + s, f, "unseen"))
        for f in FAMILIES
        for s in range(UNSEEN_SAMPLES)
    )
    new = {k for k in unseen if k not in train}
    for family in FAMILIES:
        assert any(k.startswith(f"{family}:") for k in new), family
        share = sum(n for k, n in unseen.items() if k in new and k.startswith(family))
        assert share >= 0.3 * UNSEEN_SAMPLES, (family, share)
    # training: the kinds the warm start balances (4 arithmetic, 6 data, 4 numbers)
    assert Counter(k.split(":")[0] for k in train) == {"arithmetic": 4, "data": 6, "numbers": 4}


def test_training_phrases_tables_in_several_layouts_and_orders() -> None:
    questions = [generate_task(s, "data").question for s in range(300)]
    assert any(q.lstrip().startswith("|") or "\n|" in q for q in questions)  # markdown
    assert any(" costs " in q for q in questions)  # prose rows
    csv_heads = {q.split("\n")[2] for q in questions if q.split("\n")[2].count(",") == 2
                 and q.split("\n")[2].replace(",", "").isalpha()}  # fmt: skip
    assert len(csv_heads) >= 3  # columns in several orders
    assert any(q.rstrip().endswith("?") and q.index("?") > q.index("\n") for q in questions)


def test_every_family_has_enough_distinct_heldout_tasks() -> None:
    """>= 200 held-out tasks, >= 60 distinct questions in each family (a repeated question
    would count one task twice); the unseen pool >= 60 distinct in each family too."""
    cfg = ToolUseConfig()
    held = cfg.heldout()
    assert len(held) >= 200
    for family in FAMILIES:
        seeds = [s for f, s in held if f == family]
        assert len({generate_task(s, family).question for s in seeds}) >= 60, family
        unseen = {generate_task(HELDOUT_OFFSET + k, family, "unseen").question for k in range(70)}
        assert len(unseen) >= 60, family  # available beyond the default's 30 a family
    pool = cfg.unseen()
    assert len(pool) >= 60 and all(n >= 20 for n in Counter(f for f, _ in pool).values())
    assert len({generate_task(s, f, "unseen").question for f, s in pool}) == len(pool)
    assert min(s for _, s in pool) >= HELDOUT_OFFSET


@pytest.mark.parametrize("family", FAMILIES)
def test_the_unseen_pool_is_solvable_in_the_environment(family: str) -> None:
    """Every unseen task has a right answer a program can reach: the scripted solution
    (written from the task's spec, never its answer) succeeds in the real environment."""

    def run(seeds: list[int]) -> list[bool]:
        env = ToolUseEnv(family=family, max_steps=4, pool="unseen")
        return [solve_episode(env, s).success for s in seeds]

    seeds = [HELDOUT_OFFSET + s for s in range(24)]
    with ThreadPoolExecutor(2) as pool:
        results = [ok for part in pool.map(run, [seeds[0::2], seeds[1::2]]) for ok in part]
    assert all(results)


def test_word_problems_never_ask_for_a_negative_count() -> None:
    """A warehouse cannot send out more crates than it holds: every training word problem's
    answer and the part it subtracts are counts (s33 found "had 594 crates and sent out 879"),
    and its recorded expression still evaluates to its answer. Plain expressions may stay
    negative."""
    seeds = [*range(2000), *range(HELDOUT_OFFSET, HELDOUT_OFFSET + 2000)]
    words = [t for s in seeds if "/word/" in (t := generate_task(s, "arithmetic")).phrasing]
    assert len(words) > 800
    for task in words:
        assert task.answer >= 0, task.question
        assert eval(task.spec["expression"], {"__builtins__": {}}) == task.answer
        if task.kind == "sub_mul_add":  # the crates sent out are at most the crates held
            held, sent = (int(n) for n in re.findall(r"\d+", task.question)[:2])
            assert sent <= held, task.question
    plain = [generate_task(s, "arithmetic") for s in range(2000)]
    assert any(t.answer < 0 for t in plain if "/plain/" in t.phrasing)
