"""Deployment: validation, the model registry (NATS KV), the OpenAI-compatible gateway,
and the rollout controller with its sequential-test monitor.

Import the parts you need (`agentrl.serving.gateway`, `agentrl.serving.registry`, ...): this
package init stays light so `agentrl --help` does not import torch or FastAPI.
"""
