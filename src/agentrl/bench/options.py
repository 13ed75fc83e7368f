"""The settings of the benchmarks that have no options model in their own package: each
`agentrl bench NAME`'s options are a model's fields (their docstrings the help) and the
model's docstring is the command's help (`agentrl.bench.cli` draws them through
`agentrl.core.configcli`). Unset means the default written here: no option has a "0 means
default" value; a field whose unset value is "none" is Optional and reached with
`--set FIELD=null`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Options(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


class BusBench(_Options):
    """Publish N ~4 KB trajectory events (pipelined, with PubAcks and de-duplication ids),
    then consume and ack them with a durable pull consumer (acks confirmed). Targets on 2
    cores: publish >= raw nats-py publish_async in the same run, consume+ack >= 10,000
    msg/s, ack_pending_after 0, nothing lost or duplicated. With --cluster 3: R3 rates
    and the seconds from a stream-leader SIGKILL to publishing resumed."""

    n: int = Field(100_000, ge=1)
    """Number of messages."""
    url: str | None = None
    """Benchmark an existing server instead of the embedded one."""
    cluster: int | None = Field(None, ge=2)
    """Also run on a fresh cluster of this many local nats-servers (3): R3 publish/consume
    rates and a stream-leader SIGKILL while publishing."""
    failover_n: int = Field(20_000, ge=1)
    """Trajectories published during the leader-kill drill."""

    @classmethod
    def quick(cls, **kw: Any) -> BusBench:
        """20,000 messages instead of 100,000."""
        return cls(**{"n": 20_000, **kw})


class GigpoBench(_Options):
    """Time GiGPO advantages on synthetic gridworld batches against a dictionary peer.

    Batches: groups of 8 episodes of 1-15 steps walking a 6x6 room, anchors as fresh
    strings (rendered grids), so anchor groups recur as in real training.

    The peer computes the same advantages the way verl-agent does (dictionaries of ids,
    loops over rows); the table shows both times, the speedup and the largest difference.
    Goal: 100k rows in under 50 ms on one core.
    """

    sizes: str = "10000,100000,1000000"
    """Comma-separated batch sizes in step rows."""
    repeats: int = Field(5, ge=1)
    """Timed runs per size; the best is reported."""
    peer_max_rows: int = Field(1_000_000, ge=0)
    """Largest batch the dictionary peer is timed on (about 2-5 s per million rows)."""
    seed: int = 0
    """Seed of the synthetic batch."""


class RolloutBench(_Options):
    """Environment steps per second of a GiGPO group of episodes driven by a local model
    (a tiny random Llama with SmolLM2's tokenizer), generating for all episodes in one
    batched generation versus one episode at a time, and batched without sharing the
    group's common prompt prefix. Same task, seed and episode length for all; the last
    line is JSON with `batched_speedup` (goal >= 4).
    """

    env: str = "sokoban"
    """Environment id for agentrl.envs.make_env."""
    group: int = Field(8, ge=1)
    """Episodes per group (run concurrently)."""
    steps: int = Field(10, ge=1)
    """Steps per episode (the random model never solves it)."""
    max_new_tokens: int = Field(32, ge=1)
    """Tokens generated per action (a short think-then-act answer)."""
    history_window: int | None = Field(2, ge=0)
    """Past turns in each prompt; longer prompts cost more per call (`--set
    history_window=null`: all)."""
    repeats: int = Field(3, ge=1)
    """Timed groups per mode; the fastest is reported."""
    seed: int = 0
    """Seed of the level and of the model's weights."""
    threads: int | None = Field(1, ge=1)
    """Torch threads, one by default: on a shared machine extra threads wait on each other
    and make the timing noise, not the speed (`--set threads=null`: torch's default)."""


class LineagesBench(_Options):
    """One controller tick per lineage with 1 lineage and with MANY (registry and
    controllers on a real nats-server): one JSON line."""

    many: int = Field(100, ge=1)
    """Lineages of the large run (the small one has 1)."""
    rounds: int = Field(5, ge=1)
    """Ticks of every lineage measured."""


class CanaryBench(_Options):
    """False rollbacks and promoted worse canaries: sticky sessions through the real
    controller, split and monitor; and a small deployment (5 agents, sessions of 20)."""

    runs: int = Field(200, ge=1)
    """Rollouts of a canary identical to live."""
    worse_runs: int = Field(100, ge=1)
    """Rollouts of a canary 0.3 worse."""
    cap: int = Field(8000, ge=1)
    """Trajectories per rollout before it counts as held."""
    batch: int = Field(200, ge=1)
    """Trajectories between two looks of the monitor."""
    small_runs: int = Field(200, ge=1)
    """Small deployment: identical canaries."""
    small_worse_runs: int = Field(100, ge=1)
    """Small deployment: 0.3 worse."""
    small_better_runs: int = Field(100, ge=1)
    """Small deployment: 0.3 better."""
    small_cap: int = Field(2000, ge=1)
    """Small deployment: the deadline, episodes."""

    @classmethod
    def quick(cls, **kw: Any) -> CanaryBench:
        """A smoke test: 6 + 4 shorter rollouts."""
        small = {"small_runs": 4, "small_worse_runs": 3, "small_better_runs": 3}
        return cls(**{"runs": 6, "worse_runs": 4, "cap": 12_000, **small, **kw})


class GatewayBench(_Options):
    """Gateway overhead, rollback time, batching factor, split accuracy.

    \b
    Beside other gateways (installed once, then cached):
      agentrl bench gateway --peers --only tensorzero,litellm
    Interleaved rounds, where a shared host's load drifts:
      agentrl bench gateway --peers --interleave 5 --only agentrl-w2,tensorzero
    """

    duration: float = Field(3.0, gt=0)
    """Seconds of load per request rate."""
    model: str = "tiny"
    """Local model for the batching figure."""
    tokens: int = Field(32, ge=1)
    """Completion tokens per request (batching)."""
    period: float = Field(2.0, gt=0)
    """Monitor period for the rollback figure."""
    latency_only: bool = False
    """Only the added-latency figures."""
    repeat: int = Field(1, ge=1)
    """Latency runs per rate (the median is reported)."""
    peers: bool = False
    """Side by side with LiteLLM's proxy, Portkey's gateway and TensorZero's (installed once
    into ~/.cache/agentrl/bench-peers): added latency, max rate, CPU."""
    only: str = "litellm,portkey,tensorzero"
    """With --peers: which peers, comma-separated; also agentrl's own gateway under another
    server, loop or scheduler slice: agentrl-asyncio, agentrl-granian,
    agentrl-granian-asyncio, agentrl-h11, agentrl-slice, agentrl-w2 and agentrl-w3 (2 or 3
    gateway processes on one port: `agentrl up --gateway-workers`); and the compiled front
    (`agentrl up --gateway-front rust`): agentrl-rust, agentrl-rust-t2 (two threads),
    agentrl-rust-nolog (no completion log)."""
    interleave: int | None = Field(None, ge=1)
    """With --peers: agentrl and every peer started at once, then N rounds of one short
    non-streamed run each in turn (medians and each round's figures)."""
    rates: str = "1000"
    """With --interleave: request rates, comma-separated."""


class StructuredBench(_Options):
    """Structured outputs: valid fraction, added time per token, grammar compile time."""

    model: str = "smollm2"
    """Local model: smollm2 or tiny (random)."""
    n_schemas: int = Field(200, ge=1)
    """Generated JSON Schemas (one prompt each)."""
    max_tokens: int = Field(160, ge=1)
    """Completion token cap per request."""
    batch: int = Field(8, ge=1)
    """Max batch size of the local engine."""
    seed: int = 0
    """Seed of the schemas and the model."""


class ServingBench(_Options):
    """The local backend and vLLM, same model, same prompts, through the gateway:
    requests/s, output tokens/s, p50/p99 latency, adapter load seconds; and the local
    engine's prefix cache on a 5,408-token Agent Zero prompt; N lineages' adapters in one
    batch (`multilora_tokens_per_s_{1,4,16}`, `adapter_mib`); one JSON line. Order: the
    multi-LoRA part, the prefix part, then vLLM and the load levels in what is left of
    the budget (what does not fit is listed under `skipped`)."""

    model: str = "smollm2"
    """Base model: smollm2, or tiny (random)."""
    prompts: int = Field(256, ge=1)
    """Prompts, the same for both backends."""
    concurrency: str = "1,8,32"
    """Concurrency levels, comma-separated."""
    max_tokens: int = Field(32, ge=1)
    """Completion tokens per request."""
    budget_s: float | None = Field(540.0, gt=0)
    """Seconds for the whole bench: the prefix-cache part first, then vLLM's start and the
    load runs in what is left (the command ends within ~10 minutes on 2 cores); what does
    not fit is listed under `skipped` (`--set budget_s=null`: no bound)."""
    prefix: bool = True
    """Also measure the local engine's prefix cache on Agent Zero's prompt."""
    prefix_only: bool = False
    """Only the prefix-cache figures (no vLLM, no throughput levels)."""
    agent_zero_prompt: Path | None = None
    """A file with Agent Zero's rendered system prompt (default: synthetic)."""
    multilora: bool = True
    """Also measure N = 1, 4, 16 live LoRA adapters in one batch (lineages)."""
    multilora_only: bool = False
    """Only the multi-LoRA figures (no prefix cache, no vLLM)."""


class MetricsBench(_Options):
    """CPU cost of the metrics hooks per trajectory / message / request, and of a scrape."""

    batch: int = Field(256, ge=1)
    """Messages per batch (the services' batch size)."""


class StartupBench(_Options):
    """`agentrl up` from an empty model cache and from a warm one to the first token
    streamed through the gateway, each service's ready time, and SIGINT to exit
    (targets on 2 cores: warm <= 30 s, cold <= 3 min, exit <= 5 s)."""

    keep: bool = False
    """Keep the data dirs and logs of both starts."""


class ChoiceBench(_Options):
    """guided_choice scoring on the local backend: prompts/s one at a time, batched at 8
    and 32 in flight, and the path before batching, on the loop's own prompts."""

    model: str = "smollm2"
    """Local model: smollm2 or tiny (random)."""
    prompts: int = Field(64, ge=1)
    """Distinct FrozenLake prompts per peer."""
    seed: int = 0
    """Seed of the episodes and the model."""


class CaptureBench(_Options):
    """Episodes at the gateway under load (published = sent, tracking cost per request),
    the cases that used to duplicate, split, merge or lose episodes, and the OTLP
    receiver's spans per second. Exit status 1 when an episode was lost, failed,
    duplicated, split or merged."""

    sessions: int = Field(1000, ge=1)
    """Concurrent sessions (episodes)."""
    turns: int = Field(5, ge=1)
    """Requests per session (the last is text)."""
    connections: int = Field(64, ge=1)
    """HTTP connections of the clients."""
    otlp_traces: int = Field(2000, ge=100)
    """GenAI traces posted as OTLP."""
    extra: int = Field(20, ge=1)
    """Runs of each hard case: gateway + OTLP, threads, timeout, one user's two
    conversations, an oversized episode."""


def comma_list(text: str) -> list[str]:
    """The items of a comma-separated option, blanks dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


class PlayBench(_Options):
    """In-process tool-use play (the learners' held-out evaluations and job plays): the same
    held-out tasks played twice in one run, with the play's prefix cache (a turn prefills
    only what is new) and without it (each turn's prompt prefilled whole). CPU-s per episode
    (load-independent), prompt tokens prefilled and taken from the cache, decode steps,
    success; greedy plays also say whether both sides sampled the same tokens."""

    model: str = "smollm2"
    """smollm2, tiny (random), or a checkpoint folder (the light warm start)."""
    tasks_per_family: int = Field(4, ge=1)
    """Held-out tasks of each family (three families)."""
    temperature: float = Field(0.0, ge=0)
    """0: greedy (the held-out evaluation's)."""
    max_new_tokens: int = Field(256, ge=1)
    """Tokens per reply (the loop's 256)."""
    max_steps: int = Field(4, ge=1)
    """Turns per episode (the loop's 4)."""
    batch_size: int = Field(34, ge=1)
    """Episodes decoding together."""
    seed: int = 0
    """Seed of the sampling."""


class ActingBench(_Options):
    """Tool-use acting as `agentrl loop --env tooluse` acts: the loop's agents through the
    gateway and the local engine for a fixed time. Episodes a minute, generated and prefill
    tokens/s, the prefix cache's share, step time per batch size, and the share of wall in
    forward passes, grammar masks, sampling, tools and the rest; one JSON line."""

    model: str = "smollm2"
    """Base model: smollm2, or tiny (random)."""
    checkpoint: Path | None = None
    """A LoRA checkpoint over the base to act with (the light warm start); none: the base."""
    agents: int = Field(16, ge=1)
    """Agent workers (the tool-use loop's 16)."""
    seconds: float = Field(120.0, gt=0)
    """Seconds of acting measured."""
    min_episodes: int = Field(0, ge=0)
    """Keep the window open past `seconds` until this many episodes ended (at most ten times
    `seconds`): on a busy host a short window may otherwise end before any episode does."""
    max_batch_size: int | None = Field(None, ge=1)
    """The engine's decode batch; unset: the tool-use loop's (`loop_tooluse.SERVE_MAX_BATCH`)."""
    threads: int | None = Field(None, ge=1)
    """Torch threads of the engine; unset: the engine's default (one per two cores)."""
    packed_weights: bool = False
    """Weights packed once for MKL (`agentrl up`'s AGENTRL_DEPLOY_PACKED_WEIGHTS)."""
    max_tokens: int = Field(256, ge=1)
    """Tokens per reply (the loop's 256)."""
    max_steps: int = Field(4, ge=1)
    """Turns per episode (the loop's 4)."""
    temperature: float = Field(1.0, ge=0)
    """The agents' sampling temperature (the loop's 1.0)."""
    seed: int = 0
    """Seed of the model and the engine's sampling."""
    profile: Path | None = None
    """Also record a py-spy profile (speedscope JSON) of the run to this file."""
