"""DistributedDataParallel through torchrun: gloo on CPU, nccl on GPU.

`torchrun --nproc-per-node N -m agentrl.llm.ddp_main ...` sets RANK/WORLD_SIZE/MASTER_*;
`DistContext.from_env` joins that group. Every rank holds the same sample list and takes
its strided share of each minibatch, so all ranks take the same number of optimiser steps
(a requirement of DDP's collective calls) and the averaged gradient equals the gradient of
the whole minibatch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @classmethod
    def single(cls) -> DistContext:
        return cls()

    @classmethod
    def from_env(cls, device: str = "cpu") -> DistContext:
        """Join the process group torchrun set up (a single process if there is none)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls.single()
        backend = "nccl" if device.startswith("cuda") and torch.cuda.is_available() else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if backend == "nccl":
            torch.cuda.set_device(local)
        return cls(rank=dist.get_rank(), world_size=world, local_rank=local, backend=backend)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_objects(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def shutdown(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


# An `agentrl ...` command relaunched under torchrun (`python -m agentrl`, see
# `agentrl.__main__`) finds its command line here: torchrun's own parser would otherwise take
# options such as --nproc as abbreviations of its own.
CLI_ARGV_ENV = "AGENTRL_CLI_ARGV"


def torchrun(
    module: str,
    args: Sequence[str],
    nproc: int,
    timeout: float | None = None,
    capture: bool = True,
    **kw: Any,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m module args` under torchrun with `nproc` processes on this host
    (output captured, or streamed to this terminal with capture=False)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        module,
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(
        cmd, capture_output=capture, text=True, timeout=timeout, env=env, check=False, **kw
    )
