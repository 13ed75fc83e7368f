"""Stand-ins for the few Agent Zero objects the plugin touches, and a driver that replays
recorded loop data through Agent Zero's extension interface exactly as Agent Zero calls it.

Agent Zero cannot be installed here, and nothing of it is copied: these classes are written
for the tests from its source, read at agent0ai/agent-zero 2d95cd9 (2026-04-03):
- helpers/extension.py: `Extension(agent, **kwargs)` with `execute(**kwargs)` (may be
  async); extension classes are loaded per point from `<plugin>/extensions/python/<point>/`
  (every enabled plugin), file-name order, one class per file, `cls(agent=agent).execute(**kw)`;
- helpers/tool.py: `Tool(agent, name, method, args, message, loop_data, **kwargs)`,
  `async execute(**kwargs) -> Response(message, break_loop, additional)`;
- agent.py: `LoopData(user_message, iteration, last_response, ...)`; `Agent.number`,
  `config.profile`, `context.id`, `data` ("_superior" / "_subordinate");
  `monologue()` calls monologue_start(loop_data), then per iteration message_loop_start,
  chat_model_call_before(call_data) (call_data["model"] is the LiteLLM chat wrapper),
  chat_model_call_after(call_data, response, reasoning), response_stream_end,
  hist_add_ai_response (sets loop_data.last_response), process_tools ->
  tool_execute_before(tool_args, tool_name) / tool_execute_after(response, tool_name),
  message_loop_end (finally), and monologue_end (finally);
- tools/call_subordinate.py: `Agent(number + 1, config)` with the profile from the tool's
  args, `sub.set_data("_superior", agent)`, `agent.set_data("_subordinate", sub)`, then
  the subordinate's monologue; its answer is the tool's Response (break_loop False);
- history: `hist_add_message` calls the sync point hist_add_before(content_data, ai) for
  every message: the AI response (fw.ai_response), a tool's result (Tool.after_execution ->
  hist_add_tool_result: {"tool_name", "tool_result"}), warnings (fw.warning:
  {"system_warning": ...}: fw.msg_misformat, fw.msg_repeat when the answer repeats the last
  one, a repairable error's text); process_tools parses the answer with a dirty-JSON parser
  (a trailing comma is fine);
- helpers/plugins.py `get_plugin_config(plugin, agent=...)`: the project from the chat's data
  ("project"), the profile from `agent.config.profile` (always set), the first config.json
  of find_plugin_assets' order, which looks at a project's own plugin folder only when no
  profile is given; else default_config.yaml with A0_SET_<plugin>__<key>;
- helpers/secrets.py `get_secrets_manager(context)`: usr/secrets.env plus the project's
  .a0proj/secrets.env, `load_secrets()`, `mask_values()`, `replace_placeholders()`;
- `@extensible` functions emit `_functions/<module>/<qualname>/start|end` with
  data={"args", "kwargs", "result", "exception"} (AgentContext.kill_process and reset are
  sync, so are their extension calls); a killed task skips message_loop_end/monologue_end.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POINTS = (
    "monologue_start",
    "message_loop_start",
    "chat_model_call_before",
    "chat_model_call_after",
    "response_stream_end",
    "tool_execute_before",
    "tool_execute_after",
    "message_loop_end",
    "monologue_end",
    "hist_add_before",
    "_functions/agent/AgentContext/kill_process/start",
    "_functions/agent/AgentContext/remove/start",
)
MISFORMAT = (
    "You have misformatted your message. Follow system prompt instructions on JSON message "
    "formatting precisely."
)
REPEAT = "You have sent the same message again. You have to do something else!"

HELPERS = {
    "helpers/__init__.py": "",
    "helpers/extension.py": """
        from abc import abstractmethod


        class Extension:
            def __init__(self, agent, **kwargs):
                self.agent = agent
                self.kwargs = kwargs

            @abstractmethod
            def execute(self, **kwargs):
                pass
    """,
    "agent.py": """
        class AgentContext:
            _contexts = {}

            @staticmethod
            def get(id):
                return AgentContext._contexts.get(id)
    """,
    "helpers/api.py": """
        class Request:
            pass


        class Response:
            def __init__(self, response=None, status=200, mimetype=None):
                self.response = response
                self.status = status


        class ApiHandler:
            def __init__(self, app=None, thread_lock=None):
                self.app = app
                self.thread_lock = thread_lock

            async def process(self, input, request):
                raise NotImplementedError
    """,
    "helpers/plugins.py": """
        import json
        import os
        from pathlib import Path

        import yaml

        ROOT = Path(__file__).resolve().parent.parent


        def find_plugin_asset(plugin_name, *subpaths, project_name="", agent_profile=""):
            # find_plugin_assets(only_first=True), in its order: a project's profile folder;
            # the project-wide folder ONLY when no profile is given; usr/agents/<profile>;
            # usr/plugins; plugins
            candidates = []
            if project_name:
                meta = ROOT / "usr" / "projects" / project_name / ".a0proj"
                if agent_profile:
                    candidates.append(
                        meta / "agents" / agent_profile / "plugins" / plugin_name
                    )
                if not agent_profile or agent_profile == "*":
                    candidates.append(meta / "plugins" / plugin_name)
            if agent_profile:
                candidates.append(ROOT / "usr" / "agents" / agent_profile / "plugins" / plugin_name)
            candidates.append(ROOT / "usr" / "plugins" / plugin_name)
            candidates.append(ROOT / "plugins" / plugin_name)
            for base in candidates:
                path = base.joinpath(*subpaths)
                if path.exists():
                    return {"path": str(path)}
            return None


        def get_plugin_config(plugin_name, agent=None, project_name=None, agent_profile=None):
            # helpers/plugins.py: the project from the chat, the profile from the agent
            # (always set: "agent0" for the main agent), the first config.json found, else
            # the defaults with A0_SET_<plugin>__<key> applied (_apply_defaults_from_env)
            if project_name is None and agent is not None:
                project_name = agent.context.get_data("project")
            if agent_profile is None and agent is not None:
                agent_profile = agent.config.profile
            found = find_plugin_asset(
                plugin_name,
                "config.json",
                project_name=project_name or "",
                agent_profile=agent_profile or "",
            )
            if found:
                return json.loads(Path(found["path"]).read_text())
            default = ROOT / "usr" / "plugins" / plugin_name / "default_config.yaml"
            if not default.is_file():
                return None
            config = yaml.safe_load(default.read_text()) or {}
            for key in list(config):
                env = os.environ.get(f"A0_SET_{plugin_name}__{key}")
                if env is not None:
                    config[key] = env
            return config
    """,
    "helpers/secrets.py": """
        from pathlib import Path

        ROOT = Path(__file__).resolve().parent.parent
        PLACEHOLDER = "\u00a7\u00a7secret({key})"


        class SecretsManager:
            # helpers/secrets.py: KEY=VALUE lines of usr/secrets.env (and the project's
            # .a0proj/secrets.env), keys upper-case; mask_values replaces values of 4 or
            # more characters by their placeholder, replace_placeholders the reverse
            def __init__(self, *files):
                self.files = files

            def load_secrets(self):
                out = {}
                for path in self.files:
                    if not path.is_file():
                        continue
                    for line in path.read_text().splitlines():
                        key, sep, value = line.partition("=")
                        if sep and key.strip() and not key.startswith("#"):
                            out[key.strip().upper()] = value.strip()
                return out

            def mask_values(self, text):
                if not text:
                    return text
                items = sorted(self.load_secrets().items(), key=lambda kv: -len(kv[1]))
                for key, value in items:
                    if value and len(value.strip()) >= 4:
                        text = text.replace(value, PLACEHOLDER.format(key=key))
                return text

            def replace_placeholders(self, text):
                for key, value in self.load_secrets().items():
                    text = text.replace(PLACEHOLDER.format(key=key), value)
                return text


        def get_secrets_manager(context=None):
            files = [ROOT / "usr" / "secrets.env"]
            project = context.get_data("project") if context is not None else None
            if project:
                files.append(ROOT / "usr" / "projects" / project / ".a0proj" / "secrets.env")
            return SecretsManager(*files)
    """,
    "helpers/subagents.py": """
        from pathlib import Path

        ROOT = Path(__file__).resolve().parent.parent


        def get_paths(agent, *subpaths, must_exist_completely=True, default_root="", **kw):
            # the folders Agent.get_tool searches, in priority order: the profile's (user,
            # default), usr/, every plugin's, then the default root (helpers/subagents.py)
            profile = agent.config.profile if agent and agent.config.profile else ""
            roots = []
            if profile:
                roots += [ROOT / "usr" / "agents" / profile, ROOT / "agents" / profile]
            roots.append(ROOT / "usr")
            roots += sorted((ROOT / "usr" / "plugins").glob("*"))
            roots.append(ROOT / default_root)
            paths = [str(r.joinpath(*subpaths)) for r in roots]
            if must_exist_completely:
                paths = [p for p in paths if Path(p).exists()]
            return paths
    """,
    "helpers/tool.py": """
        from abc import abstractmethod
        from dataclasses import dataclass
        from typing import Any


        @dataclass
        class Response:
            message: str
            break_loop: bool
            additional: dict[str, Any] | None = None


        class Tool:
            def __init__(self, agent, name, method, args, message, loop_data, **kwargs):
                self.agent = agent
                self.name = name
                self.method = method
                self.args = args
                self.loop_data = loop_data
                self.message = message
                self.progress = ""

            @abstractmethod
            async def execute(self, **kwargs):
                pass
    """,
}


def make_checkout(root: Path, legacy: bool = False) -> Path:
    """An Agent Zero-shaped folder: the stand-in helpers (under python/ for the legacy layout)."""
    base = root / "python" if legacy else root
    for rel, text in HELPERS.items():
        path = (root if rel == "agent.py" else base) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    if legacy:
        (root / "python" / "__init__.py").write_text("")
    return root


def import_file(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def classes_in(path: Path, base: type) -> list[type]:
    """Agent Zero's rule: the last (by name) subclass of `base` defined or imported."""
    members = inspect.getmembers(import_file(path), inspect.isclass)
    return [c for _, c in reversed(members) if c is not base and issubclass(c, base)][:1]


