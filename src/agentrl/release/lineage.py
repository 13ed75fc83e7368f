"""Lineages: one public model name per agent (or group of agents), each with its own
versions, split, rollout, validation benchmark, training triggers and rollback history.

All lineages live in ONE registry key, `lineages` (a `LineageTable`), written with
compare-and-set: a name collision or an agent claimed by two lineages is refused atomically,
and a gateway learns every lineage and the whole agent/profile -> lineage mapping with one
read per poll. The default lineage is `DeploySettings.public_model` (`agentrl-policy`); it
needs no record (an existing deployment keeps working unchanged, no migration), and a
request or trajectory no lineage claims belongs to it.

A new lineage starts from the base model (`start="base"`: an agent whose work is unlike any
existing lineage's, so nothing learned elsewhere should carry over) or from another
lineage's live version at creation time (`start="lineage"`, `parent`: a specialisation of an
agent already trained, e.g. a subordinate of the developer, which then needs less data). The
choice is recorded (`parent_model`, and the first version's decision names its source).

States: active (routed, trained, rolled out), paused (routed on its current split; its
rollout is paused, the controller deploys nothing new and training triggers skip it),
retired (not routed: the gateway answers 404; its agents and profiles are released).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.contracts.base import utcnow
from agentrl.serving.errors import DeployError, UnknownModel
from agentrl.serving.registry import (
    MODEL_LIKE,
    Decision,
    ModelRecord,
    Registry,
)

LineageState = Literal["active", "paused", "retired"]
KEY = "lineages"
MAX_NAME = 64
# lowercase words joined by . _ / - ; no empty KV token (..), no trailing separator
_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9_-]|[./](?=[a-z0-9]))*$")


class UnknownLineage(UnknownModel):
    """A lineage name the registry does not know (404)."""


class LineageConflict(DeployError):
    """A name already taken, or an agent / profile another lineage claims (409)."""


def check_name(name: str) -> str:
    """The name, or ValueError saying what a lineage name may be."""
    if not isinstance(name, str) or not name:
        raise ValueError("a lineage name must be a non-empty string")
    if len(name) > MAX_NAME:
        raise ValueError(f"lineage name {name[:80]!r} is longer than {MAX_NAME} characters")
    if not _NAME.match(name):
        raise ValueError(
            f"lineage name {name!r} is not valid: lowercase letters, digits and . _ / - "
            "(starting with a letter or digit, no '..', '//' or trailing '.' or '/')"
        )
    if MODEL_LIKE.search(name):
        raise ValueError(
            f"lineage name {name!r} ends like a version id (-vN / -base) of another lineage"
        )
    return name


class Lineage(BaseModel):
    """One lineage's record (inside the `lineages` table)."""

    model_config = ConfigDict(extra="allow")

    name: str
    agents: list[str] = Field(default_factory=list)  # agent ids (x-agentrl-agent, trajectories)
    profiles: list[str] = Field(default_factory=list)  # Agent Zero profiles (x-agentrl-profile)
    # DeploySettings overrides of this lineage's validation (benchmark_tasks, _env_kwargs, ...)
    validation: dict[str, Any] = Field(default_factory=dict)
    # training trigger overrides (threshold, ...) and request overrides for its jobs
    triggers: dict[str, Any] = Field(default_factory=dict)
    state: LineageState = "active"
    start: Literal["base", "lineage"] = "base"
    parent: str | None = None
    parent_model: str | None = None
    base_model: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    decisions: list[Decision] = Field(default_factory=list)


class LineageTable(BaseModel):
    lineages: dict[str, Lineage] = Field(default_factory=dict)


class Routing:
    """What the gateway and the training triggers route by: agent id / profile -> lineage
    (dict lookups), the lineages served and the retired ones (answered 404)."""

    def __init__(self, table: LineageTable, default: str) -> None:
        self.default = default
        self.by_agent: dict[str, str] = {}
        self.by_profile: dict[str, str] = {}
        self.served: dict[str, Lineage] = {}
        self.retired: set[str] = set()
        for lin in table.lineages.values():
            if lin.state == "retired":
                self.retired.add(lin.name)
                continue
            self.served[lin.name] = lin
            for a in lin.agents:
                self.by_agent[a] = lin.name
            for p in lin.profiles:
                self.by_profile[p] = lin.name

    def of_agent(self, agent_id: str | None, profile: str | None = None) -> str:
        """The lineage of an agent (its id first, then its profile), else the default."""
        return (
            self.by_agent.get(agent_id or "") or self.by_profile.get(profile or "") or self.default
        )


def _claims(table: LineageTable, name: str, agents: list[str], profiles: list[str]) -> None:
    for other in table.lineages.values():
        if other.name == name or other.state == "retired":
            continue
        taken = sorted(set(agents) & set(other.agents))
        if taken:
            raise LineageConflict(f"agent(s) {taken} already belong to lineage {other.name!r}")
        taken = sorted(set(profiles) & set(other.profiles))
        if taken:
            raise LineageConflict(f"profile(s) {taken} already belong to lineage {other.name!r}")


