"""The planner on public model shapes and shipped site profiles, next to published figures:
Llama 2 7B, 13B and 70B (Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned
Chat Models": Table 1 for the sizes and the 4k context; layers, hidden size, heads and the
32,000-token vocabulary as in the released models' configurations) on JUWELS Booster
(4 x A100 40 GB per node) and Leonardo Booster (4 x A100 64 GB per node), 4 nodes each,
bf16 and Adam, micro batch 1, with and without activation checkpointing.

Published figures compared:
- model states: 16Ψ bytes for mixed-precision Adam, 2Ψ + 2Ψ + 12Ψ (Rajbhandari et al. 2020,
  "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", section 3.1),
  16Ψ/N once partitioned (P_os+g+p, section 5.3);
- DeepSpeed's own estimators, called here: estimate_zero2_model_states_mem_needs and
  estimate_zero3_model_states_mem_needs, which estimate_zero2/3_model_states_mem_needs_all_cold
  print (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py);
- activations per GPU (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models"): section 4.1 equation (1), s·b·h·(34 + 5·a·s/h) bytes per layer without
  tensor parallelism; section 5, selective recomputation s·b·h·34 per layer, full
  recomputation 2·s·b·h per layer, plus the working set of the layer being recomputed."""

from dataclasses import dataclass

import pytest

from launcher import api
from launcher.resolution import memory, planner
from launcher.resolution.memory import PlanInput
from launcher.resolution.planner import make_plan

GPUS, NODES, SEQ, VOCAB = 4, 4, 4096, 32000


@dataclass(frozen=True)
class Shape:
    params: int            # the released checkpoints' parameter counts
    layers: int
    hidden: int
    heads: int

    @property
    def largest_layer(self) -> int:
        return VOCAB * self.hidden          # the embedding (and output) matrix: larger than any MLP matrix


LLAMA2 = {
    "7B": Shape(6_738_415_616, 32, 4096, 32),
    "13B": Shape(13_015_864_320, 40, 5120, 40),
    "70B": Shape(68_976_648_192, 80, 8192, 64),     # grouped-query attention: 64 query heads
}

# (model, site, model.activation_checkpointing) -> the recommendation, FlashAttention off so
# that the activations are Korthikanti's equations as published.
RECOMMENDED = {
    ("7B", "juwels-booster", "none"): "fsdp with activation_checkpointing: selective",
    ("7B", "juwels-booster", "full"): "zero2",
    ("7B", "leonardo-booster", "none"): "zero1 with activation_checkpointing: selective",
    ("7B", "leonardo-booster", "full"): "zero1",
    ("13B", "juwels-booster", "none"): "fsdp with activation_checkpointing: full",
    ("13B", "juwels-booster", "full"): "fsdp",
    ("13B", "leonardo-booster", "none"): "fsdp with activation_checkpointing: selective",
    ("13B", "leonardo-booster", "full"): "zero2",
    ("70B", "juwels-booster", "none"): "zero3_offload with activation_checkpointing: full",
    ("70B", "juwels-booster", "full"): "zero3_offload",
    ("70B", "leonardo-booster", "none"): "zero3_offload with activation_checkpointing: full",
    ("70B", "leonardo-booster", "full"): "zero3_offload",
}

EXP = """\
name: llama2
entrypoint: {script: train.py}
resources: {nodes: 4}
strategy: {name: auto}
precision: bf16
batch: {micro_size: 1}
"""


def korthikanti_bytes(shape: Shape, recompute: str) -> float:
    """Activation bytes per GPU, micro batch 1, 16-bit, no tensor parallelism."""
    s, b, h, a, layers = SEQ, 1, shape.hidden, shape.heads, shape.layers
    layer = s * b * h * (34 + 5 * a * s / h)                                   # equation (1)
    return {"none": layers * layer,
            "selective": layers * s * b * h * 34,                              # section 5
            "full": layers * 2 * s * b * h + layer}[recompute]                 # section 5


def plan(tmp_path, site: str, shape: Shape, *overrides: str) -> planner.PlanResult:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "exp.yaml").write_text(EXP)
    return api.plan(tmp_path / "exp.yaml", site=site, overrides=[
        f"model.params={shape.params}", f"model.layers={shape.layers}", f"model.hidden_size={shape.hidden}",
        f"model.heads={shape.heads}", f"model.seq_len={SEQ}", f"model.largest_layer_params={shape.largest_layer}",
        *overrides])