class Extensions:
    """Extension classes of each point, found under `folders` like Agent Zero finds them."""

    def __init__(self, folders: list[Path], package: str = "helpers") -> None:
        # the stand-in (sys.path): helpers.extension, or python.helpers.extension (legacy)
        Extension = importlib.import_module(f"{package}.extension").Extension
        self.package = package
        self.by_point: dict[str, list[type]] = {}
        for point in POINTS:
            found = {}
            for folder in folders:
                d = folder / point
                if d.is_dir():
                    for f in sorted(d.glob("*.py")):
                        found.setdefault(f.name, classes_in(f, Extension))
            self.by_point[point] = [c for name in sorted(found) for c in found[name]]

    async def call(self, point: str, agent: Any, **kwargs: Any) -> None:
        for cls in self.by_point.get(point, []):
            result = cls(agent=agent).execute(**kwargs)
            if inspect.isawaitable(result):
                await result

    def call_sync(self, point: str, agent: Any, **kwargs: Any) -> None:
        """call_extensions_sync: an extension that returns an awaitable is an error."""
        for cls in self.by_point.get(point, []):
            if inspect.isawaitable(cls(agent=agent).execute(**kwargs)):
                raise ValueError(f"Extension {cls.__name__} returned awaitable in sync mode")


@dataclass
class Config:
    profile: str = ""


