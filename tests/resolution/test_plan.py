"""The strategy planner: its memory model against DeepSpeed's estimators, the ZeRO paper
and hand-computed FSDP2 figures, `strategy.name: auto` through the real CLI, `glaunch
plan` and its imports."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from launcher import cli
from launcher.resolution import memory, planner
from launcher.resolution.memory import PlanInput
from launcher.resolution.planner import make_plan
from launcher.resolution.strategy import inspect_factory

REPO = Path(__file__).resolve().parents[2]

SITE = """\
name: eight
scheduler: slurm
default_partition: gpu
partitions:
  gpu: {{gpus_per_node: 8, gpu_mem_gb: 80, max_nodes: 16{extra}}}
"""
EXP = """\
name: sweep
entrypoint: {script: train.py}
resources: {nodes: 1, time: "01:00:00"}
strategy: {name: auto}
precision: bf16
model: {params: 1.0e9}
"""


def glaunch(monkeypatch, capsys, *args):
    """Run the CLI in-process; (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["glaunch", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def workdir(tmp_path, monkeypatch, isolated_env):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "exp.yaml").write_text(EXP)
    (tmp_path / "site.yaml").write_text(SITE.format(extra=""))
    return tmp_path


# --- DeepSpeed's estimators -------------------------------------------------------------

SIZES = [(125e6, 768), (1.3e9, 2048), (7e9, 4096), (70e9, 8192)]     # (params, hidden size)
LAYOUTS = [(1, 1), (1, 8), (2, 4), (16, 8), (128, 4)]                # (nodes, GPUs per node)


@pytest.mark.parametrize("params,hidden", SIZES)
@pytest.mark.parametrize("nodes,gpus", LAYOUTS)
def test_deepspeed_gb_matches_deepspeeds_estimators(ds_estimators, params, hidden, nodes, gpus, capsys):
    zero2, zero3 = ds_estimators
    psi, largest = int(params), 4 * hidden * hidden
    rows = {r.name: r for r in make_plan(PlanInput(params=psi, nodes=nodes, gpus_per_node=gpus, gpu_mem_gb=80,
                                                   largest_layer_params=largest)).rows}
    expected = {
        "zero2": zero2(psi, gpus, nodes, cpu_offload=False)[1],
        "zero2_offload": zero2(psi, gpus, nodes, cpu_offload=True)[1],
        "zero3": zero3(psi, largest, gpus, nodes, cpu_offload=False, cpu_offload_params=False)[1],
        "zero3_offload": zero3(psi, largest, gpus, nodes, cpu_offload=True, cpu_offload_params=True)[1],
    }
    for name, gpu_bytes in expected.items():
        assert rows[name].deepspeed_gb * 1e9 == pytest.approx(gpu_bytes, rel=0.01), name


def test_deepspeed_gb_through_plan_json(ds_estimators, workdir, monkeypatch, capsys):
    zero2, zero3 = ds_estimators
    code, out, err = glaunch(monkeypatch, capsys, "plan", "exp.yaml", "--site", "site.yaml", "--json",
                             "model.params=7e9", "model.largest_layer_params=67108864", "resources.nodes=4")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)["strategies"]}
    assert rows["zero2"]["deepspeed_gb"] * 1e9 == pytest.approx(zero2(7_000_000_000, 8, 4, cpu_offload=False)[1],
                                                                rel=0.01)
    assert rows["zero3"]["deepspeed_gb"] * 1e9 == pytest.approx(
        zero3(7_000_000_000, 67108864, 8, 4, cpu_offload=False, cpu_offload_params=False)[1], rel=0.01)


def test_ddp_and_zero1_follow_deepspeeds_byte_counts():
    rows = {r.name: r for r in make_plan(PlanInput(params=10**9, nodes=2, gpus_per_node=8, gpu_mem_gb=80)).rows}
    assert rows["ddp"].deepspeed_gb == pytest.approx(20.0)              # the ZeRO-2 estimate with N = 1
    assert rows["zero1"].deepspeed_gb == pytest.approx(4 + 16 / 16)
    one = {r.name: r for r in make_plan(PlanInput(params=10**9, nodes=1, gpus_per_node=1, gpu_mem_gb=80)).rows}
    assert one["ddp"].deepspeed_gb == one["zero1"].deepspeed_gb == one["zero2"].deepspeed_gb


