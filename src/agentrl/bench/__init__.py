"""The benchmarks' wing: every `agentrl bench NAME` and `agentrl soak`.

One module per benchmark, named for its command (`gateway`, `canary`, `bus`, `rewards`,
`training`, ...); `cli` registers them all (no package's own cli knows its benchmarks);
`report` prints each one's readable table and, as the last line, one JSON object of named
figures (`docs/bench/results.jsonl` keeps them); `soak` (with `soak_config`,
`soak_replicas`) runs the loop under faults; `testing_server` is a scripted
OpenAI-compatible server the tests talk to. It stands on top of the house:
it may import any package, and none imports it.
"""
