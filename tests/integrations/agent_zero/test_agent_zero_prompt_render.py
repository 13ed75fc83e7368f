"""Agent Zero's system prompt rendered as Agent Zero renders it (`render_prompt`): folder
priority, includes (named and `original`), `{{if}}` blocks, placeholders, `.py` variables
plugins, tool prompts, skills, and the extensions' order; and the shipped bench prompt is
what the renderer makes of the Agent Zero commit it names (when that source is here)."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from agentrl.integrations.agent_zero.render_prompt import Renderer, evaluate_conditions, render

DATA = Path(__file__).with_name("data")
MIRROR = Path("/work/.mirror/agent0ai+agent-zero/repo")


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def agent_zero_shaped(root: Path) -> None:
    write(
        root,
        {
            "prompts/agent.system.main.md": '# Manual\n{{ include "agent.system.main.role.md" }}\n'
            '{{ include "agent.system.main.tips.md" }}\n{{ include "missing.md" }}',
            "prompts/agent.system.main.role.md": "default role",
            "agents/agent0/prompts/agent.system.main.role.md": "agent0 role, then: {{ include original }}",
            "prompts/agent.system.main.tips.md": "work in {{workdir_path}}",
            "prompts/agent.system.main.tips.py": "# a VariablesPlugin in Agent Zero",
            "prompts/agent.system.tools.md": "## tools\n{{tools}}",
            "prompts/agent.system.tools_vision.md": "## vision",
            "prompts/agent.system.tool.response.md": "### response (default)",
            "agents/agent0/prompts/agent.system.tool.response.md": "### response (agent0)",
            "prompts/agent.system.tool.call_sub.md": "### call_sub\n{{if agent_profiles}}\n"
            "profiles: {{agent_profiles}}\n{{endif}}",
            "prompts/agent.system.tool.call_sub.py": "# a VariablesPlugin in Agent Zero",
            "plugins/_editor/plugin.yaml": "name: editor",
            "plugins/_editor/prompts/agent.system.tool.text_editor.md": "### editor {{default_line_count}}",
            "plugins/_off/plugin.yaml": "name: off",
            "plugins/_off/.toggle-0": "",
            "plugins/_off/prompts/agent.system.tool.zzz.md": "### disabled plugin's tool",
            "prompts/agent.system.secrets.md": "{{if secrets}}\n## secrets\n{{secrets}}\n{{endif}}",
            "prompts/agent.system.skills.md": "## skills\n{{skills}}",
            "skills/good/SKILL.md": "---\nname: good-skill\ndescription: does good things\n---\nbody",
            "skills/bad/SKILL.md": "---\nname: Bad Name\ndescription: not listed\n---\n",
            "skills/.hidden/SKILL.md": "---\nname: hidden\ndescription: not listed\n---\n",
            "prompts/agent.system.projects.main.md": "projects",
            "prompts/agent.system.projects.inactive.md": "no project",
            "plugins/_editor/prompts/agent.system.promptinclude.md": "includes {{name_pattern}}"
            "{{if includes}}: {{includes}}{{endif}}",
            "prompts/agent.system.behaviour.md": "# Rules\n{{rules}}",
            "prompts/agent.system.behaviour_default.md": "- be kind",
            "agents/agent0/agent.yaml": "title: Agent 0\ndescription: main\ncontext: ''\n",
            "agents/helper/agent.yaml": "title: Helper\ndescription: helps\ncontext: use it\n",
        },
    )


def test_it_renders_like_agent_zero(tmp_path: Path) -> None:
    agent_zero_shaped(tmp_path)
    text = render(tmp_path)
    parts = text.split("\n\n")
    assert parts[0] == "# Rules\n- be kind"  # the behaviour rules go first
    assert "# Manual\nagent0 role, then: default role\nwork in /a0/usr/workdir\n" in text
    assert '{{ include "missing.md" }}' in text  # Agent Zero leaves an unknown include
    # tools: unique by name (agent0's response wins), sorted, a disabled plugin's left out
    tools = text[text.index("## tools") : text.index("## vision")]
    assert tools.index("### call_sub") < tools.index("### response") < tools.index("### editor 100")
    assert "### response (agent0)" in tools and "(default)" not in tools and "zzz" not in text
    assert (
        "profiles: {'agent0': {'title': 'Agent 0', 'description': 'main', 'context': ''}, "
        "'helper': {'title': 'Helper', 'description': 'helps', 'context': 'use it'}}"
    ) in text
    assert "## skills\n**good-skill** does good things" in text
    assert "Bad Name" not in text and "hidden" not in text
    assert "projects\n\nno project" in text
    assert text.endswith("includes *.promptinclude.md")  # nothing in the work dir
    assert "## secrets" not in text


def test_conditions_follow_agent_zero() -> None:
    assert evaluate_conditions("a{{if x}}b{{if y}}c{{endif}}{{endif}}d", x=1, y=0) == "abd"
    assert evaluate_conditions("{{if not x}}no x{{endif}}", x="") == "no x"
    kept = "{{if x == 1}}?{{endif}}"  # not evaluated here: left as it is, as on an error
    assert evaluate_conditions(kept, x=1) == kept
    assert evaluate_conditions("{{if z}}?{{endif}}") == "{{if z}}?{{endif}}"  # unknown name


def test_an_unknown_variables_plugin_is_an_error(tmp_path: Path) -> None:
    agent_zero_shaped(tmp_path)
    write(tmp_path, {"prompts/agent.system.main.role.py": "# new in a later Agent Zero"})
    with pytest.raises(NotImplementedError, match=r"agent\.system\.main\.role\.py"):
        Renderer(tmp_path).system_prompt()


def test_the_shipped_prompt_is_the_render_of_its_commit(tmp_path: Path) -> None:
    meta = json.loads((DATA / "agent_zero_system_prompt.json").read_text())
    if not (MIRROR / "HEAD").exists():
        pytest.skip("Agent Zero's source is not mirrored on this machine")
    try:
        tar = subprocess.run(
            ["git", f"--git-dir={MIRROR}", "archive", meta["agent_zero_commit"]],
            check=True,
            capture_output=True,
        ).stdout
    except subprocess.CalledProcessError:
        pytest.skip("the mirror lacks the recorded commit")
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(tmp_path, filter="data")
    assert render(tmp_path) == (DATA / meta["file"]).read_text()