# --- the ZeRO paper's accounting ---------------------------------------------------------


def test_model_states_match_zero_paper_figure_1():
    """Ψ = 7.5B, Nd = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB."""
    result = make_plan(PlanInput(params=7_500_000_000, nodes=8, gpus_per_node=8, gpu_mem_gb=80, precision="bf16"))
    got = {r.name: r.model_states_gb for r in result.rows}
    assert got["ddp"] == pytest.approx(120.0, abs=0.05)
    assert got["zero1"] == pytest.approx(31.4, abs=0.05)
    assert got["zero2"] == pytest.approx(16.6, abs=0.05)
    assert got["zero3"] == pytest.approx(1.9, abs=0.05)


@pytest.mark.parametrize("precision,optimizer,ddp_bytes,zero3_bytes", [
    ("fp16", "adamw", 16, 16),          # 2 + 2 + 12
    ("fp32", "adam", 16, 16),           # 4 + 4 + 8
    ("bf16", "sgd", 12, 12),            # 2 + 2 + (4 master + 4 momentum)
    ("fp32", "sgd", 12, 12),            # 4 + 4 + 4 momentum
])
def test_model_states_follow_precision_and_optimizer(precision, optimizer, ddp_bytes, zero3_bytes):
    result = make_plan(PlanInput(params=10**9, nodes=1, gpus_per_node=4, gpu_mem_gb=80, precision=precision,
                                 optimizer=optimizer))
    rows = {r.name: r for r in result.rows}
    assert rows["ddp"].model_states_gb == pytest.approx(ddp_bytes)
    assert rows["zero3"].model_states_gb == pytest.approx(zero3_bytes / 4)
    word = 4 if precision == "fp32" else 2
    assert rows["zero1"].model_states_gb == pytest.approx(2 * word + (ddp_bytes - 2 * word) / 4)


# --- FSDP2 (fsdp): ZeRO-3's sharded states + the largest layer gathered whole ---------------


@pytest.mark.parametrize("precision,optimizer,expected_gb", [
    # 7.5e9 params over 4 GPUs, largest layer 2^26 = 67,108,864 params:
    ("bf16", "adam", 16 * 7.5e9 / 4 / 1e9 + 4 * 67_108_864 / 1e9),     # 30 + 0.268435456
    ("fp16", "adamw", 30.0 + 0.268435456),                              # (2 + 2 + 12) / 4, (2 + 2) L
    ("fp32", "adam", 30.0 + 0.536870912),                               # (4 + 4 + 8) / 4, (4 + 4) L
    ("bf16", "sgd", 22.5 + 0.268435456),                                # (2 + 2 + 8) / 4
    ("fp32", "sgd", 22.5 + 0.536870912),                                # (4 + 4 + 4) / 4
])
def test_fsdp_row_by_hand(precision, optimizer, expected_gb):
    result = make_plan(PlanInput(params=7_500_000_000, nodes=1, gpus_per_node=4, gpu_mem_gb=80, precision=precision,
                                 optimizer=optimizer, largest_layer_params=2**26))
    fsdp, zero3 = result.row("fsdp"), result.row("zero3")
    assert fsdp.estimate_gb == pytest.approx(expected_gb, abs=1e-9)
    assert fsdp.total_gb == pytest.approx(expected_gb + 2.0, abs=1e-9)       # + the site's overhead
    assert fsdp.model_states_gb == zero3.model_states_gb                       # the ZeRO paper's P_os+g+p
    assert fsdp.deepspeed_gb is None and fsdp.to_json()["deepspeed_gb"] is None
    assert fsdp.to_json()["estimate_gb"] == pytest.approx(expected_gb, abs=1e-6)
    assert (fsdp.comm_volume, fsdp.pcie_gb, fsdp.host_gb, fsdp.host_fits) == (1.5, 0.0, None, None)


