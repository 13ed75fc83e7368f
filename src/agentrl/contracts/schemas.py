"""JSON Schema export of the contracts, for producers in other languages.

The exported schemas describe the wire form (what `Event.to_json` writes), so they say what
PMOVES.AI's published agent-rl schemas say: the seed's fields only at the top level
(`additionalProperties: false`; nested objects stay open), no null, ids in canonical UUID
form (`format: uuid`), timestamps `format: date-time`, and only the enum values that go out
(agentrl's input-only spellings, such as algorithm `gigpo` or mixed_precision `no`, are left
out of the export: they are accepted on input but never written).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.contracts.base import Event
from agentrl.contracts.streams import stream_for
from agentrl.contracts.subjects import MODELS

# Values agentrl accepts on input (or keeps in memory) but writes differently on the wire:
# gigpo -> grpo (+ adv_estimator), no -> fp32, CONFIG/CANCELLED -> UNKNOWN (+ detail_code).
INPUT_ONLY_VALUES = {"gigpo": None, "no": "fp32", "CONFIG": None, "CANCELLED": None}
# Fields whose values producers mint as canonical UUIDs (the published schemas assert it).
UUID_FIELDS = {
    "trajectory_id",
    "reward_id",
    "training_job_id",
    "deployment_id",
    "feedback_id",
    "previous_training_job",
}


def wire_schema(model: type[Event]) -> dict[str, Any]:
    """The JSON Schema of `model`'s wire form."""
    schema = model.model_json_schema(mode="validation")
    _clean(schema)
    if model.FOLD_INTO in model.model_fields:  # the subjects PMOVES publishes schemas for
        schema["additionalProperties"] = False
    always = [n for n, f in model.model_fields.items() if f.default_factory is not None]
    schema["required"] = list(dict.fromkeys([*schema.get("required", []), *always]))
    for name in UUID_FIELDS & set(schema.get("properties", {})):
        prop = schema["properties"][name]
        prop.pop("minLength", None)
        prop["format"] = "uuid"
    schema["$id"] = model.SUBJECT
    schema["x-stream"] = stream_for(model.SUBJECT).name
    return schema


def _clean(node: Any) -> None:
    """No null types, no input-only enum values, anywhere in the schema; fields that are
    always written (they have a default) are required."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict):  # a field with a (non-null) default is always written
            always = [
                k for k, p in props.items() if isinstance(p, dict) and p.get("default") is not None
            ]
            if always:
                node["required"] = list(dict.fromkeys([*node.get("required", []), *always]))
        options = node.get("anyOf")
        if isinstance(options, list):
            kept = [o for o in options if o != {"type": "null"}]
            if len(kept) != len(options):
                if len(kept) == 1:
                    del node["anyOf"]
                    node.update({k: v for k, v in kept[0].items() if k not in node})
                else:
                    node["anyOf"] = kept
        if "default" in node and node["default"] is None:
            del node["default"]
        if isinstance(node.get("enum"), list):
            wire = [INPUT_ONLY_VALUES.get(v, v) if isinstance(v, str) else v for v in node["enum"]]
            node["enum"] = list(dict.fromkeys(v for v in wire if v is not None))
        for value in node.values():
            _clean(value)
    elif isinstance(node, list):
        for item in node:
            _clean(item)


def export_schemas(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for subject, model in MODELS.items():
        path = out_dir / f"{subject}.json"
        path.write_text(json.dumps(wire_schema(model), indent=2) + "\n")
        written.append(path)
    return written
