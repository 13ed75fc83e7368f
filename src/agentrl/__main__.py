"""`python -m agentrl`: the `agentrl` command; also each rank of a command relaunched under
torchrun (`agentrl train-policy --nproc N`), whose command line travels in
`AGENTRL_CLI_ARGV`."""

from __future__ import annotations

import json
import os

from agentrl import cli

# agentrl.llm.distributed.CLI_ARGV_ENV, not imported: that module imports torch (~3 CPU-s)
CLI_ARGV_ENV = "AGENTRL_CLI_ARGV"

if __name__ == "__main__":
    argv = os.environ.get(CLI_ARGV_ENV)
    if argv is not None:
        cli.app(args=json.loads(argv), standalone_mode=True)
    else:
        cli.main()  # its command's plugin only (`cli.app` would register them all)