def test_fsdp_shards_over_every_rank_of_every_node():
    # 70e9 on 16 nodes x 8 GPUs, bf16 Adam, L = 8192 x 28672 (a LLaMA-70B MLP matrix):
    # 16 x 70e9 / 128 = 8.75 GB, 4 x 234,881,024 = 0.939524096 GB.
    rows = planner.evaluate(PlanInput(params=70 * 10**9, nodes=16, gpus_per_node=8, gpu_mem_gb=80,
                                      largest_layer_params=8192 * 28672))
    fsdp = next(r for r in rows if r.name == "fsdp")
    assert fsdp.estimate_gb == pytest.approx(8.75 + 0.939524096, abs=1e-9)
    assert fsdp.total_gb == pytest.approx(8.75 + 0.939524096 + 2.0, abs=1e-9)


@pytest.mark.parametrize("gpu_mem_gb,chosen", [
    (80, "zero1"),       # zero1: 2Ψ + 2Ψ + 16Ψ/4 = 60 GB + 2 of 72 usable: DDP's communication volume
    (57, "zero2"),       # zero1's 62 > 51.3 usable; zero2: 15 + 18 x 7.5/4 = 48.75 + 2 fits
    (40, "fsdp"),        # zero2's 50.75 > 36; fsdp: 30.27 + 2 fits, as zero3 (36.02) does not
    (20, "zero2_offload"),   # fsdp's 32.27 > 18; zero2 offload: 15 + 2 fits
])
def test_auto_prefers_least_communication_then_fsdp_over_zero3(gpu_mem_gb, chosen):
    result = make_plan(PlanInput(params=7_500_000_000, nodes=1, gpus_per_node=4, gpu_mem_gb=gpu_mem_gb,
                                 largest_layer_params=2**26))
    assert result.recommended == chosen
    assert memory.STRATEGIES.index("zero2") < memory.STRATEGIES.index("fsdp") < memory.STRATEGIES.index("zero3")


@pytest.mark.parametrize("precision", memory.PRECISIONS)
@pytest.mark.parametrize("optimizer", memory.OPTIMIZERS)
def test_fsdp_never_needs_more_than_zero3(precision, optimizer):
    # Both gather the largest layer's weights and gradients whole, (P + G)L; zero3's DeepSpeed
    # count shards S = G + F + O + 4 bytes, fsdp's P + G + K: 2 bytes more under mixed
    # precision (the fp32 gradients against the 16-bit weights), as many in fp32. In fp32:
    # 16 x 1e9 / 8 + 8 x 1e8 = 2.8 GB for both, and the order picks fsdp.
    base = dict(params=10**9, nodes=1, gpus_per_node=8, precision=precision, optimizer=optimizer,
                largest_layer_params=10**8, overhead_gb=0.0, headroom=0.0)
    result = make_plan(PlanInput(**base, gpu_mem_gb=80))
    assert result.row("fsdp").estimate_gb <= result.row("zero3").estimate_gb
    if precision == "fp32" and optimizer != "sgd":
        assert result.row("fsdp").estimate_gb == pytest.approx(2.8) == result.row("zero3").estimate_gb
        assert make_plan(PlanInput(**base, gpu_mem_gb=2.8)).recommended == "fsdp"


# --- activations, overhead, headroom -------------------------------------------------------


def test_activations_follow_korthikanti():
    shape = dict(layers=24, hidden_size=2048, heads=16, seq_len=2048, micro_batch=4, flash_attention=False)
    rows = make_plan(PlanInput(params=1_300_000_000, nodes=1, gpus_per_node=8, gpu_mem_gb=80, precision="bf16",
                               **shape)).rows
    s, b, h, a, layers = 2048, 4, 2048, 16, 24
    expected = layers * s * b * h * (34 + 5 * a * s / h) / 1e9
    assert all(r.activations_gb == pytest.approx(expected) for r in rows)
    fp32 = make_plan(PlanInput(params=1_300_000_000, nodes=1, gpus_per_node=8, gpu_mem_gb=80, precision="fp32",
                               **shape)).rows[0]
    assert fp32.activations_gb == pytest.approx(layers * s * b * h * (66 + 9 * a * s / h) / 1e9)


