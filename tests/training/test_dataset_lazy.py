"""A dataset job reads only what it samples (`dataset.sample_from_stream`): the trajectory
ids come from a headers-only read, the rewards are read whole, and only the sampled payloads
are fetched. Its sample is the full read's `seeded_sample` for the same seed whenever the
content filters remove none of the candidates; otherwise the documented rule (`draw_order`:
replacements from a seeded permutation). Any doubt falls back to the full read (None)."""

from __future__ import annotations

import json
from typing import Any

import nats as nats_client
import numpy as np
from nats.js.api import StreamConfig

from agentrl.contracts.training import DatasetFilter
from agentrl.training.dataset import (
    FilterReport,
    _fetch_seqs_api,
    apply_filters,
    draw_order,
    fetch_seqs,
    header_msg_id,
    latest_rewards,
    parse_all,
    read_located,
    read_subject,
    sample_from_stream,
    seeded_sample,
)

SUBJECT = "agent.rl.trajectory.v1"


def _traj(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "trajectory_id": f"t-{i:05d}",
        "end_timestamp": f"2026-11-20T12:{i // 60 % 60:02d}:{i % 60:02d}+00:00",
        "turns": [{"turn_id": 1, "action": {"type": "response", "raw_response": "x"}}],
        "task_context": {"task_id": f"task-{i % 9}", "domain": "coding"},
        "metadata": {},
        **extra,
    }


def _reward(i: int, total: float, version: int = 1) -> dict[str, Any]:
    return {"trajectory_id": f"t-{i:05d}", "total_reward": total, "version": version}


async def _setup(js: Any, trajs: list[tuple[str, dict[str, Any] | bytes]]) -> None:
    await js.add_stream(StreamConfig(name="TRAJ", subjects=[SUBJECT]))
    for mid, t in trajs:
        data = t if isinstance(t, bytes) else json.dumps(t).encode()
        await js.publish(SUBJECT, data, headers={"Nats-Msg-Id": mid})


def _full(trajs: list[dict[str, Any]], rewards: dict[str, Any], flt: DatasetFilter, size: int):
    recs, report = apply_filters(trajs, rewards, flt)
    return seeded_sample(recs, size, 3), report


async def _lazy(js: Any, rewards: dict[str, Any], flt: DatasetFilter, size: int, **kw: Any):
    return await sample_from_stream(js, "TRAJ", SUBJECT, rewards, flt, size, 3, **kw)


def test_draw_order_starts_with_the_seeded_sample_then_permutes_the_rest():
    for n, size, seed in ((50, 7, 0), (1000, 40, 5), (30_000, 600, 1), (12, 12, 2)):
        order = list(draw_order(n, size, seed))
        expect = sorted(np.random.default_rng(seed).choice(n, size=size, replace=False).tolist())
        assert order[:size] == expect
        assert sorted(order) == list(range(n))
        assert order == list(draw_order(n, size, seed))  # deterministic


def test_header_msg_id():
    assert header_msg_id(b"NATS/1.0\r\nNats-Msg-Id: abc\r\nNats-Msg-Size: 9\r\n\r\n") == "abc"
    assert header_msg_id(b"NATS/1.0\r\nNats-Msg-Size: 9\r\n\r\n") is None


async def test_lazy_sample_equals_the_full_reads_for_the_same_seed(nats):
    nc = await nats_client.connect(nats.url)
    js = nc.jetstream()
    try:
        trajs = [_traj(i) for i in range(400)]
        items: list[tuple[str, dict[str, Any] | bytes]] = [(t["trajectory_id"], t) for t in trajs]
        await _setup(js, items)
        # every 5th has no reward (bad row), two reward versions for some, min_reward cuts
        raw = [_reward(i, (i % 7) / 6) for i in range(400) if i % 5]
        raw += [_reward(i, 1.0, version=2) for i in range(0, 400, 11) if i % 5]
        rewards = latest_rewards(raw)
        for flt in (DatasetFilter(), DatasetFilter(min_reward=0.3)):
            old, old_report = _full(trajs, rewards, flt, 40)
            got = await _lazy(js, rewards, flt, 40)
            assert got is not None
            new, report = got
            assert [r.trajectory_id for r in new] == [r.trajectory_id for r in old]
            assert [r.trajectory for r in new] == [r.trajectory for r in old]
            assert [r.reward for r in new] == [r.reward for r in old]
            assert report.removed == old_report.removed
            assert report.kept == old_report.kept
            assert report.trajectories == old_report.trajectories == 400
        assert (await js.stream_info("TRAJ")).state.consumer_count == 0
    finally:
        await nc.close()


