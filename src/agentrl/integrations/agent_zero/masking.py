"""No secret of Agent Zero's store leaves the agent in clear.

Agent Zero keeps secrets in `usr/secrets.env` (and a project's `.a0proj/secrets.env`) and
shows the model `§§secret(NAME)` placeholders; its own extensions put the values into tool
arguments (`tool_execute_before/_10_unmask_secrets`) and mask them in tool output and history.
But the model may write a secret's value itself (in its thoughts, its answer, a tool's
arguments), and what the plugin sees depends on the order the extensions run in. So every
text field of every event the plugin publishes is masked here, last, against the values of
the store: each value becomes its placeholder (as Agent Zero's `mask_values` does, values
under 4 characters left alone), in its plain and its JSON-escaped spelling (an answer's raw
text holds the value as written inside a JSON string).

`mask_event` is pure; `secrets_of` reads Agent Zero's store for a chat (its project's
secrets included) and gives {} outside Agent Zero.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from agentrl.contracts.base import Event

log = logging.getLogger("agentrl.agent_zero")

PLACEHOLDER = "§§secret({key})"
MIN_LENGTH = 4  # Agent Zero's mask_values leaves shorter values alone

E = TypeVar("E", bound=Event)


def _spellings(value: str) -> list[str]:
    """The value as it may appear in a text: as is, and escaped inside a JSON string."""
    out = [value]
    for ascii_only in (True, False):
        escaped = json.dumps(value, ensure_ascii=ascii_only)[1:-1]
        if escaped not in out:
            out.append(escaped)
    return out


class Masker:
    """Replaces every secret value (longest first) with its placeholder."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        pairs = [
            (str(k).upper(), str(v))
            for k, v in secrets.items()
            if isinstance(v, str) and len(v.strip()) >= MIN_LENGTH
        ]
        self.rules = sorted(
            ((spelling, PLACEHOLDER.format(key=k)) for k, v in pairs for spelling in _spellings(v)),
            key=lambda r: -len(r[0]),
        )

    def __bool__(self) -> bool:
        return bool(self.rules)

    def text(self, text: str) -> str:
        for value, placeholder in self.rules:
            if value in text:
                text = text.replace(value, placeholder)
        return text

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


def mask_event(event: E, secrets: Mapping[str, str]) -> E:
    """`event` with every secret value in any of its text fields replaced by its
    placeholder; the same object when there is nothing to mask."""
    masker = Masker(secrets)
    if not masker:
        return event
    data = event.model_dump(mode="json")
    masked = masker.value(data)
    if masked == data:
        return event
    return type(event).model_validate(masked)


def mask_text(text: str | None, secrets: Mapping[str, str]) -> str | None:
    return None if text is None else Masker(secrets).text(text)


def secrets_of(context: Any) -> dict[str, str]:
    """The secrets Agent Zero's store holds for this chat (its project's merged in, as
    `get_secrets_manager(context)` gives them); {} outside Agent Zero or on any error."""
    for name in ("helpers.secrets", "python.helpers.secrets"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        try:
            get = module.get_secrets_manager
            try:
                manager = get(context)
            except TypeError:  # an older signature without the context
                manager = get()
            found = manager.load_secrets()
        except Exception:  # never into Agent Zero's loop
            log.warning("agentrl: could not read Agent Zero's secrets store", exc_info=True)
            return {}
        return {str(k): str(v) for k, v in dict(found or {}).items() if v}
    return {}
