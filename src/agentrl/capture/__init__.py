"""Capture: trajectories from agents that only talk to an OpenAI-compatible endpoint.

Three ways in, none needing a change in the agent: episodes assembled at the gateway from
the chat histories it serves (`episodes`, `service`), OpenTelemetry GenAI / OpenInference
traces posted to `/v1/traces` (`otlp`, `api`), and TensorZero-style feedback naming an
episode, a completion or a trajectory (`feedback`). Pure cores, thin services.
"""
