"""Integrations of agentrl with agent frameworks (Agent Zero)."""
