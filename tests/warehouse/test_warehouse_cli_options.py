"""The warehouse commands' options are drawn from `agentrl.warehouse.options` and
`WarehouseSettings` (issue 55.3): each chosen field is an option helped by its docstring,
`--set` reaches the others, unset options keep the model's values (`--quick`'s), and a
refused value exits 2."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from agentrl.cli import app
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.options import ExportOptions, IngesterOptions, StatsQuery, WarehouseBench
from config_cli_check import RUNNER, check_fields, shown

COMMANDS = [
    (["stats", "success"], StatsQuery),
    (["stats", "tools"], StatsQuery),
    (["warehouse", "migrate"], WarehouseSettings),
    (["warehouse", "serve"], IngesterOptions),
    (["warehouse", "export", "out.jsonl"], ExportOptions),
    (["bench", "warehouse"], WarehouseBench),
]


_shown = shown


@pytest.mark.parametrize(("command", "model"), COMMANDS)
def test_every_field_is_reachable_and_helped_by_its_docstring(
    command: list[str], model: type[BaseModel]
) -> None:
    text = check_fields(command, model)
    assert "--set" in text and "default 30" not in text


def test_options_keep_their_names_and_override_the_model() -> None:
    got = _shown(
        ["warehouse", "export", "d.parquet", "--min-reward", "0.5", "--domain", "coding",
         "--domain", "research", "--no-raw", "--sample-size", "10", "--start", "2026-01-02"]
    )  # fmt: skip
    assert (got["min_reward"], got["domain"], got["include_raw"]) == (
        0.5,
        ["coding", "research"],
        False,
    )
    filt = ExportOptions.model_validate(got).dataset_filter()
    assert filt.task_domains == ["coding", "research"] and filt.date_range is not None
    stats = _shown(["stats", "success", "--json", "--bucket-s", "60", "--since", "2026-01-01"])
    assert (stats["as_json"], stats["bucket_s"], stats["since"]) == (
        True, 60, "2026-01-01T00:00:00",
    )  # fmt: skip
    serve = _shown(["warehouse", "serve", "--batch-size", "5", "--no-migrate"])
    assert (serve["batch_size"], serve["migrate"], serve["durable_prefix"]) == (
        5,
        False,
        "warehouse",
    )
    assert _shown(["bench", "warehouse", "--quick", "--n", "7"]) == {
        **WarehouseBench.quick().model_dump(), "n": 7,
    }  # fmt: skip
    assert _shown(["bench", "warehouse"])["n"] == 20_000  # no "0 means default" any more


def test_a_password_is_not_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_CLICKHOUSE_PASSWORD", "hunter2")
    result = RUNNER.invoke(app, ["warehouse", "migrate", "--show-config"])
    assert result.exit_code == 0 and "hunter2" not in result.output
    assert json.loads(result.output)["clickhouse_password"] == "***"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["bench", "warehouse", "--repeat", "0"], "repeat"),
        (["stats", "success", "--bucket-s", "0"], "bucket_s"),
        (["stats", "success", "--since", "yesterday"], "--since"),
        (["warehouse", "export", "o.jsonl", "--max-length", "0"], "max_length"),
        (["warehouse", "export", "o.jsonl", "--domain", "chess"], "chess"),
        (["warehouse", "serve", "--batch-size", "0"], "batch_size"),
        (["warehouse", "migrate", "--set", "nope=1"], "FIELD=VALUE"),
    ],
)
def test_bad_input_exits_2_with_the_reason(args: list[str], why: str) -> None:
    result = RUNNER.invoke(app, [*args, "--show-config"])
    assert result.exit_code == 2 and why in result.output, result.output
