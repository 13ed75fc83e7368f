"""Agent Zero's system prompt as its default agent sees it on a new chat, rendered from an
Agent Zero folder the way Agent Zero renders it (for `agentrl bench serving
--agent-zero-prompt FILE`: the prefix cache measured on the real prompt, not one of its size).

What Agent Zero does, and so what this does (its `helpers/files.py` `read_prompt_file`,
`process_includes`, `evaluate_text_conditions`, `replace_placeholders_text`; `agent.py`
`get_system_prompt`; the `system_prompt` extensions):

- prompt folders, first found wins: `plugins/*/agents/<profile>/prompts`,
  `agents/<profile>/prompts`, `usr/prompts`, `plugins/*/prompts` (enabled plugins, by name;
  a `.toggle-0` file disables one), `prompts`;
- a file's variables come from its `.py` variables plugin, then the caller's; `{{if x}}`
  blocks are kept when `x` is truthy, dropped when not (a condition it cannot evaluate is
  left as it is, as Agent Zero does); `{{x}}` is `str(value)`; `{{ include "f" }}` renders
  `f` from the same folders with the caller's variables (not the plugin's);
- the `system_prompt` extensions in file-name order: the text editor's tool arguments, the
  main prompt, the tools prompt (every `agent.system.tool.*.md`, unique by name, sorted, and
  the vision note when the chat model has vision, as by default), MCP (none configured),
  secrets (none), skills (every `SKILL.md` under the skill folders), projects (no project),
  prompt includes (an empty work dir), and the memory plugin's behaviour rules, put first;
- the parts joined with a blank line.

Defaults of a fresh install: profile `agent0`, work dir `/a0/usr/workdir`, no secrets, no
variables, no MCP servers, no project, no `usr/` content. Two of Agent Zero's `.py`
variables plugins are computed here (the work dir of `agent.system.main.tips`, the
subordinate profiles of `agent.system.tool.call_sub`); another one is an error, so a newer
Agent Zero that adds one is noticed rather than rendered wrong.

usage: python -m agentrl.integrations.agent_zero.render_prompt AGENT_ZERO_DIR [OUT]
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

PROFILE = "agent0"
WORKDIR = "/a0/usr/workdir"
TEXT_EDITOR_LINES = 100  # plugins/_text_editor's default_line_count

_IF = re.compile(r"{{\s*if\s+(.*?)}}", flags=re.DOTALL)
_TOKEN = re.compile(r"{{\s*(if\b.*?|endif)\s*}}", flags=re.DOTALL)
_NAME = re.compile(r"(not\s+)?([A-Za-z_][A-Za-z0-9_]*)")
_INCLUDE = re.compile(r"{{\s*include\s*['\"](.*?)['\"]\s*}}")
_ORIGINAL = re.compile(r"{{\s*include\s+original\s*}}")


def _condition(text: str, names: dict[str, Any]) -> bool:
    """`name` or `not name` (all Agent Zero's templates use); anything else raises, and a
    name that is not given raises (simpleeval's NameNotDefined): the block stays as is."""
    m = _NAME.fullmatch(text.strip())
    if m is None or m.group(2) not in names:
        raise ValueError(text)
    value = bool(names[m.group(2)])
    return not value if m.group(1) else value


def evaluate_conditions(content: str, **names: Any) -> str:
    """Agent Zero's `evaluate_text_conditions` (nested `{{if}}` ... `{{endif}}`)."""
    m_if = _IF.search(content)
    if not m_if:
        return content
    depth, pos = 1, m_if.end()
    while True:
        m = _TOKEN.search(content, pos)
        if not m:
            return content
        depth += 1 if m.group(1).startswith("if ") else -1
        if depth == 0:
            break
        pos = m.end()
    before, inner, after = (
        content[: m_if.start()],
        content[m_if.end() : m.start()],
        content[m.end() :],
    )
    try:
        keep = _condition(m_if.group(1), names)
    except ValueError:
        return content
    kept = before + evaluate_conditions(inner, **names) if keep else before
    return kept + evaluate_conditions(after, **names)


def _remove_code_fences(text: str) -> str:
    return re.sub(r"(```|~~~)(.*?\n)(.*?)(\1)", lambda m: m.group(3), text, flags=re.DOTALL)


def _is_full_json_template(text: str) -> bool:
    return bool(re.fullmatch(r"^\s*(```|~~~)\s*json\s*\n(.*?)\n\1\s*$", text.strip(), re.DOTALL))


_SKILL_NAME = re.compile(r"^[a-z0-9-]+$")


def frontmatter(text: str) -> dict[str, Any] | None:
    """A SKILL.md's frontmatter (Agent Zero's `split_frontmatter`: PyYAML, else its
    key: value fallback); None when it has none or it is invalid."""
    import yaml

    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        if line.strip() == "---":
            start = i
            break
        if line.strip():
            return None
    if start is None:
        return None
    end = next((j for j in range(start + 1, len(lines)) if lines[j].strip() == "---"), None)
    if end is None:
        return None
    fm_text = "\n".join(lines[start + 1 : end]).strip()
    if not fm_text:
        return {}
    try:
        parsed = yaml.safe_load(fm_text)
    except yaml.YAMLError:
        parsed = None
    if parsed is not None:
        return parsed if isinstance(parsed, dict) else None
    data: dict[str, Any] = {}
    key = None
    for raw in fm_text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip().startswith("#"):
            continue
        if m := re.match(r"^([A-Za-z0-9_.-]+)\s*:\s*(.*)$", line):
            key, val = m.group(1), m.group(2).strip()
            if len(val) > 1 and val[0] == val[-1] and val[0] in "\"'":
                val = val[1:-1]
            data[key] = val if val else []
        elif (m := re.match(r"^\s*-\s*(.*)$", line)) and key:
            item = m.group(1).strip()
            if len(item) > 1 and item[0] == item[-1] and item[0] in "\"'":
                item = item[1:-1]
            if not isinstance(data.get(key), list):
                data[key] = []
            data[key].append(item)
    return data or None


def _valid_skill(name: str, descr: str, compatibility: str) -> bool:
    """Agent Zero's `validate_skill`: a skill that fails it is not listed."""
    return (
        1 <= len(name) <= 64
        and bool(_SKILL_NAME.match(name))
        and not name.startswith("-")
        and not name.endswith("-")
        and "--" not in name
        and 0 < len(descr) <= 1024
        and len(compatibility) <= 500
    )


class Renderer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.plugins = self._enabled_plugins()
        self.dirs = self._prompt_dirs()

    # ---- where files are ------------------------------------------------------------------
    def _enabled_plugins(self) -> list[Path]:
        base = self.root / "plugins"
        found = sorted(
            (d for d in base.iterdir() if d.is_dir() and not d.name.startswith(".")),
            key=lambda d: d.name,
        )
        return [d for d in found if (d / "plugin.yaml").exists() and not (d / ".toggle-0").exists()]

    def _prompt_dirs(self) -> list[Path]:
        dirs = [p / "agents" / PROFILE / "prompts" for p in self.plugins]
        dirs += [self.root / "agents" / PROFILE / "prompts", self.root / "usr" / "prompts"]
        dirs += [p / "prompts" for p in self.plugins]
        dirs.append(self.root / "prompts")
        return [d for d in dirs if d.is_dir()]

    def find(self, name: str, dirs: list[Path]) -> Path:
        for d in dirs:
            if (d / name).exists():
                return d / name
        raise FileNotFoundError(name)

    # ---- Agent Zero's read_prompt ---------------------------------------------------------
    def read_prompt(self, name: str, *, _dirs: list[Path] | None = None, **kwargs: Any) -> str:
        dirs = self.dirs if _dirs is None else _dirs
        path = self.find(name, dirs)
        content = path.read_text(encoding="utf-8")
        variables = {**self.plugin_variables(path, dirs), **kwargs}
        content = evaluate_conditions(content, **variables)
        for key, value in variables.items():
            content = content.replace("{{" + key + "}}", str(value))
        content = self._includes(content, dirs, name, path.parent, **kwargs)
        if _is_full_json_template(content):  # Agent.read_prompt
            content = _remove_code_fences(content)
        return content

    def _includes(
        self, content: str, dirs: list[Path], name: str, source: Path, **kwargs: Any
    ) -> str:
        def original(_: re.Match[str]) -> str:
            rest = dirs[dirs.index(source) + 1 :] if source in dirs else []
            try:
                return self.read_prompt(name, _dirs=rest, **kwargs) if rest else ""
            except FileNotFoundError:
                return ""

        def include(m: re.Match[str]) -> str:
            if os.path.isabs(m.group(1)):
                return m.group(0)
            try:
                return self.read_prompt(m.group(1), _dirs=dirs, **kwargs)
            except FileNotFoundError:
                return m.group(0)

        return _INCLUDE.sub(include, _ORIGINAL.sub(original, content))

    def plugin_variables(self, path: Path, dirs: list[Path]) -> dict[str, Any]:
        """The variables of `path`'s `.py` plugin (two are known; another is an error)."""
        try:
            plugin = self.find(path.stem + ".py", [path.parent, *dirs])
        except FileNotFoundError:
            return {}
        if plugin.name == "agent.system.main.tips.py":
            return {"workdir_path": WORKDIR}
        if plugin.name == "agent.system.tool.call_sub.py":
            return {"agent_profiles": self.agent_profiles() or None}
        raise NotImplementedError(f"Agent Zero's variables plugin {plugin} is not rendered here")

    # ---- what the extensions read ----------------------------------------------------------
    def agent_profiles(self) -> dict[str, dict[str, str]]:
        """`subagents.get_available_agents_dict(None)`: default agents, then plugins' (merged)."""
        import yaml

        out: dict[str, dict[str, str]] = {}
        for base in [self.root / "agents", *(p / "agents" for p in self.plugins)]:
            if not base.is_dir():
                continue
            for sub in sorted(d for d in base.iterdir() if d.is_dir()):
                spec = sub / "agent.yaml"
                if not spec.exists():
                    continue
                data = yaml.safe_load(spec.read_text()) or {}
                if data.get("enabled", True) is False:
                    continue
                name = data.get("name") or sub.name
                out[name] = {
                    "title": data.get("title") or name,
                    "description": data.get("description") or "",
                    "context": data.get("context") or "",
                }
        return out

    def skills(self) -> list[tuple[str, str]]:
        """(name, description) of every SKILL.md under the agent's skill folders, deduped."""

        roots = [p / "agents" / PROFILE / "skills" for p in self.plugins]
        roots += [self.root / "agents" / PROFILE / "skills", self.root / "usr" / "skills"]
        roots += [p / "skills" for p in self.plugins]
        roots.append(self.root / "skills")
        seen: dict[str, tuple[str, str]] = {}
        for root in roots:
            if not root.is_dir():
                continue
            for md in sorted(root.rglob("SKILL.md"), key=str):
                if any(part.startswith(".") for part in md.relative_to(root).parts):
                    continue
                fm = frontmatter(md.read_text(encoding="utf-8", errors="replace"))
                if fm is None:
                    continue
                name = str(fm.get("name") or fm.get("skill") or "").strip()
                descr = str(
                    fm.get("description") or fm.get("when_to_use") or fm.get("summary") or ""
                ).strip()
                if not _valid_skill(name, descr, str(fm.get("compatibility") or "").strip()):
                    continue
                key = re.sub(r"\s+", "-", name.lower()) or md.parent.name
                seen.setdefault(key, (name, descr))
        return list(seen.values())

    # ---- the system_prompt extensions ------------------------------------------------------
    def system_prompt(self) -> str:
        parts: list[str] = []
        tool_kwargs: dict[str, dict[str, Any]] = {
            "agent.system.tool.text_editor.md": {"default_line_count": TEXT_EDITOR_LINES}
        }
        parts.append(self.read_prompt("agent.system.main.md"))  # _10_main_prompt
        names = sorted({p.name for d in self.dirs for p in d.glob("agent.system.tool.*.md")})
        tools = "\n\n".join(self.read_prompt(n, **tool_kwargs.get(n, {})) for n in names)
        prompt = self.read_prompt("agent.system.tools.md", tools=tools)  # _11_tools_prompt
        parts.append(prompt + "\n\n" + self.read_prompt("agent.system.tools_vision.md"))
        # _12_mcp_prompt: no MCP servers configured, nothing
        secrets = self.read_prompt("agent.system.secrets.md", secrets="", vars="")
        if secrets:  # _13_secrets_prompt
            parts.append(secrets)
        listed = [f"**{n.replace(chr(10), ' ')[:100]}** {d.replace(chr(10), ' ')[:500]}"
                  for n, d in self.skills()]  # fmt: skip
        if listed:  # _13_skills_prompt
            parts.append(self.read_prompt("agent.system.skills.md", skills="\n".join(listed)))
        parts.append(  # _14_project_prompt
            self.read_prompt("agent.system.projects.main.md")
            + "\n\n"
            + self.read_prompt("agent.system.projects.inactive.md")
        )
        parts.append(  # _16_promptinclude: an empty work dir
            self.read_prompt(
                "agent.system.promptinclude.md", name_pattern="*.promptinclude.md", includes=""
            )
        )
        rules = self.read_prompt("agent.system.behaviour_default.md")
        parts.insert(0, self.read_prompt("agent.system.behaviour.md", rules=rules))  # _20
        return "\n\n".join(parts)


def render(root: Path) -> str:
    return Renderer(root).system_prompt()


if __name__ == "__main__":
    text = render(Path(sys.argv[1]))
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