async def test_content_filters_remove_drawn_ones_and_the_rule_replaces_them(nats):
    nc = await nats_client.connect(nats.url)
    js = nc.jetstream()
    try:
        out = {i for i in range(0, 300, 4)}  # opted out yet rewarded, or too long
        trajs = [
            _traj(i, metadata={"rl_opt_out": True})
            if i % 8 == 0
            else _traj(i, turns=[{"turn_id": k} for k in range(5)])
            if i in out
            else _traj(i)
            for i in range(300)
        ]
        await _setup(js, [(t["trajectory_id"], t) for t in trajs])
        rewards = latest_rewards([_reward(i, 0.5) for i in range(300)])
        flt = DatasetFilter(max_trajectory_length=3)
        got = await _lazy(js, rewards, flt, 50)
        assert got is not None
        new, report = got
        ids = [r.trajectory_id for r in new]
        assert len(new) == 50 and ids == sorted(ids)
        assert not {f"t-{i:05d}" for i in out} & set(ids)
        # the documented rule, computed from the full data
        cands = sorted(rewards)
        ok = {r.trajectory_id for r in apply_filters(trajs, rewards, flt)[0]}
        expect = []
        for i in draw_order(len(cands), 50, 3):
            if cands[i] in ok:
                expect.append(cands[i])
            if len(expect) == 50:
                break
        assert set(ids) == set(expect)
        assert report.removed["opted_out"] + report.removed["max_trajectory_length"] > 0
        again = await _lazy(js, rewards, flt, 50)
        assert again is not None and [r.trajectory_id for r in again[0]] == ids
    finally:
        await nc.close()


async def test_any_doubt_reads_everything(nats):
    nc = await nats_client.connect(nats.url)
    js = nc.jetstream()
    try:
        trajs = [_traj(i) for i in range(100)]
        items: list[tuple[str, dict[str, Any] | bytes]] = [(t["trajectory_id"], t) for t in trajs]
        await _setup(js, items)
        rewards = latest_rewards([_reward(i, 0.5) for i in range(100)])
        flt = DatasetFilter()
        assert await _lazy(js, rewards, flt, 100) is None  # the sample is everything
        assert await _lazy(js, rewards, flt, 10, newest_guided=lambda t: True) is None
        probe: list[int] = []
        got = await _lazy(js, rewards, flt, 10, newest_guided=lambda t: probe.append(len(t)))
        assert got is not None and len(got[0]) == 10 and probe == [10]  # min(size, GUIDED_PROBE)
        located = await read_located(js, "TRAJ", SUBJECT)
        assert located is not None
        assert located[:2] == [("t-00000", 1), ("t-00001", 2)] and located[-1][1] == 100
        # a msg id that is not the payload's id (would be fetched): read everything
        await js.publish(SUBJECT, json.dumps(_traj(500)).encode(), headers={"Nats-Msg-Id": "x"})
        bad = {**rewards, "x": _reward(500, 0.5)}
        assert await sample_from_stream(js, "TRAJ", SUBJECT, bad, flt, 100, 3) is None
        # a message that is not JSON among the sample: read everything (it is skipped there)
        await js.publish(SUBJECT, b"not json", headers={"Nats-Msg-Id": "t-00600"})
        bad = {**rewards, "t-00600": _reward(600, 0.5)}
        assert await sample_from_stream(js, "TRAJ", SUBJECT, bad, flt, 100, 3) is None
        # a message without an id, then a deleted one: positions are not sequences
        await js.publish(SUBJECT, json.dumps(_traj(700)).encode())
        assert await read_located(js, "TRAJ", SUBJECT) is None
        await js.delete_msg("TRAJ", 5)
        assert await read_located(js, "TRAJ", SUBJECT) is None
        # a fetch of a message that is gone: None; the raw fetch equals nats-py's get_msg
        assert await fetch_seqs(js, "TRAJ", [4, 5]) is None
        got4 = await fetch_seqs(js, "TRAJ", [4, 6])
        assert got4 == await _fetch_seqs_api(js, "TRAJ", [4, 6])
        assert got4 is not None and json.loads(got4[4]) == trajs[3]
        assert await _fetch_seqs_api(js, "TRAJ", [5]) is None
    finally:
        await nc.close()


async def test_load_data_with_a_seed_reads_only_the_sample(nats):
    """The job's loader: with a seed, `sampled` holds the same records as the full read's
    sample; without one (the old call), everything is read."""
    from agentrl.bench.training import _publish
    from agentrl.bus import Bus
    from agentrl.core.settings import Settings
    from agentrl.training.jobs import load_data
    from agentrl.training.requests import fill_request
    from agentrl.training.settings import TrainingSettings

    bus = await Bus.connect(nats.url, settings=Settings(nats_url=nats.url))
    try:
        await bus.ensure_streams()
        await _publish(bus, 300)
    finally:
        await bus.close()
    req = fill_request(
        {"training_config": {"base_model": "tiny", "dataset": {"sample_size": 25}}},
        TrainingSettings(),
    )
    spec = {"request": req.model_dump(mode="json"), "nats_url": nats.url}
    lazy = await load_data(spec, seed=4)
    full = await load_data(spec)
    assert "sampled" in lazy and "sampled" not in full
    assert len(full["trajectories"]) == 300 and len(lazy["trajectories"]) == 25
    records, report = lazy["sampled"]
    old, old_report = apply_filters(
        full["trajectories"], latest_rewards(full["rewards"]), DatasetFilter()
    )
    old = seeded_sample(old, 25, 4)
    assert [r.trajectory for r in records] == [r.trajectory for r in old]
    assert report.trajectories == old_report.trajectories == 300
    assert isinstance(report, FilterReport) and report.rewards == 300
    nc = await nats_client.connect(nats.url)
    try:
        raw = parse_all(await read_subject(nc.jetstream(), "RL_REWARDS", "agent.rl.reward.v1"))
        assert len(raw) == 300
    finally:
        await nc.close()