class Log:
    """helpers/log.py: the items the web UI shows, numbered `no` from 0."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []

    def log(self, type: str, content: Any = "") -> dict[str, Any]:
        item = {"no": len(self.logs), "type": type, "content": content}
        self.logs.append(item)
        return item


class Context:
    def __init__(self, context_id: str) -> None:
        self.id = context_id
        self.data: dict[str, Any] = {}
        self.agent0: Any = None
        self.streaming_agent: Any = None
        self.log = Log()

    def get_data(self, key: str, recursive: bool = True) -> Any:
        return self.data.get(key)

    def set_data(self, key: str, value: Any, recursive: bool = True) -> None:
        self.data[key] = value


@dataclass
class Message:
    """A history message: Agent Zero keeps the user message as the fw.user_message template."""

    content: Any
    id: str = ""


class LoopData:
    def __init__(self, **kwargs: Any) -> None:
        self.iteration = -1
        self.user_message: Message | None = None
        self.last_response = ""
        self.params_temporary: dict[str, Any] = {}
        self.current_tool = None
        for key, value in kwargs.items():
            setattr(self, key, value)


@dataclass
class Agent:
    number: int
    config: Config
    context: Context
    data: dict[str, Any] = field(default_factory=dict)
    last_user_message: Message | None = None

    @property
    def agent_name(self) -> str:
        return f"A{self.number}"

    def get_data(self, key: str) -> Any:
        return self.data.get(key)

    def set_data(self, key: str, value: Any) -> None:
        self.data[key] = value


class Served:
    """What LiteLLM hands its success callbacks for a call to agentrl's gateway: the
    assembled response (`id`, `model`, `usage`) and the provider's headers, prefixed
    `llm_provider-` (litellm ModelResponse._hidden_params["additional_headers"])."""

    def __init__(self, served: dict[str, Any]) -> None:
        self.id = served["id"]
        self.model = served["model"]
        self.usage = dict(served["usage"])
        self._hidden_params = {
            "additional_headers": {"llm_provider-x-agentrl-model-version": served["model"]}
        }


class ChatModel:
    """Agent Zero's LiteLLM chat wrapper for one recorded call: `unified_call(**kwargs)`
    passes extra kwargs (here: `metadata`) to LiteLLM, which reports the finished call to
    its callbacks; the reply is the recorded response text."""

    def __init__(
        self, iteration: dict[str, Any], api_base: str = "", model: str = "", provider: str = ""
    ) -> None:
        self.iteration = iteration
        self.kwargs = {"api_base": api_base} if api_base else {}  # as LiteLLMChatWrapper
        self.kwargs_seen: dict[str, Any] = {}
        if model:  # LiteLLMChatWrapper(model, provider): model_name "<provider>/<model>"
            self.model_name, self.provider = f"{provider}/{model}", provider

    async def unified_call(self, messages: Any = None, **kwargs: Any) -> tuple[str, str]:
        self.kwargs_seen = kwargs
        served = self.iteration.get("served")
        if served is not None and "metadata" in kwargs:
            from agentrl.integrations.agent_zero import capture

            capture.record({"litellm_params": {"metadata": kwargs["metadata"]}}, Served(served))
        return self.iteration["response"], ""


def message_text_of(message: Any) -> str:
    content = getattr(message, "content", "")
    if isinstance(content, dict):
        return str(content.get("user_message", ""))
    return str(content)


def parse_tool_request(text: str) -> dict[str, Any] | None:
    """What process_tools finds: the outermost JSON object, trailing commas allowed (its
    dirty-JSON parser takes them); None: a misformat."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    body = text[start : end + 1]
    for candidate in (body, re.sub(r",(\s*[}\]])", r"\1", body)):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        return value if isinstance(value, dict) else None
    return None


