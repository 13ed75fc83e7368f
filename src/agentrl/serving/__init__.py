"""Serving: what answers the agents' requests.

The OpenAI-compatible gateway (`gateway`: chat completions, the sticky traffic split,
structured outputs, the completion log), the engines and backends behind it (`local`: batched
decoding with LoRA adapters over one base, prefix cache, guided choices; `backends`: local,
an upstream server, checkpoint fetch and checks; `vllm/`: vLLM as the engine), and the model
registry it serves from (`registry`: one NATS KV bucket of versions, splits and rollouts).
`config.DeploySettings` (AGENTRL_DEPLOY_*) is the settings of serving and release both.

It knows nothing of the release path: `agentrl.release` decides which version serves and
writes the registry; the gateway reads it. Import the parts you need
(`agentrl.serving.gateway`, `agentrl.serving.registry`, ...): this init stays light so
`agentrl --help` does not import torch or FastAPI.
"""
