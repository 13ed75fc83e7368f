"""Entry point of one rank of a distributed training job: `torchrun ... -m agentrl.llm.ddp_main`.

Every rank reads the same config and sample file, joins the process group (gloo on CPU,
nccl on GPU), trains with DistributedDataParallel, and rank 0 writes the final checkpoint.
`--dump-params` writes each rank's flat parameters (tests compare them across ranks).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from agentrl.core.errors import TrainingError
from agentrl.llm.config import TrainerConfig
from agentrl.llm.samples import PolicySample


def save_samples(samples: list[PolicySample], path: Path) -> None:
    """Write samples for the ranks to read (torch format keeps the log-prob tensors)."""
    rows = [
        {
            "prompt_ids": s.prompt_ids,
            "action_ids": s.action_ids,
            "advantage": s.advantage,
            "old_logprobs": s.old_logprobs,
            "reward": s.reward,
            "ret": s.ret,
            "group_id": s.group_id,
            "episode_id": s.episode_id,
        }
        for s in samples
    ]
    torch.save(rows, path)


def load_samples(path: Path) -> list[PolicySample]:
    rows = torch.load(path, weights_only=False)
    return [PolicySample(**row) for row in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="TrainerConfig as a JSON file")
    parser.add_argument("--samples", required=True, help="samples written by save_samples")
    parser.add_argument("--tiny-kwargs", default=None, help="JSON kwargs of the tiny model")
    parser.add_argument("--dump-params", default=None, help="folder for rank<N>.pt params")
    parser.add_argument("--no-checkpoint", action="store_true")
    args = parser.parse_args(argv)

    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.llm.trainer import PolicyTrainer

    config = TrainerConfig.model_validate_json(Path(args.config).read_text())
    config.distributed = True
    tiny = json.loads(args.tiny_kwargs) if args.tiny_kwargs else None
    try:
        trainer = PolicyTrainer.from_config(config, tiny_kwargs=tiny)
        samples = load_samples(Path(args.samples))
        history = trainer.train_on_samples(samples)
        if args.dump_params:
            out = Path(args.dump_params)
            out.mkdir(parents=True, exist_ok=True)
            flat = torch.cat([p.detach().flatten() for p in trainer.head.parameters()])
            torch.save(flat, out / f"rank{trainer.dist.rank}.pt")
        if not args.no_checkpoint:
            ckpt = CheckpointManager(
                config.storage_path, config.max_checkpoints, config.storage_options
            )
            ckpt.save(trainer, history[-1] if history else {}, name="final")
        trainer.dist.barrier()
        trainer.dist.shutdown()
    except TrainingError as exc:
        print(json.dumps({"error": {"code": exc.code, "message": str(exc)}}), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
