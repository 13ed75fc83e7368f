"""`agentrl loop --quick --lineages 2 --bad-candidate` on the real stack with the tiny model:
two lineages (FrozenLake 4x4 and 5x5 agents) each walk the chain on their own trajectories
(trigger -> job -> validation -> canary -> decision); the drill's broken version in the first
lineage's canary is rolled back and the second lineage's split never shows a version not its
own. The last line is the issue's JSON."""

from __future__ import annotations

import json
from pathlib import Path

from loop_helpers import run_loop_cli

from agentrl.app.loop_lineages import Drill, at_rest, own_split_only, paced, specs


def test_own_split_only_names_versions_of_other_lineages() -> None:
    assert own_split_only("lake/5x5", {"lake/5x5-v2": 50.0, "lake/5x5-base": 50.0}) == set()
    assert own_split_only("lake/5x5", {"lake/4x4-v3": 10.0, "lake/5x5-v2": 90.0}) == {"lake/4x4-v3"}
    assert own_split_only("lake/5x5", {"lake/4x4-v3": 0.0}) == set()


def test_a_done_lineage_rests_unless_the_drill_needs_it() -> None:
    """A done lineage stops acting and is paused (its trajectories would train versions no
    one counts, on the CPU the other lineage's jobs need), except while the drill runs: its
    target, and the other lineage whose controller and split the drill watches at work."""
    assert not at_rest("a", False, None) and at_rest("a", True, None)
    drill = Drill("a", "b")
    assert not at_rest("a", True, drill) and not at_rest("b", True, drill)
    assert at_rest("c", True, drill) and not at_rest("c", False, drill)
    drill.injected, drill.state = "a-v3", "canary"
    assert not at_rest("a", True, drill) and not at_rest("b", True, drill)
    for end in ("rolled_back", "skipped"):
        drill.state = end
        assert at_rest("a", True, drill) and at_rest("b", True, drill)


def test_a_lineage_acts_at_a_trickle_unless_its_canary_needs_sessions() -> None:
    # done, busy, validating, a job active
    assert not paced(False, False, False, False)  # acting for its next job's trajectories
    assert paced(False, False, True, False) and paced(False, False, False, True)
    assert not paced(False, True, True, True)  # its canary: full speed
    assert paced(True, False, False, False) and paced(True, True, False, False)  # the drill's


def test_two_lineages_walk_apart_and_the_drill_rolls_back_in_one(tmp_path: Path) -> None:
    # one agent a lineage (the profile gives each 2): both lineages still act, train and
    # canary on their own; half the agents at full speed through the canaries cost ~12
    # CPU-s less of the suite
    proc = run_loop_cli(
        "--quick", "--lineages", "2", "--bad-candidate", "--set", "agents=1",
        "--data-dir", str(tmp_path / "loop"),
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    last = json.loads(out.strip().splitlines()[-1])
    assert last["lineages"] == 2
    assert last["lost"] == 0 and last["trajectories"] > 0, out[-3000:]
    names = [s.name for s in specs(2)]
    assert sorted(last["per_lineage"]) == sorted(names)
    for name in names:
        one = last["per_lineage"][name]
        # its base and at least one trained version of its own, decided by its own controller
        assert one["versions"] >= 2 and one["promoted"] + one["rolled_back"] >= 1, (name, one)
        assert one["base_heldout_success"] is not None and one["heldout_seeds"] > 0
        assert one["trajectories"] > 0
    assert last["drill_version"] and last["drill_version"].startswith(names[0] + "-"), last
    assert last["drill_rolled_back"] is True and last["drill_other_split_untouched"] is True
    assert last["min_lineage_gain"] is not None
    # each lineage's jobs ran on its own agents: versions registered into their own lineage
    for name in names:
        assert f"version {name}-v1: register" in out, out[-3000:]
    assert "rollback -> rolled_back" in out
    page = (tmp_path / "loop" / "report" / "index.html").read_text()
    for name in names:  # the report's section per lineage: a row and a headline each
        assert f'<tr data-lineage="{name}">' in page and f"lineage {name}</th>" in page
        assert f'<p class="headline" data-lineage="{name}">' in page
    assert (tmp_path / "loop" / "report" / "reward_per_lineage.png").exists()


def test_a_lineage_table_has_no_empty_stage_line() -> None:
    """The run's stages belong to the run's JSON line; a lineage's own table (no stages)
    printed 'stage wall times (s): ' with nothing after it."""
    from agentrl.app.loop_results import LoopResult, VersionRow, table

    lineage = LoopResult(versions=[VersionRow("lake/4x4-base", "live")], trajectories=3)
    assert "stage wall times" not in table(lineage)
    run = LoopResult(versions=[VersionRow("p-base", "live")], stages={"acting": 1.5})
    assert table(run).splitlines()[-1] == "stage wall times (s): acting=1.5"
