"""PEP 517 backend of agentrl-a0-client: the wheel of
agentrl.integrations.agent_zero.client, built from this checkout's src/agentrl (that module
is loaded by path, so building needs neither agentrl installed nor any download)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent.parent / "src" / "agentrl"


def _client() -> Any:
    path = PACKAGE / "integrations" / "agent_zero" / "client.py"
    spec = importlib.util.spec_from_file_location("_agentrl_a0_client_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _version() -> str:
    text = (PACKAGE / "__init__.py").read_text()
    found = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    return found.group(1) if found else "0.0.0"


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    return []


def build_wheel(
    wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None
) -> str:
    return str(_client().build_wheel(PACKAGE, Path(wheel_directory), _version()).name)
