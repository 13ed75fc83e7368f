"""`python -m agentrl`: the `agentrl` command; also each rank of a command relaunched under
torchrun (`agentrl train-policy --nproc N`), whose command line travels in
`AGENTRL_CLI_ARGV`."""

from __future__ import annotations

import json
import os

from agentrl.cli import app, main
from agentrl.llm.distributed import CLI_ARGV_ENV

if __name__ == "__main__":
    argv = os.environ.get(CLI_ARGV_ENV)
    if argv is not None:
        app(args=json.loads(argv), standalone_mode=True)
    else:
        main()
