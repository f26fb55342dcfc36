"""strategy.name: fsdp from the experiment to the job: resolution (DeepSpeed's keys
ignored or refused), the run bundle (GLAUNCH_STRATEGY=fsdp, no ds_config.json), sweeps
across strategies, and the runtime's FSDP2 precision policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_examples_devices import fake_cuda

from launcher import api
from launcher.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

SITE = """\
name: four
scheduler: slurm
default_partition: gpu
partitions:
  gpu: {gpus_per_node: 4, gpu_mem_gb: 80, max_nodes: 8}
"""
EXP = """\
name: sharded
entrypoint: {script: train.py}
resources: {nodes: 2, time: "01:00:00"}
precision: bf16
batch: {global_size: 64, micro_size: 4}
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch, isolated_env):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "site.yaml").write_text(SITE)
    return tmp_path


def write_exp(workdir: Path, extra: str) -> str:
    (workdir / "exp.yaml").write_text(EXP + extra)
    return "exp.yaml"


def prepared(workdir: Path, extra: str, *overrides: str):
    return api.prepare(write_exp(workdir, extra), site="site.yaml", overrides=overrides,
                       runs_dir=str(workdir / "runs"), dry_run=True)


def env_sh(files) -> str:
    return next(text for name, text in files.items() if name.endswith("env.sh"))


def test_fsdp_resolves_to_its_own_strategy(workdir):
    p = prepared(workdir, "strategy: {name: fsdp}\n")
    plan = p.plan
    assert (plan.training.strategy, plan.training.zero_stage, plan.training.ds_config, plan.training.strategy_choice) == ("fsdp", None, None, None)
    assert (plan.launch.world_size, plan.training.accumulation) == (8, 2)        # 64 / (4 x 8)
    env = env_sh(p.files)
    assert "export GLAUNCH_STRATEGY=fsdp\n" in env and "GLAUNCH_DS_CONFIG" not in env
    assert "export GLAUNCH_PRECISION=bf16\n" in env
    assert not any(name.endswith("ds_config.json") for name in p.files)


def test_zero_stage_is_ignored_for_fsdp(workdir):
    # DeepSpeed's key has no meaning for FSDP; written in the file it changes nothing.
    def bundle(extra):
        p = prepared(workdir, extra)
        return p.plan, env_sh(p.files).replace(p.plan.run_id, "RUN")

    plain, plain_env = bundle("strategy: {name: fsdp}\n")
    staged, staged_env = bundle("strategy: {name: fsdp, zero_stage: 3, nvme_path: /nvme}\n")
    assert staged.training.zero_stage is None and staged.training.ds_config is None
    assert staged_env == plain_env
    # A stage outside 0..3 is a mistake whatever the strategy: refused, naming the key.
    with pytest.raises(ConfigError, match=r"strategy\.zero_stage.*0\.\.3"):
        bundle("strategy: {name: fsdp, zero_stage: 7}\n")


def test_an_experiment_written_for_deepspeed_switches_to_fsdp_by_override(workdir):
    ds = "strategy: {name: deepspeed, zero_stage: 3}\n"
    assert prepared(workdir, ds).plan.training.zero_stage == 3
    plan = prepared(workdir, ds, "strategy.name=fsdp").plan
    assert (plan.training.strategy, plan.training.zero_stage, plan.training.ds_config) == ("fsdp", None, None)


def test_sweep_over_strategies(workdir):
    write_exp(workdir, "strategy: {name: deepspeed, zero_stage: 2}\n")
    sweep = api.submit("exp.yaml", site="site.yaml", runs_dir=str(workdir / "runs"), dry_run=True,
                       sweep=["strategy.name=ddp,fsdp,deepspeed"], check=False)
    by_strategy = {}
    for run in sweep.runs:
        text = (Path(run.run_dir) / "env.sh").read_text()
        name = next(line.split("=", 1)[1] for line in text.splitlines()
                    if line.startswith("export GLAUNCH_STRATEGY="))
        by_strategy[name] = Path(run.run_dir)
    assert sorted(by_strategy) == ["ddp", "deepspeed", "fsdp"]
    assert (by_strategy["deepspeed"] / "ds_config.json").exists()
    assert not (by_strategy["fsdp"] / "ds_config.json").exists()


