"""Structured outputs for Agent Zero's main chat call (setting `structured_outputs`, off by
default): the call asks agentrl's gateway for OpenAI's `response_format` with Agent Zero's
response schema (`thoughts`, `headline`, `tool_name`, `tool_args`; shipped as
agentrl/serving/schemas/agent_zero_response.json), so every answer is a well-formed tool
request, decoded under the grammar (issue 30). `tool_name` is narrowed to the agent's own
tools (a name, or `name:method`) when they can be listed: the `tools/*.py` files of the folders Agent Zero's `get_tool`
searches (`helpers.subagents.get_paths(agent, "tools")`: the agent's profile, plugins, user
and default folders). When they cannot (an older checkout, or MCP servers configured, whose
tools are named at run time) `tool_name` stays a free string: a real tool is never forbidden.

Sent only towards agentrl's gateway (it enforces the schema token by token on its local
backend and passes it on to a vLLM upstream); other providers may reject a strict schema.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
from functools import cache
from pathlib import Path
from typing import Any

log = logging.getLogger("agentrl.agent_zero")

SCHEMA_NAME = "agent_zero_response"
HERE = Path(__file__).resolve().parent
# the client wheel ships the schema beside this file; a full install has it under serving/
SCHEMA_FILES = (
    HERE / f"{SCHEMA_NAME}.json",
    HERE.parents[1] / "serving" / "schemas" / f"{SCHEMA_NAME}.json",
)
NOT_TOOLS = frozenset({"__init__", "unknown"})  # Agent Zero's fallback for unknown names


@cache
def base_schema() -> dict[str, Any]:
    path = next((p for p in SCHEMA_FILES if p.is_file()), SCHEMA_FILES[-1])
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


def response_schema(tool_names: list[str] | None) -> dict[str, Any]:
    """Agent Zero's response schema; `tool_name` one of `tool_names` (or `name:method`, as
    Agent Zero splits it: agentrl's own `rl_training:start`), or any string."""
    schema = json.loads(json.dumps(base_schema()))  # a copy: the cached one stays as shipped
    if tool_names:
        names = sorted(set(tool_names))
        either = "|".join(re.escape(n) for n in names)
        schema["properties"]["tool_name"] = {
            "anyOf": [
                {"type": "string", "enum": names},
                {"type": "string", "pattern": f"^(?:{either}):[A-Za-z_][A-Za-z0-9_]*$"},
            ]
        }
    else:
        schema["properties"]["tool_name"] = {"type": "string", "minLength": 1}
    return schema


def response_format(tool_names: list[str] | None) -> dict[str, Any]:
    """OpenAI's `response_format` asking for Agent Zero's response schema."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": SCHEMA_NAME,
            "schema": response_schema(tool_names),
            "strict": True,
        },
    }


def _subagents() -> Any:
    for name in ("helpers.subagents", "python.helpers.subagents"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _has_mcp_servers(agent: Any) -> bool:
    raw = getattr(getattr(agent, "config", None), "mcp_servers", "") or ""
    try:
        servers = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return bool(str(raw).strip())
    if isinstance(servers, dict):
        servers = servers.get("mcpServers", servers)
    return bool(servers)


def tool_names_of(agent: Any) -> list[str] | None:
    """The names the agent's `get_tool` can load, None when they cannot be known."""
    subagents = _subagents()
    if subagents is None or _has_mcp_servers(agent):
        return None
    try:
        folders = subagents.get_paths(agent, "tools")
    except Exception as exc:  # another Agent Zero version: no narrowing
        log.debug("agentrl: the agent's tool folders are unknown (%s)", exc)
        return None
    names = {
        f.stem
        for folder in folders or []
        if Path(folder).is_dir()
        for f in Path(folder).glob("*.py")
        if f.stem not in NOT_TOOLS
    }
    return sorted(names) or None