async def test_only_the_named_completions_are_fetched(nats):
    """The completion log of a lazy job: the records its sample's turns name, no others;
    an id not in the log is left out (the turn is re-tokenised, as before); a record whose
    id is not its msg id makes the job read the whole log."""
    from agentrl.training.dataset import fetch_by_ids
    from agentrl.training.jobs import COMPLETION_STREAM, COMPLETION_SUBJECT, completion_ids

    nc = await nats_client.connect(nats.url)
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=COMPLETION_STREAM, subjects=[COMPLETION_SUBJECT]))
        for i in range(60):
            body = json.dumps({"completion_id": f"c{i}", "prompt_token_ids": [i]}).encode()
            await js.publish(COMPLETION_SUBJECT, body, headers={"Nats-Msg-Id": f"c{i}"})
        trajs = [
            {"turns": [{"action": {"completion_id": "c7"}}, {"action": {"completion_id": "c3"}}]},
            {"turns": [{"action": {"completion_id": "gone"}}, {"action": {}}]},
        ]
        ids = completion_ids(trajs)
        assert ids == {"c3", "c7", "gone"}
        got = await fetch_by_ids(js, COMPLETION_STREAM, COMPLETION_SUBJECT, ids, "completion_id")
        assert got is not None
        assert [json.loads(b)["completion_id"] for b in got] == ["c3", "c7"]
        assert await fetch_by_ids(js, COMPLETION_STREAM, COMPLETION_SUBJECT, [], "x") == []
        body = json.dumps({"completion_id": "other"}).encode()
        await js.publish(COMPLETION_SUBJECT, body, headers={"Nats-Msg-Id": "c99"})
        assert (
            await fetch_by_ids(js, COMPLETION_STREAM, COMPLETION_SUBJECT, {"c99"}, "completion_id")
            is None
        )
    finally:
        await nc.close()


def test_latest_rewards_equals_the_keyed_reference():
    """`latest_rewards` computes the (version, timestamp) key only on a collision: the same
    answer as keying every reward (the former code), ties keeping the first."""
    from agentrl.training.dataset import reward_version

    def reference(rewards):
        best = {}
        for r in rewards:
            tid = r.get("trajectory_id")
            if not tid:
                continue
            key = (reward_version(r), str(r.get("timestamp", "")))
            if tid not in best or key > best[tid][0]:
                best[tid] = (key, r)
        return {t: v[1] for t, v in best.items()}

    rng = np.random.default_rng(0)
    rewards = []
    for k in range(3000):
        r: dict[str, Any] = {"trajectory_id": f"t{rng.integers(0, 800)}", "n": k}
        kind = rng.integers(0, 4)
        if kind == 1:
            r["version"] = int(rng.integers(1, 4))
        elif kind == 2:
            r["metadata"] = {"version": int(rng.integers(1, 4))}
        if rng.integers(0, 2):
            r["timestamp"] = f"2026-11-2{rng.integers(0, 3)}"
        rewards.append(r)
    rewards += [{"n": -1}, {"trajectory_id": "", "n": -2}]
    got = latest_rewards(rewards)
    assert got == reference(rewards)
    assert all(got[t] is reference(rewards)[t] for t in got)


async def test_a_probe_with_none_of_the_jobs_own_trajectories_reads_everything(nats):
    """Two lineages on one stream: the newest trajectories are the other lineage's. The
    probe keeps none of them after the job's agent filter, so the job's data kind is
    unknown: read everything (before: an empty probe read as 'not valid-action', and a
    lineage's valid-action job took the token path and failed on its objective)."""
    nc = await nats_client.connect(nats.url)
    js = nc.jetstream()
    try:
        guided = {"turn_id": 1, "action": {"type": "response", "guided_choice": ["a", "b"]}}
        trajs = [_traj(i, agent_id="mine", turns=[guided]) for i in range(60)]
        trajs += [_traj(i, agent_id="other", turns=[guided]) for i in range(60, 100)]
        await _setup(js, [(t["trajectory_id"], t) for t in trajs])
        rewards = latest_rewards([_reward(i, 0.5) for i in range(100)])
        flt = DatasetFilter(agent_ids=["mine"])
        seen: list[int] = []

        def probe(t: list[dict[str, Any]]) -> bool:
            seen.append(len(t))
            return bool(t)

        assert await _lazy(js, rewards, flt, 10, newest_guided=probe) is None
        assert seen in ([], [0])  # an empty probe decides nothing
    finally:
        await nc.close()
