"""User-defined reward functions, in the spirit of reward-kit's `@reward_function`.

    from agentrl.rewards import reward_function, EvaluateResult, MetricResult

    @reward_function
    def mentions_answer(messages, ground_truth=None, **kwargs) -> EvaluateResult:
        last = messages[-1].get("content") or ""
        hit = ground_truth is not None and str(ground_truth) in last
        return EvaluateResult(score=1.0 if hit else 0.0, reason="answer in final message" if hit else "answer missing")

A decorated function (sync or async) takes the trajectory as OpenAI chat `messages`, the
task's `ground_truth` and keyword arguments (the trajectory itself comes as `trajectory=`),
and returns an `EvaluateResult`: a score in [0, 1], a reason, per-metric `MetricResult`s and,
for dense rewards, per-step `StepOutput`s with a `base_reward`. It is registered under its
name and becomes an extra weighted component once the YAML config gives it a weight.

`evaluate()` never raises: an exception, a timeout or an out-of-range score comes back as an
`EvaluateResult` with `error` set, which the reward service records in the reward's metadata.
Async functions run on the event loop under `asyncio.wait_for`; sync functions run in forked
worker processes (`agentrl.rewards.isolation`), so a slow or stuck one cannot freeze the
service's loop (acks, heartbeats) and is killed when it overruns its timeout. Timeouts are
counted in `RewardFunction.stats`.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.core.errors import AgentRLError, ConfigError
from agentrl.rewards.isolation import WorkerPool


class RewardFunctionError(AgentRLError, ValueError):
    """A custom reward function raised, timed out or returned something invalid."""


class MetricResult(BaseModel):
    model_config = ConfigDict(extra="allow")

    score: float
    success: bool | None = None
    reason: str | None = None


class StepOutput(BaseModel):
    """One step's reward for dense credit assignment (`base_reward`, any finite value)."""

    model_config = ConfigDict(extra="allow")

    step_index: int | str
    base_reward: float
    reason: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)


class EvaluateResult(BaseModel):
    model_config = ConfigDict(extra="allow")

    score: float
    reason: str | None = None
    metrics: dict[str, MetricResult] = Field(default_factory=dict)
    step_outputs: list[StepOutput] | None = None
    error: str | None = None
    is_score_valid: bool = True


def coerce_result(value: Any, name: str) -> EvaluateResult:
    """Turn what a function returned into a checked EvaluateResult, or raise RewardFunctionError.

    Accepted: an EvaluateResult, a dict of its fields, a bare number (the score), or
    reward-kit's legacy tuple (score, metrics).
    """
    try:
        if isinstance(value, EvaluateResult):
            result = value
        elif isinstance(value, dict):
            result = EvaluateResult.model_validate(value)
        elif isinstance(value, bool):
            raise RewardFunctionError(
                f"reward function {name!r} returned a bool; return a score in [0, 1]"
            )
        elif isinstance(value, int | float):
            result = EvaluateResult(score=float(value))
        elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], int | float):
            metrics = {
                k: v if isinstance(v, MetricResult) else MetricResult(score=float(v))
                for k, v in dict(value[1] or {}).items()
            }
            result = EvaluateResult(score=float(value[0]), metrics=metrics)
        else:
            raise RewardFunctionError(
                f"reward function {name!r} returned {type(value).__name__}; return an EvaluateResult"
            )
    except ValidationError as exc:
        raise RewardFunctionError(
            f"reward function {name!r} returned an invalid result: {exc}"
        ) from exc
    if result.error:
        raise RewardFunctionError(f"reward function {name!r} reported an error: {result.error}")
    if not math.isfinite(result.score) or not 0.0 <= result.score <= 1.0:
        raise RewardFunctionError(
            f"reward function {name!r} returned score {result.score!r}, outside [0, 1]"
        )
    for step in result.step_outputs or []:
        if not math.isfinite(step.base_reward):
            raise RewardFunctionError(
                f"reward function {name!r} returned a non-finite base_reward at step {step.step_index!r}"
            )
    return result


class RewardFunction:
    """A registered reward function; calling it calls the user's function (checked output)."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name
        self.is_async = inspect.iscoroutinefunction(fn)
        self.stats: Counter[str] = Counter()  # calls, timeouts, errors
        self._pool: WorkerPool | None = None
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def _workers(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(self.fn, f"reward-fn-{self.name}")
        return self._pool

    def close(self) -> None:
        """Stop the worker processes of a sync function (they also die with this process)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_async:

            async def _run() -> EvaluateResult:
                return coerce_result(await self.fn(*args, **kwargs), self.name)

            return _run()
        return coerce_result(self.fn(*args, **kwargs), self.name)

    async def evaluate(
        self,
        messages: list[dict[str, Any]],
        ground_truth: Any = None,
        timeout: float | None = 5.0,
        **kwargs: Any,
    ) -> EvaluateResult:
        """Run the function; never raises (errors come back with `error` set, score 0).

        A sync function runs in a worker process, off the event loop; past `timeout` the
        worker is killed (a thread could not be stopped) and the call reports a timeout."""
        self.stats["calls"] += 1
        try:
            if self.is_async:
                raw = await asyncio.wait_for(
                    self.fn(messages=messages, ground_truth=ground_truth, **kwargs), timeout
                )
            else:
                call_kwargs = {"messages": messages, "ground_truth": ground_truth, **kwargs}
                raw = await asyncio.to_thread(self._workers().call, (), call_kwargs, timeout)
            return coerce_result(raw, self.name)
        except TimeoutError:
            self.stats["timeouts"] += 1
            return _failed(
                f"reward function {self.name!r} timed out after {timeout}s", kind="timeout"
            )
        except RewardFunctionError as exc:
            self.stats["errors"] += 1
            return _failed(str(exc))
        except Exception as exc:
            self.stats["errors"] += 1
            return _failed(f"reward function {self.name!r} raised {type(exc).__name__}: {exc}")

    def __repr__(self) -> str:
        return f"RewardFunction({self.name!r}, async={self.is_async})"