def test_activations_zero_without_shape_and_said_so():
    result = make_plan(PlanInput(params=10**9, nodes=1, gpus_per_node=8, gpu_mem_gb=80, layers=24, heads=16))
    assert all(r.activations_gb == 0 for r in result.rows)
    table = planner.format_plan_table(result)
    assert "activations not counted" in table and "model.hidden_size" in table and "model.seq_len" in table
    assert "activation_checkpointing: none, flash_attention: true; no other recomputation tried" in table


def test_fits_uses_overhead_and_headroom():
    # ddp: 20 bytes x 3.3e9 = 66 GB, + 2 GB overhead = 68 GB of 72 GB usable (80 GB less 10 %)
    base = dict(params=3_300_000_000, nodes=1, gpus_per_node=8, gpu_mem_gb=80)
    assert make_plan(PlanInput(**base)).recommended == "ddp"
    assert make_plan(PlanInput(**base, overhead_gb=6.5)).recommended != "ddp"
    assert make_plan(PlanInput(**base, headroom=0.2)).recommended != "ddp"
    row = make_plan(PlanInput(**base, overhead_gb=3.0)).rows[0]
    assert row.total_gb == pytest.approx(row.estimate_gb + row.activations_gb + 3.0)


def test_zero3_largest_layer_estimate_is_documented_in_the_table():
    result = make_plan(PlanInput(params=10**9, nodes=1, gpus_per_node=8, gpu_mem_gb=80, hidden_size=2048))
    assert result.largest_layer_params == 4 * 2048 * 2048 + 4 * 2048
    assert "estimated" in planner.format_plan_table(result)
    given = make_plan(PlanInput(params=10**9, nodes=1, gpus_per_node=8, gpu_mem_gb=80, largest_layer_params=5))
    assert given.row("zero3_offload").deepspeed_gb == pytest.approx(20e-9)


def test_bad_plan_input_names_the_field():
    with pytest.raises(memory.PlanInputError) as info:
        PlanInput(params=10**9, nodes=1, gpus_per_node=8, gpu_mem_gb=80, seq_len=0)
    assert info.value.field == "seq_len"


@pytest.mark.parametrize("field,value", [
    ("gpu_mem_gb", float("nan")), ("gpu_mem_gb", float("inf")), ("host_mem_gb", float("inf")),
    ("host_mem_gb", float("nan")), ("overhead_gb", float("nan")), ("overhead_gb", float("inf")),
    ("headroom", float("nan")), ("params", float("inf")), ("params", float("nan")), ("max_nodes", float("inf")),
])
def test_non_finite_plan_input_is_refused(field, value):
    base = dict(params=10**9, nodes=1, gpus_per_node=8, gpu_mem_gb=80)
    with pytest.raises(memory.PlanInputError) as info:
        PlanInput(**{**base, field: value})
    assert info.value.field == field


def test_table_and_json_agree_on_what_fits():
    # 60B on one node of 8 x 80 GB with 512 GB of host memory: zero3_offload fits the GPUs
    # only; the table's `fits` column says no, like the JSON.
    result = make_plan(PlanInput(params=60 * 10**9, nodes=1, gpus_per_node=8, gpu_mem_gb=80, host_mem_gb=512,
                                 max_nodes=16))
    row = result.row("zero3_offload")
    assert row.gpu_fits and row.host_fits is False and not row.fits
    line = next(x for x in planner.format_plan_table(result).splitlines() if x.startswith("zero3_offload"))
    assert line.split()[5] == "no" and line.endswith("NO")
    assert row.to_json()["fits"] is False and row.to_json()["gpu_fits"] is True


