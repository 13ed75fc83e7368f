"""The valid-action learner's FrozenLake system prompt, apart from the learner (which imports
torch): `agentrl loop` sets its services' settings from it before its stack starts, and a
loop stopped then had imported torch for this string alone (~3 CPU-s)."""

SYSTEM_PROMPT = (
    "Frozen lake: walk to the goal; a hole ends the game, a wall blocks. Rows grow "
    "downwards. Reply with one move: up, down, left or right."
)
