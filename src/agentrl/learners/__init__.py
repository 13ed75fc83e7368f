"""What learns in an environment: valid-action (`agentrl learn`), on-policy rollouts and updates, SFT, tool use."""
