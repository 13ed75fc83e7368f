"""Agent Zero joins agentrl's loop by configuration and a copy of files.

`agentrl agent-zero install PATH` copies the plugin (`plugin/`: plugin.yaml,
default_config.yaml, extensions, the rl_training tool, the rl-trainer profile) into an Agent
Zero checkout; its extensions call `hooks`, which records each monologue with the pure
`recorder` and publishes through `publisher` (redaction, on-disk `spool`, bounded wait),
masked against Agent Zero's secrets first (`masking`); `usage` reads turns' token counts
from the gateway's completion log, `background` is the plugin's own flush loop.
`feedback`, `training_tool` and `deployment` (handle_model_deployment) complete it.
"""

from agentrl.integrations.agent_zero.deployment import ModelSwitcher, handle_model_deployment
from agentrl.integrations.agent_zero.recorder import Identity, TrajectoryRecorder

__all__ = ["Identity", "ModelSwitcher", "TrajectoryRecorder", "handle_model_deployment"]