class Driver:
    """Replays recorded iterations of Agent Zero's message loop through the extensions."""

    def __init__(self, extensions: Extensions) -> None:
        self.ext = extensions
        self.calls: list[Any] = []  # the chat model of each call, as the extensions left it
        self.api_base = ""  # the chat model's API base (Agent Zero's chat model settings)
        self.history: list[tuple[bool, Any]] = []  # (ai, content) as the model will see it
        self.tool_args_seen: list[dict[str, Any]] = []  # what each tool was called with
        self.model_factory: Any = None  # (iteration, api_base) -> chat model; default ChatModel

    def hist_add(self, agent: Agent, ai: bool, content: Any) -> None:
        """Agent.hist_add_message: extensions see (and may rewrite) the content first."""
        content_data = {"content": content}
        self.ext.call_sync("hist_add_before", agent, content_data=content_data, ai=ai)
        self.history.append((ai, content_data["content"]))
        agent.context.log.log("agent" if ai else "tool", content_data["content"])

    def hist_add_warning(self, agent: Agent, message: str) -> None:
        self.hist_add(agent, False, {"system_warning": message})

    async def monologue(self, agent: Agent, iterations: list[dict[str, Any]]) -> str | None:
        Response = importlib.import_module(f"{self.ext.package}.tool").Response

        loop_data = LoopData(user_message=agent.last_user_message)
        if agent.number == 0:  # communicate(): the user's message is logged first
            agent.context.log.log("user", message_text_of(agent.last_user_message))
        if agent.context.agent0 is None:
            agent.context.agent0 = agent
        alive = True  # False once the task was killed: no end hooks post mortem
        await self.ext.call("monologue_start", agent, loop_data=loop_data)
        try:
            for it in iterations:
                loop_data.iteration += 1
                agent.context.streaming_agent = agent
                await self.ext.call("message_loop_start", agent, loop_data=loop_data)
                try:
                    factory = self.model_factory or ChatModel
                    model = factory(it, self.api_base)
                    call_data = {"model": model, "messages": [], "background": False}
                    await self.ext.call("chat_model_call_before", agent, call_data=call_data)
                    text, reasoning = await call_data["model"].unified_call(messages=[])
                    self.calls.append(call_data["model"])
                    await self.ext.call(
                        "chat_model_call_after",
                        agent,
                        call_data=call_data,
                        response=text,
                        reasoning=reasoning,
                    )
                    await self.ext.call("response_stream_end", agent, loop_data=loop_data)
                    repeated = loop_data.last_response == text
                    loop_data.last_response = text  # hist_add_ai_response
                    self.hist_add(agent, True, {"ai_response": text})
                    if repeated:
                        self.hist_add_warning(agent, REPEAT)
                        continue
                    request = parse_tool_request(text)
                    if request is None:
                        self.hist_add_warning(agent, MISFORMAT)
                        continue
                    if not isinstance(request.get("tool_name"), str) or not isinstance(
                        request.get("tool_args"), dict
                    ):
                        raise ValueError("Tool request must have a tool_name and tool_args")
                    raw_name = request["tool_name"]
                    name = raw_name.split(":", 1)[0]
                    args = request["tool_args"]
                    await self.ext.call(
                        "tool_execute_before", agent, tool_args=args, tool_name=name
                    )
                    self.tool_args_seen.append(args)
                    outcome = it["tool"]
                    if "raises" in outcome:
                        raise RuntimeError(outcome["raises"])
                    if outcome.get("blocks"):
                        await asyncio.Event().wait()  # until the task is killed
                    if "subordinate" in outcome:
                        answer = await self.call_subordinate(agent, args, outcome["subordinate"])
                        response = Response(message=answer or "", break_loop=False)
                    else:
                        response = Response(
                            message=outcome.get("message"),
                            break_loop=outcome.get("break_loop", False),
                        )
                    await self.ext.call(
                        "tool_execute_after", agent, response=response, tool_name=name
                    )
                    # Tool.after_execution (a non-text answer fails in .strip(): an error)
                    text = response.message.strip()
                    self.hist_add(agent, False, {"tool_name": name, "tool_result": text})
                    if response.break_loop:
                        return str(response.message)
                except asyncio.CancelledError:
                    alive = False
                    raise
                except Exception as exc:  # a repairable error goes back to the agent
                    self.hist_add_warning(agent, f"{type(exc).__name__}: {exc}")
                finally:
                    if alive:
                        await self.ext.call("message_loop_end", agent, loop_data=loop_data)
            return None
        except asyncio.CancelledError:
            alive = False
            raise
        finally:
            agent.context.streaming_agent = None
            if alive:
                await self.ext.call("monologue_end", agent, loop_data=loop_data)

    async def call_subordinate(
        self, agent: Agent, args: dict[str, Any], recording: dict[str, Any]
    ) -> str | None:
        if agent.get_data("_subordinate") is None:
            config = Config(profile=args.get("profile", args.get("agent_profile", "")))
            sub = Agent(agent.number + 1, config, agent.context)
            sub.set_data("_superior", agent)
            agent.set_data("_subordinate", sub)
        sub = agent.get_data("_subordinate")
        sub.last_user_message = Message({"user_message": args.get("message", "")})
        return await self.monologue(sub, recording["iterations"])


def _standin_modules() -> list[str]:
    return [m for m in sys.modules if m in ("helpers", "agent") or m.startswith("helpers.")]


def install_standins(root: Path) -> None:
    sys.path.insert(0, str(root))
    for name in _standin_modules():
        del sys.modules[name]


def remove_standins(root: Path) -> None:
    if str(root) in sys.path:
        sys.path.remove(str(root))
    for name in _standin_modules():
        del sys.modules[name]