class Lineages:
    """The lineage table's operations over the registry (compare-and-set on one key)."""

    def __init__(self, registry: Registry, default: str) -> None:
        self.registry = registry
        self.default = default

    async def table(self) -> tuple[LineageTable, int]:
        table, revision = await self.registry._get(KEY, LineageTable)
        return table or LineageTable(), revision

    async def routing(self) -> Routing:
        return Routing((await self.table())[0], self.default)

    def _default_record(self) -> Lineage:
        return Lineage(name=self.default, state="active")

    async def all(self) -> list[Lineage]:
        """Every lineage, the default first (implicit unless it was given agents)."""
        table, _ = await self.table()
        out = dict(table.lineages)
        out.setdefault(self.default, self._default_record())
        return [out[self.default], *(v for k, v in sorted(out.items()) if k != self.default)]

    async def get(self, name: str) -> Lineage:
        table, _ = await self.table()
        if name in table.lineages:
            return table.lineages[name]
        if name == self.default:
            return self._default_record()
        known = sorted({self.default, *table.lineages})
        raise UnknownLineage(f"no lineage {name!r}; known: {known}")

    async def create(
        self,
        name: str,
        *,
        base_model: str,
        agents: list[str] | None = None,
        profiles: list[str] | None = None,
        parent: str | None = None,
        validation: dict[str, Any] | None = None,
        triggers: dict[str, Any] | None = None,
        by: str,
        reason: str = "created",
        bus: Any = None,
    ) -> Lineage:
        """A new lineage and its first live version (the base, or `parent`'s live one)."""
        check_name(name)
        agents, profiles = sorted(set(agents or [])), sorted(set(profiles or []))
        source: ModelRecord | None = None
        if parent is not None:
            await self.get(parent)  # 404 for a parent that does not exist
            split, _ = await self.registry.get_split(parent)
            if split is None or not split.live:
                raise LineageConflict(f"lineage {parent!r} has no live version to start from")
            source = await self.registry.require_model(split.live)

        def add(cur: LineageTable | None) -> LineageTable:
            table = cur or LineageTable()
            if name == self.default or name in table.lineages:
                state = table.lineages[name].state if name in table.lineages else "active"
                raise LineageConflict(f"lineage {name!r} already exists ({state})")
            parent_lin = table.lineages.get(parent) if parent is not None else None
            if parent_lin is not None and parent_lin.state == "retired":
                raise LineageConflict(f"lineage {parent!r} is retired: not a parent")
            _claims(table, name, agents, profiles)
            lin = Lineage(
                name=name,
                agents=agents,
                profiles=profiles,
                validation=dict(validation or {}),
                triggers=dict(triggers or {}),
                start="lineage" if source else "base",
                parent=parent,
                parent_model=source.model_id if source else None,
                base_model=source.base_model if source else base_model,
            )
            lin.decisions.append(Decision(by=by, action="create", reason=reason, to_state="active"))
            table.lineages[name] = lin
            return table

        table = await self.registry._mutate(KEY, LineageTable, add)
        from agentrl.release.actions import Deployer

        await Deployer(self.registry, bus, name).bootstrap(
            table.lineages[name].base_model, by=by, source=source
        )
        return table.lineages[name]

    async def set_state(
        self, name: str, state: LineageState, *, by: str, reason: str, bus: Any = None
    ) -> Lineage:
        """Pause, resume or retire a lineage (the default one can be paused, not retired)."""
        if name == self.default and state == "retired":
            raise LineageConflict(f"{name!r} is the default lineage: it cannot be retired")
        await self.get(name)
        allowed = {"active": {"paused", "retired"}, "paused": {"active", "retired"}}

        def apply(cur: LineageTable | None) -> LineageTable:
            table = cur or LineageTable()
            lin = table.lineages.get(name)
            if lin is None:
                lin = table.lineages[name] = self._default_record()
            if lin.state == state:
                return table
            if state not in allowed.get(lin.state, set()):
                raise LineageConflict(f"lineage {name!r} is {lin.state}; it cannot become {state}")
            if state != "retired":  # back from paused: its claims must still be free
                _claims(table, name, lin.agents, lin.profiles)
            lin.decisions.append(
                Decision(by=by, action=state, reason=reason, from_state=lin.state, to_state=state)
            )
            lin.state = state
            lin.updated_at = utcnow()
            return table

        lin = (await self.registry._mutate(KEY, LineageTable, apply)).lineages[name]
        await self._hold_rollout(name, state, by, reason, bus)
        return lin

    async def _hold_rollout(self, name: str, state: str, by: str, reason: str, bus: Any) -> None:
        """A paused lineage's running rollout holds where it is; resumed, it goes on."""
        from agentrl.release.actions import Deployer

        rollout = await self.registry.get_rollout(name)
        if rollout is None or rollout.status != "running":
            return
        d = Deployer(self.registry, bus, name)
        if state == "paused" and not rollout.paused:
            await d.pause(by=by, reason=f"lineage paused: {reason}")
        elif state == "active" and rollout.paused:
            await d.resume(by=by, reason=f"lineage resumed: {reason}")

    async def assign(
        self, name: str, *, agents: list[str], profiles: list[str], by: str, reason: str
    ) -> Lineage:
        """Map agents / profiles to `name` (taken from whichever lineage had them). A mapping
        to a lineage that does not exist is a 404, to a retired one a 409."""
        await self.get(name)

        def apply(cur: LineageTable | None) -> LineageTable:
            table = cur or LineageTable()
            lin = table.lineages.get(name)
            if lin is None:
                lin = table.lineages[name] = self._default_record()
            if lin.state == "retired":
                raise LineageConflict(f"lineage {name!r} is retired: nothing maps to it")
            for other in table.lineages.values():
                if other.name != name:
                    other.agents = [a for a in other.agents if a not in agents]
                    other.profiles = [p for p in other.profiles if p not in profiles]
            lin.agents = sorted({*lin.agents, *agents})
            lin.profiles = sorted({*lin.profiles, *profiles})
            lin.decisions.append(
                Decision(
                    by=by,
                    action="map",
                    reason=reason,
                    evidence={"agents": agents, "profiles": profiles},
                )
            )
            lin.updated_at = utcnow()
            return table

        return (await self.registry._mutate(KEY, LineageTable, apply)).lineages[name]