def test_min_nodes_search_is_bounded_whatever_max_nodes_says(monkeypatch):
    inp = PlanInput(params=10**12, nodes=1, gpus_per_node=4, gpu_mem_gb=80, largest_layer_params=10**9,
                    host_mem_gb=512, max_nodes=10**15)
    evaluated = []
    evaluate = planner.evaluate
    monkeypatch.setattr(planner, "evaluate", lambda i, *n: evaluated.append(n) or evaluate(i, *n))
    result = make_plan(inp)
    # A bisection over 10**15 node counts: about log2(10**15) = 50 evaluations, not a scan.
    assert 2 <= len(evaluated) <= 60, len(evaluated)
    n = result.min_nodes
    assert n is not None and n > 1
    # The smallest: one node fewer fits nothing.
    assert any(r.fits for r in planner.evaluate(inp, n))
    assert not any(r.fits for r in planner.evaluate(inp, n - 1))


def test_min_nodes_matches_a_linear_search():
    for params in (3e10, 6e10, 1.5e11, 4e11):
        inp = PlanInput(params=int(params), nodes=1, gpus_per_node=4, gpu_mem_gb=40, host_mem_gb=256, max_nodes=64)
        linear = next((n for n in range(2, 65) if any(r.fits for r in planner.evaluate(inp, n))), None)
        assert planner.find_min_nodes(inp) == linear, params


# --- strategy.name: auto through the CLI ---------------------------------------------------


@pytest.mark.parametrize("params,chosen,stage,offload", [
    ("1.0e9", "ddp", None, None),
    ("8.0e9", "zero1", 1, None),
    ("14.0e9", "zero2", 2, None),
    ("25.0e9", "fsdp", None, None),             # 16 x 25e9 / 8 + 4L = 50.7 GB; zero2's 2 x 25e9 does not fit
    ("34.8e9", "zero2_offload", 2, ("cpu", None)),   # fsdp: 69.6 + 0.86 + 2 > 72; zero2 offload 69.6 + 2
    ("60.0e9", "zero3_offload", 3, ("cpu", "cpu")),
])
def test_auto_picks_the_first_strategy_that_fits(workdir, monkeypatch, capsys, params, chosen, stage, offload):
    runs = workdir / "runs"
    code, out, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "site.yaml", "--dry-run",
                             "--runs-dir", str(runs), "--json", f"model.params={params}")
    assert code == 0, err
    run_dir = workdir / "runs" / json.loads(out)["run_id"]
    resolved = yaml.safe_load((run_dir / "resolved.yaml").read_text())
    choice = resolved["derived"]["strategy_choice"]
    assert choice["chosen"] == chosen
    assert chosen in choice["reason"] and "fits" in choice["reason"]
    ds_path = run_dir / "ds_config.json"
    if stage is None:
        assert resolved["derived"]["strategy"] == chosen
        assert resolved["derived"].get("zero_stage") is None
        assert f"export GLAUNCH_STRATEGY={chosen}\n" in (run_dir / "env.sh").read_text()
        assert not ds_path.exists()
        return
    zero = json.loads(ds_path.read_text())["zero_optimization"]
    assert resolved["derived"]["strategy"] == "deepspeed"
    assert zero["stage"] == stage
    want_opt, want_param = offload or (None, None)
    assert zero.get("offload_optimizer", {}).get("device") == want_opt
    assert zero.get("offload_param", {}).get("device") == want_param


def test_auto_nothing_fits_exits_2_with_minimum_nodes(workdir, monkeypatch, capsys):
    # 60B on one node: only zero3_offload fits the GPUs, and it needs 18 x 60e9 = 1080 GB of
    # host memory, of 460.8 GB usable. On two nodes FSDP fits the GPUs:
    # 16 x 60e9 / 16 + 4L = 61.2 GB, + 2 GB overhead <= 72 GB (L estimated: 297M).
    (workdir / "site.yaml").write_text(SITE.format(extra=", mem_gb: 512"))
    runs = workdir / "runs"
    code, out, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "site.yaml", "--dry-run",
                             "--runs-dir", str(runs), "model.params=60e9")
    assert code == 2
    assert "Traceback" not in out + err
    assert "exp.yaml" in err and "strategy.name" in err
    assert "fits from 2 node(s)" in err
    assert "zero3_offload" in err and "ZeRO paper" in err                 # the plan table
    assert not runs.exists()
    code, out, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "site.yaml", "--dry-run",
                             "--runs-dir", str(runs), "--json", "model.params=60e9", "resources.nodes=2")
    assert code == 0, err
    resolved = yaml.safe_load((runs / json.loads(out)["run_id"] / "resolved.yaml").read_text())
    assert resolved["derived"]["strategy_choice"]["chosen"] == "fsdp"
    assert resolved["derived"]["strategy"] == "fsdp"