def _failed(message: str, kind: str = "error") -> EvaluateResult:
    return EvaluateResult(score=0.0, error=message, is_score_valid=False, error_kind=kind)


REGISTRY: dict[str, RewardFunction] = {}


@overload
def reward_function(fn: Callable[..., Any], *, name: str | None = None) -> RewardFunction: ...
@overload
def reward_function(
    fn: None = None, *, name: str | None = None
) -> Callable[[Callable[..., Any]], RewardFunction]: ...


def reward_function(
    fn: Callable[..., Any] | None = None, *, name: str | None = None
) -> RewardFunction | Callable[[Callable[..., Any]], RewardFunction]:
    """Register `fn` as a reward function (usable bare or as `@reward_function(name=...)`)."""

    def wrap(f: Callable[..., Any]) -> RewardFunction:
        rf = RewardFunction(f, name or f.__name__)
        REGISTRY[rf.name] = rf
        return rf

    return wrap(fn) if fn is not None else wrap


def resolve(name: str, module: str | None = None) -> RewardFunction:
    """The registered function `name`, importing `module` first (it registers on import).

    `module` may also be "package.module:function" to register a plain function by path.
    """
    if module:
        modname, _, attr = module.partition(":")
        try:
            mod = importlib.import_module(modname)
        except ImportError as exc:
            raise ConfigError(f"cannot import reward function module {modname!r}: {exc}") from exc
        if attr:
            obj = getattr(mod, attr, None)
            if obj is None:
                raise ConfigError(f"module {modname!r} has no attribute {attr!r}")
            if not isinstance(obj, RewardFunction):
                obj = RewardFunction(obj, name)
            REGISTRY[name] = obj
    if name not in REGISTRY:
        raise ConfigError(
            f"no reward function named {name!r} is registered; decorate it with @reward_function "
            f"and give its module in the config (registered: {sorted(REGISTRY)})"
        )
    return REGISTRY[name]


# ---- trajectories as OpenAI chat messages ------------------------------------------------
def trajectory_messages(trajectory: TrajectoryEvent) -> list[dict[str, Any]]:
    """The trajectory as OpenAI chat messages: user/subordinate observations, assistant
    actions (with tool_calls), and tool results."""
    msgs: list[dict[str, Any]] = []
    if trajectory.task_context.instructions:
        first = trajectory.turns[0].observation if trajectory.turns else None
        if not (
            first is not None
            and first.type == "user_message"
            and first.content == trajectory.task_context.instructions
        ):
            msgs.append({"role": "user", "content": trajectory.task_context.instructions})
    previous_had_result = False
    for turn in trajectory.turns:
        obs = turn.observation
        content = (
            obs.content if isinstance(obs.content, str) else json.dumps(obs.content, default=str)
        )
        if obs.type == "user_message":
            msgs.append({"role": "user", "content": content})
        elif obs.type == "subordinate_response":
            msgs.append({"role": "user", "name": "subordinate", "content": content})
        elif not previous_had_result:  # a tool result not already given as the last result
            msgs.append(
                {"role": "tool", "tool_call_id": f"call_{turn.turn_id - 1}", "content": content}
            )
        action = turn.action
        msg: dict[str, Any] = {"role": "assistant", "content": action.raw_response}
        calls_tool = action.type in ("tool_call", "subordinate_call") and action.tool_name
        if calls_tool:
            msg["tool_calls"] = [
                {
                    "id": f"call_{turn.turn_id}",
                    "type": "function",
                    "function": {
                        "name": action.tool_name,
                        "arguments": json.dumps(action.tool_args, default=str),
                    },
                }
            ]
        msgs.append(msg)
        previous_had_result = False
        if calls_tool and turn.result is not None:
            out = turn.result.output if turn.result.error is None else f"error: {turn.result.error}"
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": f"call_{turn.turn_id}",
                    "content": out if isinstance(out, str) else json.dumps(out, default=str),
                }
            )
            previous_had_result = True
    return msgs


def ground_truth_of(trajectory: TrajectoryEvent) -> Any:
    """`ground_truth` from the task context or the metadata (extra fields), else None."""
    for part in (trajectory.task_context, trajectory.metadata):
        extra = part.model_extra or {}
        if "ground_truth" in extra:
            return extra["ground_truth"]
    return None


AsyncEvaluate = Callable[..., Awaitable[EvaluateResult]]
