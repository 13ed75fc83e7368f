"""JetStream streams: the seed's three, plus homes for events the seed left without one.

The seed's RL_TRAINING captures only `agent.rl.training.>`, so deployment events would be
kept by no stream; RL_MODELS keeps them (90 days, the seed's model retention). Feedback gets
RL_FEEDBACK, off-policy trainer events RL_OFFPOLICY, and poison messages RL_DLQ.
"""

from __future__ import annotations

from dataclasses import dataclass

DAY = 24 * 3600
GiB = 1024**3


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_s: int
    max_msgs: int
    max_bytes: int
    storage: str = "file"
    duplicate_window_s: int = 120


DLQ_PREFIX = "agent.rl.dlq"

STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("RL_TRAJECTORIES", ("agent.rl.trajectory.v1",), 30 * DAY, 1_000_000, 8 * GiB),
    StreamSpec("RL_REWARDS", ("agent.rl.reward.v1",), 30 * DAY, 500_000, 2 * GiB),
    StreamSpec("RL_TRAINING", ("agent.rl.training.>",), 7 * DAY, 10_000, 1 * GiB),
    StreamSpec("RL_MODELS", ("agent.rl.model.>",), 90 * DAY, 10_000, 256 * 1024**2),
    StreamSpec("RL_FEEDBACK", ("agent.rl.feedback.v1",), 30 * DAY, 1_000_000, 1 * GiB),
    StreamSpec("RL_OFFPOLICY", ("agent.rl.offpolicy.>",), 7 * DAY, 100_000, 512 * 1024**2),
    # The gateway's completion log (token ids + log-probs per completion id), as long as
    # the trajectories that point at it.
    StreamSpec("RL_COMPLETIONS", ("agent.rl.completion.v1",), 30 * DAY, 1_000_000, 4 * GiB),
    StreamSpec("RL_DLQ", (f"{DLQ_PREFIX}.>",), 30 * DAY, 100_000, 1 * GiB),
)


def stream_for(subject: str) -> StreamSpec:
    """The stream that stores `subject` (NATS wildcard rules: `*` one token, `>` the rest)."""
    for spec in STREAMS:
        if any(subject_matches(pattern, subject) for pattern in spec.subjects):
            return spec
    raise KeyError(f"no stream stores subject {subject!r}")


def subject_matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)