@pytest.mark.parametrize("model,site,recompute", sorted(RECOMMENDED))
def test_llama2_shapes_on_shipped_profiles(tmp_path, isolated_env, ds_estimators, model, site, recompute):
    zero2, zero3 = ds_estimators
    shape = LLAMA2[model]
    psi, largest, n = shape.params, shape.largest_layer, NODES * GPUS
    result = plan(tmp_path, site, shape, f"model.activation_checkpointing={recompute}", "model.flash_attention=false")
    rows = {r.name: r for r in result.rows}
    assert result.world_size == n
    # ZeRO paper, section 3.1 and 5.3: 16Ψ, and 16Ψ/N fully partitioned
    assert rows["ddp"].model_states_gb == pytest.approx(16 * psi / 1e9)
    assert rows["zero3"].model_states_gb == rows["fsdp"].model_states_gb == pytest.approx(16 * psi / n / 1e9)
    # DeepSpeed's estimators, GPU side
    assert rows["zero2"].deepspeed_gb * 1e9 == pytest.approx(zero2(psi, GPUS, NODES, cpu_offload=False)[1], rel=1e-9)
    assert rows["zero2_offload"].deepspeed_gb * 1e9 == pytest.approx(zero2(psi, GPUS, NODES, cpu_offload=True)[1])
    assert rows["zero3"].deepspeed_gb * 1e9 == pytest.approx(
        zero3(psi, largest, GPUS, NODES, cpu_offload=False, cpu_offload_params=False)[1], rel=1e-9)
    assert rows["zero3_offload"].deepspeed_gb * 1e9 == pytest.approx(
        zero3(psi, largest, GPUS, NODES, cpu_offload=True, cpu_offload_params=True)[1])
    # Korthikanti et al. 2022
    for row in rows.values():
        assert row.activations_gb == pytest.approx(korthikanti_bytes(shape, recompute) / 1e9)
    # what fits, and the recommendation, which fits with what it assumes
    usable = result.input.usable_gb
    assert result.recommendation == RECOMMENDED[model, site, recompute]
    chosen = result.recommended_row
    assert chosen is not None and chosen.name == result.recommended
    assert chosen.activations_gb == pytest.approx(korthikanti_bytes(shape, result.recomputation) / 1e9)
    assert chosen.fits and chosen.total_gb <= usable
    for row in (*result.rows, *result.recomputed_rows):
        assert row.total_gb == pytest.approx(row.estimate_gb + row.activations_gb + result.input.overhead_gb)
        assert row.gpu_fits == (row.total_gb <= usable)


def test_llama2_7b_on_four_a100_40gb_nodes_fits_with_recomputation(tmp_path, isolated_env):
    # Without recomputation and with the scores stored, 104 GB of activations per GPU fit no
    # node count; the same model trains on 8 A100 40 GB with ZeRO-3 or FSDP and activation
    # checkpointing.
    result = plan(tmp_path, "juwels-booster", LLAMA2["7B"], "model.flash_attention=false")
    assert not any(r.fits for r in result.rows)
    assert result.rows[0].activations_gb == pytest.approx(104.15, abs=0.01)
    assert result.recommended == "fsdp" and result.recomputation == "selective"
    assert result.recommended_row.total_gb <= result.input.usable_gb
    assert result.row("fsdp").total_gb > result.input.usable_gb         # the experiment's own setting
    text = planner.format_plan_table(result)
    assert "recommended: fsdp with activation_checkpointing: selective" in text
    assert "with activation_checkpointing: selective, activations: 32 layers x s·b·h·34 bytes" in text
    assert "no FlashAttention" in text and "set model.activation_checkpointing: selective" in result.reason
    data = result.to_json()
    assert data["recommended"] == "fsdp" and data["recommended_activation_checkpointing"] == "selective"
    assert data["activations"]["activation_checkpointing"] == "none" and data["activations"]["flash_attention"] is False
    assert [r["name"] for r in data["recomputed_strategies"]] == list(memory.STRATEGIES)
    # FlashAttention (the default) never stores the scores: 18.25 GB, and fsdp fits as configured.
    flash = plan(tmp_path, "juwels-booster", LLAMA2["7B"])
    assert flash.rows[0].activations_gb == pytest.approx(32 * SEQ * 4096 * 34 / 1e9)
    assert flash.recommendation == "fsdp" and not flash.recomputed_rows
    assert "FlashAttention: scores never stored" in planner.format_plan_table(flash)


# --- every `fits` in the precision of the table beside it ----------------------------------


def test_fp32_zero2_does_not_fit_where_its_own_column_does_not():
    # 7e9 fp32 Adam on 2 nodes x 4 A100 40 GB (36 GB usable, 2 GB overhead): the ZeRO paper's
    # 4Ψ + (4 + 8)Ψ/8 = 38.5 GB. DeepSpeed's mixed-precision counts, 2Ψ + 18Ψ/8 = 29.75 GB,
    # once decided fit beside it.
    result = make_plan(PlanInput(params=7 * 10**9, nodes=2, gpus_per_node=4, gpu_mem_gb=40, precision="fp32"))
    zero2 = result.row("zero2")
    assert zero2.model_states_gb == pytest.approx(38.5)
    assert zero2.estimate_gb >= zero2.model_states_gb and not zero2.fits
    assert result.recommended != "zero2"
    chosen = result.row(result.recommended)
    assert chosen.model_states_gb + result.input.overhead_gb <= result.input.usable_gb