def test_auto_nothing_fits_at_any_node_count(workdir, monkeypatch, capsys):
    code, out, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "site.yaml", "--dry-run",
                             "--runs-dir", str(workdir / "runs"), "model.params=1e11",
                             "model.largest_layer_params=20000000000")
    assert code == 2
    assert "strategy.name" in err and "no node count up to 16 fits" in err


def test_auto_records_the_recomputation_it_assumes(workdir, monkeypatch, capsys):
    # 7B on one node of 8 x 80 GB with the attention scores stored: 104 GB of activations
    # per GPU fit nothing; with selective recomputation (18.25 GB) zero1 does,
    # 4Ψ + 16Ψ/8 + 18.25 + 2 = 60.7 GB of 72.
    runs = workdir / "runs"
    code, out, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "site.yaml", "--dry-run",
                             "--runs-dir", str(runs), "--json", "model.params=6.74e9", "model.layers=32",
                             "model.hidden_size=4096", "model.heads=32", "model.seq_len=4096",
                             "model.flash_attention=false")
    assert code == 0, err
    choice = yaml.safe_load((runs / json.loads(out)["run_id"] / "resolved.yaml").read_text())["derived"][
        "strategy_choice"]
    assert choice["chosen"] == "zero1" and choice["activation_checkpointing"] == "selective"
    assert "set model.activation_checkpointing: selective" in choice["reason"]
    assert choice["per_gpu_gb"] <= choice["usable_gb"]


# --- glaunch plan --------------------------------------------------------------------------


def test_plan_json_shape(workdir, monkeypatch, capsys):
    code, out, err = glaunch(monkeypatch, capsys, "plan", "exp.yaml", "--site", "site.yaml", "--json",
                             "model.params=7.5e9")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"world_size", "gpu_mem_gb", "strategies", "recommended", "reason", "min_nodes",
                         "recommended_activation_checkpointing", "recomputed_strategies", "activations", "notes",
                         "goodput"}
    assert data["activations"] == {"activation_checkpointing": "none", "flash_attention": True, "counted": False,
                                   "missing": ["model.layers", "model.hidden_size", "model.seq_len"]}
    assert data["recommended_activation_checkpointing"] == "none" and data["recomputed_strategies"] is None
    assert data["world_size"] == 8 and data["gpu_mem_gb"] == 80.0
    assert [s["name"] for s in data["strategies"]] == list(memory.STRATEGIES)
    assert "fsdp" in memory.STRATEGIES
    for row in data["strategies"]:
        for key in ("model_states_gb", "estimate_gb", "activations_gb", "total_gb"):
            assert isinstance(row[key], float), key
        assert isinstance(row["deepspeed_gb"], float) if row["name"] != "fsdp" else row["deepspeed_gb"] is None
        assert row["total_gb"] == pytest.approx(row["estimate_gb"] + row["activations_gb"] + 2.0, abs=1e-5)
        assert isinstance(row["fits"], bool) and isinstance(row["gpu_fits"], bool)
        assert row["gpu_fits"] == (row["total_gb"] <= 80 * 0.9)
        assert row["fits"] == (row["gpu_fits"] and row["host_fits"] is not False)
    assert data["recommended"] == "zero1" and data["min_nodes"] is None
    assert isinstance(data["reason"], str) and data["reason"]


