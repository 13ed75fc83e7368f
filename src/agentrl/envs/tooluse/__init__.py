"""Tool-use tasks in Agent Zero's JSON format: calculator, sandboxed Python, final response."""

from __future__ import annotations

from agentrl.envs.tooluse.calculator import CalculatorError, evaluate
from agentrl.envs.tooluse.env import TOOL_SPECS, ToolUseEnv
from agentrl.envs.tooluse.sandbox import (
    SandboxResult,
    SandboxSettings,
    SandboxUnavailableError,
    isolation_tool,
    network_isolation,
    run_python,
)
from agentrl.envs.tooluse.tasks import ToolTask, check_answer, generate_task

__all__ = [
    "TOOL_SPECS",
    "CalculatorError",
    "SandboxResult",
    "SandboxSettings",
    "SandboxUnavailableError",
    "ToolTask",
    "ToolUseEnv",
    "check_answer",
    "evaluate",
    "generate_task",
    "isolation_tool",
    "network_isolation",
    "run_python",
]
