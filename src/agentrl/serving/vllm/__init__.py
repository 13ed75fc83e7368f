"""vLLM as the serving engine behind the gateway (`AGENTRL_DEPLOY_BACKEND=vllm`).

agentrl starts and supervises one `vllm serve` process (the OpenAI server with LoRA and
runtime adapter loading on) for the base model, and serves each version as a LoRA adapter
loaded into it at run time. vLLM lives in an environment of its own (`agentrl vllm setup`):
its pins (transformers, torch) differ from agentrl's.

- `settings`: AGENTRL_VLLM_* (where the environment is, port, engine limits).
- `env`: find the environment's Python (clear error naming the install command), build it.
- `server`: the process supervisor (start, health, restart with backoff, hooks on ready).
- `backend`: the gateway backend (adapters verified then loaded, exact tokens, reloads).
"""
