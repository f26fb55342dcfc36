"""Goodput projected to a size (launcher.resolution.goodput_projection): the first-order
waste model, the Young-Daly interval, the recovery roads, the failure rate derived from
the published figures, and `glaunch plan`'s projection (text and JSON)."""

import json
import math
import time
from dataclasses import replace

import pytest

import badinput
from badinput import SITE, Refused, refuse, within
from launcher import api
from launcher.errors import ConfigError
from launcher.resolution import goodput_projection as gp
from launcher.resolution.goodput_projection import Costs
from launcher.views.goodput_text import projection_lines
from launcher.views.plan_text import format_plan

H = 3600.0
COSTS = Costs(save_s=30.0, startup_s=180.0, load_s=60.0, queue_wait_s=600.0, step_s=1.0, every_steps=500)


# --- the published figures ----------------------------------------------------------------


def test_default_rate_reproduces_the_published_times_between_interruptions():
    # Kokolis et al. 2024 (Meta's research clusters): about 8 h on 1,024 GPUs, under 2 h on 16,384.
    assert gp.job_mtbf_s(gp.DEFAULT_FAILURES_PER_NODE_HOUR, 1024 // 8) / H == pytest.approx(8.0, rel=0.05)
    assert gp.job_mtbf_s(gp.DEFAULT_FAILURES_PER_NODE_HOUR, 16_384 // 8) / H < 2.0


def test_llama3_rate_gives_back_its_interruptions():
    # Dubey et al. 2024: 419 unexpected interruptions in 54 days on 16,384 GPUs (2,048 nodes of 8).
    assert pytest.approx(1.58e-4, rel=0.01) == gp.RATE_LLAMA3
    assert pytest.approx(419) == gp.RATE_LLAMA3 * 2048 * 54 * 24
    assert gp.job_mtbf_s(gp.RATE_LLAMA3, 2048) / H == pytest.approx(3.09, abs=0.01)
    assert gp.RATE_LLAMA3 < gp.DEFAULT_FAILURES_PER_NODE_HOUR      # the default is the cautious one


# --- the model ----------------------------------------------------------------------------


def test_young_daly_interval_is_the_closed_form_and_the_minimum():
    mtbf = gp.job_mtbf_s(1e-3, 256)
    best = gp.young_daly_interval_s(30.0, mtbf)
    assert best == pytest.approx(math.sqrt(2 * 30.0 * mtbf))
    size = gp.project_size(1e-3, COSTS, 256, 8, 4 * H)
    assert size.optimal_interval_s == pytest.approx(best)
    for restart in (0.0, 240.0, 840.0):          # at first order the restart cost does not move it
        at_best = gp.waste(30.0, best, restart, mtbf)
        assert all(gp.waste(30.0, best * f, restart, mtbf) > at_best for f in (0.5, 0.9, 1.1, 2.0))


def test_waste_and_ettr_by_hand():
    # δ = 30 s, τ = 600 s, R = 240 s, M = 10 h: 30/600 + (300 + 240)/36000 = 0.05 + 0.015
    assert gp.waste(30, 600, 240, 10 * H) == pytest.approx(0.065)
    assert gp.ettr(30, 600, 240, 10 * H) == pytest.approx(0.935)
    assert gp.ettr(30, 600, 240, 60) == 0.0                      # clamped


def test_ettr_falls_as_the_failure_rate_rises():
    rates = [1e-5, 1e-4, 5e-4, 1e-3, 5e-3]
    for road in gp.ROADS:
        values = [gp.project_size(r, COSTS, 128, 8, 4 * H).road(road) for r in rates]
        for attr in ("ettr_optimal", "ettr_configured"):
            series = [getattr(v, attr) for v in values]
            assert series == sorted(series, reverse=True) and series[0] > series[-1], (road, attr)


def test_in_allocation_beats_requeue_when_the_queue_waits():
    for nodes in (1, 16, 128, 2048):
        size = gp.project_size(1e-3, COSTS, nodes, 8, 4 * H)
        requeue, in_allocation = size.road("requeue"), size.road("in_allocation")
        assert in_allocation.restart_s == 240 and requeue.restart_s == 840
        assert in_allocation.ettr_optimal >= requeue.ettr_optimal
        assert in_allocation.ettr_configured >= requeue.ettr_configured
    no_queue = Costs(30, 180, 60, 0.0, 1.0, 500)
    size = gp.project_size(1e-3, no_queue, 128, 8, 4 * H)
    assert size.road("requeue").ettr_optimal == size.road("in_allocation").ettr_optimal


def test_spares_trade_requeues_for_idle_nodes():
    mtbf, alloc = gp.job_mtbf_s(1e-3, 2048), 4 * H
    best = gp.young_daly_interval_s(COSTS.save_s, mtbf)
    roads = {k: gp.spares_road(COSTS, 2048, k, mtbf, best, alloc) for k in (1, 4, 8, 16, 64, 512)}
    shares = [roads[k].requeue_share for k in sorted(roads)]
    assert shares == sorted(shares, reverse=True)                    # more spares, fewer requeues
    assert roads[512].requeue_share == pytest.approx(0.0, abs=1e-9)
    # Never worse than in-allocation restarts on N nodes, never better than them once paid for.
    in_allocation = gp.ettr(COSTS.save_s, best, 240, mtbf)
    assert all(r.ettr_optimal <= in_allocation for r in roads.values())
    # Too many spares cost more idle node-hours than the requeues they save.
    assert roads[512].ettr_optimal < roads[16].ettr_optimal
    # At 2,048 nodes some spares beat requeueing every failure; on one node a spare halves the job.
    chosen = gp.best_spares(COSTS, 2048, mtbf, best, alloc)
    assert chosen.ettr_optimal > gp.ettr(COSTS.save_s, best, 840, mtbf)
    assert chosen.ettr_optimal >= max(r.ettr_optimal for r in roads.values())
    one = gp.project_size(1e-3, COSTS, 1, 8, 4 * H)
    assert one.road("spares").spare_nodes == 1
    assert one.road("spares").ettr_optimal < one.road("requeue").ettr_optimal


def test_requeue_share_is_the_poisson_excess():
    assert gp.requeue_share(0, 2.0) == pytest.approx(1.0)
    # F ~ Poisson(1), K = 1: E[max(F-1, 0)] = 1 - P(F >= 1) = e^-1; over E[F] = 1
    assert gp.requeue_share(1, 1.0) == pytest.approx(math.exp(-1))
    assert gp.requeue_share(3, 0.0) == 0.0


def test_defaults_are_named_and_measured_costs_kept():
    costs = gp.costs_with_defaults({"save_s": 4.0, "step_s": None, "queue_wait_s": 12.0}, 100)
    assert costs.save_s == 4.0 and costs.queue_wait_s == 12.0
    assert set(costs.defaults) == {"startup_s", "load_s", "step_s"}
    assert costs.interval_s == 100 * gp.DEFAULT_COSTS["step_s"]
    assert gp.costs_with_defaults({}, None).interval_s is None


def test_projection_json():
    data = gp.project(None, COSTS, [(128, 8), (2048, 8)], 4 * H).to_json()
    assert data["failures_per_node_hour"] == gp.DEFAULT_FAILURES_PER_NODE_HOUR
    assert "Kokolis" in data["rate_source"]
    assert [s["gpus"] for s in data["sizes"]] == [1024, 16384]
    small, large = data["sizes"]
    assert small["mtbf_s"] == pytest.approx(8 * H)
    assert [r["road"] for r in large["roads"]] == ["requeue", "in_allocation", "spares"]
    assert large["optimal_every_steps"] == round(math.sqrt(2 * 30 * 1800))
    assert all(0 <= r["ettr_optimal"] <= 1 for s in data["sizes"] for r in s["roads"])
    assert gp.project(2e-4, COSTS, [(1, 8)], H, "site").rate_source == "site"


# --- glaunch plan -------------------------------------------------------------------------
# conftest's mysite_workdir: 2 nodes x 4 GPUs, one hour; checkpoint.every_steps at its default (500).
PARAMS = ["model.params=1e9"]



def test_plan_projects_at_its_size_and_the_named_one(mysite_workdir):
    result = api.plan("exp.yaml", site="mysite", overrides=PARAMS, at_gpus=16384)
    text = format_plan(result).split("goodput projected", 1)[1]
    for fragment in ["0.000977 failures per node-hour", "Kokolis", "save stall 30.0 s (default)",
                     "checkpoint every 500 steps = 8m20s", "at 8 GPUs (2 node(s) x 4)",
                     "at 16384 GPUs (4096 node(s) x 4): job MTBF 15m00s", "requeue", "in-allocation restart",
                     "spare nodes (", "ETTR now", "at Young-Daly", "1h00m allocation"]:
        assert fragment in text, fragment


def test_plan_json_carries_the_projection(mysite_workdir):
    site = mysite_workdir / "site_configs" / "mysite.yaml"
    site.write_text(site.read_text() + "goodput: {failures_per_node_hour: 1.6e-4}\n")
    projection = json.loads(json.dumps(api.plan("exp.yaml", site="mysite", overrides=PARAMS, at_gpus=1000).to_json()))
    projection = projection["goodput"]["projection"]
    assert projection["failures_per_node_hour"] == 1.6e-4
    assert projection["rate_source"] == "site goodput.failures_per_node_hour"
    assert projection["allocation_s"] == H and projection["costs"]["every_steps"] == 500
    assert [(s["nodes"], s["gpus"]) for s in projection["sizes"]] == [(2, 8), (250, 1000)]
    assert api.plan("exp.yaml", site="mysite", overrides=PARAMS).to_json()["goodput"]["projection"]["sizes"][0]["gpus"] == 8


def test_plan_refuses_no_gpus(mysite_workdir):
    with pytest.raises(ConfigError, match="--at-gpus"):
        api.plan("exp.yaml", site="mysite", overrides=PARAMS, at_gpus=0)


# --- sizes and costs the model cannot take: said, never a traceback, bounded work -----------


# (id, failure rate, costs, nodes, allocation, {figure: fragment of why it is not computable})
DEGENERATE = [
    ("checkpoint-interval-zero", 1e-3, replace(COSTS, step_s=0.0), 2, 4 * H,
     {"ettr_configured": "the checkpoint interval measured 0 s (500 steps of 0 s)",
      "optimal_every_steps": "in steps of 0 s is not a count of steps"}),
    ("save-stall-zero", 1e-3, replace(COSTS, save_s=0.0), 2, 4 * H,
     {"ettr_optimal": "the Young-Daly interval is 0 s (the save stall measured 0 s)",
      "spares": "the Young-Daly interval is 0 s"}),
    ("save-stall-infinite", 1e-3, replace(COSTS, save_s=math.inf), 2, 4 * H,
     {"ettr_optimal": "the Young-Daly interval is not a finite time", "optimal_interval_s": "not a finite time"}),
    ("step-subnormal", 1e-3, replace(COSTS, step_s=5e-324), 2, 4 * H,
     {"optimal_every_steps": "in steps of 4.94e-324 s"}),
    ("every-steps-past-the-floats", 1e-3, replace(COSTS, every_steps=10**400), 2, 4 * H,
     {"ettr_configured": "the checkpoint interval measured inf s"}),
    ("rate-subnormal", 1e-320, COSTS, 2, 4 * H,
     dict.fromkeys(["mtbf_s", "optimal_interval_s", "optimal_every_steps", "ettr_configured", "ettr_optimal",
                    "spares"], "the job's MTBF comes out as inf s from 1e-320 failures per node-hour x 2")),
    ("rate-zero", 0.0, COSTS, 2, 4 * H, {"mtbf_s": "the job's MTBF comes out as inf s"}),
    ("rate-nan", math.nan, COSTS, 2, 4 * H, {"ettr_optimal": "the job's MTBF comes out as nan s"}),
    ("rate-infinite", math.inf, COSTS, 2, 4 * H, {"ettr_configured": "the job's MTBF comes out as 0 s"}),
    ("rate-huge", 1e300, COSTS, 2, 4 * H, {"spares": "failures expected per allocation of 1.44e+04 s, past the "
                                                     "10,000"}),
    ("nodes-past-the-floats", 1e-3, COSTS, 10**400, 4 * H, {"mtbf_s": "the job's MTBF comes out as 0 s"}),
    ("million-single-gpu-nodes-a-slurm-lifetime", 1e-3, COSTS, 10**6, 2**31 * 60.0,
     {"spares": "failures expected per allocation"}),
]


@pytest.mark.parametrize("rate, costs, nodes, allocation, cannot", [c[1:] for c in DEGENERATE],
                         ids=[c[0] for c in DEGENERATE])
def test_what_the_model_cannot_compute_is_said(rate, costs, nodes, allocation, cannot):
    with within(5):
        data = json.loads(json.dumps(gp.project(rate, costs, [(nodes, 8)], allocation).to_json(), allow_nan=False))
    (size,) = data["sizes"]
    for key, fragment in cannot.items():
        assert fragment in size["not_computable"].get(key, ""), (key, size["not_computable"])
    roads = {r["road"]: r for r in size["roads"]}
    if "ettr_optimal" in cannot:
        assert all(r["ettr_optimal"] is None for r in roads.values())
    if "ettr_configured" in cannot:
        assert all(r["ettr_configured"] is None for r in roads.values())
    if "optimal_every_steps" in cannot:
        assert size["optimal_every_steps"] is None
    said = "\n".join(projection_lines(data)).partition("not computable: ")[2]
    assert all(fragment in said for fragment in cannot.values()), said


def test_measured_costs_that_are_not_times_count_as_not_measured():
    costs = gp.costs_with_defaults({"save_s": math.nan, "startup_s": -1.0, "load_s": "5", "queue_wait_s": math.inf,
                                    "step_s": 10**400, "restart_s": True}, 100)
    assert set(costs.defaults) == set(gp.DEFAULT_COSTS) and costs.restart_s is None


def test_the_spares_search_does_not_grow_with_the_size():
    # A million nodes, a failure every few seconds of a day's allocation: the numbers of
    # spares weighed stop a few standard deviations past the failures expected.
    for nodes, allocation in [(10**6 // 8, 24 * H), (10**6, 4 * H), (10**6, 24 * H), (2048, 30 * 24 * H)]:
        with within(3):
            size = gp.project_size(gp.DEFAULT_FAILURES_PER_NODE_HOUR, COSTS, nodes, 8, allocation)
        spares = size.road("spares")
        assert spares.spare_nodes <= nodes and ("spares" in size.not_computable) == (spares.ettr_optimal is None)


def test_requeue_shares_in_one_pass_are_those_of_each_count():
    for mean in (0.3, 2.0, 40.0, 900.0):
        shares = gp.requeue_shares(60, mean)
        assert [gp._share(shares, k) for k in (0, 1, 7, 60)] == [
            pytest.approx(gp.requeue_share(k, mean)) for k in (0, 1, 7, 60)]
    assert gp.requeue_share(10**12, 3.0) == pytest.approx(0.0, abs=1e-12)   # no loop over the count


# --- glaunch plan --at-gpus: bounded --------------------------------------------------------


@pytest.mark.parametrize("value", ["99999999999999999999", "1000000000", "1000001"])
@pytest.mark.parametrize("as_json", [[], ["--json"]], ids=["text", "json"])
def test_at_gpus_past_the_bound_is_refused_at_once(mysite_workdir, monkeypatch, capsys, value, as_json):
    monkeypatch.setattr(badinput, "HANG_S", 20)
    began = time.monotonic()
    code, out, err = badinput.run_cli(monkeypatch, capsys, ["glaunch", "plan", "exp.yaml", "--site", "mysite",
                                                            "--at-gpus", value, *as_json, *PARAMS])
    assert time.monotonic() - began < 5
    assert code == 2 and out == "" and "Traceback" not in err, err
    assert err.startswith("glaunch: error: ") and err.count("\n") == 1, err
    assert "--at-gpus" in err and "1,000,000" in err, err


def test_at_gpus_at_the_bound_is_projected_at_once(mysite_workdir, monkeypatch, capsys):
    # A million nodes of one GPU for a day: tens of thousands of failures per allocation.
    monkeypatch.setattr(badinput, "HANG_S", 20)
    began = time.monotonic()
    code, out, err = badinput.run_cli(monkeypatch, capsys, [
        "glaunch", "plan", "exp.yaml", "--site", "mysite", "--at-gpus", "1000000", "--json", *PARAMS,
        "resources.gpus_per_node=1", "resources.time=1-00:00:00"])
    assert time.monotonic() - began < 5
    assert code == 0, err
    size = json.loads(out)["goodput"]["projection"]["sizes"][1]
    assert (size["gpus"], size["nodes"]) == (1_000_000, 1_000_000)
    assert "failures expected per allocation" in size["not_computable"]["spares"]


@pytest.mark.parametrize("value", [1_000_001, 10**20, 2.5, "8", True])
def test_api_plan_refuses_at_gpus_that_are_not_a_count_in_range(mysite_workdir, value):
    with within(20), pytest.raises(ConfigError, match="--at-gpus") as caught:
        api.plan("exp.yaml", site="mysite", overrides=PARAMS, at_gpus=value)
    assert caught.value.exit_code == 2


# --- goodput.failures_per_node_hour: a bounded range -----------------------------------------
# (the site's value -> what its one error line says besides the file, the key and the range)
RATES = [("1e-320", "got 1e-320"), ("5e-324", "got 4.94e-324"), ("1e-10", "got 1e-10"), ("0", "got 0"),
         ("-1e-3", "got -0.001"), ("1.5", "got 1.5"), ("1e300", "got 1e+300")]


@pytest.mark.parametrize("value, said", RATES, ids=[r[0] for r in RATES])
@pytest.mark.parametrize("command", ["plan", "submit"])
def test_a_failure_rate_out_of_range_is_refused(tmp_path, monkeypatch, capsys, isolated_env, command, value, said):
    case = Refused(f"rate-{value}", {"site_configs/mysite.yaml": SITE + f"goodput: {{failures_per_node_hour: {value}}}\n"},
                   PARAMS if command == "plan" else [], command=command)
    err = refuse(case, tmp_path, monkeypatch, capsys)
    for fragment in ["mysite.yaml", "goodput.failures_per_node_hour", "from 1e-09 to 1 failures per node-hour",
                     "above 0", said]:
        assert fragment in err, (fragment, err)


@pytest.mark.parametrize("costs, sizes, said", [
    # The starter's defaults: a 30 s default save against a 25 s interval.
    ({"save_s": 30.0, "interval_s": 25.0, "defaults": ["save_s"]}, [{"optimal_every_steps": 1200}],
     "ETTR now 0: a save stall of 30.0 s (a default: measure it with a run, or give it) is as long as the "
     "checkpoint interval or longer (25.0 s): the run would only save; set checkpoint.every_steps to 1200"),
    ({"save_s": 60.0, "interval_s": 60.0}, [{}],
     "save less often (checkpoint.every_steps) or faster (a background save)"),
    ({"save_s": 10.0, "interval_s": 60.0}, [{"optimal_every_steps": 5}], None),
    ({"save_s": None, "interval_s": 60.0}, [], None),
], ids=["starter-defaults", "no-young-daly", "saves-fit", "no-save-time"])
def test_an_ettr_of_0_says_the_save_outlasts_the_interval_and_what_to_set(costs, sizes, said):
    from launcher.views.goodput_text import saving_only_lines

    lines = saving_only_lines({"costs": costs, "sizes": sizes})
    if said is None:
        assert lines == []
    else:
        assert len(lines) == 1 and said in lines[0], lines
