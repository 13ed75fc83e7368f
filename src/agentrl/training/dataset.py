"""The dataset of a training job: logged trajectories joined with their latest reward.

I/O (`read_subject`) reads a JetStream stream with an ordered consumer from a start time
(the request's date_range start, a margin earlier) to the end as of the call. Everything else
is pure: keep the highest reward version per trajectory, apply every filter of the seed in
a fixed order counting what each removes, draw a seeded sample, split off a holdout by
task_id (all attempts of one task land on the same side, so the holdout is unseen tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

import numpy as np
import orjson

from agentrl.contracts.training import DatasetFilter

FILTER_ORDER = (
    "no_reward",
    "opted_out",
    "min_reward",
    "max_trajectory_length",
    "date_range",
    "task_domains",
    "exclude_subordinate_profiles",
    "agent_ids",
)
CLOCK_SKEW = timedelta(hours=1)


@dataclass
class Record:
    """One trajectory with its latest reward (raw dicts: parsing 100k models costs seconds)."""

    trajectory: dict[str, Any]
    reward: dict[str, Any]

    @property
    def trajectory_id(self) -> str:
        return str(self.trajectory["trajectory_id"])

    @property
    def task_id(self) -> str:
        return str((self.trajectory.get("task_context") or {}).get("task_id") or self.trajectory_id)

    @property
    def domain(self) -> str:
        return str((self.trajectory.get("task_context") or {}).get("domain") or "general")

    @property
    def score(self) -> float:
        return float(self.reward["total_reward"])

    @property
    def correction(self) -> str | None:
        """The user's correction of this trajectory (latest; redacted), from its reward's
        `metadata.feedback.correction`: what the agent should have done, the hint a job may
        build a hinted context from. None when no user corrected it."""
        meta = self.reward.get("metadata")
        fb = meta.get("feedback") if isinstance(meta, dict) else None
        text = fb.get("correction") if isinstance(fb, dict) else None
        return text if isinstance(text, str) and text.strip() else None

    @property
    def hint(self) -> str | None:
        """The hint the user gave for this trajectory's task (its correction), if any."""
        return self.correction

    @property
    def turn_rewards(self) -> list[float] | None:
        """Per-turn rewards summing to the total (the reward's `metadata.turn_rewards`: each
        turn's partial credit, the outcome on the last), or None when the reward has none or
        they do not match the trajectory's turns."""
        from agentrl.advantages.steps import turn_rewards_of

        return turn_rewards_of(self.reward, len(self.trajectory.get("turns") or ()))


@dataclass
class FilterReport:
    """How many trajectories each stage removed (and how many were read)."""

    trajectories: int = 0
    rewards: int = 0
    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FILTER_ORDER, 0))
    kept: int = 0
    sampled: int = 0
    holdout: int = 0
    payloads_read: int = 0  # trajectory payloads read: all of them, or the lazy sample's

    def message(self) -> str:
        parts = ", ".join(f"{k} -{v}" for k, v in self.removed.items())
        return (
            f"no trajectories left after filtering: {self.trajectories} trajectories read, "
            f"{self.rewards} rewards read; removed by filter: {parts}; kept {self.kept}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "trajectories": self.trajectories,
            "rewards": self.rewards,
            "removed": dict(self.removed),
            "kept": self.kept,
            "sampled": self.sampled,
            "holdout": self.holdout,
            "payloads_read": self.payloads_read,
        }