def test_plan_json_when_nothing_fits(workdir, monkeypatch, capsys):
    (workdir / "site.yaml").write_text(SITE.format(extra=", mem_gb: 512"))
    code, out, err = glaunch(monkeypatch, capsys, "plan", "exp.yaml", "--site", "site.yaml", "--json",
                             "model.params=60e9")
    assert code == 0, err
    data = json.loads(out)
    assert data["recommended"] is None and data["min_nodes"] == 2
    zero3_offload = data["strategies"][-1]
    # It fits the GPUs but not the host: a reader of `fits` must not take it as usable.
    assert zero3_offload["gpu_fits"] and zero3_offload["host_fits"] is False
    assert zero3_offload["fits"] is False
    assert not any(row["fits"] for row in data["strategies"])
    assert zero3_offload["host_gb"] == pytest.approx(1080)


def test_plan_table(workdir, monkeypatch, capsys):
    code, out, err = glaunch(monkeypatch, capsys, "plan", "exp.yaml", "--site", "site.yaml", "model.params=7.5e9")
    assert code == 0, err
    for fragment in ["ZeRO paper", "estimate", "DeepSpeed", "FSDP2", "activations", "total", "fits", "1.5x",
                     "recommended: zero1", "reason:", *memory.STRATEGIES]:
        assert fragment in out, fragment
    # 7.5e9 over 8 GPUs, L estimated as 4h² + 4h with h = (128 x 7.5e9 / 12)^(1/3):
    # fsdp = 16 x 7.5e9 / 8 + 4L = 15 GB + 4L
    h = (128 * 7.5e9 / 12) ** (1 / 3)
    fsdp_line = next(line for line in out.splitlines() if line.startswith("fsdp "))
    assert fsdp_line.split()[1:3] == ["15.00", f"{15 + 4 * int(4 * h * h + 4 * h) / 1e9:.2f}"]


def test_plan_with_params_imports_no_torch(workdir):
    code = textwrap.dedent("""
        import sys
        from launcher import cli
        sys.argv = ["glaunch", "plan", "exp.yaml", "--site", "site.yaml"]
        try:
            cli.main()
        except SystemExit as exc:
            assert not exc.code, exc.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "deepspeed", "lightning"))
        print("HEAVY", heavy)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout
    assert "recommended:" in proc.stdout


# --- model.factory -------------------------------------------------------------------------

FACTORY = """\
import torch

def build():
    return torch.nn.Linear(1000, 1000)

def broken():
    raise RuntimeError("no weights here")
"""


def test_inspect_factory(tmp_path):
    (tmp_path / "tiny_factory_a.py").write_text(FACTORY)
    assert inspect_factory("tiny_factory_a:build", [str(tmp_path)]) == (1_001_000, 1_001_000)


def test_factory_through_plan(workdir, monkeypatch, capsys):
    (workdir / "tiny_factory_b.py").write_text(FACTORY)
    exp = EXP.replace("model: {params: 1.0e9}", "model: {factory: 'tiny_factory_b:build'}")
    (workdir / "exp.yaml").write_text(exp)
    code, out, err = glaunch(monkeypatch, capsys, "plan", "exp.yaml", "--site", "site.yaml", "--json")
    assert code == 0, err
    ddp = json.loads(out)["strategies"][0]
    assert ddp["deepspeed_gb"] == pytest.approx(20 * 1_001_000 / 1e9)


@pytest.mark.parametrize("factory,fragment", [
    ("tiny_factory_c", "module:function"),
    ("no_such_module_xyz:build", "no_such_module_xyz"),
    ("tiny_factory_c:missing", "missing"),
    ("tiny_factory_c:broken", "no weights here"),
])
def test_bad_factory_exits_2_naming_model_factory(workdir, monkeypatch, capsys, factory, fragment):
    (workdir / "tiny_factory_c.py").write_text(FACTORY)
    exp = EXP.replace("model: {params: 1.0e9}", f"model: {{factory: '{factory}'}}")
    (workdir / "exp.yaml").write_text(exp)
    code, out, err = glaunch(monkeypatch, capsys, "plan", "exp.yaml", "--site", "site.yaml")
    assert code == 2
    assert "exp.yaml" in err and "model.factory" in err and fragment in err
    assert "Traceback" not in out + err
