"""The peer road of the goodput projection (recovery.peer): a share of the failures costs a
peer recovery instead of half an interval and a restart; at 1,024 and 16,384 GPUs it beats
the in-allocation restart it falls back on, its figures are finite, and it is shown where
asked for or measured."""

import json
import math
from dataclasses import replace

import pytest

from launcher.resolution import goodput_projection as gp
from launcher.resolution.goodput_projection import Costs

H = 3600.0
COSTS = Costs(save_s=30.0, startup_s=180.0, load_s=60.0, queue_wait_s=600.0, step_s=1.0, every_steps=500)
SIZES = [(1024 // 8, 8), (16_384 // 8, 8)]


def test_the_peer_road_beats_the_restart_at_1024_and_16384_gpus():
    projection = gp.project(None, COSTS, SIZES, 4 * H, peer_share=gp.DEFAULT_PEER_SHARE)
    data = json.loads(json.dumps(projection.to_json(), allow_nan=False))
    assert data["peer_share"] == gp.DEFAULT_PEER_SHARE and "peer" in data["model"]
    for size in data["sizes"]:
        roads = {r["road"]: r for r in size["roads"]}
        assert list(roads) == ["requeue", "in_allocation", "spares", "peer"]
        peer, restart = roads["peer"], roads["in_allocation"]
        for key in ("restart_s", "ettr_configured", "ettr_optimal", "optimal_interval_s"):
            assert isinstance(peer[key], float) and math.isfinite(peer[key]), (size["gpus"], key)
        assert 0 < peer["ettr_optimal"] <= 1 and 0 < peer["ettr_configured"] <= 1
        assert peer["ettr_optimal"] > restart["ettr_optimal"] and peer["ettr_configured"] > restart["ettr_configured"]
        assert peer["ettr_optimal"] > max(r["ettr_optimal"] for name, r in roads.items() if name != "peer")
        # Fewer failures reach a checkpoint: the road saves less often.
        assert peer["optimal_interval_s"] > size["optimal_interval_s"]
    small, large = data["sizes"]
    gain = [s["roads"][3]["ettr_optimal"] - s["roads"][1]["ettr_optimal"] for s in (small, large)]
    assert gain[1] > gain[0]                     # the larger the job, the more failures the road saves


def test_the_peer_road_by_hand():
    # M = 8 h, p = 0.15, P = 30 s, R = 240 s, δ = 30 s, τ = 500 s:
    # 30/500 + (0.85 x (250 + 240) + 0.15 x 30) / 28800
    mtbf = gp.job_mtbf_s(gp.DEFAULT_FAILURES_PER_NODE_HOUR, 128)
    assert mtbf == pytest.approx(8 * H)
    expected = 30 / 500 + (0.85 * (250 + 240) + 0.15 * 30) / mtbf
    assert gp.peer_waste(30, 500, 240, 30, 0.15, mtbf) == pytest.approx(expected)
    road = gp.project_size(gp.DEFAULT_FAILURES_PER_NODE_HOUR, COSTS, 128, 8, 4 * H, peer_share=0.15).road("peer")
    assert road.ettr_configured == pytest.approx(1 - expected)
    assert road.restart_s == pytest.approx(0.15 * gp.DEFAULT_PEER_S + 0.85 * 240)
    # Its own Young-Daly interval sqrt(2 δ M / (1 - p)) is the minimum of its waste.
    best = math.sqrt(2 * 30 * mtbf / 0.85)
    assert road.optimal_interval_s == pytest.approx(best)
    at_best = gp.peer_waste(30, best, 240, 30, 0.15, mtbf)
    assert all(gp.peer_waste(30, best * f, 240, 30, 0.15, mtbf) > at_best for f in (0.5, 0.9, 1.1, 2.0))


def test_no_share_is_the_in_allocation_road_and_more_share_is_better():
    size = gp.project_size(1e-3, COSTS, 512, 8, 4 * H, peer_share=0.0)
    assert size.road("peer").ettr_optimal == pytest.approx(size.road("in_allocation").ettr_optimal)
    values = [gp.project_size(1e-3, COSTS, 512, 8, 4 * H, peer_share=p).road("peer").ettr_optimal
              for p in (0.0, 0.1, 0.3, 0.6, 0.9)]
    assert values == sorted(values) and values[-1] > values[0]


def test_shown_where_asked_for_or_measured_only():
    assert [r.name for r in gp.project(None, COSTS, SIZES, 4 * H).sizes[0].roads] == list(gp.ROADS)
    measured = gp.costs_with_defaults({"peer_s": 0.4}, 500)
    projection = gp.project(None, measured, SIZES, 4 * H)
    assert projection.peer_share == gp.DEFAULT_PEER_SHARE
    peer = projection.sizes[1].road("peer")
    assert peer.restart_s == pytest.approx(gp.DEFAULT_PEER_SHARE * 0.4 + (1 - gp.DEFAULT_PEER_SHARE) * 240)
    costs = projection.to_json()["costs"]
    assert costs["peer_s"] == 0.4 and costs["peer_measured"] is True
    assert gp.costs_with_defaults({}, 500).to_json()["peer_measured"] is False


@pytest.mark.parametrize("share", [1.0, -0.1, math.nan, math.inf, True, "0.2"])
def test_a_share_that_is_not_one_is_refused(share):
    with pytest.raises(ValueError, match="from 0 to below 1"):
        gp.project(None, COSTS, SIZES, 4 * H, peer_share=share)


@pytest.mark.parametrize("costs, rate", [
    (replace(COSTS, save_s=0.0), 1e-3), (replace(COSTS, save_s=math.inf), 1e-3), (replace(COSTS, step_s=0.0), 1e-3),
    (COSTS, 0.0), (COSTS, math.nan), (COSTS, math.inf), (COSTS, 1e300), (replace(COSTS, peer_s=1e308), 1e-3)])
def test_degenerate_costs_give_none_never_nan(costs, rate):
    data = json.loads(json.dumps(gp.project(rate, costs, [(2048, 8)], 4 * H, peer_share=0.5).to_json(),
                                 allow_nan=False))
    (size,) = data["sizes"]
    peer = next(r for r in size["roads"] if r["road"] == "peer")
    for key in ("ettr_configured", "ettr_optimal"):
        assert peer[key] is None or 0 <= peer[key] <= 1
    if "ettr_optimal" in size["not_computable"]:
        assert peer["ettr_optimal"] is None


@pytest.mark.parametrize("peer, shown", [("true", True), ("false", False)])
def test_glaunch_plan_shows_the_peer_road_when_the_experiment_turns_it_on(peer, shown, isolated_env):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "launcher.cli", "plan", "examples/torch_ddp.yaml", "--site",
                           "local-slurm", f"recovery.peer={peer}", "model.params=1e9", "--at-gpus", "16384",
                           "--json"], cwd=repo, env=isolated_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    projection = json.loads(done.stdout)["goodput"]["projection"]
    roads = {road["road"] for size in projection["sizes"] for road in size["roads"]}
    assert ("peer" in roads) is shown, roads
