"""The loop's warm start: the agents act only once a gateway routes everything to it (they
were served by the base while its adapter loaded, and the start was measured on the base)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agentrl.app.loop import _until_served
from agentrl.bus import Bus
from agentrl.serving.registry import Registry, ServingReport


async def test_waits_for_the_gateway_to_route_to_the_warm_start(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    tag = uuid.uuid4().hex[:8]
    registry = await Registry.open(bus.js, f"warm_{tag}")
    public, v1 = f"warm-{tag}", f"warm-{tag}-v1"

    def report(weights: dict[str, float], **kw: object) -> ServingReport:
        return ServingReport(gateway="g1", public_name=public, weights=weights, **kw)  # type: ignore[arg-type]

    await registry.report_serving(report({f"{public}-base": 100.0}))  # still loading v1
    waiting = asyncio.create_task(_until_served(registry, public, v1, timeout_s=30))
    await asyncio.sleep(1.0)
    assert not waiting.done()
    await registry.report_serving(report({v1: 100.0}, loaded=[v1]))
    await asyncio.wait_for(waiting, 10)

    await registry.report_serving(report({f"{public}-base": 100.0}, refused={v1: "bad manifest"}))
    with pytest.raises(RuntimeError, match=r"refused the warm start .*bad manifest"):
        await _until_served(registry, public, v1, timeout_s=10)
    with pytest.raises(RuntimeError, match="no gateway served"):
        await _until_served(registry, public, f"{public}-v2", timeout_s=1)
    await bus.close()


def test_the_warm_start_is_not_one_of_the_generations() -> None:
    """A warm start is live from the first second: counted as a decided generation, a
    one-generation loop with `--init-checkpoint` ended before its first job (measured)."""
    from agentrl.app.loop import trained_and_decided
    from agentrl.serving.registry import ModelRecord

    def rec(v: int, state: str, ckpt: str | None = "/ckpt") -> ModelRecord:
        return ModelRecord(
            model_id=f"p-v{v}" if v else "p-base",
            version=v,
            public_name="p",
            base_model="smollm2",
            checkpoint_path=ckpt,
            state=state,  # type: ignore[arg-type]
        )

    records = [rec(0, "retired", None), rec(1, "live"), rec(2, "candidate")]
    assert trained_and_decided(records, {None, "p-v1"}) == []  # v1: the warm start
    records[2].state = "rolled_back"
    records.append(rec(3, "rejected"))
    got = trained_and_decided(records, {"p-v1", "p-v3"})  # v3: injected by hand
    assert [r.model_id for r in got] == ["p-v2"]
    assert [r.model_id for r in trained_and_decided(records, {None})] == ["p-v1", "p-v2", "p-v3"]


def test_a_warm_started_runs_summary_counts_only_what_it_trained() -> None:
    """The one-line result of a warm-started run whose trained version was rejected: nothing
    promoted by the loop, no trained figure, the held-out size of the evaluated rows (the
    base is not evaluated there), no promotion time (it was 0 promoted and -43 s)."""
    from agentrl.app.loop import LoopResult, VersionRow

    start = VersionRow("p-v1", "live", 0.7, 0.57, 0.80, heldout_n=60, decision="promote")
    result = LoopResult(
        versions=[
            VersionRow("p-base", "retired", decision="bootstrap"),
            start,
            VersionRow("p-v2", "rejected", decision="reject"),
        ],
        start_model="p-v1",
    )
    got = result.summary()
    assert got["promoted"] == 0
    assert got["heldout_seeds"] == 60
    assert got["base_heldout_success"] is None
    assert got["start_heldout_success"] == got["live_heldout_success"] == 0.7
    assert got["trained_heldout_success"] is None  # no trained version was served
    assert got["best_heldout_success"] == 0.7
    assert got["loop_wall_s"] is None


def test_the_run_finishes_the_versions_already_through_validation() -> None:
    """The fresh-clone run of 2026-11-27 that reported 0.16: its sixth decided version came
    while v9 (0.54 held-out) had passed validation and was starting its canary, and the run
    ended there. The versions past validation at that moment are finished first; a
    candidate registered later (still unvalidated) is not waited for."""
    from agentrl.app.loop import passed_validation, undecided
    from agentrl.serving.registry import Decision, ModelRecord

    def rec(v: int, state: str, *actions: str) -> ModelRecord:
        r = ModelRecord(
            model_id=f"p-v{v}",
            version=v,
            public_name="p",
            base_model="smollm2",
            checkpoint_path="/ckpt",
            state=state,  # type: ignore[arg-type]
        )
        r.decisions = [Decision(by="c", action=a, reason="") for a in ("register", *actions)]
        return r

    records = [
        rec(7, "live", "validate", "promote"),
        rec(8, "retired", "validate", "supersede"),
        rec(9, "canary", "validate", "wait", "set_weight"),
        rec(10, "candidate", "validate", "wait"),
        rec(11, "candidate"),  # registered, not validated yet
        rec(12, "rejected", "validate", "reject"),
    ]
    assert passed_validation(records, {None}) == {"p-v9", "p-v10"}
    assert passed_validation(records, {"p-v9"}) == {"p-v10"}  # e.g. an injected version
    finishing = passed_validation(records, {None})
    records[2].state = "live"
    assert undecided(records, finishing) == {"p-v10"}
    records[3].state = "retired"  # superseded, or promoted and replaced
    assert undecided(records, finishing) == set()
