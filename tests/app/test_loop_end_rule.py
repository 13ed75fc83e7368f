"""The loop's end rule: `generations` decided versions, then more (up to `max_generations`)
while the live version fails its own validation benchmark; the held-out maps never enter it."""

from __future__ import annotations

from agentrl.app.loop import LoopConfig, end_rule, live_benchmark
from agentrl.serving.registry import ModelRecord


def rec(v: int, state: str, bench: float | None = None) -> ModelRecord:
    return ModelRecord(
        model_id=f"p-v{v}" if v else "p-base",
        version=v,
        public_name="p",
        base_model="smollm2",
        checkpoint_path="/ckpt" if v else None,
        state=state,  # type: ignore[arg-type]
        validation_details={} if bench is None else {"benchmark": {"mean": bench}},
    )


def test_the_live_versions_own_benchmark_is_read() -> None:
    assert live_benchmark([rec(0, "live")]) is None  # the base was never validated
    assert live_benchmark([rec(1, "candidate", 0.9)]) is None  # no live version
    records = [rec(0, "retired"), rec(1, "live", 0.4), rec(2, "canary", 0.9)]
    assert live_benchmark(records) == 0.4  # the canary's figure is not the live one's


def test_more_generations_only_while_the_live_version_is_below_the_bar() -> None:
    cfg = LoopConfig()  # 4 generations, 0.6, up to 9
    assert (cfg.generations, cfg.until_benchmark, cfg.max_generations) == (4, 0.6, 9)
    assert end_rule(cfg, 3, 0.9) == "train"  # the generations come first, whatever the bar
    assert end_rule(cfg, 4, 0.6) == "end"
    assert end_rule(cfg, 4, 0.4) == "extend"
    assert end_rule(cfg, 6, None) == "extend"  # the base still live: every version rejected
    assert end_rule(cfg, 8, 0.57) == "extend"
    assert end_rule(cfg, 9, 0.1) == "end"  # the cap
    assert end_rule(LoopConfig(generations=12), 12, 0.0) == "end"  # a cap below generations
    assert end_rule(LoopConfig(until_benchmark=0.0), 6, 0.0) == "end"  # the bar off


def test_the_quick_and_slow_modes_never_extend() -> None:
    """A random tiny model's benchmark is 0, and the tool-use and vLLM loops run for half an
    hour a generation: none of them goes on past its generations."""
    for cfg in (LoopConfig.quick(), LoopConfig.tooluse(), LoopConfig.tooluse(quick=True)):
        assert end_rule(cfg, cfg.generations, 0.0) == "end", cfg.env
    assert end_rule(LoopConfig.on_vllm(), 1, 0.0) == "end"
