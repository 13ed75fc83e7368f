"""The tool-use environment: answer a question using tools, in Agent Zero's JSON format.

Each action is one JSON object `{"thoughts": [...], "headline": "...", "tool_name": "...",
"tool_args": {...}}` (OpenAI's `{"name": ..., "arguments": ...}` is accepted too). Tools:
  - calculator  {"expression": "(3 + 4) * 2"}   AST-evaluated arithmetic
  - code_exe    {"code": "print(sum(range(10)))"}  Python in a sandboxed subprocess
  - response    {"text": "14"}                     the final answer; ends the episode
The final answer is checked against the task's ground truth: reward `success_reward` if
right, 0 if wrong. `view="agent_zero"` shows the task and the tool results as Agent Zero
does (`agent_prompt`: the question alone, each result as a JSON user message; the tools are
in the system prompt), so the loop's agents see what an Agent Zero agent sees. The anchor (GiGPO's state) is the task plus the last tool result.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agentrl.envs.actions import tool_call_from_text
from agentrl.envs.base import Observation
from agentrl.envs.tooluse.agent_prompt import tool_result_message
from agentrl.envs.tooluse.calculator import CalculatorError, evaluate, format_number
from agentrl.envs.tooluse.sandbox import run_python
from agentrl.envs.tooluse.tasks import POOLS, ToolTask, check_answer, generate_task

TOOLS = ("calculator", "code_exe", "response")
_ALIASES = {
    "calc": "calculator",
    "calculate": "calculator",
    "code_execution_tool": "code_exe",  # Agent Zero's name for its code tool
    "python": "code_exe",
    "final_answer": "response",
    "answer": "response",
}
_ARG_KEYS = {
    "calculator": ("expression", "expr", "input", "query"),
    "code_exe": ("code", "source", "input"),
    "response": ("text", "answer", "message", "content"),
}
TOOL_HELP = (
    "Reply with ONE JSON object per turn, in this format:\n"
    '{"thoughts": ["..."], "headline": "...", "tool_name": "<tool>", "tool_args": {...}}\n'
    "Tools:\n"
    '  calculator  tool_args {"expression": "(3 + 4) * 2"}  arithmetic, math functions\n'
    '  code_exe    tool_args {"code": "print(1 + 1)"}      runs Python 3, shows stdout\n'
    '  response    tool_args {"text": "<final answer>"}     your final answer; ends the task'
)

TOOL_SPECS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / // % **, sqrt, log, ...).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "code_exe",
            "description": "Run a Python 3 script (no network, 5 s, 512 MB); returns stdout/stderr.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "response",
            "description": "Give the final answer and end the task.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    },
]


class ToolUseEnv:
    """Question answering with a calculator, a Python sandbox and a final `response`."""

    def __init__(
        self,
        family: str = "mixed",
        max_steps: int | None = 6,
        code_timeout_s: float = 5.0,
        code_memory_mb: int = 512,
        step_penalty: float = 0.0,
        invalid_action_penalty: float = 0.0,
        success_reward: float = 1.0,
        view: str = "plain",
        pool: str = "train",
    ) -> None:
        if view not in ("plain", "agent_zero"):
            raise ValueError(f"view {view!r}: use 'plain' or 'agent_zero'")
        if pool not in POOLS:
            raise ValueError(f"pool {pool!r}: use one of {', '.join(POOLS)}")
        self.view = view
        self.family = family
        self.pool = pool  # "unseen": wordings and kinds the training generator never makes
        self.env_id = "tooluse" if family == "mixed" else f"tooluse-{family}"
        self.max_steps = max_steps
        self.code_timeout_s = code_timeout_s
        self.code_memory_mb = code_memory_mb
        self.step_penalty = step_penalty
        self.invalid_action_penalty = invalid_action_penalty
        self.success_reward = success_reward
        self.task: ToolTask | None = None
        self.ground_truth: Any = None
        self._steps = 0
        self._done = False
        self._state = "start"

    def reset(self, seed: int | None = None) -> Observation:
        self.task = generate_task(0 if seed is None else int(seed), self.family, self.pool)
        self.ground_truth = self.task.answer
        self._steps = 0
        self._done = False
        self._state = "start"
        text = f"Task: {self.task.question}\n\n{TOOL_HELP}"
        if self.view == "agent_zero":  # the task as the user types it; the system prompt
            text = self.task.question  # (agent_prompt.SYSTEM_PROMPT) lists the tools
        return {
            "text": text,
            "anchor": f"{self.task.task_id}|start",
            "question": self.task.question,
        }

    def step(self, action_text: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self.task is None or self._done:
            obs: Observation = {
                "text": "No episode in progress: call reset(seed) first.",
                "anchor": "" if self.task is None else f"{self.task.task_id}|over",
            }
            return obs, 0.0, True, {"invalid_action": True, "success": False, "episode_over": True}
        self._steps += 1
        call = tool_call_from_text(action_text) if isinstance(action_text, str) else None
        if call is None:
            return self._invalid("Invalid action: no JSON tool call found. " + TOOL_HELP)
        name, args = call
        tool = _ALIASES.get(name.lower(), name.lower())
        if tool not in TOOLS:
            return self._invalid(
                f"Invalid action: unknown tool {name!r}. Use one of {', '.join(TOOLS)}."
            )
        value = _argument(tool, args)
        if value is None:
            keys = " or ".join(repr(k) for k in _ARG_KEYS[tool][:2])
            return self._invalid(f"Invalid action: tool {tool!r} needs tool_args {keys}.")
        info: dict[str, Any] = {"invalid_action": False, "success": False, "tool_name": tool}
        if tool == "response":
            correct = check_answer(value, self.task)
            self._done = True
            info.update(success=correct, answer=str(value), truncated=False)
            verdict = "correct" if correct else "not correct"
            text = f"Final answer received: {value!s}. The answer is {verdict}."
            reward = self.step_penalty + (self.success_reward if correct else 0.0)
            return {"text": text, "anchor": f"{self.task.task_id}|answered"}, reward, True, info
        if tool == "calculator":
            try:
                result = f"calculator: {value} = {format_number(evaluate(str(value)))}"
            except CalculatorError as exc:
                result = f"calculator error: {exc}"
                info["tool_error"] = True
        else:
            if str(args.get("runtime", "python")).lower() not in ("python", "python3"):
                result = "code_exe error: only the python runtime is available"
                info["tool_error"] = True
            else:
                run = run_python(
                    str(value), timeout_s=self.code_timeout_s, memory_mb=self.code_memory_mb
                )
                info.update(sandbox_isolation=run.isolation, tool_error=not run.ok)
                if run.timed_out:
                    result = f"code_exe: timed out after {self.code_timeout_s:g} s"
                else:
                    result = f"code_exe exit code {run.returncode}\nstdout:\n{run.stdout}"
                    if run.stderr.strip():
                        result += f"\nstderr:\n{run.stderr}"
        return self._after_tool(result, info)

    # ---- helpers -----------------------------------------------------------------------
    def _after_tool(
        self, result: str, info: dict[str, Any]
    ) -> tuple[Observation, float, bool, dict[str, Any]]:
        truncated = self.max_steps is not None and self._steps >= self.max_steps
        self._done = truncated
        info["truncated"] = truncated
        text = result
        if truncated:
            text += "\nOut of steps: the task ended without a final answer."
        elif self.max_steps is not None:
            text += (
                f"\n(Steps left: {self.max_steps - self._steps}. Finish with the response tool.)"
            )
        self._state = result
        if self.view == "agent_zero":
            text = tool_result_message(info.get("tool_name"), text)["content"]
        return self._observation(text), self.step_penalty, truncated, info

    def _invalid(self, message: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        truncated = self.max_steps is not None and self._steps >= self.max_steps
        self._done = truncated
        info = {"invalid_action": True, "success": False, "truncated": truncated}
        reward = self.invalid_action_penalty + self.step_penalty
        if self.view == "agent_zero":  # Agent Zero answers a malformed reply as an error
            message = tool_result_message("error", message)["content"]
        # The environment's state did not change, so neither does the anchor.
        return self._observation(message), reward, truncated, info

    def _observation(self, text: str) -> Observation:
        """The anchor is the task and the last tool result (not the conversation)."""
        assert self.task is not None
        if self._state == "start":
            return {"text": text, "anchor": f"{self.task.task_id}|start"}
        digest = hashlib.blake2b(self._state.encode(), digest_size=8).hexdigest()
        return {"text": text, "anchor": f"{self.task.task_id}|{digest}"}


def _argument(tool: str, args: dict[str, Any]) -> Any:
    for key in _ARG_KEYS[tool]:
        if key in args and args[key] not in (None, ""):
            return args[key]
    for key, value in args.items():  # a single unnamed argument is fine
        if key == "runtime":
            continue
        if isinstance(value, (str, int, float)) and value != "":
            return value
    return None
