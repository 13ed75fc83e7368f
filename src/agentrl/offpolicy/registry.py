"""Registries: versioned entity records, and named operations.

The entity registry keeps every record ever made of a (kind, key) pair, numbered from
1, so a run can be audited: which smoothing decision was in force at update 4000,
what the early-stop controller said at each evaluation. Records are frozen entities,
so a stored version never changes.

The callable registry maps stable names ("compute_knn_kernel",
"apply_consensus_update", "early_stop_check", ...) to functions, so configurations,
events and remote workers can refer to operations by name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from agentrl.core.errors import AgentRLError

F = TypeVar("F", bound=Callable[..., Any])


class RegistryError(AgentRLError, KeyError):
    """A name or record is not registered, or is registered twice."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Record:
    kind: str
    key: str
    version: int
    entity: BaseModel


class EntityRegistry:
    """Append-only store of versioned entity records, safe to use from several threads."""

    def __init__(self, max_versions: int | None = None) -> None:
        self._records: dict[tuple[str, str], list[Record]] = {}
        self._lock = threading.Lock()
        self.max_versions = max_versions

    def record(self, entity: BaseModel, key: str = "default", kind: str | None = None) -> Record:
        """Store `entity` as the next version of (kind, key); kind defaults to its class name."""
        if not entity.model_config.get("frozen"):
            raise RegistryError(
                f"{type(entity).__name__} is mutable; only frozen entities are kept"
            )
        kind = kind or type(entity).__name__
        with self._lock:
            history = self._records.setdefault((kind, key), [])
            version = history[-1].version + 1 if history else 1
            rec = Record(kind, key, version, entity)
            history.append(rec)
            if self.max_versions is not None and len(history) > self.max_versions:
                del history[0]
        return rec

    def get(self, kind: str, key: str = "default", version: int | None = None) -> Record:
        """Latest record of (kind, key), or the given version."""
        with self._lock:
            history = self._records.get((kind, key))
            if not history:
                raise RegistryError(f"no {kind} record under key {key!r}")
            if version is None:
                return history[-1]
            for rec in history:
                if rec.version == version:
                    return rec
        raise RegistryError(
            f"{kind}[{key!r}] has no version {version} (kept: {self.versions(kind, key)})"
        )

    def history(self, kind: str, key: str = "default") -> list[Record]:
        with self._lock:
            return list(self._records.get((kind, key), ()))

    def versions(self, kind: str, key: str = "default") -> list[int]:
        return [r.version for r in self.history(kind, key)]

    def kinds(self) -> list[str]:
        with self._lock:
            return sorted({kind for kind, _ in self._records})


class CallableRegistry:
    """Name -> function. Registering a name twice is an error unless `replace=True`."""

    def __init__(self) -> None:
        self._fns: dict[str, Callable[..., Any]] = {}

    def register(
        self, name: str, fn: Callable[..., Any] | None = None, *, replace: bool = False
    ) -> Any:
        """`register("x", f)` or as a decorator `@register("x")`."""

        def add(f: F) -> F:
            if name in self._fns and not replace and self._fns[name] is not f:
                raise RegistryError(f"operation {name!r} is already registered")
            self._fns[name] = f
            return f

        return add(fn) if fn is not None else add

    def get(self, name: str) -> Callable[..., Any]:
        try:
            return self._fns[name]
        except KeyError:
            raise RegistryError(
                f"no operation named {name!r}; registered: {', '.join(sorted(self._fns))}"
            ) from None

    def __call__(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.get(name)(*args, **kwargs)

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def names(self) -> list[str]:
        return sorted(self._fns)


def default_operations() -> CallableRegistry:
    """The registry of the package's named operations (imports the numerical cores)."""
    from agentrl.offpolicy import dqn, early_stop, free_energy, replay, smoothing

    reg = CallableRegistry()
    reg.register("compute_knn", smoothing.compute_knn)
    reg.register("adaptive_sigmas", smoothing.adaptive_sigmas)
    reg.register("compute_knn_kernel", smoothing.compute_knn_kernel)
    reg.register("kernel_consensus", smoothing.kernel_consensus)
    reg.register("apply_consensus_update", smoothing.apply_consensus_update)
    reg.register("schedule_alpha_step", smoothing.schedule_alpha_step)
    reg.register("free_energy", free_energy.free_energy)
    reg.register("mann_kendall", early_stop.mann_kendall)
    reg.register("early_stop_check", early_stop.EarlyStopController.update)
    reg.register("aggregate_metrics", early_stop.aggregate_metrics)
    reg.register("double_dqn_targets", dqn.double_dqn_targets)
    reg.register("per_priorities", replay.priorities_from_td)
    return reg
