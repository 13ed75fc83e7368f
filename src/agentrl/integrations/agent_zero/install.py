"""`agentrl agent-zero install PATH`: copy the plugin into an Agent Zero checkout.

Two layouts, told apart by where Agent Zero keeps its extension base class:
  plugin (agent0ai/agent-zero since its plugin system, checked at 2d95cd9, 2026-04-03):
      helpers/extension.py -> the plugin folder goes to usr/plugins/agentrl/ as is
  legacy (older checkouts and forks, checked: POWERFULMOVES/PMOVES-Agent-Zero 0ff6097):
      python/helpers/extension.py -> extensions to python/extensions/<point>/, the tool to
      python/tools/, its prompt to prompts/, the rl-trainer profile to agents/rl-trainer/,
      and the settings (plugin.yaml, default_config.yaml) to usr/plugins/agentrl/
A `config.json` already there (settings the user saved) is never overwritten.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml

Layout = Literal["plugin", "legacy"]
PLUGIN_NAME = "agentrl"
KEEP = ("config.json",)
# files earlier versions installed that must not stay (relative to the extensions folder)
OBSOLETE = ("tool_execute_before/_80_agentrl_trajectory.py",)


def plugin_source() -> Path:
    """The plugin folder shipped in this package."""
    return Path(str(resources.files("agentrl.integrations.agent_zero") / "plugin"))


def detect_layout(root: Path) -> Layout:
    if (root / "helpers" / "extension.py").is_file():
        return "plugin"
    if (root / "python" / "helpers" / "extension.py").is_file():
        return "legacy"
    raise FileNotFoundError(
        f"{root} is not an Agent Zero checkout (no helpers/extension.py or "
        "python/helpers/extension.py)"
    )


@dataclass
class Installed:
    root: Path
    layout: Layout
    plugin_dir: Path
    files: list[Path] = field(default_factory=list)


def _copy(src: Path, dst: Path, out: Installed) -> None:
    if dst.name in KEEP and dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    out.files.append(dst)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def install(root: Path, layout: Layout | None = None) -> Installed:
    root = root.resolve()
    layout = layout or detect_layout(root)
    src = plugin_source()
    plugin_dir = root / "usr" / "plugins" / PLUGIN_NAME
    out = Installed(root, layout, plugin_dir)
    for rel in OBSOLETE:
        for ext in (plugin_dir / "extensions" / "python", root / "python" / "extensions"):
            (ext / rel).unlink(missing_ok=True)
    if layout == "plugin":
        for f in _files(src):
            _copy(f, plugin_dir / f.relative_to(src), out)
        return out
    for name in ("plugin.yaml", "default_config.yaml"):
        _copy(src / name, plugin_dir / name, out)
    for f in _files(src / "extensions" / "python"):
        _copy(f, root / "python" / "extensions" / f.relative_to(src / "extensions" / "python"), out)
    for f in _files(src / "tools"):
        _copy(f, root / "python" / "tools" / f.name, out)
    for f in _files(src / "prompts"):
        _copy(f, root / "prompts" / f.name, out)
    profile = src / "agents" / "rl-trainer"
    for f in _files(profile / "prompts"):
        _copy(f, root / "agents" / "rl-trainer" / "prompts" / f.name, out)
    meta = yaml.safe_load((profile / "agent.yaml").read_text())
    context = root / "agents" / "rl-trainer" / "_context.md"
    context.parent.mkdir(parents=True, exist_ok=True)
    context.write_text(f"# {meta['title']}\n- {meta['description']}\n- {meta['context']}\n")
    out.files.append(context)
    return out


def urls_from_environment() -> dict[str, str]:
    """Where agentrl runs, as this shell's agentrl settings say (the variables `agentrl up`
    reads: NATS_URL, AGENTRL_GATEWAY_PORT / _HOST, AGENTRL_API_PORT); only those set."""
    import os

    out: dict[str, str] = {}
    if os.environ.get("NATS_URL"):
        out["nats_url"] = os.environ["NATS_URL"]
    if os.environ.get("AGENTRL_GATEWAY_PORT") or os.environ.get("AGENTRL_GATEWAY_HOST"):
        host = os.environ.get("AGENTRL_GATEWAY_HOST") or "127.0.0.1"
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        out["gateway_url"] = f"http://{host}:{os.environ.get('AGENTRL_GATEWAY_PORT') or 8700}/v1"
    if os.environ.get("AGENTRL_API_PORT"):
        out["api_url"] = f"http://127.0.0.1:{os.environ['AGENTRL_API_PORT']}"
    return out


def served_context(gateway_url: str, model_name: str, token: str = "") -> int | None:
    """The served model's context window (`max_model_len` of GET /models, as agentrl's
    gateway and vLLM answer it); None when the gateway cannot say."""
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(gateway_url.rstrip("/") + "/models", headers=headers, timeout=3.0)
        resp.raise_for_status()
        entries = resp.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == model_name:
            size = entry.get("max_model_len") or entry.get("context_length")
            return int(size) if isinstance(size, int) and size > 0 else None
    return None


def model_settings(gateway_url: str, model_name: str, ctx_length: int | None = None) -> str:
    """What to enter in Agent Zero's chat model settings to use agentrl's gateway."""
    if ctx_length:
        ctx = f"  ctx_length: {ctx_length}   # the served model's context window\n"
    else:
        ctx = (
            "  ctx_length: the served model's context window (no answer from agentrl's "
            f"gateway at {gateway_url}: run this again while `agentrl up` runs, with "
            "--gateway-url if it serves elsewhere)\n"
        )
    return (
        "Chat model settings for Agent Zero (Settings > Agent > Chat Model, or "
        "usr/plugins/_model_config/config.json `chat_model`):\n"
        f"  provider: other (OpenAI compatible)   # litellm provider 'openai'\n"
        f"  name:     {model_name}\n"
        f"  api_base: {gateway_url}\n"
        "  api key:  any non-empty value, or a token from AGENTRL_API_TOKENS\n"
        f"{ctx}"
        "The gateway answers with the serving version in `model` and the "
        "x-agentrl-model-version header; agentrl's plugin records it per trajectory."
    )
