"""Ape-X on a real local Ray instance: 2 actors, 2 replay shards, parameter syncs observed."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.offpolicy.apex import ApexTrainer, actor_epsilons
from agentrl.offpolicy.config import load_config
from agentrl.offpolicy.events import EventDispatcher, ParameterSyncEvent, ReplayUpdateEvent
from agentrl.offpolicy.registry import EntityRegistry

CARTPOLE = Path(__file__).resolve().parents[2] / "configs" / "cartpole.yaml"


def test_actor_epsilons_follow_apex_schedule() -> None:
    eps = actor_epsilons(8)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    assert eps[3] == pytest.approx(0.4 ** (1 + 7 * 3 / 7))
    assert all(a > b for a, b in itertools.pairwise(eps))
    assert actor_epsilons(1) == [0.4]
    with pytest.raises(ValueError):
        actor_epsilons(0)


@pytest.fixture(scope="module")  # one start for the file: 15-25 s on 2 busy cores
def local_ray() -> Iterator[None]:
    import ray

    from agentrl.offpolicy.apex import ensure_ray

    ensure_ray(None, num_cpus=2)  # waits for a slow raylet; tried again if it ended
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_apex_two_actors_two_shards(local_ray: None) -> None:
    # 1,500 env steps (3,000 before): measured 264-432 learner updates (the checks need 25),
    # 9-17 parameter versions loaded by each actor, an evaluation at 750; at load 6-7 the
    # training took 16-18 s instead of 29-38 s
    cfg = load_config(
        CARTPOLE,
        total_steps=1500,
        **{
            "distributed.replay_shards": 2,
            "distributed.param_sync_interval": 25,
            "distributed.actor_chunk_steps": 50,
            "distributed.actor_num_cpus": 0.5,
            "distributed.shard_num_cpus": 0.25,
            "dqn.learning_starts": 400,
            "replay.batch_size": 64,
            "evaluation.every_env_steps": 750,
            "evaluation.episodes": 2,
            "network.hidden": [32],
            "kernel_smoothing.latent_dim": 32,
        },
    )
    dispatcher = EventDispatcher()
    syncs: list[ParameterSyncEvent] = []
    replay_events: list[ReplayUpdateEvent] = []
    dispatcher.subscribe(syncs.append, ParameterSyncEvent)
    dispatcher.subscribe(replay_events.append, ReplayUpdateEvent)
    registry = EntityRegistry()
    result = ApexTrainer(
        cfg, num_actors=2, dispatcher=dispatcher, registry=registry, run_id="apex"
    ).train()

    assert result.env_steps >= 1500 and result.updates >= 25
    # version 0 at start, then one broadcast every 25 learner updates
    assert [s.model_version for s in syncs] == list(range(len(syncs)))
    assert len(syncs) == 1 + result.updates // 25 >= 2
    assert len({s.checksum for s in syncs}) == len(syncs)  # parameters changed between syncs
    assert all(s.learner_id == "learner-apex" for s in syncs)
    # actors loaded broadcast parameters (checksum verified on their side)
    assert len(result.extra["actor_model_versions"]) == 2
    assert all(v >= 1 for v in result.extra["actor_model_versions"])
    # both shards were filled by their actors, with actor-computed priorities
    assert all(size > 0 for size in result.extra["shard_sizes"])
    assert {e.shard_id for e in replay_events} == {0, 1}
    assert all(e.priority_stats["max"] > 0 for e in replay_events)
    assert result.extra["actor_epsilons"] == pytest.approx(actor_epsilons(2))
    assert registry.versions("PopulationMetricsEntity", "apex")
    assert result.eval_rows and result.eval_rows[0]["population"]["entropy"] > 0


def test_apex_refuses_more_actors_than_the_cluster_can_place(local_ray: None) -> None:
    from agentrl.core.errors import ConfigError

    cfg = load_config(CARTPOLE, **{"distributed.actor_num_cpus": 1.0})
    with pytest.raises(ConfigError, match="actor_num_cpus"):
        ApexTrainer(cfg, num_actors=3).train()  # 3 + 4 x 0.25 CPUs > the fixture's 2


def test_a_local_ray_that_misses_its_start_window_is_started_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A raylet can end before it registers (its dashboard agent missed Ray's fixed 15 s on a
    busy machine). `ensure_ray` ends what the failed start left behind (a real child process
    here) and starts once more; any other error is raised at once. Ray's own wait for the
    raylet is lengthened where the environment does not say otherwise."""
    import subprocess
    import sys

    import ray

    from agentrl.offpolicy import apex

    leftovers: list[subprocess.Popen[bytes]] = []
    calls: list[dict[str, object]] = []

    def init(**kw: object) -> None:
        calls.append(kw)
        if len(calls) == 1:  # what a timed-out start leaves: a process of Ray's, still running
            leftovers.append(
                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "raylet"])
            )
            raise Exception("The current node timed out during startup. This could happen ...")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.delenv("RAY_raylet_start_wait_time_s", raising=False)
    monkeypatch.setenv("RAY_enable_worker_prestart", "1")  # the environment's own word wins
    assert apex.ensure_ray(None, num_cpus=2) is True
    assert len(calls) == 2 and calls[1]["num_cpus"] == 2
    assert {name: os.environ.get(name) for name in apex.LOCAL_RAY_ENV} == {
        "RAY_raylet_start_wait_time_s": "60",  # Ray's own knob: a slow raylet is waited for
        "RAY_enable_worker_prestart": "1",
    }
    leftovers[0].wait(timeout=10)  # it sleeps 60 s: ended, not left to run (else it times out)

    def broken(**kw: object) -> None:
        raise RuntimeError("some other failure")

    monkeypatch.setattr(ray, "init", broken)
    with pytest.raises(RuntimeError, match="some other failure"):
        apex.ensure_ray(None)
    calls.clear()
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw) or failed_start())
    with pytest.raises(Exception, match="timed out during startup"):
        apex.ensure_ray(None)  # the last resort is one more start, not more
    assert len(calls) == apex.LOCAL_RAY_TRIES == 2


def failed_start() -> None:
    raise Exception("The current node timed out during startup. This could happen ...")
