"""Shared helpers for `agentrl bench NAME` commands."""