@pytest.mark.parametrize("strategy,key", [
    ("{name: fsdp, offload_params: cpu}", "strategy.offload_params"),
    ("{name: fsdp, offload_optimizer: cpu}", "strategy.offload_optimizer"),
    ("{name: fsdp, offload_optimizer: nvme, nvme_path: /nvme}", "strategy.offload_optimizer"),
])
def test_fsdp_offload_is_refused_naming_the_key(workdir, strategy, key):
    with pytest.raises(ConfigError) as info:
        prepared(workdir, f"strategy: {strategy}\n")
    assert info.value.key == key and "exp.yaml" in str(info.value)
    assert "CPUOffloadPolicy" in str(info.value) and "strategy.name: deepspeed" in str(info.value)
    assert not (workdir / "runs").exists()


def test_examples_resolve_to_fsdp(isolated_env, tmp_path):
    for example in ("fsdp", "lightning_fsdp"):
        run = api.submit(REPO / "examples" / f"{example}.yaml", site="local", dry_run=True,
                         runs_dir=str(tmp_path / example), check=False)
        resolved = (Path(run.run_dir) / "resolved.yaml").read_text()
        assert "strategy: fsdp" in resolved, example
        assert "export GLAUNCH_STRATEGY=fsdp\n" in (Path(run.run_dir) / "env.sh").read_text()


def test_plan_json_has_the_fsdp_row(workdir, capsys, monkeypatch):
    import sys

    from launcher import cli

    write_exp(workdir, "strategy: {name: fsdp}\nmodel: {params: 7.5e9, largest_layer_params: 67108864}\n")
    monkeypatch.setattr(sys, "argv", ["glaunch", "plan", "exp.yaml", "--site", "site.yaml", "--json",
                                      "resources.nodes=1"])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr().out
    assert not code
    row = next(r for r in json.loads(out)["strategies"] if r["name"] == "fsdp")
    # 16 x 7.5e9 / 4 = 30 GB, + 4 x 67,108,864 = 0.268 GB gathered, + 2 GB overhead
    assert row["estimate_gb"] == pytest.approx(30.268435, abs=1e-6)
    assert row["total_gb"] == pytest.approx(32.268435, abs=1e-6)
    assert row["deepspeed_gb"] is None and row["fits"] is True


# --- the runtime: launcher.runtime.fsdp -------------------------------------------------------


@pytest.fixture
def rank_env(monkeypatch):
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                           GLAUNCH_STRATEGY="fsdp").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GLAUNCH_DIST_BACKEND", raising=False)


@pytest.mark.parametrize("precision,dtype", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", None)])
def test_mixed_precision_follows_the_configured_precision_on_gpus(monkeypatch, rank_env, precision, dtype):
    torch = pytest.importorskip("torch")
    from launcher.runtime import fsdp as gfsdp

    monkeypatch.setenv("GLAUNCH_PRECISION", precision)
    # Fake of what cannot run here: torch reporting a CUDA GPU.
    fake_cuda(monkeypatch, 1)
    policy = gfsdp.mixed_precision()
    if dtype is None:
        assert policy is None
    else:
        assert policy.param_dtype == getattr(torch, dtype) and policy.reduce_dtype == torch.float32


def test_mixed_precision_is_none_on_the_cpu(monkeypatch, rank_env):
    torch = pytest.importorskip("torch")
    from launcher.runtime import fsdp as gfsdp

    monkeypatch.setenv("GLAUNCH_PRECISION", "bf16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gfsdp.mixed_precision() is None


def test_shard_passes_the_policy_unless_given(monkeypatch, rank_env):
    torch = pytest.importorskip("torch")
    import torch.distributed.fsdp as fsdp_module

    from launcher.runtime import fsdp as gfsdp

    monkeypatch.setenv("GLAUNCH_PRECISION", "bf16")
    fake_cuda(monkeypatch, 1)     # fake: an H100
    calls = []
    # Fake of what needs a process group on a GPU: fully_shard, recording its arguments.
    monkeypatch.setattr(fsdp_module, "fully_shard", lambda module, **kw: calls.append((module, kw)))
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    gfsdp.shard(model, mesh="MESH")
    assert [m for m, _ in calls] == [model[0], model[2], model]            # each layer with parameters, then the root
    assert all(kw["mp_policy"].param_dtype == torch.bfloat16 and kw["mesh"] == "MESH" for _, kw in calls)
    calls.clear()
    gfsdp.shard(model, mesh="MESH", mp_policy=None)
    assert all(kw["mp_policy"] is None for _, kw in calls)
