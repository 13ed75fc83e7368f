"""`agentrl bench learning`: GiGPO vs GRPO vs RLOO at equal episode budgets, in one process
per worker, on three settings:

- `fl4`: `agentrl learn`'s configuration (FrozenLake 4x4, configs/frozenlake-valid-action.yaml),
  GiGPO, one run per seed: base and trained held-out success, seconds to 0.7; its adapter is
  the curriculum's starting point for that seed (`fl4_every_algorithm`: GRPO and RLOO run
  the same 4x4 budget from the base too, where learning starts at the floor);
- `curriculum`: larger FrozenLake maps started from that seed's 4x4 adapter;
- `sokoban`: one box in a small room (configs/sokoban-valid-action.yaml: the "outcomes"
  observation), the four moves, from the base model.

Why one process: the model loads once (about 30 s each time), and the frozen lower layers'
output is cached per prompt text for the whole benchmark (LoRA sits on the top layers
only), so every run after the first reuses it. Each run resets the adapter (fresh per seed,
or the seed's 4x4 adapter), the optimiser, the prompt cache and the sampling stream. Within a
seed, every algorithm sees the same task seeds, sampling seed, episodes and updates; only
the advantage differs. Every run records wall and process-CPU seconds (rollouts + updates,
held-out evaluations excluded) at each held-out reading.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.core.stats import wilson

ALGORITHMS = ("gigpo", "grpo", "rloo")
SETTINGS = ("fl4", "curriculum", "sokoban")
Progress = Callable[[str], None]


@dataclass
class Plan:
    """What one benchmark runs: the base config file plus per-setting overrides."""

    config_path: str
    seeds: int = 5
    algorithms: tuple[str, ...] = ALGORITHMS
    settings: tuple[str, ...] = SETTINGS
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    eval_every: dict[str, int] = field(default_factory=dict)
    out_dir: str = "runs/bench-learning"
    threads: int = 0
    carry_optimizer: bool = True  # curriculum: keep the 4x4 run's AdamW moments
    reuse: bool = False  # reuse finished 4x4 runs (adapter + optimizer) saved under out_dir
    fl4_every_algorithm: bool = False  # 4x4 from the base for GRPO/RLOO too, not GiGPO only

    def config(self, setting: str, algorithm: str, seed: int) -> Any:
        from agentrl.learners.valid_action import ValidActionConfig

        over = dict(self.overrides.get(setting, {}))
        over.update(self.overrides.get("all", {}))  # e.g. the quick plan's tiny model wins
        over.update(algorithm=algorithm, seed=seed, save_adapter=False, threads=self.threads)
        return ValidActionConfig.from_file(self.config_path, **over)


def sokoban_overrides(config_path: str) -> dict[str, Any]:
    """The Sokoban setting: the shipped Sokoban config (configs/sokoban-valid-action.yaml,
    beside the 4x4 one) as overrides, less what the benchmark sets itself."""
    import yaml

    name = "sokoban-valid-action.yaml"
    paths = [Path(config_path).parent / name, Path("configs") / name]
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(
            f"the Sokoban setting needs {name}: not at {paths[0]} or {paths[1]}"
        )
    data = yaml.safe_load(path.read_text()) or {}
    for key in ("seed", "out_dir", "threads", "eval_every", "heldout_seeds"):
        data.pop(key, None)
    return dict(data)


def full_plan(config_path: str, seeds: int, out_dir: str, threads: int = 0) -> Plan:
    """The recorded benchmark (SmolLM2). Budgets come from one-seed probes (BENCHMARKS.md):
    6x6 maps (the 4x4 adapter scores about 0.44 there; 8x8 cost 3x per iteration); Sokoban
    on a 3x3 floor with the "outcomes" observation (with positions as numbers, 640 and more
    episodes stayed at 0)."""
    return Plan(
        config_path=config_path,
        seeds=seeds,
        out_dir=out_dir,
        threads=threads,
        overrides={
            "fl4": {},
            "curriculum": {
                "env_kwargs": {"size": 6},
                "max_steps": 20,
                "iterations": 8,
                "maps_per_iteration": 8,
                "episodes_per_map": 16,
            },
            "sokoban": sokoban_overrides(config_path),
        },
        eval_every={"fl4": 5, "curriculum": 2, "sokoban": 10},
    )


def quick_plan(config_path: str, out_dir: str) -> Plan:
    """Seconds on a tiny random model: checks the plumbing and the JSON line, not learning."""
    small = {"maps_per_iteration": 2, "episodes_per_map": 4, "iterations": 2, "heldout_seeds": 4}
    return Plan(
        config_path=config_path,
        seeds=2,
        out_dir=out_dir,
        threads=1,
        overrides={
            "all": {"model": "tiny", "lora_layers": 1, "dtype": "fp32", **small},
            "fl4": {"max_steps": 6},
            "curriculum": {"env_kwargs": {"size": 5}, "max_steps": 8},
            "sokoban": {
                **sokoban_overrides(config_path),
                "env_kwargs": {"dim": 5, "min_moves": 2},
                "max_steps": 6,
            },
        },
        eval_every={"fl4": 1, "curriculum": 1, "sokoban": 1},
    )


# ---- one run ------------------------------------------------------------------------------


@dataclass
class Point:
    iteration: int
    wall_s: float
    cpu_s: float
    success: float


@dataclass
class Run:
    setting: str
    algorithm: str
    seed: int
    heldout_seeds: int
    base_success: float
    final_success: float
    final_wins: int
    points: list[Point]
    wall_s: float
    cpu_s: float
    eval_wall_s: float
    episodes: int
    load_before: float
    load_after: float
    threads: int

    def seconds_to(self, level: float, clock: str = "wall_s") -> float | None:
        for p in self.points:
            if p.success >= level:
                return float(getattr(p, clock))
        return None


def load1() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def lora_state(learner: Any) -> dict[str, Any]:
    """A copy of the trainable (LoRA) weights: a warm start kept in memory."""
    return {
        n: p.detach().clone() for n, p in learner.policy.model.named_parameters() if p.requires_grad
    }


def reset_learner(
    learner: Any,
    config: Any,
    state: dict[str, Any] | None,
    optimizer_state: dict[str, Any] | None = None,
) -> None:
    """Make `learner` a fresh run of `config`: LoRA from `state` (a warm start) or newly
    initialised from `config.seed` (A as peft does it, B zero: the base model's outputs),
    a new optimiser (or the warm start's AdamW moments, at `config.learning_rate`), prompt
    cache and sampling stream. The trunk cache stays (the lower layers are frozen)."""
    import torch

    from agentrl.learners.valid_action import SYSTEM_PROMPT, PromptCache

    learner.config = config
    gen = torch.Generator().manual_seed(10_007 + config.seed)
    with torch.no_grad():
        for name, p in learner.policy.model.named_parameters():
            if not p.requires_grad:
                continue
            if state is not None:
                p.copy_(state[name])
            elif "lora_A" in name:
                bound = 1.0 / math.sqrt(p.shape[1])  # kaiming_uniform_(a=sqrt(5))
                p.copy_(torch.empty_like(p).uniform_(-bound, bound, generator=gen))
            else:
                p.zero_()
    learner.optimizer = torch.optim.AdamW(learner.params, lr=config.learning_rate, weight_decay=0.0)
    if optimizer_state is not None:
        learner.optimizer.load_state_dict(copy.deepcopy(optimizer_state))
        for group in learner.optimizer.param_groups:
            group["lr"] = config.learning_rate
    learner.cache = PromptCache(learner.tokenizer, config.system_prompt or SYSTEM_PROMPT)
    learner.scorer.set_prefix(learner.cache.shared_prefix_ids() if config.share_prefix else ())
    learner.generator = torch.Generator().manual_seed(config.seed)
    learner.scorer.temperature = float(config.temperature)


def run_one(
    learner: Any,
    config: Any,
    setting: str,
    eval_every: int,
    state: dict[str, Any] | None,
    progress: Progress,
    optimizer_state: dict[str, Any] | None = None,
) -> Run:
    from agentrl.learners.valid_action import evaluate_heldout, rollout

    reset_learner(learner, config, state, optimizer_state)
    fn = learner.logprob_fn()
    load_before = load1()
    t_eval = time.perf_counter()
    base = evaluate_heldout(fn, config, None, learner.cache)
    eval_wall = time.perf_counter() - t_eval
    points = [Point(0, 0.0, 0.0, base.success)]
    wall = cpu = 0.0
    episodes = 0
    last = base
    tag = f"{setting} {config.algorithm} seed {config.seed}"
    progress(f"{tag}: base held-out {base.success:.2f} (load {load_before:.2f})")
    for it in range(config.iterations):
        w0, c0 = time.perf_counter(), time.process_time()
        batch = rollout(
            config,
            fn,
            learner.cache,
            config.train_seeds(it),
            config.episodes_per_map,
            generator=learner.generator,
        )
        learner.update(batch, it)
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
        episodes += len(batch.episode_return)
        line = (
            f"{tag}: iter {it + 1}/{config.iterations} rollout success "
            f"{float(np.mean(batch.episode_success)):.2f}  {wall:.0f}s wall {cpu:.0f}s cpu"
        )
        if (it + 1) % eval_every == 0 or it + 1 == config.iterations:
            t_eval = time.perf_counter()
            last = evaluate_heldout(fn, config, None, learner.cache)
            eval_wall += time.perf_counter() - t_eval
            points.append(Point(it + 1, wall, cpu, last.success))
            line += f"  held-out {last.success:.2f}"
        progress(line)
    return Run(
        setting=setting,
        algorithm=config.algorithm,
        seed=config.seed,
        heldout_seeds=last.seeds,
        base_success=base.success,
        final_success=last.success,
        final_wins=round(last.success * last.seeds),
        points=points,
        wall_s=wall,
        cpu_s=cpu,
        eval_wall_s=eval_wall,
        episodes=episodes,
        load_before=load_before,
        load_after=load1(),
        threads=int(_threads()),
    )


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


def tasks(plan: Plan) -> list[tuple[str, int]]:
    """The work, most needed first: per seed the 4x4 run and the curriculum that starts
    from its adapter ("chain"), then per seed the Sokoban runs. An interrupted benchmark
    thus has whole seeds of the headline comparison."""
    out: list[tuple[str, int]] = []
    if "fl4" in plan.settings or "curriculum" in plan.settings:
        out += [("chain", s) for s in range(plan.seeds)]
    if "sokoban" in plan.settings:
        out += [("sokoban", s) for s in range(plan.seeds)]
    return out


class Worker:
    """One model, one trunk cache; runs tasks and appends one JSON line per run to `sink`."""

    def __init__(self, plan: Plan, sink: Path, progress: Progress) -> None:
        import torch

        from agentrl.learners.valid_action import Learner, pick_threads

        torch.set_num_threads(pick_threads(plan.threads))
        t0 = time.perf_counter()
        self.plan, self.sink, self.progress = plan, sink, progress
        self.learner = Learner(plan.config("fl4", "gigpo", 0))
        progress(f"model loaded in {time.perf_counter() - t0:.0f}s, {_threads()} torch threads")
        sink.parent.mkdir(parents=True, exist_ok=True)

    def record(self, run: Run) -> None:
        with self.sink.open("a") as fh:
            fh.write(json.dumps(asdict(run)) + "\n")
        self.progress(
            f"RUN {run.setting} {run.algorithm} seed {run.seed}: held-out "
            f"{run.base_success:.2f} -> {run.final_success:.2f}, {run.wall_s:.0f}s wall, "
            f"{run.cpu_s:.0f}s cpu, load {run.load_before:.1f}-{run.load_after:.1f}"
        )

    def run(self, task: tuple[str, int]) -> None:
        kind, seed = task
        if kind == "chain":
            self.chain(seed)
        else:
            self.compare("sokoban", seed, None, None)

    def chain(self, seed: int) -> None:
        """The 4x4 run (GiGPO, `agentrl learn`'s configuration), then the curriculum from its
        adapter and AdamW moments, once per algorithm."""
        import torch

        plan = self.plan
        saved = Path(plan.out_dir) / "warm" / f"fl4-seed{seed}.pt"
        if plan.reuse and saved.exists():
            data = torch.load(saved, weights_only=False)
            warm, warm_opt = data["lora"], data["optimizer"]
            run = Run(**{**data["run"], "points": [Point(**p) for p in data["run"]["points"]]})
            self.progress(f"reused the 4x4 run of seed {seed} from {saved}")
        else:
            cfg = plan.config("fl4", "gigpo", seed)
            every = plan.eval_every.get("fl4", 5)
            run = run_one(self.learner, cfg, "fl4", every, None, self.progress)
            warm = lora_state(self.learner)
            warm_opt = copy.deepcopy(self.learner.optimizer.state_dict())
            saved.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"lora": warm, "optimizer": warm_opt, "run": asdict(run)}, saved)
        if "fl4" in plan.settings:
            self.record(run)
            if plan.fl4_every_algorithm:  # the same seed's 4x4 budget, from the base
                self.compare("fl4", seed, None, None, skip=("gigpo",))
        if "curriculum" in plan.settings:
            self.compare("curriculum", seed, warm, warm_opt if plan.carry_optimizer else None)

    def compare(
        self,
        setting: str,
        seed: int,
        state: dict[str, Any] | None,
        opt: dict[str, Any] | None,
        skip: tuple[str, ...] = (),
    ) -> None:
        for algo in (a for a in self.plan.algorithms if a not in skip):
            cfg = self.plan.config(setting, algo, seed)
            every = self.plan.eval_every.get(setting, 2)
            self.record(run_one(self.learner, cfg, setting, every, state, self.progress, opt))


def _worker(plan: Plan, queue: Any, sink: str) -> None:
    import sys

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    worker = Worker(plan, Path(sink), say)
    while True:
        task = queue.get()
        if task is None:
            return
        worker.run(task)


def run_plan(plan: Plan, jobs: int, progress: Progress) -> tuple[list[Run], dict[str, float]]:
    """Run every task: in this process (jobs 1), or on `jobs` processes with one torch
    thread each, pulling from one queue. Returns the runs and the cost: wall, CPU (this
    process + children), load."""
    import multiprocessing as mp
    import resource

    out = Path(plan.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sink = out / "runs.jsonl"
    sink.unlink(missing_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_start = load1()
    work = tasks(plan)
    if jobs <= 1:
        worker = Worker(plan, sink, progress)
        for task in work:
            worker.run(task)
    else:
        plan.threads = 1
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        for task in work:
            queue.put(task)
        n = min(jobs, len(work))
        for _ in range(n):
            queue.put(None)
        procs = [ctx.Process(target=_worker, args=(plan, queue, str(sink))) for _ in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                progress(f"a worker exited with {p.exitcode}; its unfinished runs are missing")
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
    cost = {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0 + children,
        "load_start": load_start,
        "load_end": load1(),
    }
    return load_runs(sink), cost


def load_runs(path: Path) -> list[Run]:
    runs: list[Run] = []
    if not path.exists():
        return runs
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            d["points"] = [Point(**p) for p in d["points"]]
            runs.append(Run(**d))
    return runs


# ---- summary ------------------------------------------------------------------------------

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def t_interval(values: list[float], clip: bool = True) -> tuple[float, float, float]:
    """Mean and 95 % Student-t interval across seeds (one seed: [mean, mean])."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    m = float(x.mean())
    if len(x) < 2:
        return m, m, m
    half = T95.get(len(x) - 1, 1.96) * float(x.std(ddof=1)) / math.sqrt(len(x))
    lo, hi = m - half, m + half
    return (m, max(0.0, lo), min(1.0, hi)) if clip else (m, max(0.0, lo), hi)


def median_reached(values: list[float | None]) -> float | None:
    """Median over seeds, or None when half the seeds or more never got there."""
    got = [v for v in values if v is not None]
    if not got or len(got) * 2 <= len(values):
        return None
    return round(float(np.median(got)), 1)


def summarise(runs: list[Run], setting: str, algorithm: str) -> dict[str, Any]:
    """Final held-out success (t interval over seeds, pooled Wilson) and the seconds
    (wall and CPU) to 0.5 and 0.7 for one setting and algorithm."""
    mine = sorted(
        (r for r in runs if r.setting == setting and r.algorithm == algorithm),
        key=lambda r: r.seed,
    )
    finals = [r.final_success for r in mine]
    m, lo, hi = t_interval(finals)
    wins = sum(r.final_wins for r in mine)
    n = sum(r.heldout_seeds for r in mine)
    w_lo, w_hi = wilson(wins, n)
    out: dict[str, Any] = {
        "n": len(mine),
        "base": float(np.mean([r.base_success for r in mine])) if mine else None,
        "final": m,
        "ci": (lo, hi),
        "wilson": (w_lo, w_hi),
        "per_seed": finals,
        "episodes": mine[0].episodes if mine else 0,
        "wall_s": float(np.mean([r.wall_s for r in mine])) if mine else None,
        "cpu_s": float(np.mean([r.cpu_s for r in mine])) if mine else None,
    }
    for level, tag in ((0.5, "050"), (0.7, "070")):
        for clock in ("wall_s", "cpu_s"):
            vals = [r.seconds_to(level, clock) for r in mine]
            got = [v for v in vals if v is not None]
            _, s_lo, s_hi = t_interval(got, clip=False)
            key = f"t{tag}" + ("" if clock == "wall_s" else "_cpu")
            out[key] = median_reached(vals)
            out[key + "_ci"] = (round(s_lo, 1), round(s_hi, 1)) if len(got) > 1 else None
            out[key + "_reached"] = f"{len(got)}/{len(vals)}"
    return out


def last_line(runs: list[Run], cost: dict[str, float], plan: Plan, jobs: int) -> dict[str, Any]:
    """The JSON line: exactly the issue's keys first, then extras (Sokoban, CPU, load)."""
    fl4 = summarise(runs, "fl4", "gigpo")
    cur = {a: summarise(runs, "curriculum", a) for a in ALGORITHMS}
    sok = {a: summarise(runs, "sokoban", a) for a in ALGORITHMS}

    def r4(v: Any) -> Any:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 4)

    line: dict[str, Any] = {
        "base_success": r4(fl4["base"]),
        "trained_success": r4(fl4["final"]),
        "seconds_to_070": fl4["t070"],
        "gigpo_final_success": r4(cur["gigpo"]["final"]),
        "grpo_final_success": r4(cur["grpo"]["final"]),
        "rloo_final_success": r4(cur["rloo"]["final"]),
        "gigpo_seconds_to_050": cur["gigpo"]["t050"],
        "grpo_seconds_to_050": cur["grpo"]["t050"],
        "gigpo_ci_low": r4(cur["gigpo"]["ci"][0]),
        "gigpo_ci_high": r4(cur["gigpo"]["ci"][1]),
        "grpo_ci_low": r4(cur["grpo"]["ci"][0]),
        "grpo_ci_high": r4(cur["grpo"]["ci"][1]),
        "seeds": min((cur[a]["n"] for a in plan.algorithms), default=0),
        "wall_s": round(cost["wall_s"], 1),
    }
    line.update(
        cpu_s=round(cost["cpu_s"], 1),
        load_start=cost["load_start"],
        load_end=cost["load_end"],
        jobs=jobs,
        seconds_to_070_cpu=fl4["t070_cpu"],
        rloo_ci_low=r4(cur["rloo"]["ci"][0]),
        rloo_ci_high=r4(cur["rloo"]["ci"][1]),
        rloo_seconds_to_050=cur["rloo"]["t050"],
    )
    for a in ALGORITHMS:
        line[f"{a}_seconds_to_050_cpu"] = cur[a]["t050_cpu"]
        line[f"{a}_seconds_to_070"] = cur[a]["t070"]
        line[f"{a}_seconds_to_070_cpu"] = cur[a]["t070_cpu"]
    for a in ALGORITHMS:
        s = sok[a]
        line[f"sokoban_{a}_final_success"] = r4(s["final"])
        line[f"sokoban_{a}_ci_low"] = r4(s["ci"][0])
        line[f"sokoban_{a}_ci_high"] = r4(s["ci"][1])
        for tag in ("050", "070"):
            line[f"sokoban_{a}_seconds_to_{tag}"] = s[f"t{tag}"]
            line[f"sokoban_{a}_seconds_to_{tag}_cpu"] = s[f"t{tag}_cpu"]
            line[f"sokoban_{a}_reached_{tag}"] = s[f"t{tag}_reached"]
    line["sokoban_seeds"] = min((sok[a]["n"] for a in plan.algorithms), default=0)
    if plan.fl4_every_algorithm:
        for a in ALGORITHMS:
            s = summarise(runs, "fl4", a)
            line[f"fl4_{a}_final_success"] = r4(s["final"])
            line[f"fl4_{a}_ci_low"] = r4(s["ci"][0])
            line[f"fl4_{a}_ci_high"] = r4(s["ci"][1])
            for tag in ("050", "070"):
                line[f"fl4_{a}_seconds_to_{tag}"] = s[f"t{tag}"]
                line[f"fl4_{a}_seconds_to_{tag}_cpu"] = s[f"t{tag}_cpu"]
                line[f"fl4_{a}_seconds_to_{tag}_cpu_ci"] = s[f"t{tag}_cpu_ci"]
                line[f"fl4_{a}_reached_{tag}"] = s[f"t{tag}_reached"]
    return line


def table_rows(runs: list[Run], plan: Plan) -> list[dict[str, Any]]:
    rows = []
    for setting in plan.settings:
        algos = ("gigpo",) if setting == "fl4" and not plan.fl4_every_algorithm else plan.algorithms
        for a in algos:
            s = summarise(runs, setting, a)
            if not s["n"]:
                continue

            def sec(tag: str, s: dict[str, Any] = s) -> str:
                ci = s[f"{tag}_ci"]
                band = f" [{ci[0]:.0f}, {ci[1]:.0f}]" if ci else ""
                val = "-" if s[tag] is None else f"{s[tag]:.0f}"
                return f"{val}{band} ({s[tag + '_reached']})"

            rows.append(
                {
                    "setting": setting,
                    "algorithm": a,
                    "seeds": s["n"],
                    "episodes/run": s["episodes"],
                    "base": f"{s['base']:.2f}",
                    "final [t 95%]": f"{s['final']:.2f} [{s['ci'][0]:.2f}, {s['ci'][1]:.2f}]",
                    "pooled Wilson": f"[{s['wilson'][0]:.2f}, {s['wilson'][1]:.2f}]",
                    "per seed": " ".join(f"{v:.2f}" for v in s["per_seed"]),
                    "wall s to 0.5": sec("t050"),
                    "cpu s to 0.5": sec("t050_cpu"),
                    "wall s to 0.7": sec("t070"),
                    "cpu s to 0.7": sec("t070_cpu"),
                }
            )
    return rows


def plot(runs: list[Run], plan: Plan, path: Path) -> Path:
    """Held-out success per iteration: mean over seeds and a 95 % t band, per algorithm,
    one panel per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [s for s in plan.settings if any(r.setting == s for r in runs)]
    fig, axes = plt.subplots(1, max(1, len(settings)), figsize=(5 * max(1, len(settings)), 3.6))
    axes = np.atleast_1d(axes)
    titles = {
        "fl4": "FrozenLake 4x4 (main config)",
        "curriculum": "curriculum: larger maps from the 4x4 adapter",
        "sokoban": "Sokoban, one box",
    }
    for ax, setting in zip(axes, settings, strict=False):
        for a in plan.algorithms:
            mine = [r for r in runs if r.setting == setting and r.algorithm == a]
            if not mine:
                continue
            its = sorted({p.iteration for r in mine for p in r.points})
            rows = [[_at(r.points, it) for it in its] for r in mine]
            arr = np.array(rows, dtype=float)
            mean = arr.mean(0)
            ax.plot(its, mean, marker="o", ms=3, label=f"{a} ({len(mine)} seeds)")
            if len(mine) > 1:
                half = T95.get(len(mine) - 1, 1.96) * arr.std(0, ddof=1) / math.sqrt(len(mine))
                ax.fill_between(
                    its, np.clip(mean - half, 0, 1), np.clip(mean + half, 0, 1), alpha=0.2
                )
        ax.set_title(titles.get(setting, setting), fontsize=9)
        ax.set_xlabel("iteration")
        ax.set_ylabel("held-out greedy success")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _at(points: list[Point], iteration: int) -> float:
    """The last held-out reading at or before `iteration` (a step curve)."""
    val = points[0].success
    for p in points:
        if p.iteration <= iteration:
            val = p.success
    return val