@contextlib.contextmanager
def gc_paused(freeze: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector while a dataset is read and parsed: hundreds of
    thousands of small live objects make it rescan again and again (measured: parsing runs
    2.5-5x faster without it). Reference counting still frees everything acyclic.

    With `freeze`, everything alive at the end moves to the collector's permanent
    generation (`gc.freeze`): a job's records and samples live as long as the job, and the
    first collection after the pause would otherwise walk every one of them (measured:
    0.4 s for the samples of 100,000 trajectories), later full ones again. Frozen objects
    are still freed by reference counting; only cyclic garbage alive at that moment is
    never collected, so freeze in a process that ends with its work (a training job)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was:
            gc.enable()


# -- pure -------------------------------------------------------------------------------------


def reward_version(reward: dict[str, Any]) -> int:
    """The reward's version (top level, or in a nested extras object on the wire)."""
    v = reward.get("version")
    if v is None:
        for value in reward.values():
            if isinstance(value, dict) and isinstance(value.get("version"), int):
                v = value["version"]
                break
    return int(v or 1)


def latest_rewards(rewards: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """trajectory_id -> its highest reward version (later timestamp breaks ties). The
    (version, timestamp) key is computed only for a trajectory with two or more rewards."""
    best: dict[str, dict[str, Any]] = {}
    keys: dict[str, tuple[int, str]] = {}
    for r in rewards:
        tid = r.get("trajectory_id")
        if not tid:
            continue
        cur = best.get(tid)
        if cur is None:
            best[tid] = r
            continue
        held = keys.get(tid)
        if held is None:
            held = keys[tid] = (reward_version(cur), str(cur.get("timestamp", "")))
        key = (reward_version(r), str(r.get("timestamp", "")))
        if key > held:
            best[tid], keys[tid] = r, key
    return best


def _ts(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def apply_filters(
    trajectories: Iterable[dict[str, Any]],
    rewards: dict[str, dict[str, Any]],
    flt: DatasetFilter,
    report: FilterReport | None = None,
) -> tuple[list[Record], FilterReport]:
    """Join and filter, counting removals per filter in `FILTER_ORDER`. A trajectory that
    occurs twice (a republish under another message id) is kept once. The filter is read
    through `training.filters.declared` (the warehouse source applies the same set)."""
    from agentrl.contracts.filters import declared

    f = declared(flt)  # ValueError: a filter no source applies
    report = report or FilterReport()
    removed = report.removed
    domains = set(f.task_domains)
    excluded = set(f.exclude_subordinate_profiles)
    agents = set(f.agent_ids)
    start, end = f.start, f.end
    seen: set[str] = set()
    kept: list[Record] = []
    for t in trajectories:
        tid = t.get("trajectory_id")
        if not tid or tid in seen:
            continue
        seen.add(tid)
        report.trajectories += 1
        reward = rewards.get(tid)
        if reward is None:
            removed["no_reward"] += 1
            continue
        if (t.get("metadata") or {}).get("rl_opt_out"):
            removed["opted_out"] += 1
            continue
        if flt.min_reward is not None and float(reward["total_reward"]) < flt.min_reward:
            removed["min_reward"] += 1
            continue
        if flt.max_trajectory_length is not None and len(t.get("turns") or ()) > (
            flt.max_trajectory_length
        ):
            removed["max_trajectory_length"] += 1
            continue
        if start is not None and end is not None:
            ts = _ts(t.get("end_timestamp"))
            if ts is None or ts < start or ts > end:
                removed["date_range"] += 1
                continue
        if domains and (t.get("task_context") or {}).get("domain", "general") not in domains:
            removed["task_domains"] += 1
            continue
        if excluded and t.get("subordinate_profile") in excluded:
            removed["exclude_subordinate_profiles"] += 1
            continue
        if agents and t.get("agent_id") not in agents:
            removed["agent_ids"] += 1
            continue
        kept.append(Record(t, reward))
    report.kept = len(kept)
    return kept, report


def seeded_sample(records: list[Record], size: int | None, seed: int) -> list[Record]:
    """`size` records drawn without replacement, the same ones for the same data and seed
    whatever order the stream delivered them in."""
    ordered = sorted(records, key=lambda r: r.trajectory_id)
    if size is None or size >= len(ordered):
        return ordered
    idx = np.random.default_rng(seed).choice(len(ordered), size=size, replace=False)
    return [ordered[i] for i in sorted(idx.tolist())]


def holdout_split(
    records: list[Record], fraction: float, seed: int
) -> tuple[list[Record], list[Record]]:
    """Split by task_id: about `fraction` of the tasks (at least one when fraction > 0 and
    there are two or more tasks) go to the holdout."""
    tasks = sorted({r.task_id for r in records})
    if fraction <= 0 or len(tasks) < 2:
        return records, []
    n = min(len(tasks) - 1, max(1, round(fraction * len(tasks))))
    pick = np.random.default_rng(seed + 1).choice(len(tasks), size=n, replace=False)
    held = {tasks[i] for i in pick.tolist()}
    train = [r for r in records if r.task_id not in held]
    hold = [r for r in records if r.task_id in held]
    return train, hold


# -- I/O --------------------------------------------------------------------------------------


async def read_subject(
    js: Any,
    stream: str,
    subject: str,
    start: datetime | None = None,
    idle_timeout: float = 2.0,
) -> list[bytes]:
    """Every message of `subject` in `stream` stored at or after `start` (all when None), up
    to the stream's last message at the time of the call.

    Read with batched pull requests on an ephemeral consumer (no acks) into a raw
    subscription (`bus.wire.subscribe` with a sink): no nats-py `Msg`, header parse or
    callback task per message, which was most of the read (measured: 200,000 messages
    2-3x faster). Falls back to nats-py's ordered push consumer where the connection lacks
    the internals the raw subscription uses."""
    from agentrl.bus import wire

    nc = getattr(js, "_nc", None)
    if nc is None or not wire.supported(nc):
        return await _read_ordered(js, stream, subject, start, idle_timeout)
    return await _read_pulled(js, nc, stream, subject, start, idle_timeout)


PULL_BATCH = 2000  # messages per pull request (two in flight): bounded bytes in transit


async def _read_pulled(
    js: Any,
    nc: Any,
    stream: str,
    subject: str,
    start: datetime | None,
    idle_timeout: float,
    headers_only: bool = False,
    last_seq: list[int] | None = None,
) -> list[bytes]:
    """With `headers_only`, each message's header block instead of its payload (the
    payloads are not sent), and the stream sequence of the last one delivered appended to
    `last_seq`."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from agentrl.bus import wire

    info = await js.stream_info(stream)
    if int(info.state.messages) == 0:
        return []
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        filter_subject=subject,
        mem_storage=True,
        num_replicas=1,
        inactive_threshold=max(60.0, idle_timeout * 4),
        headers_only=True if headers_only else None,
    )
    if start is not None:
        config.deliver_policy = DeliverPolicy.BY_START_TIME
        config.opt_start_time = start - CLOCK_SKEW
    reconnects = nc.stats.get("reconnects", 0)
    consumer = await js.add_consumer(stream, config=config)
    expected = int(consumer.num_pending)
    out: list[bytes] = []
    unfilled = [0]  # messages that ended requests (408/409 status) left undelivered
    arrived = asyncio.Event()

    def sink(_subject: bytes, data: bytes, headers: bytes | None) -> None:
        if headers is not None and headers[8:10] != b"\r\n":  # a status line: request ended
            if headers[9:12] in (b"408", b"409"):
                for line in headers.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"nats-pending-messages":
                        unfilled[0] += int(value)
                arrived.set()
            return
        out.append((headers or b"") if headers_only else data)
        if len(out) >= expected or len(out) % PULL_BATCH == 0:
            arrived.set()

    inbox = nc.new_inbox()
    sub = await wire.subscribe(nc, inbox, sink)
    next_subject = f"{js._prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer.name}"
    requested = 0
    paused = gc_paused()
    paused.__enter__()
    try:
        idle_since = time.monotonic()
        count = 0
        while len(out) < expected:
            requested -= unfilled[0]
            unfilled[0] = 0
            arrived.clear()  # before the write: what arrives while it yields still wakes us
            frames = []
            while requested - len(out) < 2 * PULL_BATCH and requested < expected:
                n = min(PULL_BATCH, expected - requested)
                body = b'{"batch":%d,"expires":%d}' % (n, int(idle_timeout * 1e9))
                frames.append(
                    b"PUB %s %s %d\r\n%s\r\n"
                    % (next_subject.encode(), inbox.encode(), len(body), body)
                )
                requested += n
            await wire.write(nc, frames)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), idle_timeout)
            if len(out) > count:
                count, idle_since = len(out), time.monotonic()
            elif time.monotonic() - idle_since > idle_timeout:
                break  # nothing for a while: messages removed meanwhile (limits, age)
        if last_seq is not None:
            last_seq.append(
                int((await js.consumer_info(stream, consumer.name)).delivered.stream_seq)
            )
    finally:
        paused.__exit__(None, None, None)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_consumer(stream, consumer.name)
    if nc.stats.get("reconnects", 0) != reconnects and len(out) < expected:
        raise ConnectionError(
            f"reading {stream}: the connection to NATS was re-established mid-read "
            f"({len(out)} of {expected} messages): read again"
        )
    return out[:expected]


async def _read_ordered(
    js: Any, stream: str, subject: str, start: datetime | None, idle_timeout: float
) -> list[bytes]:
    """`read_subject` through nats-py's ordered push consumer (the fallback)."""
    from nats.js.api import DeliverPolicy

    info = await js.stream_info(stream)
    last = int(info.state.last_seq)
    if int(info.state.messages) == 0:
        return []
    out: list[bytes] = []
    done = asyncio.Event()

    expected: list[int] = []

    async def on_msg(msg: Any) -> None:
        out.append(msg.data)
        if not expected:  # parse the metadata once: how many messages follow this one
            meta = msg.metadata
            expected.append(len(out) + int(meta.num_pending))
            if meta.sequence.stream >= last:
                done.set()
        if len(out) >= expected[0]:
            done.set()

    kw: dict[str, Any] = {"ordered_consumer": True, "cb": on_msg, "stream": stream}
    if start is not None:
        from nats.js.api import ConsumerConfig

        kw["deliver_policy"] = DeliverPolicy.BY_START_TIME
        kw["config"] = ConsumerConfig(opt_start_time=start - CLOCK_SKEW)
    sub = await js.subscribe(subject, **kw)
    paused = gc_paused()
    paused.__enter__()
    try:
        count = -1
        while not done.is_set():  # stop early when nothing matches or the stream is idle
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), idle_timeout)
            if len(out) == count:
                break
            count = len(out)
    finally:
        paused.__exit__(None, None, None)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return out[: expected[0]] if expected else out


def parse_all(blobs: Iterable[bytes]) -> list[dict[str, Any]]:
    """orjson-parse payloads, skipping any that are not JSON objects (they were dead-lettered
    upstream; a dataset must not fail on one)."""
    out = []
    with gc_paused():
        for b in blobs:
            try:
                d = orjson.loads(b)
            except orjson.JSONDecodeError:
                continue
            if isinstance(d, dict):
                out.append(d)
    return out


# -- reading only the sample ------------------------------------------------------------------
#
# A job that samples `size` of N logged trajectories need not read and parse all N payloads:
# the sampler needs only the ids (the `Nats-Msg-Id` every publisher sets to the trajectory
# id, read with a headers-only consumer: no payload is sent) and the rewards (small, read
# whole). The sample's payloads are then fetched by stream sequence. Sampling rule
# (`draw_order`): the candidates are the trajectories with a reward that passes
# `min_reward`, sorted by id; the first ones taken are exactly `seeded_sample`'s draw for
# (len(candidates), size, seed); the content filters (opt-out, length, date range, domain,
# profile, agent) run on what was fetched, and each one they remove is replaced by the next
# candidate of a seeded permutation of the others. So the sample equals the full read's
# whenever the content filters remove none of the candidates (the usual case: opted-out
# trajectories get no reward), and otherwise is a seeded draw of `size` trajectories
# passing every filter. Any doubt (a message without an id, gaps in the stream's
# sequences, a fetched payload whose id differs) returns None: the caller reads it all.

LAZY_FETCH_CONCURRENCY = 64
LAZY_MAX_FRACTION = 1 / 3  # a larger sample is read with the whole stream
GUIDED_PROBE = 256  # newest candidates whose kind decides the job's path


def draw_order(n: int, size: int, seed: int) -> Iterator[int]:
    """Indices into `n` id-sorted candidates in the order a lazy read takes them: first the
    `seeded_sample` draw of `size` (in index order), then every other index in a seeded
    permutation (the replacements for drawn ones that a content filter removes)."""
    first = np.random.default_rng(seed).choice(n, size=size, replace=False)
    yield from sorted(first.tolist())
    rest = np.setdiff1d(np.arange(n), first, assume_unique=True)
    yield from np.random.default_rng([seed, 1]).permutation(rest).tolist()


def header_msg_id(block: bytes) -> str | None:
    """The `Nats-Msg-Id` of a raw header block, None when it has none."""
    at = block.find(b"Nats-Msg-Id:")
    if at < 0:
        return None
    end = block.find(b"\r\n", at)
    return block[at + 12 : end if end >= 0 else None].strip().decode("utf-8", "replace") or None


async def read_located(
    js: Any, stream: str, subject: str, start: datetime | None = None, idle_timeout: float = 2.0
) -> list[tuple[str, int]] | None:
    """(msg id, stream sequence) of every message of `subject`, without the payloads. None
    where the sequences cannot be known from the delivery order (another subject or
    deleted messages in the stream, a message without an id, no raw subscription)."""
    from agentrl.bus import wire

    nc = getattr(js, "_nc", None)
    if nc is None or not wire.supported(nc):
        return None
    info = await js.stream_info(stream)
    if list(info.config.subjects or ()) != [subject] or int(info.state.num_deleted or 0):
        return None  # positions in the delivery order are not sequences
    last: list[int] = []
    blocks = await _read_pulled(
        js, nc, stream, subject, start, idle_timeout, headers_only=True, last_seq=last
    )
    if not blocks:
        return []
    first = last[0] - len(blocks) + 1 if last else 0
    if first < int(info.state.first_seq or 1):
        return None
    out: list[tuple[str, int]] = []
    for k, block in enumerate(blocks):
        mid = header_msg_id(block)
        if mid is None:
            return None
        out.append((mid, first + k))
    return out


GET_WINDOW = 1024  # message-get requests in flight


async def fetch_seqs(
    js: Any, stream: str, seqs: Sequence[int], timeout: float = 10.0
) -> dict[int, bytes] | None:
    """The payloads of the messages at `seqs`; None when one is gone or does not arrive.

    STREAM.MSG.GET requests written straight to the connection, a window at a time, each
    answered on its own reply subject (`<inbox>.<seq>`) into a raw subscription: no
    request future, `Msg` or header parse per message (nats-py's `get_msg` costs ~10x)."""
    import base64

    from agentrl.bus import wire

    nc = getattr(js, "_nc", None)
    if not seqs:
        return {}
    if nc is None or not wire.supported(nc):
        return await _fetch_seqs_api(js, stream, seqs)
    got: dict[int, bytes | None] = {}
    arrived = asyncio.Event()
    need = [0]

    def sink(subject: bytes, data: bytes, headers: bytes | None) -> None:
        try:
            seq = int(subject.rsplit(b".", 1)[1])
        except (ValueError, IndexError):
            return
        try:  # {"message": {"data": base64, ...}} or {"error": ...}
            msg = orjson.loads(data).get("message")
            got[seq] = None if msg is None else base64.b64decode(msg.get("data") or "")
        except (ValueError, AttributeError, orjson.JSONDecodeError):
            got[seq] = None  # a status reply (no responders) or not JSON
        if len(got) >= need[0]:
            arrived.set()

    inbox = nc.new_inbox()
    sub = await wire.subscribe(nc, inbox + ".*", sink)
    api = f"{js._prefix}.STREAM.MSG.GET.{stream}".encode()
    try:
        for k in range(0, len(seqs), GET_WINDOW):
            window = seqs[k : k + GET_WINDOW]
            need[0] = k + len(window)
            arrived.clear()
            frames = []
            for seq in window:
                body = b'{"seq":%d}' % seq
                frames.append(
                    b"PUB %s %s.%d %d\r\n%s\r\n" % (api, inbox.encode(), seq, len(body), body)
                )
            await wire.write(nc, frames)
            if len(got) < need[0]:
                try:
                    await asyncio.wait_for(arrived.wait(), timeout)
                except TimeoutError:
                    return None
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    out: dict[int, bytes] = {}
    for seq in seqs:
        data = got.get(seq)
        if data is None:
            return None
        out[seq] = data
    return out


async def _fetch_seqs_api(js: Any, stream: str, seqs: Sequence[int]) -> dict[int, bytes] | None:
    """`fetch_seqs` through nats-py's `get_msg` (the fallback)."""
    sem = asyncio.Semaphore(LAZY_FETCH_CONCURRENCY)

    async def one(seq: int) -> tuple[int, bytes | None]:
        async with sem:
            try:
                msg = await js.get_msg(stream, seq=seq)
            except Exception:
                return seq, None
            return seq, msg.data

    got = await asyncio.gather(*(one(s) for s in seqs))
    if any(data is None for _, data in got):
        return None
    return {seq: data for seq, data in got if data is not None}


async def fetch_by_ids(
    js: Any,
    stream: str,
    subject: str,
    ids: Iterable[str],
    id_field: str,
    start: datetime | None = None,
) -> list[bytes] | None:
    """The payloads of the messages whose msg id is in `ids` (ids not in the stream are left
    out), read without the others' payloads; None where that cannot be done exactly (see
    `read_located`, or a payload whose `id_field` is not its msg id): read all instead."""
    wanted = set(ids)
    if not wanted:
        return []
    located = await read_located(js, stream, subject, start)
    if located is None:
        return None
    seqs: dict[str, int] = {}
    for mid, seq in located:
        if mid in wanted:
            seqs.setdefault(mid, seq)
    got = await fetch_seqs(js, stream, sorted(seqs.values())) if seqs else {}
    if got is None:
        return None
    for mid, seq in seqs.items():
        try:
            d = orjson.loads(got[seq])
        except orjson.JSONDecodeError:
            return None
        if not isinstance(d, dict) or str(d.get(id_field)) != mid:
            return None
    return [got[seq] for seq in sorted(seqs.values())]


async def sample_from_stream(
    js: Any,
    stream: str,
    subject: str,
    rewards: dict[str, dict[str, Any]],
    flt: DatasetFilter,
    size: int,
    seed: int,
    start: datetime | None = None,
    report: FilterReport | None = None,
    newest_guided: Callable[[list[dict[str, Any]]], bool] | None = None,
) -> tuple[list[Record], FilterReport] | None:
    """The job's sample read lazily (the rule: see above this function): only the ids, then
    the sampled payloads. None: read everything instead (also when the sample is a third
    of the candidates or more, or when `newest_guided` says the newest `GUIDED_PROBE` candidates by
    arrival are the valid-action kind, whose path takes the newest by end time from a full
    read)."""
    located = await read_located(js, stream, subject, start)
    if located is None:
        return None
    report = report or FilterReport()
    removed = report.removed
    seqs: dict[str, int] = {}
    for tid, seq in located:
        seqs.setdefault(tid, seq)  # a republished trajectory: the first copy, as the full read
    report.trajectories = len(seqs)
    cands: list[str] = []
    for tid in seqs:
        reward = rewards.get(tid)
        if reward is None:
            removed["no_reward"] += 1
        elif flt.min_reward is not None and float(reward["total_reward"]) < flt.min_reward:
            removed["min_reward"] += 1
        else:
            cands.append(tid)
    if len(cands) * LAZY_MAX_FRACTION <= size:
        return None  # most of the stream: one streamed read costs less than the gets
    cands.sort()
    fetched: dict[int, bytes] = {}

    async def payloads(ids: list[str]) -> list[dict[str, Any]] | None:
        missing = [seqs[t] for t in ids if seqs[t] not in fetched]
        got = await fetch_seqs(js, stream, missing) if missing else {}
        if got is None:
            return None
        fetched.update(got)
        out = parse_all(fetched[seqs[t]] for t in ids)
        if len(out) != len(ids) or any(
            d.get("trajectory_id") != t for d, t in zip(out, ids, strict=True)
        ):
            return None  # the msg id is not the payload's id: read everything
        return out

    if newest_guided is not None:
        newest = sorted(cands, key=seqs.__getitem__)[-min(size, GUIDED_PROBE) :]
        probe = await payloads(newest)
        if probe is None:
            return None
        kept_probe, _ = apply_filters(probe, rewards, flt, FilterReport())
        # none of the newest is the job's own (another lineage's agents acted last): its
        # kind is unknown, read everything (a lineage's valid-action job took the token path)
        if not kept_probe or newest_guided([r.trajectory for r in kept_probe]):
            return None
    order = draw_order(len(cands), size, seed)
    kept: list[Record] = []
    read = 0
    while len(kept) < size:
        ids = [cands[i] for i in islice(order, size - len(kept))]
        if not ids:
            break
        batch = await payloads(ids)
        if batch is None:
            return None
        read += len(ids)
        more, _ = apply_filters(batch, rewards, flt, report)
        kept.extend(more)
    report.trajectories = len(seqs)
    report.payloads_read = len(fetched)
    content = sum(removed[k] for k in FILTER_ORDER if k not in ("no_reward", "min_reward"))
    report.kept = len(cands) - content  # removals found in what was read
    kept.sort(key=lambda r: r.trajectory_id)
    return kept, report
