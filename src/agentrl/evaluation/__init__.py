"""Measuring learning: held-out comparisons of base and trained models, the learning curves
of the algorithms, the trainer's own speed. Everything here reads `agentrl.llm`; nothing in
`agentrl.llm` reads this."""