@pytest.mark.parametrize("precision", memory.PRECISIONS)
@pytest.mark.parametrize("optimizer", memory.OPTIMIZERS)
@pytest.mark.parametrize("nodes,gpus", [(1, 1), (1, 8), (16, 8)])
def test_estimate_never_below_the_zero_paper_column(precision, optimizer, nodes, gpus):
    # Offload rows aside: DeepSpeed's GPU estimate for them leaves the gradient partition out.
    result = make_plan(PlanInput(params=7 * 10**9, nodes=nodes, gpus_per_node=gpus, gpu_mem_gb=80,
                                 precision=precision, optimizer=optimizer))
    for row in result.rows:
        if row.name not in memory.OFFLOAD:
            assert row.estimate_gb >= row.model_states_gb - 1e-9, row.name


# --- recomputation and FlashAttention in the activation count ------------------------------


@pytest.mark.parametrize("precision,word,linear,quadratic", [("bf16", 2, 34, 5), ("fp32", 4, 66, 9)])
def test_activation_count_per_setting(precision, word, linear, quadratic):
    s, b, h, a, layers = 2048, 2, 2048, 16, 24
    base = dict(params=1_300_000_000, nodes=1, gpus_per_node=8, gpu_mem_gb=80, precision=precision, layers=layers,
                hidden_size=h, heads=a, seq_len=s, micro_batch=b)
    scores = s * b * h * (linear + quadratic * a * s / h)
    plain = s * b * h * linear
    expected = {
        ("none", False): layers * scores, ("selective", False): layers * plain,
        ("full", False): layers * word * s * b * h + scores,
        ("none", True): layers * plain, ("selective", True): layers * plain,
        ("full", True): layers * word * s * b * h + plain,
    }
    for (setting, flash), want in expected.items():
        inp = PlanInput(**base, activation_checkpointing=setting, flash_attention=flash)
        assert memory.activation_bytes(inp) == pytest.approx(want), (setting, flash)


def test_heads_are_needed_only_where_the_scores_count():
    base = dict(params=10**9, nodes=1, gpus_per_node=8, gpu_mem_gb=80, layers=24, hidden_size=2048, seq_len=2048)
    assert make_plan(PlanInput(**base)).rows[0].activations_gb > 0                   # FlashAttention
    without = make_plan(PlanInput(**base, flash_attention=False))
    assert without.rows[0].activations_gb == 0 and not without.recomputed_rows
    assert "model.heads not given" in planner.format_plan_table(without)


def test_recomputation_is_not_tried_beyond_full_nor_without_a_shape():
    # 1e11 on one node with 64 GB of host memory: nothing fits whatever the activations; the
    # reason says so with full.
    shape = dict(layers=80, hidden_size=8192, heads=64, seq_len=4096, flash_attention=False, host_mem_gb=64)
    result = make_plan(PlanInput(params=10**11, nodes=1, gpus_per_node=4, gpu_mem_gb=40, max_nodes=1, **shape))
    assert result.recommended is None and result.recommendation == "none"
    assert result.reason.startswith("nothing fits with activation_checkpointing: none")
    assert "with activation_checkpointing: full, nothing fits" in result.reason
    full = make_plan(PlanInput(params=10**11, nodes=1, gpus_per_node=4, gpu_mem_gb=40, max_nodes=1,
                               activation_checkpointing="full", **shape))
    assert full.recomputation == "full" and not full.recomputed_rows
    assert planner.recomputation_to_try(PlanInput(params=10**9, nodes=1, gpus_per_node=1, gpu_mem_gb=80)) == ("none",)


def test_offload_comes_after_recomputation():
    # 13B on 4 x 4 A100 40 GB, scores stored: with selective only zero3_offload fits (31.2 GB),
    # with full fsdp does (21.4 GB) without moving the optimizer step to the host.
    shape = LLAMA2["13B"]
    inp = PlanInput(params=shape.params, nodes=NODES, gpus_per_node=GPUS, gpu_mem_gb=40, layers=shape.layers,
                    hidden_size=shape.hidden, heads=shape.heads, seq_len=SEQ, largest_layer_params=shape.largest_layer,
                    flash_attention=False, activation_checkpointing="selective", host_mem_gb=492)
    assert make_plan(inp).recommendation == "fsdp with activation_checkpointing: full"
    assert "only offload fits with activation_checkpointing: selective" in make_plan(inp).reason


def test_min_nodes_counts_recomputation():
    # 7B, scores stored, one GPU of 40 GB and 16 GB of host memory per node: with full
    # recomputation fsdp fits from 4 nodes, 16Ψ/4 + 4L + 4.33 + 2 = 33.8 GB <= 36 GB (with
    # selective from 8, offload's host memory from 9).
    shape = LLAMA2["7B"]
    inp = PlanInput(params=shape.params, nodes=1, gpus_per_node=1, gpu_mem_gb=40, layers=shape.layers,
                    hidden_size=shape.hidden, heads=shape.heads, seq_len=SEQ, largest_layer_params=shape.largest_layer,
                    flash_attention=False, max_nodes=64, host_mem_gb=16)
    result = make_plan(inp)
    assert result.recommended is None and result.min_nodes == 4
    there = make_plan(PlanInput(**{**inp.__dict__, "nodes": result.min_nodes}))
    assert there.recommendation == "fsdp with activation_checkpointing: full"
    assert make_plan(PlanInput(**{**inp.__dict__, "nodes": result.min_nodes - 1})).recommended is None
